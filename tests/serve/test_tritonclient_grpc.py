"""The official client, tritonclient.grpc, unmodified, against a real `torchplace serve` over gRPC.

Live, ready, metadata, Triton's config and statistics, and inference in every datatype the
server takes (answers equal the model run in-process); errors arrive as the gRPC status codes
of their HTTP statuses, with the same messages; the series per protocol; the drain.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
import torch

from torchplace.serve.datatypes import host_numpy_dtype
from torchplace.serve.running import ServerThread

from .conftest import test_config
from .datatype_model import ALL, WIDTH, build

grpcclient = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

try:
    from ml_dtypes import bfloat16 as _ML_BF16
except ImportError:  # an older tritonclient, which takes BF16 as float32
    _ML_BF16 = None

MODEL = "tests.serve.datatype_model:build"
NAME = "tests.serve.datatype_model-build"  # a factory's default name: MODULE-CALLABLE


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    thread = ServerThread(
        test_config(model=MODEL, device="cpu", max_batch_size=4, max_request_rows=64)
    ).start(timeout=120)
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture
def client(server: ServerThread) -> Iterator[Any]:
    assert server.grpc_port, "gRPC is on by default when the extra is installed"
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        yield c
    finally:
        c.close()


def _rows(datatype: str, rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if datatype == "BOOL":
        return rng.integers(0, 2, (rows, WIDTH)).astype(bool)
    dtype = host_numpy_dtype(datatype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, (rows, WIDTH), dtype=dtype, endpoint=True)
    x = rng.standard_normal((rows, WIDTH)).astype(dtype)
    if datatype == "BF16":  # values a bfloat16 holds exactly
        x = (x.view(np.uint32) & 0xFFFF0000).view(np.float32)
    return x


def _reference(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    inputs = [torch.from_numpy(np.ascontiguousarray(arrays[dt])) for dt in ALL]
    with torch.inference_mode():
        out = build()(*inputs)
    return {name: tensor.numpy() for name, tensor in out.items()}


def _client_array(dt: str, array: np.ndarray) -> np.ndarray:
    """What the client sends: BF16 as ml_dtypes.bfloat16 (tritonclient >= 2.68 asks for it;
    older ones take float32)."""
    if dt == "BF16" and _ML_BF16 is not None:
        return array.astype(_ML_BF16)
    return array


def _inputs(arrays: dict[str, np.ndarray]) -> list[Any]:
    found = []
    for dt in ALL:
        inp = grpcclient.InferInput(f"in_{dt}", list(arrays[dt].shape), dt)
        inp.set_data_from_numpy(_client_array(dt, arrays[dt]))
        found.append(inp)
    return found


def test_live_ready_and_metadata(client: Any) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready(NAME)
    assert client.is_model_ready(NAME, "1")
    assert not client.is_model_ready("no-such-model")  # not ready, not an error (as Triton)
    assert not client.is_model_ready(NAME, "9")
    server = client.get_server_metadata(as_json=True)
    assert server["name"] == "torchplace"
    assert {"model_configuration", "statistics", "binary_tensor_data"} <= set(server["extensions"])
    meta = client.get_model_metadata(NAME, as_json=True)
    assert meta["versions"] == ["1"]
    assert [t["name"] for t in meta["inputs"]] == [f"in_{dt}" for dt in ALL]
    # the outputs were never declared: the loader's dry run named and shaped them
    assert meta["outputs"] == [
        {"name": f"out_{dt}", "datatype": dt, "shape": ["-1", str(WIDTH)]} for dt in ALL
    ]


def test_model_config_in_tritons_spelling(server: ServerThread, client: Any) -> None:
    config = client.get_model_config(NAME, as_json=True)["config"]
    assert config["name"] == NAME
    assert int(config["max_batch_size"]) == 4
    assert config["input"][0] == {"name": "in_BF16", "data_type": "TYPE_BF16", "dims": ["3"]}
    assert {o["data_type"] for o in config["output"]} == {"TYPE_" + dt for dt in ALL}
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == "2000"
    group = config["instance_group"][0]
    assert (group["kind"], group["count"]) == ("KIND_CPU", 1)
    # the REST document is the same configuration
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", f"/v2/models/{NAME}/versions/1/config")
    rest = orjson.loads(conn.getresponse().read())
    conn.close()
    assert rest["max_batch_size"] == 4
    assert rest["instance_group"] == [
        {"name": f"{NAME}_cpu", "kind": "KIND_CPU", "count": 1, "gpus": []}
    ]
    assert rest["input"][0] == {"name": "in_BF16", "data_type": "TYPE_BF16", "dims": [3]}


@pytest.mark.parametrize("rows", [1, 7], ids=["one-row", "split-over-batches"])
def test_infer_every_datatype_equals_the_model_in_process(client: Any, rows: int) -> None:
    arrays = {dt: _rows(dt, rows, seed=rows) for dt in ALL}
    want = _reference(arrays)
    result = client.infer(NAME, _inputs(arrays), request_id="g1")
    assert result.get_response().id == "g1"
    for dt in ALL:
        got = result.as_numpy(f"out_{dt}")
        assert got.shape == (rows, WIDTH), dt
        if dt == "BF16":
            got = got.astype(np.float32)
        expected = want[f"out_{dt}"]
        if dt == "BF16":
            expected = expected.astype(np.float32)
        np.testing.assert_array_equal(got, expected, err_msg=dt)


def test_a_stream_answers_every_request_by_id_and_outlives_a_bad_one(client: Any) -> None:
    """ModelStreamInfer (``start_stream``/``async_stream_infer``): answers equal the model's,
    matched by request id; a bad request's error arrives on the stream, which goes on."""
    import queue

    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    sent = {str(i): {dt: _rows(dt, 1 + i % 6, seed=40 + i) for dt in ALL} for i in range(12)}
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for request_id, arrays in list(sent.items())[:6]:
            client.async_stream_infer(NAME, _inputs(arrays), request_id=request_id)
        bad = {dt: _rows(dt, 1, seed=1) for dt in ALL}
        bad["FP32"] = bad["FP32"][:, :2]
        client.async_stream_infer(NAME, _inputs(bad), request_id="bad")
        for request_id, arrays in list(sent.items())[6:]:
            client.async_stream_infer(NAME, _inputs(arrays), request_id=request_id)
        got, errors = {}, []
        for _ in range(len(sent) + 1):
            result, error = answers.get(timeout=30)
            if error is not None:
                errors.append(error.message())
            else:
                got[result.get_response().id] = result
    finally:
        client.stop_stream()
    assert errors == [f"unexpected shape for input 'in_FP32' for model '{NAME}'. Expected [-1,3], "
                      "got [1,2] (the first dimension is the batch: -1, any number of rows)"]  # fmt: skip
    assert set(got) == set(sent)
    for request_id, arrays in sent.items():
        want = _reference(arrays)
        for dt in ALL:
            answer = got[request_id].as_numpy(f"out_{dt}")
            np.testing.assert_array_equal(
                answer.astype(np.float32) if dt == "BF16" else answer,
                want[f"out_{dt}"].astype(np.float32) if dt == "BF16" else want[f"out_{dt}"],
                err_msg=f"{request_id} {dt}",
            )


