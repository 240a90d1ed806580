"""Conformance with the Open Inference Protocol's own texts and with KServe's model server.

The texts: ``kserve/open-inference-protocol``, ``specification/protocol/inference_rest.md``,
``open_inference_rest.yaml`` and ``open_inference_grpc.proto``. KServe: its server's tests
(``kserve/kserve``, ``python/kserve/test/test_server.py``, ``test_grpc_server.py``), its data
models (``python/kserve/kserve/protocol/rest/v2_datamodels.py``) and its client's codec
(``python/kserve/kserve/protocol/infer_type.py``: ``InferRequest.to_rest``/``to_grpc``,
``InferResponse.from_bytes``/``from_grpc``). Each test names what it comes from; where KServe
and the text or Triton differ, it says which torchplace follows.

The wire tests always run; the client test drives KServe's ``InferenceRESTClient`` and
``InferenceGRPCClient`` in a child interpreter and skips unless ``kserve`` is importable there
(see :func:`tests.serve.test_kserve_clients.client_python`). One real server serves
``seed-mlp`` and :mod:`tests.serve.datatype_model`'s models over the OIP's datatypes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.errors import InputError
from torchplace.models import TensorSpec
from torchplace.serve.protocol import decode_infer_request
from torchplace.serve.running import ServerThread

from .conftest import Client
from .datatype_model import OIP, TYPED, WIDTH
from .test_conformance_mlserver import (
    _DTYPES,
    _EDGE,
    OIP_MODEL,
    TYPED_MODEL,
    _grpc_error,
    _rolled,
    _stub,
    edge_arrays,
    served_datatypes,
)
from .test_conformance_mlserver import _close_channels as _close_channels
from .test_kserve_clients import _run_client, reference

grpc = pytest.importorskip("grpc")
from torchplace.serve.proto import grpc_service_pb2 as pb  # noqa: E402

_JSON = {"Content-Type": "application/json"}
_LENGTH = "inference-header-content-length"


served = pytest.fixture(scope="module", name="served")(served_datatypes)


@pytest.fixture
def rest(served: ServerThread) -> Client:
    return Client("127.0.0.1", served.port)


def _json_inputs(datatypes: tuple[str, ...]) -> list[dict[str, Any]]:
    return [
        {"name": f"in_{dt}", "datatype": dt, "shape": list(a.shape), "data": a.ravel().tolist()}
        for dt, a in edge_arrays(datatypes).items()
    ]


def _split(headers: dict[str, str], data: bytes) -> tuple[dict[str, Any], bytes]:
    """The JSON header of an answer and the binary section after it."""
    length = int(headers.get(_LENGTH, len(data)))
    header: dict[str, Any] = orjson.loads(data[:length])
    return header, data[length:]


# -- REST: the routes and their bodies ------------------------------------------------------
@pytest.mark.parametrize("versioned", [False, True])
def test_every_oip_rest_route_answers_its_object(rest: Client, versioned: bool) -> None:
    """inference_rest.md, the API table and Payload Contents: server live, ready and metadata,
    model ready and metadata, with and without ``/versions/<v>`` (the yaml's paths carry the
    version; the table shows it optional). Each answers 200 ``application/json`` with the
    fields the spec gives it."""
    model = f"/v2/models/seed-mlp{'/versions/1' if versioned else ''}"
    expected: dict[str, Any] = {
        "/v2/health/live": {"live": True},
        "/v2/health/ready": {"ready": True},
        f"{model}/ready": {"name": "seed-mlp", "ready": True},
    }
    for path, body in expected.items():
        status, headers, data = rest.get(path)
        assert (status, headers["content-type"]) == (200, "application/json"), path
        assert orjson.loads(data) == body, path
    for path in ("/v2", "/v2/"):  # the yaml writes the server metadata path '/v2/'
        status, _, data = rest.get(path)
        server = orjson.loads(data)
        assert status == 200
        assert {"name", "version", "extensions"} <= set(server)
        assert all(isinstance(e, str) for e in server["extensions"])
    status, _, data = rest.get(model)
    meta = orjson.loads(data)
    assert status == 200
    assert {"name", "versions", "platform", "inputs", "outputs"} <= set(meta)
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 8]}]
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}
    status, _, data = rest.post(f"{model}/infer", orjson.dumps(body), headers=_JSON)
    assert status == 200
    answer = orjson.loads(data)
    assert {"model_name", "outputs"} <= set(answer)  # the yaml's required fields


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/v2/models/seed-mlp/infer", b"{not json", 400),
        ("POST", "/v2/models/seed-mlp/infer", b'{"inputs": 1}', 400),
        ("POST", "/v2/models/nope/infer", b'{"inputs": []}', 404),
        ("GET", "/v2/models/nope", None, 404),
        ("GET", "/v2/models/nope/ready", None, 404),
        ("GET", "/v2/models/seed-mlp/versions/9", None, 404),
        ("GET", "/v2/models/seed-mlp/infer", None, 405),
        ("POST", "/v2/health/live", b"{}", 405),
    ],
)
def test_every_failure_is_an_error_object(
    rest: Client, method: str, path: str, body: bytes | None, status: int
) -> None:
    """inference_rest.md, the $..._error_response objects: a failed request has an HTTP error
    status and the body ``{"error": <message string>}``, with nothing else (KServe's
    InferenceRESTClient reads that key into its exception only when the content type is
    exactly ``application/json``: inference_client.py ``_construct_http_status_error``)."""
    got, headers, data = rest.request(method, path, body=body, headers=_JSON if body else None)
    assert (got, headers["content-type"]) == (status, "application/json")
    answer = orjson.loads(data)
    assert list(answer) == ["error"]
    assert isinstance(answer["error"], str)
    assert answer["error"]


def test_kserve_v1_liveness_and_model_list(rest: Client) -> None:
    """test_server.py test_liveness_v1 (``GET /`` is ``{"status": "alive"}``, which
    ``InferenceRESTClient(protocol="v1").is_server_live`` reads), test_list_models_v1 and
    test_list_models_v2 (``{"models": [...]}``), test_unknown_model_v1 (404 with an
    ``error``)."""
    status, _, data = rest.get("/")
    assert (status, orjson.loads(data)) == (200, {"status": "alive"})
    names = {"seed-mlp", OIP_MODEL, TYPED_MODEL}
    for path in ("/v1/models", "/v2/models"):
        status, _, data = rest.get(path)
        assert status == 200
        assert set(orjson.loads(data)["models"]) == names
    status, _, data = rest.get("/v1/models/InvalidModel")
    assert status == 404
    assert "'InvalidModel' is not found" in orjson.loads(data)["error"]


# -- REST: what a request may carry ---------------------------------------------------------
def test_kserve_to_rest_body_with_parameters_of_every_kind(rest: Client) -> None:
    """test_server.py test_infer_parameters_v2: ``InferRequest.to_rest()`` adds the
    ``model_name`` to the body (no field of the OIP's request) and parameters of each
    ``$parameter`` kind (string, boolean, integer, float) on the request and on the input;
    the ``id`` comes back."""
    parameters = {"test-str": "dummy", "test-bool": True, "test-int": 100, "test-float": 1.3}
    body = {
        "id": "123",
        "model_name": "seed-mlp",
        "parameters": parameters,
        "inputs": [
            {
                "name": "input",
                "datatype": "FP32",
                "shape": [1, 8],
                "data": [0.5] * 8,
                "parameters": parameters,
            }
        ],
        "outputs": [{"name": "output", "parameters": parameters}],
    }
    status, _, data = rest.post("/v2/models/seed-mlp/infer", orjson.dumps(body), headers=_JSON)
    assert status == 200, data
    answer = orjson.loads(data)
    assert (answer["id"], answer["model_name"]) == ("123", "seed-mlp")


def test_binary_data_of_an_output_overrides_binary_data_output(rest: Client) -> None:
    """test_server.py test_binary_data_parameter_precedence (and test_fp16_output_as_binary_data):
    ``binary_data_output`` true with one output asked ``binary_data`` false answers that one
    as JSON ``data`` and the other as binary data (FP16: little-endian half floats), with
    ``binary_data_size`` in its parameters and the JSON's length in
    ``Inference-Header-Content-Length``."""
    body = {
        "id": "123",
        "inputs": _json_inputs(OIP),
        "parameters": {"binary_data_output": True},
        "outputs": [
            {"name": "out_FP16", "parameters": {"binary_data": True}},
            {"name": "out_FP32", "parameters": {"binary_data": False}},
        ],
    }
    status, headers, data = rest.post(
        f"/v2/models/{OIP_MODEL}/infer", orjson.dumps(body), headers=_JSON
    )
    assert status == 200, data
    header, binary = _split(headers, data)
    half, single = header["outputs"]
    want = edge_arrays(("FP16", "FP32"))
    assert (half["name"], half["parameters"], "data" in half) == (
        "out_FP16",
        {"binary_data_size": 12},
        False,
    )
    np.testing.assert_array_equal(
        np.frombuffer(binary, "<f2").reshape(2, WIDTH), np.roll(want["FP16"], 1, -1)
    )
    assert (single["name"], "parameters" in single) == ("out_FP32", False)
    # FP32 JSON numbers are written shortest-first (3.4028235e+38): equal as float32
    np.testing.assert_array_equal(
        np.array(single["data"], np.float32), np.roll(want["FP32"], 1, -1).ravel()
    )


def test_binary_data_output_answers_every_output_binary(rest: Client) -> None:
    """test_server.py test_all_output_as_binary_data: ``binary_data_output`` true and no
    ``outputs``: every output (the OIP: all of them when none is asked) as binary data, in
    the order of the JSON header, sizes adding up to the binary section."""
    body = {"inputs": _json_inputs(OIP), "parameters": {"binary_data_output": True}}
    status, headers, data = rest.post(
        f"/v2/models/{OIP_MODEL}/infer", orjson.dumps(body), headers=_JSON
    )
    assert status == 200, data
    header, binary = _split(headers, data)
    assert [o["name"] for o in header["outputs"]] == [f"out_{dt}" for dt in OIP]
    offset = 0
    for output, (datatype, array) in zip(header["outputs"], edge_arrays(OIP).items(), strict=True):
        size = output["parameters"]["binary_data_size"]
        values = np.frombuffer(
            binary[offset : offset + size], np.dtype(_DTYPES[datatype]).newbyteorder("<")
        )
        np.testing.assert_array_equal(values.reshape(2, WIDTH), np.roll(array, 1, -1))
        offset += size
    assert offset == len(binary)


def test_fp16_as_binary_input_data_with_octet_stream(rest: Client) -> None:
    """test_server.py test_fp16_input_as_binary_data: ``to_rest()`` of an FP16 input set
    ``binary_data=True`` posts ``Content-Type: application/octet-stream`` with the JSON
    header's length; the other inputs stay JSON ``data``."""
    inputs = _json_inputs(OIP)
    half = edge_arrays(("FP16",))["FP16"]
    raw = half.astype("<f2").tobytes()
    for entry in inputs:
        if entry["datatype"] == "FP16":
            del entry["data"]
            entry["parameters"] = {"binary_data_size": len(raw)}
    header = orjson.dumps({"id": "123", "model_name": OIP_MODEL, "inputs": inputs})
    status, headers, data = rest.post(
        f"/v2/models/{OIP_MODEL}/infer",
        header + raw,
        headers={"Content-Type": "application/octet-stream", _LENGTH: str(len(header))},
    )
    assert status == 200, data
    answer, _ = _split(headers, data)
    outputs = {o["name"]: o["data"] for o in answer["outputs"]}
    assert outputs["out_FP16"] == np.roll(half, 1, -1).astype(np.float64).ravel().tolist()


@pytest.mark.parametrize("content_type", ["application/octet-stream", "application/json"])
def test_binary_data_without_the_json_length_names_the_header(
    rest: Client, content_type: str
) -> None:
    """kserve/inference_client.py ``infer`` (and ``InferRequest.to_rest``) sends
    ``Inference-Header-Content-Length`` whenever binary data follows the JSON, as
    tritonclient does; a client that leaves it out sends a body that does not parse as JSON
    (binary bytes after it). The 400 said only that (often 'not UTF-8', from the float
    bytes); it now names the missing header, because the JSON names a binary_data_size."""
    x = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)
    entry = {"name": "input", "shape": [1, 8], "datatype": "FP32"}
    header = orjson.dumps({"inputs": [{**entry, "parameters": {"binary_data_size": 32}}]})
    for data in (x, np.zeros_like(x)):  # invalid UTF-8 after the JSON, and valid
        status, _, body = rest.post(
            "/v2/models/seed-mlp/infer",
            header + data.tobytes(),
            headers={"Content-Type": content_type},
        )
        assert status == 400
        message = orjson.loads(body)["error"]
        assert message.startswith("request body is not valid JSON: ")
        assert "give the JSON's length in bytes in the Inference-Header-Content-Length" in message
    status, _, body = rest.post("/v2/models/seed-mlp/infer", b"{", headers=_JSON)
    assert status == 400
    assert "Inference-Header-Content-Length" not in orjson.loads(body)["error"]


