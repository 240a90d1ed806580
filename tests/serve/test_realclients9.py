"""Round nine: real clients used the way their own docs and examples use them, plus very slow
readers of large answers and requests caught by a model unload or reload part-way.

Clients: ``tritonclient.http`` and ``tritonclient.grpc`` (sync and ``aio``, ``async_infer``
with callbacks, ``start_stream``/``async_stream_infer``, ``client_timeout``, compression,
headers, model control, statistics, system shared memory), ``requests`` and ``aiohttp``.

Tried this round and found to behave as designed (not repeated here): every client call of
Triton's examples (compression both ways, headers, priorities, timeouts, classification,
shared-memory inputs and outputs at offsets, ``load_model`` with an inline config, ``unload_model``
with ``unload_dependents``, statistics per version; ``load_model`` with ``files`` is refused with
a 400 naming the fix, as docs/serve.md says); the trace and log settings extensions, which the
server does not list in its metadata, answer 404/``UNIMPLEMENTED``; a reload while requests
queue on the old version (each finishes there, a cancelled gRPC call, a client gone and a
deadline passed are dropped from the old queue, the unload waits for no dropped request).

What is pinned here:

- a slow reader (a relay that passes the server's bytes on a few at a time) of a large answer,
  over HTTP and gRPC: others are served meanwhile, the slow one gets its whole answer or, with a
  client timeout, a clear ``DEADLINE_EXCEEDED``, and the server holds nothing for it afterwards;
- an HTTP client that stops reading with less than the high-water mark of its answer unsent is
  dropped after ``--request-timeout`` without progress once the connection is closed (idle, or
  ``Connection: close``); it was kept forever;
- requests still queued on a version when an unload's or reload's ``--drain-timeout`` passes
  are told that their version went, not that the server is shutting down (it was not);
- ``load_model(config=...)`` with one batching field (Triton's ``dynamic_batching`` delay, or
  ``max_batch_size``) keeps the file's other one instead of the server's default.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.serve.running import ServerThread

from .conftest import test_config

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

SLOW = 'source = "tests.serve.addsub_model:build_slow"\n[batching]\nmax_batch_size = 1\n'
ONES = np.ones((1, 16), np.int32)
TWOS = np.full((1, 16), 2, np.int32)


def _addsub_inputs(module: Any) -> list[Any]:
    """Triton's ``simple`` inputs (ones and twos) for ``module`` (tritonclient.http/grpc)."""
    inputs = []
    for name, value in (("INPUT0", ONES), ("INPUT1", TWOS)):
        entry = module.InferInput(name, [1, 16], "INT32")
        entry.set_data_from_numpy(value)
        inputs.append(entry)
    return inputs


class SlowRelay:
    """A TCP relay to ``127.0.0.1:target`` whose answers reach the client ``rate`` bytes per
    ``tick`` s: it reads the server's side no faster, through a small receive buffer, so the
    server sees a client that reads slowly. Requests pass at once."""

    def __init__(self, target: int, rate: int, tick: float = 0.05) -> None:
        self.target, self.rate, self.tick = target, rate, tick
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.relayed = 0
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue
            upstream = socket.socket()
            upstream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
            upstream.connect(("127.0.0.1", self.target))
            for args in ((client, upstream, 65536, 0.0), (upstream, client, self.rate, self.tick)):
                thread = threading.Thread(target=self._pipe, args=args, daemon=True)
                thread.start()
                self.threads.append(thread)

    def _pipe(self, src: socket.socket, dst: socket.socket, size: int, pause: float) -> None:
        src.settimeout(0.2)
        try:
            while not self.stop.is_set():
                try:
                    data = src.recv(size)
                except TimeoutError:
                    continue
                if not data:
                    break
                dst.sendall(data)
                if pause:
                    self.relayed += len(data)
                    time.sleep(pause)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                sock.close()

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        for thread in self.threads:
            thread.join(5)


# -- very slow readers of large answers ------------------------------------------------------
ROWS = 1000
X = np.linspace(-1.0, 1.0, ROWS * 8, dtype=np.float32).reshape(ROWS, 8)


@pytest.fixture(scope="module")
def seed_server() -> Iterator[ServerThread]:
    config = test_config(device="cpu", request_timeout_s=2.0, keepalive_timeout_s=2.0)
    with ServerThread(config) as thread:
        yield thread


def _reference(server: ServerThread) -> np.ndarray:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    try:
        entry = httpclient.InferInput("input", list(X.shape), "FP32")
        entry.set_data_from_numpy(X)
        out: np.ndarray = client.infer("seed-mlp", [entry]).as_numpy("output")
        return out
    finally:
        client.close()


