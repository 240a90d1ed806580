"""Conformance with MLServer (``SeldonIO/MLServer``), the other Open Inference Protocol server
that publishes its own test suite: the requests of its tests and test data (``tests/rest``,
``tests/grpc``, ``tests/testdata``), and what its types (``mlserver/types``) and codecs
(``mlserver/codecs``, ``mlserver/grpc/converters.py``, ``mlserver/raw.py``) put on the wire
and read back.

Each test names the file of MLServer it comes from. Where MLServer differs from the protocol
text (``kserve/open-inference-protocol``) or from Triton, the test says which torchplace
follows. The wire tests always run; the client tests drive MLServer's own codecs in a child
interpreter and skip unless ``mlserver`` is importable there (see
:func:`tests.serve.test_kserve_clients.client_python`). One real server serves ``seed-mlp``
and :mod:`tests.serve.datatype_model`'s models over the OIP's datatypes.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.serve.running import ServerThread

from .conftest import Client, test_config
from .datatype_model import OIP, TYPED, WIDTH
from .test_kserve_clients import _run_client, client_python, reference

grpc = pytest.importorskip("grpc")
from torchplace.serve.proto import grpc_service_pb2 as pb  # noqa: E402

OIP_MODEL = "tests.serve.datatype_model-build_oip"
TYPED_MODEL = "tests.serve.datatype_model-build_typed"
INFER = "/v2/models/seed-mlp/infer"
_JSON = {"Content-Type": "application/json"}


def served_datatypes() -> Iterator[ServerThread]:
    """One real server of seed-mlp and the two datatype models (every OIP datatype), for a
    module's tests: started, handed out, stopped."""
    models = ("tests.serve.datatype_model:build_oip", "tests.serve.datatype_model:build_typed")
    config = test_config(model="seed-mlp", models=models, device="cpu")
    thread = ServerThread(config).start(timeout=120)
    try:
        yield thread
    finally:
        thread.stop()


served = pytest.fixture(scope="module", name="served")(served_datatypes)


@pytest.fixture
def rest(served: ServerThread) -> Client:
    return Client("127.0.0.1", served.port)


def _entry(**override: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": "input", "datatype": "FP32", "shape": [1, 8]}
    entry["data"] = [0.5] * 8
    entry.update(override)
    return entry


def _post(rest: Client, body: object, path: str = INFER) -> tuple[int, dict[str, Any]]:
    status, headers, data = rest.post(path, orjson.dumps(body), headers=_JSON)
    assert headers["content-type"] == "application/json"
    answer: dict[str, Any] = orjson.loads(data)
    return status, answer


def _stub(served: ServerThread, method: str, response: Any) -> Any:
    channel = grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}")
    _CHANNELS.append(channel)
    return channel.unary_unary(
        f"/inference.GRPCInferenceService/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response.FromString,
    )


_CHANNELS: list[Any] = []


@pytest.fixture(autouse=True)
def _close_channels() -> Iterator[None]:
    yield
    while _CHANNELS:
        _CHANNELS.pop().close()


def _grpc_error(call: Any, request: Any) -> tuple[Any, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)
    return info.value.code(), info.value.details() or ""


# -- what a request may carry ---------------------------------------------------------------
def test_content_type_parameters_at_every_level_are_taken(rest: Client) -> None:
    """mlserver/types/dataplane.py ``Parameters`` (``content_type``) on the request, each input
    and each requested output; MLServer's codecs (mlserver/codecs/numpy.py ``encode_input``,
    ``NumpyRequestCodec``) set it on every input they encode. A custom parameter is the
    server's to read or ignore (OIP inference_rest.md, Parameters)."""
    body = {
        "id": "ml-1",
        "parameters": {"content_type": "np"},
        "inputs": [_entry(parameters={"content_type": "np"})],
        "outputs": [{"name": "output", "parameters": {"content_type": "np"}}],
    }
    status, answer = _post(rest, body)
    assert status == 200, answer
    assert (answer["id"], [o["name"] for o in answer["outputs"]]) == ("ml-1", ["output"])


