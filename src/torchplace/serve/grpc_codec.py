"""The Open Inference Protocol over gRPC: ``ModelInferRequest`` to validated arrays and back.

:func:`decode_infer_request` checks a request against the model's declared inputs with the
same rules, and the same messages, as the REST codec (:mod:`torchplace.serve.protocol`):
name, datatype, shape with ``-1`` as the batch dimension, element count, the rows limit and the
NaN policy. Tensor data may come as ``raw_input_contents`` (one entry per input, in order,
little-endian: what ``tritonclient.grpc`` sends) or as the typed ``contents`` fields
(``fp32_contents``...; FP16 and BF16 have none and must be raw). The ``timeout``
(microseconds) and ``priority`` parameters are read as over REST.

:func:`encode_infer_response` answers every output as ``raw_output_contents`` (what
``tritonclient.grpc``'s ``as_numpy`` reads), BF16 rounded to bfloat16 bits as over REST.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from torchplace.errors import InputError
from torchplace.models import TensorSpec
from torchplace.serve.datatypes import HOST_DTYPES
from torchplace.serve.proto import grpc_service_pb2 as pb
from torchplace.serve.protocol import (
    WIRE_DTYPES,
    InferRequest,
    RequestedOutput,
    _bf16_bits,
    _binary_array,
    _check_complete,
    _check_finite,
    _checked_shape,
    _describe,
    _same_rows,
)

__all__ = ["decode_infer_request", "encode_infer_response", "parse_message"]

#: OIP datatype -> the typed ``InferTensorContents`` field that may carry it
_CONTENTS: dict[str, str] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def parse_message(message: Any, data: bytes) -> Any:
    """``data`` parsed as a ``message`` (a protobuf class); InputError when it is not one."""
    try:
        return message.FromString(data)
    except DecodeError as exc:
        raise InputError(
            f"the request is not a valid {message.DESCRIPTOR.full_name} message ({exc}); "
            "build it from the protocol's .proto"
        ) from None


def decode_infer_request(
    message: Any,
    *,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    max_rows: int,
    allow_nan: bool = False,
) -> InferRequest:
    """Validate a ``ModelInferRequest`` into an :class:`~torchplace.serve.protocol.InferRequest`
    (``binary_output`` is meaningless over gRPC: every output is raw)."""
    tensors = message.inputs
    if not tensors:
        raise InputError(
            "request needs 'inputs', a non-empty array; the model takes "
            + ", ".join(_describe(s) for s in inputs)
        )
    raw = message.raw_input_contents
    if raw and len(raw) != len(tensors):
        raise InputError(
            f"the request has {len(tensors)} inputs but {len(raw)} raw_input_contents; give "
            "one raw entry per input, in order, or use the typed contents for every input"
        )
    specs = {s.name: s for s in inputs}
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    rows = -1
    for index, tensor in enumerate(tensors):
        spec = specs.get(tensor.name)
        if spec is None:
            raise InputError(
                f"unknown input {tensor.name!r}; the model takes "
                + ", ".join(_describe(s) for s in inputs)
            )
        if tensor.name in arrays:
            raise InputError(f"input {tensor.name!r} is given twice")
        if "shared_memory_region" in tensor.parameters:
            raise InputError(
                f"input {spec.name!r}: shared-memory inputs are not supported; send data"
            )
        shape = _checked_shape(
            {"datatype": tensor.datatype, "shape": list(tensor.shape)}, spec, max_rows
        )
        count = math.prod(shape)
        if raw:
            if tensor.HasField("contents"):
                raise InputError(
                    f"input {spec.name!r} has both contents and raw_input_contents; send one"
                )
            data = raw[index]
            array = _binary_array(spec, memoryview(data), 0, len(data), shape, count)
        else:
            array = _typed_array(spec, tensor, shape, count)
        array = array.reshape(shape)
        if not allow_nan:
            _check_finite(spec, array)
        rows = _same_rows(spec.name, array, rows)
        arrays[spec.name] = array
    _check_complete(inputs, arrays)
    timeout_us, priority = _parameters(message.parameters)
    return InferRequest(
        id=message.id or None,
        inputs=arrays,
        rows=rows,
        outputs=_requested(message.outputs, outputs),
        binary_output=True,
        timeout_us=timeout_us,
        priority=priority,
    )


def _typed_array(spec: TensorSpec, tensor: Any, shape: list[int], count: int) -> np.ndarray:
    field = _CONTENTS.get(spec.datatype)
    if field is None:
        raise InputError(
            f"input {spec.name!r}: {spec.datatype} has no typed contents field in the protocol; "
            "send it as raw_input_contents (little-endian bytes)"
        )
    values = getattr(tensor.contents, field)
    if len(values) != count:
        others = [f.name for f, _ in tensor.contents.ListFields() if f.name != field]
        wrong = f" ({spec.datatype} goes in {field}, not {others[0]})" if others else ""
        raise InputError(
            f"input {spec.name!r}: shape {shape} needs {count} values but {field} holds "
            f"{len(values)}{wrong}"
        )
    dtype: np.dtype[Any] = HOST_DTYPES[spec.datatype]
    if dtype.kind not in "iu":  # floats and bools: the field already has the type
        return np.array(values, dtype=dtype)
    array = np.array(values, dtype=np.uint64 if field == "uint64_contents" else np.int64)
    info = np.iinfo(dtype)
    if count and (array.min() < info.min or array.max() > info.max):
        bad = array.min() if array.min() < info.min else array.max()
        raise InputError(
            f"input {spec.name!r}: value {bad} is out of range for {spec.datatype} "
            f"({info.min}..{info.max})"
        )
    converted: np.ndarray[Any, Any] = array.astype(dtype, copy=False)
    return converted


def _parameters(params: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The ``timeout`` (microseconds) and ``priority`` parameters of a request."""
    found: list[int | None] = []
    for key, meaning in (("timeout", "microseconds"), ("priority", "a level, 1 first")):
        if key not in params:
            found.append(None)
            continue
        param = params[key]
        which = param.WhichOneof("parameter_choice")
        value: Any = getattr(param, which) if which is not None else None
        if which not in ("int64_param", "uint64_param") or not 0 <= value < 2**63:
            raise InputError(
                f"parameter {key!r} must be a non-negative integer ({meaning}), got {value!r}"
            )
        found.append(value)
    return found[0], found[1]


