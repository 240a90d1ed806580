"""The Open Inference Protocol (KServe v2 REST) codec, with Triton's binary tensor extension.

:func:`decode_infer_request` turns an HTTP body into an :class:`InferRequest` whose arrays are
already validated against the model's declared inputs (name, datatype, shape with ``-1`` as the
batch dimension, element count, NaN policy); every problem raises
:class:`~torchplace.errors.InputError` naming the input and what was expected.
:func:`encode_infer_response` does the reverse for outputs, as JSON ``data`` or as binary tensor
data (``binary_data`` per output, ``binary_data_output`` for all) after the JSON header, whose
length then goes in the ``Inference-Header-Content-Length`` header. With Triton's system
shared-memory extension an input's bytes come from a registered region, and an output's go to
one (its answer then carries no data): the ``shared_memory_*`` parameters, looked up in a
:class:`~torchplace.serve.shm.SharedMemoryRegions`.

Datatypes map to little-endian numpy dtypes; ``BF16`` travels as ``float32`` arrays inside the
server: decoded exactly from bfloat16 bits (binary) or numbers (JSON), and on the way out
rounded to nearest even bfloat16, as bits (binary) or as the numbers those bits hold (JSON).
``BYTES`` is not a torch type and is refused as an input; an output asked for with Triton's
``classification`` parameter is answered as ``BYTES`` (:mod:`torchplace.serve.classification`).
"""

from __future__ import annotations

import math
import reprlib
import sys
from array import array as c_array
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, cast

import numpy as np
import orjson

from torchplace.errors import InputError, PayloadTooLargeError, SharedMemoryError
from torchplace.models import TensorSpec
from torchplace.serve.classification import CLASSIFIABLE, classify, serialize_bytes
from torchplace.serve.datatypes import HOST_DTYPES
from torchplace.serve.shm import SharedMemoryRegions, Target, check_region_named

__all__ = [
    "MOST_DIMS",
    "WIRE_DTYPES",
    "InferRequest",
    "RequestedOutput",
    "bf16_values",
    "check_json_finite",
    "check_output_room",
    "check_rank",
    "check_request_id",
    "check_reserved",
    "check_shape",
    "class_count",
    "decode_infer_request",
    "encode_infer_response",
    "json_loads",
    "model_metadata",
    "nested_shape",
    "number_hint",
    "output_target",
    "server_metadata",
    "shared_memory_array",
    "shown",
]

#: OIP datatype -> the dtype of its elements on the wire (binary extension, little-endian).
WIRE_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
# numpy kinds a JSON list may decode to for each datatype (bools are not numbers here).
_FLOAT_KINDS = frozenset("iuf")
_INT_KINDS = frozenset("iu")
_JSON_KINDS: dict[str, frozenset[str]] = {
    name: frozenset("b")
    if name == "BOOL"
    else _FLOAT_KINDS
    if name in ("FP16", "BF16", "FP32", "FP64")
    else _INT_KINDS
    for name in WIRE_DTYPES
}
_JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY
# The quick path (:func:`_quick_json_array`): float datatypes, the largest finite value of each.
_QUICK_LIMITS: dict[str, float] = {
    "FP16": float(np.finfo(np.float16).max),
    "FP32": float(np.finfo(np.float32).max),
    "FP64": sys.float_info.max,
}
_QUICK_MAX_VALUES = 256  # past this, numpy's vectorised checks beat per-element Python ones
_FLOATS = frozenset((float,))
_NUMBERS = frozenset((float, int))
#: the registry of a caller that gives none: client shared memory is off
_NO_REGIONS = SharedMemoryRegions(allowed=False)
_NO_LABELS: Mapping[str, Sequence[str]] = {}


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    """An output the client asked for, and whether it wants it as binary tensor data or
    written into a shared-memory region (``target``), and as its top
    ``classes`` classes instead of its values (Triton's classification extension)."""

    name: str
    binary: bool
    target: Target | None = field(default=None, compare=False)
    classes: int = 0


@dataclass(slots=True)
class InferRequest:
    """A decoded, validated inference request (not frozen: made for every request, and a frozen
    dataclass's ``__init__`` costs four times as much)."""

    id: str | None
    inputs: dict[str, np.ndarray[Any, Any]]
    rows: int
    outputs: tuple[RequestedOutput, ...] | None
    binary_output: bool
    #: the ``timeout`` parameter: how long it may stay queued, in microseconds (0: default)
    timeout_us: int | None = None
    #: the ``priority`` parameter: its level, 1 first (0: default)
    priority: int | None = None


class _Shown(reprlib.Repr):
    """``reprlib``'s cut repr, and a whole float past 64 bits said to be one: JSON parsing reads
    an integer past 64 bits (``18446744073709551616``) as a float, which alone would tell the
    client that sent an integer it sent ``1.8446744073709552e+19``."""

    def repr_float(self, value: float, level: int) -> str:
        text = repr(value)
        if math.isfinite(value) and not -(2**63) <= value < 2**64 and value == math.trunc(value):
            return f"{text} (past 64 bits: a JSON integer this large is read as a float)"
        return text


_SHOWN = _Shown()
_SHOWN.maxstring = _SHOWN.maxother = 200
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = 16
_SHOWN.maxlevel = 4


def shown(value: object) -> str:
    """``repr(value)`` for a message, of a value a client sent: long strings and arrays cut (a
    shape of millions of entries would cost the event loop its repr and be echoed back whole)."""
    return _SHOWN.repr(value)


def _fail(message: str) -> InputError:
    return InputError(message)


class _ModelWords(InputError):
    """An error in Triton's words (its clients and tests match on them), which name the model:
    ``render(model)`` writes it ('' when the name is not known here), and the decoder writes it
    again once it is (:meth:`of_model`)."""

    def __init__(self, render: Callable[[str], str], model: str = "") -> None:
        self.render = render
        super().__init__(render(model))

    def of_model(self, model: str) -> InputError:
        return _ModelWords(self.render, model) if model else self


def _for(model: str) -> str:
    return f" for model {model!r}" if model else ""


def _dims(shape: Sequence[object]) -> str:
    """A shape as Triton writes one: ``[-1,16]`` (past 16 dimensions, cut; an entry that is
    not an integer, as a client sent it, cut too)."""
    more = f",... {len(shape) - 16} more" if len(shape) > 16 else ""
    return "[" + ",".join(str(d) if type(d) is int else shown(d) for d in shape[:16]) + more + "]"


#: dimensions past which a shape the model does not declare so is refused by its rank alone,
#: before any dimension is read (numpy's arrays have at most 64): a shape of millions of them
#: would otherwise be walked, over REST and gRPC, before the rank was compared
MOST_DIMS = 64


def check_rank(spec: TensorSpec, shape: Sequence[object]) -> None:
    """Refuse a shape of more than :data:`MOST_DIMS` dimensions where ``spec`` has another
    number, by its length alone: none of its dimensions is read."""
    if len(shape) > MOST_DIMS and len(shape) != len(spec.shape):
        raise _ModelWords(
            lambda m: (
                f"unexpected shape for input {spec.name!r}{_for(m)}. Expected "
                f"{_dims(spec.shape)}, got {_dims(shape)}: {len(shape)} dimensions, where it "
                f"has {len(spec.shape)}"
            )
        )


def _unknown_input(name: str, inputs: Sequence[TensorSpec]) -> InputError:
    takes = ", ".join(_describe(s) for s in inputs)
    return _ModelWords(
        lambda m: f"unexpected inference input {shown(name)}{_for(m)}; it takes {takes}"
    )


def _unknown_output(name: str, outputs: Sequence[TensorSpec]) -> InputError:
    gives = ", ".join(_describe(s) for s in outputs)
    return _ModelWords(
        lambda m: f"unexpected inference output {shown(name)}{_for(m)}; it returns {gives}"
    )


def _size_mismatch(name: str, expected: int, got: object, detail: str) -> InputError:
    return _ModelWords(
        lambda m: (
            f"input byte size mismatch for input {name!r}{_for(m)}. Expected {expected}, "
            f"got {got}: {detail}"
        )
    )


def _kind_name(value: object) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def decode_infer_request(
    body: bytes | bytearray | memoryview,
    *,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    max_rows: int,
    header_length: int | None = None,
    allow_nan: bool = False,
    regions: SharedMemoryRegions = _NO_REGIONS,
    model: str = "",
) -> InferRequest:
    """Decode and validate an OIP inference request body (JSON, or JSON + binary tensors);
    more than ``max_rows`` rows is :class:`~torchplace.errors.PayloadTooLargeError` (413).
    Inputs and outputs in shared memory are looked up in ``regions``; ``model`` names the
    model in the messages that Triton's name it in."""
    try:
        return _decode_request(body, inputs, outputs, max_rows, header_length, allow_nan, regions)
    except _ModelWords as exc:
        raise exc.of_model(model) from None