def test_the_response_has_the_fields_of_mlservers_inference_response(rest: Client) -> None:
    """mlserver/types/dataplane.py ``InferenceResponse``/``ResponseOutput`` (and the OIP's
    $inference_response): ``model_name`` and ``outputs`` always, ``model_version`` and ``id``
    as strings, each output's ``name``, ``shape``, ``datatype`` and ``data``; no field is
    ``null`` (MLServer's models are ``Optional[str]``, KServe's ``id`` is a plain ``str``)."""
    status, answer = _post(rest, {"id": "ml-2", "inputs": [_entry()]})
    assert status == 200
    assert set(answer) == {"model_name", "model_version", "id", "outputs"}
    assert (answer["model_name"], answer["model_version"], answer["id"]) == (
        "seed-mlp",
        "1",
        "ml-2",
    )
    (output,) = answer["outputs"]
    assert set(output) == {"name", "datatype", "shape", "data"}
    assert (output["name"], output["datatype"], output["shape"]) == ("output", "FP32", [1, 2])
    assert len(output["data"]) == 2
    assert b"null" not in orjson.dumps(answer)


@pytest.mark.parametrize(
    "nulls",
    [
        {"id": None},
        {"parameters": None},
        {"outputs": None},
        {"id": None, "parameters": None, "outputs": None},
    ],
    ids=["id", "parameters", "outputs", "all"],
)
def test_null_optional_request_fields_are_not_given(rest: Client, nulls: dict[str, Any]) -> None:
    """mlserver/types/dataplane.py ``InferenceRequest`` and KServe's v2_datamodels.py declare
    ``id``, ``parameters`` and ``outputs`` ``Optional[...] = None``: a client that dumps its
    model without ``exclude_none`` (pydantic's default ``model_dump()``) sends them as
    ``null``, which both servers read as absent."""
    status, answer = _post(rest, {"inputs": [_entry()], **nulls})
    assert status == 200, answer
    assert "id" not in answer
    assert [o["name"] for o in answer["outputs"]] == ["output"]


def test_null_parameters_of_an_input_and_an_output_are_not_given(rest: Client) -> None:
    """mlserver/types/dataplane.py ``RequestInput.parameters``/``RequestOutput.parameters``:
    ``Optional[Parameters] = None``, sent as ``null`` by a plain ``model_dump()``."""
    body = {
        "inputs": [_entry(parameters=None)],
        "outputs": [{"name": "output", "parameters": None}],
    }
    status, answer = _post(rest, body)
    assert status == 200, answer


def test_mlservers_sample_request_body_is_answered(rest: Client) -> None:
    """tests/testdata/batch_processing/single.txt: one compact JSON line, the form of
    MLServer's batch processor (``mlserver infer``), for a model of one input."""
    line = b'{"inputs":[{"name":"input","shape":[1,8],"datatype":"FP32","data":[1,2,3,4,5,6,7,8]}]}'
    status, _, data = rest.post(INFER, line, headers=_JSON)
    assert status == 200, data
    assert orjson.loads(data)["outputs"][0]["shape"] == [1, 2]


# -- what is refused, and how ---------------------------------------------------------------
def test_an_input_without_a_datatype_is_named(rest: Client) -> None:
    """tests/testdata/batch_processing/invalid.txt: an input with no ``datatype`` (MLServer's
    ``RequestInput.datatype`` is required; its batch processor counts the line invalid). The
    message said 'data-type is None', a Python word for a JSON client; it now names the field
    and the datatype to send."""
    for entry in (_entry(datatype=None), {k: v for k, v in _entry().items() if k != "datatype"}):
        status, answer = _post(rest, {"inputs": [entry]})
        assert status == 400
        message = answer["error"]
        assert "Unable to parse 'datatype' of input 'input'" in message
        assert "got none" in message
        assert 'send "datatype": "FP32"' in message
    status, answer = _post(rest, {"inputs": [_entry(datatype=32)]})
    assert status == 400
    assert "it must be a datatype string, got integer" in answer["error"]


