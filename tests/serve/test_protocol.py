"""The OIP codec: JSON and binary tensors for every datatype, and every validation error."""

from __future__ import annotations

import contextlib
import re
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchplace.errors import InputError, PayloadTooLargeError, ServeError
from torchplace.models import TensorSpec
from torchplace.serve import protocol, protocol_v1
from torchplace.serve.protocol import (
    WIRE_DTYPES,
    decode_infer_request,
    encode_infer_response,
    model_metadata,
    server_metadata,
)

from .conftest import seed_input

SEED_IN = (TensorSpec("input", "FP32", (-1, 8)),)
SEED_OUT = (TensorSpec("output", "FP32", (-1, 2)),)

SAMPLES: dict[str, list[Any]] = {
    "BOOL": [True, False, True, True],
    "UINT8": [0, 1, 200, 255],
    "UINT16": [0, 1, 60000, 65535],
    "UINT32": [0, 1, 4_000_000_000, 7],
    "UINT64": [0, 1, 2**63, 9],
    "INT8": [-128, 0, 5, 127],
    "INT16": [-32768, 0, 5, 32767],
    "INT32": [-(2**31), 0, 5, 2**31 - 1],
    "INT64": [-(2**63), 0, 5, 2**63 - 1],
    "FP16": [0.5, -1.25, 1024.0, 0.0],
    "BF16": [0.5, -1.25, 1024.0, 3.0],
    "FP32": [0.5, -1.25, 1e30, 1e-30],
    "FP64": [0.5, -1.25, 1e300, 1e-300],
}


def _specs(datatype: str) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    return (TensorSpec("x", datatype, (-1, 2)),), (TensorSpec("y", datatype, (-1, 2)),)


def _json_body(inputs: list[dict[str, Any]], **extra: Any) -> bytes:  # a request with given inputs
    return orjson.dumps({"inputs": inputs, **extra})


def _decode(body: bytes, **kw: Any) -> protocol.InferRequest:
    kw.setdefault("inputs", SEED_IN)
    kw.setdefault("outputs", SEED_OUT)
    kw.setdefault("max_rows", 32)
    return decode_infer_request(body, **kw)


def _binary_body(entries: list[tuple[dict[str, Any], bytes]], **extra: Any) -> tuple[bytes, int]:
    header = orjson.dumps({"inputs": [e for e, _ in entries], **extra})
    return header + b"".join(raw for _, raw in entries), len(header)


@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_json_round_trip_every_datatype(datatype: str) -> None:
    inputs, outputs = _specs(datatype)
    values = SAMPLES[datatype]
    body = _json_body([{"name": "x", "datatype": datatype, "shape": [2, 2], "data": values}])
    req = _decode(body, inputs=inputs, outputs=outputs)
    array = req.inputs["x"]
    assert array.shape == (2, 2)
    assert req.rows == 2
    np.testing.assert_array_equal(array.reshape(-1), np.array(values, dtype=array.dtype))
    encoded, header_length = encode_infer_response(
        model_name="m", model_version="1", request=req, results={"y": array}, outputs=outputs
    )
    assert header_length is None
    doc = orjson.loads(encoded)
    out = doc["outputs"][0]
    assert (out["name"], out["datatype"], out["shape"]) == ("y", datatype, [2, 2])
    assert out["data"] == values


