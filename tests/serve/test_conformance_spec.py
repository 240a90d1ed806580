"""Conformance with the published protocol texts, checked the way a client that follows them
(and the suites that test Triton) would check a server.

Each test names the text that defines what it checks: the Open Inference Protocol
(kserve/open-inference-protocol, ``specification/protocol``), Triton's protocol extensions
(triton-inference-server/server, ``docs/protocol/extension_*.md``), Triton's own code where the
extension documents leave the behaviour to it (triton-inference-server/core ``src/``, and the
server's ``src/shared_memory_manager.cc`` and ``src/grpc/grpc_utils.cc``), and the QA tests that
pin its words (``qa/L0_*`` of triton-inference-server/server). A real server serves
``seed-mlp`` on the CPU over REST and gRPC, with client shared memory allowed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.errors import InputError, OverloadedError
from torchplace.models import TensorSpec
from torchplace.serve.admission import DeadlineExceededError, QueuePolicy
from torchplace.serve.protocol import decode_infer_request
from torchplace.serve.running import ServerThread

from .conftest import Client, test_config
from .test_admission import _gated_engine, _hold, _row
from .test_conformance import _client, _close_clients  # noqa: F401 (an autouse fixture)

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.utils import InferenceServerException  # noqa: E402

from torchplace.serve.grpc_codec import decode_infer_request as decode_grpc  # noqa: E402
from torchplace.serve.proto import grpc_service_pb2 as pb  # noqa: E402

INFER = "/v2/models/seed-mlp/infer"
_JSON = {"Content-Type": "application/json"}
_TWO_IN = (TensorSpec("INPUT0", "INT32", (-1, 16)), TensorSpec("INPUT1", "INT32", (-1, 16)))
_TWO_OUT = (TensorSpec("OUTPUT0", "INT32", (-1, 16)),)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread(test_config(device="cpu", allow_client_shm=True)) as thread:
        yield thread


@pytest.fixture
def rest(server: ServerThread) -> Client:
    return Client("127.0.0.1", server.port)


def _seed_input(kind: str, rows: int = 1) -> Any:
    module = httpclient if kind == "http" else grpcclient
    entry = module.InferInput("input", [rows, 8], "FP32")
    entry.set_data_from_numpy(np.full((rows, 8), 0.5, np.float32))
    return entry


def _entry(name: str = "input", **override: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}
    entry.update(override)
    return entry


def _post(rest: Client, body: object) -> tuple[int, dict[str, Any]]:
    status, _, data = rest.post(INFER, orjson.dumps(body), headers=_JSON)
    return status, orjson.loads(data)


# -- the schedule policy extension --------------------------------------------------------------
@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_the_schedule_policy_extension_is_listed(server: ServerThread, kind: str) -> None:
    """extension_schedule_policy.md: a server that takes the ``priority`` and ``timeout``
    request parameters reports "schedule_policy" in its metadata's extensions (a client may
    check it before sending them); torchplace takes both, and listed it not."""
    meta = _client(server, kind).get_server_metadata()
    listed = meta["extensions"] if kind == "http" else list(meta.extensions)
    assert "schedule_policy" in listed


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_a_priority_past_the_servers_levels_is_served_at_the_default_level(
    server: ServerThread, kind: str
) -> None:
    """extension_schedule_policy.md leaves a priority past the model's levels to the server;
    Triton (core src/infer_request.cc, ``InferenceRequest::SetPriority``) serves it at the
    default level, as it does priority 0 (qa/L0_model_queue test_max_priority_levels sends
    one). A client written for a deployment with more levels got a 400 here."""
    client = _client(server, kind)
    result = client.infer("seed-mlp", [_seed_input(kind)], priority=5)
    assert result.as_numpy("output").shape == (1, 2)


def test_a_priority_is_any_unsigned_64_bit_integer_over_rest(rest: Client) -> None:
    """Triton's REST front reads ``priority`` as an unsigned 64-bit integer
    (src/http_server.cc, ``MemberAsUInt``); one past int64 was refused here."""
    for priority in (2**63, 2**64 - 1):
        status, answer = _post(rest, {"parameters": {"priority": priority}, "inputs": [_entry()]})
        assert status == 200, answer
    status, answer = _post(rest, {"parameters": {"priority": -1}, "inputs": [_entry()]})
    assert status == 400
    assert "priority" in answer["error"]


def test_a_priority_is_any_unsigned_64_bit_integer_over_grpc() -> None:
    """Triton's gRPC front takes ``priority`` as ``uint64_param`` (what ``tritonclient.grpc``
    sends) up to the type's largest value."""
    message = pb.ModelInferRequest(model_name="seed-mlp")
    tensor = message.inputs.add(name="input", datatype="FP32", shape=[1, 8])
    tensor.contents.fp32_contents.extend([0.5] * 8)
    message.parameters["priority"].uint64_param = 2**64 - 1
    spec = (TensorSpec("input", "FP32", (-1, 8)),)
    out = (TensorSpec("output", "FP32", (-1, 2)),)
    assert decode_grpc(message, inputs=spec, outputs=out, max_rows=8).priority == 2**64 - 1