def _requested(
    requested: Sequence[Any], outputs: Sequence[TensorSpec]
) -> tuple[RequestedOutput, ...] | None:
    if not requested:
        return None
    known = {s.name for s in outputs}
    chosen: list[RequestedOutput] = []
    for entry in requested:
        name = entry.name
        if name not in known:
            raise InputError(
                f"unknown output {name!r}; the model returns "
                + ", ".join(_describe(s) for s in outputs)
            )
        if "classification" in entry.parameters:
            raise InputError(f"output {name!r}: the classification extension is not supported")
        if "shared_memory_region" in entry.parameters:
            raise InputError(f"output {name!r}: shared-memory outputs are not supported")
        if any(c.name == name for c in chosen):
            raise InputError(f"output {name!r} is requested twice")
        chosen.append(RequestedOutput(name, True))
    return tuple(chosen)


def encode_infer_response(
    *,
    model_name: str,
    model_version: str,
    request: InferRequest,
    results: Mapping[str, np.ndarray[Any, Any]],
    outputs: Sequence[TensorSpec],
) -> Any:
    """A ``ModelInferResponse`` with every chosen output as raw little-endian bytes."""
    datatypes = {s.name: s.datatype for s in outputs}
    names = [o.name for o in request.outputs] if request.outputs else list(datatypes)
    response = pb.ModelInferResponse(model_name=model_name, model_version=model_version)
    if request.id is not None:
        response.id = request.id
    for name in names:
        array = results[name]
        datatype = datatypes[name]
        response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        if datatype == "BF16":
            raw = _bf16_bits(array).tobytes()
        else:
            raw = np.ascontiguousarray(array, dtype=WIRE_DTYPES[datatype]).tobytes()
        response.raw_output_contents.append(raw)
    return response