@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_binary_round_trip_every_datatype(datatype: str) -> None:
    inputs, outputs = _specs(datatype)
    values = SAMPLES[datatype]
    wire = WIRE_DTYPES[datatype]
    if datatype == "BF16":  # exact bfloat16 values: the top 16 bits of their float32
        raw = (np.array(values, dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    else:
        raw = np.array(values, dtype=wire).tobytes()
    entry = {
        "name": "x",
        "datatype": datatype,
        "shape": [2, 2],
        "parameters": {"binary_data_size": len(raw)},
    }
    body, hl = _binary_body([(entry, raw)], parameters={"binary_data_output": True})
    req = _decode(body, header_length=hl, inputs=inputs, outputs=outputs)
    array = req.inputs["x"]
    assert array.flags.writeable
    np.testing.assert_array_equal(array.reshape(-1), np.array(values, dtype=array.dtype))
    encoded, header_length = encode_infer_response(
        model_name="m", model_version="1", request=req, results={"y": array}, outputs=outputs
    )
    assert header_length is not None
    doc = orjson.loads(encoded[:header_length])
    out = doc["outputs"][0]
    assert out["parameters"] == {"binary_data_size": len(raw)}
    assert "data" not in out
    assert encoded[header_length:] == raw


def test_bf16_output_rounds_to_nearest_even() -> None:
    inputs, outputs = _specs("BF16")
    req = _decode(
        _json_body([{"name": "x", "datatype": "BF16", "shape": [1, 2], "data": [1.0, 2.0]}]),
        inputs=inputs,
        outputs=outputs,
    )
    value = np.array([[1.0 + 2**-8, 1.0 + 3 * 2**-8]], dtype=np.float32)  # ties
    wanted = protocol.RequestedOutput("y", binary=True)
    req2 = protocol.InferRequest(req.id, req.inputs, 1, (wanted,), False)
    body, hl = encode_infer_response(
        model_name="m", model_version="1", request=req2, results={"y": value}, outputs=outputs
    )
    assert hl is not None
    bits = np.frombuffer(body[hl:], dtype="<u2")
    # 1 + 2^-8 ties to 1.0 (even), 1 + 3*2^-8 ties up to 1 + 2^-6
    assert bits.tolist() == [0x3F80, 0x3F82]


def test_nested_json_data_is_accepted() -> None:
    nested = [[float(i) for i in range(8)], [float(i) for i in range(8, 16)]]
    req = _decode(
        _json_body([{"name": "input", "datatype": "FP32", "shape": [2, 8], "data": nested}])
    )
    np.testing.assert_array_equal(req.inputs["input"], np.array(nested, dtype=np.float32))


def test_requested_outputs_pick_binary_per_output() -> None:
    outputs = (TensorSpec("a", "FP32", (-1, 1)), TensorSpec("b", "INT64", (-1, 1)))
    inputs = (TensorSpec("x", "FP32", (-1, 1)),)
    body = orjson.dumps(
        {
            "id": "r1",
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}],
            "outputs": [{"name": "b", "parameters": {"binary_data": True}}, {"name": "a"}],
        }
    )
    req = _decode(body, inputs=inputs, outputs=outputs)
    assert req.outputs == (
        protocol.RequestedOutput("b", True),
        protocol.RequestedOutput("a", False),
    )
    results = {"a": np.array([[0.25]], np.float32), "b": np.array([[7]], np.int64)}
    encoded, hl = encode_infer_response(
        model_name="m", model_version="2", request=req, results=results, outputs=outputs
    )
    assert hl is not None
    doc = orjson.loads(encoded[:hl])
    assert doc["id"] == "r1"
    assert doc["model_version"] == "2"
    assert [o["name"] for o in doc["outputs"]] == ["b", "a"]
    assert doc["outputs"][1]["data"] == [0.25]
    assert np.frombuffer(encoded[hl:], "<i8").tolist() == [7]


def test_metadata_bodies() -> None:
    meta = orjson.loads(server_metadata(name="torchplace", version="1", extensions=["x"]))
    assert meta == {"name": "torchplace", "version": "1", "extensions": ["x"]}
    model = orjson.loads(
        model_metadata(
            name="seed-mlp", versions=["1"], platform="pytorch", inputs=SEED_IN, outputs=SEED_OUT
        )
    )
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 8]}]
    assert model["outputs"][0]["shape"] == [-1, 2]


BAD_REQUESTS: list[tuple[str, bytes, dict[str, Any], str]] = [
    ("not json", b"{nope", {}, "not valid JSON"),
    ("json array", b"[1, 2]", {}, "JSON object"),
    ("no inputs", b"{}", {}, "needs 'inputs'"),
    ("empty inputs", _json_body([]), {}, "missing required input(s) ['input']"),
    ("input not object", _json_body([5]), {}, "must be an object"),
    ("nameless input", _json_body([{"datatype": "FP32"}]), {}, "'name'"),
    ("unknown input", _json_body([seed_input(name="x")]), {}, "unexpected inference input 'x'"),
    ("twice", _json_body([seed_input(), seed_input()]), {}, "already exists in request"),
    (
        "wrong datatype",
        _json_body([seed_input(datatype="FP64")]),
        {},
        "data-type is 'FP64', but the model expects 'FP32'",
    ),
    ("bytes", _json_body([seed_input(datatype="BYTES")]), {}, "BYTES"),
    ("shape not list", _json_body([seed_input(shape="1,8")]), {}, "'shape'"),
    ("negative dim", _json_body([seed_input(shape=[-1, 8])]), {}, "non-negative"),
    ("bool dim", _json_body([seed_input(shape=[True, 8])]), {}, "non-negative"),
    ("wrong rank", _json_body([seed_input(shape=[8])]), {}, "Expected [-1,8], got [8]"),
    ("wrong width", _json_body([seed_input(shape=[1, 7])]), {}, "unexpected shape for input"),
    ("zero rows", _json_body([seed_input(shape=[0, 8], data=[])]), {}, "at least one row"),
    ("count lies", _json_body([seed_input(shape=[2, 8])]), {}, "needs 16 values"),
    ("no data", _json_body([seed_input(data=None)]), {}, "needs 'data'"),
    ("strings", _json_body([seed_input(data=["a"] * 8)]), {}, "strings"),
    ("bools for floats", _json_body([seed_input(data=[True] * 8)]), {}, "booleans"),
    ("ragged", _json_body([seed_input(data=[[1.0], [1.0, 2.0]])]), {}, "regularly nested"),
    ("objects", _json_body([seed_input(data=[{}] * 8)]), {}, "mixed or nested"),
    ("id not str", _json_body([seed_input()], id=5), {}, "'id'"),
    ("params not object", _json_body([seed_input()], parameters=[1]), {}, "'parameters'"),
    (
        "binary flag not bool",
        _json_body([seed_input()], parameters={"binary_data_output": "yes"}),
        {},
        "binary_data_output",
    ),
    ("outputs not list", _json_body([seed_input()], outputs={}), {}, "'outputs'"),
    (
        "unknown output",
        _json_body([seed_input()], outputs=[{"name": "z"}]),
        {},
        "unexpected inference output 'z'",
    ),
    (
        "output twice",
        _json_body([seed_input()], outputs=[{"name": "output"}, {"name": "output"}]),
        {},
        "output 'output' already exists in request",  # Triton's words
    ),
    (
        "classification",
        _json_body(
            [seed_input()], outputs=[{"name": "output", "parameters": {"classification": "3"}}]
        ),
        {},
        "'classification' must be a positive integer",
    ),
    (
        "shm input",
        _json_body([seed_input(parameters={"shared_memory_region": "r"})]),
        {},
        "'shared_memory_region' and also 'data'",
    ),
    (
        "binary size without header",
        _json_body([seed_input(data=None, parameters={"binary_data_size": 32})]),
        {},
        "Inference-Header-Content-Length",
    ),
    (
        "data and binary",
        _json_body([seed_input(parameters={"binary_data_size": 32})]),
        {"header_length": len(_json_body([seed_input(parameters={"binary_data_size": 32})]))},
        "both 'data' and 'binary_data_size'",
    ),
    ("raw body of the wrong size", b"{}", {"header_length": 0}, "the whole body is one row"),
]


