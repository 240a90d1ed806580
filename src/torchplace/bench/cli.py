"""Time GPU work honestly: clocks, host/device transfers, copy/compute overlap, model stages.

Subcommands:

- ``timing``: one matrix product timed three ways (naive clock, synchronised clock, events);
- ``transfer``: H2D/D2H bandwidth, pageable vs pinned, ``non_blocking`` off/on (CUDA only);
- ``overlap``: how much of a side-stream copy hides behind compute (CUDA only);
- ``model``: H2D, compute, D2H, total, throughput and peak memory per batch size.

Every subcommand prints a table, or writes JSON with ``--json PATH`` (``--json -`` for stdout
only). CUDA-only parts on a machine without CUDA say that they were skipped and why, and exit 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from torchplace.errors import ConfigError, TimingError

if TYPE_CHECKING:
    import torch
    from rich.console import Console

__all__ = ["JSON_SCHEMA", "configure", "run"]

JSON_SCHEMA = "torchplace.bench/1"

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
        if not value > 0:  # also rejects nan
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive {noun}")
        return value

    return parse


_positive_float = _positive(float, "number")
_positive_int = _positive(int, "integer")


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
        "--device", default="auto", help="device to measure on: auto, cpu, cuda, cuda:N, ..."
    )
    common.add_argument(
        "--json", metavar="PATH", help="write the results as JSON to PATH ('-' for stdout only)"
    )
    common.add_argument(
        "--threads",
        type=_positive_int,
        metavar="N",
        help="torch CPU threads (torch.set_num_threads) for a reproducible CPU figure",
    )
    plot = argparse.ArgumentParser(add_help=False)
    plot.add_argument(
        "--plot", metavar="FILE.png", help="draw the sweep to a PNG (needs torchplace[plot])"
    )
    subs = parser.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)

    timing = _subcommand(
        subs,
        "timing",
        [common],
        "one matmul timed three ways: naive clock, synchronised clock, device events",
    )
    timing.add_argument(
        "--size", type=_positive_int, metavar="N", help="matrix side (default 4096; CPU 1024)"
    )
    timing.add_argument("--repeats", type=_positive_int, default=20, help="timed calls per way")
    timing.add_argument("--warmup", type=int, default=3, help="untimed calls after the first")

    transfer = _subcommand(
        subs,
        "transfer",
        [common, plot],
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
        help="seconds of copies per case",
    )

    overlap = _subcommand(
        subs,
        "overlap",
        [common],
        "fraction of a side-stream copy hidden behind compute (CUDA only)",
    )
    overlap.add_argument(
        "--batch-mib", type=_positive_int, default=64, help="MiB copied per batch (default 64)"
    )
    overlap.add_argument("--batches", type=_positive_int, default=32, help="batches per run")
    overlap.add_argument(
        "--compute-ms",
        type=_positive_float,
        metavar="MS",
        help="compute per batch in ms (default: 1.25 x the copy time, so the copy can hide)",
    )
    overlap.add_argument("--repeats", type=_positive_int, default=5, help="runs; the median counts")

    model = _subcommand(
        subs,
        "model",
        [common, plot],
        "per-stage times of a model per batch size: H2D, compute, D2H, total, rows/s",
    )
    model.add_argument(
        "--model",
        default="seed-mlp",
        help="seed-mlp, wide-mlp, or module:callable returning an nn.Module (default seed-mlp)",
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
        help="shape of one input row, such as 512 (required for module:callable)",
    )
    model.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "float16", "bfloat16", "float64"),
        help="input and weight dtype",
    )
    model.add_argument(
        "--min-time",
        type=_positive_float,
        metavar="SECONDS",
        default=0.1,
        help="seconds of calls per stage",
    )


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark; 0 when it ran or was skipped for a stated reason."""
    from rich.console import Console

    from torchplace.bench.timer import TimingWarning
    from torchplace.devices import resolve_device

    if getattr(args, "plot", None):
        from torchplace.bench.plot import require_matplotlib

        require_matplotlib()
        if not str(args.plot).lower().endswith(".png"):
            raise ConfigError(f"--plot writes a PNG; give a path ending in .png, not {args.plot!r}")
    to_stdout = args.json == "-"
    for flag, path in (("--json", None if to_stdout else args.json), ("--plot", _plot_path(args))):
        _check_writable(flag, path)
    console = Console(file=sys.stderr if to_stdout else sys.stdout, highlight=False)
    device = resolve_device(args.device)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    if device.type == "meta":
        raise TimingError(
            "cannot benchmark on the 'meta' device: it runs no kernels; use cpu or cuda:N"
        )
    notes: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TimingWarning)
        payload = _dispatch(args, device, console, quiet=to_stdout)
    for warning in caught:
        if issubclass(warning.category, TimingWarning):
            notes.append(str(warning.message))
        else:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    if not to_stdout:
        for note in notes:
            console.print(f"[yellow]note:[/] {note}")
    document = _envelope(args.bench, device, payload, notes)
    if args.json:
        text = json.dumps(document, indent=2)
        if to_stdout:
            sys.stdout.write(text + "\n")
        else:
            Path(args.json).write_text(text + "\n")
            console.print(f"wrote {args.json}")
    return 0