def _decode_request(
    body: bytes | bytearray | memoryview,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    max_rows: int,
    header_length: int | None,
    allow_nan: bool,
    regions: SharedMemoryRegions,
) -> InferRequest:
    if header_length is None:  # JSON only: parsed as it came, no view
        json_part: bytes | bytearray | memoryview = body
        binary = None
    else:
        view = memoryview(body)
        if header_length == 0:
            return _raw_request(view, inputs, allow_nan)
        if not 0 <= header_length <= len(view):
            raise _fail(  # Triton's words first
                f"inference header size should be in range (0, {len(view)}), got: "
                f"{header_length}; Inference-Header-Content-Length {header_length} is outside "
                f"the body of {len(view)} bytes, it must give the length of the JSON header"
            )
        json_part, binary = view[:header_length], view[header_length:]
    try:
        doc = json_loads(json_part)
    except orjson.JSONDecodeError as exc:
        hint = number_hint(exc) or (
            _binary_hint(json_part) if binary is None else _header_hint(exc, len(json_part))
        )
        raise _fail(f"request body is not valid JSON: {exc}{hint}") from None
    if not isinstance(doc, dict):
        raise _fail(f"request body must be a JSON object, not {_kind_name(doc)}")
    if len(inputs) == 1 and binary is None:
        # a list long enough for the long path takes at least two bytes a value
        bools = len(body) <= 2 * _QUICK_MAX_VALUES or _may_hold_bools(body)
        quick = _quick_request(doc, inputs[0], max_rows, bools)
        if quick is not None:
            return quick
    request_id = doc.get("id")
    if request_id is not None:
        check_request_id(request_id)
    binary_output, timeout_us, priority = _request_parameters(doc.get("parameters"))
    arrays, offset = _decode_inputs(doc.get("inputs"), inputs, binary, max_rows, allow_nan, regions)
    if binary is not None and offset != len(binary):
        have = len(binary)
        raise _ModelWords(  # Triton's words first
            lambda m: (
                f"unexpected additional input data{_for(m)}: the binary section has {have} "
                f"bytes but the inputs' binary_data_size add up to {offset}; the sizes must "
                "match the data exactly"
            )
        )
    rows = len(next(iter(arrays.values())))
    requested = _requested_outputs(doc.get("outputs"), outputs, binary_output, regions)
    check_output_room(requested, outputs, rows)
    return InferRequest(
        id=request_id,
        inputs=arrays,
        rows=rows,
        outputs=requested,
        binary_output=binary_output,
        timeout_us=timeout_us,
        priority=priority,
    )


#: the tokens Python's ``json.dumps`` writes for non-finite floats (unless ``allow_nan=False``;
#: ``tritonclient.http`` writes its JSON tensors so), which JSON does not have
_NON_FINITE_TOKENS = ("NaN", "Infinity", "-Infinity")


def number_hint(exc: orjson.JSONDecodeError) -> str:
    """For a body that does not parse because of a number JSON cannot carry: a ``NaN`` or
    ``Infinity`` token, or a number past float64's range (read as infinite), what to send
    instead ("" for any other parse error)."""
    if exc.msg == "number is infinity when parsed as double":
        return (
            "; a number past float64's range (about ±1.8e308) is infinite: send numbers "
            "in the range of the tensor's datatype"
        )
    doc, pos = exc.doc, exc.pos
    if any(doc.startswith(token, at) for token in _NON_FINITE_TOKENS for at in (pos, pos - 1)):
        return (
            "; JSON has no NaN or Infinity (Python's json.dumps writes them unless told "
            "allow_nan=False): send finite numbers, NaN as null to a server started with "
            "--allow-nan, or non-finite values as binary tensor data"
        )
    return ""


def _binary_hint(body: bytes | bytearray | memoryview) -> str:
    """For a body that does not parse as JSON and came without a JSON length, yet names a
    ``binary_data_size``: the binary data after the JSON is what broke it (a client that
    forgot the header), so say which header is missing."""
    if b'"binary_data_size"' not in bytes(body):
        return ""
    return (
        "; it names a binary_data_size: if binary tensor data follows the JSON, give the "
        "JSON's length in bytes in the Inference-Header-Content-Length header (Triton's "
        "binary tensor data extension)"
    )


def _header_hint(exc: orjson.JSONDecodeError, length: int) -> str:
    """For a JSON header (the body's first ``length`` bytes, as Inference-Header-Content-Length
    says) that does not parse: what that length made of it, and the fix (a client that counted
    the JSON's characters, not its bytes, or counted a separator, is one or a few bytes off)."""
    if exc.msg == "unexpected content after document":
        what = f"is longer than the JSON header (something follows it at byte {exc.pos})"
    elif exc.msg == "unexpected end of data":
        what = "cuts the JSON header short"
    else:
        what = f"takes the body's first {length} bytes as the JSON header"
    return (
        f"; Inference-Header-Content-Length {length} {what}: give the JSON header's exact "
        "length in bytes, with the binary tensor data after it"
    )


def _raw_request(body: memoryview, inputs: Sequence[TensorSpec], allow_nan: bool) -> InferRequest:
    """Triton's raw binary request (``Inference-Header-Content-Length: 0``): the body is the
    one input's bytes, one row; every output is answered as binary data."""
    if len(inputs) != 1:
        takes = ", ".join(_describe(s) for s in inputs)
        raise _ModelWords(  # Triton's words first: its clients and tests match on them
            lambda m: (
                f"Raw request must only have 1 input (found 1) to be deduced but got "
                f"{len(inputs)} inputs in {repr(m) if m else 'the'} model configuration: a raw "
                "binary request (Inference-Header-Content-Length: 0) needs a model with one input; "
                f"this one takes {takes}; send the JSON header with the binary data"
            )
        )
    spec = inputs[0]
    shape = _raw_shape(spec, len(body))
    try:
        array = _binary_array(
            spec, body, 0, len(body), shape, math.prod(shape), "the raw body's byte size"
        )
    except InputError as exc:
        raise _fail(
            f"{exc}; with Inference-Header-Content-Length: 0 the whole body is one row of the "
            "input's raw bytes"
        ) from None
    array = array.reshape(shape)
    if not allow_nan:
        _check_finite(spec, array)
    return InferRequest(None, {spec.name: array}, 1, None, True)


def _raw_shape(spec: TensorSpec, size: int) -> list[int]:
    """One row of ``spec`` in ``size`` bytes: its fixed dimensions, and at most one variable
    one worked out from the byte count (as Triton does)."""
    shape = [1, *spec.shape[1:]]
    variable = [i for i, d in enumerate(shape) if d < 0]
    if len(variable) > 1:
        raise _fail(  # Triton's words first
            f"The shape of the raw input {spec.name!r} can not be deduced because there are "
            "more than one variable-sized dimension: a raw binary request needs at most one "
            f"in a row, but it is {list(spec.shape)}; send the JSON header with the binary data"
        )
    if variable:
        fixed = math.prod(d for d in shape if d >= 0) * WIRE_DTYPES[spec.datatype].itemsize
        shape[variable[0]] = size // fixed if fixed and size % fixed == 0 else -1
        if shape[variable[0]] < 1:
            raise _fail(
                f"input byte size mismatch for input {spec.name!r}: the raw body's {size} "
                f"bytes do not fill a row of {list(spec.shape[1:])} {spec.datatype} (a "
                f"positive multiple of {fixed} bytes)"
            )
    return shape


def _quick_request(
    doc: dict[str, Any], spec: TensorSpec, max_rows: int, bools: bool = True
) -> InferRequest | None:
    """A request of its one input and nothing else (an ``id`` string at most), decoded by
    :func:`_quick_json_array` (``bools`` as it takes it); None for anything else."""
    raw_inputs = doc.get("inputs")
    request_id = doc.get("id")
    if (
        type(raw_inputs) is not list
        or len(raw_inputs) != 1
        or len(doc) != (1 if request_id is None else 2)
        or (
            request_id is not None
            and (type(request_id) is not str or len(request_id) > MAX_ID_CHARS)
        )
    ):
        return None
    raw = raw_inputs[0]
    if type(raw) is not dict or raw.get("name") != spec.name:
        return None
    array = _quick_json_array(raw, spec, max_rows, bools)
    if array is None:
        return None
    return InferRequest(request_id, {spec.name: array}, len(array), None, False)


#: the longest request ``id`` taken (characters): it is echoed in the answer, so a huge one would
#: double what the request holds and cost the event loop its copies
MAX_ID_CHARS = 4096


