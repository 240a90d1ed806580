"""Rich tables for the ``torchplace bench`` results: one function per benchmark."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from torchplace.bench.overlap import OverlapResult
from torchplace.bench.stages import StagesResult
from torchplace.bench.timer import Measurement
from torchplace.bench.timing import TimingComparison
from torchplace.bench.transfer import TransferResult
from torchplace.bench.units import format_bytes, format_duration, format_rate, scaled

__all__ = ["overlap_table", "stages_table", "timing_table", "transfer_tables"]


def _median(m: Measurement | None, noop: str = "n/a") -> str:
    return noop if m is None else format_duration(m.median_s)


def _count(value: float) -> str:
    return scaled(value, ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")))


def timing_table(result: TimingComparison) -> Table:
    """Method, median, IQR, min, cold first call; skipped rows give their reason."""
    skipped = [row for row in result.rows if row.measurement is None]
    caption = result.explanation
    if skipped:
        names = " and ".join(row.method for row in skipped)
        caption += f" Skipped {names}: {skipped[0].skipped}."
    table = Table(title=f"{result.workload} on {result.device}", caption=caption)
    for column in ("method", "how", "median", "IQR", "min", "first call"):
        table.add_column(column, justify="left" if column in ("method", "how") else "right")
    for row in result.rows:
        m = row.measurement
        if m is None:
            table.add_row(row.method, "skipped (CUDA only, see below)", "-", "-", "-", "-")
            continue
        table.add_row(
            row.method,
            row.description,
            format_duration(m.median_s),
            format_duration(m.iqr_s),
            format_duration(m.min_s),
            format_duration(m.cold_s),
        )
    return table


def transfer_tables(result: TransferResult) -> list[Table]:
    """The allocation costs, then one row per copy with its rate and share of the link peak."""
    alloc = Table(
        title=f"Host allocation on {result.device} (paid once, apart from the copies)",
        caption="pinned = torch.empty(..., pin_memory=True); pageable = torch.empty(...).fill_(1)",
    )
    for column in ("size", "pinned alloc", "pageable alloc + touch"):
        alloc.add_column(column, justify="right")
    for size in sorted(result.pinned_alloc_s):
        alloc.add_row(
            format_bytes(size),
            format_duration(result.pinned_alloc_s[size]),
            format_duration(result.pageable_alloc_s.get(size)),
        )
    copies = Table(
        title=f"Copies on {result.device} (CUDA events per copy, median)",
        caption=f"link: {result.link_note}",
    )
    for column in (
        "size",
        "dir",
        "host memory",
        "non_blocking",
        "median",
        "GB/s",
        "% peak",
        "first",
    ):
        copies.add_column(column, justify="right")
    for case in result.cases:
        percent = case.percent_of_peak
        copies.add_row(
            format_bytes(case.size_bytes),
            case.direction,
            case.memory,
            "on" if case.non_blocking else "off",
            format_duration(case.measurement.median_s),
            f"{case.bytes_per_s / 1e9:.3g}",
            "n/a" if percent is None else f"{percent:.0f}%",
            format_duration(case.measurement.cold_s),
        )
    return [alloc, copies]


def overlap_table(result: OverlapResult) -> Table:
    """Copy alone, compute alone, overlapped, and the hidden fraction."""
    table = Table(
        title=(
            f"Copy/compute overlap on {result.device}: {result.batches} batches of "
            f"{format_bytes(result.batch_bytes)} from pinned memory on a side stream"
        ),
        caption=(
            f"hidden = (copy + compute - overlapped) / copy = {result.hidden:.1%} "
            f"(at best {result.best_possible:.1%}: the first copy has nothing to hide behind); "
            f"{result.matmuls_per_batch} matmul(s) per batch; median of {result.repeats}"
        ),
    )
    table.add_column("run")
    table.add_column("time", justify="right")
    table.add_column("per batch", justify="right")
    for name, seconds in (
        ("copy alone (H2D, side stream)", result.copy_s),
        ("compute alone", result.compute_s),
        ("copy + compute, sequential", result.copy_s + result.compute_s),
        ("overlapped pipeline", result.overlapped_s),
        ("DevicePrefetcher", result.prefetcher_s),
    ):
        if seconds is not None:
            per_batch = format_duration(seconds / result.batches)
            table.add_row(name, format_duration(seconds), per_batch)
    table.add_row("copy rate", format_rate(result.batch_bytes * result.batches / result.copy_s), "")
    table.add_row("hidden fraction", f"{result.hidden:.1%}", "")
    if result.prefetcher_hidden is not None:
        table.add_row("hidden fraction, DevicePrefetcher", f"{result.prefetcher_hidden:.1%}", "")
    return table


def stages_table(result: StagesResult) -> Table:
    """One row per batch size: H2D, compute, D2H, total, rows/s, peak memory."""
    noop = "no-op"
    table = Table(
        title=(
            f"{escape(result.model)} on {result.device} ({_dtypes(result)}, row shape "
            f"{result.row_shape})"
        ),
        caption=(
            "median per call; "
            + (
                "H2D/D2H are no-ops on the host (x.to('cpu') returns x); "
                if result.device == "cpu"
                else ""
            )
            + f"peak memory: {result.memory_note}; first: the model's first call at that batch "
            "size (synchronised wall time: compilation, lazy initialisation and autotuning "
            f"included); input: {result.input_note}"
        ),
    )
    for column in ("batch", "H2D", "compute", "D2H", "total", "rows/s", "peak memory", "first"):
        table.add_column(column, justify="right")
    for row in result.rows:
        table.add_row(
            str(row.batch_size),
            _median(row.h2d, noop),
            format_duration(row.compute.median_s),
            _median(row.d2h, noop),
            format_duration(row.total.median_s),
            _count(row.rows_per_s),
            format_bytes(row.peak_memory_bytes),
            format_duration(row.total.cold_s if row.first_call_s is None else row.first_call_s),
        )
    return table


def _dtypes(result: StagesResult) -> str:
    """``float16``, or ``int64 inputs, float16 weights`` when the two differ (token ids)."""
    weights = result.weights_dtype or result.dtype
    if weights == result.dtype:
        return result.dtype
    return f"{result.dtype} inputs, {weights} weights"
