#!/usr/bin/env python
"""Triton's own load tool, ``perf_analyzer``, against ``torchplace serve`` over HTTP and gRPC.

The tool evaluations in this field are done with. It reads the model's configuration (Triton's
model configuration extension), sends binary tensors (HTTP: the binary tensor extension; gRPC:
raw contents), sweeps concurrency, and reads the server-side statistics (the statistics
extension) into its table: queue, compute input, compute infer and compute output per request.

What it needs is installed outside the repository when missing (``peers.perf_client``:
``tritonclient==2.51.0``, whose wheel bundles the binary, the CUDA runtime wheel it links
against, ``libb64-0d``). Anything that cannot be installed or run is a SKIP line with the
reason, and the script exits 0.

Run: ``python benchmarks/perf_analyzer.py [--model wide-mlp] [--concurrency-range 1:33:8]``;
``--shared-memory system`` has perf_analyzer pass the tensors through system shared memory
(Triton's extension; the server then runs with ``--allow-client-shm``).
It starts ``torchplace serve`` (a subprocess on free 127.0.0.1 ports), runs the sweep over HTTP
then gRPC (each step bounded: ``--interval-ms`` windows, at most ``--max-trials``), prints
perf_analyzer's tables, then one line per protocol with req/s at the highest concurrency and the
gRPC/REST ratio, and stops the server by its process group.

``--quick`` (used by ``make bench ARGS=--quick``) keeps within about 20 s: it installs nothing
(without perf_analyzer already in its venv it is a SKIP line), sweeps concurrency 1 and 33 in
three windows of 500 ms each (no stability check), runs one alternating round, and prints the
gRPC >= REST target as an INFO line: rounds that short cannot resolve it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from peers import perf_client
from peers.procs import free_port, stop_group  # benchmarks/ is this script's folder

#: the settings a full run and a --quick run use where the command line gives none
FULL = {"concurrency_range": "1:33:8", "interval_ms": 2000, "max_trials": 8, "stability": 100,
        "timeout": 300, "rounds": 5}  # fmt: skip
QUICK = {"concurrency_range": "1:33:32", "interval_ms": 500, "max_trials": 3,
         "stability": perf_client.STABILITY_OFF, "timeout": 60, "rounds": 1}  # fmt: skip


def skip(reason: str) -> int:
    print(f"SKIP perf_analyzer: {reason}")
    return 0


@contextlib.contextmanager
def torchplace_server(
    model: str, threads: int | None, shared_memory: bool = False
) -> Iterator[tuple[int, int, int]]:
    """``torchplace serve`` in its own process group; yields (HTTP port, gRPC port, pid)."""
    http, grpc = free_port(), free_port()
    cmd = [sys.executable, "-c", "import sys; from torchplace.cli import main; sys.exit(main())",
           "serve", "--model", model, "--device", "cpu", "--port", str(http),
           "--grpc-port", str(grpc), "--log-level", "warning"]  # fmt: skip
    if threads:
        cmd += ["--torch-threads", str(threads)]
    if shared_memory:
        cmd += ["--allow-client-shm"]
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"torchplace serve exited with {proc.returncode}")
            ready = f"http://127.0.0.1:{http}/v2/health/ready"
            with contextlib.suppress(OSError), urllib.request.urlopen(ready, timeout=1):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError("torchplace serve was not ready within 120 s")
        yield http, grpc, proc.pid
    finally:
        stop_group(proc, grace=30)


def server_cost(pid: int, http: int, model: str) -> tuple[float, int]:
    """The server's CPU seconds so far and the requests it has answered (its statistics)."""
    ticks = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{model}/stats", timeout=5) as r:
        stats = json.loads(r.read())["model_stats"][0]["inference_stats"]
    return cpu, int(stats["success"]["count"])


