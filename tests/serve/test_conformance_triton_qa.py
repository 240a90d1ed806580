"""Triton's own QA suite as the ground truth: each test mirrors one check of a ``qa/L0_*`` test of
triton-inference-server/server that concerns the protocol as a client sees it (status codes,
error words, headers, JSON fields, shared-memory and repository semantics), run against
``torchplace serve``. The docstring names the QA file and test it mirrors; where torchplace
answers differently on purpose (documented in docs/serve.md), the test pins torchplace's answer
and says why.

Checks that need Triton-only backends, ensembles, sequence batching, BYTES tensors or CUDA are
left out. A real server serves Triton's ``simple`` model (``tests/serve/addsub_model.py``), a
one-input ``seed`` (seed-mlp) and a two-version ``versioned`` model from a repository in explicit
model control mode, over REST and gRPC, with client shared memory allowed.
"""

from __future__ import annotations

import gzip
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.serve.running import ServerThread

from .conftest import Client, FakeEngine, StartServer, answer_of, exchange, raw_request, test_config
from .repository_helpers import CONFIG as SEED_CONFIG

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.utils import InferenceServerException  # noqa: E402

SIMPLE = 'source = "tests.serve.addsub_model:build"\n'
INFER = "/v2/models/simple/infer"
SEED_INFER = "/v2/models/seed/infer"
_JSON = {"Content-Type": "application/json"}
_SHM_BYTES = 64  # one row of 16 INT32 values, as the QA tests' DEFAULT_SHM_BYTE_SIZE
_PAGE = 4096


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("repository")
    (root / "simple" / "1").mkdir(parents=True)
    (root / "simple" / "config.toml").write_text(SIMPLE)
    (root / "seed" / "1").mkdir(parents=True)
    (root / "seed" / "config.toml").write_text(SEED_CONFIG)
    for version in ("1", "2"):
        (root / "versioned" / version).mkdir(parents=True)
    (root / "versioned" / "config.toml").write_text(SIMPLE + "[version_policy]\nall = true\n")
    (root / "bad_config" / "1").mkdir(parents=True)
    (root / "bad_config" / "config.toml").write_text("source = [\n")
    config = test_config(
        device="cpu",
        model_repository=root,
        model_control_mode="explicit",
        load_models=("simple", "seed", "versioned"),
        allow_client_shm=True,
        max_queue=64,
    )
    with ServerThread(config) as thread:
        yield thread


@pytest.fixture
def rest(server: ServerThread) -> Client:
    return Client("127.0.0.1", server.port)


@pytest.fixture
def clients(server: ServerThread) -> Iterator[dict[str, Any]]:
    """One tritonclient of each kind, closed after the test."""
    made = {
        "http": httpclient.InferenceServerClient(f"127.0.0.1:{server.port}"),
        "grpc": grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}"),
    }
    yield made
    for client in made.values():
        client.close()


@pytest.fixture
def regions(clients: dict[str, Any]) -> Iterator[list[Any]]:
    """Shared-memory handles the test creates; destroyed and unregistered after it."""
    handles: list[Any] = []
    yield handles
    clients["http"].unregister_system_shared_memory()
    for handle in handles:
        shm.destroy_shared_memory_region(handle)


def _module(kind: str) -> Any:
    return httpclient if kind == "http" else grpcclient


def _entry(name: str, **override: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "datatype": "INT32", "shape": [1, 16]}
    entry["data"] = list(range(1, 17))
    entry.update(override)
    return entry


def _post(rest: Client, body: object, path: str = INFER) -> tuple[int, dict[str, Any]]:
    status, _, data = rest.post(path, orjson.dumps(body), headers=_JSON)
    return status, orjson.loads(data) if data else {}


def _two_inputs(kind: str, a: np.ndarray, b: np.ndarray) -> list[Any]:
    module = _module(kind)
    inputs = [module.InferInput("INPUT0", list(a.shape), "INT32")]
    inputs.append(module.InferInput("INPUT1", list(b.shape), "INT32"))
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _region(regions: list[Any], name: str, size: int = _SHM_BYTES) -> tuple[Any, str]:
    """A new POSIX shared-memory object of ``size`` bytes (a unique key), kept in ``regions``."""
    key = f"/tp_qa_{name}_{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region(name, key, size)
    regions.append(handle)
    return handle, key


def _message(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(InferenceServerException) as err:
        call(*args, **kwargs)
    return str(err.value.message())


# -- qa/L0_http/http_test.py --------------------------------------------------------------------
def _seed_reference(rest: Client, x: np.ndarray) -> np.ndarray:
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8], "data": x.tolist()}]}
    status, doc = _post(rest, body, SEED_INFER)
    assert status == 200, doc
    return np.asarray(doc["outputs"][0]["data"], np.float32)


def _raw_infer(rest: Client, body: bytes, **headers: str) -> tuple[int, dict[str, str], bytes]:
    return rest.post(SEED_INFER, body, headers={"Inference-Header-Content-Length": "0", **headers})