def check_request_id(request_id: object) -> None:
    """Refuse an ``id`` that is not a string, or longer than :data:`MAX_ID_CHARS`."""
    if not isinstance(request_id, str):
        raise _fail(f"'id' must be a string, not {_kind_name(request_id)}")
    if len(request_id) > MAX_ID_CHARS:
        raise _fail(
            f"'id' is {len(request_id)} characters long, over the limit of {MAX_ID_CHARS}; "
            "send a shorter request id"
        )


def _request_parameters(params: object) -> tuple[bool, int | None, int | None]:
    """``binary_data_output``, ``timeout`` (microseconds) and ``priority`` of a request."""
    if params is None:
        return False, None, None
    if not isinstance(params, dict):
        raise _fail(f"'parameters' must be an object, not {_kind_name(params)}")
    check_reserved(params)
    _check_scalars(params, "the request", _REQUEST_CHECKED)
    flag = params.get("binary_data_output", False)
    if not isinstance(flag, bool):
        raise _fail("parameter 'binary_data_output' must be true or false")
    found: list[int | None] = []
    for key, meaning, bound in _SCHEDULE_PARAMETERS:
        value = params.get(key)
        if value is not None and (type(value) is not int or not 0 <= value < bound):
            raise _fail(
                f"parameter {key!r} must be a non-negative integer below "
                f"2**{bound.bit_length() - 1} ({meaning}), got {shown(value)}"
            )
        found.append(value)
    return flag, found[0], found[1]


#: the types of a parameter value: the protocol's ``$parameter`` is a boolean, a number or a string
_SCALARS = frozenset((bool, int, float, str))
#: the parameters of the shared-memory extension, checked together where a region is named
_SHM_KEYS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")
#: parameters whose own checks refuse any value they do not take (and say what they take)
_REQUEST_CHECKED = ("binary_data_output", "timeout", "priority")
_INPUT_CHECKED = ("binary_data_size",)
_OUTPUT_CHECKED = ("binary_data", "classification")
_ARTICLES = {"object": "an object", "array": "an array"}


def _check_scalars(
    params: Mapping[str, object],
    where: str,
    checked: tuple[str, ...],
    shm: bool = False,
    name: str | None = None,
) -> None:
    """Refuse a parameter whose value is not a boolean, a number or a string (an object, an
    array, null), in Triton's words; ``where`` and ``name`` say whose parameters they are
    (``the request``; ``input`` or ``output`` and its name, shown only in a refusal). A non-null
    value of a ``checked`` parameter is left to that parameter's own check, as are the
    shared-memory ones (``shm``: an input's or output's) once a region is named, the only time
    they are read. When all are scalars (the common case) this is one pass in C."""
    if _SCALARS.issuperset(map(type, params.values())):
        return
    if shm and "shared_memory_region" in params:
        checked = (*checked, *_SHM_KEYS)
    for key, value in params.items():
        if type(value) in _SCALARS or (value is not None and key in checked):
            continue
        kind = _kind_name(value)
        whose = where if name is None else f"{where} {shown(name)}"
        raise _fail(  # Triton's words first
            f"parameter {shown(key)} has invalid type. It should be either 'int', 'bool', or "
            f"'string'. Parameter {shown(key)} of {whose} is "
            f"{_ARTICLES.get(kind, kind)}; a parameter value is a boolean, a number or a "
            "string (the Open Inference Protocol's $parameter): send one of those, with any "
            "structure encoded as a JSON string"
        )


#: the schedule policy extension's request parameters, what they mean, and the bound of their
#: values: Triton reads ``priority`` as an unsigned 64-bit integer (one past the server's levels
#: is the default level), ``timeout`` as microseconds that must fit in a signed one
_SCHEDULE_PARAMETERS = (
    ("timeout", "microseconds", 2**63),
    ("priority", "a level, 1 first", 2**64),
)


def check_reserved(params: Iterable[str], allowed: Iterable[str] = ()) -> None:
    """Refuse request parameters named with the ``triton_`` prefix, which Triton keeps for
    itself (its parameters extension), in its words; ``allowed``: those it takes anyway."""
    for key in params:
        if isinstance(key, str) and key.startswith("triton_") and key not in allowed:
            raise _fail(
                "parameter keys starting with 'triton_' are reserved for Triton usage and "
                f"should not be specified: {key!r}; give the custom parameter another name"
            )


def _decode_inputs(
    raw_inputs: object,
    inputs: Sequence[TensorSpec],
    binary: memoryview | None,
    max_rows: int,
    allow_nan: bool,
    regions: SharedMemoryRegions,
) -> tuple[dict[str, np.ndarray[Any, Any]], int]:
    """Every entry of ``inputs``, decoded and checked; the arrays and the binary offset. A
    one-input model's common binary request is read by :func:`_quick_binary_array`."""
    if len(inputs) == 1 and binary is not None:
        quick = _quick_binary_array(raw_inputs, inputs[0], binary, max_rows)
        if quick is not None:
            if not allow_nan:
                _check_finite(inputs[0], quick)
            return {inputs[0].name: quick}, len(binary)
    if not isinstance(raw_inputs, list):
        raise _fail(
            "request needs 'inputs', a non-empty array; the model takes "
            + ", ".join(_describe(s) for s in inputs)
        )
    if not raw_inputs:  # no inputs at all: Triton's count of what is missing
        _check_complete(inputs, {})
    specs = {s.name: s for s in inputs}
    arrays: dict[str, np.ndarray[Any, Any]] = {}
    offset = 0
    rows = -1
    for raw in raw_inputs:
        if not isinstance(raw, dict):
            raise _fail(f"each entry of 'inputs' must be an object, not {_kind_name(raw)}")
        name = raw.get("name")
        if not isinstance(name, str):
            raise _fail("each input needs a 'name' string")
        spec = specs.get(name)
        if spec is None:
            raise _unknown_input(name, inputs)
        if name in arrays:
            raise _given_twice(name)
        array = _quick_json_array(raw, spec, max_rows)
        if array is None:
            array, offset = _decode_input(raw, spec, binary, offset, max_rows, allow_nan, regions)
        rows = _same_rows(name, array, rows)
        arrays[name] = array
    _check_complete(inputs, arrays)
    return arrays, offset


def _given_twice(name: str) -> InputError:
    """An input named twice, in Triton's words (its output's are alike)."""
    return _fail(f"input {name!r} already exists in request; give each input once")


def _same_rows(name: str, array: np.ndarray[Any, Any], rows: int) -> int:
    """The batch size so far (-1: none yet), checked against one more input's rows."""
    if rows != -1 and len(array) != rows:
        have = len(array)
        raise _ModelWords(  # Triton's words first
            lambda m: (
                f"input {name!r} batch size does not match other inputs"
                f"{f' for {m!r}' if m else ''}: it has {have} rows but another input has "
                f"{rows}; every input must have the same batch size"
            )
        )
    return len(array)


def _check_complete(inputs: Sequence[TensorSpec], arrays: Mapping[str, object]) -> None:
    """Every declared input was given."""
    missing = [s.name for s in inputs if s.name not in arrays]
    if missing:
        given, lacking = _names(arrays), _names(missing)
        takes = ", ".join(_describe(s) for s in inputs)
        raise _ModelWords(
            lambda m: (
                f"expected {len(inputs)} inputs but got {len(arrays)} inputs{_for(m)}. "
                f"Got input(s) {given}, but missing required input(s) {lacking}. Please provide "
                f"all required input(s). The model takes {takes}"
            )
        )


def _names(names: Iterable[str]) -> str:
    """Tensor names as Triton lists them: ``['INPUT0','INPUT1']``."""
    return "[" + ",".join(f"'{n}'" for n in names) + "]"


def _describe(spec: TensorSpec) -> str:
    return f"{spec.name!r} ({spec.datatype}, shape {list(spec.shape)})"


def _decode_input(
    raw: dict[str, Any],
    spec: TensorSpec,
    binary: memoryview | None,
    offset: int,
    max_rows: int,
    allow_nan: bool,
    regions: SharedMemoryRegions = _NO_REGIONS,
) -> tuple[np.ndarray[Any, Any], int]:
    """One entry of ``inputs`` -> its validated array (in its host dtype) and the next offset
    into the binary section."""
    shape = _checked_shape(raw, spec, max_rows)
    count = math.prod(shape)
    params = raw.get("parameters")
    size = None
    from_json = False
    if params is not None:
        if not isinstance(params, dict):
            raise _fail(f"input {spec.name!r}: 'parameters' must be an object")
        _check_scalars(params, "input", _INPUT_CHECKED, shm=True, name=spec.name)
        check_region_named(spec.name, params)
        size = params.get("binary_data_size")
    if params is not None and "shared_memory_region" in params:
        if size is not None or raw.get("data") is not None:
            raise _fail(
                f"input {spec.name!r} has 'shared_memory_region' and also "
                f"{'binary_data_size' if size is not None else 'data'!r}; send one"
            )
        array = shared_memory_array(spec, params, regions, shape, count)
    elif size is not None:
        if raw.get("data") is not None:
            raise _fail(f"input {spec.name!r} has both 'data' and 'binary_data_size'; send one")
        array = _binary_array(spec, binary, offset, size, shape, count)
        offset += size
    else:
        array = _json_array(spec, raw.get("data"), shape, count)
        from_json = True
    array = array.reshape(shape)
    if not allow_nan:
        _check_finite(spec, array, json=from_json)
    return array, offset


