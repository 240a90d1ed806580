"""Server processes: start one in a session of its own, wait until it answers a real request
correctly, stop every process it started.

Readiness is a real inference request whose answer equals the in-process model's: some peers
(Triton) report ready before their model has loaded. Every process a server starts inherits a
marker variable naming this run, so the ones that leave the session (``setsid``) are still found
and stopped by pid. Listening sockets are read from ``/proc`` so that the benchmark can say
whether a server listens on loopback only.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARKER = "TORCHPLACE_BENCH_RUN"
#: seconds a server may answer with errors other than 503 before it counts as broken
FAIL_AFTER = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def flat_floats(doc: Any) -> list[float]:
    """The numbers of an answer: OIP ``outputs[0].data`` or a (nested) JSON list."""
    if isinstance(doc, dict):
        doc = doc["outputs"][0]["data"]
    out: list[float] = []
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            out.append(float(item))
    return out


def check_answer(url: str, body: bytes, want: list[float], timeout: float = 30) -> None:
    """POST ``body`` to ``url``; RuntimeError unless the answer's numbers equal ``want``."""
    req = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        got = flat_floats(json.loads(resp.read()))
    if len(got) != len(want) or any(
        abs(a - b) > 1e-4 + 1e-4 * abs(b) for a, b in zip(got, want, strict=True)
    ):
        raise RuntimeError(f"{url} answered {got[:4]}..., expected {want[:4]}...")


def _session_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[3])  # after ')': state, ppid, pgrp, session


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def members(leader: int, marker: str) -> list[int]:
    """Every live process of ``leader``'s session, or carrying this run's ``marker``."""
    tag = f"{MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        pid = int(entry.name)
        if _session_of(pid) == leader or _has_marker(pid, tag):
            found.append(pid)
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds that the processes ``pids`` have used, all their threads
    (one that has exited counts nothing)."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # after ')': utime, stime are 14, 15
    return ticks / os.sysconf("SC_CLK_TCK")


def listening(pids: list[int]) -> list[str]:
    """``host:port`` of every TCP socket in LISTEN state held by ``pids``."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                    continue
                addr, port = cols[1].split(":")
                found.append(f"{_address(addr, width)}:{int(port, 16)}")
    return sorted(set(found))


def _address(hex_addr: str, width: int) -> str:
    raw = bytes.fromhex(hex_addr)
    if width == 8:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0]
    return host.startswith("127.") or host in ("::1", "::ffff:127.0.0.1")


@dataclass
class Started:
    """A running server: its leader process, log, marker and what it listens on."""

    proc: subprocess.Popen[bytes]
    log: Any
    marker: str
    listens: list[str] = field(default_factory=list)

    def log_tail(self, chars: int = 3000) -> str:
        self.log.flush()
        self.log.seek(0)
        return str(self.log.read().decode(errors="replace")[-chars:])


def stop_group(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM to the process group ``proc`` leads, then SIGKILL to it after ``grace``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def stop(started: Started, grace: float = 15.0) -> None:
    """SIGTERM to the session's group, then SIGKILL to whatever of it is left, bounded."""
    proc = started.proc
    stop_group(proc, grace)
    for _ in range(50):  # workers that outlived their parent, or left its process group
        left = members(proc.pid, started.marker)
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    started.log.close()


def start(argv: list[str], *, env: dict[str, str] | None = None) -> Started:
    """Start ``argv`` in a session of its own, its output in a temporary file."""
    marker = uuid.uuid4().hex
    full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1", MARKER: marker}
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
    try:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )
    except OSError:
        log.close()
        raise
    return Started(proc, log, marker)


def wait_ready(started: Started, ready: Callable[[], None], timeout: float = 240.0) -> None:
    """Call ``ready()`` until it stops raising; RuntimeError with the log's end if the server
    exits or ``timeout`` passes first. Records what the server listens on."""
    proc = started.proc
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    failing_since: float | None = None  # when the server began answering with errors
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}:\n{started.log_tail()}")
        try:
            ready()
            break
        except urllib.error.HTTPError as exc:
            # 503 is "not yet"; any other error answer held for FAIL_AFTER is a broken server
            last = exc
            now = time.monotonic()
            failing_since = failing_since or now
            if exc.code != 503 and now - failing_since > FAIL_AFTER:
                detail = exc.read().decode(errors="replace")[:500]
                raise RuntimeError(
                    f"answers {exc.code} ({detail}) for {FAIL_AFTER:.0f} s:\n{started.log_tail()}"
                ) from None
        except (urllib.error.URLError, OSError, ValueError, RuntimeError, KeyError) as exc:
            last, failing_since = exc, None
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"no correct answer within {timeout:.0f} s (last: {last}):\n{started.log_tail()}"
            )
        time.sleep(0.5)
    started.listens = listening(members(proc.pid, started.marker))


@contextlib.contextmanager
def running(
    argv: list[str],
    ready: Callable[[], None],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 240.0,
) -> Iterator[Started]:
    """Run ``argv`` in a new session until ``ready()`` stops raising; stop it all on exit."""
    started = start(argv, env=env)
    try:
        wait_ready(started, ready, timeout)
        yield started
    finally:
        stop(started)