def test_a_raw_binary_request_answers_binary_outputs(rest: Client) -> None:
    """qa/L0_http/http_test.py test_raw_binary: a body that is only the input's bytes, with
    ``Inference-Header-Content-Length: 0``, is answered with the header's length and the
    output's bytes after it."""
    x = np.arange(8, dtype=np.float32)
    status, headers, data = _raw_infer(rest, x.tobytes())
    assert status == 200, data
    start = int(headers["inference-header-content-length"])
    header = orjson.loads(data[:start])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == len(data) - start
    got = np.frombuffer(data[start:], np.float32)
    np.testing.assert_allclose(got, _seed_reference(rest, x), rtol=1e-6)


def test_a_raw_binary_request_of_the_wrong_size_is_a_byte_size_mismatch(rest: Client) -> None:
    """qa/L0_http/http_test.py test_raw_binary_longer: a raw body is one row; seed's row is
    fixed ([8]), so 32 values are not its row (Triton's identity model has a variable one)."""
    status, _, data = _raw_infer(rest, np.arange(32, dtype=np.float32).tobytes())
    assert status == 400
    assert "input byte size mismatch for input 'input'" in orjson.loads(data)["error"]


def test_a_raw_binary_request_for_a_model_of_two_inputs_is_refused(rest: Client) -> None:
    """qa/L0_http/http_test.py test_multi_inputs."""
    body = np.arange(32, dtype=np.int32).tobytes()
    status, _, data = rest.post(INFER, body, headers={"Inference-Header-Content-Length": "0"})
    assert status == 400
    assert (
        "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in"
        in orjson.loads(data)["error"]
    )


def test_a_chunked_raw_binary_request_is_read(server: ServerThread, rest: Client) -> None:
    """qa/L0_http/http_test.py test_content_encoding_chunked_manually."""
    x = np.arange(8, dtype=np.float32)
    chunked = b"%X\r\n%s\r\n0\r\n\r\n" % (len(x.tobytes()), x.tobytes())
    request = raw_request(
        chunked,
        path=SEED_INFER.encode(),
        headers={
            b"Transfer-Encoding": b"chunked",
            b"Inference-Header-Content-Length": b"0",
            b"Content-Type": b"application/octet-stream",
        },
    )
    reply = exchange(server.port, request)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), reply[:300]
    lines = {k.strip().lower(): v.strip() for k, _, v in
             (line.partition(b":") for line in head.split(b"\r\n")[1:])}  # fmt: skip
    if lines.get(b"transfer-encoding") == b"chunked":  # de-chunk the answer
        plain, rest_ = b"", body
        while True:
            size_line, _, rest_ = rest_.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            plain, rest_ = plain + rest_[:size], rest_[size + 2 :]
        body = plain
    start = int(lines[b"inference-header-content-length"])
    got = np.frombuffer(body[start:], np.float32)
    np.testing.assert_allclose(got, _seed_reference(rest, x), rtol=1e-6)


def test_a_full_queue_is_503() -> None:
    """qa/L0_http/http_test.py test_descriptive_status_code: with a queue of one and a request
    running, a further request is refused with 503 (server unavailable), in Triton's words."""
    config = test_config(model="tests.serve.addsub_model:build_slow", name="simple",
                         device="cpu", max_queue=1, max_batch_size=1, max_queue_wait_ms=0,
                         inline_batch_ms=0.0)  # fmt: skip
    body = orjson.dumps({"inputs": [_entry("INPUT0"), _entry("INPUT1")]})
    answers: list[tuple[int, bytes]] = []
    with ServerThread(config) as thread:
        client = Client("127.0.0.1", thread.port)

        def send() -> None:
            status, _, data = client.post(INFER, body, headers=_JSON)
            answers.append((status, data))

        threads = [threading.Thread(target=send) for _ in range(3)]
        for worker in threads:
            worker.start()
            time.sleep(0.2)
        for worker in threads:
            worker.join(timeout=30)
    statuses = sorted(status for status, _ in answers)
    assert statuses == [200, 200, 503], answers
    refused = next(data for status, data in answers if status == 503)
    assert "Exceeds maximum queue size" in orjson.loads(refused)["error"]


def test_element_count_and_byte_size_overflows_are_400(rest: Client) -> None:
    """qa/L0_http/http_test.py test_buffer_size_overflow: a shape whose element count or byte
    size does not fit 64 bits is refused (400) in Triton's words, whatever ``data`` holds."""
    status, doc = _post(rest, {"inputs": [_entry("INPUT0", shape=[2**4, 2**60 + 2], data=[1]),
                                          _entry("INPUT1")]})  # fmt: skip
    assert status == 400
    assert "causes total element count to exceed maximum size of" in doc["error"]
    status, doc = _post(rest, {"inputs": [_entry("INPUT0", shape=[2**2, 2**60 + 2], data=[1]),
                                          _entry("INPUT1")]})  # fmt: skip
    assert status == 400
    assert "byte size overflow for input" in doc["error"]