#: marks looked at one by one before :func:`_holds_word` falls back to the plain search
_MAX_MARKS = 16
_SHORT_TEXT = 4096  # bytes: below it _holds_word searches for the word itself


def _may_hold_bools(body: object) -> bool:
    """False when the JSON text ``body`` cannot hold a boolean: it has neither literal (a
    string holding the word, an ``id`` say, only makes this True, which is always safe)."""
    if not isinstance(body, (bytes, bytearray)):
        return True
    return _holds_word(body, b"true", 2) or _holds_word(body, b"false", 2)


def _holds_word(text: bytes | bytearray, word: bytes, at: int) -> bool:
    """``word in text``, for JSON text that is mostly numbers and a ``word[at]`` that no JSON
    number holds (``true``'s ``u``, ``false``'s and ``null``'s ``l``): that byte is found with
    one ``memchr`` and only its few places outside numbers (in keys and names) are looked at,
    where a search for the word itself costs a pass over the text. A short text is searched
    at once: there the plain search costs less than the calls that avoid it."""
    if len(text) < _SHORT_TEXT:
        return word in text
    mark = word[at]
    found = text.find(mark)
    for _ in range(_MAX_MARKS):
        if found < 0:
            return False
        if found >= at and text.startswith(word, found - at):
            return True
        found = text.find(mark, found + 1)
    return word in text  # many marks (a long name or id): the plain search


def _quick_json_array(
    raw: dict[str, Any], spec: TensorSpec, max_rows: int, bools: bool = True
) -> np.ndarray[Any, Any] | None:
    """The common request, decoded without the general checks: a float input whose ``data`` is
    a flat list of finite numbers that fit its dtype, with a valid shape and no parameters.
    Anything else (errors included) is None, for :func:`_decode_input` to decide; an array
    returned here equals the one that path would return.

    Up to ``_QUICK_MAX_VALUES`` values are checked one by one (Python floats only); a longer
    list is converted first and checked by numpy (:func:`_quick_long_array`, told by ``bools``
    False that the document holds no boolean)."""
    limit = _QUICK_LIMITS.get(spec.datatype)
    data = raw.get("data")
    shape = raw.get("shape")
    if (
        limit is None
        or type(data) is not list
        or raw.get("datatype") != spec.datatype
        or "parameters" in raw
        or not data
    ):
        return None
    count = _quick_count(spec, shape, max_rows)
    if count != len(data):
        return None
    shape = cast("list[int]", shape)  # _quick_count took it
    if count > _QUICK_MAX_VALUES:
        return _quick_long_array(data, spec, limit, shape, bools)
    if (
        not _FLOATS.issuperset(map(type, data))
        # a NaN or an infinity makes the sum non-finite; the bounds rule out overflow
        or not math.isfinite(sum(data))
        or not (-limit <= min(data) and max(data) <= limit)
    ):
        return None
    return np.array(data, dtype=HOST_DTYPES[spec.datatype]).reshape(shape)


#: the datatypes whose binary bytes are their values as they are (no BF16 widening, no BOOL check)
_PLAIN_BINARY = frozenset(("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
                           "INT64", "FP16", "FP32", "FP64"))  # fmt: skip


def _quick_count(spec: TensorSpec, shape: object, max_rows: int) -> int | None:
    """The values a shape holds, for the quick reads: a list of positive integers that fits
    the declared shape, 1 to ``max_rows`` rows; None for any other (the general path's to
    refuse or take)."""
    if type(shape) is not list or len(shape) != len(spec.shape):
        return None
    count = 1
    for want, got in zip(spec.shape, shape):  # noqa: B905 (lengths checked above)
        if type(got) is not int or got < 1 or (want != got and want != -1):
            return None
        count *= got
    return count if shape[0] <= max_rows else None


def _quick_raw_array(
    spec: TensorSpec, shape: object, data: bytes | memoryview, max_rows: int
) -> np.ndarray[Any, Any] | None:
    """An input's raw little-endian bytes (REST's binary section, gRPC's raw contents) as the
    array the general path would make, when its datatype's bytes are its values
    (:data:`_PLAIN_BINARY`), its shape passes :func:`_quick_count` and ``data`` is exactly what
    that shape takes; None otherwise. Its values are not yet checked finite."""
    datatype = spec.datatype
    if datatype not in _PLAIN_BINARY:
        return None
    count = _quick_count(spec, shape, max_rows)
    wire = WIRE_DTYPES[datatype]
    if count is None or len(data) != count * wire.itemsize:
        return None
    array: np.ndarray[Any, Any] = np.frombuffer(data, dtype=wire).astype(HOST_DTYPES[datatype])
    return array.reshape(shape)


def _quick_binary_array(
    raw_inputs: object, spec: TensorSpec, binary: memoryview, max_rows: int
) -> np.ndarray[Any, Any] | None:
    """The common binary request's one input, read without the general checks: its name, its
    datatype, its shape and ``binary_data_size`` and nothing else, its bytes all of the binary
    section (see :func:`_quick_raw_array`). None for anything else (errors included), for
    :func:`_decode_inputs` to decide; an array returned here (its values not yet checked
    finite) equals the one that path would return."""
    if type(raw_inputs) is not list or len(raw_inputs) != 1:
        return None
    raw = raw_inputs[0]
    if type(raw) is not dict or len(raw) != 4:  # name, datatype, shape, parameters
        return None
    params = raw.get("parameters")
    if (
        raw.get("name") != spec.name
        or raw.get("datatype") != spec.datatype
        or type(params) is not dict
        or len(params) != 1
    ):
        return None
    size = params.get("binary_data_size")
    if type(size) is not int or size != len(binary):
        return None
    return _quick_raw_array(spec, raw.get("shape"), binary, max_rows)


def _quick_long_array(
    data: list[Any], spec: TensorSpec, limit: float, shape: list[int], bools: bool = True
) -> np.ndarray[Any, Any] | None:
    """A long list of numbers, converted as the general path converts it, then range-checked.

    With ``bools`` False (no boolean anywhere in the document), the list goes straight into
    float64 (:func:`_plain_floats`). What that cannot vouch for, or any list when ``bools`` is
    True, is decided by the types of its values: floats only, numpy is told the dtype (float64,
    what it would infer, without looking at each value); floats and ints, numpy infers it as the
    general path does (an int past 64 bits makes an object array: declined); anything else is
    declined, booleans first (numpy would take them as numbers), strings, None and nested lists."""
    if not bools:
        plain = _plain_floats(data, limit)
        if plain is not None:
            return plain.astype(HOST_DTYPES[spec.datatype]).reshape(shape)
    kinds = set(map(type, data))
    if kinds == _FLOATS:
        array = np.array(data, dtype=np.float64)
    elif kinds == _NUMBERS:
        array = np.array(data)
        if array.dtype != np.float64:
            return None
    else:
        return None
    if not float(np.abs(array).max()) <= limit:  # NaN compares false
        return None
    return array.astype(HOST_DTYPES[spec.datatype]).reshape(shape)


#: below this magnitude every int is a float64 exactly, so any int64 or float64 road to the
#: host dtype rounds it once, the same way
_EXACT_INTS = float(2**53)


def _plain_floats(data: list[Any], limit: float) -> np.ndarray[Any, Any] | None:
    """A list of JSON numbers (no booleans: the caller knows) as float64, in one C loop,
    when every value is under ``limit`` and under 2**53 in magnitude; None otherwise (a
    string, None or a list stops the loop, a larger value fails the bound).

    The values equal the general path's: floats are copied, and ints under 2**53 convert
    exactly, so an all-int list that numpy reads as int64 rounds to the host dtype as it does
    here. One sum of squares bounds them all: it is finite and at most ``bound**2`` only when
    every value is within ``bound``. It is ``np.vdot``'s, which overflows to infinity quietly
    for a value past 1e154, where ``ndarray.dot`` would warn (a client's request making the
    server warn, an error where warnings are; ``np.errstate`` would cost more than the sum)."""
    try:
        values = c_array("d", data)
    except (TypeError, OverflowError):
        return None
    floats = np.frombuffer(values, dtype=np.float64)
    bound = min(limit, _EXACT_INTS)
    if not float(np.vdot(floats, floats)) <= bound * bound:  # NaN compares false
        return None
    return floats


