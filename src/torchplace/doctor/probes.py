"""The facts the doctor reads: the torch build, its settings, the driver, the toolkit, the
environment and the visible devices, gathered once into :class:`Facts` through a device probe."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchplace.devices import DeviceInfo, DeviceProbe, DriverInfo, VisibleDevices

__all__ = [
    "ENV_VARS",
    "Facts",
    "build_kind",
    "cpu_limits",
    "driver_from_proc",
    "gather",
    "nvcc_version",
    "one_line",
    "tf32_allowed",
]

ENV_VARS = (
    "TORCHPLACE_DEVICE",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_MODULE_LOADING",
    "CUDA_LAUNCH_BLOCKING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "PYTORCH_NVML_BASED_CUDA_CHECK",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
)


@dataclass
class Facts:
    """What one look at the machine found; the checks and the report are derived from it.

    ``init_error`` is the runtime's own failure when asking for the devices (a driver too old
    for the runtime, a lost device), which the checks report instead of raising;
    ``device_errors`` the error of each visible device that could not be read (by its name,
    ``cuda:1``), and ``probe_errors`` each other question the probe failed to answer, as
    (question, error): the report shows that fact as unknown.
    """

    probe: DeviceProbe
    flags: dict[str, Any]
    cuda_build: str | None
    hip_build: str | None
    hip_runtime: str | None
    miopen: str | None
    cudnn: int | None
    arch_list: list[str]
    env: dict[str, str | None]
    visible: VisibleDevices
    driver: DriverInfo
    driver_version: str | None
    nvcc: str | None
    backends: dict[str, bool]
    cuda_available: bool = False
    device_count: int = 0
    inventory: list[DeviceInfo] = field(default_factory=list)
    init_error: Exception | None = None
    torch_version: str = "unknown"
    accelerator: str | None = None
    module_loading: str | None = None
    device_errors: dict[str, str] = field(default_factory=dict)
    cpu_affinity: int | None = None
    cpu_quota: float | None = None
    probe_errors: list[tuple[str, str]] = field(default_factory=list)

    @property
    def built(self) -> bool:
        """Whether torch was built for a GPU (CUDA or ROCm)."""
        return self.cuda_build is not None or self.hip_build is not None


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, for a report."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Asker:
    """Asks the probe one question at a time; a question that raises is noted and answered with
    a default, so that one broken answer leaves the rest of the report standing."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, str]] = []

    def __call__(self, question: str, call: Callable[[], Any], default: Any) -> Any:
        try:
            return call()
        except Exception as exc:  # any probe, ours or injected, may fail in its own way
            if question not in (q for q, _ in self.errors):
                self.errors.append((question, one_line(exc)))
            return default


def gather(
    probe: DeviceProbe,
    toolkit: Callable[[], str | None] = lambda: None,
    cpus: Callable[[], tuple[int | None, float | None]] = lambda: (None, None),
) -> Facts:
    """Ask ``probe`` (and the host) everything the doctor reports, once.

    Nothing a probe raises escapes: a question that fails is in ``probe_errors`` (or, for the
    devices, ``init_error`` and ``device_errors``) and its fact is reported as unknown.
    """
    from torchplace.devices import DriverInfo, VisibleDevices, visible_devices

    ask = _Asker()
    cuda_build = ask("cuda_build", probe.cuda_build, None)
    hip_build = ask("hip_build", probe.hip_build, None)
    built = cuda_build is not None or hip_build is not None
    hip_runtime, miopen = _hip_config() if hip_build is not None else (None, None)
    driver = ask("driver", probe.driver, None)
    if driver is None:  # said once, in the driver check, not as a probe error as well
        driver = DriverInfo(True, error=f"asking for the driver failed: {ask.errors.pop()[1]}")
    facts = Facts(
        probe=probe,
        flags=torch_flags(),
        cuda_build=cuda_build,
        hip_build=hip_build,
        hip_runtime=hip_runtime,
        miopen=miopen,
        cudnn=ask("cudnn_version", probe.cudnn_version, None),
        arch_list=ask("arch_list", probe.arch_list, []) if built else [],
        env={name: ask("env", partial(probe.env, name), None) for name in ENV_VARS},
        visible=ask(
            "visible devices",
            lambda: visible_devices(probe=probe),
            VisibleDevices("CUDA_VISIBLE_DEVICES", None, None),
        ),
        driver=driver,
        driver_version=driver.driver_version or driver_from_proc(),
        nvcc=toolkit(),
        backends={},
        torch_version=ask("torch_version", probe.torch_version, "unknown"),
    )
    _devices(facts, probe, built)
    facts.cpu_affinity, facts.cpu_quota = ask("cpu limits", cpus, (None, None))
    facts.backends = {
        kind: bool(
            ask(f"backend_available({kind!r})", partial(probe.backend_available, kind), False)
        )
        for kind in ("mps", "xpu")
    }
    facts.accelerator = ask("accelerator", probe.accelerator, None)
    # read after CUDA init, which sets LAZY when unset (as collect_env reports it)
    facts.module_loading = ask("env", partial(probe.env, "CUDA_MODULE_LOADING"), None)
    facts.probe_errors = ask.errors
    return facts


