"""KServe's V1 inference protocol (``POST /v1/models/{name}:predict``), checked as the Open
Inference Protocol request it stands for.

A request is ``{"instances": [...]}`` (or ``{"inputs": [...]}``), one entry per row: for a
model with one input, the row itself (a number, or a nested list in the input's shape without
the batch dimension); for any model, an object naming each input. The columnar form
``{"inputs": {"name": [...], ...}}`` (TensorFlow Serving's) gives each input's rows under its
name instead. It becomes the OIP request
with one tensor per input (the rows stacked) and goes through
:func:`~torchplace.serve.protocol.decode_infer_request`, so the rules and messages are the
OIP's: datatypes, shapes, element counts, NaN, the rows limit.

The answer is ``{"predictions": [...]}``, one entry per row: the output's row for a model with
one output, else an object naming each output (BF16 as the numbers a bfloat16 holds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from torchplace.errors import InputError, PayloadTooLargeError
from torchplace.models import TensorSpec
from torchplace.serve.protocol import (
    MOST_DIMS,
    InferRequest,
    bf16_values,
    check_json_finite,
    check_shape,
    decode_infer_request,
    json_loads,
    nested_shape,
    number_hint,
    shown,
)

__all__ = ["decode_predict_request", "encode_predict_response"]


def decode_predict_request(
    body: bytes,
    *,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    max_rows: int,
    allow_nan: bool = False,
    model: str = "",
) -> InferRequest:
    """A V1 ``:predict`` body, validated as the OIP request of the same rows (``model`` named
    in the messages that name it)."""
    rows, columnar = _instances(body, max_rows)
    _check_names(rows, inputs, columnar)
    tensors = []
    for spec in inputs:
        column = [_value(row, index, spec, inputs) for index, row in enumerate(rows)]
        _check_even(column, spec)
        shape = _column_shape(column, spec, max_rows, model)
        tensors.append(
            {"name": spec.name, "datatype": spec.datatype, "shape": shape, "data": column}
        )
    try:
        document = orjson.dumps({"inputs": tensors})
    except TypeError as exc:  # nested past orjson's depth limit
        raise _too_deep(str(exc)) from None
    return decode_infer_request(
        document,
        inputs=inputs,
        outputs=outputs,
        max_rows=max_rows,
        allow_nan=allow_nan,
        model=model,
    )


def _column_shape(column: list[Any], spec: TensorSpec, max_rows: int, model: str) -> list[int]:
    """The shape of input ``spec``'s rows, checked against the model's before the rows are
    written out as an OIP request and parsed again (rows of the wrong shape cost both, for a
    refusal their first values already told)."""
    shape = nested_shape(column)
    if len(shape) > MOST_DIMS:  # no tensor is this deep (and orjson may not write it out)
        levels, takes = len(shape) - 1, len(spec.shape) - 1
        raise _too_deep(f"{levels} levels in a row, where input {spec.name!r} has {takes}")
    check_shape(spec, shape, max_rows, model)
    return shape


def _too_deep(detail: str) -> InputError:
    return InputError(f"the instances are nested too deeply to be tensor rows ({detail})")


def encode_predict_response(
    results: Mapping[str, np.ndarray[Any, Any]], outputs: Sequence[TensorSpec], model: str = ""
) -> bytes:
    """``{"predictions": [...]}``, one entry per row; an :class:`InputError` (400) for what
    V1's JSON rows cannot carry (NaN or infinite values, several outputs of different lengths),
    naming the V2 route of ``model`` that can."""
    arrays = [(spec.name, _plain(results[spec.name], spec.datatype)) for spec in outputs]
    check_json_finite(  # V1 has no binary form: the V2 route has
        dict(arrays),
        f"V1 answers are JSON only: POST the request to {_v2_route(model)} with the output "
        'asked for as binary data ("binary_data": true) to get them',
    )
    predictions: Any = arrays[0][1] if len(arrays) == 1 else _rows_of_outputs(arrays, model)
    return orjson.dumps({"predictions": predictions}, option=orjson.OPT_SERIALIZE_NUMPY)


def _rows_of_outputs(
    arrays: Sequence[tuple[str, np.ndarray[Any, Any]]], model: str
) -> list[dict[str, Any]]:
    """Several outputs as one object per row, when they share the batch dimension."""
    lengths = {name: len(array) if array.ndim else None for name, array in arrays}
    if len(set(lengths.values())) > 1 or None in lengths.values():
        raise InputError(
            f"the outputs do not share a batch dimension (rows per output: {shown(lengths)}), "
            f"so V1 cannot answer them as one prediction per row; POST the request to "
            f"{_v2_route(model)}, which answers each output whole"
        )
    rows = len(arrays[0][1])
    return [{name: array[row] for name, array in arrays} for row in range(rows)]


def _v2_route(model: str) -> str:
    return f"/v2/models/{model or '{name}'}/infer"


def _instances(body: bytes, max_rows: int) -> tuple[list[Any], bool]:
    """The request's rows, refused past ``max_rows`` before any is built (a columnar body of
    millions of numbers would otherwise become as many row objects: gigabytes, and seconds of
    the event loop), and whether they came in the columnar form."""
    try:
        doc = json_loads(body)
    except orjson.JSONDecodeError as exc:
        raise InputError(f"the body is not valid JSON: {exc}{number_hint(exc)}") from None
    if isinstance(doc, dict) and "instances" in doc and "inputs" in doc:
        raise InputError(
            "the request has both 'instances' and 'inputs'; send one of them: 'instances' "
            "(one entry per row) or 'inputs' (the same rows, or each input's rows under its name)"
        )
    rows = doc.get("instances", doc.get("inputs")) if isinstance(doc, dict) else None
    columnar = False
    if isinstance(rows, dict) and "instances" not in doc:
        rows, columnar = _rows_of_columns(rows, max_rows), True
    if isinstance(rows, list) and len(rows) > max_rows:
        raise _too_many(len(rows), max_rows)
    if not isinstance(rows, list) or not rows:
        raise InputError(
            'a V1 request is {"instances": [...]}, a non-empty array with one entry per row '
            '(or {"inputs": {"name": [...]}}, the rows of each input under its name)'
        )
    if isinstance(rows[0], dict) and "datatype" in rows[0]:
        raise InputError(
            "this is an Open Inference Protocol (v2) request; send it to "
            "/v2/models/{name}/infer, or send V1 rows as 'instances'"
        )
    return rows, columnar


def _too_many(rows: int, max_rows: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(
        f"{rows} instances is over the limit of {max_rows} rows per request "
        "(--max-request-rows); split the request"
    )


def _rows_of_columns(columns: dict[str, Any], max_rows: int) -> list[dict[str, Any]]:
    """The columnar form's rows: ``{"a": [a0, a1], "b": [b0, b1]}`` as
    ``[{"a": a0, "b": b0}, {"a": a1, "b": b1}]``."""
    counts = {name: len(rows) if isinstance(rows, list) else 0 for name, rows in columns.items()}
    if not counts or 0 in counts.values():
        raise InputError(
            'columnar "inputs" maps each input name to a non-empty array with one entry per row, '
            'e.g. {"inputs": {"input": [[1, 2], [3, 4]]}}'
        )
    if len(set(counts.values())) > 1:
        raise InputError(
            f'columnar "inputs" must give every input the same number of rows; got {shown(counts)}'
        )
    (count,) = set(counts.values())
    if count > max_rows:
        raise _too_many(count, max_rows)
    return [{name: rows[i] for name, rows in columns.items()} for i in range(count)]


def _check_names(rows: list[Any], inputs: Sequence[TensorSpec], columnar: bool) -> None:
    """Refuse an instance (or a column) naming a value the model does not take (a misspelled
    input would otherwise be dropped, and the rest answered)."""
    names = {spec.name for spec in inputs}
    for index, row in enumerate(rows):
        if isinstance(row, dict) and not names.issuperset(row):
            extra = next(key for key in row if key not in names)
            if extra == "b64" and len(inputs) == 1:  # KServe's image examples send this
                raise _base64(index, inputs[0])
            where = 'columnar "inputs"' if columnar else f"instance {index}"
            raise InputError(
                f"{where} names input {shown(extra)}, which the model does not take; "
                "it takes " + ", ".join(repr(s.name) for s in inputs)
            )


def _base64(index: int, spec: TensorSpec) -> InputError:
    """V1's ``{"b64": ...}`` for an input: base64 bytes are BYTES, which no input here takes."""
    return InputError(
        f'instance {index} gives input {spec.name!r} as {{"b64": ...}}, KServe V1\'s form of '
        "binary (BYTES) data, which no input here takes (BYTES is not a tensor type torch can "
        f"take); give its {spec.datatype} values as numbers, nested in its shape without the "
        f"batch dimension ({list(spec.shape[1:])})"
    )