def test_an_input_without_a_datatype_over_grpc_is_named(served: ServerThread) -> None:
    """The same over gRPC, where an unset ``datatype`` is the empty string."""
    request = pb.ModelInferRequest(model_name="seed-mlp")
    tensor = request.inputs.add(name="input", shape=[1, 8])
    tensor.contents.fp32_contents.extend([0.5] * 8)
    code, message = _grpc_error(_stub(served, "ModelInfer", pb.ModelInferResponse), request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "'datatype' of input 'input': it must be a datatype string, got none" in message
    assert not message.startswith("Unable to parse")  # JSON's words, not gRPC's


@pytest.mark.parametrize("kind", ["rest", "grpc"])
def test_an_invalid_datatype_is_refused(served: ServerThread, kind: str) -> None:
    """tests/rest/test_endpoints.py and tests/grpc/test_servicers.py
    test_infer_invalid_datatype_error (tests/testdata/inference-request-invalid-datatype.json,
    ``"datatype": "INT322"``): refused before the model runs. MLServer answers pydantic's 422
    over REST; torchplace answers 400 (the OIP: a failed inference is 'typically 400') in
    Triton's words, naming the datatype given and the one expected; gRPC INVALID_ARGUMENT."""
    if kind == "rest":
        status, answer = _post(
            Client("127.0.0.1", served.port), {"inputs": [_entry(datatype="INT322")]}
        )
        assert status == 400
        message = answer["error"]
    else:
        request = pb.ModelInferRequest(model_name="seed-mlp")
        tensor = request.inputs.add(name="input", datatype="INT322", shape=[1, 8])
        tensor.contents.int_contents.extend([1] * 8)
        tensor.parameters["content_type"].string_param = "np"
        code, message = _grpc_error(_stub(served, "ModelInfer", pb.ModelInferResponse), request)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "inference input 'input' data-type is 'INT322'" in message
    assert "expects 'FP32'" in message


@pytest.mark.parametrize("value", [{"x-foo": "bar"}, None], ids=["object", "null"])
def test_an_object_or_null_parameter_is_refused(rest: Client, value: object) -> None:
    """mlserver/types/dataplane.py ``Parameters``: ``headers: Optional[Dict[str, Any]]`` (MLServer
    fills it from the HTTP headers on its side) and ``content_type: Optional[str]``, so
    MLServer takes an object or a ``null`` there. The OIP's ``$parameter`` is a string, a
    number or a boolean, KServe's ``InferParameter`` (v2_datamodels.py) the same, and Triton
    refuses anything else; torchplace keeps to the text (docs/serve.md, Tensors) and says how
    to send a structure."""
    for where in ("request", "input", "output"):
        body: dict[str, Any] = {"inputs": [_entry()], "outputs": [{"name": "output"}]}
        target = {"request": body, "input": body["inputs"][0], "output": body["outputs"][0]}
        target[where]["parameters"] = {"headers": value}
        status, answer = _post(rest, body)
        assert status == 400, where
        assert "parameter 'headers' has invalid type" in answer["error"], where
        assert "encoded as a JSON string" in answer["error"]


def test_an_output_the_model_lacks_is_named(rest: Client) -> None:
    """tests/testdata/inference-request-with-output.json: ``outputs`` asks for
    "requested-output-0", which the model does not return: 400 naming it and the outputs it
    has (Triton's words first; MLServer leaves it to the model)."""
    body = {"inputs": [_entry()], "outputs": [{"name": "requested-output-0"}]}
    status, answer = _post(rest, body)
    assert status == 400
    message = answer["error"]
    assert "unexpected inference output 'requested-output-0' for model 'seed-mlp'" in message
    assert "'output' (FP32, shape [-1, 2])" in message


def test_a_bytes_input_is_refused_with_the_reason(rest: Client) -> None:
    """tests/testdata/batch_processing/bytes.txt and mlserver/codecs/string.py
    (``StringCodec``, ``Base64Codec``): strings as ``BYTES``. No torch tensor holds strings,
    so no served input takes them (docs/serve.md); the 400 says so."""
    entry = {"name": "input", "shape": [1, 8], "datatype": "BYTES", "data": ["a"] * 8}
    for parameters in (None, {"content_type": "str"}, {"content_type": "base64"}):
        status, answer = _post(rest, {"inputs": [{**entry, "parameters": parameters}]})
        assert status == 400
        assert "(BYTES is not a tensor type torch can take)" in answer["error"]


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/v2/models/my-model/versions/v0/infer", "'my-model' is not found"),
        ("/v2/models/my-model/infer", "'my-model' is not found"),
        ("/v2/models/seed-mlp/versions/v0/infer", "'seed-mlp' version v0 is not found"),
    ],
)
def test_an_unknown_model_or_version_is_404_with_an_error(
    rest: Client, path: str, words: str
) -> None:
    """tests/rest/test_endpoints.py test_infer_error: 404 ``{"error": ...}`` for a model or a
    version the server does not have (MLServer: 'Model my-model with version v0 not found')."""
    status, answer = _post(rest, {"inputs": [_entry()]}, path)
    assert status == 404
    assert set(answer) == {"error"}
    assert words in answer["error"]


