"""Time GPU work honestly: clocks, host/device transfers, copy/compute overlap, model stages.

Subcommands:

- ``timing``: one matrix product timed three ways (naive clock, synchronised clock, events);
- ``transfer``: H2D/D2H bandwidth, pageable vs pinned, ``non_blocking`` off/on (CUDA only);
- ``overlap``: how much of a side-stream copy hides behind compute (CUDA only);
- ``model``: H2D, compute, D2H, total, throughput and peak memory per batch size.

Every subcommand prints a table, or its JSON report with ``--json`` (``-o PATH`` writes either to
a file instead of stdout). CUDA-only parts on a machine without CUDA say that they were skipped
and why, and exit 0.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from torchplace import report
from torchplace.bench.stages import DTYPES
from torchplace.errors import ConfigError, TimingError

if TYPE_CHECKING:
    import torch
    from rich.console import Console

__all__ = ["configure", "run"]

_CUDA_ONLY = {
    "transfer": (
        "it times copies across the host/device link, and on {device} the data never leaves "
        "host memory; run it on a machine with CUDA (--device cuda:N)"
    ),
    "overlap": (
        "it overlaps copies on a CUDA side stream with compute on another stream; on {device} "
        "there is no copy engine to overlap with; run it on a machine with CUDA (--device cuda:N)"
    ),
}


def _has_empty_entry(text: str, separators: str = ",") -> bool:
    """True for ``1,,2``, ``1,2,`` or ``,``: a list flag's empty entry is an error, not skipped."""
    for sep in separators[1:]:
        text = text.replace(sep, separators[0])
    return not all(part.strip() for part in text.split(separators[0]))


def _empty_entry(text: str, example: str) -> str:
    return (
        f"{text!r} has an empty entry; give a comma-separated list without empty entries "
        f"or stray commas, such as {example}"
    )


def _positive_int_list(text: str) -> tuple[int, ...]:
    if _has_empty_entry(text):
        raise argparse.ArgumentTypeError(_empty_entry(text, "1,8,32,128"))
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of positive integers, such as 1,8,32,128"
        )
    return values


def _sizes(text: str) -> tuple[int, ...]:
    from torchplace.bench.units import parse_sizes

    if _has_empty_entry(text):
        raise argparse.ArgumentTypeError(_empty_entry(text, "4K,64K,1M"))
    try:
        return parse_sizes(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _row_shape(text: str) -> str:
    """``--input-shape`` is read later, by the model loader; here only empty entries fail."""
    if _has_empty_entry(text, ",x"):
        raise argparse.ArgumentTypeError(_empty_entry(text, "512 or 3,224,224"))
    return text


N = TypeVar("N", int, float)


def _positive(cast: Callable[[str], N], noun: str) -> Callable[[str], N]:
    """An argparse ``type`` that reads ``cast(text)`` and accepts it only when above 0."""

    def parse(text: str) -> N:
        try:
            value = cast(text)
        except ValueError:
            value = cast("0")
        if not (value > 0 and math.isfinite(value)):  # also rejects nan and inf
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive {noun}")
        return value

    return parse


_positive_float = _positive(float, "finite number")
_positive_int = _positive(int, "integer")

#: The most CPU threads --threads takes: far more than any machine's cores, and far below the
#: counts at which the thread pool crashes the process (100000 segfaults).
MAX_THREADS = 1024


def _calls(text: str) -> int:
    """An argparse ``type`` for a count of calls: a positive integer up to ``MAX_CALLS``."""
    from torchplace.bench.timer import MAX_CALLS

    value = _positive_int(text)
    if value > MAX_CALLS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is more than the {MAX_CALLS:,} calls allowed; give a smaller count"
        )
    return value


