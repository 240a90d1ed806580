"""The planner's activation peak against the peak of a real run, and the planner's own cost.

For each model and batch size the planner traces the forward on ``meta`` (as the measuring
device's kernels run: ``torchplace.planner.fused.kernels``) and estimates the activation peak
of one device (``Trace.peak()``: the most bytes alive at once, inputs
excluded). The real model then runs the same forward:

* on the CPU, under torch's profiler with ``profile_memory=True``: the CPU allocator's own
  allocation and free events, summed in time order (independent of the planner's tracker;
  each event at its own time, so a fused operator's temporaries count);
* on CUDA (``--device cuda:0``), as the caching allocator's peak of requested bytes
  (``memory_stats()["requested_bytes.all.peak"]``) less what was requested before the
  forward, after a warm-up run: the tensors' own bytes, as the plan counts them. The
  allocator rounds each block up to a multiple of 512 bytes, so ``max_memory_allocated()``
  (printed beside it) counts seed-mlp's batch-1 peak, two 64-byte tensors, as two 512-byte
  blocks; the plan's margin reserve covers that rounding. A torch without the requested-bytes
  statistic is measured by ``max_memory_allocated()``.

A case passes within ``--tolerance`` (default 10%). Then the planner's cost: ``torchplace plan
--model llama-7b-like --batch 1-64`` in a fresh process, its wall time and peak RSS against
30 s and 2 GiB. Prints PASS/FAIL lines; exits 1 if any fails.

    python benchmarks/plan_accuracy.py
    python benchmarks/plan_accuracy.py --device cuda:0 --quick --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CASES: list[tuple[str, list[int], int | None]] = [
    ("seed-mlp", [1, 64, 1024], None),
    ("wide-mlp", [1, 16, 256], None),
    ("gpt2-like", [1, 2, 4], 64),
    ("gpt2-like", [1, 2], 256),
]
QUICK = [CASES[0], CASES[1], ("gpt2-like", [1, 2], 64)]
SPEED_TARGET_S, RSS_TARGET = 30.0, 2 << 30


def measured_peak(module: Any, inputs: list[Any], device: str) -> int:
    """The real forward's peak above what was allocated before it (the figure judged)."""
    return measured_peaks(module, inputs, device)[0]


def measured_peaks(module: Any, inputs: list[Any], device: str) -> tuple[int, int | None]:
    """The figure judged, and on CUDA the allocated peak beside it (None elsewhere)."""
    import torch

    with torch.inference_mode():
        module(*inputs)  # warm-up: lazy state, kernels, workspaces
        if device.startswith("cuda"):
            return _cuda_peak(module, inputs, device)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = module(*inputs)
            del out
    return _allocator_peak(prof), None


_REQUESTED = "requested_bytes.all"


def _cuda_peak(module: Any, inputs: list[Any], device: str) -> tuple[int, int]:
    """The forward's peak on CUDA above what was there before it: (requested bytes, as the
    plan counts them, and allocated bytes, rounded up to the allocator's blocks); the
    allocated peak stands for both where torch keeps no requested-bytes statistic."""
    import torch

    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    requested_base = torch.cuda.memory_stats(device).get(f"{_REQUESTED}.current")
    allocated_base = torch.cuda.memory_allocated(device)
    out = module(*inputs)
    torch.cuda.synchronize(device)
    allocated = int(torch.cuda.max_memory_allocated(device)) - allocated_base
    requested_peak = torch.cuda.memory_stats(device).get(f"{_REQUESTED}.peak")
    del out
    if requested_base is None or requested_peak is None:
        return allocated, allocated
    return int(requested_peak) - int(requested_base), allocated


def _allocator_peak(prof: Any) -> int:
    """The most bytes the CPU allocator held at once: its allocation and free events (each
    with its own time, wherever it happened: a fused operator's temporaries, freed by the
    operator that made them or by its caller) summed in time order."""
    from torch._C._profiler import _EventType

    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation:
            events.append((event.start_time_ns, event.extra_fields.alloc_size))
    live = peak = 0
    for _, change in sorted(events):
        live += change
        peak = max(peak, live)
    return peak


