"""Deadlines, priorities, cancellation, overload and requests larger than a batch.

Dropped work is shown never computed by the model's own call log (``Gate.seen``: the first
value of every batch it ran). No timing is asserted: a gate holds the one replica busy while
the queue is examined.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from torchplace.errors import ConfigError, OverloadedError
from torchplace.serve.admission import DeadlineExceededError, QueuePolicy, WaitEstimate
from torchplace.serve.engine import Engine
from torchplace.serve.running import ServerThread

from .conftest import Client, seed_body, test_config
from .engine_helpers import Faulty, loaded

CPU = torch.device("cpu")
INFER = "/v2/models/test-model/infer"


class Gate(nn.Module):
    """y = 2x; every forward logs its first value and waits until the gate is open. The
    replica's deep copy shares the gate and the log with the original."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((4,), 2.0))
        self.open = _Shared(threading.Event())
        self.open.set()
        self.entered = _Shared(threading.Event())
        self.seen: list[float] = _Shared([])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(float(x[0, 0]))
        self.entered.set()
        self.open.wait(20)
        return x * self.weight


def _Shared(value: Any) -> Any:
    """``value`` made immune to deepcopy (the copy is the object itself)."""

    class Shared(type(value)):  # type: ignore[misc]
        def __deepcopy__(self, memo: dict[int, Any]) -> Any:
            return self

    if isinstance(value, list):
        return Shared(value)
    shared = Shared()
    return shared


def _row(value: float, rows: int = 1) -> dict[str, np.ndarray]:
    return {"input": np.full((rows, 4), value, np.float32)}


def _errors(engine: Engine, cls: str) -> int:
    return engine.metrics.device("cpu").errors[cls].value


async def _gated_engine(**kwargs: Any) -> tuple[Engine, Gate]:
    gate = Gate()
    engine = Engine(loaded(gate), [CPU], max_batch_size=1, max_delay_ms=0.0, **kwargs)
    await engine.start()
    gate.seen.clear()
    return engine, gate


async def _hold(engine: Engine, gate: Gate) -> asyncio.Task[Any]:
    """Close the gate and occupy the one replica with a request of value 1."""
    gate.open.clear()
    gate.entered.clear()
    held = asyncio.ensure_future(engine.infer(_row(1.0)))
    while not gate.entered.is_set():
        await asyncio.sleep(0.005)
    return held


def test_a_queued_request_past_its_deadline_is_dropped_never_computed() -> None:
    async def main() -> None:
        engine, gate = await _gated_engine()
        held = await _hold(engine, gate)
        with pytest.raises(DeadlineExceededError, match="deadline passed while it was queued"):
            await engine.infer(_row(2.0), timeout_s=0.05)
        assert len(engine._batcher or ()) == 0  # removed from the queue at once
        gate.open.set()
        np.testing.assert_array_equal((await held)["output"], np.full((1, 4), 2.0, np.float32))
        assert gate.seen == [1.0]  # the expired request never reached the model
        assert _errors(engine, "deadline") == 1
        assert DeadlineExceededError.status == 504
        # Triton's failure reason (nv_inference_request_failure's label) of a deadline drop
        assert engine.statistics.failures() == {
            "REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0
        }  # fmt: skip
        await engine.stop()

    asyncio.run(main())


def test_the_server_default_deadline_applies_when_a_request_gives_none() -> None:
    async def main() -> None:
        engine, gate = await _gated_engine(queue=QueuePolicy(default_timeout_s=0.05))
        held = await _hold(engine, gate)
        with pytest.raises(DeadlineExceededError):
            await engine.infer(_row(2.0))
        gate.open.set()
        await held
        result = await engine.infer(_row(3.0))  # a free replica: well within its deadline
        np.testing.assert_array_equal(result["output"], np.full((1, 4), 6.0, np.float32))
        assert gate.seen == [1.0, 3.0]
        await engine.stop()

    asyncio.run(main())


