"""Pressure as hostile or unusual clients apply it: split requests past their deadline or the
queue limit, deadlines given as a header, and a drain with a client slow to read its answer.

No timing is asserted: a gate holds the one replica busy while the queue is examined, and the
drain test only waits (bounded) for the server to give up on a client that is not reading.
"""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from torchplace.errors import PayloadTooLargeError
from torchplace.serve.admission import DeadlineExceededError, QueuePolicy
from torchplace.serve.engine import Engine

from .conftest import FakeEngine, StartServer, raw_request, seed_body
from .engine_helpers import Scale, loaded
from .test_admission import CPU, _errors, _gated_engine, _hold, _row


def test_a_split_request_past_its_deadline_is_dropped_and_counted_once() -> None:
    async def main() -> None:
        engine, gate = await _gated_engine()
        held = await _hold(engine, gate)
        with pytest.raises(DeadlineExceededError):
            await engine.infer(_row(2.0, rows=3), timeout_s=0.05)  # 3 chunks of 1 row
        assert len(engine._batcher or ()) == 0
        assert _errors(engine, "deadline") == 1
        gate.open.set()
        await held
        assert gate.seen == [1.0]  # no chunk of the expired request ran
        await engine.stop()

    asyncio.run(main())


def test_a_request_of_more_chunks_than_its_queue_holds_is_413_not_a_503_forever() -> None:
    async def main() -> None:
        policy = QueuePolicy(max_queue=4)
        engine = Engine(loaded(Scale()), [CPU], max_batch_size=1, queue=policy)
        await engine.start()
        with pytest.raises(PayloadTooLargeError, match="at most 4 rows"):
            await engine.infer(_row(1.0, rows=5))  # an idle server: it could never be queued
        result = await engine.infer(_row(1.0, rows=4))
        np.testing.assert_array_equal(result["output"], np.full((4, 4), 2.0, np.float32))
        await engine.stop()

    asyncio.run(main())


def test_an_inference_timeout_header_takes_what_the_parameter_takes(
    start_server: StartServer,
) -> None:
    running = start_server()
    body = seed_body(np.full((1, 8), 0.5, np.float32))
    path = "/v2/models/seed-mlp/infer"
    biggest = str(2**63 - 1)
    status, _, _ = running.client.post(path, body, headers={"Inference-Timeout-Us": biggest})
    assert status == 200
    status, _, _ = running.client.post(path, body, headers={"Inference-Timeout-Us": str(2**63)})
    assert status == 400


def _read_answer(sock: socket.socket) -> tuple[int, bytes]:
    """The Content-Length of the one answer on ``sock`` and the body bytes that came."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed before the answer's head"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        body += chunk
    return length, body


def test_a_drain_waits_for_a_client_slow_to_read_its_answer(start_server: StartServer) -> None:
    running = start_server(FakeEngine(model_name="wide-mlp"), drain_timeout_s=30.0)
    body = seed_body(np.zeros((4096, 512), np.float32))  # about 20 MB of JSON comes back
    headers = {b"Connection": b"keep-alive"}
    with socket.create_connection(("127.0.0.1", running.port), timeout=30) as sock:
        sock.sendall(raw_request(body, path=b"/v2/models/wide-mlp/infer", headers=headers))
        assert sock.recv(1, socket.MSG_PEEK)  # the answer is being written, and not read
        running.thread.stop(timeout=3)  # SIGTERM; the server gives up on the reader, or waits
        length, got = _read_answer(sock)
    running.thread.stop()
    assert len(got) == length  # the whole answer, not a 200 cut short by the exit