def _batches(text: str) -> int:
    """``--batches`` of ``overlap``: a pipeline needs two batches at least."""
    value = _calls(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{text!r} batches make no pipeline; give 2 or more")
    return value


def _threads(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(
            f"{text!r} threads is more than the {MAX_THREADS} allowed; this machine has "
            f"{os.cpu_count() or 'an unknown number of'} CPUs"
        )
    return value


def _subcommand(
    subs: Any, name: str, parents: list[argparse.ArgumentParser], text: str
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subs.add_parser(
        name, parents=parents, help=text, description=text
    )
    return parser


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare the ``bench`` subcommands and their flags."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--device",
        default="auto",
        help="device to measure on: auto, cpu, cuda, cuda:N, ... (default auto)",
    )
    common.add_argument(
        "--threads",
        type=_threads,
        metavar="N",
        help=f"torch CPU threads (torch.set_num_threads) for a reproducible CPU figure; 1 to "
        f"{MAX_THREADS}",
    )
    report.add_output_options(common)
    plot = argparse.ArgumentParser(add_help=False)
    plot.add_argument(
        "--plot", metavar="FILE.png", help="draw the sweep to a PNG (needs torchplace[plot])"
    )
    subs = parser.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    _timing_options(subs, [common])
    _transfer_options(subs, [common, plot])
    _overlap_options(subs, [common])
    _model_options(subs, [common, plot])


def _timing_options(subs: Any, parents: list[argparse.ArgumentParser]) -> None:
    timing = _subcommand(
        subs,
        "timing",
        parents,
        "one matmul timed three ways: naive clock, synchronised clock, device events",
    )
    timing.add_argument(
        "--size", type=_positive_int, metavar="N", help="matrix side (default 4096; CPU 1024)"
    )
    timing.add_argument(
        "--repeats", type=_calls, default=20, help="timed calls per way (default 20)"
    )
    timing.add_argument(
        "--warmup", type=int, default=3, help="untimed calls after the first (default 3)"
    )


def _transfer_options(subs: Any, parents: list[argparse.ArgumentParser]) -> None:
    transfer = _subcommand(
        subs,
        "transfer",
        parents,
        "H2D/D2H bandwidth: pageable vs pinned, non_blocking off/on (CUDA only)",
    )
    transfer.add_argument(
        "--sizes",
        type=_sizes,
        metavar="LIST",
        help="copy sizes, such as 4K,64K,1M,16M,256M (the default)",
    )
    transfer.add_argument(
        "--min-time",
        type=_positive_float,
        metavar="SECONDS",
        default=0.05,
        help="seconds of copies per case (default 0.05)",
    )


def _overlap_options(subs: Any, parents: list[argparse.ArgumentParser]) -> None:
    overlap = _subcommand(
        subs,
        "overlap",
        parents,
        "fraction of a side-stream copy hidden behind compute (CUDA only)",
    )
    overlap.add_argument(
        "--batch-mib", type=_positive_int, default=64, help="MiB copied per batch (default 64)"
    )
    overlap.add_argument(
        "--batches", type=_batches, default=32, help="batches per run, 2 or more (default 32)"
    )
    overlap.add_argument(
        "--compute-ms",
        type=_positive_float,
        metavar="MS",
        help="compute per batch in ms (default: 1.25 x the copy time, so the copy can hide)",
    )
    overlap.add_argument(
        "--repeats", type=_calls, default=5, help="runs; the median counts (default 5)"
    )


def _model_options(subs: Any, parents: list[argparse.ArgumentParser]) -> None:
    model = _subcommand(
        subs,
        "model",
        parents,
        "per-stage times of a model per batch size: H2D, compute, D2H, total, rows/s",
    )
    model.add_argument(
        "--model",
        default="seed-mlp",
        help="seed-mlp, wide-mlp, or module:callable returning an nn.Module; it runs in eval mode "
        "as model(x), one tensor (default seed-mlp)",
    )
    model.add_argument(
        "--batch-sizes",
        type=_positive_int_list,
        metavar="LIST",
        default=(1, 8, 32, 128),
        help="comma-separated batch sizes (default 1,8,32,128)",
    )
    model.add_argument(
        "--input-shape",
        type=_row_shape,
        metavar="SHAPE",
        help="shape of one input row, such as 512 (required for module:callable); the batch is "
        "dimension 0 of x, before it",
    )
    model.add_argument(
        "--dtype",
        default=None,
        choices=DTYPES,
        help="input and weight dtype; int64 or int32 give index inputs (token ids 0 and 1) "
        "to a model that takes them, such as an embedding, and leave its weights as they are "
        "(default: the model's own dtype, that of its first floating parameter; float32 for "
        "the embedded models)",
    )
    model.add_argument(
        "--min-time",
        type=_positive_float,
        metavar="SECONDS",
        default=0.1,
        help="seconds of calls per stage, 5 calls at least (default 0.1)",
    )


@dataclass
class _Outcome:
    """What one benchmark gives: its figures (None when skipped), tables, and notes."""

    figures: dict[str, Any] | None
    tables: list[Any] = field(default_factory=list)
    reason: str | None = None
    plot: str | None = None


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark; 0 when it ran or was skipped for a stated reason."""
    from rich.console import Console

    report.require_torch()  # say why torch cannot be imported, not a traceback
    from torchplace.bench.timer import TimingWarning
    from torchplace.devices import resolve_device

    _check_plot(args)
    report.check_output(args.output)
    report.check_stdout(args.output)
    report.check_distinct(
        [args.output, getattr(args, "plot", None)],
        report.model_source(getattr(args, "model", None)),
    )
    device = resolve_device(args.device)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    if device.type == "meta":
        raise TimingError(
            "cannot benchmark on the 'meta' device: it runs no kernels; use cpu or cuda:N"
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TimingWarning)
        # a model's own prints go to stderr: stdout holds the report alone (--json parses)
        with contextlib.redirect_stdout(sys.stderr):
            outcome = _dispatch(args, device)
    notes: list[str] = []
    for warning in caught:
        if issubclass(warning.category, TimingWarning):
            notes.append(str(warning.message))
        else:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    if args.format == "json":
        result = _result(args.bench, outcome, notes)
        report.write_report(
            report.to_json(report.envelope("bench", result, device=str(device))), args.output
        )
    else:
        with report.open_report(args.output) as out:
            console = Console(file=out, highlight=False, width=report.console_width())
            _print_text(console, args.bench, device, outcome, notes)
    return report.EXIT_OK


def _check_plot(args: argparse.Namespace) -> None:
    """Refuse a ``--plot`` path that cannot be written before the benchmark runs, not after."""
    path = getattr(args, "plot", None)
    if not path:
        return
    from torchplace.bench.plot import require_matplotlib

    require_matplotlib()
    if not str(path).lower().endswith(".png"):
        raise ConfigError(f"--plot writes a PNG; give a path ending in .png, not {path!r}")
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"--plot {path!r} is a directory; give a file path")
    if not target.parent.is_dir():
        raise ConfigError(
            f"--plot {path!r}: the directory {str(target.parent)!r} does not exist; create it "
            "or give a path in an existing directory"
        )


def _result(benchmark: str, outcome: _Outcome, notes: list[str]) -> dict[str, Any]:
    """The ``result`` of the JSON report (the shipped schema ``bench.v1.json``)."""
    import torch

    return {
        "benchmark": benchmark,
        "threads": torch.get_num_threads(),
        "skipped": outcome.figures is None,
        "reason": outcome.reason,
        "figures": outcome.figures,
        "plot": outcome.plot,
        "warnings": notes,
    }


def _print_text(
    console: Console, benchmark: str, device: torch.device, outcome: _Outcome, notes: list[str]
) -> None:
    from rich.markup import escape

    # paths, reasons and notes are text, not markup: '[b]' in a --plot path stays in it
    if outcome.figures is None:
        console.print(
            f"[bold]torchplace bench {benchmark}[/]: skipped on {device}. "
            f"{escape(outcome.reason or '')}."
        )
    for table in outcome.tables:
        console.print(table)
    if outcome.plot:
        console.print(f"wrote plot {escape(outcome.plot)}")
    for note in notes:
        console.print(f"[yellow]note:[/] {escape(note)}")


@contextmanager
def _steps(total: int) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr (only on a terminal) advanced once per step."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    err = Console(file=sys.stderr)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )
    with progress:
        task = progress.add_task("starting", total=total)
        started = False

        def step(description: str) -> None:
            nonlocal started
            if started:
                progress.advance(task)
            started = True
            progress.update(task, description=description)

        yield step


def _dispatch(args: argparse.Namespace, device: torch.device) -> _Outcome:
    command = args.bench
    if command in _CUDA_ONLY and device.type != "cuda":
        reason = f"{command} is CUDA only: " + _CUDA_ONLY[command].format(device=device)
        return _Outcome(None, reason=reason)
    run_one: dict[str, Callable[[argparse.Namespace, torch.device], _Outcome]] = {
        "timing": _timing,
        "transfer": _transfer,
        "overlap": _overlap,
        "model": _model,
    }
    return run_one[command](args, device)


def _timing(args: argparse.Namespace, device: torch.device) -> _Outcome:
    from torchplace.bench import timing
    from torchplace.bench.render import timing_table
    from torchplace.bench.timer import MAX_CALLS

    if not 0 <= args.warmup <= MAX_CALLS:
        raise ConfigError(f"--warmup must be 0 to {MAX_CALLS:,}, got {args.warmup}")
    result = timing.compare_clocks(device, size=args.size, repeats=args.repeats, warmup=args.warmup)
    reason = "naive clock and device events skipped: CUDA only" if device.type == "cpu" else None
    return _Outcome(result.to_dict(), [timing_table(result)], reason=reason)


def _transfer(args: argparse.Namespace, device: torch.device) -> _Outcome:
    from torchplace.bench.render import transfer_tables
    from torchplace.bench.transfer import DEFAULT_SIZES, run_transfer, transfer_cases

    sizes = args.sizes or DEFAULT_SIZES
    with _steps(len(sizes) * len(transfer_cases())) as step:
        result = run_transfer(device, sizes=sizes, min_time=args.min_time, progress=step)
    outcome = _Outcome(result.to_dict(), transfer_tables(result))
    if args.plot:
        from torchplace.bench.plot import plot_transfer

        outcome.plot = str(plot_transfer(result, args.plot))
    return outcome


def _overlap(args: argparse.Namespace, device: torch.device) -> _Outcome:
    from torchplace.bench.overlap import run_overlap
    from torchplace.bench.render import overlap_table

    with _steps(args.repeats + 1) as step:
        result = run_overlap(
            device,
            batch_bytes=args.batch_mib << 20,
            batches=args.batches,
            compute_ms=args.compute_ms,
            repeats=args.repeats,
            progress=step,
        )
    return _Outcome(result.to_dict(), [overlap_table(result)])


def _model(args: argparse.Namespace, device: torch.device) -> _Outcome:
    from torchplace.bench.render import stages_table
    from torchplace.bench.stages import load_model_spec, run_stages

    spec = load_model_spec(args.model, args.input_shape)
    with _steps(len(args.batch_sizes)) as step:
        result = run_stages(
            spec,
            device,
            batch_sizes=args.batch_sizes,
            dtype=args.dtype,
            min_time=args.min_time,
            progress=step,
        )
    outcome = _Outcome(result.to_dict(), [stages_table(result)])
    if args.plot:
        from torchplace.bench.plot import plot_stages

        outcome.plot = str(plot_stages(result, args.plot))
    return outcome