def test_queued_work_of_a_client_that_went_away_is_removed_and_counted() -> None:
    async def main() -> None:
        engine, gate = await _gated_engine()
        held = await _hold(engine, gate)
        gone = asyncio.ensure_future(engine.infer(_row(2.0, rows=3)))  # 3 chunks of 1 row
        await asyncio.sleep(0.02)
        assert len(engine._batcher or ()) == 3
        gone.cancel()  # what the HTTP server does when the connection closes
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert len(engine._batcher or ()) == 0
        gate.open.set()
        await held
        assert gate.seen == [1.0]  # never computed
        assert _errors(engine, "cancelled") == 1
        assert engine.statistics.failures()["CANCELED"] == 1
        assert engine.statistics.failures()["REJECTED"] == 0
        await engine.stop()

    asyncio.run(main())


def test_higher_priority_runs_first_and_each_level_has_its_own_limit() -> None:
    async def main() -> None:
        policy = QueuePolicy(priority_levels=2, queue_limits=(1, 1))
        engine, gate = await _gated_engine(queue=policy)
        held = await _hold(engine, gate)
        low = asyncio.ensure_future(engine.infer(_row(2.0)))  # default: the lowest level
        await asyncio.sleep(0.02)
        high = asyncio.ensure_future(engine.infer(_row(3.0), priority=1))
        await asyncio.sleep(0.02)
        with pytest.raises(OverloadedError, match="at priority 2"):
            await engine.infer(_row(4.0), priority=2)
        with pytest.raises(OverloadedError, match="at priority 1"):
            await engine.infer(_row(5.0), priority=1)
        # a priority past the levels is the default level, as in Triton: full too
        with pytest.raises(OverloadedError, match="at priority 2"):
            await engine.infer(_row(6.0), priority=3)
        gate.open.set()
        await asyncio.gather(held, low, high)
        assert gate.seen == [1.0, 3.0, 2.0]  # the high one overtook the low one
        assert _errors(engine, "overload") == 3
        await engine.stop()

    asyncio.run(main())


def test_over_the_wait_limit_a_request_is_refused_at_once() -> None:
    async def main() -> None:
        engine, gate = await _gated_engine(queue=QueuePolicy(max_queue_wait_s=0.01))
        engine._estimate.batch_s = 0.05  # as if measured: each batch takes 50 ms
        held = await _hold(engine, gate)
        queued = asyncio.ensure_future(engine.infer(_row(2.0)))  # nothing ahead: admitted
        await asyncio.sleep(0.02)
        with pytest.raises(OverloadedError, match="over the 10 ms limit"):
            await engine.infer(_row(3.0))  # a full batch (50 ms) of work ahead of it
        gate.open.set()
        await asyncio.gather(held, queued)
        assert gate.seen == [1.0, 2.0]
        assert _errors(engine, "overload") == 1
        await engine.stop()

    asyncio.run(main())


def test_a_request_larger_than_a_batch_runs_in_chunks_with_oom_split_per_chunk() -> None:
    async def main() -> None:
        engine = Engine(loaded(Faulty()), [CPU], max_batch_size=8, max_delay_ms=0.0)
        await engine.start()
        model = engine.replicas[0].module
        assert isinstance(model, Faulty)
        model.rows_seen.clear()
        model.oom_over = 3  # every chunk of 8 rows is split down to 2
        x = np.arange(20 * 4, dtype=np.float32).reshape(20, 4)
        result = await engine.infer({"input": x})
        np.testing.assert_array_equal(result["output"], x * 2)  # rows in order
        assert max(model.rows_seen) == 8  # chunks of at most a batch
        assert sum(r for r in model.rows_seen if r <= 3) == 20  # every row ran once, split
        assert engine.metrics.device("cpu").oom_splits.value == 7  # 8 -> 4+4 -> 2+2+2+2 twice, 4
        assert b"torchplace_oom_splits_total{" in engine.metrics_text()
        await engine.stop()

    asyncio.run(main())


