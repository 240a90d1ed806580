"""Device specs, resolution and inventory.

:func:`resolve_device` turns a loose spec (``"auto"``, ``"cuda"``, ``1``, ``"cuda:1"``,
``torch.device(...)``) into one explicit :class:`torch.device` with an index, or raises an error
that says what is visible and how to fix it. :func:`device_inventory` lists every visible
accelerator with the physical id it maps to under ``CUDA_VISIBLE_DEVICES``.

Every hardware query goes through a :class:`DeviceProbe`. The default, :class:`TorchProbe`, asks
torch (and NVML for the driver) only when a function is called, never at import. Tests and
CPU-only CI pass a :class:`FakeProbe` instead, which describes any machine: a CPU-only build,
eight GPUs with ``CUDA_VISIBLE_DEVICES="2,0"``, an MPS laptop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from torchplace.errors import ConfigError, DeviceIndexError, DeviceUnavailableError

__all__ = [
    "DEVICE_ENV_VAR",
    "DeviceInfo",
    "DeviceProbe",
    "DeviceProperties",
    "DriverInfo",
    "FakeProbe",
    "TorchProbe",
    "VisibleDevices",
    "cuda_unavailable_reason",
    "default_probe",
    "device_inventory",
    "parse_visible_devices",
    "resolve_device",
    "visible_devices",
]

DEVICE_ENV_VAR = "TORCHPLACE_DEVICE"
"""Environment variable that ``resolve_device("auto")`` honours before looking at hardware."""

_CUDA_WHEEL_FIX = (
    "install a CUDA build of torch, e.g. "
    "'pip install torch --index-url https://download.pytorch.org/whl/cu128' "
    "(pick the CUDA version your driver supports, see https://pytorch.org/get-started/locally/), "
    "or ask for device 'cpu'"
)
_OTHER_ACCELERATORS = ("mps", "xpu")
_PASS_THROUGH = ("cpu", "meta")
_SPEC_RE = re.compile(r"^(?P<type>[a-z_]+)(?::(?P<index>-?\d+))?$")


# --------------------------------------------------------------------------------------------
# What a probe reports
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceProperties:
    """What the runtime reports about one logical CUDA (or ROCm) device."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    l2_cache_size: int | None = None
    is_integrated: bool | None = None
    gcn_arch_name: str | None = None


@dataclass(frozen=True)
class DriverInfo:
    """What NVML reports about the driver; ``error`` says why a field is missing."""

    nvml_installed: bool
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    physical_gpu_count: int | None = None
    physical_gpus: tuple[str, ...] = ()
    error: str | None = None


@runtime_checkable
class DeviceProbe(Protocol):
    """Every hardware question torchplace asks; swap it for a fake to test without a GPU."""

    def torch_version(self) -> str:
        """``torch.__version__``."""
        ...

    def cuda_build(self) -> str | None:
        """CUDA version torch was compiled with (``torch.version.cuda``), None if not."""
        ...

    def hip_build(self) -> str | None:
        """HIP version torch was compiled with (``torch.version.hip``), None if not."""
        ...

    def cudnn_version(self) -> int | None:
        """cuDNN (or MIOpen) version torch loads, None without one."""
        ...

    def cuda_available(self) -> bool:
        """``torch.cuda.is_available()``."""
        ...

    def device_count(self) -> int:
        """Number of visible CUDA devices."""
        ...

    def current_device(self) -> int:
        """Index of the current CUDA device."""
        ...

    def properties(self, index: int) -> DeviceProperties:
        """Properties of the logical CUDA device ``index``."""
        ...

    def mem_get_info(self, index: int) -> tuple[int, int]:
        """(free, total) bytes of the logical device ``index``."""
        ...

    def arch_list(self) -> list[str]:
        """Architectures the build has kernels for (``torch.cuda.get_arch_list()``)."""
        ...

    def env(self, name: str) -> str | None:
        """An environment variable (``CUDA_VISIBLE_DEVICES``, ``TORCHPLACE_DEVICE``, ...)."""
        ...

    def backend_available(self, kind: str) -> bool:
        """Whether a non-CUDA accelerator (``"mps"``, ``"xpu"``) is usable."""
        ...

    def backend_device_count(self, kind: str) -> int:
        """Number of devices of a non-CUDA accelerator."""
        ...

    def backend_current_index(self, kind: str) -> int:
        """Current device index of a non-CUDA accelerator."""
        ...

    def accelerator(self) -> str | None:
        """Type of the current accelerator per ``torch.accelerator`` (None if none/absent)."""
        ...

    def driver(self) -> DriverInfo:
        """The NVIDIA driver as NVML sees it."""
        ...