def accuracy(
    device: str, cases: list[tuple[str, list[int], int | None]], tolerance: float
) -> list[dict[str, Any]]:
    from torchplace.planner.api import plan
    from torchplace.planner.fused import kernels
    from torchplace.planner.inputs import load_plan_model

    rows = []
    for name, batches, seq in cases:
        # traced as the measuring device's kernels run (they differ for fused attention)
        with kernels("cpu" if device == "cpu" else "cuda"):
            p = plan(name, batch_sizes=batches, seq=seq, assume="1xH200", strategy="replicate")
        real = load_plan_model(name, device="cpu")
        module = real.module.to(device)
        for b in batches:
            estimate = p.traces[b].peak()
            got, allocated = measured_peaks(module, real.example(b, seq, device), device)
            error = (estimate - got) / got if got else 0.0
            ok = abs(error) <= tolerance
            rows.append(
                {
                    "model": name,
                    "batch": b,
                    "seq": seq,
                    "estimate": estimate,
                    "measured": got,
                    "allocated": allocated,
                    "error": error,
                    "ok": ok,
                }
            )
            label = f"{name} batch {b}" + (f" seq {seq}" if seq else "")
            blocks = "" if allocated is None else f"; in allocator blocks {allocated:,} B"
            print(
                f"{'PASS' if ok else 'FAIL'} plan_accuracy {label} on {device}: estimated "
                f"{estimate:,} B, measured {got:,} B ({error:+.2%}, tolerance {tolerance:.0%})"
                f"{blocks}"
            )
        del module
    return rows


_SELF_RSS = (
    "import resource, sys\n"
    "from torchplace.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "sys.stderr.write(f'\\nMAXRSS_KIB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n')\n"
    "sys.exit(code)\n"
)


def speed() -> dict[str, Any]:
    """``torchplace plan`` for llama-7b-like at batch 1-64, in a fresh process that reports its
    own peak RSS (``getrusage(RUSAGE_SELF)`` at exit)."""
    cmd = [
        sys.executable,
        "-c",
        _SELF_RSS,
        "plan",
        "--model",
        "llama-7b-like",
        "--batch",
        "1-64",
        "--assume",
        "2xH200",
        "--json",
        "-o",
        os.devnull,
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    wall = time.perf_counter() - start
    kib = [line.split()[1] for line in done.stderr.splitlines() if line.startswith("MAXRSS_KIB ")]
    rss = int(kib[-1]) * 1024 if kib else -1
    ok = done.returncode == 0 and wall <= SPEED_TARGET_S and 0 < rss < RSS_TARGET
    print(
        f"{'PASS' if ok else 'FAIL'} plan_speed llama-7b-like batch 1-64: {wall:.1f} s wall "
        f"(target {SPEED_TARGET_S:.0f} s), peak RSS {rss / 2**20:,.0f} MiB (target "
        f"{RSS_TARGET / 2**30:.0f} GiB), exit {done.returncode}"
    )
    if done.returncode:
        print(done.stderr[-2000:])
    return {"wall_s": wall, "peak_rss": rss, "rc": done.returncode, "ok": ok}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="where the real model runs (cpu, cuda:0)")
    parser.add_argument(
        "--tolerance", type=float, default=0.10, help="relative error (default 0.10)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer sizes")
    parser.add_argument("--no-speed", action="store_true", help="skip the llama-7b-like timing")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = parser.parse_args(argv)
    rows = accuracy(args.device, QUICK if args.quick else CASES, args.tolerance)
    result: dict[str, Any] = {"device": args.device, "accuracy": rows}
    if not args.no_speed:
        result["speed"] = speed()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2), encoding="utf-8")
    failed = not all(r["ok"] for r in rows) or not result.get("speed", {"ok": True})["ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
