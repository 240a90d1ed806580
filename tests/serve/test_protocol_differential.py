"""Differential fuzzing of the OIP codec's fast paths against its general ones.

Every request body is decoded twice: as the server decodes it (``_quick_request`` and
``_quick_json_array`` first, told by ``_may_hold_bools`` whether the text can hold a boolean),
and with the fast paths turned off (:func:`_general`), so that only ``_decode_input`` and its
checks decide. The two answers must be equal: the same id, arrays (dtype, shape and every bit),
rows, outputs and parameters, or the same error type and message. The bodies are written by hand
(:func:`_text`) to vary what a parser sees and a serializer never writes: whitespace, unicode
escapes, duplicate keys, number spellings (``1e2``, ``-0``, ``1.0`` for integers), NaN and
Infinity spellings, and documents near the valid ones (wrong shapes, datatypes, names and
parameters, nested and ragged data, booleans and nulls among numbers, values at and past every
datatype's limits, long ids).

The same values sent as JSON ``data``, as binary tensor data, and as a raw binary body must
decode alike too, as must the fast scans (``_holds_word``) and the plain ones they stand for.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from tests.serve.fuzzing import FUZZ, array_bits, exact_values
from torchplace.errors import ServeError
from torchplace.models import TensorSpec
from torchplace.serve import protocol
from torchplace.serve.datatypes import HOST_DTYPES
from torchplace.serve.protocol import WIRE_DTYPES, decode_infer_request

DATATYPES = tuple(sorted(WIRE_DTYPES))
_FLOATING = ("FP16", "FP32", "FP64")
OUTPUTS = (TensorSpec("y", "FP32", (-1, 2)), TensorSpec("z", "INT64", (-1,)))


# ------------------------------------------------------------------------------ the two paths
@contextlib.contextmanager
def _fast_paths_off() -> Iterator[None]:
    """The codec with its quick paths declining everything (only the general path decides)."""
    saved = protocol._quick_request, protocol._quick_json_array
    protocol._quick_request = lambda *args, **kwargs: None  # type: ignore[assignment]
    protocol._quick_json_array = lambda *args, **kwargs: None  # type: ignore[assignment]
    try:
        yield
    finally:
        protocol._quick_request, protocol._quick_json_array = saved


def _outcome(decode: Callable[[], protocol.InferRequest]) -> tuple[Any, ...]:
    """A decode's answer as comparable values: every field, each array as its dtype, shape and
    bytes (so that -0.0 and 0.0, or two NaNs, are told apart); or the error's type and text."""
    try:
        request = decode()
    except ServeError as exc:
        return ("error", type(exc).__name__, exc.status, str(exc))
    arrays = array_bits(request.inputs)
    return (
        "ok",
        request.id,
        arrays,
        request.rows,
        request.outputs,
        request.binary_output,
        request.timeout_us,
        request.priority,
    )


def _decode(body: bytes, specs: tuple[TensorSpec, ...], **kw: Any) -> protocol.InferRequest:
    kw.setdefault("max_rows", 4)
    return decode_infer_request(body, inputs=specs, outputs=OUTPUTS, model="m", **kw)


def _general(body: bytes, specs: tuple[TensorSpec, ...], **kw: Any) -> tuple[Any, ...]:
    with _fast_paths_off():
        return _outcome(lambda: _decode(body, specs, **kw))


def _fast(body: bytes, specs: tuple[TensorSpec, ...], **kw: Any) -> tuple[Any, ...]:
    return _outcome(lambda: _decode(body, specs, **kw))


def _taken(body: bytes, specs: tuple[TensorSpec, ...], options: dict[str, Any]) -> str:
    """Which path answered ``body``: the quick request, or the general one (for the test's
    statistics, which show that both are exercised)."""
    try:
        doc = orjson.loads(body.removeprefix(b"\xef\xbb\xbf"))
    except orjson.JSONDecodeError:
        return "not JSON"
    if len(specs) != 1 or type(doc) is not dict:
        return "general path"
    quick = protocol._quick_request(doc, specs[0], options["max_rows"])
    return "general path" if quick is None else "quick path"


# ------------------------------------------------------------------------------ JSON text
@dataclass(frozen=True)
class _Token:
    """JSON text written as it is (a number's spelling, or something that is not JSON)."""

    text: str


