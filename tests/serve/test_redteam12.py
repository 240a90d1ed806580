"""A twelfth red-team pass, at the pressure features: drain, deadlines, priorities,
cancellation, overload, requests split into chunks, under hostile clients.

Tried this round and found to behave as designed (not repeated here): a client that goes away
while the first chunk of a 4,000-row request runs (the other chunks are withdrawn, counted once
as ``cancelled``, never computed) and a deadline that passes between chunks (the chunks still
queued are dropped, counted once as ``deadline``, never computed); ``priority`` and ``timeout``
given as strings, floats, ``1.0``, booleans, ``null``, lists, objects, negative numbers and
past 64 (63) bits over REST (400 naming the value; 0 and any level up to 2**64 - 1 are taken);
``Inference-Timeout-Us`` of ``-1``, ``1.5``, ``1e3``, empty and padded; 200 requests of four
clients each with a 1 µs deadline (every one 200 or 504, and ``/metrics``' requests per status,
its ``deadline`` errors and the Triton statistics' success and fail counts all add up to what
was sent); ``Retry-After`` on every 503 (overload, queue full, draining, timed out: the
admission limit keeps the queued work under ``--max-queue-wait-ms``, so one second is never
short of it by more than a batch); SIGTERM twice and SIGINT then SIGTERM (the drain goes on,
exit 0); keep-alive connections that never send past the drain (closed after the grace); a
reload under load with SIGTERM right after it (every request 200, 503 or refused); a client
that sent ``Connection: close`` and then closed its socket while queued is still computed, as
documented (its FIN cannot be told from a half-close).

What is pinned here:

- ``CONNECT host:443`` (a client that takes the server for a proxy) was answered 404 and the
  connection kept open, its tunnel's bytes read as the next request: it is 501 and closes;
- an answer compressed for ``Accept-Encoding`` did not say ``Vary: Accept-Encoding``: a cache
  between client and server could hand it to a client that cannot read gzip;
- on SIGTERM a ``ModelStreamInfer`` stream its client still held open ended with OK once the
  requests read from it were answered: requests the client sent meanwhile got no answer and no
  error, and ``tritonclient.grpc``'s stream callback was never told the stream had ended. It now
  ends ``UNAVAILABLE`` (OK still when the client had half-closed it);
- a batch that ran out of memory while one of its requests' client went away was retried in
  halves that computed that request's rows too (the model's call log showed them): a half
  whose every request has gone is now not run, and no one is told an out-of-memory error;
- a split request whose deadline passed after its first chunk ran was told "it was not run":
  the 504 now says how many of its chunks were not;
- a 4,000-row request whose client goes away mid-split, and a second SIGTERM: outcomes pinned
  end to end (the model's call log, ``/metrics`` and the statistics; exit 0).
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
import torch
from torch import nn

from torchplace.serve.admission import DeadlineExceededError
from torchplace.serve.engine import Engine
from torchplace.serve.running import ServerThread

from .conftest import Client, StartServer, exchange, raw_request, seed_body, test_config
from .engine_helpers import loaded
from .test_admission import (
    CPU,
    INFER,
    Gate,
    _errors,
    _gated_engine,
    _hold_over_http,
    _Shared,
    _stream_request,
)
from .test_drain import _start_server

_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


def test_connect_is_501_and_what_follows_it_is_not_read_as_a_request(
    start_server: StartServer,
) -> None:
    running = start_server()
    live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    tunnel = b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"
    reply = exchange(running.port, live + tunnel + live)  # returns once the server closes
    first, _, rest = reply.partition(b"HTTP/1.1 501 ")
    assert first.startswith(b"HTTP/1.1 200 ")  # the request before it is answered first
    head, _, body = rest.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    assert b"not a proxy" in body
    assert b"HTTP/1.1" not in body  # nothing after it was answered


@pytest.mark.parametrize(("accepted", "coding"), [("gzip", "gzip"), ("identity", None)])
def test_an_answer_accept_encoding_chose_says_vary(
    start_server: StartServer, accepted: str, coding: str | None
) -> None:
    running = start_server()
    body = seed_body(np.full((1, 8), 0.5, np.float32))
    path = "/v2/models/seed-mlp/infer"
    status, headers, _ = running.client.post(path, body, headers={"Accept-Encoding": accepted})
    assert status == 200
    assert headers.get("content-encoding") == coding
    assert headers.get("vary") == "accept-encoding"


@pytest.fixture
def gated() -> Iterator[tuple[ServerThread, Engine, Gate]]:
    gate = Gate()
    engine = Engine(loaded(gate), [CPU], max_batch_size=1, max_delay_ms=0.0)
    thread = ServerThread(test_config(device="cpu", drain_timeout_s=20.0), engine=engine)
    thread.start(timeout=60)
    gate.seen.clear()
    try:
        yield thread, engine, gate
    finally:
        gate.open.set()
        thread.stop()


@pytest.mark.parametrize("half_closed", [False, True], ids=["held-open", "half-closed"])
def test_a_drained_stream_ends_unavailable_unless_its_client_had_half_closed_it(
    gated: tuple[ServerThread, Engine, Gate], half_closed: bool
) -> None:
    grpc = pytest.importorskip("grpc")
    from torchplace.serve.proto import grpc_service_pb2 as pb

    thread, engine, gate = gated
    holder = _hold_over_http(thread, gate)
    more = threading.Event()

    def requests() -> Iterator[bytes]:
        yield _stream_request(2.0, "queued")
        if not half_closed:
            more.wait(30)  # the client keeps its side open, as a streaming client does

    with grpc.insecure_channel(f"127.0.0.1:{thread.grpc_port}") as channel:
        answers = channel.stream_stream(_STREAM)(requests(), timeout=30)
        end = time.monotonic() + 10
        while not engine.queue_depth():
            assert time.monotonic() < end, "the stream's request never reached the queue"
            time.sleep(0.01)
        stopper = threading.Thread(target=thread.stop)
        stopper.start()  # the drain starts with the stream's request queued
        while thread.app is None or not thread.app.server.draining:
            time.sleep(0.01)
        gate.open.set()
        first = pb.ModelStreamInferResponse.FromString(next(answers))
        assert (first.error_message, first.infer_response.id) == ("", "queued")
        if half_closed:
            assert list(answers) == []  # an OK end: the client said it sends no more
        else:
            with pytest.raises(grpc.RpcError) as ended:
                next(answers)
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in ended.value.details()
        more.set()
        stopper.join(30)
    holder.join(10)
    assert gate.seen == [1.0, 2.0]


def test_tritonclient_s_stream_callback_is_told_the_drain_ended_its_stream() -> None:
    """tritonclient.grpc's stream thread calls back only on an answer or an RpcError: an OK
    end left its callback waiting, and async_stream_infer still took requests."""
    tritongrpc = pytest.importorskip("tritonclient.grpc")
    thread = ServerThread(test_config(device="cpu")).start(timeout=120)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = tritongrpc.InferenceServerClient(f"127.0.0.1:{thread.grpc_port}")
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        request = tritongrpc.InferInput("input", [1, 8], "FP32")
        request.set_data_from_numpy(np.full((1, 8), 0.5, np.float32))
        client.async_stream_infer("seed-mlp", [request], request_id="before")
        result, error = results.get(timeout=30)
        assert error is None
        assert result.get_response().id == "before"
        thread.stop()
        result, error = results.get(timeout=30)  # not left waiting
        assert result is None
        assert "shutting down" in str(error)
    finally:
        client.stop_stream()
        client.close()
        thread.stop()


def test_a_client_gone_mid_split_leaves_every_count_true() -> None:
    """A 4,000-row request in chunks of 1,000: its client goes away while the first chunk
    runs; the other three are never computed, and each count says so once."""
    gate = Gate()
    engine = Engine(loaded(gate), [CPU], max_batch_size=1000, max_delay_ms=0.0)
    thread = ServerThread(test_config(device="cpu"), engine=engine).start(timeout=60)
    gate.seen.clear()
    x = np.arange(4000, dtype=np.float32)[:, None].repeat(4, axis=1)
    entry = {"name": "input", "datatype": "FP32", "shape": [4000, 4], "data": x.ravel().tolist()}
    body = orjson.dumps({"inputs": [entry]})
    client = Client("127.0.0.1", thread.port)
    try:
        gate.open.clear()
        gate.entered.clear()
        with socket.create_connection(("127.0.0.1", thread.port)) as sock:
            keep = {b"Connection": b"keep-alive"}  # a FIN after "close" may be a half-close
            sock.sendall(raw_request(body, path=INFER.encode(), headers=keep))
            assert gate.entered.wait(20)
            assert engine.queue_depth() == 3  # chunks 2 to 4 wait
        end = time.monotonic() + 10
        while not _errors(engine, "cancelled"):
            assert time.monotonic() < end, "the disconnect was not noticed"
            time.sleep(0.01)
        assert engine.queue_depth() == 0
        gate.open.set()
        status, _, answer = client.post(INFER, body)
        assert status == 200
        got = orjson.loads(answer)["outputs"][0]["data"]
        np.testing.assert_array_equal(np.asarray(got, np.float32), (x * 2).ravel())
        assert gate.seen == [0.0, 0.0, 1000.0, 2000.0, 3000.0]  # the gone client's chunk 1 only
        metrics = client.get("/metrics")[2].decode()
        assert 'status="200",version="1"} 1.0' in metrics
        assert 'status="503",version="1"} 1.0' in metrics  # the gone client, counted once
        assert _errors(engine, "cancelled") == 1
        stats = orjson.loads(client.get("/v2/models/test-model/stats")[2])["model_stats"][0]
        counts = stats["inference_stats"]
        assert (counts["success"]["count"], counts["fail"]["count"]) == (1, 1)
        assert stats["inference_count"] == 4000
    finally:
        gate.open.set()
        thread.stop()


def test_a_deadline_between_chunks_says_how_much_of_the_request_was_not_run() -> None:
    """Its first chunk ran; the 504 said "it was not run" of the whole request."""

    async def main() -> None:
        engine, gate = await _gated_engine()
        gate.open.clear()
        gate.entered.clear()
        rows = {"input": np.arange(12, dtype=np.float32).reshape(3, 4)}  # 3 chunks of 1 row
        split = asyncio.ensure_future(engine.infer(rows, timeout_s=0.05))
        while not gate.entered.is_set():
            await asyncio.sleep(0.005)
        with pytest.raises(DeadlineExceededError, match="2 of its 3 chunks were not run"):
            await split
        gate.open.set()
        await engine.drain(10.0)
        assert gate.seen == [0.0]  # the first chunk only
        assert _errors(engine, "deadline") == 1
        await engine.stop()

    asyncio.run(main())


class _Oom(nn.Module):
    """y = 2x; a forward of more than 2 rows waits for ``go``, then raises torch's
    OutOfMemoryError; every forward that runs logs (rows, first value). The replica's deep
    copy shares the events and the log."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((4,), 2.0))
        self.go = _Shared(threading.Event())
        self.go.set()
        self.entered = _Shared(threading.Event())
        self.seen: list[tuple[int, float]] = _Shared([])
        self.oom = _Shared([False])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.oom[0] and x.shape[0] > 2:
            self.entered.set()
            self.go.wait(20)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        self.seen.append((x.shape[0], float(x[0, 0])))
        return x * self.weight


