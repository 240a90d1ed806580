"""Where Triton's own examples and QA tests pin the protocol's edge cases, torchplace answers alike.

Each case names what defines it: Triton's client examples (``src/python/examples`` of
triton-inference-server/client, run unchanged against ``torchplace serve``), its server QA tests
(``qa/L0_*`` of triton-inference-server/server) and its protocol extension documents. A real
server serves Triton's ``simple`` model (``tests/serve/addsub_model.py``) from a repository in
explicit model control mode, over REST and gRPC, with client shared memory allowed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.errors import InputError
from torchplace.models import TensorSpec
from torchplace.serve import protocol
from torchplace.serve.classification import MAX_CLASSIFIED, classify
from torchplace.serve.running import ServerThread

from .conftest import Client, test_config

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
from tritonclient.utils import InferenceServerException  # noqa: E402

from torchplace.serve.grpc_codec import decode_infer_request as decode_grpc  # noqa: E402
from torchplace.serve.proto import grpc_service_pb2 as pb  # noqa: E402

IN = (TensorSpec("INPUT0", "INT32", (-1, 16)), TensorSpec("INPUT1", "INT32", (-1, 16)))
OUT = (TensorSpec("OUTPUT0", "INT32", (-1, 16)), TensorSpec("OUTPUT1", "INT32", (-1, 16)))
SIMPLE = 'source = "tests.serve.addsub_model:build"\n'
MISSING_BOTH = (
    "expected 2 inputs but got 0 inputs for model 'simple'. Got input(s) [], but missing "
    "required input(s) ['INPUT0','INPUT1']. Please provide all required input(s)."
)
MISSING_ONE = (
    "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], but "
    "missing required input(s) ['INPUT1']. Please provide all required input(s)."
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("repository")
    for name in ("simple", "other"):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.toml").write_text(SIMPLE)
    for version in ("1", "2"):
        (root / "versioned" / version).mkdir(parents=True)
    (root / "versioned" / "config.toml").write_text(SIMPLE + "[version_policy]\nall = true\n")
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "config.toml").write_text(SIMPLE)
    (root / "broken" / "1" / "model.safetensors").write_bytes(b"not a safetensors file")
    config = test_config(
        device="cpu",
        model_repository=root,
        model_control_mode="explicit",
        load_models=("simple",),
        allow_client_shm=True,
    )
    with ServerThread(config) as thread:
        yield thread


@pytest.fixture
def rest(server: ServerThread) -> Client:
    return Client("127.0.0.1", server.port)


_OPEN: list[Any] = []


def _client(server: ServerThread, kind: str) -> Any:
    """A tritonclient of ``kind`` for ``server``, closed after the test."""
    client: Any
    if kind == "http":
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    else:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    _OPEN.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def _module(kind: str) -> Any:
    return httpclient if kind == "http" else grpcclient


def _input(kind: str, name: str, array: np.ndarray) -> Any:
    entry = _module(kind).InferInput(name, list(array.shape), "INT32")
    entry.set_data_from_numpy(array)
    return entry


def _entry(name: str, **override: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "datatype": "INT32", "shape": [1, 16]}
    entry["data"] = list(range(16)) if name == "INPUT0" else [1] * 16
    entry.update(override)
    return entry


def _error(client: Client, path: str, body: object) -> tuple[int, str]:
    status, _, data = client.post(path, orjson.dumps(body), headers=_JSON)
    return status, orjson.loads(data)["error"]


_JSON = {"Content-Type": "application/json"}
INFER = "/v2/models/simple/infer"


# -- inference ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_missing_inputs_are_listed_in_tritons_words(server: ServerThread, kind: str) -> None:
    """qa/L0_input_validation: no inputs, or some missing, names them as Triton does."""
    client = _client(server, kind)
    with pytest.raises(InferenceServerException) as none:
        client.infer("simple", [])
    assert MISSING_BOTH in none.value.message()
    one = _input(kind, "INPUT0", np.zeros((1, 16), np.int32))
    with pytest.raises(InferenceServerException) as missing:
        client.infer("simple", [one])
    assert MISSING_ONE in missing.value.message()


def test_an_empty_inputs_array_is_counted_over_rest(rest: Client) -> None:
    status, message = _error(rest, INFER, {"inputs": []})
    assert (status, MISSING_BOTH in message) == (400, True)


def test_an_empty_outputs_array_asks_for_every_output(rest: Client) -> None:
    """OIP: outputs absent means all of them; Triton reads an empty array the same way."""
    body = {"inputs": [_entry("INPUT0"), _entry("INPUT1")], "outputs": []}
    status, _, data = rest.post(INFER, orjson.dumps(body), headers=_JSON)
    assert status == 200
    outputs = {o["name"]: o["data"] for o in orjson.loads(data)["outputs"]}
    assert outputs == {"OUTPUT0": list(range(1, 17)), "OUTPUT1": list(range(-1, 15))}


def test_an_empty_outputs_list_over_grpc_asks_for_every_output(server: ServerThread) -> None:
    client = _client(server, "grpc")
    a, b = np.arange(16, dtype=np.int32)[None], np.ones((1, 16), np.int32)
    result = client.infer("simple", [_input("grpc", "INPUT0", a), _input("grpc", "INPUT1", b)],
                          outputs=[])  # fmt: skip
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_an_unknown_version_is_named_as_triton_does(server: ServerThread, kind: str) -> None:
    """qa/L0_server_status: the version is not quoted."""
    client = _client(server, kind)
    for call in (client.get_model_metadata, client.get_model_config):
        with pytest.raises(InferenceServerException) as err:
            call("simple", model_version="99")
        assert err.value.message().startswith(
            "Request for unknown model: 'simple' version 99 is not found"
        )


def test_json_nested_past_tritons_depth_limit_is_refused(rest: Client) -> None:
    """qa/L0_http test_json_recursion_depth_limit: 120 levels refused, 50 read."""

    def nested(depth: int, values: list[int]) -> Any:
        for _ in range(depth):
            values = [values]  # type: ignore[list-item]
        return values

    deep = {"inputs": [_entry("INPUT0", data=nested(120, [1] * 16)), _entry("INPUT1")]}
    status, message = _error(rest, INFER, deep)
    assert status == 400
    assert "JSON nesting depth exceeds maximum allowed limit (100)" in message
    fine = {"inputs": [_entry("INPUT0", data=nested(50, list(range(16)))), _entry("INPUT1")]}
    status, _, data = rest.post(INFER, orjson.dumps(fine), headers=_JSON)
    assert status == 200, data
    assert orjson.loads(data)["outputs"][0]["data"] == list(range(1, 17))


def test_triton_prefixed_parameters_are_reserved(rest: Client) -> None:
    """qa/L0_parameters and docs/protocol/extension_parameters.md: ``triton_*`` is Triton's."""
    body = {"inputs": [_entry("INPUT0"), _entry("INPUT1")]}
    for key in ("triton_enable_empty_final_response", "triton_final_response"):
        status, message = _error(rest, INFER, {**body, "parameters": {key: "dummy-value"}})
        assert (status, "reserved for Triton usage" in message) == (400, True)
    custom = {**body, "parameters": {"key1": "value1", "key2": 2, "key3": True}}
    assert rest.post(INFER, orjson.dumps(custom), headers=_JSON)[0] == 200


