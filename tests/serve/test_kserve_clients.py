"""KServe's and MLServer's own clients against a real `torchplace serve` (seed-mlp and wide-mlp
on one server), and the wire behaviour they depend on, reproduced with plain HTTP and gRPC.

The wire tests always run. The client tests need ``kserve`` or ``mlserver`` importable in this
interpreter, or an interpreter that has it named by ``TORCHPLACE_KSERVE_PYTHON`` or
``TORCHPLACE_MLSERVER_PYTHON`` (a virtual environment of its own: the clients pin protobuf,
grpcio and pydantic versions a server's environment need not share), and skip otherwise.
``make test`` builds both venvs (``scripts/client-venvs``) and names them; by hand::

    scripts/client-venvs .venv-clients
    TORCHPLACE_KSERVE_PYTHON=$(cat .venv-clients/kserve.python) pytest tests/serve/test_kserve_clients.py

They drive the client in a child process, because ``tritonclient.grpc``, ``kserve`` and
``mlserver`` each register the ``inference.*`` protobuf messages in protobuf's default pool
and no two of them can be imported in one process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
import torch

from torchplace.models import build_model
from torchplace.serve.running import ServerThread

from .conftest import Client, StartServer, test_config

MODELS = ("seed-mlp", "wide-mlp")
WIDTH = {"seed-mlp": 8, "wide-mlp": 512}


@pytest.fixture(scope="module")
def served() -> Iterator[ServerThread]:
    thread = ServerThread(test_config(model="seed-mlp", models=("wide-mlp",), device="cpu")).start(
        timeout=120
    )
    try:
        yield thread
    finally:
        thread.stop()


def reference(name: str, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        y: np.ndarray = build_model(name)(torch.from_numpy(x)).numpy()
    return y


def rows(name: str, n: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, WIDTH[name])).astype(np.float32)


# -- the wire, from this interpreter ---------------------------------------------------------


def test_v1_explain_is_not_implemented_and_names_predict(served: ServerThread) -> None:
    """KServe answers ``:explain`` 501 for a model without an explainer; it was a 404 'no
    route' here, which reads as a wrong URL."""
    client = Client("127.0.0.1", served.port)
    body = orjson.dumps({"instances": [[0.5] * 8]})
    status, headers, data = client.post("/v1/models/seed-mlp:explain", body)
    assert status == 501
    assert headers["content-type"] == "application/json"
    message = orjson.loads(data)["error"]
    assert "model 'seed-mlp' has no explainer" in message
    assert "/v1/models/seed-mlp:predict" in message
    status, _, data = client.post("/v1/models/nope:explain", body)
    assert status == 404
    assert "'nope' is not found" in orjson.loads(data)["error"]
    status, headers, _ = client.get("/v1/models/seed-mlp:explain")
    assert (status, headers["allow"]) == (405, "POST")


def test_json_null_in_a_float_input_is_nan_refused_without_allow_nan(
    served: ServerThread,
) -> None:
    """MLServer's NumpyCodec writes NaN as null; the message said 'mixed or nested values'."""
    client = Client("127.0.0.1", served.port)
    x = [0.5] * 7 + [None]
    body = orjson.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8], "data": x}]}
    )
    status, _, data = client.post("/v2/models/seed-mlp/infer", body)
    assert status == 400
    message = orjson.loads(data)["error"]
    assert "NaN or infinite values are not allowed (a null in JSON 'data' is NaN)" in message
    assert "flat index 7" in message
    assert "--allow-nan" in message