def test_a_negative_dimension_is_refused_in_tritons_words(rest: Client) -> None:
    """qa/L0_http/http_test.py test_negative_dimensions: Triton's words for a shape entry that
    is not an unsigned integer. Triton answers 500 (its JSON reader's error); torchplace 400,
    as for every request that does not match the model (docs/serve.md, Errors)."""
    status, doc = _post(rest, {"inputs": [_entry("INPUT0", shape=[2, -5], data=[1]),
                                          _entry("INPUT1")]})  # fmt: skip
    assert status == 400
    assert (
        "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as "
        "unsigned-integer" in doc["error"]
    )


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_an_output_asked_twice_is_refused(clients: dict[str, Any], kind: str) -> None:
    """qa/L0_http/http_test.py test_duplicate_output_names and qa/L0_grpc/python_unit_test.py
    test_duplicate_output_names_rejected: 400 / INVALID_ARGUMENT, and the server stays live."""
    client = clients[kind]
    a = np.arange(16, dtype=np.int32)[None]
    outputs = [_module(kind).InferRequestedOutput("OUTPUT0") for _ in range(2)]
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", _two_inputs(kind, a, a), outputs=outputs)
    assert "output 'OUTPUT0' already exists in request" in err.value.message()
    if kind == "grpc":
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    else:
        assert err.value.status() == "400"
    assert client.is_server_live()


def test_an_inference_header_length_out_of_range_is_400(rest: Client) -> None:
    """qa/L0_http/http_test.py test_inference_header_content_length_out_of_range."""
    status, _, data = rest.post(
        INFER, b'{"inputs": []}',
        headers={**_JSON, "Inference-Header-Content-Length": "99999999999"},
    )  # fmt: skip
    assert status == 400, data
    assert "error" in orjson.loads(data)
    assert rest.get("/v2/health/live")[0] == 200


def test_an_inference_header_length_past_a_compressed_body_is_400(rest: Client) -> None:
    """qa/L0_http/http_input_size_limit_test.py test_no_leak_on_invalid_inference_header_length:
    a gzip body with a header length past its decompressed size, again and again: 400 each."""
    body = gzip.compress(b" " * (1 << 20))
    headers = {**_JSON, "Content-Encoding": "gzip", "Inference-Header-Content-Length": "9999999"}
    for _ in range(5):
        status, _, data = rest.post(INFER, body, headers=headers)
        assert status == 400, data
    assert rest.get("/v2/health/live")[0] == 200


def test_a_body_over_the_limit_is_named_in_tritons_words(start_server: StartServer) -> None:
    """qa/L0_http/http_test.py test_loading_large_invalid_model and
    qa/L0_http/http_input_size_limit_test.py test_large_string_in_json: the error names the
    request's size and the limit as Triton does. Triton answers 400; torchplace 413 (Content Too
    Large, the status for it; docs/serve.md, Errors)."""
    running = start_server(max_body_bytes=4096)
    payload = orjson.dumps({"parameters": {"config": "{}", "file:1/model.onnx": "A" * 8192}})
    for path in ("/v2/repository/models/x/load", "/v2/models/seed-mlp/infer"):
        status, _, data = running.client.post(path, payload, headers=_JSON)
        assert status == 413
        error = orjson.loads(data)["error"]
        assert "request JSON size" in error
        assert " exceeds the maximum allowed input size" in error