def _others_served_while(busy: threading.Thread, server: ServerThread, limit_s: float) -> int:
    """One-row inferences by another client while ``busy`` runs (each answered at once)."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    one = grpcclient.InferInput("input", [1, 8], "FP32")
    one.set_data_from_numpy(X[:1])
    served, ends = 0, time.monotonic() + limit_s
    try:
        while busy.is_alive() and time.monotonic() < ends:
            client.infer("seed-mlp", [one], client_timeout=2.0)  # fails the test if slowed
            served += 1
            time.sleep(0.2)
    finally:
        client.close()
    return served


def _run(target: Any) -> tuple[threading.Thread, queue.Queue[Any]]:
    answers: queue.Queue[Any] = queue.Queue()

    def go() -> None:
        try:
            answers.put(target())
        except InferenceServerException as exc:
            answers.put(exc)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, answers


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_slow_reader_of_a_large_answer_gets_all_of_it_while_others_are_served(
    seed_server: ServerThread, protocol: str
) -> None:
    """1,000 rows answered through a relay passing ~2.5 KB/s (JSON over HTTP: ~24 KB; gRPC's
    raw contents: 8 KB), past the server's request and keep-alive timeouts (2 s): the answer
    arrives whole and equal to a fast client's, and another client is served meanwhile."""
    want = _reference(seed_server)
    port = seed_server.port if protocol == "http" else seed_server.grpc_port
    assert port is not None
    relay = SlowRelay(port, rate=128 if protocol == "http" else 64)
    try:
        if protocol == "http":
            client: Any = httpclient.InferenceServerClient(
                f"127.0.0.1:{relay.port}", network_timeout=60.0
            )
            entry = httpclient.InferInput("input", list(X.shape), "FP32")
            entry.set_data_from_numpy(X, binary_data=False)
            output = [httpclient.InferRequestedOutput("output", binary_data=False)]
        else:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{relay.port}")
            entry = grpcclient.InferInput("input", list(X.shape), "FP32")
            entry.set_data_from_numpy(X)
            output = [grpcclient.InferRequestedOutput("output")]
        busy, answers = _run(lambda: client.infer("seed-mlp", [entry], outputs=output))
        served = _others_served_while(busy, seed_server, limit_s=40.0)
        busy.join(40)
        got = answers.get(timeout=1)
        client.close()
    finally:
        relay.close()
    assert not isinstance(got, Exception), got
    np.testing.assert_allclose(got.as_numpy("output"), want, rtol=1e-6, atol=1e-6)
    assert relay.relayed > 4000  # it was slow: several seconds at this rate
    assert served >= 5


def test_a_slow_grpc_reader_with_a_client_timeout_gets_deadline_exceeded(
    seed_server: ServerThread,
) -> None:
    """A client deadline shorter than the slow read: the client is told DEADLINE_EXCEEDED at
    its deadline, and others are served meanwhile."""
    assert seed_server.grpc_port is not None
    relay = SlowRelay(seed_server.grpc_port, rate=16)
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{relay.port}")
        entry = grpcclient.InferInput("input", list(X.shape), "FP32")
        entry.set_data_from_numpy(X)
        started = time.monotonic()
        busy, answers = _run(lambda: client.infer("seed-mlp", [entry], client_timeout=2.0))
        assert _others_served_while(busy, seed_server, limit_s=10.0) >= 2
        busy.join(10)
        got = answers.get(timeout=1)
        took = time.monotonic() - started
        client.close()
    finally:
        relay.close()
    assert isinstance(got, InferenceServerException)
    assert got.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert took < 5.0


@pytest.mark.parametrize("close", [False, True])
def test_a_reader_that_stops_under_the_high_water_mark_is_dropped_not_kept_forever(
    seed_server: ServerThread, close: bool
) -> None:
    """A client that stops reading while less than the transport's high-water mark of its
    answer is still unsent (the kernel's buffers full): the server closes the connection when
    it goes idle (or at once, after ``Connection: close``), and ``close()`` would wait for the
    client to read the rest. It was kept that way forever, a file descriptor and the unsent
    answer each; it is dropped after ``--request-timeout`` without progress, as a client that
    stops reading above the mark is."""
    assert seed_server.app is not None
    http = seed_server.app.server
    body = orjson.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(X.shape),
                     "data": X.ravel().tolist()}]}
    )  # fmt: skip
    head = b"POST /v2/models/seed-mlp/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n"
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect(("127.0.0.1", seed_server.port))
    try:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        mine = [c for c in list(http.connections) if c._transport is not None and
                c._transport.get_extra_info("peername") == sock.getsockname()]  # fmt: skip
        assert len(mine) == 1
        conn = mine[0]
        # a small send buffer: most of the ~24 KB answer stays in the transport's buffer
        conn._transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, 4096
        )
        extra = b"Connection: close\r\n" if close else b""
        sock.sendall(head % len(body) + extra + b"\r\n" + body)
        deadline = time.monotonic() + 5
        while conn._transport is not None and time.monotonic() < deadline:
            if conn._transport.is_closing() and conn._transport.get_write_buffer_size():
                break
            time.sleep(0.05)
        assert conn._transport is not None
        assert conn._transport.get_write_buffer_size() > 0
        deadline = time.monotonic() + 10  # keep-alive 2 s, then 2 s without progress
        while conn in http.connections and time.monotonic() < deadline:
            time.sleep(0.1)
        assert conn not in http.connections
    finally:
        sock.close()