@dataclass(frozen=True)
class _Object:
    """A JSON object as its key/value pairs, in order, duplicates allowed."""

    pairs: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class _Style:
    """How a document is written: the whitespace between tokens, strings as \\u escapes."""

    spaces: tuple[str, ...]
    escaped: bool


def _text(value: Any, style: _Style) -> str:
    gaps = iter(style.spaces * 10_000)

    def gap() -> str:
        return next(gaps, "")

    def string(text: str) -> str:
        if not style.escaped:
            return orjson.dumps(text).decode()
        units = text.encode("utf-16-le")
        return (
            '"'
            + "".join(
                f"\\u{int.from_bytes(units[i : i + 2], 'little'):04x}"
                for i in range(0, len(units), 2)
            )
            + '"'
        )

    def write(item: Any) -> str:
        if isinstance(item, _Token):
            return item.text
        if isinstance(item, _Object):
            inner = ",".join(
                gap() + string(k) + gap() + ":" + gap() + write(v) + gap() for k, v in item.pairs
            )
            return "{" + inner + "}"
        if isinstance(item, list):
            return "[" + ",".join(gap() + write(v) + gap() for v in item) + "]"
        if isinstance(item, str):
            return string(item)
        if isinstance(item, float) and not math.isfinite(item):
            return "NaN" if math.isnan(item) else ("-" if item < 0 else "") + "Infinity"
        if type(item) is int:  # any size: JSON numbers have no limit
            return str(item)
        return orjson.dumps(item).decode()

    return gap() + write(value) + gap()


_STYLES = st.builds(
    _Style,
    st.lists(st.sampled_from(["", " ", "\n", "\t", "\r\n  "]), min_size=1, max_size=4).map(tuple),
    st.integers(0, 4).map(lambda n: n == 0),
)


# ------------------------------------------------------------------------------ values
def _limits(datatype: str) -> list[Any]:
    """Values at and just past ``datatype``'s limits, as JSON gives them."""
    if datatype == "BOOL":
        return [True, False, 0, 1]
    if datatype in ("FP16", "FP32", "FP64", "BF16"):
        finfo = np.finfo(np.float32 if datatype == "BF16" else HOST_DTYPES[datatype])
        big = float(finfo.max)
        return [
            big,
            -big,
            big * 1.0000001,
            float(finfo.tiny),
            65519.0,
            65520.0,
            2.0**53 + 1,
            3.4028235677973366e38,
            1e308,
            5e-324,
            -0.0,
            0.0,
        ]
    info = np.iinfo(HOST_DTYPES[datatype])
    return [int(info.min), int(info.max), int(info.min) - 1, int(info.max) + 1, 2**64, -(2**63) - 1]


def _number(datatype: str, odd: bool) -> st.SearchStrategy[Any]:
    """One element of ``data``: what the datatype takes, or (``odd``) now and then something
    else."""
    if datatype == "BOOL":
        fitting: st.SearchStrategy[Any] = st.booleans()
    elif datatype in ("FP16", "FP32", "FP64", "BF16"):
        width = {"FP16": 16, "FP32": 32, "FP64": 64, "BF16": 32}[datatype]
        fitting = st.floats(allow_nan=False, allow_infinity=False, width=width)  # type: ignore[arg-type]
    else:
        info = np.iinfo(HOST_DTYPES[datatype])
        fitting = st.integers(int(info.min), int(info.max))
    spelled = st.sampled_from(
        ["1e2", "-0", "-0.0", "1.0", "1E+2", "0.5e1", "100", "-1", "2.5", "1e400", "-1e400"]
    ).map(_Token)
    other = st.one_of(
        st.sampled_from(_limits(datatype)),
        st.floats(allow_nan=False, allow_infinity=False),
        st.integers(-(2**70), 2**70),
        st.booleans(),
        st.none(),
        st.just("1"),
        st.just([1.0]),
    )
    if not odd:
        return fitting
    return st.one_of(fitting, fitting, fitting, fitting, fitting, fitting, spelled, other)


def _nested(flat: list[Any], shape: list[int]) -> Any:
    """``flat`` nested as ``shape`` (when the count fits it)."""
    for size in reversed(shape[1:]):
        if size <= 0 or len(flat) % size:
            return flat
        flat = [flat[i : i + size] for i in range(0, len(flat), size)]
    return flat