def test_triton_prefixed_parameters_are_reserved_over_grpc() -> None:
    message = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        tensor = message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend([1] * 16)
    message.parameters["triton_enable_empty_final_response"].bool_param = True  # Triton's gRPC
    assert decode_grpc(message, inputs=IN, outputs=OUT, max_rows=8).rows == 1  # takes this one
    message.parameters["triton_final_response"].bool_param = True
    with pytest.raises(InputError, match="reserved for Triton usage"):
        decode_grpc(message, inputs=IN, outputs=OUT, max_rows=8, model="simple")


def test_classes_of_a_bool_output_are_refused_in_tritons_words() -> None:
    """qa/L0_parameters class_count_test: the unsupported type named as Triton names it."""
    with pytest.raises(InputError) as err:
        protocol.class_count("OUTPUT0", "BOOL", 3)
    assert "class result not available for output due to unsupported type 'BOOL'" in str(err.value)


def test_classes_of_a_row_over_a_million_values_are_refused() -> None:
    """qa/L0_parameters class_count_test: Triton ranks at most 1,000,000 values a row."""
    assert len(classify(np.ones((1, MAX_CLASSIFIED), np.float32), "FP32", 5)[0]) == 5
    with pytest.raises(InputError, match="classification output tensor too large"):
        classify(np.ones((1, MAX_CLASSIFIED + 1), np.float32), "FP32", 5)