def test_an_unknown_model_or_version_over_grpc_is_not_found(served: ServerThread) -> None:
    """tests/grpc/test_servicers.py test_model_infer_error (its request,
    tests/testdata/grpc/model-infer-request.json, asks for ``model_version`` "v1.2.3")."""
    call = _stub(served, "ModelInfer", pb.ModelInferResponse)
    for name, version, words in (
        ("my-model", "v1.2.3", "'my-model' is not found"),
        ("seed-mlp", "v1.2.3", "'seed-mlp' version v1.2.3 is not found"),
    ):
        request = pb.ModelInferRequest(model_name=name, model_version=version)
        tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 8])
        tensor.contents.fp32_contents.extend([0.5] * 8)
        tensor.parameters["content_type"].string_param = "np"
        code, message = _grpc_error(call, request)
        assert (code, words in message) == (grpc.StatusCode.NOT_FOUND, True), message


# -- the other endpoints --------------------------------------------------------------------
def test_health_and_versioned_model_ready(rest: Client) -> None:
    """tests/rest/test_endpoints.py test_live, test_ready, test_model_ready (with the
    version in the path): 200, with the OIP's bodies."""
    for path, body in (
        ("/v2/health/live", {"live": True}),
        ("/v2/health/ready", {"ready": True}),
        ("/v2/models/seed-mlp/ready", {"name": "seed-mlp", "ready": True}),
        ("/v2/models/seed-mlp/versions/1/ready", {"name": "seed-mlp", "ready": True}),
    ):
        status, headers, data = rest.get(path)
        assert (status, headers["content-type"], orjson.loads(data)) == (
            200,
            "application/json",
            body,
        ), path


def test_server_and_model_metadata_have_mlservers_fields(rest: Client) -> None:
    """tests/rest/test_endpoints.py test_metadata and test_model_metadata, validated there
    with ``MetadataServerResponse`` (``name``, ``version``, ``extensions``: strings) and
    ``MetadataModelResponse`` (``name``, ``platform``, ``versions``, ``inputs``, ``outputs``;
    each tensor's ``name``, ``datatype`` and ``shape``, -1 for a variable dimension)."""
    status, _, data = rest.get("/v2")
    server = orjson.loads(data)
    assert status == 200
    assert isinstance(server["name"], str)
    assert isinstance(server["version"], str)
    assert all(isinstance(e, str) for e in server["extensions"])
    status, _, data = rest.get(f"/v2/models/{OIP_MODEL}")
    model = orjson.loads(data)
    assert status == 200
    assert (model["name"], model["platform"], model["versions"]) == (OIP_MODEL, "pytorch", ["1"])
    assert model["inputs"] == [
        {"name": f"in_{dt}", "datatype": dt, "shape": [-1, WIDTH]} for dt in OIP
    ]
    assert {o["name"]: o["shape"] for o in model["outputs"]} == {
        f"out_{dt}": [-1, WIDTH] for dt in OIP
    }


def test_every_repository_index_entry_has_a_reason(rest: Client) -> None:
    """mlserver/types/model_repository.py ``RepositoryIndexResponseItem``: ``name``,
    ``version``, ``state`` and ``reason``, a required string (empty when there is none), as
    Triton's extension_model_repository.md lists it, not marked optional; KServe's
    model_repository_extension.py writes ``"reason": ""`` too. MLServer's client failed to
    read torchplace's index, which left an empty reason out (as Triton's server does)."""
    for body in (b"{}", b'{"ready": true}', b'{"ready": null}'):
        status, _, data = rest.post("/v2/repository/index", body, headers=_JSON)
        assert status == 200
        index = orjson.loads(data)
        assert {e["name"] for e in index} == {"seed-mlp", OIP_MODEL, TYPED_MODEL}
        for entry in index:
            assert entry == {"name": entry["name"], "version": "1", "state": "READY", "reason": ""}