@st.composite
def _specs(draw: st.DrawFn) -> tuple[TensorSpec, ...]:
    """One input (the quick path's case) or two, of any datatype and a shape with the batch
    dimension first."""
    count = draw(st.integers(1, 6))
    specs = []
    for name in ("x", "w")[: 1 if count > 1 else 2]:
        datatype = draw(
            st.sampled_from(_FLOATING) if draw(st.integers(0, 3)) else st.sampled_from(DATATYPES)
        )
        dims = draw(st.lists(st.integers(1, 4) | st.just(-1), max_size=2))
        specs.append(TensorSpec(name, datatype, (-1, *dims)))
    return tuple(specs)


@st.composite
def _entry(draw: st.DrawFn, spec: TensorSpec, long: bool, near: bool) -> _Object:
    """An ``inputs`` entry for ``spec``: valid, or (``near``) now and then near it."""
    rows = draw(st.sampled_from([1, 1, 2, 2, 3, 3, 3, 3, 3, 5]))  # 5: over the max_rows of 4
    shape = [rows, *(draw(st.integers(1, 3)) if d == -1 else d for d in spec.shape[1:])]
    if long:  # past the quick path's one-by-one checks, to numpy's
        shape = [1, 300]
    count = math.prod(shape)
    odd = near and draw(st.integers(0, 3)) == 0
    values = draw(st.lists(_number(spec.datatype, odd), min_size=count, max_size=count))
    if long and draw(st.booleans()):  # many long lists of plain numbers: what it takes
        width = {"FP16": 16, "FP32": 32}.get(spec.datatype, 64)
        plain = st.floats(allow_nan=False, allow_infinity=False, width=width)  # type: ignore[arg-type]
        values = draw(
            st.lists(plain | st.integers(-(2**60), 2**60), min_size=count, max_size=count)
        )
    name: Any = spec.name
    datatype: Any = spec.datatype
    wrong = draw(st.integers(0, 28)) if near else -1  # past 13: valid
    if wrong == 1:
        shape = [*shape[:-1], shape[-1] + 1]
    elif wrong == 2:
        values = values[:-1]
    elif wrong == 3:
        shape = [*shape, 1]
    elif wrong == 4:
        shape = [float(d) if i == 0 else d for i, d in enumerate(shape)]  # type: ignore[misc]
    elif wrong == 5:
        datatype = draw(st.sampled_from([*DATATYPES, "BYTES", spec.datatype.lower(), None]))
    elif wrong == 6:
        name = draw(st.sampled_from(["X", "nope", "", None]))
    elif wrong == 7:
        shape = [0, *shape[1:]]
    data: Any = _nested(values, shape) if draw(st.booleans()) else values
    if wrong == 8 and isinstance(data, list) and data and isinstance(data[-1], list):
        data = [*data[:-1], data[-1][:-1]]  # ragged
    pairs: list[tuple[str, Any]] = []
    keys = ["name", "datatype", "shape", "data"]
    order = draw(st.permutations(keys))
    given = {"name": name, "datatype": datatype, "shape": shape, "data": data}
    for key in order:
        if wrong == 9 and key == "data":
            continue
        pairs.append((key, given[key]))
    if wrong == 10:
        pairs.append(("parameters", draw(_parameters())))
    elif wrong == 11:
        pairs.append((draw(st.sampled_from(["extra", "contents", "Data"])), draw(st.integers())))
    elif wrong == 12:  # a key given twice: the last one counts
        pairs.insert(0, ("data", draw(st.sampled_from([[], [1.0], None, "x"]))))
    elif wrong == 13:
        pairs.insert(0, ("shape", [9, 9]))
    return _Object(tuple(pairs))


def _parameters() -> st.SearchStrategy[Any]:
    scalar = st.one_of(
        st.booleans(),
        st.integers(-(2**64), 2**64),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=5),
    )
    keys = st.sampled_from(
        [
            "binary_data_size",
            "binary_data_output",
            "timeout",
            "priority",
            "custom",
            "triton_x",
            "shared_memory_offset",
            "binary_data",
            "classification",
        ]
    )
    value = scalar | st.none() | st.just({}) | st.just([1])
    return st.one_of(
        st.dictionaries(keys, value, max_size=3).map(lambda d: _Object(tuple(d.items()))),
        st.just(_Object(())),
        st.none(),
        st.just([]),
        st.just("x"),
    )