def _plot_path(args: argparse.Namespace) -> str | None:
    """The ``--plot`` path, for the subcommands that have one."""
    value = getattr(args, "plot", None)
    return None if value is None else str(value)


def _check_writable(flag: str, path: str | None) -> None:
    """Refuse an output path that cannot be written before the benchmark runs, not after."""
    if not path:
        return
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{flag} {path!r} is a directory; give a file path")
    if not target.parent.is_dir():
        raise ConfigError(
            f"{flag} {path!r}: the directory {str(target.parent)!r} does not exist; create it "
            "or give a path in an existing directory"
        )


def _envelope(
    command: str, device: torch.device, payload: dict[str, Any], notes: list[str]
) -> dict[str, Any]:
    import torch

    from torchplace import __version__

    return {
        "schema": JSON_SCHEMA,
        "command": f"bench {command}",
        "device": str(device),
        "torch": torch.__version__,
        "torchplace": __version__,
        "threads": torch.get_num_threads(),
        "skipped": payload.get("skipped", False),
        "reason": payload.get("reason"),
        "result": payload.get("result"),
        "plot": payload.get("plot"),
        "warnings": notes,
    }


@contextmanager
def _steps(console: Console, total: int, quiet: bool) -> Iterator[Callable[[str], None]]:
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
        disable=quiet or not err.is_terminal,
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


def _skip(console: Console, command: str, device: torch.device, quiet: bool) -> dict[str, Any]:
    reason = f"{command} is CUDA only: " + _CUDA_ONLY[command].format(device=device)
    if not quiet:
        console.print(f"[bold]torchplace bench {command}[/]: skipped on {device}. {reason}.")
    return {"skipped": True, "reason": reason, "result": None}


def _dispatch(
    args: argparse.Namespace, device: torch.device, console: Console, *, quiet: bool
) -> dict[str, Any]:
    from torchplace.bench import render

    command = args.bench
    if command in _CUDA_ONLY and device.type != "cuda":
        return _skip(console, command, device, quiet)
    payload: dict[str, Any] = {}
    if command == "timing":
        from torchplace.bench.timing import compare_clocks

        if args.warmup < 0:
            raise ConfigError(f"--warmup must be 0 or more, got {args.warmup}")
        timing = compare_clocks(device, size=args.size, repeats=args.repeats, warmup=args.warmup)
        payload["result"] = timing.to_dict()
        if device.type == "cpu":
            payload["reason"] = "naive clock and device events skipped: CUDA only"
        if not quiet:
            console.print(render.timing_table(timing))
    elif command == "transfer":
        from torchplace.bench.transfer import DEFAULT_SIZES, run_transfer, transfer_cases

        sizes = args.sizes or DEFAULT_SIZES
        with _steps(console, len(sizes) * len(transfer_cases()), quiet) as step:
            transfer = run_transfer(device, sizes=sizes, min_time=args.min_time, progress=step)
        payload["result"] = transfer.to_dict()
        if not quiet:
            for table in render.transfer_tables(transfer):
                console.print(table)
        if args.plot:
            from torchplace.bench.plot import plot_transfer

            payload["plot"] = str(plot_transfer(transfer, args.plot))
    elif command == "overlap":
        from torchplace.bench.overlap import run_overlap

        with _steps(console, args.repeats + 1, quiet) as step:
            overlap = run_overlap(
                device,
                batch_bytes=args.batch_mib << 20,
                batches=args.batches,
                compute_ms=args.compute_ms,
                repeats=args.repeats,
                progress=step,
            )
        payload["result"] = overlap.to_dict()
        if not quiet:
            console.print(render.overlap_table(overlap))
    else:
        from torchplace.bench.stages import load_model_spec, run_stages

        spec = load_model_spec(args.model, args.input_shape)
        with _steps(console, len(args.batch_sizes), quiet) as step:
            stages = run_stages(
                spec,
                device,
                batch_sizes=args.batch_sizes,
                dtype=args.dtype,
                min_time=args.min_time,
                progress=step,
            )
        payload["result"] = stages.to_dict()
        if not quiet:
            console.print(render.stages_table(stages))
        if args.plot:
            from torchplace.bench.plot import plot_stages

            payload["plot"] = str(plot_stages(stages, args.plot))
    if payload.get("plot") and not quiet:
        console.print(f"wrote plot {payload['plot']}")
    return payload