def test_queue_policy_and_estimate_validate() -> None:
    with pytest.raises(ConfigError, match="one limit >= 1 per priority level"):
        QueuePolicy(priority_levels=2, queue_limits=(4,))
    with pytest.raises(ConfigError, match="default_priority=3"):
        QueuePolicy(priority_levels=2, default_priority=3)
    assert QueuePolicy(priority_levels=3, default_priority=2).level(0) == 1
    estimate = WaitEstimate()
    assert estimate.wait(100, 32, 1) == 0.0  # nothing measured: nothing refused
    estimate.record(0.01)
    assert estimate.wait(64, 32, 2) == pytest.approx(0.01)


# ---------------------------------------------------------------------- over HTTP
@pytest.fixture
def gated() -> Iterator[tuple[ServerThread, Engine, Gate]]:
    gate = Gate()
    engine = Engine(loaded(gate), [CPU], max_batch_size=1, max_delay_ms=0.0)
    thread = ServerThread(test_config(device="cpu"), engine=engine).start(timeout=60)
    gate.seen.clear()
    try:
        yield thread, engine, gate
    finally:
        gate.open.set()
        thread.stop()


def _body(value: float, **extra: Any) -> bytes:
    return seed_body(np.full((1, 4), value, np.float32), **extra)


def _hold_over_http(thread: ServerThread, gate: Gate) -> threading.Thread:
    gate.open.clear()
    gate.entered.clear()
    client = Client("127.0.0.1", thread.port)
    holder = threading.Thread(target=client.post, args=(INFER, _body(1.0)))
    holder.start()
    assert gate.entered.wait(10)
    return holder


def test_timeout_parameter_and_header_answer_504_over_http(
    gated: tuple[ServerThread, Engine, Gate],
) -> None:
    thread, engine, gate = gated
    holder = _hold_over_http(thread, gate)
    client = Client("127.0.0.1", thread.port)
    status, _, body = client.post(INFER, _body(2.0, parameters={"timeout": 50_000}))
    assert status == 504
    assert b"deadline passed" in body
    status, _, _ = client.post(INFER, _body(3.0), headers={"Inference-Timeout-Us": "50000"})
    assert status == 504
    status, _, body = client.post(INFER, _body(4.0), headers={"Inference-Timeout-Us": "soon"})
    assert status == 400
    assert b"Inference-Timeout-Us" in body
    gate.open.set()
    holder.join(10)
    assert gate.seen == [1.0]
    assert _errors(engine, "deadline") == 2


def test_a_request_the_server_timed_out_is_dropped_as_a_deadline_not_a_cancel() -> None:
    gate = Gate()
    engine = Engine(loaded(gate), [CPU], max_batch_size=1, max_delay_ms=0.0)
    config = test_config(device="cpu", request_timeout_s=0.3)
    thread = ServerThread(config, engine=engine).start(timeout=60)
    gate.seen.clear()
    try:
        holder = _hold_over_http(thread, gate)
        status, headers, body = Client("127.0.0.1", thread.port).post(INFER, _body(2.0))
        assert status == 503, body
        assert b"timed out" in body
        assert headers.get("retry-after") == "1"
        assert engine.queue_depth() == 0  # removed from the queue, not left to run
        assert _errors(engine, "deadline") == 1  # the server's deadline, not the client's cancel
        assert _errors(engine, "cancelled") == 0
        gate.open.set()
        holder.join(10)
        assert gate.seen == [1.0]  # never computed
    finally:
        gate.open.set()
        thread.stop()


def _until(check: Any, why: str) -> None:
    """Wait (10 s at most) until ``check()`` is true."""
    end = time.monotonic() + 10
    while not check():
        assert time.monotonic() < end, why
        time.sleep(0.01)


def _withdrawn_never_computed(
    engine: Engine, gate: Gate, holder: threading.Thread, disconnect: Any
) -> None:
    """Once the request is queued, ``disconnect()``: it is removed, counted, never computed."""
    _until(engine.queue_depth, "the request never reached the queue")
    disconnect()
    _until(lambda: _errors(engine, "cancelled"), "the disconnect was not noticed")
    assert engine.queue_depth() == 0
    gate.open.set()
    holder.join(10)
    assert gate.seen == [1.0]