def test_fp16_json_data_is_read_as_numbers(rest: Client) -> None:
    """test_server.py test_fp16_input_not_binary_data and test_fp16_output_not_binary_data:
    KServe's server answers 400 to FP16 as JSON numbers either way. The OIP leaves it to the
    server ('The server can decide to coerce each element to the required type or return an
    error'); torchplace keeps its documented reading: FP16 JSON numbers are rounded to half
    floats, and an FP16 output asked as JSON is answered with the numbers they hold."""
    body = {"inputs": _json_inputs(OIP), "outputs": [{"name": "out_FP16"}]}
    status, _, data = rest.post(f"/v2/models/{OIP_MODEL}/infer", orjson.dumps(body), headers=_JSON)
    assert status == 200, data
    (output,) = orjson.loads(data)["outputs"]
    assert (output["datatype"], output["shape"]) == ("FP16", [2, WIDTH])
    assert output["data"] == np.roll(edge_arrays(("FP16",))["FP16"], 1, -1).ravel().tolist()


def _decode(datatype: str, data: str) -> np.ndarray:
    body = b'{"inputs":[{"name":"x","datatype":"%s","shape":[1,3],"data":%s}]}' % (
        datatype.encode(),
        data.encode(),
    )
    spec = (TensorSpec("x", datatype, (-1, 3)),)
    decoded = decode_infer_request(body, inputs=spec, outputs=_Y, max_rows=8, model="m")
    array: np.ndarray = decoded.inputs["x"]
    return array


