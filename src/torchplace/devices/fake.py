"""A probe that describes an imaginary machine: :class:`FakeProbe`, for tests and CPU-only CI.

It describes any machine: a CPU-only build, eight GPUs with ``CUDA_VISIBLE_DEVICES="2,0"``, an
MPS laptop. The visible devices follow the environment it reports the way the CUDA runtime would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from torchplace.devices.probe import DeviceProperties, DriverInfo
from torchplace.devices.visible import (
    parse_hip_visible_devices,
    parse_rocr_visible_devices,
    parse_visible_devices,
    rocr_visible_devices,
    visibility_variable,
)

__all__ = ["FakeProbe"]


@dataclass
class FakeProbe:
    """A probe that describes an imaginary machine; for tests and CPU-only CI.

    ``devices`` are the *physical* GPUs in CUDA order; ``env`` holds the environment variables
    the probe reports (``CUDA_VISIBLE_DEVICES`` included), and the visible devices follow it the
    way the CUDA runtime would: ``FakeProbe(devices=[a, b, c], env={"CUDA_VISIBLE_DEVICES":
    "2,0"})`` shows ``c`` as logical 0 and ``a`` as logical 1. Physical devices are matched by
    integer position or by ``uuid`` prefix; of several MIG devices listed, only the first is
    visible, as CUDA enumerates one MIG device per process. With ``hip_version`` set (a ROCm
    build), ``ROCR_VISIBLE_DEVICES`` picks and orders the physical devices first (by index or
    UUID prefix, in any case, up to the first entry it cannot read or that repeats one), and
    ``HIP_VISIBLE_DEVICES`` or ``CUDA_VISIBLE_DEVICES`` then index into those, read as HIP
    reads them: a repeated GPU is skipped, and a ``GPU-`` entry names the first of those whose
    UUID contains it.
    """

    devices: Sequence[DeviceProperties] = ()
    cuda_version: str | None = None
    hip_version: str | None = None
    version: str = "2.13.0+cpu"
    cudnn: int | None = None
    arches: Sequence[str] = ()
    env_vars: Mapping[str, str] = field(default_factory=dict)
    free_memory: Mapping[int, int] = field(default_factory=dict)
    current: int = 0
    backends: Mapping[str, int] = field(default_factory=dict)
    driver_info: DriverInfo = field(
        default_factory=lambda: DriverInfo(nvml_installed=False, error="fake probe")
    )

    def _visible(self) -> list[DeviceProperties]:
        if self.cuda_version is None and self.hip_version is None:
            return []
        pool = self._rocr_visible()
        value = self.env(visibility_variable(self))
        if self.hip_version is not None:
            return _hip_visible(parse_hip_visible_devices(value), pool)
        parsed = parse_visible_devices(value)
        if parsed is None:
            return pool
        out: list[DeviceProperties] = []
        for entry in parsed:
            match = _match_physical(entry, pool)
            if match is None:  # the CUDA runtime stops at the first unknown entry
                break
            if match in out:
                return []
            if _is_mig(match) and any(_is_mig(d) for d in out):
                continue  # CUDA enumerates one MIG device per process
            out.append(match)
        return out

    def _rocr_visible(self) -> list[DeviceProperties]:
        """The devices ``ROCR_VISIBLE_DEVICES`` leaves, in its order (all when unset)."""
        value = rocr_visible_devices(self)
        if value is None:
            return list(self.devices)
        out: list[DeviceProperties] = []
        for entry in parse_rocr_visible_devices(value) or ():  # not None: value is set
            match = _match_physical(entry, self.devices, upper=True)
            if match is None or match in out:  # ROCr stops at an unknown or repeated GPU
                break
            out.append(match)
        return out

    def torch_version(self) -> str:
        return self.version

    def cuda_build(self) -> str | None:
        return self.cuda_version

    def hip_build(self) -> str | None:
        return self.hip_version

    def cudnn_version(self) -> int | None:
        return self.cudnn

    def cuda_available(self) -> bool:
        return bool(self._visible())

    def device_count(self) -> int:
        return len(self._visible())

    def current_device(self) -> int:
        return self.current

    def properties(self, index: int) -> DeviceProperties:
        visible = self._visible()
        if not 0 <= index < len(visible):
            raise RuntimeError(f"invalid device ordinal {index}")
        return visible[index]

    def mem_get_info(self, index: int) -> tuple[int, int]:
        props = self.properties(index)
        return self.free_memory.get(index, props.total_memory), props.total_memory

    def arch_list(self) -> list[str]:
        return list(self.arches)

    def env(self, name: str) -> str | None:
        return self.env_vars.get(name)

    def backend_available(self, kind: str) -> bool:
        return self.backends.get(kind, 0) > 0

    def backend_device_count(self, kind: str) -> int:
        return self.backends.get(kind, 0)

    def backend_current_index(self, kind: str) -> int:
        return 0

    def accelerator(self) -> str | None:
        if self.cuda_available():
            return "cuda"
        return next((k for k, n in self.backends.items() if n > 0), None)

    def driver(self) -> DriverInfo:
        return self.driver_info


def _hip_visible(parsed: list[str] | None, pool: list[DeviceProperties]) -> list[DeviceProperties]:
    """The devices of ``pool`` that HIP's reading ``parsed`` picks, in its order (all if None)."""
    if parsed is None:
        return pool
    out: list[DeviceProperties] = []
    for entry in parsed:
        if "GPU-" in entry:  # HIP takes the first GPU whose UUID contains the entry
            match = next((d for d in pool if d.uuid is not None and entry in d.uuid), None)
        else:
            match = _match_physical(entry, pool)
        if match is None:  # HIP stops at the first entry that names no GPU
            break
        if match not in out:  # and skips one named again
            out.append(match)
    return out


def _is_mig(device: DeviceProperties) -> bool:
    return device.uuid is not None and device.uuid.startswith("MIG-")


def _match_physical(
    entry: str, devices: Sequence[DeviceProperties], *, upper: bool = False
) -> DeviceProperties | None:
    if entry.isdigit():
        i = int(entry) if len(entry) < 19 else len(devices)  # no int() of 5000 digits
        return devices[i] if i < len(devices) else None
    uuids = [(d, d.uuid.upper() if upper else d.uuid) for d in devices if d.uuid is not None]
    hits = [d for d, uuid in uuids if uuid.startswith(entry)]
    return hits[0] if len(hits) == 1 else None
