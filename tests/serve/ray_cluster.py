"""A local multi-node Ray cluster on loopback for the Ray tests (started once per module).

Every node gets 127.0.0.1 as its address, Ray's temp dir is a fresh temporary folder, and the
auth mode and token are the same on every node (RAY_AUTH_MODE, the token in that folder).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

LOOPBACK = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def ray_environment(tmp: Path, **extra: str) -> Iterator[dict[str, str]]:
    """The environment every node and driver of a test cluster shares (restored after),
    with ``extra`` variables."""
    token_file = tmp / "auth_token"
    token_file.write_text(secrets.token_hex(16))
    env = {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        # Ray's temp dir (sessions, sockets, logs, the address file) under ``tmp``
        "RAY_TMPDIR": str(tmp),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_file),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_metrics_report_interval_ms": "1000",
        "RAY_SERVE_LOG_TO_STDERR": "0",
        # the head's GCS may take longer than Ray's 30 s to bind on a busy two-core machine
        "RAY_gcs_server_port_wait_time_s": "90",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
        ),
        "TORCHPLACE_TEST_RAY_TMP": str(tmp),
        **extra,
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def node_started(start: Callable[[], T], attempts: int = 2) -> T:
    """``start()`` (a Ray node started in this process), tried again when Ray gives up on it:
    a node's raylet has a fixed 30 s to register with the GCS, which a busy two-core machine
    now and then misses ("The current node timed out during startup"). Any other error, or
    the last attempt's, is raised."""
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except Exception as exc:
            if attempt == attempts or "timed out during startup" not in str(exc):
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, every: float = 0.5) -> T:
    """Call ``probe`` until it returns a truthy value (bounded in time)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            found = probe()
        except Exception as exc:
            last = exc
        else:
            if found:
                return found
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout} s (last error: {last!r})")


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def replicas(handle: Any, want: int, tries: int = 120) -> dict[tuple[str, int], dict[str, Any]]:
    """The replicas met through the handle (by node and pid), bounded in calls."""
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    for _ in range(tries):
        record = handle.describe.remote().result(timeout_s=30)
        seen[(record["node_id"], record["pid"])] = record
        if len(seen) >= want:
            break
    return seen
