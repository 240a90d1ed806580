"""Fixtures for the HTTP side of serve: a fake engine and servers on free loopback ports."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest
import torch

from torchplace.errors import NotReadyError, ServeError
from torchplace.models import TensorSpec, embedded_model
from torchplace.serve.config import ServeConfig
from torchplace.serve.running import ServerThread

INFER = b"/v2/models/seed-mlp/infer"
#: the body limit of :func:`hostile_server`
LIMIT = 64 * 1024


async def eventually(condition: Callable[[], object], tries: int = 100) -> None:
    """Wait (up to ``tries`` times 10 ms) until ``condition()`` holds; the caller asserts."""
    for _ in range(tries):
        if condition():
            return
        await asyncio.sleep(0.01)


def raw_request(
    body: bytes,
    *,
    path: bytes = INFER,
    method: bytes = b"POST",
    headers: dict[bytes, bytes] | None = None,
) -> bytes:
    """An HTTP/1.1 request, byte for byte, with ``Connection: close`` and (unless chunked) the
    body's ``Content-Length``; ``headers`` add to the defaults or replace them."""
    hdrs = {b"Host": b"localhost", b"Content-Type": b"application/json", b"Connection": b"close"}
    hdrs.update(headers or {})
    if b"Transfer-Encoding" not in hdrs:
        hdrs.setdefault(b"Content-Length", str(len(body)).encode())
    head = b"".join(b"%s: %s\r\n" % kv for kv in hdrs.items())
    return b"%s %s HTTP/1.1\r\n%s\r\n%s" % (method, path, head, body)


def exchange(port: int, payload: bytes) -> bytes:
    """Send ``payload`` on a fresh loopback connection; everything read back within 10 s."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # the server may answer and close before reading everything
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(payload)
        chunks = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def answer_of(port: int, payload: bytes) -> tuple[int, bytes]:
    """The status and body of the one answer to ``payload`` (a fresh connection)."""
    reply = exchange(port, payload)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), reply[:200]
    return int(head[9:12]), body


@dataclass
class FakeEngine:
    """Stands in for torchplace.serve.engine.Engine: runs an embedded model in the loop."""

    model_name: str = "seed-mlp"
    version: str = "1"
    max_batch_size: int = 32
    max_request_rows: int = 4096
    platform: str = "pytorch"
    dtype: str | None = None
    delay_s: float = 0.0
    fail_with: ServeError | None = None
    ready: bool = True
    calls: int = 0
    observed: list[tuple[int, float]] = field(default_factory=list)
    started: bool = False
    stopped: bool = False
    drained: bool = False
    in_flight: int = 0
    loop_shared: bool = False
    options: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        spec = embedded_model(self.model_name)
        self.name = self.model_name
        self.inputs: tuple[TensorSpec, ...] = spec.inputs
        self.outputs: tuple[TensorSpec, ...] = spec.outputs
        self.labels: dict[str, tuple[str, ...]] = {}
        self.module = spec.build()

    async def start(self) -> None:
        self.started = True

    def is_ready(self) -> bool:
        return self.started and self.ready and not self.drained

    def is_live(self) -> bool:
        return True

    async def infer(
        self, inputs: dict[str, np.ndarray], *, stamps: Any = None, **options: Any
    ) -> dict[str, np.ndarray]:
        self.calls += 1
        self.options.append(options)
        if not self.is_ready():
            raise NotReadyError("model is not ready")
        if self.fail_with is not None:
            raise self.fail_with
        self.in_flight += 1
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            x = torch.from_numpy(inputs[self.inputs[0].name])
            with torch.inference_mode():
                y = self.module(x).numpy()
            return {self.outputs[0].name: y}
        finally:
            self.in_flight -= 1

    def submit(
        self,
        inputs: dict[str, np.ndarray],
        *,
        caller: Any = None,
        rows: Any = None,
        stamps: Any = None,
        **options: Any,
    ) -> Any:
        """:meth:`infer` as a task, shaped like the engine's ``Submitted``."""
        return SimpleNamespace(
            future=asyncio.ensure_future(self.infer(inputs, **options)), device=""
        )

    async def drain(self, timeout: float, reason: str | None = None) -> None:
        self.drained = True

    async def stop(self) -> None:
        self.stopped = True

    def share_loop(self, shared: bool) -> None:
        self.loop_shared = shared

    def metrics_text(self) -> bytes:
        return b"# TYPE torchplace_fake_requests counter\ntorchplace_fake_requests 1\n"

    def observe_request(self, status: int, seconds: float, device: str | None = None) -> None:
        self.observed.append((status, seconds))

    def reference(self, x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.module(torch.from_numpy(x)).numpy()


def test_config(**overrides: Any) -> ServeConfig:
    base: dict[str, Any] = {
        "port": 0,
        "request_timeout_s": 5.0,
        "drain_timeout_s": 5.0,
        "drain_grace_s": 0.0,
    }
    base.update(overrides)
    return ServeConfig(**base)


# Not a test: pytest would collect a module-level name starting with test_.
test_config.__test__ = False  # type: ignore[attr-defined]


def seed_input(**override: Any) -> dict[str, Any]:
    """One valid ``seed-mlp`` input entry (one row of 0.5s), with fields overridden."""
    entry: dict[str, Any] = {
        "name": "input",
        "datatype": "FP32",
        "shape": [1, 8],
        "data": [0.5] * 8,
    }
    entry.update(override)
    return entry


def seed_body(x: np.ndarray, **extra: Any) -> bytes:
    """A JSON inference request carrying ``x`` as the ``seed-mlp`` input."""
    entry = seed_input(shape=list(x.shape), data=x.ravel().tolist())
    return orjson.dumps({"inputs": [entry], **extra})


class Client:
    """Raw HTTP against a running server (one keep-alive connection per call)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    def get(self, path: str, **kw: Any) -> tuple[int, dict[str, str], bytes]:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: bytes, **kw: Any) -> tuple[int, dict[str, str], bytes]:
        return self.request("POST", path, body=body, **kw)


@dataclass
class Running:
    thread: ServerThread
    engine: Any
    client: Client

    @property
    def port(self) -> int:
        return self.thread.port

    @property
    def url(self) -> str:
        return self.thread.url


StartServer = Callable[..., Running]


@pytest.fixture
def start_server() -> Iterator[StartServer]:
    """Start servers (fake engine unless one is given); all are stopped at teardown."""
    started: list[ServerThread] = []

    def start(engine: Any = None, **config: Any) -> Running:
        engine = engine if engine is not None else FakeEngine()
        thread = ServerThread(test_config(**config), engine=engine).start(timeout=60)
        started.append(thread)
        return Running(thread, engine, Client("127.0.0.1", thread.port))

    yield start
    for thread in started:
        thread.stop()


@pytest.fixture
def server(start_server: StartServer) -> Running:
    """One server with the fake seed-mlp engine."""
    return start_server()


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[ServerThread]:
    """A real server (CPU) with a small body limit (:data:`LIMIT`), one per test module."""
    thread = ServerThread(test_config(max_body_bytes=LIMIT, device="cpu")).start(timeout=120)
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture
def still_serving(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used :func:`hostile_server`, a normal inference is still answered
    (a module takes it with ``pytestmark = pytest.mark.usefixtures("still_serving")``)."""
    yield
    if "hostile_server" in request.fixturenames:
        port = request.getfixturevalue("hostile_server").port
        body = orjson.dumps({"inputs": [seed_input()]})
        status, answer = answer_of(port, raw_request(body))
        assert status == 200, answer
