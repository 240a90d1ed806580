"""One request, three wires, one answer: REST JSON, REST binary and gRPC against a real server.

A server of :mod:`tests.serve.datatype_model` (one input and one output per datatype it serves)
is sent random valid inputs of every datatype, as JSON ``data`` asking for JSON outputs, as
binary tensor data asking for binary outputs, and as a gRPC ``ModelInfer`` with raw contents.
The three answers must hold the same outputs, bit for bit, and equal the model run in process.
"""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("grpc")

import grpc

from torchplace.serve.datatypes import HOST_DTYPES
from torchplace.serve.proto import grpc_service_pb2 as pb
from torchplace.serve.protocol import WIRE_DTYPES
from torchplace.serve.running import ServerThread

from .conftest import test_config
from .datatype_model import ALL, WIDTH, build

MODEL = "tests.serve.datatype_model:build"
NAME = "tests.serve.datatype_model-build"
PATH = f"/v2/models/{NAME}/infer"
_FUZZ = settings(
    max_examples=60,  # each is three round trips to a server
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    thread = ServerThread(
        test_config(
            model=MODEL, device="cpu", max_batch_size=4, max_request_rows=8, max_delay_ms=0.0
        )
    ).start(timeout=120)
    try:
        yield thread
    finally:
        thread.stop()


def _bf16(values: np.ndarray) -> np.ndarray:
    return (values.view(np.uint32) & 0xFFFF0000).view(np.float32)


@st.composite
def _arrays(draw: st.DrawFn) -> dict[str, np.ndarray]:
    """One array per datatype, ``rows`` rows of ``WIDTH``: any finite value it holds."""
    rows = draw(st.integers(1, 3))
    found = {}
    for datatype in ALL:
        size = rows * WIDTH
        if datatype == "BOOL":
            values: Any = draw(st.lists(st.booleans(), min_size=size, max_size=size))
            array = np.array(values, bool)
        elif HOST_DTYPES[datatype].kind in "iu":
            info = np.iinfo(HOST_DTYPES[datatype])
            element = st.integers(int(info.min), int(info.max))
            array = np.array(draw(st.lists(element, min_size=size, max_size=size)), object)
            array = array.astype(HOST_DTYPES[datatype])
        else:
            width = {"FP16": 16, "FP64": 64}.get(datatype, 32)
            element = st.floats(allow_nan=False, allow_infinity=False, width=width)  # type: ignore[arg-type]
            array = np.array(draw(st.lists(element, min_size=size, max_size=size)))
            array = array.astype(HOST_DTYPES[datatype])
            if datatype == "BF16":
                array = _bf16(array)
                array[~np.isfinite(array)] = 1.0
        found[datatype] = array.reshape(rows, WIDTH)
    return found


def _wire(datatype: str, array: np.ndarray) -> bytes:
    if datatype == "BF16":
        return (array.view(np.uint32) >> 16).astype("<u2").tobytes()
    return np.ascontiguousarray(array, dtype=WIRE_DTYPES[datatype]).tobytes()


def _from_wire(datatype: str, raw: bytes, shape: list[int]) -> np.ndarray:
    array = np.frombuffer(raw, dtype=WIRE_DTYPES[datatype])
    if datatype == "BF16":
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(HOST_DTYPES[datatype]).reshape(shape)


def _post(server: ServerThread, body: bytes, headers: dict[str, str]) -> tuple[int, Any, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", PATH, body, headers)
        reply = conn.getresponse()
        return reply.status, reply.headers, reply.read()
    finally:
        conn.close()


def _rest_json(server: ServerThread, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    inputs = [
        {"name": f"in_{dt}", "datatype": dt, "shape": list(a.shape), "data": a.ravel().tolist()}
        for dt, a in arrays.items()
    ]
    status, _, body = _post(
        server, orjson.dumps({"inputs": inputs, "id": "j"}), {"Content-Type": "application/json"}
    )
    assert status == 200, body[:500]
    doc = orjson.loads(body)
    assert doc["id"] == "j"
    found = {}
    for out in doc["outputs"]:
        dt = out["datatype"]
        found[out["name"]] = (
            np.array(out["data"], dtype=object)
            .astype(np.float64 if dt in ("FP16", "BF16", "FP32") else HOST_DTYPES[dt])
            .astype(HOST_DTYPES[dt])
            .reshape(out["shape"])
        )
    return found


def _rest_binary(server: ServerThread, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    inputs, chunks = [], []
    for dt, a in arrays.items():
        raw = _wire(dt, a)
        inputs.append(
            {
                "name": f"in_{dt}",
                "datatype": dt,
                "shape": list(a.shape),
                "parameters": {"binary_data_size": len(raw)},
            }
        )
        chunks.append(raw)
    header = orjson.dumps({"inputs": inputs, "id": "b", "parameters": {"binary_data_output": True}})
    status, headers, body = _post(
        server,
        header + b"".join(chunks),
        {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        },
    )
    assert status == 200, body[:500]
    length = int(headers["Inference-Header-Content-Length"])
    doc = orjson.loads(body[:length])
    assert doc["id"] == "b"
    found, offset = {}, length
    for out in doc["outputs"]:
        size = out["parameters"]["binary_data_size"]
        found[out["name"]] = _from_wire(out["datatype"], body[offset : offset + size], out["shape"])
        offset += size
    assert offset == len(body)
    return found


def _grpc(server: ServerThread, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    request = pb.ModelInferRequest(model_name=NAME, id="g")
    for dt, a in arrays.items():
        request.inputs.add(name=f"in_{dt}", datatype=dt, shape=list(a.shape))
        request.raw_input_contents.append(_wire(dt, a))
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        infer = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        response = infer(request, timeout=30)
    assert response.id == "g"
    return {
        out.name: _from_wire(out.datatype, raw, list(out.shape))
        for out, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    }


def _reference(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tensors = [torch.from_numpy(np.ascontiguousarray(arrays[dt])) for dt in ALL]
    tensors[ALL.index("BF16")] = tensors[ALL.index("BF16")].to(torch.bfloat16)
    with torch.inference_mode():
        out = build()(*tensors)
    return {
        name: t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
        for name, t in out.items()
    }


def _bits(found: dict[str, np.ndarray]) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    return {
        n: (a.dtype.str, a.shape, np.ascontiguousarray(a).tobytes())
        for n, a in sorted(found.items())
    }


@_FUZZ
@given(_arrays())
def test_rest_json_rest_binary_and_grpc_answer_alike(
    server: ServerThread, arrays: dict[str, np.ndarray]
) -> None:
    assert server.grpc_port, "gRPC is on by default when the extra is installed"
    want = _bits(_reference(arrays))
    assert _bits(_rest_json(server, arrays)) == want
    assert _bits(_rest_binary(server, arrays)) == want
    assert _bits(_grpc(server, arrays)) == want