def test_the_queue_policy_maps_a_priority_past_its_levels_to_the_default() -> None:
    policy = QueuePolicy(priority_levels=2, default_priority=1)
    assert [policy.level(p) for p in (0, None, 1, 2, 3, 2**64 - 1)] == [0, 0, 0, 1, 0, 0]
    lowest = QueuePolicy(priority_levels=3)  # no default given: the lowest level
    assert [lowest.level(p) for p in (0, 4, 1)] == [2, 2, 0]


def test_a_full_queue_is_refused_in_tritons_words() -> None:
    """qa/L0_model_queue test_max_queue_size matches "Exceeds maximum queue size" (core
    src/scheduler_utils.cc); torchplace said "the queue is full"."""

    async def main() -> None:
        engine, gate = await _gated_engine(queue=QueuePolicy(max_queue=1))
        held = await _hold(engine, gate)
        queued = asyncio.ensure_future(engine.infer(_row(2.0)))
        await asyncio.sleep(0.02)
        with pytest.raises(OverloadedError) as refused:
            await engine.infer(_row(3.0))
        assert str(refused.value).startswith("Exceeds maximum queue size")
        gate.open.set()
        await asyncio.gather(held, queued)
        await engine.stop()

    asyncio.run(main())


def test_a_request_whose_timeout_expires_in_the_queue_is_refused_in_tritons_words() -> None:
    """qa/L0_model_queue (test_policy_reject, test_timeout_override) and qa/L0_batcher
    queue_timeout_test match "Request timeout expired" (core src/dynamic_batch_scheduler.cc);
    torchplace said "the request's deadline passed"."""

    async def main() -> None:
        engine, gate = await _gated_engine()
        held = await _hold(engine, gate)
        with pytest.raises(DeadlineExceededError) as expired:
            await engine.infer(_row(2.0), timeout_s=0.05)
        assert str(expired.value).startswith("Request timeout expired")
        assert "was not run" in str(expired.value)
        gate.open.set()
        await held
        await engine.stop()

    asyncio.run(main())


# -- inputs, in Triton's words ---------------------------------------------------------------
@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_an_input_given_twice_is_named_in_tritons_words(server: ServerThread, kind: str) -> None:
    """core src/infer_request.cc (``AddOriginalInput``): "input 'x' already exists in
    request", which qa/L0_http generate_endpoint_test matches; the same words as for an output
    asked for twice."""
    client = _client(server, kind)
    with pytest.raises(InferenceServerException) as err:
        client.infer("seed-mlp", [_seed_input(kind), _seed_input(kind)])
    assert err.value.message().startswith("input 'input' already exists in request")


def test_inputs_of_different_batch_sizes_are_named_in_tritons_words() -> None:
    """core src/infer_request.cc (``Normalize``): "input 'x' batch size does not match other
    inputs for 'model'"."""
    body = orjson.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
                {"name": "INPUT1", "datatype": "INT32", "shape": [2, 16], "data": [1] * 32},
            ]
        }
    )
    with pytest.raises(InputError) as rest_err:
        decode_infer_request(body, inputs=_TWO_IN, outputs=_TWO_OUT, max_rows=8, model="simple")
    message = pb.ModelInferRequest(model_name="simple")
    for name, rows in (("INPUT0", 1), ("INPUT1", 2)):
        message.inputs.add(name=name, datatype="INT32", shape=[rows, 16])
        message.raw_input_contents.append(np.ones((rows, 16), np.int32).tobytes())
    with pytest.raises(InputError) as grpc_err:
        decode_grpc(message, inputs=_TWO_IN, outputs=_TWO_OUT, max_rows=8, model="simple")
    for err in (rest_err, grpc_err):
        assert str(err.value).startswith(
            "input 'INPUT1' batch size does not match other inputs for 'simple'"
        )