def test_the_grpc_repository_index_has_every_field(served: ServerThread) -> None:
    """tests/grpc/test_servicers.py test_model_repository_index: the gRPC index (a ``reason``
    there is the empty string when unset, as protobuf's default)."""
    call = _stub(served, "RepositoryIndex", pb.RepositoryIndexResponse)
    index = call(pb.RepositoryIndexRequest(ready=True), timeout=30)
    assert sorted((m.name, m.version, m.state, m.reason) for m in index.models) == sorted(
        (name, "1", "READY", "") for name in ("seed-mlp", OIP_MODEL, TYPED_MODEL)
    )


def test_the_model_repository_service_of_mlserver_and_kserve_is_served(
    served: ServerThread,
) -> None:
    """proto/model_repository.proto (MLServer; KServe's docs publish the same): the repository
    extension as its own service, ``inference.model_repository.ModelRepositoryService``, with
    messages that match Triton's on the wire. It was UNIMPLEMENTED; it now answers as
    ``GRPCInferenceService``'s own repository RPCs do (a load refused by model control mode
    'none' is FAILED_PRECONDITION on both)."""
    channel = grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}")
    _CHANNELS.append(channel)

    def rpc(service: str, method: str, response: Any) -> Any:
        return channel.unary_unary(
            f"/{service}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response.FromString,
        )

    answers = {}
    for service in (
        "inference.GRPCInferenceService",
        "inference.model_repository.ModelRepositoryService",
    ):
        index = rpc(service, "RepositoryIndex", pb.RepositoryIndexResponse)(
            pb.RepositoryIndexRequest(), timeout=30
        )
        load = rpc(service, "RepositoryModelLoad", pb.RepositoryModelLoadResponse)
        code, message = _grpc_error(load, pb.RepositoryModelLoadRequest(model_name="my-model"))
        answers[service] = (sorted(m.name for m in index.models), code, message)
    repository, triton = answers.values()
    assert repository == triton
    assert repository[0] == sorted(("seed-mlp", OIP_MODEL, TYPED_MODEL))
    assert repository[1] == grpc.StatusCode.FAILED_PRECONDITION


def test_data_that_is_not_an_array_is_named(rest: Client) -> None:
    """tests/test_types.py test_tensor_data: MLServer's ``TensorData`` root is
    ``Union[List, Any]``, so a client may send a bare scalar; the OIP's $tensor_data is an
    array (KServe's ``RequestInput.data`` is a ``List``), and a scalar is refused. The
    message said only that 'data' is needed; it now says what came instead."""
    for data, kind in ((0.5, "number 0.5"), ("AAAA", "string 'AAAA'"), ({"a": 1}, "object")):
        status, answer = _post(rest, {"inputs": [_entry(data=data)]})
        assert status == 400
        assert (
            "input 'input' needs 'data', an array of 8 FP32 values, not " + kind in answer["error"]
        )


# -- MLServer's own codecs, in a child interpreter -------------------------------------------
_DTYPES = {
    "BOOL": "?",
    "UINT8": "u1",
    "UINT16": "u2",
    "UINT32": "u4",
    "UINT64": "u8",
    "INT8": "i1",
    "INT16": "i2",
    "INT32": "i4",
    "INT64": "i8",
    "FP16": "f2",
    "FP32": "f4",
    "FP64": "f8",
}