def _value(row: Any, index: int, spec: TensorSpec, inputs: Sequence[TensorSpec]) -> Any:
    """Input ``spec``'s part of one row."""
    if isinstance(row, dict):
        if spec.name not in row:
            raise InputError(
                f"instance {index} has no input {spec.name!r}; the model takes "
                + ", ".join(repr(s.name) for s in inputs)
            )
        value = row[spec.name]
        if isinstance(value, dict):  # not a row of numbers: the OIP decoder would call it [1]
            if "b64" in value:
                raise _base64(index, spec)
            raise InputError(
                f"instance {index} gives input {spec.name!r} as a JSON object; give its "
                f"{spec.datatype} values as numbers, nested in its shape without the batch "
                f"dimension ({list(spec.shape[1:])})"
            )
        return value
    if len(inputs) > 1:
        raise InputError(
            f"the model takes {len(inputs)} inputs ("
            + ", ".join(repr(s.name) for s in inputs)
            + "): give each instance as an object naming them"
        )
    return row


def _check_even(column: list[Any], spec: TensorSpec) -> None:
    """Every instance's part of input ``spec`` has the first one's shape (read as
    :func:`~torchplace.serve.protocol.nested_shape` reads it): else the instance that differs is
    named, with both shapes."""
    first = nested_shape(column[0])
    for index in range(1, len(column)):
        shape = nested_shape(column[index])
        if shape != first:
            raise InputError(
                f"instance {index} gives input {spec.name!r} in shape {shape}, where instance 0 "
                f"gives {first}; give every instance the same shape (the model takes "
                f"{list(spec.shape[1:])} per instance)"
            )


def _plain(array: np.ndarray[Any, Any], datatype: str) -> np.ndarray[Any, Any]:
    return bf16_values(array) if datatype == "BF16" else np.ascontiguousarray(array)