# -- requests caught by an unload or a reload --------------------------------------------------
@pytest.fixture
def slow_repository(tmp_path: Path) -> Iterator[ServerThread]:
    """Triton's ``simple`` model taking a second a request, one request a batch, in explicit
    model control with a short ``--drain-timeout``."""
    (tmp_path / "slow" / "1").mkdir(parents=True)
    (tmp_path / "slow" / "config.toml").write_text(SLOW)
    config = test_config(
        device="cpu",
        model_repository=tmp_path,
        model_control_mode="explicit",
        load_models=("*",),
        drain_timeout_s=1.0,
        request_timeout_s=30.0,
    )
    with ServerThread(config) as thread:
        yield thread


@pytest.mark.parametrize("action", ["unload", "reload"])
def test_requests_queued_past_the_drain_timeout_are_told_their_version_went(
    slow_repository: ServerThread, action: str
) -> None:
    """Four requests (three gRPC async_infer, one HTTP) on a version that takes a second each;
    an unload (or a reload) while they queue drains for one second: each request is either
    answered by the old version or told 503/UNAVAILABLE that its version was unloaded or
    replaced before it ran (send it again), never that the server is shutting down; none is
    lost, and afterwards the server serves (the new version on a reload)."""
    server = slow_repository
    assert server.grpc_port is not None
    assert server.app is not None
    grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    try:
        for k in range(3):
            grpc_client.async_infer(
                "slow",
                _addsub_inputs(grpcclient),
                callback=lambda result, error: answers.put((result, error)),
                request_id=f"g{k}",
            )

        def over_http() -> None:
            client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
            try:
                answers.put((client.infer("slow", _addsub_inputs(httpclient)), None))
            except InferenceServerException as exc:
                answers.put((None, exc))
            finally:
                client.close()

        threading.Thread(target=over_http, daemon=True).start()
        handle = server.app.registry.get("slow")
        deadline = time.monotonic() + 10
        while handle.active < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handle.active == 4
        if action == "unload":
            grpc_client.unload_model("slow")
        else:
            grpc_client.load_model("slow", config='{"max_batch_size": 2}')
        got = [answers.get(timeout=30) for _ in range(4)]
        refused = [error for _, error in got if error is not None]
        assert 1 <= len(refused) <= 3, got
        for result, error in got:
            if error is None:
                assert (result.as_numpy("OUTPUT0") == 3).all()
                continue
            message = error.message()
            assert error.status() in ("StatusCode.UNAVAILABLE", "503"), message
            assert (
                "version '1' of model 'slow' was unloaded or replaced before this request ran"
                in message
            )
            assert "--drain-timeout 1 s" in message
            assert "shutting down" not in message
        if action == "reload":
            result = grpc_client.infer("slow", _addsub_inputs(grpcclient), client_timeout=10)
            assert (result.as_numpy("OUTPUT1") == -1).all()
        else:
            assert not grpc_client.is_model_ready("slow")
    finally:
        grpc_client.close()


# -- model control as tritonclient's docs call it ----------------------------------------------
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_inline_config_of_one_batching_field_keeps_the_file_s_other(
    tmp_path: Path, protocol: str
) -> None:
    """``load_model(name, config=...)`` with Triton's ``dynamic_batching`` delay alone, then
    ``max_batch_size`` alone: each is laid over the file's ``[batching]`` table (batches of 8,
    1 ms), as docs/serve.md says inline values are; the field not sent keeps the file's value
    (the whole table was replaced, and the other field fell back to the server's default)."""
    from .repository_helpers import write_model

    write_model(tmp_path, "a")  # [batching] max_batch_size = 8, max_delay_ms = 1.0
    config = test_config(
        device="cpu", model_repository=tmp_path, model_control_mode="explicit", load_models=("*",)
    )
    with ServerThread(config) as server:
        if protocol == "http":
            client: Any = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")

            def doc() -> dict[str, Any]:
                got: dict[str, Any] = client.get_model_config("a")
                return got
        else:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")

            def doc() -> dict[str, Any]:
                got: dict[str, Any] = client.get_model_config("a", as_json=True)["config"]
                return got

        try:
            client.load_model(
                "a", config='{"dynamic_batching": {"max_queue_delay_microseconds": 500}}'
            )
            got = doc()
            assert int(got["max_batch_size"]) == 8
            assert int(got["dynamic_batching"]["max_queue_delay_microseconds"]) == 500
            client.load_model("a", config='{"max_batch_size": 4}')
            got = doc()
            assert int(got["max_batch_size"]) == 4
            assert int(got["dynamic_batching"]["max_queue_delay_microseconds"]) == 1000
        finally:
            client.close()