def _checked_shape(
    raw: dict[str, Any], spec: TensorSpec, max_rows: int, *, json: bool = True
) -> list[int]:
    """The entry's datatype and shape checked against the declaration; returns the shape
    (``json``: it came in a JSON request, whose reader Triton's words for a bad one name)."""
    name = spec.name
    datatype = raw.get("datatype")
    if datatype != spec.datatype:
        if not datatype or type(datatype) is not str:  # absent (null, or '' over gRPC)
            raise _missing_datatype(spec, datatype, json)
        # Triton's words first; BYTES (strings) is no tensor type torch has, so no input takes it
        note = " (BYTES is not a tensor type torch can take)" if datatype == "BYTES" else ""
        raise _ModelWords(
            lambda m: (
                f"inference input {name!r} data-type is {shown(datatype)}, but "
                f"{f'model {m!r}' if m else 'the model'} expects {spec.datatype!r}{note}"
            )
        )
    shape = raw.get("shape")
    if type(shape) is list and len(shape) > MOST_DIMS and _unsigned(shape[:MOST_DIMS]):
        # the rank told before the rest is read (a first dimension that is no unsigned
        # integer is told first, in Triton's words, as in a short shape)
        check_rank(spec, shape)
    if type(shape) is not list or not _unsigned(shape):
        # Triton's words first for a dimension that is not an unsigned integer
        triton = (
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer; "
            if json and type(shape) is list
            else ""
        )
        raise _fail(
            f"{triton}input {name!r}: 'shape' must be an array of non-negative integers, "
            f"got {shown(shape)}"
        )
    declared = spec.shape
    if len(shape) != len(declared) or any(
        want != got and want != -1
        for want, got in zip(declared, shape)  # noqa: B905
    ):
        _check_overflow(spec, shape)
        batch = " (the first dimension is the batch: -1, any number of rows)"
        raise _ModelWords(
            lambda m: (
                f"unexpected shape for input {name!r}{_for(m)}. Expected "
                f"{_dims(declared)}, got {_dims(shape)}{batch if declared[:1] == (-1,) else ''}"
            )
        )
    rows = shape[0]
    if rows < 1:
        raise _fail(f"input {name!r}: batch dimension {rows}; send at least one row")
    if rows > max_rows:  # 413 (documented) even where the count would overflow
        raise PayloadTooLargeError(
            f"input {name!r}: {rows} rows is over the limit of {max_rows} rows per request "
            "(--max-request-rows); split the request"
        )
    return shape


def check_shape(spec: TensorSpec, shape: list[int], max_rows: int, model: str = "") -> None:
    """Refuse a ``shape`` that ``spec`` does not take, as :func:`decode_infer_request` would
    (``model`` named where its words name it): for a caller that knows a request's shape before
    it writes the request (KServe V1's rows, refused before they are written out as one)."""
    try:
        _checked_shape({"datatype": spec.datatype, "shape": shape}, spec, max_rows)
    except _ModelWords as exc:
        raise exc.of_model(model) from None


_INT64_MAX = 2**63 - 1


def _unsigned(dims: list[Any]) -> bool:
    return all(type(d) is int and d >= 0 for d in dims)


def _missing_datatype(spec: TensorSpec, datatype: object, json: bool) -> InputError:
    """An input without a ``datatype`` string, which the protocol requires (MLServer's
    ``RequestInput`` and KServe's refuse one without it too); Triton's words first over JSON."""
    got = "none" if datatype is None or datatype == "" else _kind_name(datatype)
    return _fail(
        f"{'Unable to parse ' if json else ''}'datatype' of input {spec.name!r}: it must be a "
        f'datatype string, got {got}; send "datatype": "{spec.datatype}", the input\'s '
        "declared datatype (GET the model's metadata for every input's)"
    )


def _check_overflow(spec: TensorSpec, shape: list[int]) -> None:
    """Refuse, in Triton's words, a shape whose element count or byte size does not fit an
    int64 (called only on the way to refusing a shape that does not match the model, so a
    valid request never pays)."""
    count = 1
    for dim in shape:  # stops once past int64: a hostile shape's product is never computed whole
        count *= dim
        if count > _INT64_MAX:
            break
    if count > _INT64_MAX:
        raise _fail(
            f"invalid shape for input {spec.name!r}: shape {_dims(shape)} causes total element "
            f"count to exceed maximum size of {_INT64_MAX}"
        )
    size = WIRE_DTYPES[spec.datatype].itemsize
    if size > 1 and count > _INT64_MAX // size:
        raise _fail(
            f"byte size overflow for input {spec.name!r}: element count ({count}) * data type "
            f"size ({size}) exceeds maximum allowed size ({_INT64_MAX})"
        )


def _binary_array(
    spec: TensorSpec,
    binary: memoryview | None,
    offset: int,
    size: object,
    shape: list[int],
    count: int,
    field: str = "binary_data_size",
) -> np.ndarray[Any, Any]:
    """The input's bytes from the binary section (or the view ``field`` gives), as an array
    of its host dtype."""
    name = spec.name
    if binary is None:
        raise _fail(
            f"input {name!r} has 'binary_data_size' but the request has no "
            "Inference-Header-Content-Length header giving the JSON length"
        )
    length = _checked_size(spec, size, shape, count, field)
    if offset + length > len(binary):
        end, have = offset + length, len(binary)
        raise _ModelWords(  # Triton's words first
            lambda m: (
                f"unexpected size for input {name!r}, expecting {end - have} additional bytes"
                f"{_for(m)}: its binary data ends at byte {end} but the binary section has "
                f"only {have} bytes"
            )
        )
    array = np.frombuffer(binary[offset : offset + length], dtype=WIRE_DTYPES[spec.datatype])
    if spec.datatype == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    if spec.datatype == "BOOL":
        if array.view(np.uint8).max(initial=0) > 1:
            raise _fail(f"input {name!r}: BOOL bytes must be 0 or 1")
        copied: np.ndarray[Any, Any] = array.copy()
        return copied
    return array.astype(HOST_DTYPES[spec.datatype], copy=True)


def _checked_size(spec: TensorSpec, size: object, shape: list[int], count: int, field: str) -> int:
    """The byte size a client gave for an input (``field`` says where), checked against what
    its shape of its datatype takes."""
    expected = count * WIRE_DTYPES[spec.datatype].itemsize
    if type(size) is int and size == expected:
        return size
    takes = f"shape {shape} of {spec.datatype} takes {expected} bytes"
    if type(size) is int:
        raise _size_mismatch(spec.name, expected, size, f"{field} {size}, where {takes}")
    raise _size_mismatch(  # 32.0 or "32" is no byte count, however near it is
        spec.name,
        expected,
        shown(size),
        f"{field} {shown(size)} is not an integer; give the byte count as an integer ({takes})",
    )


def shared_memory_array(
    spec: TensorSpec,
    params: Mapping[str, Any],
    regions: SharedMemoryRegions,
    shape: list[int],
    count: int,
) -> np.ndarray[Any, Any]:
    """An input's bytes from the shared-memory region its parameters name, copied into an
    array of its host dtype; a byte size its shape does not take is refused before anything
    is read (a client's wrong size could otherwise make the server copy a whole region)."""
    source = regions.target(
        params.get("shared_memory_region"),
        params.get("shared_memory_offset"),
        params.get("shared_memory_byte_size"),
        f"input {spec.name!r}",
    )
    _checked_size(spec, source.size, shape, count, "shared_memory_byte_size")
    view = memoryview(source.read())
    return _binary_array(spec, view, 0, len(view), shape, count, "shared_memory_byte_size")


#: Triton's limit on the nesting of an input's JSON ``data``: arrays at most 99 deep
MAX_JSON_DEPTH = 100
#: ``data`` nested deeper than this is first unwrapped of its singleton levels (numpy builds
#: arrays of at most 32 dimensions in its 1.x releases, 64 in 2.x)
_MAX_DIMS = 32


def _unnested(name: str, data: list[Any]) -> list[Any]:
    """``data`` (nested arrays), refused past Triton's depth limit, and with the singleton
    levels of a deep nesting dropped (they hold no values: ``[[[1, 2]]]`` is ``[1, 2]``)."""
    depth, inner = 0, data
    while isinstance(inner, list) and inner and depth <= MAX_JSON_DEPTH:
        inner, depth = inner[0], depth + 1
    if depth >= MAX_JSON_DEPTH:  # Triton's words first
        deep = depth if depth == MAX_JSON_DEPTH else f"over {MAX_JSON_DEPTH}"
        raise _fail(
            f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH}): input "
            f"{name!r} nests its 'data' {deep} arrays deep; send it flat, or nested as its shape"
        )
    while depth > _MAX_DIMS and len(data) == 1 and isinstance(data[0], list):
        data, depth = data[0], depth - 1
    return data


