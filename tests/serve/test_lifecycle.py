"""Lifecycle under load: SIGTERM drain of a real `torchplace serve` process, and a bounded load
test across two CPU replicas with every answer checked against the model run in-process."""

from __future__ import annotations

import asyncio
import http.client
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import numpy as np
import orjson
import pytest
import torch

from torchplace.models import build_model
from torchplace.serve.running import ServerThread

from .conftest import seed_body, test_config

INFER = "/v2/models/seed-mlp/infer"


def _reference(x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return build_model("seed-mlp")(torch.from_numpy(x)).numpy()


def _start_process(*flags: str) -> tuple[subprocess.Popen[str], int, list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchplace.cli", "serve", "--port", "0", *flags],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    lines: list[str] = []
    port = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r"serving \S+ version \S+ on http://127\.0\.0\.1:(\d+)", line)
        if found:
            port = int(found.group(1))
            break
    if not port:
        proc.kill()
        proc.wait(10)
        pytest.fail("server did not start:\n" + "".join(lines))

    def pump() -> None:  # keep reading so the pipe never fills
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)

    pumping = threading.Thread(target=pump, daemon=True)
    pumping.start()
    _PUMPS[proc.pid] = pumping
    return proc, port, lines


_PUMPS: dict[int, threading.Thread] = {}


def _reap(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    pump = _PUMPS.pop(proc.pid, None)
    if pump is not None:
        pump.join(10)
    if proc.stderr is not None:
        proc.stderr.close()


def test_sigterm_mid_load_loses_nothing() -> None:
    proc, port, lines = _start_process("--drain-timeout", "10", "--max-delay-ms", "5")
    outcomes: Counter[str] = Counter()
    wrong: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    x = np.linspace(-2, 2, 24, dtype=np.float32).reshape(3, 8)
    want = _reference(x)
    body = seed_body(x)

    def client() -> None:
        opened: list[http.client.HTTPConnection] = []
        try:
            run(opened)
        finally:
            for conn in opened:
                conn.close()

    def run(opened: list[http.client.HTTPConnection]) -> None:
        conn: http.client.HTTPConnection | None = None
        while not stop.is_set():
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                opened.append(conn)
                try:
                    conn.connect()
                except ConnectionRefusedError:
                    with lock:
                        outcomes["refused before sending"] += 1
                    conn.close()
                    return
            try:
                conn.request("POST", INFER, body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                with lock:
                    outcomes["lost"] += 1
                    wrong.append(repr(exc))
                conn.close()
                return
            with lock:
                if resp.status == 200:
                    got = np.array(orjson.loads(data)["outputs"][0]["data"], np.float32)
                    if np.allclose(got.reshape(3, 2), want, rtol=1e-5, atol=1e-6):
                        outcomes["200"] += 1
                    else:
                        outcomes["wrong"] += 1
                elif resp.status == 503:
                    outcomes["503"] += 1
                else:
                    outcomes[str(resp.status)] += 1
            if resp.will_close:
                conn.close()
                conn = None
                if resp.status == 503:  # a polite client honours Retry-After
                    time.sleep(float(resp.getheader("Retry-After", "1")))

    threads = [threading.Thread(target=client) for _ in range(8)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.0)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(20)
        took = time.monotonic() - began
    finally:
        stop.set()
        for t in threads:
            t.join(20)
        _reap(proc)
    assert rc == 0, "".join(lines)
    assert took < 10, took
    assert outcomes["lost"] == 0, (outcomes, wrong[:5])
    assert outcomes["wrong"] == 0
    assert outcomes["200"] > 0
    assert set(outcomes) <= {"200", "503", "refused before sending"}, outcomes
    assert any("draining" in line for line in lines)
    print(f"SIGTERM mid-load: {dict(outcomes)}; exit 0 {took:.2f} s after the signal")


async def _load(
    port: int, inputs: list[np.ndarray], total: int, connections: int
) -> tuple[list[int], list[bytes]]:
    statuses: list[int] = [0] * total
    bodies: list[bytes] = [b""] * total
    counter = iter(range(total))
    requests = [
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (INFER.encode(), len(b), b)
        for b in (seed_body(x) for x in inputs)
    ]

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i in counter:
                writer.write(requests[i % len(requests)])
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                length = int(re.search(rb"content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
                statuses[i] = status
                bodies[i] = await reader.readexactly(length)
        finally:
            writer.close()

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(connections))), 120)
    return statuses, bodies


@pytest.mark.slow
def test_load_10k_requests_64_connections_two_cpu_replicas() -> None:
    rng = np.random.default_rng(3)
    inputs = [
        rng.standard_normal((int(rng.integers(1, 5)), 8)).astype(np.float32) for _ in range(97)
    ]
    wanted = [_reference(x) for x in inputs]
    config = test_config(device="cpu", replicas_per_device=2, max_queue=4096)
    with ServerThread(config) as server:
        engine: Any = server.app.engine if server.app else None
        assert engine is not None
        assert len(engine.replicas) == 2
        statuses, bodies = asyncio.run(_load(server.port, inputs, 10_000, 64))
        served = [lane.rows_served for lane in engine.pool.lanes]
    assert Counter(statuses) == {200: 10_000}
    exact = 0
    for i, body in enumerate(bodies):
        x_index = i % len(inputs)
        got = np.array(orjson.loads(body)["outputs"][0]["data"], np.float32)
        got = got.reshape(wanted[x_index].shape)
        np.testing.assert_allclose(got, wanted[x_index], rtol=1e-5, atol=1e-6)
        exact += bool(np.array_equal(got, wanted[x_index]))
    assert len(served) == 2
    assert all(rows > 0 for rows in served), served  # both replicas took work
    print(f"10,000 answers checked; {exact} bit-identical to the unbatched in-process result")