def test_many_chunks_of_a_raw_request_are_read_as_one_body(server: ServerThread) -> None:
    """qa/L0_http/http_request_many_chunks.py test_chunked_infer_at_max_chunks (with far fewer
    chunks): a chunked raw request for ``simple`` is read whole and refused as a raw request
    for a model of two inputs, 400 in Triton's words."""
    head = (
        f"POST {INFER} HTTP/1.1\r\nInference-Header-Content-Length: 0\r\n"
        f"Host: 127.0.0.1:{server.port}\r\nContent-Type: application/octet-stream\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode()
    status, body = answer_of(server.port, head + b"1\r\nA\r\n" * 2048 + b"0\r\n\r\n")
    assert status == 400
    assert b"Raw request must only have 1 input (found 1) to be deduced but got 2 inputs" in body


# -- qa/L0_http/test.sh: binary and JSON outputs together --------------------------------------
_SUMS = list(range(2, 33, 2))
_ZEROS = [0] * 16


@pytest.mark.parametrize(
    ("parameters", "outputs", "json_outputs"),
    [
        (None, None, {"OUTPUT0", "OUTPUT1"}),
        (None, [("OUTPUT0", True), ("OUTPUT1", False)], {"OUTPUT1"}),
        (None, [("OUTPUT0", True), ("OUTPUT1", None)], {"OUTPUT1"}),
        ({"binary_data_output": True}, None, set()),
        ({"binary_data_output": True}, [("OUTPUT0", False), ("OUTPUT1", None)], {"OUTPUT0"}),
    ],
)
def test_binary_and_json_outputs_as_the_request_asks(
    rest: Client,
    parameters: dict[str, Any] | None,
    outputs: list[tuple[str, bool | None]] | None,
    json_outputs: set[str],
) -> None:
    """qa/L0_http/test.sh "Test combinations of binary and JSON data": ``binary_data`` on an
    output wins; an output without it follows ``binary_data_output`` (default false)."""
    body: dict[str, Any] = {"inputs": [_entry("INPUT0"), _entry("INPUT1")]}
    if parameters is not None:
        body["parameters"] = parameters
    if outputs is not None:
        body["outputs"] = [
            {"name": n} if b is None else {"name": n, "parameters": {"binary_data": b}}
            for n, b in outputs
        ]
    status, headers, data = rest.post(INFER, orjson.dumps(body), headers=_JSON)
    assert status == 200, data
    start = int(headers.get("inference-header-content-length", len(data)))
    doc = orjson.loads(data[:start])
    given = {o["name"]: o for o in doc["outputs"]}
    assert {name for name, o in given.items() if "data" in o} == json_outputs
    if "OUTPUT0" in json_outputs:
        assert given["OUTPUT0"]["data"] == _SUMS
    if "OUTPUT1" in json_outputs:
        assert given["OUTPUT1"]["data"] == _ZEROS
    binary = [o for o in doc["outputs"] if "data" not in o]
    offset = start
    for o in binary:  # binary sections come in the order of the header's outputs
        size = o["parameters"]["binary_data_size"]
        values = np.frombuffer(data[offset : offset + size], np.int32).tolist()
        assert values == (_SUMS if o["name"] == "OUTPUT0" else _ZEROS)
        offset += size
    assert offset == len(data)


def test_json_data_of_the_wrong_length_is_named_in_tritons_words(rest: Client) -> None:
    """qa/L0_http/test.sh: 15 values for a [1,16] shape, and 18; each answered with Triton's
    exact error body."""
    status, doc = _post(rest, {"inputs": [_entry("INPUT0", data=list(range(1, 16)))]})
    assert status == 400
    assert doc["error"].startswith("Failed to parse 'data' field: shape does not match true shape")
    status, doc = _post(rest, {"inputs": [_entry("INPUT0", data=list(range(1, 19)))]})
    assert status == 400
    assert doc["error"].startswith(
        "Unable to parse 'data': Shape does not match true shape of 'data' field"
    )


# -- qa/L0_http_fuzz/fuzztest.py -----------------------------------------------------------------
_FUZZ_URLS = [
    "/v2", "/v2/models/simple", "/v2/models/simple/infer", "/v2/models/simple/versions/v1",
    "/v2/models/simple/config", "/v2/models/simple/stats", "/v2/models/simple/ready",
    "/v2/health/ready", "/v2/health/live", "/v2/repository/index",
    "/v2/repository/models/simple/unload", "/v2/repository/models/simple/load",
    "/v2/systemsharedmemory/status", "/v2/systemsharedmemory/register",
    "/v2/systemsharedmemory/unregister", "/v2/systemsharedmemory/region/xx/status",
    "/v2/cudasharedmemory/status", "/v2/cudasharedmemory/register",
    "/v2/cudasharedmemory/unregister", "/v2/cudasharedmemory/region/xx/status",
]  # fmt: skip
_FUZZ_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE"]


def test_every_method_on_every_route_is_answered(server: ServerThread, rest: Client) -> None:
    """qa/L0_http_fuzz/fuzztest.py test_failures_from_db: each of these request lines (every
    method on every route, then mangled URIs and versions) gets an HTTP answer, and the server
    stays up. The unload route is left out of the methods that act (it would unload simple)."""
    mangled = ["/v2/models/%00/infer", "/v2/" + "A" * 5000, "/v2/models//infer", "//v2", "v2"]
    lines = [f"{m} {u} HTTP/1.1" for m in _FUZZ_METHODS for u in _FUZZ_URLS
             if not (m == "POST" and u.endswith("/unload"))]  # fmt: skip
    lines += [f"GET {u} HTTP/1.1" for u in mangled] + ["GET /v2 HTTP/9.9", "GET /v2 HTTX/1.1"]
    for line in lines:
        request = f"{line}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
        reply = exchange(server.port, request)
        assert reply.startswith(b"HTTP/1.1 "), (line, reply[:100])
        assert int(reply[9:12]) != 500, (line, reply[:200])  # no internal error
    assert rest.get("/v2/health/live")[0] == 200
    assert rest.get("/v2/models/simple/ready")[0] == 200


# -- qa/L0_shared_memory/shared_memory_test.py ---------------------------------------------------
def test_without_the_flag_register_and_unregister_are_refused(start_server: StartServer) -> None:
    """shared_memory_test.py test_client_shm_disabled_by_default: status lists nothing, register
    and unregister say "Client shared memory is disabled", and the status is unchanged."""
    running = start_server()
    client = httpclient.InferenceServerClient(f"127.0.0.1:{running.port}")
    try:
        before = client.get_system_shared_memory_status()
        assert before == []
        assert "Client shared memory is disabled" in _message(
            client.register_system_shared_memory, "dummy_data", "/dummy_data", 8
        )
        assert "Client shared memory is disabled" in _message(
            client.unregister_system_shared_memory, "dummy_data"
        )
        assert client.get_system_shared_memory_status() == before
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_register_unregister_and_status_count_regions(
    clients: dict[str, Any], regions: list[Any], kind: str
) -> None:
    """shared_memory_test.py test_valid_create_set_register, test_unregister_before_register,
    test_unregister_after_register, test_reregister_after_register, test_unregisterall."""
    client = clients[kind]

    def count() -> int:
        status = client.get_system_shared_memory_status()
        return len(status) if kind == "http" else len(status.regions)

    handle, key = _region(regions, "dummy_data", 8)
    shm.set_shared_memory_region(handle, [np.array([1, 2], dtype=np.float32)])
    client.unregister_system_shared_memory("dummy_data")  # before it is registered: no error
    assert count() == 0
    client.register_system_shared_memory("dummy_data", key, 8)
    assert count() == 1
    assert "shared memory region 'dummy_data' already in manager" in _message(
        client.register_system_shared_memory, "dummy_data", key, 8
    )
    assert count() == 1
    client.unregister_system_shared_memory("dummy_data")
    assert count() == 0
    for name in ("r0", "r1", "r2", "r3"):
        client.register_system_shared_memory(name, _region(regions, name)[1], _SHM_BYTES)
    assert count() == 4
    client.unregister_system_shared_memory()
    assert count() == 0


def _shm_infer(
    kind: str,
    client: Any,
    regions: list[Any],
    *,
    output_offset: int = 0,
    output_size: int = _SHM_BYTES,
    input1_size: int = _SHM_BYTES,
    raw_input1: bool = False,
    register_offset: int = 0,
) -> Any:
    """``simple`` with its inputs and outputs in four regions, as the QA tests'
    ``shm_basic_infer``: INPUT0 = 0..15, INPUT1 = ones; OUTPUT0 = sum, OUTPUT1 = difference."""
    a = np.arange(16, dtype=np.int32)
    b = np.ones(16, dtype=np.int32)
    module = _module(kind)
    size = register_offset + _SHM_BYTES
    names = ("input0_data", "input1_data", "output0_data", "output1_data")
    handles = {}
    for name in names:
        handle, key = _region(regions, name, size if name != "input1_data" else
                              max(size, register_offset + input1_size))  # fmt: skip
        handles[name] = handle
        region_size = input1_size if name == "input1_data" else _SHM_BYTES
        client.register_system_shared_memory(name, key, region_size, offset=register_offset)
    shm.set_shared_memory_region(handles["input0_data"], [a], offset=register_offset)
    shm.set_shared_memory_region(handles["input1_data"], [b], offset=register_offset)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"),
              module.InferInput("INPUT1", [1, 16], "INT32")]  # fmt: skip
    inputs[0].set_shared_memory("input0_data", _SHM_BYTES)
    if raw_input1:
        inputs[1].set_data_from_numpy(b[None])
    else:
        inputs[1].set_shared_memory("input1_data", input1_size)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("output0_data", output_size, offset=output_offset)
    outputs[1].set_shared_memory("output1_data", _SHM_BYTES)
    client.infer("simple", inputs, outputs=outputs)
    got0 = shm.get_contents_as_numpy(handles["output0_data"], np.int32, [1, 16],
                                     offset=register_offset)  # fmt: skip
    got1 = shm.get_contents_as_numpy(handles["output1_data"], np.int32, [1, 16],
                                     offset=register_offset)  # fmt: skip
    np.testing.assert_array_equal(got0[0], a + b)
    np.testing.assert_array_equal(got1[0], a - b)


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_regions_stay_registered_after_inference(
    clients: dict[str, Any], regions: list[Any], kind: str
) -> None:
    """shared_memory_test.py test_unregister_after_inference, test_register_after_inference and
    test_mixed_raw_shm."""
    client = clients[kind]
    _shm_infer(kind, client, regions)
    client.unregister_system_shared_memory("output0_data")
    status = client.get_system_shared_memory_status()
    assert len(status if kind == "http" else status.regions) == 3
    client.register_system_shared_memory("input2_data", _region(regions, "input2_data")[1], 64)
    client.register_system_shared_memory("output0_data", _region(regions, "o0")[1], 64)
    status = client.get_system_shared_memory_status()
    assert len(status if kind == "http" else status.regions) == 5
    client.unregister_system_shared_memory()
    _shm_infer(kind, client, regions, raw_input1=True)


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_a_region_larger_than_the_input_is_a_byte_size_mismatch(
    clients: dict[str, Any], regions: list[Any], kind: str
) -> None:
    """shared_memory_test.py test_too_big_shm."""
    message = _message(_shm_infer, kind, clients[kind], regions, input1_size=128)
    assert (
        "input byte size mismatch for input 'INPUT1' for model 'simple'. Expected 64, got 128"
        in message
    )


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_a_large_register_offset_is_read_and_written_there(
    clients: dict[str, Any], regions: list[Any], kind: str
) -> None:
    """shared_memory_test.py test_large_shm_register_offset: objects of 1024 pages registered
    at the last page."""
    _shm_infer(kind, clients[kind], regions, register_offset=_PAGE * 1023)


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_an_output_offset_past_its_region_is_invalid(
    clients: dict[str, Any], regions: list[Any], kind: str
) -> None:
    """shared_memory_test.py test_infer_offset_out_of_bound: over REST an offset of 2**64 - 32
    (negative as int64), over gRPC 64 (one past a 64-byte region; gRPC's int64 holds no more)."""
    offset = 2**64 - 32 if kind == "http" else 64
    message = _message(
        _shm_infer, kind, clients[kind], regions, output_offset=offset, register_offset=_PAGE
    )
    assert "Invalid offset for shared memory region" in message


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_an_output_range_past_its_region_is_invalid(
    clients: dict[str, Any], regions: list[Any], kind: str
) -> None:
    """shared_memory_test.py test_infer_byte_size_out_of_bound."""
    message = _message(
        _shm_infer, kind, clients[kind], regions, output_offset=1, register_offset=_PAGE
    )
    assert "Invalid offset + byte size for shared memory region" in message