def _stream_request(value: float, request_id: str) -> bytes:
    """One row of ``value`` as a serialized ModelInferRequest for test-model."""
    from torchplace.serve.proto import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name="test-model", id=request_id)
    request.inputs.add(name="input", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.full(4, value, np.float32).tobytes())
    return request.SerializeToString()


_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


def test_a_client_that_disconnects_while_queued_is_never_computed(
    gated: tuple[ServerThread, Engine, Gate],
) -> None:
    thread, engine, gate = gated
    holder = _hold_over_http(thread, gate)
    body = _body(2.0)
    raw = socket.create_connection(("127.0.0.1", thread.port))
    raw.sendall(
        b"POST " + INFER.encode() + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    _withdrawn_never_computed(engine, gate, holder, raw.close)


def test_a_grpc_stream_that_ends_while_its_request_is_queued_is_never_computed(
    gated: tuple[ServerThread, Engine, Gate],
) -> None:
    grpc = pytest.importorskip("grpc")
    thread, engine, gate = gated
    holder = _hold_over_http(thread, gate)
    with grpc.insecure_channel(f"127.0.0.1:{thread.grpc_port}") as channel:
        call = channel.stream_stream(_STREAM)(iter([_stream_request(2.0, "queued")]))
        _withdrawn_never_computed(engine, gate, holder, call.cancel)


def test_a_grpc_stream_that_does_not_read_is_held_to_its_window(
    gated: tuple[ServerThread, Engine, Gate],
) -> None:
    grpc = pytest.importorskip("grpc")
    from torchplace.serve.grpc_server import STREAM_WINDOW
    from torchplace.serve.proto import grpc_service_pb2 as pb

    thread, engine, gate = gated
    holder = _hold_over_http(thread, gate)
    sent = STREAM_WINDOW + 40
    requests = (_stream_request(3.0, str(index)) for index in range(sent))
    with grpc.insecure_channel(f"127.0.0.1:{thread.grpc_port}") as channel:
        answers = channel.stream_stream(_STREAM)(requests, timeout=60)
        _until(lambda: engine.queue_depth() >= STREAM_WINDOW, "the window never filled")
        time.sleep(0.2)  # time to queue more, were the stream read further
        assert engine.queue_depth() == STREAM_WINDOW
        gate.open.set()
        got = [pb.ModelStreamInferResponse.FromString(a) for a in answers]
    holder.join(10)
    assert sorted(int(a.infer_response.id) for a in got) == list(range(sent))
    assert not any(a.error_message for a in got)


def test_overload_over_http_is_503_with_retry_after_and_nothing_else(
    gated: tuple[ServerThread, Engine, Gate],
) -> None:
    thread, engine, gate = gated
    engine.policy = QueuePolicy(max_queue_wait_s=0.01)
    engine._estimate.batch_s = 0.05
    holder = _hold_over_http(thread, gate)
    results: list[tuple[int, dict[str, str]]] = []

    def send(value: float) -> None:
        status, headers, _ = Client("127.0.0.1", thread.port).post(INFER, _body(value))
        results.append((status, headers))

    first = threading.Thread(target=send, args=(2.0,))
    first.start()
    end = time.monotonic() + 10
    while not engine.queue_depth():
        assert time.monotonic() < end
        time.sleep(0.005)
    senders = [threading.Thread(target=send, args=(10.0 + i,)) for i in range(6)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(10)
    refused = list(results)
    gate.open.set()
    first.join(10)
    holder.join(10)
    assert len(refused) == 6
    assert all(status == 503 and headers.get("retry-after") for status, headers in refused)
    assert sorted(s for s, _ in results) == [200, 503, 503, 503, 503, 503, 503]
    assert gate.seen == [1.0, 2.0]  # the refused ones were never queued