def test_statistics_carry_every_field_of_the_extension(rest: Client) -> None:
    """docs/protocol/extension_statistics.md: ``response_stats`` too (empty here)."""
    status, _, data = rest.get("/v2/models/simple/stats")
    (stat,) = orjson.loads(data)["model_stats"]
    assert status == 200
    assert stat["response_stats"] == {}
    assert {"batch_stats", "memory_usage", "inference_stats"} <= set(stat)


# -- model repository -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_simple_model_control_example(server: ServerThread, kind: str) -> None:
    """simple_{http,grpc}_model_control.py: a config override that is not JSON fails with
    'failed to load'; a Triton config with max_batch_size as a string is read; an unknown
    model's load fails with 'failed to load'."""
    client = _client(server, kind)
    client.load_model("simple")
    with pytest.raises(InferenceServerException) as bad:
        client.load_model("simple", config='"parameters": {"config": {{"max_batch_size": "16"}}}')
    assert "failed to load" in bad.value.message()
    try:
        client.load_model("simple", config='{"max_batch_size":"16"}')
        config = client.get_model_config("simple")
        size = config["max_batch_size"] if kind == "http" else config.config.max_batch_size
        assert size == 16
    finally:
        client.load_model("simple", config='{"max_batch_size": 32}')
    with pytest.raises(InferenceServerException) as unknown:
        client.load_model("wrong_model_name")
    assert (
        "failed to load 'wrong_model_name', failed to poll from model repository"
        in unknown.value.message()
    )  # qa/L0_lifecycle's words
    assert client.is_model_ready("simple")


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_unloaded_models_and_versions_are_named_as_triton_does(
    server: ServerThread, kind: str
) -> None:
    """qa/L0_lifecycle: a version the policy dropped 'is not at ready state'; a model unloaded
    'has no available versions'; a name never seen 'is not found'."""
    client = _client(server, kind)
    a, b = np.arange(16, dtype=np.int32)[None], np.ones((1, 16), np.int32)
    inputs = [_input(kind, "INPUT0", a), _input(kind, "INPUT1", b)]
    client.load_model("versioned")
    try:
        assert client.infer("versioned", inputs, model_version="1").as_numpy("OUTPUT0") is not None
        client.load_model("versioned", config='{"version_policy": {"specific": {"versions": [2]}}}')
        with pytest.raises(InferenceServerException) as err:
            client.infer("versioned", inputs, model_version="1")
        assert (
            "Request for unknown model: 'versioned' version 1 is not at ready state"
            in err.value.message()
        )
        with pytest.raises(InferenceServerException) as err:
            client.infer("versioned", inputs, model_version="7")
        assert "Request for unknown model: 'versioned' version 7 is not found" in str(err.value)
    finally:
        client.unload_model("versioned")
    with pytest.raises(InferenceServerException) as err:
        client.infer("versioned", inputs)
    assert "Request for unknown model: 'versioned' has no available versions" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer("never_seen", inputs)
    assert "Request for unknown model: 'never_seen' is not found" in err.value.message()


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_a_version_that_does_not_build_is_named_as_triton_does(
    server: ServerThread, kind: str
) -> None:
    """qa/L0_lifecycle test_model_control_fail: every attempt says which version failed."""
    client = _client(server, kind)
    for _ in range(2):
        with pytest.raises(InferenceServerException) as err:
            client.load_model("broken")
        assert "load failed for model 'broken'" in err.value.message()
        assert "version 1 is at UNAVAILABLE state" in err.value.message()
    assert not client.is_model_ready("broken", "1")


TRAVERSAL = ["../etc", "a/../b", "../../etc/passwd", "model/..", "..", "/etc/passwd",
             "model/subdir", "model/", " ..", ".. "]  # fmt: skip


def test_model_names_are_checked_as_triton_checks_them(server: ServerThread) -> None:
    """qa/L0_input_validation ModelNameValidationTest (over gRPC, where any name arrives)."""
    client = _client(server, "grpc")
    for name in TRAVERSAL:
        with pytest.raises(InferenceServerException) as err:
            client.load_model(name)
        assert "model name must not contain path traversal characters" in err.value.message()
    for name in ["", " ", "   ", "\t", "\n", " \t \n "]:
        with pytest.raises(InferenceServerException) as err:
            client.load_model(name)
        assert "Model name cannot be empty. Please enter a valid name to deploy." in str(err.value)
    for name in TRAVERSAL:  # an unload does not check names (nothing of that name is loaded)
        client.unload_model(name)
    for name in ["model123", "model.version1", "...", "..my_model", "model..1", "model....1"]:
        with pytest.raises(InferenceServerException) as err:
            client.load_model(name)
        assert "path traversal characters" not in err.value.message()
        assert "failed to poll from model repository" in err.value.message()


