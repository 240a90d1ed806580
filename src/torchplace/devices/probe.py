"""Every hardware question torchplace asks, behind one injectable :class:`DeviceProbe`.

The default, :class:`TorchProbe`, asks torch (and NVML for the driver) only when a method is
called, never at import; :func:`default_probe` is the process-wide one. Tests and CPU-only CI
pass a :class:`~torchplace.devices.fake.FakeProbe` instead.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from torchplace.errors import ConfigError

__all__ = [
    "DeviceProbe",
    "DeviceProperties",
    "DriverInfo",
    "TorchProbe",
    "checked_probe",
    "cuda_built",
    "default_probe",
]


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


_DEFAULT_PROBE: TorchProbe | None = None


def default_probe() -> DeviceProbe:
    """The process-wide :class:`TorchProbe` (created on first use)."""
    global _DEFAULT_PROBE
    if _DEFAULT_PROBE is None:
        _DEFAULT_PROBE = TorchProbe()
    return _DEFAULT_PROBE


def checked_probe(probe: object) -> DeviceProbe:
    """``probe`` itself when it is a :class:`DeviceProbe`, :func:`default_probe` when None;
    anything else (a number, a string, an object that lacks the probe's methods) raises
    :class:`~torchplace.errors.ConfigError` naming it, rather than an ``AttributeError`` at
    the first question asked of it (or, for a false value such as ``0``, this machine's probe
    used in its place)."""
    if probe is None:
        return default_probe()
    if isinstance(probe, DeviceProbe):
        return probe
    lacks = [n for n in _PROBE_METHODS if not callable(getattr(probe, n, None))]
    raise ConfigError(
        f"probe={probe!r:.80} ({type(probe).__name__}) is not a device probe: a probe answers "
        "the hardware questions through the methods of torchplace.devices.DeviceProbe "
        f"(cuda_build(), device_count(), properties(index), ...), and it lacks {len(lacks)} of "
        f"them ({', '.join(lacks[:4])}{', ...' if len(lacks) > 4 else ''}). Fix: leave "
        "probe=None for this machine, or pass torchplace.devices.FakeProbe(...) to describe "
        "another"
    )


_PROBE_METHODS = tuple(
    name
    for name in vars(DeviceProbe)
    if not name.startswith("_") and callable(getattr(DeviceProbe, name))
)


def cuda_built(probe: DeviceProbe) -> bool:
    """True when torch is a CUDA (or ROCm) build, whether or not a GPU is usable."""
    return probe.cuda_build() is not None or probe.hip_build() is not None