def edge_arrays(datatypes: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Two rows of :data:`WIDTH` values per datatype, with its extremes (the largest uint64,
    the smallest int64, float16's largest finite value...)."""
    arrays = {}
    for datatype in datatypes:
        dtype = np.dtype(_DTYPES[datatype])
        if datatype == "BOOL":
            array = np.array([[True, False, True], [False, False, True]])
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            array = np.array([[info.min, 1, info.max], [2, info.max - 1, 3]], dtype)
        else:
            big = float(np.finfo(dtype).max)
            array = np.array([[0.5, -1.25, 3.0], [big, 0.0, -2.0]], dtype)
        arrays[datatype] = array
    return arrays


#: :func:`edge_arrays`'s source, run in the child (which has numpy but not this package)
_EDGE = f"""
DTYPES = {_DTYPES!r}
WIDTH = {WIDTH}
def edge_arrays(datatypes):
    arrays = {{}}
    for datatype in datatypes:
        dtype = np.dtype(DTYPES[datatype])
        if datatype == "BOOL":
            array = np.array([[True, False, True], [False, False, True]])
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            array = np.array([[info.min, 1, info.max], [2, info.max - 1, 3]], dtype)
        else:
            big = float(np.finfo(dtype).max)
            array = np.array([[0.5, -1.25, 3.0], [big, 0.0, -2.0]], dtype)
        arrays[datatype] = array
    return arrays
"""

_MLSERVER = (
    """
import json, sys, urllib.error, urllib.request
import grpc, numpy as np
from mlserver.codecs import NumpyCodec
from mlserver.grpc import dataplane_pb2 as pb, dataplane_pb2_grpc
from mlserver.grpc import model_repository_pb2 as mr, model_repository_pb2_grpc
from mlserver.grpc.converters import (
    ModelInferRequestConverter, ModelInferResponseConverter, ModelMetadataResponseConverter,
    ServerMetadataResponseConverter)
from mlserver.types import (
    InferenceErrorResponse, InferenceRequest, InferenceResponse, MetadataModelResponse,
    MetadataServerResponse, Parameters, RequestOutput)
from mlserver.types.model_repository import RepositoryIndexRequest, RepositoryIndexResponse
"""
    + _EDGE
    + """
base, url, name, typed, datatypes = sys.argv[1:5] + [sys.argv[5].split(",")]
X = edge_arrays(datatypes)
found = {}

def http(method, path, body=None):
    headers = {"Content-Type": "application/json"} if body else {}
    call = urllib.request.Request(base + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(call, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()

def request(skip=(), **kw):
    inputs = [NumpyCodec.encode_input(f"in_{dt}", a) for dt, a in X.items() if dt not in skip]
    return InferenceRequest(id="ml-1", inputs=inputs, **kw)

def decoded(response):
    return {o.name: [o.datatype, NumpyCodec.decode_output(o).tolist()] for o in response.outputs}

status, body = http("POST", f"/v2/models/{name}/infer", request().model_dump_json().encode())
response = InferenceResponse.model_validate_json(body)
found["rest"] = [status, response.id, response.model_name, decoded(response)]
asked = request(parameters=Parameters(content_type="np"),
                outputs=[RequestOutput(name="out_INT64", parameters=Parameters(content_type="np"))])
status, body = http("POST", f"/v2/models/{name}/infer", asked.model_dump_json().encode())
found["asked"] = [status, decoded(InferenceResponse.model_validate_json(body))]
status, body = http("GET", f"/v2/models/{name}")
meta = MetadataModelResponse.model_validate_json(body)
found["metadata"] = [status, meta.name, meta.platform, meta.versions,
                     [[t.name, t.datatype, t.shape] for t in meta.inputs]]
status, body = http("GET", "/v2")
found["server"] = [status, MetadataServerResponse.model_validate_json(body).name]
index_request = json.dumps(RepositoryIndexRequest(ready=True).model_dump()).encode()
status, body = http("POST", "/v2/repository/index", index_request)
index = RepositoryIndexResponse.model_validate_json(body)
found["index"] = [status, sorted([m.name, m.version, getattr(m.state, "value", m.state), m.reason] for m in index)]
status, body = http("POST", "/v2/models/my-model/versions/v0/infer",
                    request().model_dump_json().encode())
found["unknown"] = [status, InferenceErrorResponse.model_validate_json(body).error]
with grpc.insecure_channel(url) as channel:
    stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
    for use_raw in (False, True):
        # FP16 has no typed contents field: only raw data carries it
        target, skip = (name, ()) if use_raw else (typed, ("FP16",))
        message = ModelInferRequestConverter.from_types(
            request(skip), model_name=target, use_raw=use_raw)
        answer = stub.ModelInfer(message, timeout=30)
        found[f"grpc {use_raw}"] = decoded(ModelInferResponseConverter.to_types(answer))
    meta = stub.ModelMetadata(pb.ModelMetadataRequest(name=name), timeout=30)
    meta = ModelMetadataResponseConverter.to_types(meta)
    found["grpc metadata"] = [meta.name, [[t.name, t.datatype, t.shape] for t in meta.inputs]]
    server = stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=30)
    found["grpc server"] = ServerMetadataResponseConverter.to_types(server).name
    for label, index_stub in (
        ("grpc index", stub),
        ("repository service", model_repository_pb2_grpc.ModelRepositoryServiceStub(channel)),
    ):
        message = (pb if index_stub is stub else mr).RepositoryIndexRequest(ready=True)
        index = index_stub.RepositoryIndex(message, timeout=30)
        found[label] = sorted([m.name, m.version, m.state, m.reason] for m in index.models)
print(json.dumps(found))
"""
)


def _rolled(datatypes: tuple[str, ...]) -> dict[str, list[Any]]:
    """What the datatype model answers for :func:`edge_arrays`: each row rolled by one."""
    return {
        f"out_{dt}": [dt, np.roll(a, 1, -1).tolist()] for dt, a in edge_arrays(datatypes).items()
    }


def test_mlserver_codecs_round_trip_every_datatype(served: ServerThread) -> None:
    """mlserver/codecs/numpy.py (``NumpyCodec.encode_input``/``decode_output``) over REST
    JSON, and mlserver/grpc/converters.py with typed contents and with ``use_raw``
    (mlserver/raw.py ``pack``): every OIP datatype at its extremes comes back exact; MLServer's
    own response, metadata and index models read torchplace's answers."""
    found = _run_client(
        "mlserver",
        _MLSERVER,
        f"http://127.0.0.1:{served.port}",
        f"127.0.0.1:{served.grpc_port}",
        OIP_MODEL,
        TYPED_MODEL,
        ",".join(OIP),
    )
    want = _rolled(OIP)
    assert found["rest"] == [200, "ml-1", OIP_MODEL, want]
    assert found["asked"] == [200, {"out_INT64": want["out_INT64"]}]
    inputs = [[f"in_{dt}", dt, [-1, WIDTH]] for dt in OIP]
    assert found["metadata"] == [200, OIP_MODEL, "pytorch", ["1"], inputs]
    assert found["server"] == [200, "torchplace"]
    assert found["index"] == [
        200,
        sorted([m, "1", "READY", ""] for m in ("seed-mlp", OIP_MODEL, TYPED_MODEL)),
    ]
    status, message = found["unknown"]
    assert (status, "'my-model' is not found" in message) == (404, True)
    assert found["grpc False"] == _rolled(TYPED)
    assert found["grpc True"] == want
    assert found["grpc metadata"] == [OIP_MODEL, inputs]
    assert found["grpc server"] == "torchplace"
    assert found["grpc index"] == found["repository service"] == found["index"][1]


_MLSERVER_INFER = """
import sys
from mlserver.cli.main import main
sys.argv = ["mlserver", "infer", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_mlservers_batch_client_runs_against_the_server(
    served: ServerThread, tmp_path: Any, binary: bool
) -> None:
    """mlserver/batch_processing.py (``mlserver infer``, its tests: tests/batch_processing and
    tests/testdata/batch_processing/*.txt): one request per line, sent in micro-batches of
    three (inputs joined along the batch dimension) through ``tritonclient.http.aio``, as
    JSON or binary data; each line's answer is split back out by its index, and a line
    MLServer's types refuse (no ``datatype``) is reported, not sent."""
    python, env = client_python("mlserver")
    x = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    lines = [
        {"inputs": [{"name": "input", "shape": [1, 8], "datatype": "FP32", "data": row.tolist()}]}
        for row in x
    ]
    lines[2]["id"] = "mine"
    text = "\n".join(orjson.dumps(line).decode() for line in lines)
    invalid = '{"inputs":[{"name":"input-0","shape":[1,3],"data":[1,2,3]}]}'  # invalid.txt
    source, target = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text(f"{text}\n{invalid}\n")
    args = ["-u", f"127.0.0.1:{served.port}", "-m", "seed-mlp", "-i", str(source)]
    args += ["-o", str(target), "-s", "3", "-w", "1", *(["-b"] if binary else [])]
    done = subprocess.run(
        [python, "-c", _MLSERVER_INFER, *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = {}
    for line in target.read_text().splitlines():
        answer = orjson.loads(line)
        answers[answer["parameters"]["batch_index"]] = answer
    assert sorted(answers) == list(range(7))
    assert "datatype" in orjson.dumps(answers[6]["error"]).decode()
    want = reference("seed-mlp", x)
    for index in range(6):
        answer = answers[index]
        assert (answer["model_name"], answer["model_version"]) == ("seed-mlp", "1")
        (output,) = answer["outputs"]
        assert output["shape"] == [1, 2]
        np.testing.assert_allclose(output["data"], want[index], rtol=1e-5, atol=1e-6)
    assert answers[2]["id"] == "mine"
