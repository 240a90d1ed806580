"""SIGTERM under load loses nothing: every request ends in 200, 503 or connection refused.

The real server runs as a subprocess (``torchplace serve``), so the signal, the listener and
the kernel's accept queue are the real ones. Clients are bounded in count and time.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from torchplace.serve.listener import accept_queue_length, refuse_new_connections

from .conftest import seed_body

_ROOT = Path(__file__).resolve().parents[2]
_BODY = seed_body(np.ones((1, 8), np.float32))
_CLIENTS = 8
_MAX_PER_CLIENT = 3000  # every loop is bounded in count and in time
_TIME_LIMIT_S = 40.0


def _start_server(*flags: str) -> tuple[subprocess.Popen[str], int, threading.Thread]:
    env = dict(os.environ, PYTHONPATH=str(_ROOT / "src"), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchplace.cli", "serve", "--device", "cpu", "--port", "0",
         "--torch-threads", "1", *flags],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )  # fmt: skip
    assert proc.stderr is not None
    end = time.monotonic() + 90
    while time.monotonic() < end:
        line = proc.stderr.readline()
        if not line:
            break
        found = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if found:
            reader = threading.Thread(target=proc.stderr.read, daemon=True)  # keep it drained
            reader.start()
            return proc, int(found.group(1)), reader
    proc.kill()
    proc.wait()
    proc.stderr.close()
    raise AssertionError("the server did not start")


def _outcome(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    return type(exc).__name__  # a reset, a closed connection, a timeout: all losses


def _client(port: int, keep_alive: bool, stop: threading.Event, seen: Counter[str]) -> None:
    conn: http.client.HTTPConnection | None = None
    end = time.monotonic() + _TIME_LIMIT_S
    for _ in range(_MAX_PER_CLIENT):
        if stop.is_set() or time.monotonic() > end:
            break
        if conn is None or not keep_alive:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
        try:
            conn.request("POST", "/v2/models/seed-mlp/infer", body=_BODY)
            response = conn.getresponse()
            response.read()
            outcome = str(response.status)
            if response.getheader("connection", "").lower() == "close" or not keep_alive:
                conn.close()
                conn = None
        except OSError as exc:
            outcome = _outcome(exc)
            conn.close()
            conn = None
        seen[outcome] += 1
        if outcome == "refused":
            time.sleep(0.01)


@pytest.mark.parametrize("keep_alive", [False, True], ids=["new-connection", "keep-alive"])
def test_sigterm_under_load_resets_nothing(keep_alive: bool) -> None:
    proc, port, reader = _start_server("--drain-grace", "1", "--drain-timeout", "10")
    stop = threading.Event()
    counters = [Counter[str]() for _ in range(_CLIENTS)]
    threads = [
        threading.Thread(target=_client, args=(port, keep_alive, stop, seen), daemon=True)
        for seen in counters
    ]
    try:
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(0.2)
        probe = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        probe.request("GET", "/v2/health/ready")
        assert probe.getresponse().status == 503  # readiness false at once, still answering
        probe.close()
        assert proc.wait(timeout=30) == 0
        time.sleep(0.5)  # the clients meet the closed port
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=10)
        assert proc.stderr is not None
        proc.stderr.close()
    seen = sum(counters, Counter[str]())
    print(keep_alive, dict(seen))
    assert set(seen) <= {"200", "503", "refused"}, seen
    assert seen["200"] > 0, seen  # served before and during the drain
    assert seen["503"] > 0, seen  # refused cleanly during the grace
    assert seen["refused"] > 0, seen  # and refused by the closed port after


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the SYN filter is Linux's")
def test_the_filter_refuses_new_connections_and_keeps_queued_ones() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        queued = socket.create_connection(("127.0.0.1", port))
        queued.sendall(b"ping")
        assert accept_queue_length(listener) == 1
        assert refuse_new_connections(listener)
        with pytest.raises(TimeoutError):
            socket.create_connection(("127.0.0.1", port), timeout=0.3)  # SYN dropped
        accepted, _ = listener.accept()
        assert accepted.recv(4) == b"ping"  # the queued one was kept, not reset
        accepted.sendall(b"pong")
        assert queued.recv(4) == b"pong"
        assert accept_queue_length(listener) == 0
        accepted.close()
        queued.close()