def test_an_output_range_that_overflows_is_named(
    clients: dict[str, Any], regions: list[Any]
) -> None:
    """shared_memory_test.py test_infer_integer_overflow (REST: gRPC's client cannot send it)."""
    message = _message(
        _shm_infer, "http", clients["http"], regions, output_offset=32, output_size=2**64 - 32
    )
    assert "Integer overflow detected: byte_size " in message


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_a_registration_past_the_object_is_invalid_args(
    clients: dict[str, Any], regions: list[Any], kind: str
) -> None:
    """shared_memory_test.py test_register_out_of_bound: four ranges past a 64-byte object."""
    client = clients[kind]
    _, key = _region(regions, "bounds", _SHM_BYTES)
    for size, offset in ((65, 0), (64, 1), (1, 64), (0, 65)):
        message = _message(client.register_system_shared_memory, "bounds", key, size,
                           offset=offset)  # fmt: skip
        assert "failed to register shared memory region" in message
        assert "invalid args" in message


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_reserved_and_invalid_keys_are_refused(clients: dict[str, Any], kind: str) -> None:
    """shared_memory_test.py test_register_reserved_names and test_register_invalid_shm_key."""
    client = clients[kind]
    prefix = "triton_python_backend_shm_region_"
    for key in (f"{prefix}_k", f"/{prefix}_k", f"///{prefix}_k"):
        assert (
            f"cannot register shared memory region 'my_test_shm_name' with key '{key}' as the "
            f"key contains the reserved prefix '{prefix}'"
        ) in _message(client.register_system_shared_memory, "my_test_shm_name", key, 10000)
    for key in ("/", "///"):
        assert (
            f"cannot register shared memory region 'my_test_shm_name' - invalid shm key '{key}'"
        ) in _message(client.register_system_shared_memory, "my_test_shm_name", key, 10000)


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_the_status_of_an_unknown_region_is_not_found(clients: dict[str, Any], kind: str) -> None:
    """shared_memory_test.py TestSharedMemoryUnregister._test_shm_not_found."""
    message = _message(clients[kind].get_system_shared_memory_status, "nowhere")
    assert "Unable to find system shared memory region: 'nowhere'" in message