_Y = (TensorSpec("y", "FP32", (-1, 3)),)


@pytest.mark.parametrize(
    ("datatype", "data", "words"),
    [
        ("INT32", "[1.0, 2.0, 3.0]", "holds numbers written as floats (such as 1.0), not INT32"),
        ("UINT8", "[[1e2, 2, 3]]", "write them as JSON integers (100)"),
        ("INT64", "[1.5, 2, 3]", "'data' holds non-integer numbers, not INT64 values"),
        ("BOOL", "[0, 1, 1]", "'data' holds integers, not BOOL values"),
        ("INT64", "[1e300, 2, 3]", "value 1e+300 is out of range for INT64"),
    ],
)
def test_json_numbers_are_not_coerced_across_kinds(datatype: str, data: str, words: str) -> None:
    """inference_rest.md, Tensor Data: 'The server can decide to coerce each element to the
    required type or return an error if an unexpected value is received.' KServe
    (infer_type.py ``as_numpy``: ``np.array(data, dtype)``) and MLServer (NumpyCodec) cast,
    cutting 1.5 to 1 and reading 0/1 as booleans; Triton refuses a JSON float for an integer
    tensor and a number for a boolean one, and so does torchplace. Whole numbers written as
    floats (what ``json.dumps`` of a float array gives) are refused with how to send them, and
    a float far past 64 bits is named as written, not as its 301 digits."""
    with pytest.raises(InputError) as info:
        _decode(datatype, data)
    assert words in str(info.value)


