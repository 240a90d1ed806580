"""How much of a host-to-device copy hides behind compute: the article's n+1 / n / n-1 pipeline.

Three timings of ``batches`` batches, each with CUDA events on the compute stream:

- copy alone: every batch copied from pinned host memory on a side stream, nothing else running;
- compute alone: the per-batch compute (matrix products over the batch) with no copies;
- overlapped: a double-buffered pipeline, the side stream copying batch n+1 while the compute
  stream works on batch n. Events order the streams: compute on a buffer waits for its copy, and
  the next copy into a buffer waits until the compute that read it is done;
- prefetcher: the same batches and compute through :class:`torchplace.DevicePrefetcher` (the
  batches are already pinned, as ``DataLoader(pin_memory=True)`` yields them), to show that the
  component reaches what the hand-written pipeline reaches.

The hidden fraction is ``(copy + compute - overlapped) / copy``, clipped to [0, 1]: 1 when the
pipeline costs no more than the compute alone, 0 when it costs copy plus compute. The first copy
of a pipeline has nothing to hide behind, so with ``batches`` batches the best reachable value is
about ``(batches - 1) / batches``. Per-batch compute is sized to at least the copy time (or to
``compute_ms``) so that the copies can hide entirely.

CUDA only: on the CPU copies and compute share the same cores; there is no copy engine.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchplace.bench.memory import require_memory
from torchplace.bench.units import format_bytes
from torchplace.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["OverlapResult", "hidden_fraction", "run_overlap"]

_INNER = 1024  # columns of the per-batch matrix product


def hidden_fraction(copy_s: float, compute_s: float, overlapped_s: float) -> float:
    """``(copy + compute - overlapped) / copy``, clipped to [0, 1] (0 when ``copy`` is 0)."""
    if copy_s <= 0:
        return 0.0
    return min(1.0, max(0.0, (copy_s + compute_s - overlapped_s) / copy_s))


@dataclass(frozen=True)
class OverlapResult:
    """Median times over the repeats of copy alone, compute alone, and both overlapped."""

    device: str
    batch_bytes: int
    batches: int
    matmuls_per_batch: int
    copy_s: float
    compute_s: float
    overlapped_s: float
    repeats: int
    prefetcher_s: float | None = None

    @property
    def hidden(self) -> float:
        """The fraction of the copy time hidden behind compute, in [0, 1]."""
        return hidden_fraction(self.copy_s, self.compute_s, self.overlapped_s)

    @property
    def prefetcher_hidden(self) -> float | None:
        """The same fraction for :class:`~torchplace.DevicePrefetcher` (None if not run)."""
        if self.prefetcher_s is None:
            return None
        return hidden_fraction(self.copy_s, self.compute_s, self.prefetcher_s)

    @property
    def best_possible(self) -> float:
        """The fraction reachable at best: the first copy of the pipeline cannot hide."""
        return (self.batches - 1) / self.batches

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "batch_bytes": self.batch_bytes,
            "batches": self.batches,
            "matmuls_per_batch": self.matmuls_per_batch,
            "copy_s": self.copy_s,
            "compute_s": self.compute_s,
            "overlapped_s": self.overlapped_s,
            "sequential_s": self.copy_s + self.compute_s,
            "hidden_fraction": self.hidden,
            "best_possible_fraction": self.best_possible,
            "prefetcher_s": self.prefetcher_s,
            "prefetcher_hidden_fraction": self.prefetcher_hidden,
            "repeats": self.repeats,
        }


def run_overlap(
    device: torch.device,
    *,
    batch_bytes: int = 64 << 20,
    batches: int = 32,
    compute_ms: float | None = None,
    repeats: int = 5,
    progress: Callable[[str], None] | None = None,
) -> OverlapResult:
    """Measure copy alone, compute alone and the overlapped pipeline on a CUDA ``device``."""
    import torch

    if device.type != "cuda":
        raise ConfigError(f"overlap needs a CUDA device, got {device}; run it with --device cuda:N")
    if batches < 2:
        raise ConfigError(f"batches must be at least 2 for a pipeline, got {batches}")
    if repeats < 1:
        raise ConfigError(f"repeats must be at least 1, got {repeats}")
    if compute_ms is not None and not compute_ms > 0:
        raise ConfigError(f"compute_ms must be a positive number of milliseconds, got {compute_ms}")
    rows = max(1, batch_bytes // (4 * _INNER))
    batch_bytes = rows * _INNER * 4
    what, fix = f"a {format_bytes(batch_bytes)} batch", "give a smaller --batch-mib"
    require_memory(torch.device("cpu"), batch_bytes, f"{what}, pinned on the host,", fix)
    # two copy buffers and the product; the prefetcher's batches in flight come on top
    require_memory(device, 3 * batch_bytes, f"{what} (two buffers and the product)", fix)
    with torch.cuda.device(device):
        return _run(device, rows, batch_bytes, batches, compute_ms, repeats, progress)


def _run(
    device: torch.device,
    rows: int,
    batch_bytes: int,
    batches: int,
    compute_ms: float | None,
    repeats: int,
    progress: Callable[[str], None] | None,
) -> OverlapResult:
    pipeline = _Pipeline(device, rows, batches)
    # Warm up (cuBLAS handles, kernel choice), then size the compute so it covers the copy.
    if progress is not None:
        progress("calibrating")
    pipeline.calibrate(compute_ms)
    runs = {
        "copy": pipeline.copy_alone,
        "compute": pipeline.compute_alone,
        "overlapped": pipeline.overlapped,
        "prefetcher": pipeline.prefetched,
    }
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(repeats):
        if progress is not None:
            progress(f"repeat {r + 1}/{repeats}")
        # Interleave the runs so that drifting clocks or neighbours affect each alike.
        for name, work in runs.items():
            samples[name].append(pipeline.elapsed(work))
    pipeline.prefetcher.close()
    return OverlapResult(
        device=str(device),
        batch_bytes=batch_bytes,
        batches=batches,
        matmuls_per_batch=pipeline.matmuls,
        copy_s=statistics.median(samples["copy"]),
        compute_s=statistics.median(samples["compute"]),
        overlapped_s=statistics.median(samples["overlapped"]),
        repeats=repeats,
        prefetcher_s=statistics.median(samples["prefetcher"]),
    )


class _Pipeline:
    """The buffers, streams and the four ways of running ``batches`` batches on ``device``."""

    def __init__(self, device: torch.device, rows: int, batches: int) -> None:
        import torch

        from torchplace.prefetch import DevicePrefetcher

        self.device, self.batches, self.matmuls = device, batches, 1
        self.main = torch.cuda.current_stream(device)
        self.side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self.host = torch.randn(rows, _INNER).pin_memory()
        self.buffers = [torch.empty(rows, _INNER, device=device) for _ in range(2)]
        self.weight = torch.randn(_INNER, _INNER, device=device) / math.sqrt(_INNER)
        self.out = torch.empty(rows, _INNER, device=device)
        # Already-pinned batches, as DataLoader(pin_memory=True) yields them: copied, never
        # staged.
        self.prefetcher = DevicePrefetcher([self.host] * batches, device, depth=2)

    @staticmethod
    def event() -> Any:
        import torch

        return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    def elapsed(self, work: Callable[[], None]) -> float:
        """Seconds of ``work`` on the compute stream, between two synchronisations."""
        import torch

        start, end = self.event(), self.event()
        torch.cuda.synchronize(self.device)
        start.record(self.main)
        work()
        end.record(self.main)
        torch.cuda.synchronize(self.device)
        return float(start.elapsed_time(end)) * 1e-3

    def calibrate(self, compute_ms: float | None) -> None:
        """Warm every run up and size the per-batch compute to cover the copy, or to
        ``compute_ms`` when given (also below the copy time: how much of a copy stays exposed
        behind short compute is a question worth asking)."""
        self.copy_alone()
        self.compute_alone()
        per_copy = self.elapsed(self.copy_alone) / self.batches
        per_matmul = self.elapsed(self.compute_alone) / self.batches
        target = 1.25 * per_copy if compute_ms is None else compute_ms * 1e-3
        self.matmuls = max(1, math.ceil(target / per_matmul))
        self.overlapped()
        self.prefetched()  # the allocator grows its pool for the prefetcher's batches, untimed

    def compute(self, buf: torch.Tensor) -> None:
        import torch

        for _ in range(self.matmuls):
            torch.mm(buf, self.weight, out=self.out)

    def copy_alone(self) -> None:
        import torch

        self.side.wait_stream(self.main)
        with torch.cuda.stream(self.side):
            for n in range(self.batches):
                self.buffers[n % 2].copy_(self.host, non_blocking=True)
        self.main.wait_stream(self.side)

    def compute_alone(self) -> None:
        for n in range(self.batches):
            self.compute(self.buffers[n % 2])

    def overlapped(self) -> None:
        import torch

        main, side, buffers, host = self.main, self.side, self.buffers, self.host
        copied = [self.event(), self.event()]
        consumed = [self.event(), self.event()]
        side.wait_stream(main)
        with torch.cuda.stream(side):
            buffers[0].copy_(host, non_blocking=True)
            copied[0].record(side)
        for n in range(self.batches):
            if n + 1 < self.batches:  # batch n+1 travels while batch n is computed
                nxt = (n + 1) % 2
                with torch.cuda.stream(side):
                    if n >= 1:  # the buffer last held batch n-1: wait until it was consumed
                        side.wait_event(consumed[nxt])
                    buffers[nxt].copy_(host, non_blocking=True)
                    copied[nxt].record(side)
            main.wait_event(copied[n % 2])
            self.compute(buffers[n % 2])
            consumed[n % 2].record(main)
        main.wait_stream(side)

    def prefetched(self) -> None:
        for batch in self.prefetcher:
            self.compute(batch)