# -- qa/L0_input_validation/input_validation_test.py ---------------------------------------------
@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_more_data_than_the_shape_is_a_byte_size_mismatch(
    clients: dict[str, Any], kind: str
) -> None:
    """input_validation_test.py InputShapeTest.test_input_shape_validation: data of 18 values
    sent with a shape of 16."""
    a = np.arange(18, dtype=np.int32)[None]
    inputs = _two_inputs(kind, a, a)
    inputs[0].set_shape([1, 16])
    inputs[1].set_shape([1, 16])
    message = _message(clients[kind].infer, "simple", inputs)
    assert (
        "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 72"
        in message
    )


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_an_input_region_smaller_than_the_shape_is_a_byte_size_mismatch(
    clients: dict[str, Any], regions: list[Any], kind: str
) -> None:
    """input_validation_test.py InputShapeTest.test_wrong_input_shape_tensor_size: an input in
    shared memory whose byte size is one element short."""
    client = clients[kind]
    handle, key = _region(regions, "INPUT0_SHM", 60)
    shm.set_shared_memory_region(handle, [np.arange(15, dtype=np.int32)])
    client.register_system_shared_memory("INPUT0_SHM", key, 60)
    inputs = _two_inputs(kind, np.zeros((1, 16), np.int32), np.zeros((1, 16), np.int32))
    inputs[0].set_shared_memory("INPUT0_SHM", 60)
    message = _message(client.infer, "simple", inputs)
    assert (
        "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 60"
        in message
    )


