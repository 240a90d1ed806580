"""Crossing bytes per forward: accelerate's device map next to torchplace's plan, GPT-2-like.

The GPT-2-small-like shape (474 MiB of fp32 weights, built on ``meta``) over two assumed
H200s, with ``max_memory`` of 400 MiB per device so that neither holds the whole model and both
tools must split it. accelerate's map is ``infer_auto_device_map``'s; its dispatch hooks copy
every argument of each placed module to that module's device on every call, and send the
output back to the inputs' device. torchplace plans a two-stage pipeline under the same
``max_memory`` and copies each tensor once per device. Both are counted on the same trace, and
each placement is also run for real on logical CPU devices (batch 1, seq 128) to check the
counts. Prints both maps, the bytes between devices per forward, the ratio, and PASS when
torchplace copies fewer bytes.

    python benchmarks/plan_vs_accelerate.py
    python benchmarks/plan_vs_accelerate.py --quick --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

MiB = 1 << 20
CASES = [(1, 128), (1, 1024), (8, 128), (4, 512)]  # (batch, sequence length)
MAX_MEMORY = [400 * MiB, 400 * MiB]
VERIFY_TOKENS = 128  # real CPU runs only up to batch x seq = 128


def summary(p: Any) -> str:
    from torchplace.planner.exercise import _ranges

    by_dev: dict[str, list[str]] = {}
    for unit in p.units.paths:
        by_dev.setdefault(p.placement.device_of(unit), []).append(unit)
    return "; ".join(f"{dev}: {_ranges(units)}" for dev, units in by_dev.items())


def run_case(batch: int, seq: int, memory: list[int], verify: bool) -> dict[str, Any]:
    from torchplace.planner.api import plan
    from torchplace.planner.verify import verify as run_verify

    row: dict[str, Any] = {"batch": batch, "seq": seq}
    for name, strategy in (("accelerate", "accelerate"), ("torchplace", "pipeline")):
        p = plan(
            "gpt2-like",
            batch_sizes=[batch],
            seq=seq,
            assume="2xH200",
            strategy=strategy,
            max_memory=memory,
        )
        edges = [c for c in p.flow.crossings if "cpu" not in (c.src, c.dst)]
        row[name] = {
            "map": summary(p),
            "device_bytes": p.flow.bytes_between_devices(),
            "copies": sum(c.count for c in edges),
            "recopies_bytes": sum(c.total for c in edges if c.kind in ("recopy", "return")),
            "warnings": [w.code for w in p.warnings],
        }
        if verify:
            row[name]["verified"] = run_verify(p, devices=["cpu"]).ok
    row["ratio"] = row["accelerate"]["device_bytes"] / max(1, row["torchplace"]["device_bytes"])
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one case only")
    parser.add_argument("--no-verify", action="store_true", help="skip the real runs on the CPU")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = parser.parse_args(argv)
    memory = MAX_MEMORY
    print(
        f"gpt2-like over 2 assumed H200s; max_memory for weights: "
        f"{memory[0] / MiB:,.0f} MiB, {memory[1] / MiB:,.0f} MiB (the same for both tools)"
    )
    rows = []
    failed = False
    for batch, seq in CASES[:2] if args.quick else CASES:
        row = run_case(
            batch, seq, memory, verify=not args.no_verify and batch * seq <= VERIFY_TOKENS
        )
        rows.append(row)
        acc, ours = row["accelerate"], row["torchplace"]
        print(f"\nbatch {batch}, seq {seq}")
        for name, r in (("accelerate", acc), ("torchplace", ours)):
            check = (
                ""
                if "verified" not in r
                else f", verified on CPU: {'yes' if r['verified'] else 'NO'}"
            )
            print(f"  {name:<10} map  {r['map']}")
            print(
                f"  {name:<10} {r['device_bytes'] / MiB:8.2f} MiB between devices per forward in "
                f"{r['copies']} copies ({r['recopies_bytes'] / MiB:.2f} MiB re-copied or sent back)"
                f"{check}; warnings: {', '.join(r['warnings']) or 'none'}"
            )
        print(f"  ratio accelerate / torchplace: {row['ratio']:.2f}x")
        ok = ours["device_bytes"] < acc["device_bytes"] and all(
            r.get("verified", True) for r in (acc, ours)
        )
        failed |= not ok
        print(
            f"{'PASS' if ok else 'FAIL'} plan_vs_accelerate batch {batch} seq {seq}: torchplace "
            f"{ours['device_bytes'] / MiB:.2f} MiB vs accelerate {acc['device_bytes'] / MiB:.2f} MiB "
            f"per forward ({row['ratio']:.2f}x fewer)"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"max_memory": memory, "cases": rows}, fh, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
