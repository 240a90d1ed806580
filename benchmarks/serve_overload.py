#!/usr/bin/env python
"""torchplace serve under overload: at twice its capacity it answers the excess at once with 503.

One run against the real server (``torchplace serve``, a subprocess on a free 127.0.0.1 port):

1. **capacity**: a closed loop of ``--connections`` keep-alive clients for ``--seconds`` (a
   client refused with 503 waits the queue-wait limit before its next request); its req/s of
   answered (200) requests is the capacity C;
2. **half load**: an open loop at 0.5 C (requests are sent on a fixed schedule, whatever the
   answers; latency counts from the scheduled time, so a slow answer cannot hide later ones);
3. **2x load**: an open loop at 2 C.

Prints each phase's req/s, the statuses seen and the p50/p99 of the answered (200) requests,
then one PASS/FAIL line per target and exits 1 if one is missed:

* at 2x, no status other than 200 and 503, and every 503 carries Retry-After;
* at 2x, the accepted requests' p99 <= 3x the p99 at half load.

The server runs with ``--max-queue-wait-ms`` (``--queue-wait-ms`` here, printed), the latency
target its admission control holds the queue to: accepted latency stays near it plus one batch.

``--soak SECONDS`` instead runs one long open loop at 0.8 C against a model that throws
out-of-memory errors (split and retried) and kernel failures (500) at random, samples the
server's resident memory every few seconds, and checks that every request got an answer
(nothing lost: no reset, no timeout) and that RSS stayed flat (the last quarter's median within
10% + 16 MiB of the median after warm-up).

Every loop is bounded in time and count; the server is stopped by its process group.

``--quick`` (used by ``make bench ARGS=--quick``) runs each phase for 2 s (``--seconds``), about
10 s in all: the statuses are still judged, and the latency target is an INFO line, since phases
that short cannot resolve a p99.

    python benchmarks/serve_overload.py                 # wide-mlp, 4 rows per request
    python benchmarks/serve_overload.py --soak 180      # three minutes with injected faults
    python benchmarks/serve_overload.py --quick         # 2 s phases, latency not judged
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
MAX_CONNECTIONS = 512  # the open loop opens more connections up to this, then counts misses
MAX_REQUESTS = 200_000  # per phase, whatever the rate
SECONDS = 8.0  # per phase
QUICK_SECONDS = 2.0  # per phase under --quick
Check = tuple[bool, str]  # (passed, what was checked)


# ---------------------------------------------------------------------- a model with faults
def flaky_model() -> Any:
    """wide-mlp that raises, at random, torch.OutOfMemoryError on batches of more than one row
    (the server splits and retries) and a RuntimeError as a CUDA kernel fault would (500)."""
    import torch

    from torchplace.models import build_model, embedded_model

    spec = embedded_model("wide-mlp")
    inner = build_model("wide-mlp")
    rate_oom = float(os.environ.get("SOAK_OOM_RATE", "0.02"))
    rate_kernel = float(os.environ.get("SOAK_KERNEL_RATE", "0.002"))

    class Flaky(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner
            self.rng = random.Random(11)
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            draw = self.rng.random() if self.calls > 8 else 0.5  # start-up runs clean
            if x.shape[0] > 1 and draw < rate_oom:
                raise torch.OutOfMemoryError("CUDA out of memory (injected)")
            if draw > 1.0 - rate_kernel:
                raise RuntimeError("CUDA error: device-side assert triggered (injected)")
            result: torch.Tensor = self.inner(x)
            return result

    model = Flaky()
    model.torchplace_inputs = spec.inputs  # type: ignore[assignment]
    model.torchplace_outputs = spec.outputs  # type: ignore[assignment]
    return model


# ---------------------------------------------------------------------- the server
def start_server(model: str, flags: list[str]) -> tuple[subprocess.Popen[str], int]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "benchmarks")]),
        PYTHONUNBUFFERED="1",
    )
    command = [sys.executable, "-m", "torchplace.cli", "serve", "--model", model,
               "--port", "0", "--drain-grace", "0", *flags]  # fmt: skip
    print("INFO server:", " ".join(command[3:]))
    proc = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stderr is not None
    end = time.monotonic() + 120
    while time.monotonic() < end:
        line = proc.stderr.readline()
        if not line:
            break
        found = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if found:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(found.group(1))
    stop_server(proc)
    raise SystemExit("FAIL the server did not start")


def stop_server(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------------- the client
def request_bytes(model: str, rows: int, port: int) -> bytes:
    from torchplace.models import embedded_model

    width = embedded_model(model).inputs[0].shape[1]
    body = orjson.dumps(
        {
            "inputs": [
                {"name": "input", "datatype": "FP32", "shape": [rows, width],
                 "data": [0.25] * (rows * width)}
            ]
        }
    )  # fmt: skip
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class Phase:
    name: str
    seconds: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)  # of the 200s
    missing_retry_after: int = 0
    unsent: int = 0  # the open loop had no connection left (client saturated)

    @property
    def answered(self) -> int:
        return sum(n for s, n in self.statuses.items() if s.isdigit())

    def p(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def line(self) -> str:
        rate = self.answered / self.seconds if self.seconds else 0.0
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        return (
            f"{self.name:>10}: {rate:8.1f} answers/s  200 p50 {self.p(0.5) * 1e3:7.2f} ms  "
            f"p99 {self.p(0.99) * 1e3:7.2f} ms  [{statuses}]"
            + (f"  unsent {self.unsent}" if self.unsent else "")
        )


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def exchange(self, payload: bytes) -> tuple[str, bool, bool]:
        """Send one request; (status, has Retry-After, connection still usable)."""
        self.writer.write(payload)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = head[9:12].decode()
        lower = head.lower()
        found = re.search(rb"content-length: *(\d+)", lower)
        await self.reader.readexactly(int(found.group(1)) if found else 0)
        return status, b"retry-after:" in lower, b"connection: close" not in lower


async def _connect(port: int) -> Connection:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return Connection(reader, writer)


async def _one(
    port: int, payload: bytes, pool: list[Connection], phase: Phase, since: float
) -> str:
    """One request on a pooled connection (or a new one); its status, as counted in ``phase``."""
    conn = None
    while pool and conn is None:
        conn = pool.pop()
        if conn.reader.at_eof():  # closed by the server while idle (keep-alive timeout)
            conn.writer.close()
            conn = None
    try:
        if conn is None:
            conn = await _connect(port)
        status, retry_after, reusable = await asyncio.wait_for(conn.exchange(payload), 30)
    except ConnectionRefusedError:
        phase.statuses["refused"] += 1
        return "refused"
    except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
        phase.statuses[type(exc).__name__] += 1
        if conn is not None:
            conn.writer.close()
        return type(exc).__name__
    phase.statuses[status] += 1
    if status == "200":
        phase.latencies.append(time.perf_counter() - since)
    elif status == "503" and not retry_after:
        phase.missing_retry_after += 1
    if reusable:
        pool.append(conn)
    else:
        conn.writer.close()
    return status


async def closed_loop(
    port: int, payload: bytes, connections: int, seconds: float, backoff: float
) -> Phase:
    """``connections`` clients, each sending its next request when the last is answered; a
    client refused with 503 waits ``backoff`` seconds first, as a client that honours the
    refusal does (retrying at once would turn the capacity run into a storm of refusals that
    takes the CPU the batches need)."""
    phase = Phase("capacity")
    pool: list[Connection] = []
    end = time.perf_counter() + seconds

    async def worker() -> None:
        for _ in range(MAX_REQUESTS):
            if time.perf_counter() >= end:
                return
            if await _one(port, payload, pool, phase, time.perf_counter()) == "503":
                await asyncio.sleep(backoff)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(connections)))
    phase.seconds = time.perf_counter() - began
    for conn in pool:
        conn.writer.close()
    return phase


async def open_loop(
    name: str, port: int, payload: bytes, rate: float, seconds: float, sample: Any = None
) -> Phase:
    """Requests at ``rate`` per second on a fixed schedule for ``seconds``."""
    phase = Phase(name)
    pool: list[Connection] = []
    tasks: set[asyncio.Task[None]] = set()
    total = min(MAX_REQUESTS, int(rate * seconds))
    began = time.perf_counter()
    for i in range(total):
        due = began + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if sample is not None:
            sample()
        if len(tasks) >= MAX_CONNECTIONS:
            phase.unsent += 1
            continue
        task = asyncio.ensure_future(_one(port, payload, pool, phase, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=60)
    phase.seconds = time.perf_counter() - began
    for conn in pool:
        conn.writer.close()
    return phase


# ---------------------------------------------------------------------- the runs
def overload(args: argparse.Namespace) -> int:
    flags = ["--device", args.device, "--max-queue-wait-ms", str(args.queue_wait_ms),
             "--torch-threads", str(args.torch_threads)]  # fmt: skip
    proc, port = start_server(args.model, flags)
    try:
        payload = request_bytes(args.model, args.rows, port)
        backoff = args.queue_wait_ms / 1000
        capacity = asyncio.run(closed_loop(port, payload, args.connections, args.seconds, backoff))
        if not capacity.statuses["200"]:
            return report([(False, f"the capacity run got no answer: {capacity.line()}")])
        rate = capacity.statuses["200"] / capacity.seconds
        print(f"INFO model {args.model}, {args.rows} rows per request; capacity {rate:.1f} req/s")
        print("INFO", capacity.line())
        half = asyncio.run(open_loop("half load", port, payload, rate / 2, args.seconds))
        print("INFO", half.line())
        double = asyncio.run(open_loop("2x load", port, payload, rate * 2, args.seconds))
        print("INFO", double.line())
    finally:
        stop_server(proc)
    if double.unsent:
        print(f"INFO the client could not send {double.unsent} requests (connections full)")
    return report(*overload_checks(half, double, args.quick))


def overload_checks(half: Phase, double: Phase, quick: bool) -> tuple[list[Check], list[str]]:
    """The targets as (passed, text), and those printed as information only: the latency
    target under --quick, whose phases are too short to resolve a p99."""
    other = {s: n for s, n in double.statuses.items() if s not in ("200", "503")}
    checks = [
        (not other and not double.missing_retry_after,
         f"at 2x only 200 and 503 (+Retry-After): others {other}, "
         f"503 without Retry-After {double.missing_retry_after}"),
        (double.statuses["503"] > 0, f"at 2x the excess is refused: {double.statuses['503']} x 503"),
        (double.p(0.99) <= 3 * half.p(0.99),
         f"accepted p99 at 2x {double.p(0.99) * 1e3:.2f} ms <= 3x p99 at half load "
         f"({3 * half.p(0.99) * 1e3:.2f} ms): {double.p(0.99) / half.p(0.99):.2f}x"),
    ]  # fmt: skip
    if not quick:
        return checks, []
    latency = checks.pop()
    return checks, [f"{latency[1]} (--quick phases are too short to judge latency)"]


def soak(args: argparse.Namespace) -> int:
    flags = ["--device", args.device, "--max-queue-wait-ms", str(args.queue_wait_ms),
             "--torch-threads", str(args.torch_threads)]  # fmt: skip
    flags += ["--name", "flaky_model"]
    proc, port = start_server("serve_overload:flaky_model", flags)
    samples: list[tuple[float, int]] = []
    try:
        payload = request_bytes("wide-mlp", args.rows, port).replace(
            b"/v2/models/wide-mlp/", b"/v2/models/flaky_model/"
        )
        backoff = args.queue_wait_ms / 1000
        probe = asyncio.run(
            closed_loop(port, payload, args.connections, min(args.seconds, 5), backoff)
        )
        if not probe.statuses["200"]:
            return report([(False, f"the capacity probe got no answer: {probe.line()}")])
        rate = 0.8 * probe.statuses["200"] / probe.seconds
        print(f"INFO soak: {args.soak:.0f} s at {rate:.1f} req/s (0.8 of the measured capacity)")
        began = time.perf_counter()
        last = [0.0]

        def sample() -> None:
            now = time.perf_counter()
            if now - last[0] >= 2.0:
                last[0] = now
                samples.append((now - began, rss_bytes(proc.pid)))

        phase = asyncio.run(open_loop("soak", port, payload, rate, args.soak, sample))
        print("INFO", phase.line())
        metrics = _errors_by_class(port)
    finally:
        stop_server(proc)
    print("INFO errors by class:", metrics)
    lost = {s: n for s, n in phase.statuses.items() if s not in ("200", "500", "503")}
    warm = [rss for t, rss in samples if t >= args.soak * 0.25]
    first = statistics.median(warm[: max(1, len(warm) // 3)]) if warm else 0
    final = statistics.median(warm[-max(1, len(warm) // 3) :]) if warm else 0
    print(f"INFO RSS after warm-up {first / 2**20:.1f} MiB, at the end {final / 2**20:.1f} MiB")
    checks = [
        (phase.statuses["200"] > 0 and not lost and not phase.unsent,
         f"nothing lost: every request answered 200, 500 (injected kernel fault) or 503; "
         f"others {lost}, unsent {phase.unsent}"),
        (metrics.get("oom_splits", 0) > 0 and metrics.get("kernel", 0) > 0,
         f"faults were injected: {metrics.get('oom_splits', 0):.0f} OOM splits, "
         f"{metrics.get('kernel', 0):.0f} kernel failures"),
        (final <= first * 1.10 + 16 * 2**20,
         f"RSS flat: {first / 2**20:.1f} -> {final / 2**20:.1f} MiB"),
    ]  # fmt: skip
    return report(checks)


def _errors_by_class(port: int) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for match in re.finditer(r'torchplace_errors_total\{[^}]*class="(\w+)"[^}]*\} (\S+)', text):
        found[match.group(1)] = found.get(match.group(1), 0.0) + float(match.group(2))
    for match in re.finditer(r"torchplace_oom_splits_total\{[^}]*\} (\S+)", text):
        found["oom_splits"] = found.get("oom_splits", 0.0) + float(match.group(1))
    return {k: v for k, v in found.items() if v}


def report(checks: list[Check], infos: list[str] | None = None) -> int:
    """One PASS/FAIL line per check, then one INFO line per target not judged; the exit
    status (1 when a check failed)."""
    for ok, text in checks:
        print(("PASS " if ok else "FAIL ") + text)
    for text in infos or []:
        print("INFO " + text)
    return 0 if all(ok for ok, _ in checks) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="wide-mlp", help="embedded model (default wide-mlp)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, default=4, help="rows per request (default 4)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help=f"per phase (default {SECONDS:g}; --quick {QUICK_SECONDS:g})",
    )
    parser.add_argument("--connections", type=int, default=32, help="closed loop (default 32)")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument(
        "--queue-wait-ms", type=float, default=20.0, help="the server's --max-queue-wait-ms"
    )
    parser.add_argument(
        "--soak", type=float, metavar="SECONDS", help="run the soak instead (e.g. 180)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_SECONDS:g} s phases (about 10 s in all); the latency target an INFO line",
    )
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = QUICK_SECONDS if args.quick else SECONDS
    if args.seconds <= 0:
        parser.error(f"--seconds {args.seconds:g}: give a phase length above 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.soak:
        return soak(args)
    return overload(args)


if __name__ == "__main__":
    sys.exit(main())