@pytest.mark.parametrize(("case", "body", "kw", "needle"), BAD_REQUESTS, ids=lambda v: str(v)[:30])
def test_bad_requests_raise_input_error_naming_the_problem(
    case: str, body: bytes, kw: dict[str, Any], needle: str
) -> None:
    with pytest.raises(InputError) as info:
        _decode(body, **kw)
    assert needle in str(info.value), (case, str(info.value))
    assert info.value.status == 400


def test_nan_is_refused_unless_allowed() -> None:
    raw = np.array([np.nan] + [0.0] * 7, dtype="<f4").tobytes()
    entry = seed_input(data=None, parameters={"binary_data_size": 32})
    body, hl = _binary_body([(entry, raw)])
    with pytest.raises(InputError, match="NaN"):
        _decode(body, header_length=hl)
    req = _decode(body, header_length=hl, allow_nan=True)
    assert np.isnan(req.inputs["input"][0, 0])


@pytest.mark.parametrize(("datatype", "big", "limit"), [("FP32", 1e39, "3.403e+38"),
                                                      ("FP16", 70000.0, "6.55e+04")])  # fmt: skip
def test_a_json_number_past_the_float_range_is_named_with_its_index_and_the_fix(
    datatype: str, big: float, limit: str
) -> None:
    inputs, outputs = _specs(datatype)
    entry = {"name": "x", "shape": [2, 2], "datatype": datatype, "data": [1.0, 2.0, big, 3.0]}
    body = orjson.dumps({"inputs": [entry]})
    with pytest.raises(InputError) as info:
        decode_infer_request(body, inputs=inputs, outputs=outputs, max_rows=4)
    message = str(info.value)
    assert f"past {datatype}'s range (±{limit})" in message, message
    assert "flat index 2" in message, message
    assert "--allow-nan" in message, message


def test_a_utf8_byte_order_mark_before_the_json_is_ignored() -> None:
    body = _json_body([seed_input()])
    plain = _decode(body)
    for bom_body, header_length in (
        (b"\xef\xbb\xbf" + body, None),
        (b"\xef\xbb\xbf" + body, len(body) + 3),
    ):
        req = _decode(bom_body, header_length=header_length)
        np.testing.assert_array_equal(req.inputs["input"], plain.inputs["input"])
    with pytest.raises(InputError, match="not valid JSON"):
        _decode(b"\xef\xbb" + body)  # a broken one is still an error