def _devices(facts: Facts, probe: DeviceProbe, built: bool) -> None:
    """Whether CUDA is available, how many devices it sees, and each one it can read."""
    from torchplace.devices import inventory_by_device

    try:
        facts.cuda_available = built and bool(probe.cuda_available())
        facts.device_count = probe.device_count() if facts.cuda_available else 0
        facts.inventory, failed = inventory_by_device(probe=probe)
    except Exception as exc:  # e.g. a driver too old for the runtime
        facts.init_error = exc
        return
    facts.device_errors = {name: one_line(exc) for name, exc in failed.items()}


def nvcc_version() -> str | None:
    """Version of the ``nvcc`` on PATH (the CUDA toolkit; pip wheels bring their own runtime)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        out = subprocess.run(
            [nvcc, "--version"],
            capture_output=True,
            text=True,
            errors="replace",  # a wrapper may print bytes that are not UTF-8
            timeout=2,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release .+ V(\S+)", out)
    return match.group(1) if match else None


def cpu_limits(
    cgroup: str = "/sys/fs/cgroup", own: str = "/proc/self/cgroup"
) -> tuple[int | None, float | None]:
    """(CPUs this process may run on, the CPU quota of its cgroup in CPUs), each None when
    unknown or unlimited: cgroup v2 ``cpu.max`` (``"200000 100000"`` is 2 CPUs), else v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``. The quota is read in the process's own
    cgroup (named in ``own``, ``/proc/self/cgroup``) and every cgroup above it, the smallest
    winning: outside a cgroup namespace (``systemd-run -p CPUQuota=``, ``docker
    --cgroupns=host``) the mount's top holds no limit. torch sizes its thread pool by cores, not
    by the quota a container runs under."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    base = cgroup.rstrip("/")
    v2, v1 = _own_cgroups(own)
    quotas = [_quota(f"{d}/cpu.max", None) for d in _upwards(base, v2)]
    if not any(quotas):
        quotas = [
            _quota(f"{d}/cpu.cfs_quota_us", f"{d}/cpu.cfs_period_us")
            for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu")
            for d in _upwards(f"{base}/{mount}", v1)
        ]
    limits = [q for q in quotas if q is not None]
    return affinity, min(limits) if limits else None


def _own_cgroups(own: str) -> tuple[str, str]:
    """The process's cgroup v2 path and v1 ``cpu`` controller path, "" when unknown."""
    try:
        with open(own, encoding="utf-8", errors="replace") as f:
            lines = f.read(65536).splitlines()
    except OSError:  # no /proc (a sandbox), or not Linux
        return "", ""
    v2 = v1 = ""
    for line in lines:
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not controllers:
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _upwards(top: str, path: str) -> list[str]:
    """``top/path`` and each directory above it up to ``top``; ``top`` alone for a path that
    leaves the mount (``/../..``, a cgroup outside this namespace)."""
    parts = [p for p in path.strip().split("/") if p]
    if ".." in parts:
        parts = []
    return [os.path.join(top, *parts[:n]) for n in range(len(parts), -1, -1)]