def test_json_integers_are_read_for_float_inputs() -> None:
    """The other way is no coercion across kinds: an integer is a number of a float tensor
    (every peer reads ``[1, 2, 3]`` for FP32), and a float past FP16's range is infinite
    there, refused as NaN or infinity are."""
    np.testing.assert_array_equal(_decode("FP32", "[1, 2, 3]"), [[1.0, 2.0, 3.0]])
    np.testing.assert_array_equal(_decode("FP16", "[1, 2, 65504]"), [[1, 2, 65504]])
    with pytest.raises(InputError, match="past FP16's range"):
        _decode("FP16", "[1, 2, 70000]")


# -- gRPC ----------------------------------------------------------------------------------
def _typed_request(datatypes: tuple[str, ...] = TYPED) -> Any:
    fields = {
        "BOOL": "bool_contents",
        "INT8": "int_contents",
        "INT16": "int_contents",
        "INT32": "int_contents",
        "INT64": "int64_contents",
        "UINT8": "uint_contents",
        "UINT16": "uint_contents",
        "UINT32": "uint_contents",
        "UINT64": "uint64_contents",
        "FP32": "fp32_contents",
        "FP64": "fp64_contents",
    }
    request = pb.ModelInferRequest(model_name=TYPED_MODEL, id="123")
    for datatype, array in edge_arrays(datatypes).items():
        tensor = request.inputs.add(name=f"in_{datatype}", datatype=datatype, shape=array.shape)
        getattr(tensor.contents, fields[datatype]).extend(array.ravel().tolist())
    return request