def _unparsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any parse of a JSON body fail the test: a refusal must come before it."""

    def parse(data: object) -> None:
        raise AssertionError("the body was parsed")

    monkeypatch.setattr(orjson, "loads", parse)


_MANY = protocol.MAX_JSON_STRUCTURES + 1


@pytest.mark.parametrize(
    ("what", "body"),
    [
        ("keys", _json_body([seed_input()], parameters={f"k{i}": 0 for i in range(_MANY)})),
        ("arrays", _json_body([seed_input(shape=[_MANY, 1], data=[[0.5]] * _MANY)])),
        # three bytes an object: padded to the size from which bodies are counted
        ("objects", _json_body([seed_input()], outputs=[{}] * _MANY, pad="x" * 300_000)),
    ],
)
def test_a_body_of_too_many_structures_is_refused_before_it_is_parsed(
    monkeypatch: pytest.MonkeyPatch, what: str, body: bytes
) -> None:
    _unparsed(monkeypatch)
    with pytest.raises(InputError) as caught:
        _decode(body, max_rows=2 * _MANY)
    message = str(caught.value)
    assert f"{protocol.MAX_JSON_STRUCTURES:,} one body may hold" in message, message
    assert "one flat array in row-major order" in message, message
    found = re.search(r"holds up to ([\d,]+) arrays and objects and ([\d,]+) keys", message)
    assert found is not None, message
    containers, keys = (int(n.replace(",", "")) for n in found.groups())
    assert _MANY <= (keys if what == "keys" else containers) <= _MANY + 10, message
    with pytest.raises(InputError, match="one body may hold"):  # and in the binary extension
        _decode(body + b"\0" * 8, header_length=len(body), max_rows=2 * _MANY)


def test_colons_in_strings_are_not_taken_for_keys() -> None:
    # one string full of colons: more colons than the bound, but few quotes, so few keys
    stamps = "12:30:00," * (protocol.MAX_JSON_STRUCTURES // 2)
    body = _json_body([seed_input()], parameters={"log": stamps})
    assert body.count(b":") > protocol.MAX_JSON_STRUCTURES
    assert _decode(body).inputs["input"].shape == (1, 8)


def test_a_body_is_counted_from_a_mib_and_nested_rows_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counted: list[object] = []
    check = protocol._check_structures
    monkeypatch.setattr(protocol, "_check_structures", lambda data: counted.append(len(data)))
    _decode(_json_body([seed_input()]))
    assert counted == []
    # 4096 nested rows, a request at the default --max-request-rows: counted, and well within
    wide = (TensorSpec("input", "FP32", (-1, 64)),)
    rows = np.full((4096, 64), 0.5, np.float32)
    big = _json_body([seed_input(shape=[4096, 64], data=rows.tolist())])
    monkeypatch.setattr(protocol, "_check_structures", lambda data: counted.append(check(data)))
    decoded = _decode(big, inputs=wide, max_rows=4096)
    assert counted == [None]  # counted once, and let through
    np.testing.assert_array_equal(decoded.inputs["input"], rows)


def test_integer_out_of_range_is_refused() -> None:
    inputs, outputs = _specs("INT8")
    body = _json_body([{"name": "x", "datatype": "INT8", "shape": [1, 2], "data": [1, 300]}])
    with pytest.raises(InputError, match="300 is out of range for INT8"):
        _decode(body, inputs=inputs, outputs=outputs)


def test_binary_bool_bytes_must_be_0_or_1() -> None:
    inputs, outputs = _specs("BOOL")
    entry = {
        "name": "x",
        "datatype": "BOOL",
        "shape": [1, 2],
        "parameters": {"binary_data_size": 2},
    }
    body, hl = _binary_body([(entry, b"\x01\x07")])
    with pytest.raises(InputError, match="0 or 1"):
        _decode(body, header_length=hl, inputs=inputs, outputs=outputs)


@pytest.mark.parametrize(
    ("size", "extra", "needle"),
    [
        (31, b"", "input byte size mismatch for input 'input'. Expected 32, got 31"),
        (32, b"", "only 16 bytes"),  # the section is short
        (32, b"\0" * 32, "add up to 32"),  # trailing bytes nobody claims
    ],
)
def test_binary_sizes_must_match(size: int, extra: bytes, needle: str) -> None:
    raw = (
        np.zeros(8, "<f4").tobytes()[:16]
        if needle == "only 16 bytes"
        else np.zeros(8, "<f4").tobytes()
    )
    entry = seed_input(data=None, parameters={"binary_data_size": size})
    body, hl = _binary_body([(entry, raw + extra)])
    with pytest.raises(InputError, match=needle):
        _decode(body, header_length=hl)


def test_header_length_past_the_body() -> None:
    with pytest.raises(InputError, match="outside the body"):
        _decode(b"{}", header_length=10)


def test_inputs_must_agree_on_rows() -> None:
    inputs = (TensorSpec("a", "FP32", (-1, 1)), TensorSpec("b", "FP32", (-1, 1)))
    body = _json_body(
        [
            {"name": "a", "datatype": "FP32", "shape": [1, 1], "data": [1.0]},
            {"name": "b", "datatype": "FP32", "shape": [2, 1], "data": [1.0, 2.0]},
        ]
    )
    with pytest.raises(InputError, match="same batch size"):
        _decode(body, inputs=inputs)
    body = _json_body([{"name": "a", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}])
    with pytest.raises(InputError, match="but missing required input"):
        _decode(body, inputs=inputs)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 32),
    seed=st.integers(0, 2**32 - 1),
    binary_in=st.booleans(),
    binary_out=st.booleans(),
)
def test_random_seed_requests_round_trip(
    rows: int, seed: int, binary_in: bool, binary_out: bool
) -> None:
    x = np.random.default_rng(seed).standard_normal((rows, 8)).astype(np.float32)
    if binary_in:
        raw = x.tobytes()
        entry = {
            "name": "input",
            "datatype": "FP32",
            "shape": [rows, 8],
            "parameters": {"binary_data_size": len(raw)},
        }
        body, hl = _binary_body([(entry, raw)], parameters={"binary_data_output": binary_out})
        req = _decode(body, header_length=hl)
    else:
        body = _json_body(
            [{"name": "input", "datatype": "FP32", "shape": [rows, 8], "data": x.ravel().tolist()}],
            parameters={"binary_data_output": binary_out},
        )
        req = _decode(body)
    np.testing.assert_array_equal(req.inputs["input"], x)
    y = x[:, :2] * 3
    encoded, hl2 = encode_infer_response(
        model_name="seed-mlp",
        model_version="1",
        request=req,
        results={"output": y},
        outputs=SEED_OUT,
    )
    if binary_out:
        assert hl2 is not None
        got = np.frombuffer(encoded[hl2:], "<f4").reshape(rows, 2)
    else:
        assert hl2 is None
        got = np.array(orjson.loads(encoded)["outputs"][0]["data"], np.float32).reshape(rows, 2)
    np.testing.assert_array_equal(got, y)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=200).map(str.encode))
def test_arbitrary_bytes_never_raise_anything_but_input_error(body: bytes) -> None:
    with contextlib.suppress(InputError):
        _decode(body)


@settings(max_examples=150, deadline=None)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | st.text(max_size=5),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(
                st.sampled_from(
                    ["name", "datatype", "shape", "data", "parameters", "inputs", "id"]
                ),
                children,
                max_size=4,
            )
        ),
        max_leaves=20,
    )
)
def test_arbitrary_json_never_raises_anything_but_input_error(doc: Any) -> None:
    try:
        body = orjson.dumps({"inputs": [doc]})
    except (TypeError, orjson.JSONEncodeError):
        return
    with contextlib.suppress(InputError):
        _decode(body)


@pytest.mark.parametrize("rows", [33, 10**12])
def test_more_rows_than_the_request_limit_is_payload_too_large(rows: int) -> None:
    with pytest.raises(PayloadTooLargeError, match="over the limit of 32 rows per request"):
        _decode(_json_body([seed_input(shape=[rows, 8])]))


def test_rows_beyond_a_batch_but_within_the_request_limit_decode() -> None:
    x = np.arange(40 * 8, dtype=np.float32).reshape(40, 8)
    decoded = _decode(_json_body([seed_input(shape=[40, 8], data=x.ravel().tolist())]), max_rows=64)
    assert decoded.rows == 40
    np.testing.assert_array_equal(decoded.inputs["input"], x)


def test_timeout_and_priority_parameters() -> None:
    decoded = _decode(_json_body([seed_input()], parameters={"timeout": 5000, "priority": 2}))
    assert (decoded.timeout_us, decoded.priority) == (5000, 2)
    assert _decode(_json_body([seed_input()])).timeout_us is None
    for bad in ({"timeout": -1}, {"timeout": 1.5}, {"priority": "high"}, {"priority": True}):
        with pytest.raises(InputError, match="must be a non-negative integer"):
            _decode(_json_body([seed_input()], parameters=bad))


# ---------------------------------------------------------------- the quick JSON path
_QUICK_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([65504.0, 65520.0, 3.4028234663852886e38, 3.5e38, -0.0, 5e-324, 1e308]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
)


def _general(raw: dict[str, Any], spec: TensorSpec) -> np.ndarray | str:
    """What the general path answers for one input entry: its array, or its error."""
    try:
        return protocol._decode_input(raw, spec, None, 0, 4096, False)[0]
    except (InputError, PayloadTooLargeError) as exc:
        return str(exc)


@settings(max_examples=300, deadline=None)
@given(
    datatype=st.sampled_from(["FP16", "FP32", "FP64", "INT32", "BF16"]),
    values=st.one_of(
        st.lists(_QUICK_VALUES, min_size=0, max_size=12),
        # lists the quick path takes (most mixed lists above it declines)
        st.lists(st.floats(allow_nan=False, allow_infinity=False, width=16), min_size=1),
        # long lists, converted by numpy first
        st.lists(_QUICK_VALUES, min_size=257, max_size=300),
        st.lists(  # finite: most of these the quick path takes, so equality is checked
            st.one_of(
                st.floats(allow_nan=False, allow_infinity=False, width=32),
                st.integers(-(2**60), 2**60),
            ),
            min_size=257,
            max_size=300,
        ),
        st.lists(  # ints alone, some past 2**53 (where float64 stops holding every int)
            st.integers(-(2**54), 2**54), min_size=257, max_size=300
        ),
    ),
    extra_dim=st.booleans(),
)
def test_quick_json_path_equals_the_general_one(
    datatype: str, values: list[Any], extra_dim: bool
) -> None:
    """Whatever the quick path takes, it decodes exactly as the general path; whatever it
    declines (NaN, infinities, overflow, ints, bools) the general path still decides."""
    spec = TensorSpec("x", datatype, (-1, len(values)))
    shape = [1, len(values)] + ([1] if extra_dim else [])
    raw = {"name": "x", "datatype": datatype, "shape": shape, "data": values}
    general = _general(raw, spec)
    routes = [protocol._quick_json_array(raw, spec, 4096)]
    if not any(type(v) is bool for v in values):  # the document holds no boolean literal
        routes.append(protocol._quick_json_array(raw, spec, 4096, bools=False))
    for quick in routes:
        if quick is None:
            continue
        assert isinstance(general, np.ndarray), general
        assert quick.dtype == general.dtype
        assert quick.shape == general.shape
        np.testing.assert_array_equal(quick, general)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"data": [1.0, float("nan")]}, "NaN"),
        ({"data": [1.0, float("inf")]}, "infinite"),
        ({"data": [1.0, 1e39]}, "overflows FP32"),
        ({"data": [1.0, 2]}, "an int"),
        ({"data": [1.0, True]}, "a bool"),
        ({"data": [[1.0, 2.0]]}, "nested"),
        ({"shape": [1, 3]}, "a shape that does not match the data"),
        ({"shape": [0, 2]}, "an empty batch"),
        ({"shape": [5000, 2]}, "over the row limit"),
        ({"datatype": "FP64"}, "another datatype"),
        ({"parameters": {}}, "parameters"),
    ],
)
def test_quick_json_path_declines_what_it_does_not_check(
    change: dict[str, Any], reason: str
) -> None:
    spec = TensorSpec("x", "FP32", (-1, 2))
    raw = {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0], **change}
    assert protocol._quick_json_array(raw, spec, 4096) is None, reason


def test_quick_json_path_takes_a_long_list_of_numbers_and_declines_anything_else() -> None:
    spec = TensorSpec("x", "FP32", (-1, 300))
    raw = {"name": "x", "datatype": "FP32", "shape": [1, 300], "data": [0.5] * 300}
    quick = protocol._quick_json_array(raw, spec, 4096)
    assert quick is not None
    assert quick.dtype == np.float32
    raw["data"] = [0.5] * 299 + [2]  # an int among floats: as numpy converts it
    quick = protocol._quick_json_array(raw, spec, 4096)
    assert quick is not None
    assert quick[0, -1] == 2.0
    for bad in (True, "0.5", None, [0.5], float("nan"), 1e39, 2**64):
        raw["data"] = [0.5] * 299 + [bad]
        assert protocol._quick_json_array(raw, spec, 4096) is None, bad
    raw["data"] = [2] * 300  # ints only: the general path's integer rules decide
    assert protocol._quick_json_array(raw, spec, 4096) is None


def test_a_long_list_in_a_document_without_booleans_goes_straight_to_float64() -> None:
    """Told the document holds no boolean, the long path takes ints and floats in one
    conversion, and still declines what it cannot vouch for."""
    spec = TensorSpec("x", "FP32", (-1, 300))
    raw = {"name": "x", "datatype": "FP32", "shape": [1, 300], "data": [2] * 299 + [0.5]}
    quick = protocol._quick_json_array(raw, spec, 4096, bools=False)
    assert quick is not None
    assert quick.dtype == np.float32
    np.testing.assert_array_equal(quick[0, :2], [2.0, 2.0])
    for bad in ("0.5", None, [0.5], float("nan"), float("inf"), 1e39, 2**53 + 1, 10**400):
        raw["data"] = [0.5] * 299 + [bad]
        quick = protocol._quick_json_array(raw, spec, 4096, bools=False)
        general = _general(raw, spec)
        if quick is not None:  # taken by the exact route after the fast one declined
            assert isinstance(general, np.ndarray), bad
            np.testing.assert_array_equal(quick, general)


@pytest.mark.parametrize(
    ("body", "bools"),
    [
        (b'{"inputs":[{"data":[1.0,2]}]}', False),
        (b'{"inputs":[{"data":[1.0,true]}]}', True),
        (b'{"id":"false","inputs":[]}', True),  # the word in a string: safe, only slower
        (bytearray(b'{"data":[false]}'), True),
        (memoryview(b'{"data":[1.0]}'), True),  # not searched: assumed to hold one
    ],
)
def test_a_document_may_hold_booleans_unless_neither_literal_appears(
    body: bytes | bytearray | memoryview, bools: bool
) -> None:
    assert protocol._may_hold_bools(body) is bools


@given(
    st.lists(
        st.sampled_from(
            [b"true", b"false", b"null", b"u", b"l", b"tr", b"ue", b"fa", b"lse", b"nu", b"1.5"]
        ),
        max_size=60,
    )
)
def test_the_literal_search_answers_as_a_plain_substring_search(parts: list[bytes]) -> None:
    """Marks near the start, many marks (past the one-by-one limit), words cut in two."""
    body = b"".join(parts)
    for text in (body, bytearray(body)):
        assert protocol._may_hold_bools(text) is (b"true" in body or b"false" in body)
        assert protocol._holds_word(text, b"null", 2) is (b"null" in body)


def test_a_long_request_body_without_booleans_takes_the_one_conversion(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """decode_infer_request sends a long list in a body with no boolean literal through
    _plain_floats, and one with a boolean (anywhere) or a short body around it."""
    calls: list[int] = []
    original = protocol._plain_floats

    def counted(data: list[Any], limit: float) -> np.ndarray | None:
        calls.append(len(data))
        return original(data, limit)

    monkeypatch.setattr(protocol, "_plain_floats", counted)
    spec = TensorSpec("x", "FP32", (-1, 300))
    entry = {"name": "x", "datatype": "FP32", "shape": [1, 300], "data": [0.5] * 299 + [2]}
    decoded = protocol.decode_infer_request(
        orjson.dumps({"inputs": [entry]}), inputs=(spec,), outputs=(), max_rows=4096
    )
    assert calls == [300]
    np.testing.assert_array_equal(decoded.inputs["x"][0, -2:], [0.5, 2.0])
    protocol.decode_infer_request(
        orjson.dumps({"id": "true", "inputs": [entry]}), inputs=(spec,), outputs=(), max_rows=4096
    )
    assert calls == [300]  # the word in the id: the type checks decide instead


def test_a_long_request_with_a_boolean_is_refused_as_before() -> None:
    """The quick path sees the boolean: the general path refuses it (not a quiet 1.0)."""
    spec = TensorSpec("x", "FP32", (-1, 300))
    body = orjson.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [1, 300], "data": [0.5] * 299 + [True]}
            ]
        }
    )
    with pytest.raises(InputError, match="booleans"):
        protocol.decode_infer_request(body, inputs=(spec,), outputs=(), max_rows=4096)


def test_the_quick_request_path_keeps_the_id_and_declines_anything_else() -> None:
    spec = TensorSpec("x", "FP32", (-1, 2))
    entry = {"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 1.5]}
    decoded = protocol._quick_request({"inputs": [entry], "id": "r1"}, spec, 4096)
    assert decoded is not None
    assert (decoded.id, decoded.rows) == ("r1", 1)
    for doc in (
        {"inputs": [entry], "id": 7},
        {"inputs": [entry], "id": None},
        {"inputs": [entry], "parameters": {}},
        {"inputs": [entry], "outputs": [{"name": "y"}]},
        {"inputs": [entry, entry]},
        {"inputs": [{**entry, "name": "z"}]},
    ):
        assert protocol._quick_request(doc, spec, 4096) is None, doc


def test_quick_json_path_takes_the_common_request() -> None:
    spec = TensorSpec("x", "FP32", (-1, 2))
    raw = {"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [0.5, -1.0, 2.0, 3.25]}
    quick = protocol._quick_json_array(raw, spec, 4096)
    assert quick is not None
    np.testing.assert_array_equal(quick, np.array([[0.5, -1.0], [2.0, 3.25]], np.float32))


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("FP32", [1.0, True]),
        ("FP32", [[1, 2.0], [3.0, False]]),
        ("INT32", [True, 2]),
        ("UINT8", [[1, 2], [3, True]]),
    ],
)
def test_booleans_among_numbers_are_refused(datatype: str, data: list[Any]) -> None:
    """numpy reads ``true`` as 1 next to numbers; the codec refuses it instead of guessing."""
    shape = [2, 2] if isinstance(data[0], list) else [1, 2]
    spec = TensorSpec("x", datatype, (-1, 2))
    raw = {"name": "x", "datatype": datatype, "shape": shape, "data": data}
    with pytest.raises(InputError, match="mixes booleans with numbers"):
        protocol._decode_input(raw, spec, None, 0, 4096, False)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_outputs_are_not_answered_as_json_null(value: float) -> None:
    """JSON has no number for them (orjson would write null); the binary form carries them."""
    spec = (TensorSpec("output", "FP32", (-1, 2)),)
    request = protocol.InferRequest(None, {}, 1, None, False)
    results = {"output": np.array([[1.0, value]], np.float32)}
    with pytest.raises(ServeError, match="NaN or infinite values, which JSON numbers cannot"):
        protocol.encode_infer_response(
            model_name="m", model_version="1", request=request, results=results, outputs=spec
        )
    binary = protocol.InferRequest(None, {}, 1, None, True)
    body, header = protocol.encode_infer_response(
        model_name="m", model_version="1", request=binary, results=results, outputs=spec
    )
    assert header is not None
    got = np.frombuffer(body[header:], np.float32)
    assert got[0] == 1.0
    assert (np.isnan(got[1]) and np.isnan(value)) or got[1] == value
    with pytest.raises(ServeError, match="NaN or infinite"):
        protocol_v1.encode_predict_response(results, spec)


def test_a_raw_binary_request_to_a_model_of_two_inputs_is_told_in_triton_s_words() -> None:
    spec = (TensorSpec("a", "FP32", (-1, 2)), TensorSpec("b", "FP32", (-1, 2)))
    with pytest.raises(InputError) as info:
        decode_infer_request(
            b"\0" * 16, inputs=spec, outputs=spec, max_rows=4, header_length=0, model="m"
        )
    assert str(info.value).startswith(
        "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'm' "
        "model configuration"
    )


def test_a_raw_binary_request_works_out_one_variable_dimension() -> None:
    """Inference-Header-Content-Length: 0 with a row of [-1] values: its length from the body
    (Triton's raw binary request), one variable dimension at most."""
    body = np.arange(8, dtype="<f4").tobytes()
    spec = (TensorSpec("x", "FP32", (-1, -1)),)
    decoded = decode_infer_request(body, inputs=spec, outputs=spec, max_rows=4, header_length=0)
    np.testing.assert_array_equal(decoded.inputs["x"], np.arange(8, dtype=np.float32)[None])
    with pytest.raises(InputError, match="do not fill a row of \\[-1\\] FP32"):
        decode_infer_request(body[:6], inputs=spec, outputs=spec, max_rows=4, header_length=0)
    two = (TensorSpec("x", "FP32", (-1, -1, -1)),)
    with pytest.raises(InputError, match=r"^The shape of the raw input 'x' can not be deduced"):
        decode_infer_request(body, inputs=two, outputs=two, max_rows=4, header_length=0)


def _binary_request(datatype: str, change: str) -> tuple[bytes, int]:
    """A one-input binary request (3 columns, 2 rows; 5 under ``too many rows``), changed one
    way (see the test below)."""
    rows = 5 if change == "too many rows" else 2
    wire = protocol.WIRE_DTYPES[datatype]
    values = np.arange(rows * 3).astype(wire)
    if change == "nan" and (values.dtype.kind == "f" or datatype == "BF16"):
        values[4] = np.nan if values.dtype.kind == "f" else 0x7FC0  # BF16's NaN bits
    data = values.tobytes()
    entry: dict[str, Any] = {"name": "x", "datatype": datatype, "shape": [rows, 3],
                             "parameters": {"binary_data_size": len(data)}}  # fmt: skip
    extra: dict[str, Any] = {}
    params = entry["parameters"]
    if change == "id":
        extra["id"] = "r9"
    elif change == "timeout and priority":
        extra["parameters"] = {"timeout": 900, "priority": 1}
    elif change == "bad priority":
        extra["parameters"] = {"priority": "high"}
    elif change == "binary outputs":
        extra["outputs"] = [{"name": "y", "parameters": {"binary_data": True}}]
    elif change == "unknown output":
        extra["outputs"] = [{"name": "z"}]
    elif change == "wrong name":
        entry["name"] = "w"
    elif change == "wrong datatype":
        entry["datatype"] = "INT32" if datatype != "INT32" else "FP32"
    elif change == "short section":
        data = data[:-1]
    elif change == "long section":
        data += b"\0"
    elif change == "size not the shape's":
        params["binary_data_size"] = len(data) - 1
    elif change == "size as a float":
        params["binary_data_size"] = float(len(data))
    elif change == "width":
        entry["shape"] = [2, 4]
    elif change == "no rows":
        entry["shape"], params["binary_data_size"], data = [0, 3], 0, b""
    elif change == "bool in shape":
        entry["shape"] = [True, 3]
    elif change == "three dims":
        entry["shape"] = [2, 3, 1]
    elif change == "data too":
        entry["data"] = [0.0] * 6
    elif change == "another parameter":
        params["note"] = "x"
    elif change == "shared memory too":
        params["shared_memory_region"] = "r"
    return _binary_body([(entry, data)], **extra)


BINARY_CHANGES = ["plain", "too many rows", "nan", "id", "timeout and priority", "bad priority",
                  "binary outputs", "unknown output", "wrong name", "wrong datatype",
                  "short section", "long section", "size not the shape's", "size as a float",
                  "width", "no rows", "bool in shape", "three dims", "data too",
                  "another parameter", "shared memory too"]  # fmt: skip


def _read(body: bytes, header_length: int, inputs: tuple[TensorSpec, ...]) -> object:
    try:
        got = decode_infer_request(
            body, inputs=inputs, outputs=(TensorSpec("y", "FP32", (-1, 3)),), max_rows=4,
            header_length=header_length,
        )  # fmt: skip
    except ServeError as exc:
        return type(exc), str(exc)
    arrays = {name: (a.dtype, a.shape, a.tobytes()) for name, a in got.inputs.items()}
    return (got.id, arrays, got.rows, got.outputs, got.binary_output, got.timeout_us,
            got.priority)  # fmt: skip


@pytest.mark.parametrize("datatype", ["FP32", "FP16", "FP64", "INT64", "UINT8", "BOOL", "BF16"])
@pytest.mark.parametrize("change", BINARY_CHANGES)
def test_the_quick_read_of_a_binary_input_is_the_general_one(
    datatype: str, change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-input model's binary requests are read by a quick path first: whatever it answers
    (a request, or a refusal) is what the general path answers."""
    inputs = (TensorSpec("x", datatype, (-1, 3)),)
    body, header_length = _binary_request(datatype, change)
    quick = _read(body, header_length, inputs)
    monkeypatch.setattr(protocol, "_quick_binary_array", lambda *args: None)
    assert quick == _read(body, header_length, inputs)


def test_the_quick_binary_read_takes_the_common_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode reads the common binary request by the quick path, never the general one."""
    body, header_length = _binary_request("FP32", "binary outputs")

    def general(*args: object) -> None:
        raise AssertionError("the general input decode ran")

    monkeypatch.setattr(protocol, "_decode_input", general)
    x, y = TensorSpec("x", "FP32", (-1, 3)), TensorSpec("y", "FP32", (-1, 3))
    got = decode_infer_request(
        body, inputs=(x,), outputs=(y,), max_rows=4, header_length=header_length
    )
    np.testing.assert_array_equal(got.inputs["x"], np.arange(6, dtype=np.float32).reshape(2, 3))