def test_json_null_in_a_float_input_is_nan_with_allow_nan(start_server: StartServer) -> None:
    running = start_server(allow_nan=True)
    x = [[0.5] * 8, [0.5] * 3 + [None] + [0.5] * 4]
    body = orjson.dumps(
        {
            "inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 8], "data": x}],
            "parameters": {"binary_data_output": True},
        }
    )
    status, headers, data = running.client.post("/v2/models/seed-mlp/infer", body)
    assert status == 200, data
    length = int(headers["inference-header-content-length"])
    y = np.frombuffer(data[length:], "<f4").reshape(2, 2)
    want = running.engine.reference(np.array([[0.5] * 8, [0.5] * 8], np.float32))
    np.testing.assert_allclose(y[0], want[0], rtol=1e-6)
    assert np.isnan(y[1]).all()  # the NaN reached the model
    # a string or a boolean next to a null is still refused as not a number
    for bad in (["a"] + [None] * 7, [True] + [None] * 7):
        body = orjson.dumps(
            {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8], "data": bad}]}
        )
        status, _, data = running.client.post("/v2/models/seed-mlp/infer", body)
        assert status == 400, bad
        assert "not FP32 values" in orjson.loads(data)["error"]


@pytest.mark.parametrize("name", MODELS)
def test_raw_contents_beside_an_empty_contents_message_are_read(
    served: ServerThread, name: str
) -> None:
    """MLServer's ``ModelInferRequestConverter.from_types(..., use_raw=True)`` sends each input
    with an empty ``contents`` message set and its data in ``raw_input_contents``; KServe and
    MLServer read the raw data, torchplace answered INVALID_ARGUMENT 'has both contents and
    raw_input_contents'."""
    grpc = pytest.importorskip("grpc")
    from torchplace.serve.proto import grpc_service_pb2 as pb

    x = rows(name, 2)
    request = pb.ModelInferRequest(model_name=name, id="m-1")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
    tensor.contents.SetInParent()  # present, empty: what MLServer's converter sends
    request.raw_input_contents.append(x.tobytes())
    with grpc.insecure_channel(f"127.0.0.1:{served.grpc_port}") as channel:
        model_infer = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        response = model_infer(request, timeout=30)
        y = np.frombuffer(response.raw_output_contents[0], "<f4").reshape(response.outputs[0].shape)
        np.testing.assert_allclose(y, reference(name, x), rtol=1e-5, atol=1e-6)
        assert response.id == "m-1"
        # values in both places are still a conflict
        tensor.contents.fp32_contents.extend(x.ravel().tolist())
        with pytest.raises(grpc.RpcError) as info:
            model_infer(request, timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "has both contents and raw_input_contents" in (info.value.details() or "")


# -- the clients, in a child process ---------------------------------------------------------


def client_python(package: str) -> tuple[str, dict[str, str]]:
    """The interpreter that has ``package``, and the environment to run it in: this one (with
    its path), or the one ``TORCHPLACE_<PACKAGE>_PYTHON`` names (a separate virtual environment,
    e.g. one ``scripts/client-venvs`` builds: the
    clients pin their own protobuf, grpcio and pydantic), run with its own path; skip if none."""
    named = os.environ.get(f"TORCHPLACE_{package.upper()}_PYTHON")
    if named:
        return named, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if importlib.util.find_spec(package) is None:
        pytest.skip(
            f"{package} is not installed in this interpreter (pip install {package}) and "
            f"TORCHPLACE_{package.upper()}_PYTHON names no interpreter that has it"
        )
    return sys.executable, dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def _run_client(package: str, script: str, *args: str) -> dict[str, Any]:
    """Run ``script`` in a child interpreter that has ``package``; it prints one JSON object."""
    python, env = client_python(package)
    done = subprocess.run(
        [python, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


_KSERVE_REST = """
import asyncio, json, sys
import httpx, numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput

base, name, width = sys.argv[1], sys.argv[2], int(sys.argv[3])
x = np.random.default_rng(0).standard_normal((3, width)).astype(np.float32)
found = {}

async def main():
    v2 = InferenceRESTClient(RESTConfig(protocol="v2", retries=0))
    v1 = InferenceRESTClient(RESTConfig(protocol="v1", retries=0))
    found["live"] = await v2.is_server_live(base)
    found["ready"] = await v2.is_server_ready(base)
    found["model_ready"] = [await v2.is_model_ready(base, name), await v1.is_model_ready(base, name)]
    found["unknown_ready"] = await v2.is_model_ready(base, "nope")
    for binary_in in (False, True):
        for binary_out in (False, True):
            inp = InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary_in)
            request = InferRequest(
                name, [inp], request_id="k-1", parameters={"binary_data_output": binary_out}
            )
            result = await v2.infer(base, request, model_name=name)
            out = result.get_output_by_name("output").as_numpy()
            found[f"v2 {binary_in} {binary_out}"] = [result.id, str(out.dtype), out.tolist()]
    inp = InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    request = InferRequest(name, [inp], request_outputs=[RequestedOutput("output", {"binary_data": True})])
    found["requested"] = (await v2.infer(base, request, model_name=name)).outputs[0].as_numpy().tolist()
    found["v1"] = (await v1.infer(base, {"instances": x.tolist()}, model_name=name))["predictions"]
    for label, call in (
        ("explain", v1.explain(base, name, {"instances": x.tolist()})),
        ("unknown", v2.infer(base, InferRequest("nope", [inp]), model_name="nope")),
    ):
        try:
            await call
        except httpx.HTTPStatusError as exc:
            found[label] = [exc.response.status_code, str(exc)]
    bad = InferInput("input", [3, width + 1], "FP32")
    bad.set_data_from_numpy(np.zeros((3, width + 1), np.float32))
    try:
        await v2.infer(base, InferRequest(name, [bad]), model_name=name)
    except httpx.HTTPStatusError as exc:
        found["shape"] = [exc.response.status_code, str(exc)]
    await v1.close()
    await v2.close()

asyncio.run(main())
print(json.dumps(found))
"""


@pytest.mark.parametrize("name", MODELS)
def test_kserve_rest_client(served: ServerThread, name: str) -> None:
    found = _run_client(
        "kserve", _KSERVE_REST, f"http://127.0.0.1:{served.port}", name, str(WIDTH[name])
    )
    want = reference(name, rows(name))
    assert found["live"]
    assert found["ready"]
    assert found["model_ready"] == [True, True]
    assert found["unknown_ready"] is False
    for binary_in in (False, True):
        for binary_out in (False, True):
            rid, dtype, got = found[f"v2 {binary_in} {binary_out}"]
            assert (rid, dtype) == ("k-1", "float32")
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(found["requested"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(found["v1"], want, rtol=1e-5, atol=1e-6)
    status, message = found["explain"]
    assert status == 501
    assert f"model '{name}' has no explainer" in message
    status, message = found["unknown"]
    assert status == 404
    assert "Request for unknown model: 'nope' is not found" in message
    status, message = found["shape"]
    assert status == 400
    assert f"unexpected shape for input 'input' for model '{name}'" in message


_KSERVE_GRPC = """
import asyncio, json, sys
import grpc, numpy as np
from kserve import InferenceGRPCClient, InferInput, InferRequest
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

url, name, width = sys.argv[1], sys.argv[2], int(sys.argv[3])
x = np.random.default_rng(0).standard_normal((3, width)).astype(np.float32)
found = {}

async def main():
    client = InferenceGRPCClient(url, retries=0)
    found["ready"] = [await client.is_server_live(), await client.is_server_ready(),
                      await client.is_model_ready(name), await client.is_model_ready("nope")]
    meta = await client._client_stub.ModelMetadata(pb.ModelMetadataRequest(name=name))
    found["meta"] = [meta.name, list(meta.inputs[0].shape), list(meta.outputs[0].shape)]
    for binary in (False, True):
        inp = InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        result = await client.infer(InferRequest(name, [inp], request_id="g-1"))
        found[f"infer {binary}"] = [result.id, result.outputs[0].as_numpy().tolist()]
    inp = InferInput("input", list(x.shape), "FP32")
    result = await client.infer(InferRequest(name, [inp], raw_inputs=[x.tobytes()]))
    found["raw_inputs"] = result.outputs[0].as_numpy().tolist()
    try:
        await client.infer(InferRequest("nope", [inp], raw_inputs=[x.tobytes()]))
    except grpc.RpcError as exc:
        found["unknown"] = [exc.code().name, exc.details()]
    await client.close()

asyncio.run(main())
print(json.dumps(found))
"""


@pytest.mark.parametrize("name", MODELS)
def test_kserve_grpc_client(served: ServerThread, name: str) -> None:
    found = _run_client(
        "kserve", _KSERVE_GRPC, f"127.0.0.1:{served.grpc_port}", name, str(WIDTH[name])
    )
    want = reference(name, rows(name))
    assert found["ready"] == [True, True, True, False]
    assert found["meta"] == [name, [-1, WIDTH[name]], [-1, list(want.shape)[1]]]
    for binary in (False, True):
        rid, got = found[f"infer {binary}"]
        assert rid == "g-1"
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(found["raw_inputs"], want, rtol=1e-5, atol=1e-6)
    code, message = found["unknown"]
    assert code == "NOT_FOUND"
    assert "'nope' is not found" in message


_MLSERVER = """
import json, sys, urllib.request
import grpc, numpy as np
from mlserver.codecs import NumpyCodec, NumpyRequestCodec
from mlserver.grpc import dataplane_pb2_grpc
from mlserver.grpc.converters import ModelInferRequestConverter, ModelInferResponseConverter
from mlserver.types import InferenceRequest, InferenceResponse

base, url, name, width = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
x = np.random.default_rng(0).standard_normal((3, width)).astype(np.float32)
x[1, 2] = np.nan  # NumpyCodec writes it as null
found = {}

request = NumpyRequestCodec.encode_request(x)
request.inputs[0].name = "input"
request.id = "m-1"
body = request.model_dump_json(exclude_none=True).encode()
post = urllib.request.Request(base + f"/v2/models/{name}/infer", data=body,
                              headers={"Content-Type": "application/json"})
try:
    urllib.request.urlopen(post, timeout=30)
except urllib.error.HTTPError as exc:
    found["nan"] = [exc.code, json.loads(exc.read())["error"]]
x[1, 2] = 0.0
request = NumpyRequestCodec.encode_request(x)
request.inputs[0].name = "input"
request.id = "m-1"
post = urllib.request.Request(base + f"/v2/models/{name}/infer",
                              data=request.model_dump_json(exclude_none=True).encode(),
                              headers={"Content-Type": "application/json"})
with urllib.request.urlopen(post, timeout=30) as answer:
    response = InferenceResponse.model_validate_json(answer.read())
found["rest"] = [response.id, NumpyRequestCodec.decode_response(response).tolist(),
                 NumpyCodec.decode_output(response.outputs[0]).tolist()]
with grpc.insecure_channel(url) as channel:
    stub = dataplane_pb2_grpc.GRPCInferenceServiceStub(channel)
    for use_raw in (False, True):
        request = NumpyRequestCodec.encode_request(x)
        request.inputs[0].name = "input"
        message = ModelInferRequestConverter.from_types(request, model_name=name, use_raw=use_raw)
        try:
            response = ModelInferResponseConverter.to_types(stub.ModelInfer(message, timeout=30))
            found[f"grpc {use_raw}"] = NumpyRequestCodec.decode_response(response).tolist()
        except grpc.RpcError as exc:
            found[f"grpc {use_raw}"] = [exc.code().name, exc.details()]
print(json.dumps(found))
"""


@pytest.mark.parametrize("name", MODELS)
def test_mlserver_codecs_over_rest_and_grpc(served: ServerThread, name: str) -> None:
    found = _run_client(
        "mlserver",
        _MLSERVER,
        f"http://127.0.0.1:{served.port}",
        f"127.0.0.1:{served.grpc_port}",
        name,
        str(WIDTH[name]),
    )
    x = rows(name)
    x[1, 2] = 0.0
    want = reference(name, x)
    status, message = found["nan"]
    assert status == 400
    assert "(a null in JSON 'data' is NaN)" in message
    assert f"flat index {WIDTH[name] + 2}" in message
    rid, decoded, output = found["rest"]
    assert rid == "m-1"
    np.testing.assert_allclose(decoded, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(output, want, rtol=1e-5, atol=1e-6)
    for use_raw in (False, True):
        np.testing.assert_allclose(found[f"grpc {use_raw}"], want, rtol=1e-5, atol=1e-6)
