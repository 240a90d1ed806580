"""The whole doctor report as one JSON-ready dict: the facts, the checks, the smoke tests on the
requested device and the verdict (the ``result`` of ``torchplace doctor --json``)."""

from __future__ import annotations

import math
import os
import platform
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchplace.doctor.checks import (
    Check,
    build_check,
    device_checks,
    driver_check,
    environment_checks,
    init_check,
    resolve_check,
    visibility_checks,
)
from torchplace.doctor.probes import (
    Facts,
    build_kind,
    cpu_limits,
    gather,
    nvcc_version,
    tf32_allowed,
)
from torchplace.doctor.smoke import matmul_check, pinned_memory_check, round_trip_check
from torchplace.doctor.verdict import judge

if TYPE_CHECKING:
    from torchplace.devices import DeviceProbe

__all__ = ["collect"]

_ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def collect(
    spec: str | None = "auto",
    *,
    probe: DeviceProbe | None = None,
    smoke: bool = True,
    toolkit: Callable[[], str | None] = nvcc_version,
    cpus: Callable[[], tuple[int | None, float | None]] = cpu_limits,
) -> dict[str, Any]:
    """Gather the whole report as a JSON-ready dict (the ``result`` of ``doctor --json``).

    Warnings torch raises on the way (an unsupported GPU, a driver too old, ...) are caught and
    reported as ``torch-warning`` checks (``warning`` for other sources) instead of being printed.
    A spec that does not parse raises :class:`~torchplace.errors.ConfigError`.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = _collect(spec, probe=probe, smoke=smoke, toolkit=toolkit, cpus=cpus)
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
    cpus: Callable[[], tuple[int | None, float | None]],
) -> dict[str, Any]:
    from torchplace.devices.probe import checked_probe

    facts = gather(checked_probe(probe), toolkit, cpus)
    checks = [*init_check(facts), build_check(facts), driver_check(facts)]
    checks += visibility_checks(facts)
    checks += environment_checks(facts)
    devices: list[dict[str, Any]] = []
    for info in facts.inventory:
        entry, device_found = device_checks(facts, info)
        devices.append(entry)
        checks += device_found
    chosen, resolved = resolve_check(spec, facts.probe, accelerator=facts.accelerator)
    checks.append(resolved)
    error: float | None = None
    if chosen is not None and smoke:
        checks += [pinned_memory_check(chosen), round_trip_check(chosen)]
        matmul, error = matmul_check(chosen, tf32=tf32_allowed(facts.flags))
        checks.append(matmul)
    return {
        **_sections(facts),
        "devices": devices,
        "smoke": {
            "ran": bool(chosen is not None and smoke),
            # JSON has no NaN: a non-finite error is reported as its text
            "matmul_relative_error": error if error is None or math.isfinite(error) else str(error),
        },
        "checks": [c.to_dict() for c in checks],
        "verdict": judge(checks, spec, chosen, smoke=smoke),
        "collect_env": _collect_env(facts),
    }


def _sections(facts: Facts) -> dict[str, Any]:
    """The facts, section by section, in the order the report shows them."""
    from torchplace import __version__

    driver, vis = facts.driver, facts.visible
    return {
        "torchplace_version": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "build": _build(facts),
        "driver": {
            "nvml": "installed" if driver.nvml_installed else "not installed",
            "driver_version": facts.driver_version,
            "cuda_driver_version": driver.cuda_driver_version,
            "physical_gpu_count": driver.physical_gpu_count,
            "physical_gpus": list(driver.physical_gpus),
            "error": driver.error,
        },
        "toolkit": {"nvcc_version": facts.nvcc},
        "environment": facts.env,
        "cuda": {
            "is_available": facts.cuda_available,
            "device_count": facts.device_count,
            "visible_devices_variable": vis.variable,
            "visible_devices": vis.value,
            "visible_physical_ids": None if vis.physical_ids is None else list(vis.physical_ids),
        },
        "accelerators": {
            "current": facts.accelerator,
            "mps_available": facts.backends["mps"],
            "xpu_available": facts.backends["xpu"],
        },
    }


def _build(facts: Facts) -> dict[str, Any]:
    return {
        "torch_version": facts.torch_version,
        "kind": build_kind(facts.cuda_build, facts.hip_build),
        "cpu_only": not facts.built,
        "cuda_compiled_version": facts.cuda_build,
        "hip_compiled_version": facts.hip_build,
        "hip_runtime_version": facts.hip_runtime,
        "miopen_runtime_version": facts.miopen,
        "cudnn_version": None if facts.hip_build else facts.cudnn,
        "arch_list": facts.arch_list,
        **facts.flags,
        "cpu_affinity": facts.cpu_affinity,
        "cpu_quota": facts.cpu_quota,
    }


def _collect_env(facts: Facts) -> dict[str, Any]:
    """The device-related fields of ``python -m torch.utils.collect_env``, under its names."""
    driver = facts.driver
    models = [f"{d.device}: {d.name}" for d in facts.inventory]
    return {
        "torch_version": facts.torch_version,
        "is_debug_build": facts.flags["debug_build"],
        "cuda_compiled_version": facts.cuda_build,
        "hip_compiled_version": facts.hip_build,
        "hip_runtime_version": facts.hip_runtime,
        "miopen_runtime_version": facts.miopen,
        "is_cuda_available": facts.cuda_available,
        "cuda_runtime_version": facts.nvcc,
        "cuda_module_loading": facts.module_loading,  # read after CUDA init, which sets LAZY
        "nvidia_gpu_models": models or list(driver.physical_gpus),
        "nvidia_driver_version": facts.driver_version,
        "cudnn_version": facts.cudnn,
        "is_xpu_available": facts.backends["xpu"],
        "caching_allocator_config": {n: facts.env[n] for n in _ALLOC_VARS if facts.env[n]},
        "is_xnnpack_available": facts.flags["xnnpack"],
    }
