"""One matrix product timed three ways: the article's exercise 6.

1. **naive wall clock**: ``perf_counter`` around the call and nothing else. On a GPU the call
   returns as soon as the kernel is queued, so this measures the launch, not the product.
2. **synchronised wall clock**: the device is synchronised before the clock starts and before it
   stops; this is the real time, plus the launch and synchronisation overhead.
3. **device events**: a pair of CUDA events around the call, read after the work; this is the
   time the device itself spent (:class:`~torchplace.bench.timer.Timer`).

On the CPU a call is finished when it returns, so only the CPU clock applies and the two device
columns are skipped, with the reason given.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchplace.bench.memory import require_memory
from torchplace.bench.timer import Measurement, Timer
from torchplace.bench.units import format_duration
from torchplace.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["METHODS", "TimingComparison", "TimingRow", "compare_clocks", "default_size"]

METHODS = ("naive wall clock", "synchronised wall clock", "device events")

CPU_SKIP_REASON = (
    "CUDA only: on the CPU a call has finished when it returns, so there is no asynchronous "
    "work to wait for and no device events; the CPU clock above is the whole answer"
)


@dataclass(frozen=True)
class TimingRow:
    """One way of timing: its measurement, or why it was skipped."""

    method: str
    description: str
    measurement: Measurement | None
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "description": self.description,
            "skipped": self.skipped is not None,
            "reason": self.skipped,
            "timing": None if self.measurement is None else self.measurement.to_dict(),
        }


@dataclass(frozen=True)
class TimingComparison:
    """The three rows for one workload and the sentence that explains the difference."""

    device: str
    workload: str
    rows: tuple[TimingRow, ...]
    explanation: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "workload": self.workload,
            "rows": [row.to_dict() for row in self.rows],
            "explanation": self.explanation,
        }


def default_size(device: torch.device) -> int:
    """A matrix side that takes milliseconds: 4096 on an accelerator, 1024 on the CPU."""
    return 1024 if device.type == "cpu" else 4096


def _host_clock_rows(
    fn: Callable[[], object], timer: Timer, *, repeats: int, sync_inside: bool, label: str
) -> Measurement:
    """Time ``fn`` with the host clock, synchronising between calls but outside the timed span
    (naive) or at both edges of it (synchronised)."""
    clock = time.perf_counter_ns
    times: list[float] = []
    colds: list[float] = []
    for k in range(1 + timer.warmup + repeats):
        timer.synchronize()
        start = clock()
        fn()
        if sync_inside:
            timer.synchronize()
        elapsed = (clock() - start) * 1e-9
        timer.synchronize()
        if k == 0:
            colds.append(elapsed)
        elif k > timer.warmup:
            times.append(elapsed)
    return Measurement(
        label=label,
        device=str(timer.device),
        clock="cpu perf_counter" + (", synchronised" if sync_inside else ", no sync"),
        times_s=tuple(times),
        cold_s=colds[0],
        cold_wall_s=colds[0],
        wall_per_call_s=sum(times) / len(times),
        warmup=timer.warmup,
    )


def compare_clocks(
    device: torch.device,
    *,
    size: int | None = None,
    repeats: int = 20,
    warmup: int = 3,
) -> TimingComparison:
    """Time ``a @ b`` (``size`` x ``size``, float32) on ``device`` every way that applies."""
    import torch

    if repeats < 1:
        raise ConfigError(f"repeats must be at least 1, got {repeats}")
    timer = Timer(device=device, warmup=warmup, repeats=repeats, spread_warning=None)
    device = timer.device
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ConfigError(f"size must be a positive int (the matrix side) or None, got {size!r}")
    n = default_size(device) if size is None else size  # 0 is refused, not the default
    matrix = n * n * 4
    fix = "give a smaller --size (the matrix side)"
    what = f"a {n}x{n} float32 matmul (two operands and the product)"
    require_memory(device, 3 * matrix, what, fix)
    if device.type != "cpu":
        require_memory(torch.device("cpu"), matrix, f"{what}, staged through the host,", fix)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=generator).to(device)
    b = torch.randn(n, n, generator=generator).to(device)
    workload = f"matmul {n}x{n} @ {n}x{n} float32"

    def matmul() -> torch.Tensor:
        return a @ b

    if device.type == "cpu":
        cpu = Timer(device=device, warmup=warmup, repeats=repeats).measure(matmul, label=workload)
        rows = (
            TimingRow("cpu clock", "perf_counter_ns around each call", cpu),
            TimingRow(METHODS[0], "CPU clock, no synchronisation", None, CPU_SKIP_REASON),
            TimingRow(METHODS[2], "a pair of device events per call", None, CPU_SKIP_REASON),
        )
        explanation = (
            f"On the CPU the call returns when the product is done, so the CPU clock "
            f"({format_duration(cpu.median_s)}) is the real time; the device columns apply to "
            "CUDA, where kernels run asynchronously."
        )
        return TimingComparison(str(device), workload, rows, explanation)

    return _three_ways(matmul, timer, workload=workload, repeats=repeats)


def _three_ways(
    fn: Callable[[], object], timer: Timer, *, workload: str, repeats: int
) -> TimingComparison:
    device = timer.device
    naive = _host_clock_rows(fn, timer, repeats=repeats, sync_inside=False, label=workload)
    synced = _host_clock_rows(fn, timer, repeats=repeats, sync_inside=True, label=workload)
    events = Timer(device=device, warmup=timer.warmup, repeats=repeats).measure(fn, label=workload)
    rows = (
        TimingRow(METHODS[0], "perf_counter around the call, no synchronisation", naive),
        TimingRow(METHODS[1], "synchronise, perf_counter, call, synchronise", synced),
        TimingRow(METHODS[2], "a pair of device events per call", events),
    )
    explanation = (
        f"The naive clock ({format_duration(naive.median_s)}) stops when the kernel is queued, "
        f"not when it finishes: CUDA runs asynchronously. The synchronised clock "
        f"({format_duration(synced.median_s)}) waits for the work but adds launch and "
        f"synchronisation overhead; the events ({format_duration(events.median_s)}) time the "
        "work on the device itself."
    )
    return TimingComparison(str(device), workload, rows, explanation)