@st.composite
def _document(draw: st.DrawFn) -> tuple[tuple[TensorSpec, ...], bytes, dict[str, Any]]:
    """Specs, a request body for them (valid or near it), and the decode's options."""
    specs = draw(_specs())
    long = len(specs) == 1 and specs[0].datatype in _FLOATING and draw(st.integers(0, 4)) == 0
    near = draw(st.booleans())
    entries = [draw(_entry(spec, long, near)) for spec in specs]
    shuffled = draw(st.permutations(entries))
    top: list[tuple[str, Any]] = [("inputs", list(shuffled))]
    extra = draw(
        st.integers(0, 16) if near else st.sampled_from([0, 0, 0, 1, 5, 6])
    )  # 0, 10-16: none
    if extra == 1:
        top.append(("id", draw(st.text(max_size=8))))
    elif extra == 2:
        top.append(("id", draw(st.sampled_from(["a" * 4096, "a" * 4097, "é" * 4097]))))
    elif extra == 3:
        top.append(("id", draw(st.integers() | st.none() | st.booleans())))
    elif extra == 4:
        top.append(("parameters", draw(_parameters())))
    elif extra == 5:
        outputs = draw(st.lists(st.sampled_from(["y", "z", "q"]), max_size=3))
        top.append(("outputs", [_Object((("name", n),)) for n in outputs]))
    elif extra == 6:
        top.append(("model_name", "m"))
    elif extra == 7:
        top.insert(0, ("inputs", "nope"))  # a key given twice: the last one counts
    elif extra == 8:
        top.append(("inputs", [*shuffled, shuffled[0]]))  # an input given twice
    elif extra == 9:
        top.append(("id", _Token("NaN")))  # not JSON
    if draw(st.booleans()):
        top = draw(st.permutations(top))
    text = _text(_Object(tuple(top)), draw(_STYLES)).encode()
    if draw(st.integers(0, 20)) == 0:
        text = b"\xef\xbb\xbf" + text  # a UTF-8 byte order mark
    options = {"allow_nan": draw(st.booleans()), "max_rows": draw(st.sampled_from([4, 4, 4, 1]))}
    return specs, text, options


# ------------------------------------------------------------------------------ the tests
@FUZZ
@given(_document())
def test_a_json_body_decodes_the_same_on_the_fast_and_the_general_path(
    case: tuple[tuple[TensorSpec, ...], bytes, dict[str, Any]],
) -> None:
    specs, body, options = case
    fast = _fast(body, specs, **options)
    assert fast == _general(body, specs, **options), body[:400]
    event(f"{fast[0]}, {_taken(body, specs, options)}")


@FUZZ
@given(
    datatype=st.sampled_from(_FLOATING),
    rows=st.integers(1, 4),
    width=st.sampled_from([1, 3, 64, 100, 300]),
    data=st.data(),
)
def test_the_quick_path_takes_plain_floats_and_answers_as_the_general_one(
    datatype: str, rows: int, width: int, data: st.DataObject
) -> None:
    """Bodies the quick path takes (finite floats and ints of a float datatype), short and
    long, with and without a boolean elsewhere in the text: it answers as the general path."""
    bits = {"FP16": 16, "FP32": 32, "FP64": 64}[datatype]
    number = st.floats(allow_nan=False, allow_infinity=False, width=bits)  # type: ignore[arg-type]
    if width * rows > 256:
        number = number | st.integers(-(2**53), 2**53)
    values = data.draw(st.lists(number, min_size=rows * width, max_size=rows * width))
    entry = {"name": "x", "datatype": datatype, "shape": [rows, width], "data": values}
    doc: dict[str, Any] = {"inputs": [entry]}
    if data.draw(st.booleans()):
        doc["id"] = data.draw(st.sampled_from(["true", "false", "r-1", "u" * 40]))
    body = orjson.dumps(doc)
    specs = (TensorSpec("x", datatype, (-1, width)),)
    fast = _fast(body, specs, max_rows=8)
    assert fast == _general(body, specs, max_rows=8)
    assert fast[0] == "ok"