def test_a_file_parameter_no_file_system_takes_fails_the_poll(
    server: ServerThread, rest: Client
) -> None:
    """qa/L0_http test_load_oversized_file_parameter and simple_grpc_model_control.py: a path
    component over NAME_MAX is Triton's internal error, and the server stays up."""
    long_path = "file:" + "A" * 256
    body = {"parameters": {long_path: "YQ==", "config": "{}"}}
    status, message = _error(rest, "/v2/repository/models/simple/load", body)
    assert (status, "failed to poll from model repository" in message) == (500, True)
    client = _client(server, "grpc")
    with pytest.raises(InferenceServerException) as err:
        client.load_model("simple", config="{}", files={long_path: b"a"})
    assert err.value.status() == "StatusCode.INTERNAL"
    assert "failed to poll from model repository" in err.value.message()
    assert client.is_server_live()
    assert client.is_model_ready("simple")


def test_a_deeply_nested_ready_is_not_a_boolean(rest: Client) -> None:
    """qa/L0_http test_repository_index_deeply_nested_json."""
    depth = 250_000
    payload = ('{"ready":' + "[" * depth + "true" + "]" * depth + "}").encode()
    status, _, data = rest.post("/v2/repository/index", payload, headers=_JSON)
    assert status == 400
    assert "Invalid value for 'ready': expected a boolean" in orjson.loads(data)["error"]
    assert rest.get("/v2/health/live")[0] == 200


# -- shared memory --------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_shared_memory_registration_errors_in_tritons_words(
    server: ServerThread, kind: str
) -> None:
    """qa/L0_shared_memory and qa/L0_grpc/python_grpc_aio_test: an object that does not open is
    an internal error; reserved keys; CUDA registration's 'invalid args'."""
    client = _client(server, kind)
    key = f"/tp_conformance_{uuid.uuid4().hex[:8]}"
    with pytest.raises(InferenceServerException) as err:
        client.register_system_shared_memory("test_shm", key, 0)
    assert f"Unable to open shared memory region: '{key}'" in err.value.message()
    assert err.value.status() in ("500", "StatusCode.INTERNAL")
    prefix = "triton_python_backend_shm_region_"
    for shm_key in (f"{prefix}_key", f"/{prefix}_key", f"///{prefix}_key"):
        with pytest.raises(InferenceServerException) as err:
            client.register_system_shared_memory("my_test_shm_name", shm_key, 10000)
        assert (
            f"cannot register shared memory region 'my_test_shm_name' with key '{shm_key}' as "
            f"the key contains the reserved prefix '{prefix}'"
        ) in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.register_cuda_shared_memory("", b"", 0, 0)
    assert "failed to register shared memory region" in err.value.message()
    assert "invalid args" in err.value.message()


def test_tritons_shared_memory_example_steps_still_run(server: ServerThread) -> None:
    """simple_http_shm_client.py's steps, after the checks above changed messages."""
    client = _client(server, "http")
    data = np.arange(16, dtype=np.int32)[None]
    handle = shm.create_shared_memory_region("conf_in", "/tp_conf_in", data.nbytes)
    try:
        shm.set_shared_memory_region(handle, [data])
        client.register_system_shared_memory("conf_in", "/tp_conf_in", data.nbytes)
        first = httpclient.InferInput("INPUT0", [1, 16], "INT32")
        first.set_shared_memory("conf_in", data.nbytes)
        second = _input("http", "INPUT1", np.ones((1, 16), np.int32))
        result = client.infer("simple", [first, second])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 1)
    finally:
        client.unregister_system_shared_memory("conf_in")
        shm.destroy_shared_memory_region(handle)


def test_examples_model_repository_index_format(rest: Client) -> None:
    """docs/protocol/extension_model_repository.md: a model never loaded has its name only."""
    status, _, data = rest.post("/v2/repository/index", b"", headers=_JSON)
    index = {e["name"]: e for e in orjson.loads(data)}
    assert status == 200
    assert index["other"] == {"name": "other"}
    assert (index["simple"]["state"], index["simple"]["version"]) == ("READY", "1")