# -- qa/L0_server_status/server_status_test.py ---------------------------------------------------
@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_server_and_model_metadata(clients: dict[str, Any], kind: str) -> None:
    """server_status_test.py test_basic and test_model_latest_infer: the server's extensions
    (those torchplace implements of the list: not ``sequence``, and ``cuda_shared_memory`` only
    as refusals, so unlisted; the name is torchplace's own, not ``triton``), and a model's name,
    versions, and INT32 inputs and outputs of shape [-1, 16]."""
    client = clients[kind]
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    extensions = meta["extensions"] if kind == "http" else list(meta.extensions)
    for ext in ("classification", "model_repository", "schedule_policy", "model_configuration",
                "system_shared_memory", "binary_tensor_data", "statistics"):  # fmt: skip
        assert ext in extensions
    model = client.get_model_metadata("versioned")
    if kind == "grpc":
        model = {"name": model.name, "versions": list(model.versions),
                 "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                            for t in model.inputs],
                 "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
                             for t in model.outputs]}  # fmt: skip
    assert model["name"] == "versioned"
    assert sorted(model["versions"]) == ["1", "2"]
    assert sorted(t["name"] for t in model["inputs"]) == ["INPUT0", "INPUT1"]
    assert sorted(t["name"] for t in model["outputs"]) == ["OUTPUT0", "OUTPUT1"]
    for tensor in model["inputs"] + model["outputs"]:
        assert (tensor["datatype"], tensor["shape"]) == ("INT32", [-1, 16])
    for version in ("1", "2"):
        assert client.is_model_ready("versioned", model_version=version)
    assert not client.is_model_ready("versioned", model_version="3")


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_unknown_models_and_versions_are_named(clients: dict[str, Any], kind: str) -> None:
    """server_status_test.py test_unknown_model and test_unknown_model_version."""
    client = clients[kind]
    assert _message(client.get_model_metadata, "foo").startswith(
        "Request for unknown model: 'foo' is not found"
    )
    assert _message(client.get_model_metadata, "simple", model_version="99").startswith(
        "Request for unknown model: 'simple' version 99 is not found"
    )


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_statistics_per_version_count_only_that_version(clients: dict[str, Any], kind: str) -> None:
    """server_status_test.py test_model_latest_infer and test_model_specific_infer: one entry
    per version, the inferences counted on the version that ran them; with no model named,
    every ready version of every model."""
    client = clients[kind]
    a = np.arange(16, dtype=np.int32)[None]

    def success(version: str) -> int:
        doc = client.get_inference_statistics("versioned", model_version=version)
        stats = doc["model_stats"] if kind == "http" else doc.model_stats
        assert len(stats) == 1
        entry = stats[0]
        if kind == "http":
            assert entry["version"] == version
            return int(entry["inference_stats"]["success"]["count"])
        assert entry.version == version
        return int(entry.inference_stats.success.count)

    before = {v: success(v) for v in ("1", "2")}
    for _ in range(3):
        client.infer("versioned", _two_inputs(kind, a, a), model_version="1")
    assert success("1") == before["1"] + 3
    assert success("2") == before["2"]
    doc = client.get_inference_statistics("versioned")
    stats = doc["model_stats"] if kind == "http" else doc.model_stats
    assert len(stats) == 2
    every = client.get_inference_statistics()
    every_stats = every["model_stats"] if kind == "http" else every.model_stats
    names = {(s["name"], s["version"]) if kind == "http" else (s.name, s.version)
             for s in every_stats}  # fmt: skip
    assert {("simple", "1"), ("seed", "1"), ("versioned", "1"), ("versioned", "2")} <= names


# -- qa/L0_parameters/parameters_test.py ---------------------------------------------------------
@pytest.mark.parametrize("kind", ["http", "grpc"])
@pytest.mark.parametrize(
    "parameters",
    [
        {"key1": "value1", "key2": "value2"},
        {"key1": 1, "key2": 2},
        {"key1": 123.123, "key2": 321.321},
        {"key1": True, "key2": "value2"},
    ],
)
def test_custom_request_parameters_are_taken(
    clients: dict[str, Any], kind: str, parameters: dict[str, Any]
) -> None:
    """parameters_test.py test_params: strings, integers, doubles and booleans, over REST and
    gRPC (the identity-of-parameters model is Triton's; here the request is answered)."""
    a = np.arange(16, dtype=np.int32)[None]
    result = clients[kind].infer("simple", _two_inputs(kind, a, a), parameters=parameters)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def test_reserved_parameters_are_refused_by_the_server_over_rest(rest: Client) -> None:
    """parameters_test.py test_params_reserved_rejected: the ``triton_`` keys are refused by the
    server itself (400, "reserved for Triton usage"), the others by Triton's clients."""
    body = {"inputs": [_entry("INPUT0"), _entry("INPUT1")]}
    for key in ("triton_enable_empty_final_response", "triton_final_response",
                "triton_injected_via_header"):  # fmt: skip
        status, doc = _post(rest, {**body, "parameters": {key: "dummy-value"}})
        assert status == 400
        assert "reserved for Triton usage" in doc["error"]