def _wire_bytes(datatype: str, values: list[Any]) -> bytes:
    if datatype == "BF16":
        return (np.array(values, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    return np.array(values, dtype=WIRE_DTYPES[datatype]).tobytes()


@FUZZ
@given(datatype=st.sampled_from(DATATYPES), width=st.integers(1, 5), data=st.data())
def test_json_binary_and_raw_bodies_of_the_same_values_decode_alike(
    datatype: str, width: int, data: st.DataObject
) -> None:
    """The same values as JSON ``data``, as binary tensor data after a JSON header, and as a
    raw binary body (``Inference-Header-Content-Length: 0``, one row) decode to one array."""
    rows = data.draw(st.integers(1, 3))
    values = data.draw(
        st.lists(exact_values(datatype), min_size=rows * width, max_size=rows * width)
    )
    specs = (TensorSpec("x", datatype, (-1, width)),)
    shape = [rows, width]
    json_body = orjson.dumps(
        {"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": values}]}
    )
    raw = _wire_bytes(datatype, values)
    entry = {
        "name": "x",
        "datatype": datatype,
        "shape": shape,
        "parameters": {"binary_data_size": len(raw)},
    }
    header = orjson.dumps({"inputs": [entry]})
    as_json = _fast(json_body, specs)
    as_binary = _fast(header + raw, specs, header_length=len(header))
    assert as_json[0] == "ok", as_json
    assert as_binary == as_json
    if rows == 1:
        assert _fast(raw, specs, header_length=0)[2] == as_json[2]


_WORDS = (b"true", b"false", b"null")


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.sampled_from([b"1.5", b"-2e10", b"0", b",", b"[", b"]", b'"x":', b" "]),
            st.sampled_from([b"true", b"false", b"null", b"tru", b"nul", b"u", b"l", b"ll"]),
            st.binary(max_size=6),
        ),
        max_size=40,
    ),
    st.integers(0, 6000),
    st.booleans(),
)
def test_the_word_scan_finds_a_word_exactly_where_the_plain_search_does(
    parts: list[bytes], padding: int, numbers_first: bool
) -> None:
    """``_holds_word`` (one memchr, then its marks) answers as ``word in text`` for any text,
    short or long, its marks few or many; so ``_may_hold_bools`` is the plain search too."""
    numbers = b"1.25," * (padding // 5)
    words = b"".join(parts)
    text = numbers + words if numbers_first else words + numbers
    for word in _WORDS:
        for at in range(len(word)):
            assert protocol._holds_word(text, word, at) == (word in text), (word, at)
    assert protocol._may_hold_bools(text) == (b"true" in text or b"false" in text)


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(
            ["a", "timeout", "binary_data_size", "shared_memory_region", "shared_memory_offset"]
        ),
        st.one_of(
            st.booleans(),
            st.integers(),
            st.floats(),
            st.text(max_size=3),
            st.none(),
            st.just({}),
            st.just([]),
        ),
        max_size=5,
    ),
    st.sampled_from([protocol._REQUEST_CHECKED, protocol._INPUT_CHECKED]),
    st.booleans(),
)
def test_the_parameter_scan_answers_as_its_loop(
    params: dict[str, Any], checked: tuple[str, ...], shm: bool
) -> None:
    """``_check_scalars``' one-pass test of all-scalar parameters lets through exactly what
    its per-key loop lets through, and the loop names the first it refuses."""
    if shm and "shared_memory_region" in params:
        checked = (*checked, *protocol._SHM_KEYS)
    refused = [
        key
        for key, value in params.items()
        if type(value) not in protocol._SCALARS and (value is None or key not in checked)
    ]
    if not refused:
        protocol._check_scalars(params, "the request", checked, shm)
        return
    with pytest.raises(ServeError) as refusal:
        protocol._check_scalars(params, "the request", checked, shm)
    assert str(refusal.value).startswith(f"parameter {refused[0]!r} has invalid type")


def test_a_long_list_with_a_value_past_1e154_is_declined_without_a_warning() -> None:
    """Regression: the quick path's sum of squares of a long list overflowed with a
    RuntimeWarning (``ndarray.dot``) for a value past 1e154, so that a request with one made
    the server warn, and fail with a 500 where warnings are errors, where the general path
    answers 400 (the value is infinite as FP32)."""
    spec = TensorSpec("x", "FP32", (-1, 300))
    values = [0.5] * 299 + [1.5e154]
    raw = {"name": "x", "datatype": "FP32", "shape": [1, 300], "data": values}
    body = orjson.dumps({"inputs": [raw]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert protocol._quick_json_array(raw, spec, 8, bools=False) is None
        fast = _fast(body, (spec,))
    assert fast == _general(body, (spec,))
    assert fast[:3] == ("error", "InputError", 400)
    assert "past FP32's range" in fast[3]
