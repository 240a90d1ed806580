"""The OpenAPI document: it describes every served model, is valid, and the API survives
schemathesis fuzzing (no 5xx)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings

from torchplace.models import TensorSpec
from torchplace.serve.openapi import openapi_document
from torchplace.serve.running import ServerThread

from .conftest import test_config


@pytest.fixture(scope="module")
def api() -> Iterator[ServerThread]:
    thread = ServerThread(test_config(device="cpu")).start(timeout=120)
    try:
        yield thread
    finally:
        thread.stop()


def test_schemathesis_finds_no_server_errors(api: ServerThread) -> None:
    schemathesis = pytest.importorskip("schemathesis")
    from schemathesis.generation import GenerationMode

    schema = schemathesis.openapi.from_url(f"{api.url}/v2/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    seen: dict[str, set[int]] = {}
    for operation in operations:
        _fuzz(operation, GenerationMode.POSITIVE, api.url, seen)
        if operation.body:  # bodies that break the schema on purpose
            _fuzz(operation, GenerationMode.NEGATIVE, api.url, seen)
    infer = seen["POST /v2/models/{MODEL_NAME}/infer"]
    assert 400 in infer, infer  # the fuzzer reached the decoder
    print({k: sorted(v) for k, v in seen.items()})


def _fuzz(operation: object, mode: object, base_url: str, seen: dict[str, set[int]]) -> None:
    label = f"{operation.method.upper()} {operation.path}"  # type: ignore[attr-defined]
    statuses = seen.setdefault(label, set())

    @given(case=operation.as_strategy(generation_mode=mode))  # type: ignore[attr-defined]
    @settings(
        max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def check(case: object) -> None:
        response = case.call(base_url=base_url)  # type: ignore[attr-defined]
        statuses.add(response.status_code)
        assert response.status_code < 500, (label, response.status_code, response.text)

    check()


@dataclass
class _Model:
    name: str
    version: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_request_rows: int


def test_the_document_describes_every_served_model() -> None:
    first = _Model(
        "a", "1", (TensorSpec("x", "FP32", (-1, 4)),), (TensorSpec("y", "FP32", (-1, 2)),), 64
    )
    second = _Model(
        "b",
        "3",
        (TensorSpec("tokens", "INT64", (-1, 8)),),
        (TensorSpec("y", "FP32", (-1, 1)),),
        512,
    )
    doc = openapi_document([first, second])
    assert "model 'a' version '1', model 'b' version '3'" in doc["info"]["description"]
    schemas = doc["components"]["schemas"]
    assert schemas["request_input"]["properties"]["name"]["enum"] == ["x", "tokens"]
    assert schemas["request_output"]["properties"]["name"]["enum"] == ["y"]
    infer = doc["paths"]["/v2/models/{MODEL_NAME}/infer"]
    assert "1..512 rows" in infer["post"]["description"]
    assert infer["parameters"][0]["example"] == "a"  # the first model gives the examples
    with pytest.raises(ValueError, match="at least one"):
        openapi_document([])
