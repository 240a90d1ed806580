"""Check that torch really runs on a device, and report what is visible.

``torchplace doctor`` reports the torch build (CPU-only, CUDA or ROCm, with compiled CUDA, cuDNN,
HIP and MIOpen versions), the driver (through NVML when ``nvidia-ml-py`` is installed), every
visible device with the physical GPU it maps to under ``CUDA_VISIBLE_DEVICES``, its memory and
compute capability against the build's arch list, and then runs smoke tests on the chosen device:
a host -> device -> host round trip from pinned memory with ``non_blocking=True``, and a matmul
compared with a float64 CPU reference. Each problem comes with a verdict and a fix.

Exit status: 0 when the requested device is usable, 1 when it is not, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

    from torchplace.devices import DeviceInfo, DeviceProbe

__all__ = [
    "Check",
    "arch_support",
    "collect",
    "configure",
    "matmul_check",
    "nvcc_version",
    "pinned_memory_check",
    "render",
    "round_trip_check",
    "run",
]

Status = Literal["pass", "warn", "fail", "skip", "info"]

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
)
_ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
# compute capabilities of integrated GPUs (Jetson/Tegra): their cubins do not mix with dGPUs
_IGPU_CC = {53, 62, 72, 87}
_ROUND_TRIP_ELEMENTS = 1 << 20  # 4 MiB of float32
_MATMUL_N = 256
_MATMUL_TOL = 1e-4  # float32 with full-precision accumulate: ~1e-7 in practice
_MATMUL_TOL_TF32 = 1e-2  # TF32 keeps 10 mantissa bits: ~1e-3 in practice
_LOW_FREE_FRACTION = 0.10


@dataclass(frozen=True)
class Check:
    """One line of the verdict: what was checked, how it went, and the fix when it failed.

    ``applies_to`` scopes the check: None (always), a device type (``"cuda"``) or one device
    (``"cuda:1"``). Only failures that apply to the requested device make it unusable.
    """

    name: str
    status: Status
    detail: str
    fix: str | None = None
    applies_to: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def concerns(self, device: str | None) -> bool:
        if self.applies_to is None:
            return True
        if device is None:
            return False
        return self.applies_to in (device, device.split(":", 1)[0])


# --------------------------------------------------------------------------------------------
# Facts
# --------------------------------------------------------------------------------------------


def arch_support(capability: tuple[int, int], arch_list: list[str]) -> tuple[Status, str]:
    """Whether a build with ``arch_list`` has kernels for a GPU of ``capability``.

    ``sm_XY`` cubins run natively on X.Y and, within the same major version, on later minors
    (integrated Tegra parts excepted); ``compute_XY`` PTX is JIT-compiled for any X.Y or newer,
    which works but makes the first run slow.
    """
    dev = capability[0] * 10 + capability[1]
    sm = f"sm_{dev}"
    cubins: list[int] = []
    ptx: list[int] = []
    for arch in arch_list:
        match = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", arch)
        if match is None:
            continue
        code, suffix = int(match.group(2)), match.group(3)
        if match.group(1) == "compute":
            ptx.append(code)
        elif suffix != "a" or code == dev:
            cubins.append(code)
    if dev in cubins:
        return "pass", f"{sm} is in the build"
    compatible = [
        c
        for c in cubins
        if c // 10 == dev // 10
        and c % 10 <= dev % 10
        and (c in _IGPU_CC) == (dev in _IGPU_CC)
        and (c not in _IGPU_CC or c == dev)
    ]
    if compatible:
        return "pass", f"{sm} runs the build's sm_{max(compatible)} kernels (same major version)"
    jit = [c for c in ptx if c <= dev]
    if jit:
        return "warn", f"{sm} has no cubin; kernels are JIT-compiled from compute_{max(jit)} PTX"
    return "fail", f"{sm} is not in the build's arch list ({' '.join(arch_list) or 'empty'})"


def nvcc_version() -> str | None:
    """Version of the ``nvcc`` on PATH (the CUDA toolkit; pip wheels bring their own runtime)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        out = subprocess.run(
            [nvcc, "--version"], capture_output=True, text=True, timeout=2, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release .+ V(\S+)", out)
    return match.group(1) if match else None


def _driver_from_proc() -> str | None:
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            text = f.read()
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


def _torch_flags() -> dict[str, Any]:
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


def _tf32(flags: dict[str, Any]) -> bool:
    """Whether float32 CUDA matmuls may run in TF32 (a setting torch refuses to report counts)."""
    if flags["cuda_matmul_fp32_precision"] == "tf32" or flags["cuda_matmul_allow_tf32"]:
        return True
    if flags["cuda_matmul_fp32_precision"] == "ieee":
        return False
    return bool(flags["float32_matmul_precision"] != "highest")  # None (refused): be safe


# --------------------------------------------------------------------------------------------
# Smoke tests
# --------------------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type not in ("cpu", "meta") and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize(device)


def pinned_memory_check(device: torch.device) -> Check:
    """Whether page-locked host memory can be allocated for ``device``'s backend."""
    import torch

    if device.type in ("cpu", "meta"):
        return Check(
            "pinned-memory",
            "skip",
            f"not needed on {device.type}: there is no host<->device copy to speed up",
        )
    try:
        pinned = torch.empty(1024, pin_memory=True).is_pinned()
    except RuntimeError as exc:
        return Check(
            "pinned-memory",
            "fail",
            f"cannot allocate pinned host memory: {exc}",
            "check the locked-memory limit ('ulimit -l') and, in a container, its memory limits",
            str(device),
        )
    if not pinned:
        return Check(
            "pinned-memory", "fail", "pin_memory=True gave pageable memory", None, str(device)
        )
    return Check("pinned-memory", "pass", "page-locked host memory allocates", None, str(device))


def round_trip_check(device: torch.device, *, elements: int = _ROUND_TRIP_ELEMENTS) -> Check:
    """Copy host -> ``device`` -> host with ``non_blocking=True`` from pinned memory; compare."""
    import torch

    name = "round-trip"
    if device.type == "meta":
        return Check(name, "skip", "meta tensors hold no data, so there is nothing to compare")
    gen = torch.Generator().manual_seed(0)
    host = torch.randn(elements, generator=gen)
    mib = host.numel() * host.element_size() / 2**20
    if device.type == "cpu":
        # No host/device boundary on cpu: check a plain copy honestly, without pretending.
        back = host.to(device, copy=True)
        ok = torch.equal(host, back)
        return Check(
            name,
            "pass" if ok else "fail",
            f"cpu copy of {mib:.0f} MiB {'equal' if ok else 'DIFFERS'} "
            "(cpu check: no host<->device transfer, pinned memory not used)",
            None if ok else "the CPU copy is corrupt: test the machine's memory",
            str(device),
        )
    try:
        pinned = True
        try:
            host = host.pin_memory()
            out = torch.empty(elements, pin_memory=True)
        except RuntimeError:
            pinned = False
            out = torch.empty(elements)
        start = time.perf_counter()
        on_device = host.to(device, non_blocking=pinned)
        # Same stream as the H2D copy, so this D2H copy is ordered after it: no sync needed here.
        out.copy_(on_device, non_blocking=pinned)
        _sync(device)  # the host must not read `out` until the D2H copy is finished
        seconds = time.perf_counter() - start
    except RuntimeError as exc:
        return Check(
            name,
            "fail",
            f"copy to {device} failed: {exc}",
            "the device is not usable; check 'nvidia-smi' and the driver logs (dmesg)",
            str(device),
        )
    ok = torch.equal(host, out)
    how = "pinned, non_blocking" if pinned else "pageable (pinning failed), blocking"
    detail = (
        f"{mib:.0f} MiB cpu -> {device} -> cpu ({how}) "
        f"{'equal' if ok else 'DIFFERS'} in {seconds * 1e3:.1f} ms"
    )
    if not ok:
        return Check(
            name,
            "fail",
            detail,
            "data came back changed: a missing synchronisation or a faulty device; "
            "run 'compute-sanitizer' or check the GPU with 'nvidia-smi -q -d ECC'",
            str(device),
        )
    return Check(name, "pass" if pinned else "warn", detail, None, str(device))


def matmul_check(
    device: torch.device, *, n: int = _MATMUL_N, tf32: bool | None = None
) -> tuple[Check, float | None]:
    """float32 matmul on ``device`` against a float64 CPU reference; returns the relative error."""
    import torch

    name = "matmul"
    if device.type == "meta":
        return (
            Check(name, "skip", "meta tensors hold no data, so there is no result to compare"),
            None,
        )
    if tf32 is None:
        tf32 = _tf32(_torch_flags())
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(n, n, generator=gen)
    b = torch.randn(n, n, generator=gen)
    reference = a.double() @ b.double()
    try:
        result = (a.to(device) @ b.to(device)).to("cpu").double()
    except RuntimeError as exc:
        return (
            Check(
                name,
                "fail",
                f"matmul on {device} failed: {exc}",
                "the device cannot run kernels from this build; see the arch check above",
                str(device),
            ),
            None,
        )
    error = float((result - reference).norm() / reference.norm())
    tol = _MATMUL_TOL_TF32 if tf32 else _MATMUL_TOL
    label = f"{n}x{n} float32 matmul on {device} vs float64 cpu: relative error {error:.2e}"
    label += f" (limit {tol:.0e}{', TF32 allowed' if tf32 else ''})"
    if device.type == "cpu":
        label += " (cpu check)"
    if not error <= tol:  # also catches NaN
        return (
            Check(
                name,
                "fail",
                label,
                "the device computes wrong results: check for overclocking, ECC errors "
                "('nvidia-smi -q -d ECC') or a broken torch install",
                str(device),
            ),
            error,
        )
    return Check(name, "pass", label, None, str(device)), error


# --------------------------------------------------------------------------------------------
# Collect
# --------------------------------------------------------------------------------------------


def _split_fix(message: str) -> tuple[str, str | None]:
    message = re.sub(r"^cannot use '[^']*': ", "", message)
    reason, sep, fix = message.partition(" Fix: ")
    return (reason.rstrip("."), fix.rstrip(".")) if sep else (message, None)


def _build_kind(cuda: str | None, hip: str | None) -> str:
    if hip is not None:
        return f"ROCm (HIP {hip})"
    if cuda is not None:
        return f"CUDA {cuda}"
    return "CPU-only"


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = re.findall(r"\d+", text)
    return tuple(int(p) for p in parts[:2]) if parts else None


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**30:.1f} GiB"


