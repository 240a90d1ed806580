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
    import torch

    from torchplace.prefetch import DevicePrefetcher

    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    host = torch.randn(rows, _INNER).pin_memory()
    buffers = [torch.empty(rows, _INNER, device=device) for _ in range(2)]
    weight = torch.randn(_INNER, _INNER, device=device) / math.sqrt(_INNER)
    out = torch.empty(rows, _INNER, device=device)

    def event() -> Any:
        return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    def elapsed(work: Callable[[], None]) -> float:
        start, end = event(), event()
        torch.cuda.synchronize(device)
        start.record(main)
        work()
        end.record(main)
        torch.cuda.synchronize(device)
        return float(start.elapsed_time(end)) * 1e-3

    matmuls = 1

    def compute(buf: torch.Tensor) -> None:
        for _ in range(matmuls):
            torch.mm(buf, weight, out=out)

    def copy_alone() -> None:
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for n in range(batches):
                buffers[n % 2].copy_(host, non_blocking=True)
        main.wait_stream(side)

    def compute_alone() -> None:
        for n in range(batches):
            compute(buffers[n % 2])

    def overlapped() -> None:
        copied = [event(), event()]
        consumed = [event(), event()]
        side.wait_stream(main)
        with torch.cuda.stream(side):
            buffers[0].copy_(host, non_blocking=True)
            copied[0].record(side)
        for n in range(batches):
            if n + 1 < batches:  # batch n+1 travels while batch n is computed
                nxt = (n + 1) % 2
                with torch.cuda.stream(side):
                    if n >= 1:  # the buffer last held batch n-1: wait until it was consumed
                        side.wait_event(consumed[nxt])
                    buffers[nxt].copy_(host, non_blocking=True)
                    copied[nxt].record(side)
            main.wait_event(copied[n % 2])
            compute(buffers[n % 2])
            consumed[n % 2].record(main)
        main.wait_stream(side)

    # Already-pinned batches, as DataLoader(pin_memory=True) yields them: copied, never staged.
    prefetcher = DevicePrefetcher([host] * batches, device, depth=2)

    def prefetched() -> None:
        for batch in prefetcher:
            compute(batch)

    # Warm up (cuBLAS handles, kernel choice), then size the compute so it covers the copy.
    if progress is not None:
        progress("calibrating")
    copy_alone()
    compute_alone()
    per_copy = elapsed(copy_alone) / batches
    per_matmul = elapsed(compute_alone) / batches
    target = max(1.25 * per_copy, (compute_ms or 0.0) * 1e-3)
    matmuls = max(1, math.ceil(target / per_matmul))
    overlapped()
    prefetched()  # the allocator grows its pool for the prefetcher's batches here, untimed
    runs = {
        "copy": copy_alone,
        "compute": compute_alone,
        "overlapped": overlapped,
        "prefetcher": prefetched,
    }
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(repeats):
        if progress is not None:
            progress(f"repeat {r + 1}/{repeats}")
        # Interleave the runs so that drifting clocks or neighbours affect each alike.
        for name, work in runs.items():
            samples[name].append(elapsed(work))
    prefetcher.close()
    return OverlapResult(
        device=str(device),
        batch_bytes=batch_bytes,
        batches=batches,
        matmuls_per_batch=matmuls,
        copy_s=statistics.median(samples["copy"]),
        compute_s=statistics.median(samples["compute"]),
        overlapped_s=statistics.median(samples["overlapped"]),
        repeats=repeats,
        prefetcher_s=statistics.median(samples["prefetcher"]),
    )