#: Triton's words (its REST front's, which its QA tests grep for) for JSON ``data`` holding more
#: values than the input's shape takes, and fewer
_TOO_MANY = "Unable to parse 'data': Shape does not match true shape of 'data' field"
_TOO_FEW = "Failed to parse 'data' field: shape does not match true shape"


def _json_array(
    spec: TensorSpec, data: object, shape: list[int], count: int
) -> np.ndarray[Any, Any]:
    """The input's JSON ``data``, as an array of its host dtype (range-checked); ``data`` that
    numpy cannot find the memory for is a 413 naming the input, not a server error."""
    name = spec.name
    if not isinstance(data, list):
        # a scalar is no $tensor_data (MLServer's TensorData takes one; KServe's, a List, not)
        given = "" if data is None else f", not {_kind_name(data)} {shown(data)}"
        raise _fail(
            f"input {name!r} needs 'data', an array of {count} {spec.datatype} values{given} "
            "(or binary data with the binary_data_size parameter)"
        )
    if count and len(data) > count:  # too many whatever they hold: refused before numpy reads them
        nested = " arrays" if isinstance(data[0], list) else ""
        raise _fail(
            f"{_TOO_MANY}: input {name!r}: shape {shape} needs {count} values but 'data' holds "
            f"{len(data)}{nested}"
        )
    data, kinds = _checked_values(spec, data, shape, count)
    try:
        return _converted(spec, data, kinds)
    except MemoryError:
        raise PayloadTooLargeError(
            f"input {name!r}: its {count} {spec.datatype} values in JSON 'data' do not fit in "
            "the server's free memory now; send fewer rows per request, or the values as "
            "binary tensor data"
        ) from None


_LISTS = frozenset((list,))
_INTS = frozenset((int,))
_BOOL_KINDS = frozenset((bool,))


def _all_bools(spec: TensorSpec, data: list[Any]) -> bool:
    """Whether a BOOL input's flat ``data`` holds only values equal to true or false (so no
    string, list or null), told by two passes in C that compare by identity first: a third of
    the time of looking at each value's type. A 1 or a 0 passes here, and is refused once numpy
    has read it as an integer."""
    return spec.datatype == "BOOL" and data.count(True) + data.count(False) == len(data)


def _checked_values(
    spec: TensorSpec, data: list[Any], shape: list[int], count: int
) -> tuple[list[Any], Set[type]]:
    """``data`` (a deep nesting's singleton levels dropped) checked before numpy reads it, and
    the types of its values. Nested, every list above the values must be as long as the first
    at its level, and those lengths hold ``count`` values, told from the lists alone; then no
    value may be a string: numpy makes every value of an array that holds one text as long as
    the longest (a string of 8,000 characters among 32,768 zeros took 1 GB, and one of a
    million more than any memory). The types are looked at once here for the checks after
    numpy too (booleans among numbers, integers past 64 bits)."""
    if data and type(data[0]) is list:
        data = _unnested(spec.name, data)
        dims = nested_shape(data)
        rows = _innermost(data, dims)
        if rows is None:
            raise _ragged(spec)
        _check_count(spec.name, shape, count, math.prod(dims))
        kinds: Set[type] = set(map(type, chain.from_iterable(rows)))
    else:
        kinds = _BOOL_KINDS if _all_bools(spec, data) else set(map(type, data))
        if list not in kinds:
            _check_count(spec.name, shape, count, len(data))
    if list in kinds:  # a value beside lists, or a list below the first one's depth
        raise _ragged(spec)
    if str in kinds:
        raise _fail(f"input {spec.name!r}: 'data' holds strings, not {spec.datatype} values")
    return data, kinds


def nested_shape(values: object) -> list[int]:
    """The shape of nested lists, read along the first entry of each level (whether the other
    lists fit it is the caller's to check)."""
    shape = []
    value: Any = values
    while type(value) is list:
        shape.append(len(value))
        value = value[0] if value else None
    return shape


def _innermost(data: list[Any], dims: Sequence[int]) -> list[Any] | None:
    """The innermost lists of nested ``data`` (those that hold the values), when every list
    above them holds lists only, each as long as ``dims`` says for its level; None otherwise.
    One pass in C a level: a request of 4,096 rows looks at 4,096 lists, none of their values."""
    rows = data
    for depth, width in enumerate(dims[1:], 2):
        if set(map(type, rows)) != _LISTS or set(map(len, rows)) != {width}:
            return None
        if depth < len(dims):
            rows = list(chain.from_iterable(rows))
    return rows


def _check_count(name: str, shape: list[int], count: int, held: int) -> None:
    if held != count:
        raise _fail(
            f"{_TOO_MANY if held > count else _TOO_FEW}: input {name!r}: shape {shape} needs "
            f"{count} values but 'data' holds {held}"
        )


def _ragged(spec: TensorSpec) -> InputError:
    return _fail(
        f"input {spec.name!r}: 'data' must be a flat or regularly nested array of "
        f"{spec.datatype} numbers"
    )


def _converted(spec: TensorSpec, data: list[Any], kinds: Set[type]) -> np.ndarray[Any, Any]:
    """``data``, checked by :func:`_checked_values` (its value ``kinds``), as an array of the
    input's host dtype, refused where its values are not the datatype's."""
    name = spec.name
    dtype: np.dtype[Any] = HOST_DTYPES[spec.datatype]  # the arrays' dtype in the server
    try:
        array = np.array(data)
    except (ValueError, TypeError, OverflowError):  # nested past numpy's 64 dimensions
        raise _ragged(spec) from None
    if array.dtype.kind == "O" and dtype.kind == "f":
        array = _nulls_as_nan(array)
    if array.dtype.kind in "fO" and dtype.kind in "iu" and kinds == _INTS:
        # past int64 (or int64 and uint64 rows): numpy fell back to float
        try:
            array = np.array(data, dtype=dtype)
        except OverflowError:
            raise _out_of_range(spec, np.array(data, object).ravel().tolist()) from None
    if array.dtype.kind in "iuf" and dtype.kind != "b" and bool in kinds:  # numpy read them as 1s
        raise _fail(
            f"input {name!r}: 'data' mixes booleans with numbers; send {spec.datatype} numbers "
            "only (true and false are not numbers here)"
        )
    if array.dtype.kind == "f" and dtype.kind in "iu" and _whole_past(array, dtype):
        raise _out_of_range(spec, array.ravel().tolist())  # an integer past 64 bits, read as float
    if array.dtype.kind not in _JSON_KINDS[spec.datatype] and array.size:
        raise _fail(
            _whole_floats(name, spec.datatype, array, dtype, data)
            or f"input {name!r}: 'data' holds {_kind_label(array)}, not {spec.datatype} values"
        )
    if array.dtype.kind in "iu" and dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise _out_of_range(spec, array.ravel().tolist())
    with np.errstate(over="ignore", invalid="ignore"):  # overflow -> inf, refused below
        converted: np.ndarray[Any, Any] = array.astype(dtype, copy=False)
    return converted


def _whole_past(array: np.ndarray[Any, Any], dtype: np.dtype[Any]) -> bool:
    """Whether float ``data`` for an integer dtype holds whole numbers only, one of them past the
    dtype's range (JSON parsing reads an integer past 64 bits as a float)."""
    if not array.size or not np.isfinite(array).all() or (array != np.trunc(array)).any():
        return False
    info = np.iinfo(dtype)  # compared as Python ints: exact past 2**53, as floats are not
    return int(array.min()) < info.min or int(array.max()) > info.max


def _out_of_range(spec: TensorSpec, values: list[Any]) -> InputError:
    """The first of an integer input's ``values`` past its datatype's range, named."""
    dtype: np.dtype[Any] = HOST_DTYPES[spec.datatype]
    info = np.iinfo(dtype)
    bad = next(v for v in values if not info.min <= v <= info.max)
    # a float far past 64 bits as written (1e+300), not as its 301 digits
    shown_bad = f"{bad:g}" if isinstance(bad, float) and abs(bad) >= 1e21 else int(bad)
    return _fail(
        f"input {spec.name!r}: value {shown_bad} is out of range for {spec.datatype} "
        f"({info.min}..{info.max})"
    )