def collect(
    spec: str | None = "auto",
    *,
    probe: DeviceProbe | None = None,
    smoke: bool = True,
    toolkit: Callable[[], str | None] = nvcc_version,
) -> dict[str, Any]:
    """Gather the whole report as a JSON-ready dict (see ``torchplace doctor --json``).

    Warnings torch raises on the way (an unsupported GPU, a driver too old, ...) are caught and
    reported as ``torch-warning`` checks (``warning`` for other sources) instead of being printed.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = _collect(spec, probe=probe, smoke=smoke, toolkit=toolkit)
    seen: set[str] = set()
    for w in caught:
        text = " ".join(str(w.message).split())
        if text in seen:
            continue
        seen.add(text)
        source = "torch-warning" if f"{os.sep}torch{os.sep}" in w.filename else "warning"
        report["checks"].append(
            Check(source, "warn", f"{w.category.__name__}: {text}", None, "cuda").to_dict()
        )
        report["verdict"]["warnings"].append(text)
    return report


def _collect(
    spec: str | None,
    *,
    probe: DeviceProbe | None,
    smoke: bool,
    toolkit: Callable[[], str | None],
) -> dict[str, Any]:
    from torchplace import __version__
    from torchplace.devices import (
        DEVICE_ENV_VAR,
        cuda_unavailable_reason,
        default_probe,
        device_inventory,
        resolve_device,
        visible_devices,
    )
    from torchplace.errors import ConfigError, DeviceError

    probe = probe or default_probe()
    checks: list[Check] = []
    flags = _torch_flags()
    cuda_build, hip_build = probe.cuda_build(), probe.hip_build()
    built = cuda_build is not None or hip_build is not None
    hip_runtime, miopen = _hip_config() if hip_build is not None else (None, None)
    cudnn = probe.cudnn_version()
    arch_list = probe.arch_list() if built else []
    env = {name: probe.env(name) for name in ENV_VARS}
    vis = visible_devices(probe=probe)
    driver = probe.driver()
    driver_version = driver.driver_version or _driver_from_proc()
    nvcc = toolkit()

    # -- availability and inventory ------------------------------------------------------
    cuda_available = False
    device_count = 0
    inventory: list[DeviceInfo] = []
    try:
        cuda_available = built and probe.cuda_available()
        device_count = probe.device_count() if cuda_available else 0
        inventory = device_inventory(probe=probe)
    except RuntimeError as exc:  # e.g. a driver too old for the runtime
        checks.append(
            Check(
                "cuda-init",
                "fail",
                f"querying CUDA devices failed: {exc}",
                "update the NVIDIA driver to one that supports this CUDA build, "
                "and check 'nvidia-smi'",
                "cuda",
            )
        )
    backends = {kind: probe.backend_available(kind) for kind in ("mps", "xpu")}

    # -- build ---------------------------------------------------------------------------
    if not built:
        checks.append(
            Check(
                "build",
                "warn",
                f"torch {probe.torch_version()} is a CPU-only build (torch.version.cuda is None): "
                "it cannot use an NVIDIA or AMD GPU",
                "to use a GPU, install a CUDA build of torch, e.g. 'pip install torch "
                "--index-url https://download.pytorch.org/whl/cu128'",
                "cuda",
            )
        )
    else:
        checks.append(
            Check(
                "build",
                "pass",
                f"torch {probe.torch_version()}, {_build_kind(cuda_build, hip_build)} build",
            )
        )

    # -- driver --------------------------------------------------------------------------
    if not driver.nvml_installed:
        checks.append(
            Check(
                "driver",
                "info",
                "nvidia-ml-py is not installed, so NVML was not asked"
                + (f"; kernel module reports driver {driver_version}" if driver_version else ""),
                "pip install nvidia-ml-py (or torchplace[nvml]) for driver and physical GPU details",
                "cuda",
            )
        )
    elif driver.error:
        checks.append(
            Check(
                "driver",
                "fail" if built and not cuda_available and hip_build is None else "info",
                driver.error,
                "install the NVIDIA driver and check that 'nvidia-smi' works" if built else None,
                "cuda",
            )
        )
    else:
        need, have = _version_tuple(cuda_build), _version_tuple(driver.cuda_driver_version)
        detail = (
            f"driver {driver.driver_version} supports CUDA up to {driver.cuda_driver_version}; "
            f"{driver.physical_gpu_count} physical GPU(s)"
        )
        if need and have and have[0] < need[0] and not cuda_available:
            checks.append(
                Check(
                    "driver",
                    "fail",
                    f"{detail}, but torch was built with CUDA {cuda_build}",
                    f"update the NVIDIA driver to one that supports CUDA {cuda_build}, "
                    "or install a torch build for an older CUDA",
                    "cuda",
                )
            )
        elif need and have and have[0] < need[0]:
            # CUDA initialised all the same: a CUDA forward-compatibility package (cuda-compat,
            # as in many datacenter containers) supplies a newer user-mode driver than the
            # kernel driver NVML reports; the smoke tests say whether it really works
            checks.append(
                Check(
                    "driver",
                    "warn",
                    f"{detail}; torch was built with CUDA {cuda_build} and CUDA initialised "
                    "anyway (a forward-compatibility package?)",
                    f"to run without a compatibility package, update the NVIDIA driver to one "
                    f"that supports CUDA {cuda_build}",
                    "cuda",
                )
            )
        elif need and have and have < need:
            checks.append(
                Check(
                    "driver",
                    "warn",
                    f"{detail}; torch was built with CUDA {cuda_build} (runs through minor "
                    "version compatibility; PTX JIT may fail)",
                    f"update the NVIDIA driver to one that supports CUDA {cuda_build}",
                    "cuda",
                )
            )
        else:
            checks.append(Check("driver", "pass", detail, None, "cuda"))

    # -- visibility ----------------------------------------------------------------------
    if built and vis.hides_all:
        checks.append(
            Check(
                "visible-devices",
                "fail",
                f"{vis.describe()} hides every GPU from this process",
                f"unset {vis.variable} or list the GPUs to use, e.g. {vis.variable}=0",
                "cuda",
            )
        )
    elif vis.value is not None:
        mapping = ", ".join(f"{d.device} = physical {d.physical_id}" for d in inventory)
        checks.append(
            Check(
                "visible-devices",
                "info",
                f"{vis.describe()}: {mapping or 'no device mapped'}",
                None,
                "cuda",
            )
        )
    physical = driver.physical_gpu_count or len(inventory)
    if physical > 1 and env["CUDA_DEVICE_ORDER"] != "PCI_BUS_ID" and hip_build is None:
        checks.append(
            Check(
                "device-order",
                "warn",
                "CUDA numbers GPUs fastest first by default, nvidia-smi by PCI bus: "
                "indices may not match between them",
                "export CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA and nvidia-smi agree",
                "cuda",
            )
        )

    # -- per device ----------------------------------------------------------------------
    devices: list[dict[str, Any]] = []
    for info in inventory:
        entry = info.to_dict()
        if info.capability is not None and cuda_build is not None and arch_list:
            status, detail = arch_support(info.capability, arch_list)
            entry["arch_support"] = status
            checks.append(
                Check(
                    f"arch {info.device}",
                    status,
                    f"{info.name}: {detail}",
                    None
                    if status == "pass"
                    else f"install a torch build whose arch list includes {info.sm} "
                    "(see https://pytorch.org/get-started/locally/), or build from source with "
                    f"TORCH_CUDA_ARCH_LIST={info.capability[0]}.{info.capability[1]}",
                    info.device,
                )
            )
        if info.free_memory is not None and info.total_memory:
            fraction = info.free_memory / info.total_memory
            entry["free_fraction"] = round(fraction, 4)
            if fraction < _LOW_FREE_FRACTION:
                checks.append(
                    Check(
                        f"memory {info.device}",
                        "warn",
                        f"only {_gib(info.free_memory)} of {_gib(info.total_memory)} free: "
                        "another process is using this GPU",
                        "see 'nvidia-smi' for the processes; pick another GPU or stop them",
                        info.device,
                    )
                )
        devices.append(entry)

    # -- the requested device ------------------------------------------------------------
    chosen: torch.device | None = None
    try:
        chosen = resolve_device(spec, probe=probe)
    except ConfigError:
        raise
    except DeviceError as exc:
        reason, fix = _split_fix(str(exc))
        checks.append(Check("resolve", "fail", reason, fix, None))
    except RuntimeError as exc:  # the runtime itself failed (driver too old, device lost, ...)
        checks.append(
            Check(
                "resolve",
                "fail",
                f"asking the runtime about {spec!r} failed: {exc}",
                "check 'nvidia-smi' and that the driver supports this torch build",
                None,
            )
        )
    else:
        note = ""
        from_env = probe.env(DEVICE_ENV_VAR)
        if spec in (None, "auto") and from_env:
            note = f" (from ${DEVICE_ENV_VAR}={from_env!r})"
        elif spec in (None, "auto") and chosen.type == "cpu":
            problem = cuda_unavailable_reason(probe)
            note = f" (no accelerator: {problem[0]})" if problem else " (no accelerator)"
        checks.append(Check("resolve", "pass", f"{spec!r} -> {chosen}{note}", None, None))

    error: float | None = None
    if chosen is not None and smoke:
        checks.append(pinned_memory_check(chosen))
        checks.append(round_trip_check(chosen))
        matmul, error = matmul_check(chosen, tf32=_tf32(flags))
        checks.append(matmul)

    device_str = None if chosen is None else str(chosen)
    # a device that did not resolve is still judged by the checks of its type ("cuda:0" that
    # cannot be used also gets the driver's and the visibility's fixes)
    scope = device_str
    if scope is None and isinstance(spec, str) and re.fullmatch(r"cuda(:\d+)?", spec.strip()):
        scope = spec.strip()
    failures = [c for c in checks if c.status == "fail" and c.concerns(scope)]
    usable = chosen is not None and not failures
    if usable:
        summary = f"{device_str} is usable"
        if not smoke:
            summary += " (smoke tests skipped)"
    else:
        target = device_str or str(spec)
        # every cause on the one line: the first failure, then the others
        summary = f"{target} is not usable" + (
            ": " + "; also: ".join(dict.fromkeys(c.detail for c in failures)) if failures else ""
        )
    verdict = {
        "usable": usable,
        "status": "ok" if usable else "fail",
        "requested": spec,
        "device": device_str,
        "summary": summary,
        "fixes": list(dict.fromkeys(c.fix for c in failures if c.fix)),  # once each, in order
        "warnings": [c.detail for c in checks if c.status == "warn"],
    }

    alloc = {name: env[name] for name in _ALLOC_VARS if env[name]}
    models = [f"{d.device}: {d.name}" for d in inventory]
    return {
        "torchplace_version": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "build": {
            "torch_version": probe.torch_version(),
            "kind": _build_kind(cuda_build, hip_build),
            "cpu_only": not built,
            "cuda_compiled_version": cuda_build,
            "hip_compiled_version": hip_build,
            "hip_runtime_version": hip_runtime,
            "miopen_runtime_version": miopen,
            "cudnn_version": None if hip_build else cudnn,
            "arch_list": arch_list,
            **flags,
        },
        "driver": {
            "nvml": "installed" if driver.nvml_installed else "not installed",
            "driver_version": driver_version,
            "cuda_driver_version": driver.cuda_driver_version,
            "physical_gpu_count": driver.physical_gpu_count,
            "physical_gpus": list(driver.physical_gpus),
            "error": driver.error,
        },
        "toolkit": {"nvcc_version": nvcc},
        "environment": env,
        "cuda": {
            "is_available": cuda_available,
            "device_count": device_count,
            "visible_devices_variable": vis.variable,
            "visible_devices": vis.value,
            "visible_physical_ids": None if vis.physical_ids is None else list(vis.physical_ids),
        },
        "accelerators": {
            "current": probe.accelerator(),
            "mps_available": backends["mps"],
            "xpu_available": backends["xpu"],
        },
        "devices": devices,
        "smoke": {
            "ran": bool(chosen is not None and smoke),
            # JSON has no NaN: a non-finite error is reported as its text
            "matmul_relative_error": error if error is None or math.isfinite(error) else str(error),
        },
        "checks": [c.to_dict() for c in checks],
        "verdict": verdict,
        # the device-related fields of `python -m torch.utils.collect_env`, under its own names
        "collect_env": {
            "torch_version": probe.torch_version(),
            "is_debug_build": flags["debug_build"],
            "cuda_compiled_version": cuda_build,
            "hip_compiled_version": hip_build,
            "hip_runtime_version": hip_runtime,
            "miopen_runtime_version": miopen,
            "is_cuda_available": cuda_available,
            "cuda_runtime_version": nvcc,
            # read after CUDA init, which sets LAZY when unset (as collect_env reports it)
            "cuda_module_loading": probe.env("CUDA_MODULE_LOADING"),
            "nvidia_gpu_models": models or list(driver.physical_gpus),
            "nvidia_driver_version": driver_version,
            "cudnn_version": cudnn,
            "is_xpu_available": backends["xpu"],
            "caching_allocator_config": alloc,
            "is_xnnpack_available": flags["xnnpack"],
        },
    }


# --------------------------------------------------------------------------------------------
# Render
# --------------------------------------------------------------------------------------------

_MARK = {
    "pass": "[green]✓ pass[/]",
    "warn": "[yellow]! warn[/]",
    "fail": "[red]✗ FAIL[/]",
    "skip": "[dim]- skip[/]",
    "info": "[cyan]i info[/]",
}


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return " ".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)


def render(report: dict[str, Any], file: Any = None) -> None:
    """Print ``report`` (from :func:`collect`) as tables for people."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    out = file or sys.stdout
    # a pipe or file gets 120 columns unless $COLUMNS says otherwise; a terminal its own width
    wide = out.isatty() or "COLUMNS" in os.environ
    console = Console(file=out, highlight=False, width=None if wide else 120)
    build, drv, cuda = report["build"], report["driver"], report["cuda"]

    facts = Table(title="torchplace doctor", show_header=False, title_justify="left", box=None)
    facts.add_column(style="bold")
    facts.add_column()
    rows = [
        ("torch", f"{build['torch_version']} ({build['kind']} build)"),
        ("CUDA used to build torch", _show(build["cuda_compiled_version"])),
        ("cuDNN (loaded by torch)", _show(build["cudnn_version"])),
        (
            "HIP / MIOpen",
            f"{_show(build['hip_compiled_version'])} / {_show(build['miopen_runtime_version'])}",
        ),
        ("arch list", _show(build["arch_list"])),
        ("debug build", _show(build["debug_build"])),
        (
            "matmul precision",
            f"float32 {_show(build['float32_matmul_precision'])}, TF32 "
            f"{_show(build['cuda_matmul_allow_tf32'])} "
            f"(fp32_precision {_show(build['cuda_matmul_fp32_precision'])})",
        ),
        (
            "CPU",
            f"{build['cpu_threads']} threads; MKL {_show(build['mkl'])}, oneDNN {_show(build['mkldnn'])}, XNNPACK {_show(build['xnnpack'])}",
        ),
        ("NVML (nvidia-ml-py)", drv["nvml"] + (f" ({drv['error']})" if drv["error"] else "")),
        (
            "NVIDIA driver",
            _show(drv["driver_version"])
            + (f" (CUDA {drv['cuda_driver_version']})" if drv["cuda_driver_version"] else ""),
        ),
        ("physical GPUs (NVML)", _show(drv["physical_gpu_count"])),
        ("CUDA toolkit (nvcc on PATH)", _show(report["toolkit"]["nvcc_version"])),
        ("CUDA available", f"{_show(cuda['is_available'])}, {cuda['device_count']} device(s)"),
        (
            "MPS / XPU available",
            f"{_show(report['accelerators']['mps_available'])} / {_show(report['accelerators']['xpu_available'])}",
        ),
    ]
    vis = cuda["visible_devices_variable"]
    if report["environment"].get(vis) is None:
        rows.append((vis, "unset (every GPU visible)"))
    rows += [(name, value) for name, value in report["environment"].items() if value is not None]
    for key, value in rows:
        facts.add_row(escape(key), escape(value))
    console.print(facts)

    if drv["physical_gpus"]:
        console.print(
            "[bold]physical GPUs (NVML order):[/] " + escape("; ".join(drv["physical_gpus"]))
        )

    if report["devices"]:
        table = Table(title="visible devices", title_justify="left")
        for col in (
            "device",
            "physical",
            "name",
            "cc",
            "build",
            "memory free/total",
            "SMs",
            "uuid",
        ):
            table.add_column(col)
        for d in report["devices"]:
            table.add_row(
                d["device"],
                escape(d["physical_id"]),
                escape(d["name"]),
                _show(d["capability"]),
                _show(d.get("arch_support")),
                f"{_gib(d['free_memory'])} / {_gib(d['total_memory'])}",
                _show(d["multi_processor_count"]),
                escape(_show(d["uuid"])),
            )
        console.print(table)
    else:
        console.print("[bold]visible devices:[/] none (no CUDA/ROCm/MPS/XPU device)")

    checks = Table(title="checks", title_justify="left")
    checks.add_column("status", no_wrap=True)
    checks.add_column("check", no_wrap=True)
    checks.add_column("detail")
    checks.add_column("fix")
    for c in report["checks"]:
        checks.add_row(
            _MARK[c["status"]], escape(c["name"]), escape(c["detail"]), escape(c["fix"] or "")
        )
    console.print(checks)

    verdict = report["verdict"]
    if verdict["usable"]:
        console.print(f"[bold green]verdict: {escape(verdict['summary'])}[/]")
    else:
        console.print(f"[bold red]verdict: {escape(verdict['summary'])}[/]")
        for fix in verdict["fixes"]:
            console.print(f"[bold]fix:[/] {escape(fix)}")


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare ``torchplace doctor``'s options."""
    parser.add_argument(
        "--device",
        default="auto",
        metavar="SPEC",
        help="device to check: auto (default; $TORCHPLACE_DEVICE, else first accelerator, else "
        "cpu), cpu, cuda, cuda:N, N, mps, xpu, meta",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--no-smoke",
        dest="smoke",
        action="store_false",
        help="skip the round-trip and matmul smoke tests",
    )


def run(args: argparse.Namespace) -> int:
    """Run the doctor; 0 when the requested device is usable, 1 when it is not."""
    report = collect(args.device, smoke=args.smoke)
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        render(report)
    if not report["verdict"]["usable"]:
        if args.json:  # the tables already end with the verdict and its fixes
            print(f"torchplace doctor: {report['verdict']['summary']}", file=sys.stderr)
            for fix in report["verdict"]["fixes"]:
                print(f"  fix: {fix}", file=sys.stderr)
        return 1
    return 0