# -- qa/L0_lifecycle/lifecycle_test.py: the load and unload API ----------------------------------
@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_loading_what_the_repository_lacks_fails_the_poll(
    clients: dict[str, Any], kind: str
) -> None:
    """lifecycle_test.py test_load_unknown_model (and test_file_override without a config)."""
    client = clients[kind]
    assert "failed to load 'unknown_model', failed to poll from model repository" in _message(
        client.load_model, "unknown_model"
    )
    assert "failed to load 'unknown_model', failed to poll from model repository" in _message(
        client.load_model, "unknown_model", files={"file:1/model.onnx": b"abc"}
    )


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_a_model_whose_configuration_is_invalid_fails_to_load(
    clients: dict[str, Any], kind: str
) -> None:
    """lifecycle_test.py test_config_override: a configuration that does not parse is
    "load failed for model 'x'"; the server stays ready."""
    client = clients[kind]
    message = _message(client.load_model, "bad_config")
    assert "load failed for model 'bad_config'" in message or "failed to load 'bad_config'" in (
        message
    )
    assert client.is_server_live()


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_an_unloaded_model_has_no_available_versions(
    server: ServerThread, clients: dict[str, Any], kind: str
) -> None:
    """lifecycle_test.py test_parse_error_modelfail and others: inference on a model that was
    unloaded is "Request for unknown model: 'x' has no available versions"; the repository
    index lists it UNAVAILABLE; loading it again serves it."""
    client = clients[kind]
    a = np.arange(16, dtype=np.int32)[None]
    client.unload_model("versioned")
    try:
        assert not client.is_model_ready("versioned")
        assert "Request for unknown model: 'versioned' has no available versions" in _message(
            client.infer, "versioned", _two_inputs(kind, a, a)
        )
        index = client.get_model_repository_index()
        if kind == "grpc":
            index = [{"name": m.name, "state": m.state} for m in index.models]
        states = {m["state"] for m in index if m["name"] == "versioned"}
        assert states == {"UNAVAILABLE"}
    finally:
        client.load_model("versioned")
    assert client.is_model_ready("versioned")
    result = client.infer("versioned", _two_inputs(kind, a, a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - a)


# -- qa/L0_grpc_state_cleanup/cleanup_test.py ----------------------------------------------------
def test_a_stream_outlives_its_requests_errors_and_cancellation(server: ServerThread) -> None:
    """cleanup_test.py test_simple_infer, test_streaming_infer and test_simple_infer_error_status
    (without the restricted protocol): a stream answers each request by id, a failed request
    does not end it, and a cancelled call leaves the server serving."""
    answers: list[Any] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        answers.append(error if error is not None else result)
        if len(answers) == 3:
            done.set()

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        a = np.arange(16, dtype=np.int32)[None]
        client.start_stream(callback=callback)
        client.async_stream_infer("simple", _two_inputs("grpc", a, a), request_id="1")
        client.async_stream_infer("simple", _two_inputs("grpc", a, a[:, :8]), request_id="2")
        client.async_stream_infer("simple", _two_inputs("grpc", a, a), request_id="3")
        assert done.wait(30)
        client.stop_stream()
        good = [r for r in answers if not isinstance(r, InferenceServerException)]
        assert sorted(r.get_response().id for r in good) == ["1", "3"]
        assert sum(isinstance(r, InferenceServerException) for r in answers) == 1
        future = client.async_infer(
            "simple", _two_inputs("grpc", a, a), callback=lambda *_, **__: None
        )  # called with keywords, at once when the answer came first
        future.cancel()
        assert client.is_server_live()
        result = client.infer("simple", _two_inputs("grpc", a, a), client_timeout=30)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    finally:
        client.close()


def test_a_client_deadline_is_deadline_exceeded(start_server: StartServer) -> None:
    """qa/L0_client_timeout/client_infer_timeout_test.py test_grpc_infer and test_http_infer: a
    request slower than the client's timeout fails with "Deadline Exceeded" (gRPC) or "timed
    out" (REST), and the server goes on serving."""
    running = start_server(FakeEngine(delay_s=1.0))
    x = np.full((1, 8), 0.5, np.float32)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.thread.grpc_port}")
    http = httpclient.InferenceServerClient(f"127.0.0.1:{running.port}", network_timeout=0.2)
    try:
        entry = grpcclient.InferInput("input", [1, 8], "FP32")
        entry.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException, match="Deadline Exceeded"):
            grpc.infer("seed-mlp", [entry], client_timeout=0.2)
        rest_entry = httpclient.InferInput("input", [1, 8], "FP32")
        rest_entry.set_data_from_numpy(x)
        with pytest.raises(Exception, match="timed out"):
            http.infer("seed-mlp", [rest_entry])
        assert grpc.is_server_live()
    finally:
        grpc.close()
        http.close()


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_the_statistics_of_an_unknown_model_are_not_found(
    clients: dict[str, Any], kind: str
) -> None:
    """server_status_test.py test_unknown_model, for the statistics extension: a model the
    server does not serve has no statistics, in the words of its other APIs."""
    client = clients[kind]
    assert _message(client.get_inference_statistics, "foo").startswith(
        "Request for unknown model: 'foo' is not found"
    )
    assert _message(client.get_inference_statistics, "simple", model_version="99").startswith(
        "Request for unknown model: 'simple' version 99 is not found"
    )


def test_a_compressed_or_chunked_body_over_the_limit_is_named_in_tritons_words(
    start_server: StartServer,
) -> None:
    """qa/L0_http/http_input_size_limit_test.py test_default_limit_compressed (a gzip body that
    inflates past the limit: "exceeds the maximum allowed value") and test_large_string_in_json
    (a body over the limit, here sent chunked, so its size is not known ahead). Triton answers
    400; torchplace 413, as for every body over --max-body-bytes (docs/serve.md, Errors)."""
    running = start_server(max_body_bytes=4096)
    inflating = gzip.compress(b'{"inputs": []' + b" " * 8192 + b"}")
    status, _, data = running.client.post(
        "/v2/models/seed-mlp/infer", inflating, headers={**_JSON, "Content-Encoding": "gzip"}
    )
    assert status == 413
    assert "exceeds the maximum allowed value" in orjson.loads(data)["error"]
    chunk = b" " * 3000
    body = b"".join(b"%X\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3)) + b"0\r\n\r\n"
    request = raw_request(body, path=b"/v2/models/seed-mlp/infer",
                          headers={b"Transfer-Encoding": b"chunked"})  # fmt: skip
    status, answer = answer_of(running.port, request)
    assert status == 413
    assert b"request JSON size" in answer
    assert b" exceeds the maximum allowed input size" in answer