def _quota(quota_path: str, period_path: str | None) -> float | None:
    """One cgroup's CPU quota in CPUs; None when it has none (``max``, ``-1``), or its files are
    absent or unreadable."""
    try:
        with open(quota_path, encoding="utf-8") as f:
            fields = f.read(256).split()
        if period_path is not None:
            with open(period_path, encoding="utf-8") as f:
                fields += f.read(256).split()
        quota, period = float(fields[0]), float(fields[1])
    except (OSError, ValueError, IndexError):
        return None
    cpus = quota / period if quota > 0 and period > 0 else math.nan
    return cpus if math.isfinite(cpus) else None


def build_kind(cuda: str | None, hip: str | None) -> str:
    """``ROCm (HIP x)``, ``CUDA x`` or ``CPU-only``."""
    if hip is not None:
        return f"ROCm (HIP {hip})"
    if cuda is not None:
        return f"CUDA {cuda}"
    return "CPU-only"


def driver_from_proc(path: str = "/proc/driver/nvidia/version") -> str | None:
    """The driver version the NVIDIA kernel module reports, None when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(65536)
    except OSError:
        return None
    match = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d[\d.]+)", text)
    return match.group(1) if match else None


def _hip_config() -> tuple[str | None, str | None]:
    import torch

    cfg = torch.__config__.show().splitlines()

    def pick(prefix: str) -> str | None:
        hits = [line.rsplit(None, 1)[-1] for line in cfg if prefix in line]
        return hits[0] if hits else None

    return pick("HIP Runtime"), pick("MIOpen")


def _read(getter: Callable[[], Any]) -> Any:
    """A torch setting, or None when torch refuses to answer or does not have it.

    Since torch 2.9 the legacy TF32 getters (``torch.get_float32_matmul_precision()``,
    ``torch.backends.cuda.matmul.allow_tf32``) raise RuntimeError once the new
    ``fp32_precision`` API was used to set something the legacy one cannot express; before 2.9,
    ``torch.backends.cuda.matmul.fp32_precision`` raises AttributeError.
    """
    try:
        return getter()
    except (RuntimeError, AttributeError):
        return None


def torch_flags() -> dict[str, Any]:
    """The build's debug flag, CPU backends and threads, and its matmul precision settings."""
    import torch
    import torch.backends.xnnpack

    backends: Any = torch.backends  # some of its is_available() are untyped
    matmul: Any = torch.backends.cuda.matmul
    allow_tf32 = _read(lambda: matmul.allow_tf32)
    return {
        "debug_build": bool(torch.version.debug),
        "xnnpack": bool(getattr(torch.backends.xnnpack, "enabled", False)),
        "mkldnn": bool(backends.mkldnn.is_available()),
        "mkl": bool(backends.mkl.is_available()),
        "openmp": bool(backends.openmp.is_available()),
        "cpu_threads": int(torch.get_num_threads()),
        "float32_matmul_precision": _read(torch.get_float32_matmul_precision),
        "cuda_matmul_allow_tf32": None if allow_tf32 is None else bool(allow_tf32),
        # torch >= 2.9: "ieee", "tf32" or "none" (follow the legacy settings); None before
        "cuda_matmul_fp32_precision": _read(lambda: matmul.fp32_precision),
        "xpu_build": getattr(torch.version, "xpu", None),
    }


def tf32_allowed(flags: dict[str, Any]) -> bool:
    """Whether float32 CUDA matmuls may run in TF32 (a setting torch refuses to report counts)."""
    if flags["cuda_matmul_fp32_precision"] == "tf32" or flags["cuda_matmul_allow_tf32"]:
        return True
    if flags["cuda_matmul_fp32_precision"] == "ieee":
        return False
    return bool(flags["float32_matmul_precision"] != "highest")  # None (refused): be safe