class TorchProbe:
    """The real probe: asks torch and NVML, lazily, when a method is called."""

    def torch_version(self) -> str:
        return str(torch.__version__)

    def cuda_build(self) -> str | None:
        return torch.version.cuda

    def hip_build(self) -> str | None:
        return getattr(torch.version, "hip", None)

    def cudnn_version(self) -> int | None:
        try:
            cudnn: Any = torch.backends.cudnn
            return int(cudnn.version()) if cudnn.is_available() and cudnn.version() else None
        except (RuntimeError, OSError):  # pragma: no cover - broken cuDNN install
            return None

    def cuda_available(self) -> bool:
        return torch.cuda.is_available()

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def properties(self, index: int) -> DeviceProperties:  # pragma: no cover - needs a GPU
        p = torch.cuda.get_device_properties(index)
        uuid = getattr(p, "uuid", None)
        uuid_text = None if uuid is None else str(uuid)
        if uuid_text and not uuid_text.startswith(("GPU-", "MIG-")) and torch.version.hip is None:
            uuid_text = f"GPU-{uuid_text}"
        bus = None
        pci = [getattr(p, a, None) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
        if all(isinstance(v, int) for v in pci):
            bus = f"{pci[0]:08x}:{pci[1]:02x}:{pci[2]:02x}.0"
        return DeviceProperties(
            name=str(p.name),
            major=int(p.major),
            minor=int(p.minor),
            total_memory=int(p.total_memory),
            multi_processor_count=int(p.multi_processor_count),
            uuid=uuid_text,
            pci_bus_id=bus,
            l2_cache_size=_int_or_none(getattr(p, "L2_cache_size", None)),
            is_integrated=_bool_or_none(getattr(p, "is_integrated", None)),
            # CUDA builds alias gcnArchName to the device name; it is an arch on ROCm only
            gcn_arch_name=(getattr(p, "gcnArchName", None) or None) if torch.version.hip else None,
        )

    def mem_get_info(self, index: int) -> tuple[int, int]:  # pragma: no cover - needs a GPU
        free, total = torch.cuda.mem_get_info(index)
        return int(free), int(total)

    def arch_list(self) -> list[str]:
        return list(torch.cuda.get_arch_list())

    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    def backend_available(self, kind: str) -> bool:
        if kind == "mps":
            return bool(torch.backends.mps.is_available())
        module = getattr(torch, kind, None)
        is_available = getattr(module, "is_available", None)
        return bool(is_available()) if callable(is_available) else False

    def backend_device_count(self, kind: str) -> int:
        if kind == "mps":
            return 1 if torch.backends.mps.is_available() else 0
        module = getattr(torch, kind, None)
        count = getattr(module, "device_count", None)
        return int(count()) if callable(count) else 0

    def backend_current_index(self, kind: str) -> int:
        if kind == "mps":
            return 0
        module = getattr(torch, kind, None)
        current = getattr(module, "current_device", None)
        return int(current()) if callable(current) else 0

    def accelerator(self) -> str | None:
        acc = getattr(torch, "accelerator", None)
        if acc is None:  # torch < 2.6
            return None
        try:
            dev = acc.current_accelerator()
        except RuntimeError:  # pragma: no cover - defensive
            return None
        return None if dev is None else str(dev.type)

    def driver(self) -> DriverInfo:
        try:
            import pynvml
        except ImportError:
            return DriverInfo(nvml_installed=False, error="nvidia-ml-py is not installed")
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError subclasses; no driver on this machine
            return DriverInfo(nvml_installed=True, error=f"NVML unavailable: {exc}")
        try:  # pragma: no cover - needs an NVIDIA driver
            version = _text(pynvml.nvmlSystemGetDriverVersion())
            cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
            count = int(pynvml.nvmlDeviceGetCount())
            gpus = []
            for i in range(count):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                gpus.append(
                    f"{i}: {_text(pynvml.nvmlDeviceGetName(handle))} "
                    f"({_text(pynvml.nvmlDeviceGetUUID(handle))})"
                )
            return DriverInfo(
                nvml_installed=True,
                driver_version=version,
                cuda_driver_version=f"{cuda // 1000}.{(cuda % 1000) // 10}",
                physical_gpu_count=count,
                physical_gpus=tuple(gpus),
            )
        except Exception as exc:  # pragma: no cover - partial NVML failure
            return DriverInfo(nvml_installed=True, error=f"NVML query failed: {exc}")
        finally:  # pragma: no cover - needs an NVIDIA driver
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _bool_or_none(value: Any) -> bool | None:
    return None if value is None else bool(value)


@dataclass
class FakeProbe:
    """A probe that describes an imaginary machine; for tests and CPU-only CI.

    ``devices`` are the *physical* GPUs in CUDA order; ``env`` holds the environment variables
    the probe reports (``CUDA_VISIBLE_DEVICES`` included), and the visible devices follow it the
    way the CUDA runtime would: ``FakeProbe(devices=[a, b, c], env={"CUDA_VISIBLE_DEVICES":
    "2,0"})`` shows ``c`` as logical 0 and ``a`` as logical 1. Physical devices are matched by
    integer position or by ``uuid`` prefix.
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
        parsed = parse_visible_devices(self.env(_visible_var(self)))
        if parsed is None:
            return list(self.devices)
        out: list[DeviceProperties] = []
        for entry in parsed:
            match = _match_physical(entry, self.devices)
            if match is None:  # the CUDA runtime stops at the first unknown entry
                break
            if match in out:
                return []
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


def _match_physical(entry: str, devices: Sequence[DeviceProperties]) -> DeviceProperties | None:
    if entry.isdigit():
        i = int(entry)
        return devices[i] if i < len(devices) else None
    hits = [d for d in devices if d.uuid is not None and d.uuid.startswith(entry)]
    return hits[0] if len(hits) == 1 else None


_DEFAULT_PROBE: TorchProbe | None = None


def default_probe() -> DeviceProbe:
    """The process-wide :class:`TorchProbe` (created on first use)."""
    global _DEFAULT_PROBE
    if _DEFAULT_PROBE is None:
        _DEFAULT_PROBE = TorchProbe()
    return _DEFAULT_PROBE


# --------------------------------------------------------------------------------------------
# CUDA_VISIBLE_DEVICES
# --------------------------------------------------------------------------------------------


def parse_visible_devices(value: str | None) -> list[str] | None:
    """Parse a ``CUDA_VISIBLE_DEVICES`` value the way the CUDA runtime reads it.

    Returns None when the variable is unset (every device visible), else the list of physical
    ids in logical order: integers (``"2,0"`` -> ``["2", "0"]``), GPU UUIDs or MIG ids (kept as
    written). Like CUDA, parsing stops at the first entry that is not valid (``"0,-1,2"`` ->
    ``["0"]``), a leading number is read like ``strtoul`` (``"1gpu"`` -> ``"1"``), and a repeated
    entry hides everything. ``""`` and ``"-1"`` give ``[]``: every GPU hidden.
    """
    if value is None:
        return None
    out: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry.startswith(("GPU-", "MIG-")):
            token = entry
        else:
            digits = re.match(r"^\+?(\d+)", entry)
            if digits is None:
                break
            token = str(int(digits.group(1)))
        if token in out:
            return []
        out.append(token)
    return out


@dataclass(frozen=True)
class VisibleDevices:
    """The visibility variable in force: its name, raw value and parsed physical ids."""

    variable: str
    value: str | None
    physical_ids: tuple[str, ...] | None

    @property
    def hides_all(self) -> bool:
        return self.physical_ids is not None and not self.physical_ids

    def physical_id(self, logical: int) -> str:
        """Physical id of logical device ``logical`` (the entry itself, or the index if unset)."""
        if self.physical_ids is None or logical >= len(self.physical_ids):
            return str(logical)
        return self.physical_ids[logical]

    def describe(self) -> str:
        """``CUDA_VISIBLE_DEVICES='1,0'``, or ``CUDA_VISIBLE_DEVICES unset``."""
        return (
            f"{self.variable}={self.value!r}"
            if self.value is not None
            else f"{self.variable} unset"
        )


def _visible_var(probe: DeviceProbe) -> str:
    if probe.hip_build() is not None and probe.env("HIP_VISIBLE_DEVICES") is not None:
        return "HIP_VISIBLE_DEVICES"
    return "CUDA_VISIBLE_DEVICES"


def visible_devices(*, probe: DeviceProbe | None = None) -> VisibleDevices:
    """The ``CUDA_VISIBLE_DEVICES`` (or, on ROCm, ``HIP_VISIBLE_DEVICES``) mapping in force."""
    probe = probe or default_probe()
    name = _visible_var(probe)
    value = probe.env(name)
    parsed = parse_visible_devices(value)
    return VisibleDevices(name, value, None if parsed is None else tuple(parsed))


# --------------------------------------------------------------------------------------------
# Inventory
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceInfo:
    """One visible accelerator: its logical index and the physical device behind it."""

    device: str
    index: int
    physical_id: str
    name: str
    capability: tuple[int, int] | None
    total_memory: int | None
    free_memory: int | None
    multi_processor_count: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    l2_cache_size: int | None = None
    is_integrated: bool | None = None
    arch: str | None = None

    @property
    def sm(self) -> str | None:
        """``"sm_90"`` for capability (9, 0); None if unknown."""
        return None if self.capability is None else f"sm_{self.capability[0]}{self.capability[1]}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (capability as ``"9.0"``)."""
        data = dataclasses.asdict(self)
        data["capability"] = (
            None if self.capability is None else f"{self.capability[0]}.{self.capability[1]}"
        )
        data["sm"] = self.sm
        return data


def device_inventory(*, probe: DeviceProbe | None = None) -> list[DeviceInfo]:
    """Every accelerator this process can see, in logical order.

    CUDA (and ROCm) devices come with the physical id each maps to under
    ``CUDA_VISIBLE_DEVICES``, name, compute capability and memory. An MPS or XPU device is listed
    with what its backend reports. A CPU-only machine gives ``[]``.

    Free memory comes from ``torch.cuda.mem_get_info``, which creates the CUDA context of every
    device it asks about (a few hundred MiB of device memory each, for the life of the
    process): call this from a diagnostic tool, not from every rank of a multi-GPU job.
    """
    probe = probe or default_probe()
    out: list[DeviceInfo] = []
    if _cuda_built(probe) and probe.cuda_available():
        vis = visible_devices(probe=probe)
        for i in range(probe.device_count()):
            props = probe.properties(i)
            try:
                free: int | None = probe.mem_get_info(i)[0]
            except RuntimeError:  # pragma: no cover - e.g. device in exclusive mode
                free = None
            out.append(
                DeviceInfo(
                    device=f"cuda:{i}",
                    index=i,
                    physical_id=vis.physical_id(i),
                    name=props.name,
                    capability=(props.major, props.minor),
                    total_memory=props.total_memory,
                    free_memory=free,
                    multi_processor_count=props.multi_processor_count,
                    uuid=props.uuid,
                    pci_bus_id=props.pci_bus_id,
                    l2_cache_size=props.l2_cache_size,
                    is_integrated=props.is_integrated,
                    arch=props.gcn_arch_name,
                )
            )
        return out
    for kind in _OTHER_ACCELERATORS:
        if probe.backend_available(kind):
            for i in range(probe.backend_device_count(kind)):
                out.append(
                    DeviceInfo(
                        device=f"{kind}:{i}",
                        index=i,
                        physical_id=str(i),
                        name=kind.upper(),
                        capability=None,
                        total_memory=None,
                        free_memory=None,
                    )
                )
    return out


# --------------------------------------------------------------------------------------------
# Resolution
# --------------------------------------------------------------------------------------------


def _cuda_built(probe: DeviceProbe) -> bool:
    return probe.cuda_build() is not None or probe.hip_build() is not None


def _parse_spec(spec: str | torch.device | int | None) -> tuple[str, int | None]:
    """Split a spec into (type, index); type may be ``"auto"``."""
    if spec is None:
        return "auto", None
    if isinstance(spec, bool):
        raise ConfigError(f"device spec {spec!r} is a bool; pass 'auto', 'cpu', 'cuda:0' or an int")
    if isinstance(spec, int):
        if spec < 0:
            raise ConfigError(f"device index {spec} is negative; use 0 or more (e.g. 0 = 'cuda:0')")
        return "cuda", spec
    if isinstance(spec, torch.device):
        return _check_kind(spec.type, spec.index, spec)
    if not isinstance(spec, str):
        raise ConfigError(
            f"device spec {spec!r} has type {type(spec).__name__}; "
            "pass a str ('auto', 'cpu', 'cuda', 'cuda:1'), an int or a torch.device"
        )
    text = spec.strip().lower()
    if text.isdigit():
        return "cuda", int(text)
    match = _SPEC_RE.match(text)
    if match is None:
        raise ConfigError(
            f"device spec {spec!r} is not understood; use 'auto', 'cpu', 'meta', 'cuda', "
            "'cuda:N', 'mps', 'xpu:N' or an int N (meaning 'cuda:N')"
        )
    index = None if match.group("index") is None else int(match.group("index"))
    return _check_kind(match.group("type"), index, spec)


def _check_kind(kind: str, index: int | None, spec: object) -> tuple[str, int | None]:
    if kind not in ("auto", "cuda", *_PASS_THROUGH, *_OTHER_ACCELERATORS):
        raise ConfigError(
            f"device type {kind!r} in spec {spec!r} is not supported; "
            "use 'auto', 'cpu', 'meta', 'cuda', 'cuda:N', 'mps' or 'xpu'"
        )
    if kind == "auto" and index is not None:
        raise ConfigError(f"device spec {spec!r}: 'auto' takes no index; use 'auto' or 'cuda:N'")
    if index is not None and index < 0:
        raise ConfigError(f"device spec {spec!r} has a negative index; use 0 or more")
    return kind, index


def resolve_device(
    spec: str | torch.device | int | None = "auto", *, probe: DeviceProbe | None = None
) -> torch.device:
    """Turn a device spec into one explicit :class:`torch.device`, with its index.

    - ``"auto"`` / None: ``$TORCHPLACE_DEVICE`` if set; else the first usable accelerator
      (``cuda:N`` with N the current device, normally 0; else ``mps:0`` or ``xpu:N``); else
      ``cpu``.
    - ``"cuda"`` -> ``cuda:N`` (the current device); ``"cuda:1"`` or ``1`` -> ``cuda:1``.
    - ``"cpu"`` and ``"meta"`` are returned as they are.

    Raises :class:`~torchplace.errors.DeviceUnavailableError` when the backend is not usable (a
    CPU-only torch build, ``CUDA_VISIBLE_DEVICES`` hiding every GPU, no driver),
    :class:`~torchplace.errors.DeviceIndexError` for an index past the visible devices and
    :class:`~torchplace.errors.ConfigError` for a spec that does not parse.
    """
    probe = probe or default_probe()
    kind, index = _parse_spec(spec)
    if kind == "auto":
        from_env = probe.env(DEVICE_ENV_VAR)
        if from_env is not None and from_env.strip() and from_env.strip().lower() != "auto":
            try:
                return resolve_device(from_env, probe=probe)
            except ConfigError as exc:
                raise ConfigError(f"${DEVICE_ENV_VAR}={from_env!r}: {exc}") from exc
        return _auto(probe)
    if kind in _PASS_THROUGH:
        return torch.device(kind) if index is None else torch.device(kind, index)
    if kind == "cuda":
        return _resolve_cuda(index, probe)
    return _resolve_other(kind, index, probe)


def _auto(probe: DeviceProbe) -> torch.device:
    if _cuda_built(probe) and probe.cuda_available() and probe.device_count() > 0:
        return torch.device("cuda", probe.current_device())
    preferred = probe.accelerator()
    kinds = [k for k in _OTHER_ACCELERATORS if k == preferred] + [
        k for k in _OTHER_ACCELERATORS if k != preferred
    ]
    for kind in kinds:
        if probe.backend_available(kind) and probe.backend_device_count(kind) > 0:
            return torch.device(kind, probe.backend_current_index(kind))
    return torch.device("cpu")


def _build_name(probe: DeviceProbe) -> str:
    return f"torch {probe.torch_version()}"


def cuda_unavailable_reason(probe: DeviceProbe | None = None) -> tuple[str, str] | None:
    """Why CUDA cannot be used here, as (reason, fix); None when it can."""
    probe = probe or default_probe()
    vis = visible_devices(probe=probe)
    if not _cuda_built(probe):
        reason = (
            f"{_build_name(probe)} is a CPU-only build (torch.version.cuda is None), "
            "so no CUDA device can be used"
        )
        if vis.value is not None:
            reason += f" ({vis.describe()} as well)"
        return reason, _CUDA_WHEEL_FIX
    if vis.hides_all:
        return (
            f"{vis.describe()} hides every GPU from this process",
            f"unset {vis.variable} or list the GPUs to use, e.g. {vis.variable}=0",
        )
    if not probe.cuda_available() or probe.device_count() == 0:
        drv = probe.driver()
        seen = ""
        if drv.physical_gpu_count:
            seen = f"; NVML sees {drv.physical_gpu_count} GPU(s)"
            if vis.value is not None:
                seen += f" but {vis.describe()} matches none of them"
        elif drv.error:
            seen = f"; {drv.error}"
        build = probe.cuda_build() or f"HIP {probe.hip_build()}"
        return (
            f"{_build_name(probe)} is built for CUDA {build} but no CUDA device is usable{seen}",
            "check that 'nvidia-smi' lists a GPU and the driver supports CUDA "
            f"{build}; in a container, run it with GPU access (e.g. 'docker run --gpus all')"
            + (f"; check {vis.describe()}" if vis.value is not None else ""),
        )
    return None


def _listing(probe: DeviceProbe, count: int) -> str:
    vis = visible_devices(probe=probe)
    parts = []
    for i in range(count):
        try:
            name = probe.properties(i).name
        except RuntimeError:  # pragma: no cover - defensive
            name = "?"
        parts.append(f"cuda:{i} = physical {vis.physical_id(i)} ({name})")
    return "; ".join(parts)


def _resolve_cuda(index: int | None, probe: DeviceProbe) -> torch.device:
    problem = cuda_unavailable_reason(probe)
    want = "cuda" if index is None else f"cuda:{index}"
    if problem is not None:
        reason, fix = problem
        raise DeviceUnavailableError(f"cannot use {want!r}: {reason}. Fix: {fix}.")
    count = probe.device_count()
    if index is None:
        return torch.device("cuda", probe.current_device())
    if index >= count:
        vis = visible_devices(probe=probe)
        raise DeviceIndexError(
            f"cannot use {want!r}: {count} CUDA device(s) visible ({vis.describe()}): "
            f"{_listing(probe, count)}. Fix: use an index from 0 to {count - 1}, "
            f"or make more GPUs visible through {vis.variable}."
        )
    return torch.device("cuda", index)


def _resolve_other(kind: str, index: int | None, probe: DeviceProbe) -> torch.device:
    want = kind if index is None else f"{kind}:{index}"
    if not probe.backend_available(kind):
        fix = (
            "use a Mac with Apple silicon and macOS 12.3+ and an arm64 build of torch"
            if kind == "mps"
            else "install the Intel GPU driver and an XPU build of torch "
            "(https://pytorch.org/docs/stable/notes/get_start_xpu.html)"
        )
        raise DeviceUnavailableError(
            f"cannot use {want!r}: {_build_name(probe)} reports no usable {kind} device. "
            f"Fix: {fix}, or ask for 'auto' or 'cpu'."
        )
    count = probe.backend_device_count(kind)
    if index is None:
        return torch.device(kind, probe.backend_current_index(kind))
    if index >= count:
        raise DeviceIndexError(
            f"cannot use {want!r}: {count} {kind} device(s) visible "
            f"({', '.join(f'{kind}:{i}' for i in range(count))}). "
            f"Fix: use an index from 0 to {count - 1}."
        )
    return torch.device(kind, index)