def test_after_an_oom_the_halves_of_a_client_that_went_away_are_not_run() -> None:
    """A batch of two requests runs out of memory while the first one's client goes away:
    the retried halves ran its rows too; now only the other request's rows are computed."""

    async def main() -> None:
        model = _Oom()
        engine = Engine(loaded(model), [CPU], max_batch_size=8, max_delay_ms=50.0)
        await engine.start()
        model.seen.clear()
        model.oom[0] = True
        model.go.clear()
        gone = engine.submit({"input": np.full((4, 4), 1.0, np.float32)})
        kept = engine.submit({"input": np.full((4, 4), 2.0, np.float32)})
        while not model.entered.is_set():  # both run as one batch of 8 rows, out of memory
            await asyncio.sleep(0.005)
        gone.future.cancel()
        model.go.set()
        result = await kept.future
        np.testing.assert_array_equal(result["output"], np.full((4, 4), 4.0, np.float32))
        assert model.seen == [(2, 2.0), (2, 2.0)]  # the kept request's rows only
        errors = engine.metrics.device("cpu").errors
        assert errors["oom"].value == 0  # nobody was answered an out-of-memory error
        stats = engine.statistics.snapshot("m", "1")["inference_stats"]
        assert (stats["success"]["count"], stats["fail"]["count"]) == (1, 1)
        await engine.stop()

    asyncio.run(main())


def test_a_second_signal_during_the_drain_changes_nothing() -> None:
    """SIGINT, then SIGTERM while draining, with a keep-alive connection that never sends:
    the drain goes on, the idle connection is closed, and the process exits 0."""
    proc, port, reader = _start_server("--drain-grace", "0.5", "--drain-timeout", "10")
    idle = socket.create_connection(("127.0.0.1", port), timeout=20)
    try:
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert idle.recv(100) == b""  # closed, not reset, not left open
    finally:
        idle.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=10)
        assert proc.stderr is not None
        proc.stderr.close()
