"""Conformance with the other reference implementations of the Open Inference Protocol and
KServe's V1 protocol: KServe's own model server (``kserve/kserve``, python/kserve) and
MLServer (``SeldonIO/MLServer``), and the OIP specification (``kserve/open-inference-protocol``).

Each test names the reference that defines the behaviour it checks.
"""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from torchplace.errors import InputError
from torchplace.models import TensorSpec
from torchplace.serve.protocol import decode_infer_request

from .conftest import FakeEngine, StartServer

_UINT64 = (TensorSpec("x", "UINT64", (-1, 3)),)
_INT64 = (TensorSpec("x", "INT64", (-1, 3)),)
_OUT = (TensorSpec("y", "FP32", (-1, 3)),)


def _decode(datatype: str, data: str, inputs: tuple[TensorSpec, ...]) -> np.ndarray:
    body = b'{"inputs":[{"name":"x","datatype":"%s","shape":[2,3],"data":%s}]}' % (
        datatype.encode(),
        data.encode(),
    )
    decoded = decode_infer_request(body, inputs=inputs, outputs=_OUT, max_rows=8)
    array: np.ndarray = decoded.inputs["x"]
    return array


@pytest.mark.parametrize(
    "data",
    [
        "[[1,18446744073709551615,6],[1,18446744073709551611,3]]",
        "[[9223372036854775808,1,2],[3,4,5]]",
        "[1,18446744073709551615,6,1,18446744073709551611,3]",
    ],
    ids=["nested-max", "nested-2**63", "flat"],
)
def test_uint64_past_int64_is_read_nested_as_flat(data: str) -> None:
    """OIP (inference_rest.md, Tensor Data): 'data' may be nested or flat (KServe's own
    test_server.py sends it nested, ``"data": [[1,2]]``; numpy's ``tolist()`` nests it). A
    UINT64 value past int64 in nested data was refused 'holds non-integer numbers' (numpy
    typed the rows apart, uint64 and int64, and fell back to float64), while the same values
    flat were read."""
    want = np.array(orjson.loads(data), np.uint64).reshape(2, 3)
    got = _decode("UINT64", data, _UINT64)
    assert got.dtype == np.uint64
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("datatype", "data", "message"),
    [
        ("UINT64", "[[-1,1,2],[3,4,5]]", "value -1 is out of range for UINT64"),
        (
            "INT64",
            "[[9223372036854775808,1,2],[3,4,5]]",
            "value 9223372036854775808 is out of range",
        ),
        ("UINT64", "[[1.5,1,2],[3,4,5]]", "'data' holds non-integer numbers, not UINT64"),
    ],
)
def test_nested_64_bit_integers_out_of_range_are_still_refused(
    datatype: str, data: str, message: str
) -> None:
    with pytest.raises(InputError, match=message):
        _decode(datatype, data, _UINT64 if datatype == "UINT64" else _INT64)


def test_not_ready_health_answers_carry_an_error_message(start_server: StartServer) -> None:
    """KServe's model server answers a model that is not ready 503 ``{"error": "Model with
    name X is not ready."}`` (kserve/errors.py, model_not_ready_handler; test_server.py
    test_model_not_ready_error), and the OIP says a failed request's body holds an ``error``;
    KServe's InferenceRESTClient reads that key into the exception it raises. torchplace
    answered ``{"ready": false}`` alone."""
    running = start_server(FakeEngine(ready=False))
    for path, extra in (
        ("/v2/health/ready", {}),
        ("/v2/models/seed-mlp/ready", {"name": "seed-mlp"}),
        ("/v1/models/seed-mlp", {"name": "seed-mlp"}),
    ):
        status, headers, body = running.client.get(path)
        assert (status, headers["content-type"], headers["retry-after"]) == (
            503,
            "application/json",
            "1",
        ), path
        answer = orjson.loads(body)
        assert {k: answer[k] for k in extra} == extra
        assert answer["ready"] is False
        assert "model 'seed-mlp' is not ready" in answer["error"], path
        assert "retry" in answer["error"]


def test_a_null_ready_in_the_repository_index_request_is_not_given(
    start_server: StartServer,
) -> None:
    """MLServer's ``RepositoryIndexRequest.ready`` is ``Optional[bool]`` and its own test
    (tests/rest/test_endpoints.py test_model_repository_index) posts
    ``RepositoryIndexRequest(ready=None).model_dump()``, that is ``{"ready": null}``; it was a
    400 'expected a boolean, got null'. A value that is not a boolean is still refused."""
    running = start_server()
    status, _, body = running.client.post("/v2/repository/index", b'{"ready": null}')
    assert status == 200, body
    everything = orjson.loads(body)
    assert [entry["name"] for entry in everything] == ["seed-mlp"]
    status, _, body = running.client.post("/v2/repository/index", b"{}")
    assert (status, orjson.loads(body)) == (200, everything)
    status, _, body = running.client.post("/v2/repository/index", b'{"ready": "yes"}')
    assert status == 400
    assert (
        "Invalid value for 'ready': expected a boolean, got \"yes\"" in orjson.loads(body)["error"]
    )
