#!/usr/bin/env python
"""Triton's own load tool, ``perf_analyzer``, against ``torchplace serve`` over HTTP and gRPC.

The tool evaluations in this field are done with. It reads the model's configuration (Triton's
model configuration extension), sends binary tensors (HTTP: the binary tensor extension; gRPC:
raw contents), sweeps concurrency, and reads the server-side statistics (the statistics
extension) into its table: queue, compute input, compute infer and compute output per request.

What it needs, installed here if missing (outside the repository):

* ``tritonclient==2.51.0`` in its own venv (``~/.cache/torchplace-bench/venvs/perf-analyzer``):
  its wheel bundles a ``perf_analyzer`` binary that runs on older glibc than the newer
  ``perf-analyzer`` wheel (glibc >= 2.38);
* the CUDA runtime library the binary links against, from the ``nvidia-cuda-runtime-cu12``
  wheel in the same venv (no GPU is needed or used);
* ``libb64.so.0d`` (Debian: ``apt-get install libb64-0d``; tried when missing and root).

Anything that cannot be installed or run is a SKIP line with the reason, and the script exits 0.

Run: ``python benchmarks/perf_analyzer.py [--model wide-mlp] [--concurrency 1,4,16,32]``.
It starts ``torchplace serve`` (a subprocess on free 127.0.0.1 ports), runs the sweep over HTTP
then gRPC (each step bounded: ``--interval-ms`` windows, at most ``--max-trials``), prints
perf_analyzer's tables, then one line per protocol with req/s at the highest concurrency and the
gRPC/REST ratio, and stops the server by its process group.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from peers.procs import free_port, stop_group  # benchmarks/ is this script's folder

VENV = Path.home() / ".cache" / "torchplace-bench" / "venvs" / "perf-analyzer"
PACKAGES = ("tritonclient[all]==2.51.0", "nvidia-cuda-runtime-cu12")


def skip(reason: str) -> int:
    print(f"SKIP perf_analyzer: {reason}")
    return 0


def _run(cmd: list[str], timeout: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )  # type: ignore[call-overload]


def ensure_venv() -> tuple[Path, dict[str, str]] | str:
    """The perf_analyzer binary and the environment it runs in, or why not."""
    python = VENV / "bin" / "python"
    binary = VENV / "bin" / "perf_analyzer"
    if not binary.exists():
        if not python.exists():
            made = _run([sys.executable, "-m", "venv", str(VENV)], 300)
            if made.returncode != 0:
                return f"cannot create {VENV}: {made.stderr.strip()[-300:]}"
        print(f"installing {' '.join(PACKAGES)} into {VENV} ...", flush=True)
        pip = _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *PACKAGES], 900)  # fmt: skip
        if pip.returncode != 0 or not binary.exists():
            return f"cannot install {' '.join(PACKAGES)}: {pip.stderr.strip()[-300:]}"
    libs = glob.glob(
        str(VENV / "lib" / "python3*" / "site-packages" / "nvidia" / "cuda_runtime" / "lib")
    )
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join([*libs, env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    missing = _missing_libraries(binary, env)
    if (
        missing
        and any("libb64" in m for m in missing)
        and shutil.which("apt-get")
        and os.geteuid() == 0
    ):
        print("installing libb64-0d with apt-get ...", flush=True)
        _run(["apt-get", "install", "-y", "-qq", "libb64-0d"], 300)
        missing = _missing_libraries(binary, env)
    if missing:
        return f"the binary lacks {', '.join(missing)} (Debian: apt-get install libb64-0d)"
    return binary, env


def _missing_libraries(binary: Path, env: dict[str, str]) -> list[str]:
    ldd = _run(["ldd", str(binary)], 30, env=env)
    return sorted({line.split()[0] for line in ldd.stdout.splitlines() if "not found" in line})


@contextlib.contextmanager
def torchplace_server(model: str, threads: int | None) -> Iterator[tuple[int, int, int]]:
    """``torchplace serve`` in its own process group; yields (HTTP port, gRPC port, pid)."""
    http, grpc = free_port(), free_port()
    cmd = [sys.executable, "-c", "import sys; from torchplace.cli import main; sys.exit(main())",
           "serve", "--model", model, "--device", "cpu", "--port", str(http),
           "--grpc-port", str(grpc), "--log-level", "warning"]  # fmt: skip
    if threads:
        cmd += ["--torch-threads", str(threads)]
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
    binary: Path,
    env: dict[str, str],
    model: str,
    protocol: str,
    url: str,
    concurrency: str,
    args: argparse.Namespace,
) -> tuple[str, dict[int, float]]:
    """perf_analyzer's output over one protocol, and req/s per concurrency."""
    cmd = [str(binary), "-m", model, "-u", url, "-i", protocol, "-b", "1",
           "--concurrency-range", concurrency, "-p", str(args.interval_ms),
           "--max-trials", str(args.max_trials),
           "--input-data", "zero", "--stability-percentage", str(args.stability)]  # fmt: skip
    print(f"$ {' '.join(cmd)}", flush=True)
    done = _run(cmd, args.timeout, env=env)
    output = done.stdout + (done.stderr if done.returncode else "")
    rates = {
        int(c): float(r)
        for c, r in re.findall(r"Concurrency: (\d+), throughput: ([\d.]+) infer/sec", output)
    }
    return output, rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="wide-mlp")
    parser.add_argument(
        "--concurrency-range", default="1:33:8", help="perf_analyzer's START:END:STEP"
    )
    parser.add_argument("--interval-ms", type=int, default=2000, help="measurement window")
    parser.add_argument("--max-trials", type=int, default=8, help="windows per step, at most")
    parser.add_argument(
        "--stability",
        type=int,
        default=100,
        help="perf_analyzer's --stability-percentage (a shared machine is noisy; its default 10)",
    )
    parser.add_argument("--timeout", type=float, default=300, help="seconds per protocol sweep")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per protocol")
    parser.add_argument("--torch-threads", type=int, default=None)
    args = parser.parse_args(argv)
    found = ensure_venv()
    if isinstance(found, str):
        return skip(found)
    binary, env = found
    version = _run([str(binary), "--version"], 30, env=env)
    if version.returncode not in (0, 1) or "error while loading" in version.stderr:
        return skip(f"the binary does not run: {version.stderr.strip()[-300:]}")
    tables: dict[str, dict[int, float]] = {}
    rounds: dict[str, list[float]] = {"http": [], "grpc": []}
    costs: dict[str, list[float]] = {"http": [], "grpc": []}  # server CPU us per request
    with torchplace_server(args.model, args.torch_threads) as (http, grpc, pid):
        urls = {"http": f"127.0.0.1:{http}", "grpc": f"127.0.0.1:{grpc}"}
        for protocol, url in urls.items():
            output, rates = sweep(
                binary, env, args.model, protocol, url, args.concurrency_range, args
            )
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
                _, rates = sweep(binary, env, args.model, protocol, url, f"{top}:{top}:1", args)
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
        f"{len(rounds['grpc'])} rounds: REST (binary tensors) {rest:,.0f} req/s "
        f"{[round(r) for r in rounds['http']]}, gRPC {grpc_rate:,.0f} req/s "
        f"{[round(r) for r in rounds['grpc']]}, gRPC/REST {grpc_rate / rest:.2f}x"
    )
    if costs["http"] and costs["grpc"]:
        rest_cpu, grpc_cpu = statistics.median(costs["http"]), statistics.median(costs["grpc"])
        print(
            f"server CPU per request (all threads, load and compute included; less sensitive to "
            f"other load than req/s): REST {rest_cpu:,.0f} us, gRPC {grpc_cpu:,.0f} us"
        )
    verdict = "PASS" if grpc_rate >= rest else "FAIL"
    print(f"{verdict} gRPC req/s >= REST req/s with binary tensors on {args.model}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