def _nulls_as_nan(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A float input's ``data`` of numbers and nulls, with each null read as NaN: MLServer's
    ``NumpyCodec`` writes NaN as null (JSON has no NaN), and KServe and MLServer read it back so.
    Anything else is returned as it is, for the type check to refuse."""
    values = array.ravel().tolist()
    kinds = set(map(type, values))
    if type(None) not in kinds or not kinds <= {type(None), int, float}:
        return array
    nan = float("nan")
    flat = np.array([nan if v is None else v for v in values], np.float64)
    read: np.ndarray[Any, Any] = flat.reshape(array.shape)
    return read


_BOM = b"\xef\xbb\xbf"
#: byte order marks of the encodings JSON is not sent in (RFC 8259, 8.1), longest first
_OTHER_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)


class _NotUtf8(orjson.JSONDecodeError):
    """A body that is not UTF-8: said where, without orjson's misleading words (it calls any
    invalid byte a surrogate, at char 0)."""

    def __str__(self) -> str:
        return str(self.msg)


#: the most arrays, objects and keys one JSON body may hold. orjson builds each for 0.2 to
#: 0.7 µs, ten times a number of a flat list, and on the event loop: 3 million one-value arrays
#: (12 MB) held it for 2 s, 1.5 million keys (18 MB) for 0.8 s, while a flat list of 64 MiB of
#: numbers takes about 0.5 s. A body at this bound parses in about 50 ms.
MAX_JSON_STRUCTURES = 1 << 18
#: a JSON body from this many bytes on has its structures counted before it is parsed. A
#: smaller one holds at most about 350,000 (three bytes each, ``[],``), near the bound.
_COUNTED_BODY = 1 << 20
#: every byte but the four that :func:`_check_structures` counts, deleted in one pass
_UNCOUNTED_BYTES = bytes(b for b in range(256) if b not in b'[{:"')


def json_loads(data: bytes | bytearray | memoryview) -> Any:
    """``orjson.loads``, past a UTF-8 byte order mark (RFC 8259 lets a parser ignore one, and
    some clients, PowerShell's among them, send it); raises ``orjson.JSONDecodeError`` (for a
    body that is not UTF-8, one that says which byte, or which encoding it is in), and
    :class:`InputError` for a body of more than :data:`MAX_JSON_STRUCTURES` arrays, objects and
    keys, before parsing it."""
    if data[:3] == _BOM:
        data = data[3:]
    if len(data) >= _COUNTED_BODY:
        _check_structures(data if isinstance(data, bytes) else bytes(data))
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "UTF-8" not in str(exc) and b"\0" not in bytes(data[:2]):
            raise
        raise _not_utf8(bytes(data)) from None


def _check_structures(data: bytes) -> None:
    """Refuse a JSON body that holds more than :data:`MAX_JSON_STRUCTURES` arrays, objects and
    keys, counted from its bytes without parsing it: brackets and braces, and keys as colons
    (at most half the quotes, as each key has two), inside strings too, so never fewer than the
    body holds."""
    marks = data.translate(None, _UNCOUNTED_BYTES)  # a few bytes, for tensor data sent flat
    containers = marks.count(b"[") + marks.count(b"{")
    keys = marks.count(b":")
    if containers + keys <= MAX_JSON_STRUCTURES:
        return
    keys = min(keys, marks.count(b'"') // 2)  # colons in strings: timestamps, URLs
    if containers + keys <= MAX_JSON_STRUCTURES:
        return
    raise InputError(
        f"the JSON body holds up to {containers:,} arrays and objects and {keys:,} keys "
        f"(brackets, braces and colons counted, in strings too), more than the "
        f"{MAX_JSON_STRUCTURES:,} one body may hold (each takes as long to parse as ten numbers, "
        "and other requests wait meanwhile); send each tensor's data as one flat array in "
        "row-major order, as Triton's clients do, or as binary tensor data"
    )


def _not_utf8(data: bytes) -> _NotUtf8:
    for bom, encoding in _OTHER_BOMS:
        if data.startswith(bom):
            return _NotUtf8(
                f"the body is {encoding} (it starts with a {encoding} byte order mark); JSON "
                "must be sent as UTF-8 (RFC 8259, 8.1): encode the body as UTF-8",
                "",
                0,
            )
    if b"\0" in data[:2]:  # JSON starts with an ASCII character: UTF-16 or -32 has a zero byte
        return _NotUtf8(
            "the body starts with a zero byte: it looks UTF-16 or UTF-32 encoded; JSON must be "
            "sent as UTF-8 (RFC 8259, 8.1): encode the body as UTF-8",
            "",
            0,
        )
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.end].hex(" ")
        return _NotUtf8(
            f"the body is not UTF-8: byte {exc.start} ({bad}) is not valid UTF-8 there; "
            "JSON must be sent as UTF-8 (RFC 8259, 8.1), with any other character "
            "escaped as \\uXXXX",
            "",
            exc.start,
        )
    return _NotUtf8("the body is not UTF-8; JSON must be sent as UTF-8 (RFC 8259, 8.1)", "", 0)


#: the smallest magnitude a float32 rounds to bfloat16 infinity from (to nearest even): a BF16
#: input holds its JSON numbers as float32, and those from here to float32's largest are finite
#: there but infinite once the model gets them as bfloat16
_BF16_INFINITE_FROM = float(np.array([0x7F7F8000], np.uint32).view(np.float32)[0])
_BF16_MAX = float(np.array([0x7F7F0000], np.uint32).view(np.float32)[0])


#: the datatypes whose arrays are known finite when the sum of their squares is: a NaN or an
#: infinity makes it non-finite, and BLAS's dot product overflows to infinity quietly (a large
#: finite value is then checked one by one). Not BF16, held as float32 but infinite from a
#: smaller magnitude; not FP16, which numpy sums itself, warning on an overflow.
_SQUARED = frozenset(("FP32", "FP64"))


def _check_finite(spec: TensorSpec, array: np.ndarray[Any, Any], json: bool = False) -> None:
    """Refuse NaN and infinite floats (a JSON number past the datatype's range is one once
    converted: 1e39 as FP32, 3.4e38 as BF16; so is a null in JSON ``data``, read as NaN)."""
    if array.dtype.kind != "f":
        return
    if spec.datatype in _SQUARED and math.isfinite(np.vdot(array, array)):
        return  # see _SQUARED
    if spec.datatype == "BF16":
        bad = ~(np.abs(array) < _BF16_INFINITE_FROM)  # NaN compares false: bad too
        if not bad.any():
            return
        limit = _BF16_MAX
    elif np.isfinite(array).all():
        return
    else:
        bad = ~np.isfinite(array)
        limit = float(np.finfo(array.dtype).max)
    where = int(np.flatnonzero(bad)[0])
    null = " (a null in JSON 'data' is NaN)" if json else ""
    raise _fail(
        f"input {spec.name!r}: NaN or infinite values are not allowed{null}, and a number "
        f"past {spec.datatype}'s range (±{limit:.4g}) is infinite there; the first is at "
        f"flat index {where}; send finite values in range, or start the server with "
        "--allow-nan"
    )


def _whole_floats(
    name: str,
    datatype: str,
    array: np.ndarray[Any, Any],
    dtype: np.dtype[Any],
    data: list[Any] | None = None,
) -> str:
    """For an integer input whose JSON numbers are all whole but written as floats (``1.0``,
    as ``json.dumps`` writes a float array's values), the refusal that says how to send them
    ('' otherwise). KServe and MLServer would cast them (and cut ``1.5`` to 1 without a
    word); Triton refuses them, as torchplace does."""
    if dtype.kind not in "iu" or array.dtype.kind != "f":
        return ""
    with np.errstate(invalid="ignore"):
        whole = bool(np.all(np.isfinite(array)) and np.all(array == np.floor(array)))
    if not whole:
        return ""
    if dtype == np.int64 and (array == -(2.0**63)).any():
        # JSON parsing reads an integer just below int64's range (-2**63 - 1 and the next
        # thousand) as this float, which names no value in range: not told to write it "as"
        info = np.iinfo(dtype)
        return (
            f"input {name!r}: 'data' holds a number read as the float {-(2.0**63)!r}: an "
            f"integer below {datatype}'s range ({info.min}..{info.max}) reads so, as does "
            f"{info.min} written as a float; send integers in range, written as JSON integers"
        )
    # the first value written as a float (``data`` as parsed), not the first value: in
    # ``[1, 5.0]`` the 1 was an integer and needs no change
    written = () if data is None else np.array(data, dtype=object).ravel()
    first = next((v for v in written if type(v) is float), float(array.ravel()[0]))
    return (
        f"input {name!r}: 'data' holds numbers written as floats (such as {first!r}), not "
        f"{datatype} integers; write them as JSON integers ({int(first)}), e.g. from an "
        "integer array, or declare the input a float datatype"
    )


def _kind_label(array: np.ndarray[Any, Any]) -> str:
    return {
        "b": "booleans",
        "O": "mixed or nested values",
        "f": "non-integer numbers",
        "i": "integers",
        "u": "integers",
    }.get(array.dtype.kind, f"{array.dtype} values")


def _requested_outputs(
    raw: Any, outputs: Sequence[TensorSpec], binary_default: bool, regions: SharedMemoryRegions
) -> tuple[RequestedOutput, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise _fail(f"'outputs' must be an array of objects, not {_kind_name(raw)}")
    if not raw:  # an empty array asks for nothing in particular: every output (as Triton)
        return None
    known = {s.name: s.datatype for s in outputs}
    chosen: list[RequestedOutput] = []
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise _fail("each entry of 'outputs' must be an object with a 'name' string")
        name = entry["name"]
        if name not in known:
            raise _unknown_output(name, outputs)
        if any(c.name == name for c in chosen):
            raise _fail(f"output {name!r} already exists in request; ask for each output once")
        params = entry.get("parameters")
        chosen.append(_requested_output(name, known[name], params, binary_default, regions))
    return tuple(chosen)


def _requested_output(
    name: str, datatype: str, params: object, binary_default: bool, regions: SharedMemoryRegions
) -> RequestedOutput:
    """One entry of ``outputs``, from its parameters: binary or JSON, or shared memory; its
    values or its top classes."""
    if params is None:
        return RequestedOutput(name, binary_default)
    if not isinstance(params, dict):
        raise _fail(f"output {name!r}: 'parameters' must be an object")
    _check_scalars(params, "output", _OUTPUT_CHECKED, shm=True, name=name)
    flag = params.get("binary_data", binary_default)
    if not isinstance(flag, bool):
        raise _fail(f"output {name!r}: parameter 'binary_data' must be true or false")
    classes = class_count(name, datatype, params.get("classification"))
    if "shared_memory_region" not in params:
        check_region_named(name, params)
        return RequestedOutput(name, flag, None, classes)
    if classes:
        raise _fail(
            f"output {name!r}: 'classification' and 'shared_memory_region' both set; the "
            "classes are answered in the response, ask for one or the other"
        )
    if params.get("binary_data") is True:
        raise _fail(
            f"output {name!r}: 'binary_data' true and 'shared_memory_region' both set; "
            "an output goes to one place"
        )
    return RequestedOutput(name, False, output_target(name, params, regions))


def class_count(name: str, datatype: str, value: object) -> int:
    """The ``classification`` parameter of an output: how many classes (0: none asked)."""
    if value is None or value is False or value == 0:
        return 0
    if type(value) is not int or value < 0:
        raise _fail(
            f"output {name!r}: 'classification' must be a positive integer (the number of "
            f"top classes to answer), got {shown(value)}"
        )
    if datatype not in CLASSIFIABLE:  # Triton's words first
        raise _fail(
            f"class result not available for output due to unsupported type '{datatype}': "
            f"output {name!r} has no classes to rank; ask for its values instead"
        )
    return value


def output_target(name: str, params: Mapping[str, Any], regions: SharedMemoryRegions) -> Target:
    """Where in the shared-memory region an output's parameters name it goes."""
    return regions.target(
        params.get("shared_memory_region"),
        params.get("shared_memory_offset"),
        params.get("shared_memory_byte_size"),
        f"output {name!r}",
    )


def check_output_room(
    requested: Sequence[RequestedOutput] | None, outputs: Sequence[TensorSpec], rows: int
) -> None:
    """Refuse, before anything runs, an output whose shared-memory range cannot hold its
    ``rows`` rows (when its declared shape fixes their size)."""
    for wanted in requested or ():
        if wanted.target is None:
            continue
        spec = next(s for s in outputs if s.name == wanted.name)
        if any(d < 0 for d in spec.shape[1:]):
            continue  # known once computed: checked when written
        need = rows * math.prod(spec.shape[1:]) * WIRE_DTYPES[spec.datatype].itemsize
        _check_room(wanted.name, wanted.target.size, need)


def _check_room(name: str, have: int, need: int) -> None:
    if need > have:
        raise SharedMemoryError(
            f"shared memory size specified with the request for output '{name}' ({have} "
            f"bytes) should be at least {need} bytes to hold the results; register a larger "
            "region or send fewer rows"
        )


def _write_output(name: str, datatype: str, array: np.ndarray[Any, Any], target: Target) -> None:
    """The output's bytes (little-endian, BF16 as bfloat16 bits) into its shared memory."""
    wire = WIRE_DTYPES[datatype]
    _check_room(name, target.size, array.size * wire.itemsize)
    data = _bf16_bits(array) if datatype == "BF16" else np.ascontiguousarray(array, dtype=wire)
    target.write(data)


def _bf16_bits(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """float32 -> bfloat16 bit patterns, rounding to nearest even (NaN stays NaN)."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
    nan = np.isnan(array.astype(np.float32, copy=False))
    if nan.any():
        rounded[nan.reshape(rounded.shape)] = 0x7FC0
    return rounded


def bf16_values(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The numbers a bfloat16 holds for ``array``'s values, as float32 of the same shape (what
    a JSON answer carries for a BF16 output)."""
    bits = _bf16_bits(array).astype(np.uint32) << 16
    values: np.ndarray[Any, Any] = bits.view(np.float32).reshape(array.shape)
    return values


def encode_infer_response(
    *,
    model_name: str,
    model_version: str,
    request: InferRequest,
    results: Mapping[str, np.ndarray[Any, Any]],
    outputs: Sequence[TensorSpec],
    labels: Mapping[str, Sequence[str]] = _NO_LABELS,
) -> tuple[bytes, int | None]:
    """Encode the outputs; returns the body and the JSON header length if binary data follows.
    ``labels``: an output's class labels, for the classification extension."""
    chosen: list[tuple[str, str, bool, Target | None, int]]
    if request.outputs is None:
        binary_output = request.binary_output
        chosen = [(s.name, s.datatype, binary_output, None, 0) for s in outputs]
    else:
        datatypes = {s.name: s.datatype for s in outputs}
        chosen = [(w.name, datatypes[w.name], w.binary, w.target, w.classes)
                  for w in request.outputs]  # fmt: skip
    entries: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for name, datatype, binary, target, classes in chosen:
        array = results[name]
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": array.shape}
        if classes:
            items, entry["shape"] = classify(array, datatype, classes, labels.get(name, ()))
            entry["datatype"] = "BYTES"
            if binary:
                raw = serialize_bytes(items)
                entry["parameters"] = {"binary_data_size": len(raw)}
                chunks.append(raw)
            else:
                entry["data"] = [item.decode() for item in items]
        elif target is not None:  # the client reads it from its region
            _write_output(name, datatype, array, target)
        elif binary:
            if datatype == "BF16":
                raw = _bf16_bits(array).tobytes()
            else:
                raw = np.ascontiguousarray(array, dtype=WIRE_DTYPES[datatype]).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        elif datatype == "BF16":  # the numbers a bfloat16 holds, like the binary form
            entry["data"] = bf16_values(array).reshape(-1)
        else:
            entry["data"] = array.ravel()  # a view when contiguous
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id is not None:
        doc["id"] = request.id
    doc["outputs"] = entries
    header = orjson.dumps(doc, option=_JSON_OPTS)
    if _holds_word(header, b"null", 2):  # orjson writes NaN and infinity as null: refuse them
        check_json_finite({e["name"]: e["data"] for e in entries if "data" in e})
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


#: how a client of this protocol gets NaN or infinite outputs (:func:`check_json_finite`)
_BINARY_FIX = 'ask for it as binary data ("binary_data": true) to get them'


def check_json_finite(data: Mapping[str, Any], fix: str = _BINARY_FIX) -> None:
    """Refuse to answer NaN or infinite output values as JSON, which has no numbers for them
    (they would read as null): the binary form carries them (``fix`` says how a client gets
    it). An InputError (400): the server did its work, and only the client can change what it
    asks for (a 500 would say the server failed)."""
    for name, values in data.items():
        floats = isinstance(values, np.ndarray) and values.dtype.kind == "f"
        if floats and not np.isfinite(values).all():
            raise InputError(
                f"output {name!r} holds NaN or infinite values, which JSON numbers cannot "
                f"carry (the model's result for these inputs); {fix}, or send inputs it keeps "
                "finite"
            )


def server_metadata(*, name: str, version: str, extensions: Sequence[str]) -> bytes:
    """The server metadata response body."""
    return orjson.dumps({"name": name, "version": version, "extensions": list(extensions)})


def model_metadata(
    *,
    name: str,
    versions: Sequence[str],
    platform: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
) -> bytes:
    """The model metadata response body."""

    def tensors(specs: Sequence[TensorSpec]) -> list[dict[str, Any]]:
        return [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in specs]

    return orjson.dumps(
        {
            "name": name,
            "versions": list(versions),
            "platform": platform,
            "inputs": tensors(inputs),
            "outputs": tensors(outputs),
        }
    )