@pytest.mark.parametrize(
    ("values", "words"),
    [
        (7, "Failed to parse 'data' field: shape does not match true shape"),
        (9, "Unable to parse 'data': Shape does not match true shape of 'data' field"),
        ([[0.5] * 3, [0.5] * 3], "Failed to parse 'data' field: shape does not match true shape"),
        (
            [[0.5] * 3] * 3,
            "Unable to parse 'data': Shape does not match true shape of 'data' field",
        ),
    ],
    ids=["fewer", "more", "fewer-nested", "more-nested"],
)
def test_json_data_that_does_not_fill_its_shape_is_named_in_tritons_words(
    rest: Client, values: Any, words: str
) -> None:
    """qa/L0_http/test.sh ("Send bad request where the 'data' field misaligns with the 'shape'
    field") greps for Triton's two messages (src/http_server.cc, ``ReadDataFromJson``); the
    answer stays a 400 naming the counts (Triton's is a 500)."""
    data = [0.5] * values if isinstance(values, int) else values
    status, answer = _post(rest, {"inputs": [_entry(data=data)]})
    assert status == 400
    assert answer["error"].startswith(words), answer
    assert "needs 8 values" in answer["error"]


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_a_bytes_input_is_a_datatype_mismatch_in_tritons_words(
    server: ServerThread, kind: str
) -> None:
    """OIP (Tensor Data Types) has BYTES; a model whose input is FP32 answers a BYTES tensor as
    Triton answers any datatype it does not take (core src/infer_request.cc): "inference input
    'x' data-type is 'BYTES', but model 'm' expects 'FP32'"."""
    module = httpclient if kind == "http" else grpcclient
    entry = module.InferInput("input", [1, 8], "BYTES")
    entry.set_data_from_numpy(np.array([[b"a"] * 8], dtype=np.object_))
    with pytest.raises(InferenceServerException) as err:
        _client(server, kind).infer("seed-mlp", [entry])
    assert err.value.message().startswith(
        "inference input 'input' data-type is 'BYTES', but model 'seed-mlp' expects 'FP32'"
    )
    assert err.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


# -- shared memory ---------------------------------------------------------------------------
def test_a_region_registered_twice_is_already_exists(server: ServerThread) -> None:
    """Triton's shared memory manager refuses a name already registered with
    ``TRITONSERVER_ERROR_ALREADY_EXISTS`` ("shared memory region 'x' already in manager",
    matched by qa/L0_shared_memory), which its REST front answers 400 and its gRPC front
    ``ALREADY_EXISTS`` (src/grpc/grpc_utils.cc); torchplace answered ``INVALID_ARGUMENT``."""
    key = f"/tp_spec_{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region("spec_region", key, 64)
    try:
        for kind, status in (("http", "400"), ("grpc", "StatusCode.ALREADY_EXISTS")):
            client = _client(server, kind)
            client.register_system_shared_memory("spec_region", key, 64)
            try:
                with pytest.raises(InferenceServerException) as err:
                    client.register_system_shared_memory("spec_region", key, 64)
                assert "shared memory region 'spec_region' already in manager" in str(
                    err.value.message()
                )
                assert err.value.status() == status
            finally:
                client.unregister_system_shared_memory("spec_region")
    finally:
        shm.destroy_shared_memory_region(handle)


# -- the streaming RPC ---------------------------------------------------------------------------
def test_every_stream_answer_says_it_is_the_final_response(server: ServerThread) -> None:
    """Triton's ``ModelStreamInfer`` sets the ``triton_final_response`` response parameter on
    every answer (src/grpc/stream_infer_handler.cc; true for a model that answers each request
    once), and a streaming client that opts in with ``enable_empty_final_response`` counts a
    request as done when it reads it true (qa/L0_decoupled decoupled_test.py:
    ``response.parameters.get("triton_final_response").bool_param``). torchplace took the
    opt-in but never set the parameter: such a client waited for ever."""
    import queue

    received: queue.Queue[Any] = queue.Queue()
    client = _client(server, "grpc")
    client.start_stream(callback=lambda result, error: received.put(error or result))
    try:
        for index in range(3):
            client.async_stream_infer(
                "seed-mlp",
                [_seed_input("grpc")],
                request_id=str(index),
                enable_empty_final_response=True,
            )
        answers = [received.get(timeout=10) for _ in range(3)]
    finally:
        client.stop_stream()
    for answer in answers:
        assert not isinstance(answer, Exception), answer
        final = answer.get_response().parameters.get("triton_final_response")
        assert final is not None
        assert final.bool_param is True
    assert sorted(a.get_response().id for a in answers) == ["0", "1", "2"]
