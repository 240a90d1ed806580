"""The load: ``wrk`` with a Lua script, or the built-in Python client when wrk is missing.

Both POST the same body over the same number of keep-alive connections for a fixed time and
report ``rps``, ``requests``, ``p50``/``p99`` (ms) and ``errors`` (non-2xx answers and socket
errors). Every loop is bounded: by its deadline, by :data:`CLIENT_MAX_REQUESTS`, and every
answer is awaited at most 10 s past the deadline (wrk's ``--timeout 10s``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import multiprocessing
import re
import subprocess
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: most responses one Python client process records per measurement (the time bound comes first)
CLIENT_MAX_REQUESTS = 2_000_000


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    found = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    if not found:
        return float("nan")
    return float(found.group(1)) * _UNITS[found.group(2)]


def run_wrk(
    wrk: str, url: str, lua: Path, *, seconds: float, connections: int, threads: int
) -> dict[str, Any]:
    cmd = [
        wrk,
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "--latency",
        "-s",
        str(lua),
        url,
    ]
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=seconds + 60, check=True
    ).stdout
    result: dict[str, Any] = {"raw": out}
    found = re.search(r"Requests/sec:\s+([\d.]+)", out)
    result["rps"] = float(found.group(1)) if found else 0.0
    found = re.search(r"(\d+) requests in", out)
    result["requests"] = int(found.group(1)) if found else 0
    for pct in ("50", "99"):
        found = re.search(rf"^\s+{pct}%\s+(\S+)", out, re.M)
        result[f"p{pct}"] = _ms(found.group(1)) if found else float("nan")
    errors = 0
    found = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    if found:
        errors += int(found.group(1))
    found = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if found:
        errors += sum(int(g) for g in found.groups())
    result["errors"] = errors
    return result


async def _keep_alive(
    host: str, port: int, request: bytes, deadline: float, latencies: list[float]
) -> tuple[int, int]:
    """One connection: request after request until ``deadline``; (answered, non-2xx/errors)."""
    answered = errors = 0
    perf = time.perf_counter
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while perf() < deadline and len(latencies) < CLIENT_MAX_REQUESTS:
            began = perf()
            writer.write(request)
            status = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            latencies.append(perf() - began)
            answered += 1
            if status[9:10] != b"2":
                errors += 1
    except (OSError, ValueError, asyncio.IncompleteReadError):
        errors += 1
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return answered, errors


def client_worker(
    url: str, body: bytes, seconds: float, connections: int
) -> tuple[int, int, float, list[float]]:
    """One client process: ``connections`` keep-alive connections POSTing ``body`` to ``url``
    for ``seconds``; (answered, errors, elapsed seconds, latencies in seconds)."""
    parsed = urllib.parse.urlsplit(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    request = (
        f"POST {parsed.path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    async def run() -> tuple[int, int, float, list[float]]:
        latencies: list[float] = []
        began = time.perf_counter()
        tasks = [
            asyncio.ensure_future(_keep_alive(host, port, request, began + seconds, latencies))
            for _ in range(connections)
        ]
        # every answer is awaited at most 10 s past the deadline, as wrk's --timeout 10s
        done, pending = await asyncio.wait(tasks, timeout=seconds + 10.0)
        for task in pending:
            task.cancel()
        elapsed = time.perf_counter() - began
        answered = errors = 0
        for task in done:
            if task.exception() is not None:
                errors += 1
                continue
            got, failed = task.result()
            answered += got
            errors += failed
        return answered, errors + len(pending), elapsed, latencies

    loop: asyncio.AbstractEventLoop
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


class PythonLoad:
    """The load generator used without ``wrk``: :func:`client_worker` in ``processes``
    processes (in this one when 1), the connections spread over them."""

    name = "python client"

    def __init__(self, body: bytes, connections: int, processes: int) -> None:
        self.body = body
        self.processes = max(1, min(processes, connections))
        self.connections = connections
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None
        if self.processes > 1:
            self.pool = concurrent.futures.ProcessPoolExecutor(
                self.processes, mp_context=multiprocessing.get_context("spawn")
            )

    def describe(self) -> str:
        return (
            f"the built-in Python client ({self.processes} process(es), {self.connections} "
            "keep-alive connections)"
        )

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def __call__(self, url: str, seconds: float) -> dict[str, Any]:
        if self.pool is None:
            parts = [client_worker(url, self.body, seconds, self.connections)]
        else:
            share, more = divmod(self.connections, self.processes)
            split = [share + (1 if i < more else 0) for i in range(self.processes)]
            futures = [self.pool.submit(client_worker, url, self.body, seconds, n) for n in split]
            parts = [f.result(timeout=seconds + 60) for f in futures]
        latencies = sorted(lat for part in parts for lat in part[3])
        answered = sum(part[0] for part in parts)

        def pct(q: float) -> float:
            if not latencies:
                return float("nan")
            return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3

        return {
            "rps": sum(part[0] / part[2] for part in parts if part[2] > 0),
            "requests": answered,
            "p50": pct(0.50),
            "p99": pct(0.99),
            "errors": sum(part[1] for part in parts),
        }


class WrkLoad:
    """``wrk`` with a Lua script that POSTs ``body``."""

    name = "wrk"

    def __init__(self, wrk: str, lua: Path, connections: int, threads: int) -> None:
        self.wrk, self.lua, self.connections, self.threads = wrk, lua, connections, threads

    def describe(self) -> str:
        return f"wrk ({self.connections} connections)"

    def close(self) -> None:
        pass

    def __call__(self, url: str, seconds: float) -> dict[str, Any]:
        return run_wrk(
            self.wrk,
            url,
            self.lua,
            seconds=seconds,
            connections=self.connections,
            threads=self.threads,
        )


Load = Callable[[str, float], dict[str, Any]]


def lua_script(body: bytes) -> str:
    """The wrk script that POSTs ``body`` as JSON. The body goes in a Lua long string whose
    brackets (``[==[ ... ]==]``) cannot occur in it: a JSON ``]]`` would end ``[[ ... ]]``."""
    text = body.decode()
    level = 1
    while f"]{'=' * level}]" in text:
        level += 1
    eq = "=" * level
    return (
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = [{eq}[{text}]{eq}]\n"
    )
