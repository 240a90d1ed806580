"""The smoke tests the doctor runs on the chosen device: pinned host memory, a host -> device
-> host round trip, and a matmul against a float64 CPU reference. On ``cpu`` they run as CPU
checks and say so; on ``meta`` they are skipped (there is no data to compare)."""

from __future__ import annotations

import os
import re
import time
from typing import TYPE_CHECKING

from torchplace.doctor.checks import Check
from torchplace.doctor.probes import one_line, tf32_allowed, torch_flags

if TYPE_CHECKING:
    import torch

__all__ = ["matmul_check", "pinned_memory_check", "round_trip_check"]

_ROUND_TRIP_ELEMENTS = 1 << 20  # 4 MiB of float32
_MATMUL_N = 256
_MATMUL_TOL = 1e-4  # float32 with full-precision accumulate: ~1e-7 in practice
_MATMUL_TOL_TF32 = 1e-2  # TF32 keeps 10 mantissa bits: ~1e-3 in practice


_ALLOC_ERROR = re.compile(r"allocator config|CachingAllocator|ConfigTokenizer|allocator backend")


def _fix(exc: BaseException, default: str) -> str:
    """The fix for a smoke test that raised: the allocator config when torch refused that (it
    does so when CUDA starts, as a ValueError), else ``default``."""
    if _ALLOC_ERROR.search(str(exc)):
        named = [
            f"{name}={os.environ[name]!r}"
            for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
            if os.environ.get(name)
        ]
        return (
            f"correct or unset the allocator config torch refused ({', '.join(named) or 'none set'}): "
            "see the allocator-config check"
        )
    return default


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
    except Exception as exc:  # RuntimeError; ValueError for an allocator config torch refuses
        return Check(
            "pinned-memory",
            "fail",
            f"cannot allocate pinned host memory: {one_line(exc)}",
            _fix(
                exc,
                "check the locked-memory limit ('ulimit -l') and, in a container, its memory "
                "limits",
            ),
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
        except Exception:
            pinned = False
            out = torch.empty(elements)
        start = time.perf_counter()
        on_device = host.to(device, non_blocking=pinned)
        # Same stream as the H2D copy, so this D2H copy is ordered after it: no sync needed here.
        out.copy_(on_device, non_blocking=pinned)
        _sync(device)  # the host must not read `out` until the D2H copy is finished
        seconds = time.perf_counter() - start
    except Exception as exc:  # RuntimeError; ValueError for an allocator config torch refuses
        return Check(
            name,
            "fail",
            f"copy to {device} failed: {one_line(exc)}",
            _fix(exc, "the device is not usable; check 'nvidia-smi' and the driver logs (dmesg)"),
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
        tf32 = tf32_allowed(torch_flags())
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(n, n, generator=gen)
    b = torch.randn(n, n, generator=gen)
    reference = a.double() @ b.double()
    try:
        result = (a.to(device) @ b.to(device)).to("cpu").double()
    except Exception as exc:  # RuntimeError; ValueError for an allocator config torch refuses
        return (
            Check(
                name,
                "fail",
                f"matmul on {device} failed: {one_line(exc)}",
                _fix(
                    exc, "the device cannot run kernels from this build; see the arch check above"
                ),
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
