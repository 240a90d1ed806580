"""OIP ``parameters`` over REST JSON: every value a boolean, a number or a string (the
protocol's ``$parameter``), as Triton requires; the known parameters keep their own checks."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from torchplace.errors import InputError, ServeError
from torchplace.models import TensorSpec
from torchplace.serve import protocol
from torchplace.serve.protocol import decode_infer_request

from .conftest import seed_input

SEED_IN = (TensorSpec("input", "FP32", (-1, 8)),)
SEED_OUT = (TensorSpec("output", "FP32", (-1, 2)),)
TRITON = "has invalid type. It should be either 'int', 'bool', or 'string'."


def _decode(doc: dict[str, Any]) -> protocol.InferRequest:
    body = orjson.dumps(doc)
    return decode_infer_request(body, inputs=SEED_IN, outputs=SEED_OUT, max_rows=32)


def _placed(where: str, params: dict[str, Any]) -> dict[str, Any]:
    """A valid request carrying ``params`` on the request, its input or its output."""
    if where == "request":
        return {"inputs": [seed_input()], "parameters": params}
    if where == "input":
        return {"inputs": [seed_input(parameters=params)]}
    return {"inputs": [seed_input()], "outputs": [{"name": "output", "parameters": params}]}


_PLACES = {"request": "the request", "input": "input 'input'", "output": "output 'output'"}
_NOT_SCALARS = [({"a": 1}, "an object"), ([1, 2], "an array"), (None, "null")]


@pytest.mark.parametrize("where", sorted(_PLACES))
@pytest.mark.parametrize(("value", "kind"), _NOT_SCALARS, ids=["object", "array", "null"])
def test_a_parameter_that_is_not_a_scalar_is_refused_naming_it_where_and_what(
    where: str, value: object, kind: str
) -> None:
    with pytest.raises(InputError) as info:
        _decode(_placed(where, {"custom": value}))
    message = str(info.value)
    assert info.value.status == 400
    assert message.startswith(f"parameter 'custom' {TRITON}"), message  # Triton's words first
    assert f"Parameter 'custom' of {_PLACES[where]} is {kind}" in message, message
    assert "a boolean, a number or a string" in message, message


@pytest.mark.parametrize("where", sorted(_PLACES))
def test_scalar_parameters_are_taken_everywhere(where: str) -> None:
    params = {"text": "a", "count": 3, "ratio": 0.5, "flag": True, "off": False}
    decoded = _decode(_placed(where, params))
    assert decoded.rows == 1


def test_the_first_offending_parameter_is_named_among_scalars() -> None:
    with pytest.raises(InputError, match=r"^parameter 'b' has invalid type"):
        _decode(_placed("request", {"a": 1, "b": [1], "c": "x"}))


@pytest.mark.parametrize(
    ("where", "params", "said"),
    [
        ("request", {"timeout": [7, 7]}, "'timeout' must be a non-negative integer"),
        ("request", {"priority": {"level": 1}}, "'priority' must be a non-negative integer"),
        ("request", {"binary_data_output": [True]}, "'binary_data_output' must be true or false"),
        ("output", {"binary_data": {}}, "'binary_data' must be true or false"),
        ("output", {"classification": [3]}, "'classification' must be a positive integer"),
        ("input", {"shared_memory_region": {}, "shared_memory_byte_size": 32}, "region name"),
        ("output", {"shared_memory_region": [], "shared_memory_byte_size": 8}, "region name"),
    ],
)
def test_a_known_parameter_keeps_its_own_message_for_a_structured_value(
    where: str, params: dict[str, Any], said: str
) -> None:
    if where == "input":
        doc = {"inputs": [seed_input(data=None, parameters=params)]}
    else:
        doc = _placed(where, params)
    with pytest.raises(ServeError) as info:  # InputError, or SharedMemoryError for a region
        _decode(doc)
    assert info.value.status == 400
    assert said in str(info.value), str(info.value)
    assert TRITON not in str(info.value)


def test_a_binary_data_size_array_keeps_its_own_message() -> None:
    header = orjson.dumps(
        {"inputs": [seed_input(data=None, parameters={"binary_data_size": [32]})]}
    )
    with pytest.raises(InputError) as info:
        decode_infer_request(
            header + bytes(32),
            inputs=SEED_IN,
            outputs=SEED_OUT,
            max_rows=32,
            header_length=len(header),
        )
    assert "binary_data_size" in str(info.value)
    assert TRITON not in str(info.value)


@pytest.mark.parametrize(
    ("where", "key"),
    [
        ("request", "timeout"),
        ("request", "priority"),
        ("output", "classification"),
        ("input", "binary_data_size"),
    ],
)
def test_null_is_refused_for_a_known_parameter_too(where: str, key: str) -> None:
    """A null ``timeout``, ``priority``, ``classification`` or ``binary_data_size`` was read as
    if it were absent; it is no parameter value (Triton refuses it)."""
    with pytest.raises(InputError) as info:
        _decode(_placed(where, {key: None}))
    assert f"Parameter {key!r} of {_PLACES[where]} is null" in str(info.value)


def test_a_shared_memory_offset_without_a_region_is_still_checked_as_a_value() -> None:
    with pytest.raises(InputError, match="Parameter 'shared_memory_offset' of input 'input' is an"):
        _decode(_placed("input", {"shared_memory_offset": {"at": 0}}))


def test_a_huge_parameter_name_is_quoted_cut() -> None:
    with pytest.raises(InputError) as info:
        _decode(_placed("request", {"k" * 50_000: {}}))
    assert len(str(info.value)) < 1000


def test_a_shared_memory_key_on_the_request_is_a_plain_parameter() -> None:
    """Only an input or an output reads the shared-memory parameters; on the request a
    ``shared_memory_region`` object is a custom parameter like any other."""
    with pytest.raises(InputError, match="Parameter 'shared_memory_offset' of the request is an"):
        _decode(_placed("request", {"shared_memory_region": "r", "shared_memory_offset": {}}))


def test_a_request_without_parameters_never_pays_for_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("checked a request that has no parameters")

    monkeypatch.setattr(protocol, "_check_scalars", refuse)
    assert _decode({"inputs": [seed_input()]}).rows == 1  # the quick path
    assert _decode({"inputs": [seed_input()], "outputs": [{"name": "output"}]}).rows == 1
    with pytest.raises(AssertionError, match="no parameters"):
        _decode(_placed("request", {"a": 1}))