def test_typed_contents_of_every_datatype_are_read(served: ServerThread) -> None:
    """test_grpc_server.py test_grpc_inputs: each input in the ``InferTensorContents`` field
    of its datatype (open_inference_grpc.proto: ``int_contents`` for INT8/16/32,
    ``uint_contents`` for UINT8/16/32...). KServe answers typed ``contents`` too; torchplace
    answers ``raw_output_contents`` (Triton's answer; the proto allows either, and KServe's
    ``InferResponse.from_grpc`` and MLServer's converter read both); the ``id`` comes back."""
    answer = _stub(served, "ModelInfer", pb.ModelInferResponse)(_typed_request(), timeout=30)
    assert answer.id == "123"
    want = _rolled(TYPED)
    for output, raw in zip(answer.outputs, answer.raw_output_contents, strict=True):
        dtype = np.dtype(_DTYPES[output.datatype]).newbyteorder("<")
        values = np.frombuffer(raw, dtype).reshape(list(output.shape)).tolist()
        assert [output.datatype, values] == want[output.name]


def test_raw_contents_missing_an_input_are_refused(served: ServerThread) -> None:
    """test_grpc_server.py test_grpc_raw_inputs_with_missing_input_data: fewer
    ``raw_input_contents`` than inputs is an invalid input (the proto: raw data 'for each
    tensor in the same order as inputs')."""
    request = pb.ModelInferRequest(model_name=OIP_MODEL)
    arrays = edge_arrays(OIP)
    for datatype, array in arrays.items():
        request.inputs.add(name=f"in_{datatype}", datatype=datatype, shape=array.shape)
    for array in list(arrays.values())[:-1]:
        request.raw_input_contents.append(array.tobytes())
    code, message = _grpc_error(_stub(served, "ModelInfer", pb.ModelInferResponse), request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"the request has {len(OIP)} inputs but {len(OIP) - 1} raw_input_contents" in message


def test_contents_beside_raw_contents_are_refused(served: ServerThread) -> None:
    """test_grpc_server.py test_grpc_raw_inputs_with_contents_specified, and the proto on
    ``raw_input_contents``: 'If this field is specified then InferInputTensor::contents must
    not be specified for any input tensor.'"""
    request = _typed_request()
    first = request.inputs[0]
    for tensor in request.inputs[1:]:
        tensor.ClearField("contents")
    for array in list(edge_arrays(TYPED).values())[1:]:
        request.raw_input_contents.append(array.tobytes())
    request.raw_input_contents.insert(0, edge_arrays((first.datatype,))[first.datatype].tobytes())
    code, message = _grpc_error(_stub(served, "ModelInfer", pb.ModelInferResponse), request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"input {first.name!r} has both contents and raw_input_contents" in message


def test_every_infer_parameter_kind_is_taken(served: ServerThread) -> None:
    """open_inference_grpc.proto ``InferParameter``: ``bool_param``, ``int64_param``,
    ``string_param``, ``double_param`` and ``uint64_param``; a custom parameter of each kind,
    on the request, an input and an output, is the server's to ignore."""
    request = _typed_request()
    output = request.outputs.add(name="out_INT32")
    for params in (request.parameters, request.inputs[0].parameters, output.parameters):
        params["a"].bool_param = True
        params["b"].int64_param = -(2**63)
        params["c"].string_param = "np"
        params["d"].double_param = 1.3
        params["e"].uint64_param = 2**64 - 1
    answer = _stub(served, "ModelInfer", pb.ModelInferResponse)(request, timeout=30)
    assert [o.name for o in answer.outputs] == ["out_INT32"]


def test_grpc_metadata_and_readiness(served: ServerThread) -> None:
    """open_inference_grpc.proto ``ModelMetadataResponse`` (``TensorMetadata`` shapes with -1
    for a variable dimension), ``ModelReady`` with a version; an unknown version of metadata
    is NOT_FOUND (test_grpc_server.py's server raises ModelNotFound, which it maps there)."""
    metadata = _stub(served, "ModelMetadata", pb.ModelMetadataResponse)
    meta = metadata(pb.ModelMetadataRequest(name=TYPED_MODEL, version="1"), timeout=30)
    assert (meta.name, list(meta.versions), meta.platform) == (TYPED_MODEL, ["1"], "pytorch")
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        (f"in_{dt}", dt, [-1, WIDTH]) for dt in TYPED
    ]
    ready = _stub(served, "ModelReady", pb.ModelReadyResponse)
    assert ready(pb.ModelReadyRequest(name=TYPED_MODEL, version="1"), timeout=30).ready
    code, message = _grpc_error(metadata, pb.ModelMetadataRequest(name=TYPED_MODEL, version="9"))
    assert (code, "version 9 is not found" in message) == (grpc.StatusCode.NOT_FOUND, True)


# -- KServe's own clients, in a child interpreter -------------------------------------------
_KSERVE = (
    """
import asyncio, json, sys
import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput
"""
    + _EDGE
    + """
base, url, name, typed, datatypes = sys.argv[1:5] + [sys.argv[5].split(",")]
found = {}

def request(model, binary, skip=(), outputs=None):
    inputs = []
    for datatype, array in edge_arrays([d for d in datatypes if d not in skip]).items():
        entry = InferInput(f"in_{datatype}", list(array.shape), datatype)
        entry.set_data_from_numpy(array, binary_data=binary)
        inputs.append(entry)
    return InferRequest(model, inputs, request_id="k-1", request_outputs=outputs)

def outputs(result):
    return {o.name: [o.datatype, o.as_numpy().tolist()] for o in result.outputs}

async def main():
    rest = InferenceRESTClient(RESTConfig(protocol="v2", retries=0))
    v1 = InferenceRESTClient(RESTConfig(protocol="v1", retries=0))
    found["live"] = [await rest.is_server_live(base), await v1.is_server_live(base)]
    # to_rest refuses FP16 as JSON: the JSON request goes to the model without it
    for binary, model, skip in ((True, name, ()), (False, typed, ("FP16",))):
        result = await rest.infer(base, request(model, binary, skip), model_name=model)
        found[f"rest {binary}"] = [result.id, outputs(result)]
    asked = [RequestedOutput("out_FP16", {"binary_data": True}),
             RequestedOutput("out_UINT64", {"binary_data": False})]
    result = await rest.infer(base, request(name, True, outputs=asked), model_name=name)
    found["asked"] = outputs(result)
    # every answer validates against KServe's own server data models
    from kserve.protocol.rest import v2_datamodels as dm
    import httpx
    async with httpx.AsyncClient(base_url=base) as http:
        checks = [("/v2", dm.ServerMetadataResponse), ("/v2/health/live", dm.ServerLiveResponse),
                  ("/v2/health/ready", dm.ServerReadyResponse), ("/v2/models", dm.ListModelsResponse),
                  (f"/v2/models/{name}", dm.ModelMetadataResponse),
                  (f"/v2/models/{name}/versions/1/ready", dm.ModelReadyResponse)]
        for path, model in checks:
            answer = await http.get(path)
            found[f"model {path}"] = [answer.status_code, model.model_validate(answer.json()).model_dump()]
        body = {"id": "k-2", "inputs": [{"name": f"in_{dt}", "datatype": dt, "shape": list(a.shape),
                "data": a.ravel().tolist()} for dt, a in edge_arrays(
                [d for d in datatypes if d != "FP16"]).items()]}
        answer = await http.post(f"/v2/models/{typed}/infer", json=body)
        response = dm.InferenceResponse.model_validate(answer.json())
        found["model infer"] = [answer.status_code, response.id, len(response.outputs)]
    grpc_client = InferenceGRPCClient(url, retries=0)
    for binary, model, skip in ((True, name, ()), (False, typed, ("FP16",))):
        result = await grpc_client.infer(request(model, binary, skip))
        found[f"grpc {binary}"] = [result.id, outputs(result)]
    await grpc_client.close()
    await rest.close()
    await v1.close()

asyncio.run(main())
print(json.dumps(found))
"""
)


def test_kserve_clients_round_trip_every_datatype(served: ServerThread) -> None:
    """infer_type.py ``InferInput.set_data_from_numpy`` (binary or JSON), ``to_rest`` and
    ``to_grpc`` (``raw_input_contents``, or the typed contents of
    constants.py ``GRPC_CONTENT_DATATYPE_MAPPINGS``), read back by ``InferResponse.from_bytes``
    and ``from_grpc``: every OIP datatype at its extremes comes back exact, the ``id`` too.
    And every answer of the REST API validates against KServe's own server data models
    (rest/v2_datamodels.py), as a suite built on them would check it."""
    found = _run_client(
        "kserve",
        _KSERVE,
        f"http://127.0.0.1:{served.port}",
        f"127.0.0.1:{served.grpc_port}",
        OIP_MODEL,
        TYPED_MODEL,
        ",".join(OIP),
    )
    assert found["live"] == [True, True]
    for kind in ("rest", "grpc"):
        assert found[f"{kind} True"] == ["k-1", _rolled(OIP)], kind
        assert found[f"{kind} False"] == ["k-1", _rolled(TYPED)], kind
    want = _rolled(OIP)
    assert found["asked"] == {name: want[name] for name in ("out_FP16", "out_UINT64")}
    # v2_datamodels.py: ServerMetadataResponse, ServerLiveResponse, ServerReadyResponse,
    # ListModelsResponse, ModelMetadataResponse, ModelReadyResponse, InferenceResponse
    assert found["model /v2"][0] == 200
    assert found["model /v2/health/live"] == [200, {"live": True}]
    assert found["model /v2/health/ready"] == [200, {"ready": True}]
    assert found["model /v2/models"][0] == 200
    status, meta = found[f"model /v2/models/{OIP_MODEL}"]
    assert (status, meta["name"], meta["versions"], meta["platform"]) == (
        200,
        OIP_MODEL,
        ["1"],
        "pytorch",
    )
    assert meta["inputs"] == [
        {"name": f"in_{dt}", "datatype": dt, "shape": [-1, WIDTH]} for dt in OIP
    ]
    assert found[f"model /v2/models/{OIP_MODEL}/versions/1/ready"] == [
        200,
        {"name": OIP_MODEL, "ready": True},
    ]
    assert found["model infer"] == [200, "k-2", len(TYPED)]


# -- a client of the OIP's own .proto ---------------------------------------------------------
#: the messages of kserve/open-inference-protocol specification/protocol/open_inference_grpc.proto
#: (Apache-2.0, Copyright 2023 The KServe Authors), field for field, without the comments: its
#: ``ModelMetadataResponse`` has a ``properties`` map (6) and its ``InferParameter`` the
#: ``double_param`` and ``uint64_param`` that Triton's lacked for years
_OIP_PROTO = """
syntax = "proto3";
package inference;
message ServerLiveRequest {}
message ServerLiveResponse { bool live = 1; }
message ServerReadyRequest {}
message ServerReadyResponse { bool ready = 1; }
message ModelReadyRequest { string name = 1; string version = 2; }
message ModelReadyResponse { bool ready = 1; }
message ServerMetadataRequest {}
message ServerMetadataResponse { string name = 1; string version = 2; repeated string extensions = 3; }
message ModelMetadataRequest { string name = 1; string version = 2; }
message ModelMetadataResponse {
  message TensorMetadata { string name = 1; string datatype = 2; repeated int64 shape = 3; }
  string name = 1; repeated string versions = 2; string platform = 3;
  repeated TensorMetadata inputs = 4; repeated TensorMetadata outputs = 5;
  map<string, string> properties = 6;
}
message ModelInferRequest {
  message InferInputTensor {
    string name = 1; string datatype = 2; repeated int64 shape = 3;
    map<string, InferParameter> parameters = 4; InferTensorContents contents = 5;
  }
  message InferRequestedOutputTensor { string name = 1; map<string, InferParameter> parameters = 2; }
  string model_name = 1; string model_version = 2; string id = 3;
  map<string, InferParameter> parameters = 4; repeated InferInputTensor inputs = 5;
  repeated InferRequestedOutputTensor outputs = 6; repeated bytes raw_input_contents = 7;
}
message ModelInferResponse {
  message InferOutputTensor {
    string name = 1; string datatype = 2; repeated int64 shape = 3;
    map<string, InferParameter> parameters = 4; InferTensorContents contents = 5;
  }
  string model_name = 1; string model_version = 2; string id = 3;
  map<string, InferParameter> parameters = 4; repeated InferOutputTensor outputs = 5;
  repeated bytes raw_output_contents = 6;
}
message InferParameter {
  oneof parameter_choice {
    bool bool_param = 1; int64 int64_param = 2; string string_param = 3;
    double double_param = 4; uint64 uint64_param = 5;
  }
}
message InferTensorContents {
  repeated bool bool_contents = 1; repeated int32 int_contents = 2;
  repeated int64 int64_contents = 3; repeated uint32 uint_contents = 4;
  repeated uint64 uint64_contents = 5; repeated float fp32_contents = 6;
  repeated double fp64_contents = 7; repeated bytes bytes_contents = 8;
}
"""

_OIP_CLIENT = """
import json, sys
import grpc, numpy as np
import open_inference_grpc_pb2 as pb

url, name = sys.argv[1], sys.argv[2]
found = {}
with grpc.insecure_channel(url) as channel:
    def call(method, request, response):
        rpc = channel.unary_unary("/inference.GRPCInferenceService/" + method,
                                  request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=response.FromString)
        return rpc(request, timeout=30)
    found["live"] = call("ServerLive", pb.ServerLiveRequest(), pb.ServerLiveResponse).live
    found["ready"] = call("ServerReady", pb.ServerReadyRequest(), pb.ServerReadyResponse).ready
    found["model ready"] = call("ModelReady", pb.ModelReadyRequest(name=name, version="1"),
                                pb.ModelReadyResponse).ready
    server = call("ServerMetadata", pb.ServerMetadataRequest(), pb.ServerMetadataResponse)
    found["server"] = [server.name, bool(server.version), "binary_tensor_data" in server.extensions]
    meta = call("ModelMetadata", pb.ModelMetadataRequest(name=name), pb.ModelMetadataResponse)
    found["metadata"] = [meta.name, list(meta.versions), meta.platform, dict(meta.properties),
                         [[t.name, t.datatype, list(t.shape)] for t in meta.inputs]]
    x = np.arange(16, dtype=np.float32).reshape(2, 8) / 8
    for raw in (False, True):
        request = pb.ModelInferRequest(model_name=name, model_version="1", id="oip-1")
        request.parameters["d"].double_param = 0.25
        request.parameters["u"].uint64_param = 2**64 - 1
        tensor = request.inputs.add(name="input", datatype="FP32", shape=[2, 8])
        if raw:
            request.raw_input_contents.append(x.tobytes())
        else:
            tensor.contents.fp32_contents.extend(x.ravel().tolist())
        request.outputs.add(name="output").parameters["d"].double_param = 0.5
        answer = call("ModelInfer", request, pb.ModelInferResponse)
        (output,) = answer.outputs
        values = np.frombuffer(answer.raw_output_contents[0], "<f4").reshape(list(output.shape))
        found[f"infer {raw}"] = [answer.id, answer.model_name, answer.model_version,
                                 output.name, output.datatype, values.tolist()]
print(json.dumps(found))
"""


def test_a_client_of_the_oips_own_proto(served: ServerThread, tmp_path: Any) -> None:
    """open_inference_grpc.proto compiled as it is published (torchplace's messages are
    Triton's ``grpc_service.proto``): a client built from it reads every answer of the five
    APIs 'a compliant server must implement' (inference_grpc.md), its metadata's
    ``properties`` map empty, and its ``double_param`` and ``uint64_param`` custom
    parameters are taken. Run in a child interpreter: the compiled module registers
    ``inference.*`` in protobuf's default pool, as ``tritonclient.grpc`` does in this one."""
    protoc = pytest.importorskip("grpc_tools.protoc")
    (tmp_path / "open_inference_grpc.proto").write_text(_OIP_PROTO)
    args = ["protoc", f"-I{tmp_path}", f"--python_out={tmp_path}", "open_inference_grpc.proto"]
    assert protoc.main(args) == 0
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *(p for p in sys.path if p)])
    done = subprocess.run(
        [sys.executable, "-c", _OIP_CLIENT, f"127.0.0.1:{served.grpc_port}", "seed-mlp"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert [found["live"], found["ready"], found["model ready"]] == [True, True, True]
    assert found["server"] == ["torchplace", True, True]
    assert found["metadata"] == ["seed-mlp", ["1"], "pytorch", {}, [["input", "FP32", [-1, 8]]]]
    want = reference("seed-mlp", np.arange(16, dtype=np.float32).reshape(2, 8) / 8)
    for raw in (False, True):
        rid, model, version, name, datatype, values = found[f"infer {raw}"]
        assert [rid, model, version, name, datatype] == ["oip-1", "seed-mlp", "1", "output", "FP32"]
        np.testing.assert_allclose(values, want, rtol=1e-5, atol=1e-6)