def sweep(
    tool: perf_client.PerfAnalyzer,
    model: str,
    protocol: str,
    url: str,
    concurrency: str,
    args: argparse.Namespace,
) -> tuple[str, dict[int, float]]:
    """perf_analyzer's output over one protocol, and req/s per concurrency."""
    cmd = perf_client.command(
        model,
        url,
        protocol,
        concurrency,
        interval_ms=args.interval_ms,
        max_trials=args.max_trials,
        stability=args.stability,
        shared_memory=args.shared_memory,
    )
    print(f"$ perf_analyzer {' '.join(cmd)}", flush=True)
    done = tool.run(cmd, args.timeout)
    output = done.stdout + (done.stderr if done.returncode else "")
    return output, perf_client.rates(output)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="wide-mlp")

    def setting(flag: str, kind: type, text: str) -> None:
        key = flag[2:].replace("-", "_")
        parser.add_argument(
            flag,
            type=kind,
            default=None,
            help=f"{text} (default {FULL[key]}; --quick {QUICK[key]})",
        )

    setting("--concurrency-range", str, "perf_analyzer's START:END:STEP")
    setting("--interval-ms", int, "measurement window")
    setting("--max-trials", int, "windows per step, at most")
    setting(
        "--stability",
        int,
        "perf_analyzer's --stability-percentage (a shared machine is noisy; its default 10)",
    )
    setting("--timeout", float, "seconds per protocol sweep")
    setting("--rounds", int, "alternating rounds per protocol")
    parser.add_argument("--torch-threads", type=int, default=None)
    parser.add_argument(
        "--shared-memory",
        choices=("none", "system"),
        default="none",
        help="tensors through system shared memory (the server runs with --allow-client-shm)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short run (about 20 s): installs nothing, short sweeps, one round, the target "
        "an INFO line",
    )
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def judge(rest: float, grpc_rate: float, model: str, quick: bool) -> int:
    """The target's line: PASS/FAIL on a full run, INFO under --quick; the exit status."""
    text = f"gRPC req/s >= REST req/s with binary tensors on {model}"
    if quick:
        print(f"INFO {text}: {grpc_rate / rest:.2f}x (--quick rounds are too short to judge speed)")
        return 0
    verdict = "PASS" if grpc_rate >= rest else "FAIL"
    print(f"{verdict} {text}")
    return 0 if verdict == "PASS" else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tool = perf_client.ensure(install=not args.quick)
    if isinstance(tool, str):
        return skip(tool)
    tables: dict[str, dict[int, float]] = {}
    rounds: dict[str, list[float]] = {"http": [], "grpc": []}
    costs: dict[str, list[float]] = {"http": [], "grpc": []}  # server CPU us per request
    shm = args.shared_memory != "none"
    with torchplace_server(args.model, args.torch_threads, shm) as (http, grpc, pid):
        urls = {"http": f"127.0.0.1:{http}", "grpc": f"127.0.0.1:{grpc}"}
        for protocol, url in urls.items():
            output, rates = sweep(tool, args.model, protocol, url, args.concurrency_range, args)
            print(output, flush=True)
            if not rates:
                return skip(f"perf_analyzer over {protocol} gave no throughput (output above)")
            tables[protocol] = rates
        # the comparison: one concurrency, protocols alternated, medians (a shared machine's
        # load drifts between runs)
        top = max(set(tables["http"]) & set(tables["grpc"]))
        print(f"gRPC vs REST at concurrency {top}: {args.rounds} alternating rounds", flush=True)
        for _ in range(args.rounds):
            for protocol, url in urls.items():
                cpu0, done0 = server_cost(pid, http, args.model)
                _, rates = sweep(tool, args.model, protocol, url, f"{top}:{top}:1", args)
                cpu1, done1 = server_cost(pid, http, args.model)
                if top in rates:
                    rounds[protocol].append(rates[top])
                if done1 > done0:
                    costs[protocol].append((cpu1 - cpu0) / (done1 - done0) * 1e6)
    if not rounds["http"] or not rounds["grpc"]:
        return skip("no stable measurement in the alternating rounds")
    rest, grpc_rate = statistics.median(rounds["http"]), statistics.median(rounds["grpc"])
    print(
        f"{args.model} at concurrency {top}, median of {len(rounds['http'])}/"
        f"{len(rounds['grpc'])} rounds: REST ({'shared memory' if shm else 'binary tensors'}) "
        f"{rest:,.0f} req/s "
        f"{[round(r) for r in rounds['http']]}, gRPC {grpc_rate:,.0f} req/s "
        f"{[round(r) for r in rounds['grpc']]}, gRPC/REST {grpc_rate / rest:.2f}x"
    )
    if costs["http"] and costs["grpc"]:
        rest_cpu, grpc_cpu = statistics.median(costs["http"]), statistics.median(costs["grpc"])
        print(
            f"server CPU per request (all threads, load and compute included; less sensitive to "
            f"other load than req/s): REST {rest_cpu:,.0f} us, gRPC {grpc_cpu:,.0f} us"
        )
    if shm:
        return 0  # the target compares the wire forms; shared memory is shown, not judged
    return judge(rest, grpc_rate, args.model, args.quick)


if __name__ == "__main__":
    raise SystemExit(main())