def test_fp16_and_bf16_need_raw_contents(client: Any) -> None:
    """The protocol has no typed field for FP16/BF16: sent typed, the server says so."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=NAME)
    for dt in ALL:
        request.inputs.add(name=f"in_{dt}", datatype=dt, shape=[1, WIDTH])
    with pytest.raises(Exception, match="BF16 has no typed contents field") as caught:
        client._client_stub.ModelInfer(request=request, timeout=10)
    assert "INVALID_ARGUMENT" in str(caught.value)


def _status(exc: InferenceServerException) -> str:
    return str(exc.status())


def test_errors_carry_the_status_codes_and_messages(client: Any) -> None:
    arrays = {dt: _rows(dt, 2, seed=5) for dt in ALL}
    with pytest.raises(InferenceServerException) as caught:
        client.infer("nope", _inputs(arrays))
    assert _status(caught.value) == "StatusCode.NOT_FOUND"
    assert (
        f"Request for unknown model: 'nope' is not found; this server serves {NAME!r}"
        in caught.value.message()
    )
    with pytest.raises(InferenceServerException) as caught:
        client.get_model_metadata(NAME, "9")
    assert _status(caught.value) == "StatusCode.NOT_FOUND"
    bad = _inputs(arrays)
    bad[0] = grpcclient.InferInput("in_BF16", [2, WIDTH + 1], "BF16")
    bad[0].set_data_from_numpy(_client_array("BF16", np.zeros((2, WIDTH + 1), np.float32)))
    with pytest.raises(InferenceServerException) as caught:
        client.infer(NAME, bad)
    assert _status(caught.value) == "StatusCode.INVALID_ARGUMENT"
    assert (
        f"unexpected shape for input 'in_BF16' for model '{NAME}'. Expected [-1,3], got [2,4]"
        in (caught.value.message())
    )
    big = {dt: _rows(dt, 65, seed=6) for dt in ALL}
    with pytest.raises(InferenceServerException) as caught:
        client.infer(NAME, _inputs(big))
    assert _status(caught.value) == "StatusCode.RESOURCE_EXHAUSTED"
    assert "--max-request-rows" in caught.value.message()
    with pytest.raises(InferenceServerException) as caught:
        client.load_model(NAME)
    assert _status(caught.value) == "StatusCode.FAILED_PRECONDITION"
    assert "not allowed in model control mode 'none'" in caught.value.message()


@pytest.mark.parametrize("rpc", ["ModelInfer", "ModelMetadata", "ModelStatistics"])
def test_bytes_that_are_not_the_message_are_invalid_argument(
    server: ServerThread, client: Any, rpc: str
) -> None:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{rpc}")
        with pytest.raises(grpc.RpcError) as caught:
            call(b"\xff\xff\xff\xff not protobuf", timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    message = f"the request is not a valid inference.{rpc}Request message"
    assert message in caught.value.details()
    assert client.is_server_ready()


def test_statistics_count_requests_batches_and_nanoseconds(
    server: ServerThread, client: Any
) -> None:
    before = client.get_inference_statistics(NAME, as_json=True)["model_stats"][0]
    arrays = {dt: _rows(dt, 6, seed=8) for dt in ALL}  # 6 rows: batches of 4 and 2
    client.infer(NAME, _inputs(arrays))
    after = client.get_inference_statistics(NAME, "1", as_json=True)["model_stats"][0]

    def count(doc: dict[str, Any], key: str) -> int:
        return int(doc["inference_stats"][key].get("count", 0))

    assert count(after, "success") == count(before, "success") + 1
    # one request, however many chunks (Triton: queue and compute count requests)
    assert count(after, "queue") == count(before, "queue") + 1
    assert int(after["inference_count"]) == int(before.get("inference_count", 0)) + 6
    assert int(after["execution_count"]) == int(before.get("execution_count", 0)) + 2
    assert int(after["inference_stats"]["compute_infer"]["ns"]) > 0
    sizes = {int(b["batch_size"]) for b in after["batch_stats"]}
    assert {2, 4} <= sizes
    # the same numbers over REST, in nanoseconds
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for path in (f"/v2/models/{NAME}/stats", "/v2/models/stats"):
        conn.request("GET", path)
        rest = orjson.loads(conn.getresponse().read())["model_stats"][0]
        assert rest["inference_stats"]["success"]["count"] == count(after, "success")
        assert rest["execution_count"] == int(after["execution_count"])
    conn.close()


def test_metrics_are_kept_per_protocol(server: ServerThread, client: Any) -> None:
    arrays = {dt: _rows(dt, 1, seed=9) for dt in ALL}
    client.infer(NAME, _inputs(arrays))
    with pytest.raises(InferenceServerException):
        client.infer(NAME, _inputs(arrays)[1:])
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    from prometheus_client.parser import text_string_to_metric_families

    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    labels = (("device", "cpu"), ("model", NAME), ("version", "1"))
    for code in ("OK", "INVALID_ARGUMENT"):
        key = ("torchplace_grpc_requests_total", tuple(sorted((*labels, ("code", code)))))
        assert samples[key] >= 1, code
    assert samples[("torchplace_grpc_request_duration_seconds_count", labels)] >= 2
    # the HTTP series keep their names, and count no gRPC call
    assert not any(
        name == "torchplace_requests_total" and ("model", NAME) in key for name, key in samples
    )


def test_a_second_copy_of_the_protocol_shares_the_process() -> None:
    """torchplace's messages live in their own descriptor pool: tritonclient's copy of
    ``inference.*`` (imported above) and ours load side by side and speak the same wire."""
    from tritonclient.grpc import service_pb2

    from torchplace.serve.proto import grpc_service_pb2

    ours = grpc_service_pb2.ModelInferRequest(model_name="m", id="7")
    ours.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    theirs = service_pb2.ModelInferRequest.FromString(ours.SerializeToString())
    assert (theirs.model_name, theirs.id, list(theirs.inputs[0].shape)) == ("m", "7", [1, 2])


def test_drain_refuses_new_grpc_inference_and_finishes_the_rest() -> None:
    thread = ServerThread(
        test_config(model=MODEL, device="cpu", drain_grace_s=0.5, drain_timeout_s=5.0)
    ).start(timeout=120)
    url = f"127.0.0.1:{thread.grpc_port}"
    client = grpcclient.InferenceServerClient(url)
    arrays = {dt: _rows(dt, 1, seed=10) for dt in ALL}
    try:
        client.infer(NAME, _inputs(arrays))
        stopper = threading.Thread(target=thread.stop)
        stopper.start()
        deadline = time.monotonic() + 5
        refused = None
        while time.monotonic() < deadline and refused is None:
            try:
                client.infer(NAME, _inputs(arrays))
            except InferenceServerException as exc:
                refused = exc
        assert refused is not None
        assert _status(refused) == "StatusCode.UNAVAILABLE"
        assert not client.is_server_ready() if stopper.is_alive() else True
        stopper.join(10)
        assert not stopper.is_alive()
    finally:
        client.close()
        thread.stop()


def _raw_request(arrays: dict[str, np.ndarray], request_id: str) -> bytes:
    """A ModelInferRequest of ``arrays`` with raw contents, as tritonclient sends it."""
    from torchplace.serve.proto import grpc_service_pb2 as pb

    message = pb.ModelInferRequest(model_name=NAME, id=request_id)
    for dt in ALL:
        array = np.ascontiguousarray(arrays[dt])
        message.inputs.add(name=f"in_{dt}", datatype=dt, shape=list(array.shape))
        if dt == "BF16":  # the upper half of each float32
            array = (array.view(np.uint32) >> 16).astype("<u2")
        message.raw_input_contents.append(array.tobytes())
    return message.SerializeToString()


def test_a_stream_ends_when_the_server_drains_once_its_requests_are_answered() -> None:
    """A drain would otherwise wait its whole timeout (60 s here) for an open stream; the
    client has not half-closed it, so it ends UNAVAILABLE (more may have been on the way)."""
    import grpc

    from torchplace.serve.proto import grpc_service_pb2 as pb

    thread = ServerThread(
        test_config(model=MODEL, device="cpu", drain_grace_s=0.5, drain_timeout_s=60.0)
    ).start(timeout=120)
    request = _raw_request({dt: _rows(dt, 1, seed=11) for dt in ALL}, "before")
    done = threading.Event()

    def requests() -> Iterator[bytes]:
        yield request
        done.wait(120)  # the client keeps its side open past the call's deadline

    try:
        with grpc.insecure_channel(f"127.0.0.1:{thread.grpc_port}") as channel:
            stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
            answers = stream(requests(), timeout=40)
            first = pb.ModelStreamInferResponse.FromString(next(answers))
            assert (first.error_message, first.infer_response.id) == ("", "before")
            stopper = threading.Thread(target=thread.stop)
            stopper.start()
            with pytest.raises(grpc.RpcError) as ended:  # ended by the server, before any timeout
                next(answers)
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in ended.value.details()
            done.set()
            stopper.join(30)
            assert not stopper.is_alive()
    finally:
        done.set()
        thread.stop()
