"""Cold start of ``torchplace doctor`` next to ``python -m torch.utils.collect_env``.

Each run is a fresh interpreter (so ``import torch`` is paid every time); the commands are
interleaved round by round so that background noise hits them alike. Two floors run beside
them: ``import torch`` alone, and ``import torch`` plus one tensor made on the device (the
context the doctor cannot avoid creating); no doctor starts faster than the second. Prints the
medians, the ratio to the peer, the doctor's time above the floor, and a PASS/FAIL line per
doctor command for the target (default: 3 s). Exits 1 if a target is missed.

    python benchmarks/doctor_startup.py                 # 5 rounds
    python benchmarks/doctor_startup.py --quick --device cuda:0 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TARGET_S = 3.0
FLOOR_IMPORT = "floor: python -c 'import torch'"
FLOOR_DEVICE = "floor: import torch + a tensor on the device"
FLOORS = (FLOOR_IMPORT, FLOOR_DEVICE)


def doctor_command() -> list[str]:
    script = Path(sys.executable).with_name("torchplace")
    return [str(script)] if script.exists() else [sys.executable, "-m", "torchplace.cli"]


def time_once(cmd: list[str], timeout: float) -> tuple[float, int]:
    start = time.perf_counter()
    try:
        done = subprocess.run(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout, check=False
        )
        rc = done.returncode
    except subprocess.TimeoutExpired:
        rc = 124
    return time.perf_counter() - start, rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="device for the doctor (default auto)")
    parser.add_argument("--runs", type=int, default=5, help="rounds (default 5; --quick: 3)")
    parser.add_argument(
        "--quick", action="store_true", help="a short run (up to 3 rounds, about 60 s at most)"
    )
    parser.add_argument("--target", type=float, default=TARGET_S, help="seconds (default 3)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = parser.parse_args(argv)
    runs = 3 if args.quick else args.runs
    if runs < 1:
        parser.error(f"--runs must be 1 or more, got {args.runs}")

    doctor = [*doctor_command(), "doctor", "--device", args.device]
    floor_code = (  # the doctor's `auto`: the current accelerator, else the CPU
        "import sys, torch; name = sys.argv[1]; "
        "auto = torch.accelerator.current_accelerator() if name == 'auto' else None; "
        "torch.zeros(1, device=auto or ('cpu' if name == 'auto' else name))"
    )
    commands = {
        FLOOR_IMPORT: [sys.executable, "-c", "import torch"],
        FLOOR_DEVICE: [sys.executable, "-c", floor_code, args.device],
        "torchplace doctor": doctor,
        "torchplace doctor --json": [*doctor, "--json"],
        "python -m torch.utils.collect_env (peer)": [
            sys.executable,
            "-W",
            "ignore",
            "-m",
            "torch.utils.collect_env",
        ],
    }
    timeout = max(60.0, 10 * args.target)
    times: dict[str, list[float]] = {name: [] for name in commands}
    codes: dict[str, list[int]] = {name: [] for name in commands}
    # --quick must end within about 60 s, even on a GPU machine where every cold start also
    # creates a CUDA context: no new round after `deadline`, and no command past `hard_stop`
    started = time.monotonic()
    deadline = started + (35 if args.quick else 600)
    hard_stop = started + (55 if args.quick else 900)
    for _ in range(runs):
        for name, cmd in commands.items():
            left = max(2.0, hard_stop - time.monotonic())  # a hung command is cut short
            seconds, rc = time_once(cmd, min(timeout, left))
            times[name].append(seconds)
            codes[name].append(rc)
        if time.monotonic() > deadline:
            break

    peer = "python -m torch.utils.collect_env (peer)"
    peer_median = statistics.median(times[peer])
    print(f"cold start, {len(times[peer])} rounds, device {args.device!r}, cpus {os.cpu_count()}")
    print(f"{'command':<46} {'median s':>9} {'min s':>7} {'max s':>7} {'vs peer':>8}  exit")
    results: list[dict[str, Any]] = []
    for name, values in times.items():
        med = statistics.median(values)
        ratio = med / peer_median
        print(
            f"{name:<46} {med:9.2f} {min(values):7.2f} {max(values):7.2f} {ratio:7.2f}x"
            f"  {sorted(set(codes[name]))}"
        )
        results.append(
            {
                "command": name,
                "argv": commands[name],
                "seconds": values,
                "median_s": med,
                "ratio_to_peer": ratio,
                "exit_codes": codes[name],
            }
        )
    failed = False
    floor = statistics.median(times[FLOOR_DEVICE])
    for row in results:
        if row["command"] == peer or row["command"] in FLOORS:
            continue
        # 0 = device usable, 1 = not usable (still a full report); anything else is a crash
        completed = all(rc in (0, 1) for rc in row["exit_codes"])
        ok = completed and row["median_s"] <= args.target
        failed |= not ok
        print(
            f"{'PASS' if ok else 'FAIL'}: {row['command']} median {row['median_s']:.2f} s "
            f"<= {args.target:.1f} s target (including import torch; "
            f"{row['median_s'] - floor:.2f} s above the device floor of {floor:.2f} s)"
            + ("" if completed else f"; it crashed (exit codes {row['exit_codes']})")
        )
    if args.json:
        payload = {
            "benchmark": "doctor_startup",
            "device": args.device,
            "target_s": args.target,
            "floor_s": floor,
            "rounds": len(times[peer]),
            "results": results,
            "pass": not failed,
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
