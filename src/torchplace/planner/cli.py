"""Plan where a model's weights, batches, activations and outputs go on a set of devices.

Exit status: 0 the plan fits (and ``--verify`` agreed); 1 it does not fit at a requested batch
size, or ``--verify`` measured past the tolerance; 2 usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from torchplace import report
from torchplace.errors import ConfigError

__all__ = ["MAX_BATCH", "MAX_BATCHES", "configure", "parse_batches", "run"]


#: The largest batch size, and the most batch sizes, one plan takes.
MAX_BATCH, MAX_BATCHES = 1 << 20, 1024


def parse_batches(text: str) -> list[int]:
    """``1,2,8`` or ``1-64`` (every size) or a mix: ``1-4,16``."""
    out: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            first = int(lo)
            last = int(hi) if dash else first  # "1-", a range without its end, fails here
        except ValueError:
            raise ConfigError(f"cannot read --batch {text!r}; write e.g. 1,8,32 or 1-64") from None
        if first < 1 or last > MAX_BATCH or first > last:
            raise ConfigError(
                f"--batch {text!r}: batch sizes must be between 1 and {MAX_BATCH}, "
                "and a range must go up (1-64)"
            )
        if last - first + len(out) >= MAX_BATCHES:
            raise ConfigError(
                f"--batch {text!r} asks for more than {MAX_BATCHES} batch sizes; plan a few "
                "at a time, e.g. 1,8,32,128 (the report gives the largest batch that fits)"
            )
        out.update(range(first, last + 1))
    return sorted(out)


def configure(parser: argparse.ArgumentParser) -> None:
    _model_options(parser)
    _device_options(parser)
    _strategy_options(parser)
    _check_options(parser)
    report.add_output_options(parser)


def _model_options(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model (as torchplace serve takes it)")
    model.add_argument(
        "--model",
        default="seed-mlp",
        help="embedded model (seed-mlp, wide-mlp), transformer shape (gpt2-like, llama-7b-like) "
        "or module:callable (default: seed-mlp)",
    )
    model.add_argument("--exported", metavar="FILE.pt2", help="plan a torch.export program")
    model.add_argument(
        "--input",
        dest="inputs",
        action="append",
        metavar="NAME:DATATYPE:DIMS",
        help="declare an input, e.g. input:FP32:-1,8 (first -1 = batch, a later -1 = sequence)",
    )
    model.add_argument(
        "--batch",
        default="1",
        help=f"batch sizes: 1,8,32 or a range 1-64 (at most {MAX_BATCHES} sizes, each at most "
        f"{MAX_BATCH}; default: 1)",
    )
    model.add_argument("--seq", type=int, help="sequence length, where the inputs have one")


def _device_options(parser: argparse.ArgumentParser) -> None:
    from torchplace.planner.hardware import ASSUMED, LINKS

    hw = parser.add_argument_group("devices")
    hw.add_argument(
        "--assume",
        metavar="NxMODEL",
        help=f"plan for assumed devices: 2xH200, 4xA100-80GB, 2x80GiB (models: "
        f"{', '.join(m.name for m in ASSUMED.values())}; default 2xH200)",
    )
    hw.add_argument(
        "--devices", metavar="LIST", help="this machine's devices: all or cuda:0,cuda:1"
    )
    hw.add_argument(
        "--link", choices=sorted(LINKS), help="link between devices (default: the model's)"
    )
    hw.add_argument(
        "--reserve",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a reserve: cuda_context=500MiB, workspace=32MiB, margin=0.05",
    )
    hw.add_argument(
        "--max-memory",
        metavar="SIZES",
        help="memory per device for weights and buffers, comma-separated (e.g. 30GiB,40GiB); "
        "a hard limit: a device over it is an over-max-memory warning and exit 1; default: "
        "capacity less reserves, activation peak and KV cache",
    )


def _strategy_options(parser: argparse.ArgumentParser) -> None:
    how = parser.add_argument_group("strategy")
    how.add_argument(
        "--strategy",
        default="auto",
        choices=["auto", "replicate", "pipeline", "accelerate", "map"],
        help="auto (best that fits), replicate, pipeline, accelerate (its "
        "infer_auto_device_map), map (--map FILE)",
    )
    how.add_argument(
        "--balance",
        default="memory",
        choices=["memory", "compute", "fill"],
        help="pipeline stages balanced by weights, by FLOPs (within --max-memory), or filled in "
        "order as accelerate does",
    )
    how.add_argument(
        "--map",
        dest="map_file",
        metavar="FILE.json",
        help="an explicit device map (implies --strategy map)",
    )


def _check_options(parser: argparse.ArgumentParser) -> None:
    act = parser.add_argument_group("check and export")
    act.add_argument(
        "--verify",
        action="store_true",
        help="run the placement for real and compare: on the --devices named, or the plan's "
        "devices mapped onto this machine's GPUs (several onto one when there are fewer), or "
        "as logical devices on the CPU where there is no GPU",
    )
    act.add_argument(
        "--tolerance",
        type=float,
        default=0.10,
        help="--verify: largest relative memory error accepted (default 0.10); crossings and "
        "copies must match exactly",
    )
    act.add_argument(
        "--export",
        nargs=2,
        metavar=("device-map", "FILE"),
        help="write the device_map and max_memory accelerate and transformers accept",
    )
    act.add_argument("--plot", metavar="FILE.png", help="draw the placement and its crossings")


def _sizes(text: str | None) -> list[int] | None:
    from torchplace.planner.hardware import parse_size

    return None if text is None else [parse_size(part) for part in text.split(",")]


def run(args: argparse.Namespace) -> int:
    report.require_torch()  # the planner's devices and shapes import it: say why it cannot be
    from torchplace.planner.render import export_device_map, plot_plan, render_text
    from torchplace.planner.verify import check_tolerance

    report.check_output(args.output)
    report.check_stdout(args.output)
    check_tolerance(args.tolerance)  # before the planning, which takes seconds
    inputs: Any = None
    if args.inputs:
        from torchplace.serve.config import parse_tensor_spec

        inputs = [parse_tensor_spec(text) for text in args.inputs]
    if args.export and args.export[0] != "device-map":
        raise ConfigError(f"--export {args.export[0]!r}: the one export is 'device-map FILE'")
    if args.export:
        report.check_output(args.export[1], flag="--export device-map")
    report.check_output(args.plot, flag="--plot")
    if args.plot and Path(args.plot).suffix.lower() != ".png":
        raise ConfigError(f"--plot {args.plot!r}: the drawing is a PNG; give a FILE.png")
    report.check_distinct(
        [args.output, args.export[1] if args.export else None, args.plot],
        [
            *report.model_source(args.model),
            *(str(p) for p in (args.map_file, args.exported) if p is not None),
        ],
    )
    # The user's factory and forward run in this process: whatever they print goes to stderr,
    # so that stdout holds the report alone (and --json stays parseable).
    with contextlib.redirect_stdout(sys.stderr):
        result, verdict = _plan_and_verify(args, inputs)
    if args.export:
        export_device_map(result, args.export[1])
    if args.plot:
        plot_plan(result, args.plot)
    ok = result.fits() and (verdict is None or verdict.ok)
    if args.format == "json":
        body = result.to_dict()
        if verdict is not None:
            body["verify"] = verdict.to_dict()
        where = ",".join(d.device for d in result.devices)
        text = report.to_json(report.envelope("plan", body, device=where))
    else:
        text = render_text(result) + ("" if verdict is None else "\n" + verdict.render())
    report.write_report(text, args.output)
    return report.EXIT_OK if ok else report.EXIT_FAILED


def _plan_and_verify(args: argparse.Namespace, inputs: Any) -> tuple[Any, Any]:
    from torchplace.planner.api import plan

    result = plan(
        args.model,
        batch_sizes=parse_batches(args.batch),
        seq=args.seq,
        assume=args.assume,
        devices=args.devices,
        link=args.link,
        strategy=args.strategy,
        balance=args.balance,
        map_file=args.map_file,
        reserves=args.reserve,
        max_memory=_sizes(args.max_memory),
        exported=args.exported,
        inputs=inputs,
    )
    verdict = None
    if args.verify:
        from torchplace.planner.verify import verify

        verdict = verify(result, tolerance=args.tolerance)
    return result, verdict
