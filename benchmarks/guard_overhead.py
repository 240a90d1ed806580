"""What does the placement guard cost? Bare forward vs. forward under ``torchplace.guard()``.

Runs the embedded ``seed-mlp`` and ``wide-mlp`` at batch 32 (eval mode), bare and inside a guard
in "record" mode, in the same process, interleaved round by round (alternating which goes
first). Each round's guarded block is divided by the bare block next to it; the verdict is the
median of those ratios.

Targets: record mode costs at most 1.5x the bare forward on ``seed-mlp`` and at most 1.05x on
``wide-mlp``, for a plain ``model(x)`` forward (autograd enabled, as a training or evaluation
loop runs it), on the CPU, where they are defined. The same forward under
``torch.inference_mode()`` is printed too, for information: it is faster bare (no autograd
bookkeeping) while the guard's cost per torch call is the same, so its ratio is higher on tiny
models. On another device (``--device cuda:0``) every row is information: the forward is
timed with a device synchronization at the end of each block (outside the guard), and a
launch-bound GPU forward of a few microseconds makes the guard's fixed cost per call look
larger than the targets, which are about the CPU.

    python benchmarks/guard_overhead.py [--device auto] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

import torchplace
from torchplace.devices import resolve_device
from torchplace.models import build_model

TARGETS = {"seed-mlp": 1.5, "wide-mlp": 1.05}
BATCH = 32


@dataclass
class Result:
    model: str
    grad_mode: str
    counts_for_target: bool
    device: str
    batch: int
    rounds: int
    iterations_per_round: int
    bare_us: float
    guard_us: float
    ratio: float
    target: float
    passed: bool
    events_in_forward: int


def _block(
    forward: Callable[[], object], n: int, sync: Callable[[], None], guarded: bool
) -> tuple[float, int]:
    """Seconds per forward over ``n`` forwards (device work included), and events recorded.

    The guarded block enters the guard once around its ``n`` forwards; the device sync that
    ends both kinds of block runs outside the guard, so it is timed but not recorded.
    """
    events = 0
    start = time.perf_counter()
    if guarded:
        with torchplace.guard("record") as report:
            for _ in range(n):
                forward()
        events = len(report)
    else:
        for _ in range(n):
            forward()
    sync()
    return (time.perf_counter() - start) / n, events


def run_model(
    name: str, device: torch.device, rounds: int, deadline: float, inference: bool
) -> Result:
    model = build_model(name).to(device)
    width = next(model.parameters()).shape[1]
    x = torch.randn(BATCH, width, device=device)
    sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def forward() -> object:
        return model(x)

    with torch.inference_mode() if inference else contextlib.nullcontext():
        # size a block to ~50 ms so the timer's resolution and the guard's enter/exit vanish
        _block(forward, 10, sync, guarded=True)  # warm up, the guard's first entry included
        _block(forward, 10, sync, guarded=False)
        # the fastest of a few short blocks: a busy moment must not shrink every block
        one = min(_block(forward, 10, sync, guarded=False)[0] for _ in range(5))
        n = max(5, min(5000, int(0.05 / max(one, 1e-7))))
        bare: list[float] = []
        guarded: list[float] = []
        events = 0
        for i in range(rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            for use_guard in order:
                seconds, recorded = _block(forward, n, sync, guarded=use_guard)
                (guarded if use_guard else bare).append(seconds)
                events += recorded
            if time.perf_counter() > deadline and i >= 4:
                break
    bare_us = statistics.median(bare) * 1e6
    guard_us = statistics.median(guarded) * 1e6
    # each round's guarded block is compared with the bare block run right next to it, so a
    # load change on a shared machine moves both; the median over rounds is the verdict
    ratio = statistics.median(g / b for g, b in zip(guarded, bare, strict=True))
    return Result(
        model=name,
        grad_mode="inference_mode" if inference else "autograd",
        counts_for_target=not inference and device.type == "cpu",
        device=str(device),
        batch=BATCH,
        rounds=len(bare),
        iterations_per_round=n,
        bare_us=bare_us,
        guard_us=guard_us,
        ratio=ratio,
        target=TARGETS[name],
        passed=ratio <= TARGETS[name],
        events_in_forward=events,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", default="auto", help="auto (default), cpu, cuda:0, ...")
    parser.add_argument("--quick", action="store_true", help="a short run (< 60 s)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per model")
    parser.add_argument("--json", default=None, metavar="PATH", help="write results to PATH")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    rounds = args.rounds or (15 if args.quick else 41)
    budget = 20.0 if args.quick else 120.0
    torch.set_num_threads(torch.get_num_threads())

    contexts = (False, True)  # autograd (the target), then inference_mode (information)
    results = [
        run_model(
            name,
            device,
            rounds,
            time.perf_counter() + budget / (len(TARGETS) * len(contexts)),
            inference,
        )
        for inference in contexts
        for name in TARGETS
    ]
    print(
        f"guard overhead: eval forward at batch {BATCH} on {device}; ratio = median over rounds "
        "of guarded/bare adjacent blocks; targets apply to the autograd rows on the CPU"
    )
    header = (
        f"{'model':<10} {'grad mode':<15} {'bare us':>10} {'guard us':>10} {'ratio':>7} "
        f"{'target':>7}  result"
    )
    print(header)
    print("-" * len(header))
    judged = not args.quick  # --quick's few rounds cannot resolve a few percent: INFO there
    for r in results:
        verdict = "(info)"
        if r.counts_for_target and judged:
            verdict = "PASS" if r.passed else "FAIL"
        print(
            f"{r.model:<10} {r.grad_mode:<15} {r.bare_us:>10.1f} {r.guard_us:>10.1f} "
            f"{r.ratio:>6.3f}x {r.target:>6.2f}x  {verdict}"
        )
    for r in results:
        if not r.counts_for_target:
            continue
        line = "PASS" if r.passed else "FAIL"
        print(
            f"{line if judged else 'INFO'}: {r.model} record-mode guard costs "
            f"{r.ratio:.3f}x the bare forward (target <= {r.target}x; {r.rounds} rounds of "
            f"{r.iterations_per_round}; {r.events_in_forward} events recorded in the forward)"
            + ("" if judged else " (--quick: too short to judge)")
        )
    if not any(r.counts_for_target for r in results):
        print(f"no target checked on {device}: the targets are about the CPU (--device cpu)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {
                    "benchmark": "guard_overhead",
                    "torch": torch.__version__,
                    "torchplace": torchplace.__version__,
                    "device": str(device),
                    "target_grad_mode": "autograd",
                    "results": [asdict(r) for r in results],
                },
                handle,
                indent=2,
            )
    return 0 if not judged or all(r.passed for r in results if r.counts_for_target) else 1


if __name__ == "__main__":
    sys.exit(main())
