"""Round 19 of hostile clients: a string among numbers, a shape of a hundred thousand
dimensions, nested rows counted before they are read, duplicate JSON keys, a Content-Length of
thousands of leading zeros, and Accept-Encoding weights."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.errors import InputError, PayloadTooLargeError
from torchplace.models import TensorSpec
from torchplace.serve import protocol_v1
from torchplace.serve.protocol import decode_infer_request
from torchplace.serve.protocol_v1 import decode_predict_request

from .conftest import Running, answer_of, raw_request, seed_body, seed_input

_SEED_IN = (TensorSpec("input", "FP32", (-1, 8)),)
_SEED_OUT = (TensorSpec("output", "FP32", (-1, 2)),)


def _v2(entry: dict[str, Any]) -> bytes:
    return orjson.dumps({"inputs": [entry]})


def _decode(body: bytes, inputs: tuple[TensorSpec, ...] = _SEED_IN) -> Any:
    return decode_infer_request(body, inputs=inputs, outputs=_SEED_OUT, max_rows=4096)


def _predict(body: bytes) -> Any:
    return decode_predict_request(
        body, inputs=_SEED_IN, outputs=_SEED_OUT, max_rows=4096, model="seed-mlp"
    )


def _peak_bytes(call: Callable[[], object]) -> int:
    """The most memory (numpy's arrays included) allocated at once while ``call`` ran."""
    tracemalloc.start()
    try:
        with pytest.raises(InputError):
            call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# -- 1. a string among numbers --------------------------------------------------------------------
_LONG = "x" * 4000
#: 511 zeros and one string of 4,000 characters: numpy made it 512 x 4,000 x 4 bytes (8 MB)
_STRING_DATA: list[Any] = [0] * 511 + [_LONG]


def test_a_string_among_numbers_is_refused_before_numpy_makes_it_text() -> None:
    body = _v2(seed_input(shape=[64, 8], data=_STRING_DATA))
    with pytest.raises(InputError, match="'input': 'data' holds strings, not FP32 values"):
        _decode(body)
    assert _peak_bytes(lambda: _decode(body)) < 1 << 20  # was 8 MB


def test_a_string_among_booleans_is_refused_before_numpy_makes_it_text() -> None:
    flags = (TensorSpec("flags", "BOOL", (-1, 8)),)
    data = [True] * 511 + [_LONG]
    body = _v2({"name": "flags", "datatype": "BOOL", "shape": [64, 8], "data": data})
    with pytest.raises(InputError, match="'flags': 'data' holds strings, not BOOL values"):
        _decode(body, flags)
    assert _peak_bytes(lambda: _decode(body, flags)) < 1 << 20  # was 8 MB


def test_a_string_in_a_v1_row_is_refused_before_numpy_makes_it_text() -> None:
    rows = [[0] * 8] * 63 + [[0] * 7 + [_LONG]]
    body = orjson.dumps({"instances": rows})
    with pytest.raises(InputError, match="'data' holds strings, not FP32 values"):
        _predict(body)
    assert _peak_bytes(lambda: _predict(body)) < 1 << 20  # was 8 MB


def test_a_string_among_numbers_is_a_400_over_http(server: Running) -> None:
    for path, body in (
        ("/v2/models/seed-mlp/infer", _v2(seed_input(shape=[64, 8], data=_STRING_DATA))),
        ("/v1/models/seed-mlp:predict", orjson.dumps({"instances": [[0] * 7 + [_LONG]]})),
    ):
        status, _, answer = server.client.post(path, body)
        assert status == 400, answer[:300]
        assert b"'data' holds strings, not FP32 values" in answer


def test_json_data_that_does_not_fit_in_memory_is_a_413_naming_the_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """numpy's MemoryError was a 500 'internal server error'; it is the request's size."""
    original = np.array

    def out_of_memory(obj: object, *args: Any, **kwargs: Any) -> Any:
        if isinstance(obj, list):
            raise MemoryError("Unable to allocate 122. GiB")
        return original(obj, *args, **kwargs)

    monkeypatch.setattr(np, "array", out_of_memory)
    ids = (TensorSpec("ids", "INT64", (-1, 4)),)
    body = _v2({"name": "ids", "datatype": "INT64", "shape": [2, 4], "data": list(range(8))})
    with pytest.raises(PayloadTooLargeError) as caught:
        _decode(body, ids)
    assert caught.value.status == 413
    assert "input 'ids'" in str(caught.value)


# -- 2. a shape of many dimensions ----------------------------------------------------------------
def test_a_shape_of_many_dimensions_is_refused_by_rank_before_its_dimensions_are_read() -> None:
    """Its 100,001 dimensions were each type-checked before the rank was compared: the last
    one, not a number, named instead of the rank (gRPC compares the rank first)."""
    body = _v2(seed_input(shape=[1] * 100_000 + ["x"], data=[0.5]))
    with pytest.raises(InputError) as caught:
        _decode(body)
    message = str(caught.value)
    assert message.startswith("unexpected shape for input 'input'. Expected [-1,8], got [1,1,")
    assert "100001 dimensions, where it has 2" in message
    assert len(message) < 400  # the shape is cut, not echoed


# -- 3. nested rows counted before they are read --------------------------------------------------
@pytest.fixture
def numpy_reads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """What ``np.array`` is given while the test runs."""
    seen: list[object] = []
    original = np.array

    def recording(obj: object, *args: Any, **kwargs: Any) -> Any:
        seen.append(obj)
        return original(obj, *args, **kwargs)

    monkeypatch.setattr(np, "array", recording)
    return seen


def test_nested_rows_of_the_wrong_width_are_counted_before_numpy_reads_them(
    numpy_reads: list[object],
) -> None:
    # 64 rows of 700 values where the shape takes 64 of 8: the top level alone fits the count
    body = _v2(seed_input(shape=[64, 8], data=[[0.5] * 700] * 64))
    with pytest.raises(InputError) as caught:
        _decode(body)
    assert str(caught.value).startswith(
        "Unable to parse 'data': Shape does not match true shape of 'data' field: input "
        "'input': shape [64, 8] needs 512 values but 'data' holds 44800"
    )
    assert numpy_reads == []


def test_ragged_rows_are_refused_before_numpy_reads_them(numpy_reads: list[object]) -> None:
    # the first row fits, the second is 5,000 values long
    body = _v2(seed_input(shape=[2, 8], data=[[0.5] * 8, [0.5] * 5000]))
    with pytest.raises(InputError, match="must be a flat or regularly nested array"):
        _decode(body)
    assert numpy_reads == []


def test_nested_rows_that_fit_are_read_as_before(numpy_reads: list[object]) -> None:
    x = np.arange(24, dtype=np.float32).reshape(3, 8)
    request = _decode(_v2(seed_input(shape=[3, 8], data=x.tolist())))
    np.testing.assert_array_equal(request.inputs["input"], x)
    ints = (TensorSpec("ids", "INT64", (-1, 2, 2)),)
    rows = [[[1, 2], [3, 4]], [[5, 6], [7, 2**40]]]
    request = _decode(
        _v2({"name": "ids", "datatype": "INT64", "shape": [2, 2, 2], "data": rows}), ints
    )
    assert request.inputs["ids"].tolist() == rows
    for wrong, words in (
        ([[[1, 2], [3, True]], [[5, 6], [7, 8]]], "mixes booleans with numbers"),
        ([[[1, 2], [3, 4.5]], [[5, 6], [7, 8]]], "holds non-integer numbers"),
        ([[[1, 2], [3, [4]]], [[5, 6], [7, 8]]], "regularly nested"),
        ([[[1, 2], [3, 4]], [[5, 6], 7]], "regularly nested"),
    ):
        body = _v2({"name": "ids", "datatype": "INT64", "shape": [2, 2, 2], "data": wrong})
        with pytest.raises(InputError, match=words):
            _decode(body, ints)


def test_v1_rows_of_the_wrong_shape_are_refused_before_they_are_encoded_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rows were written out as an OIP document and parsed again before the shape that
    their first values already told was compared with the model's."""
    reencoded: list[bytes] = []
    original = protocol_v1.decode_infer_request

    def recording(body: bytes, **kwargs: Any) -> Any:
        reencoded.append(body)
        return original(body, **kwargs)

    monkeypatch.setattr(protocol_v1, "decode_infer_request", recording)
    body = orjson.dumps({"instances": [[0.5] * 700] * 64})
    with pytest.raises(InputError) as caught:
        _predict(body)
    assert str(caught.value).startswith(
        "unexpected shape for input 'input' for model 'seed-mlp'. Expected [-1,8], got [64,700]"
    )
    assert reencoded == []
    _predict(orjson.dumps({"instances": [[0.5] * 8] * 2}))  # a fitting one still goes through
    assert len(reencoded) == 1


# -- 4. duplicate keys ----------------------------------------------------------------------------
def test_a_duplicate_key_is_read_from_its_last_occurrence_as_documented(server: Running) -> None:
    """docs/serve.md: orjson keeps the last occurrence; telling duplicates apart would cost
    every request a second parse."""
    x = np.full((1, 8), 0.25, np.float32)
    first = seed_input(data=[1.0] * 8)
    last = seed_input(data=x.ravel().tolist())
    body = b'{"inputs":[%s],"inputs":[%s]}' % (orjson.dumps(first), orjson.dumps(last))
    status, _, answer = server.client.post("/v2/models/seed-mlp/infer", body)
    assert status == 200, answer
    _, _, alone = server.client.post("/v2/models/seed-mlp/infer", seed_body(x))
    assert orjson.loads(answer)["outputs"] == orjson.loads(alone)["outputs"]


# -- 5. a Content-Length of many leading zeros ----------------------------------------------------
def _zeros_length(zeros: int, length: bytes, body: bytes) -> bytes:
    return raw_request(body, headers={b"Content-Length": b"0" * zeros + length})


@pytest.mark.parametrize("zeros", [4290, 4310, 20_000])
def test_a_content_length_of_thousands_of_leading_zeros_is_read_as_its_value(
    server: Running, zeros: int
) -> None:
    """RFC 9110 8.6: Content-Length is 1*DIGIT; past 4,300 digits int() raised inside the
    parser's callback (Python's integer-string conversion limit): 400 'User callback error'."""
    body = seed_body(np.ones((1, 8), np.float32))
    status, answer = answer_of(server.port, _zeros_length(zeros, b"%d" % len(body), body))
    assert status == 200, answer[:300]
    assert b'"outputs"' in answer


def test_a_content_length_of_leading_zeros_over_the_limit_is_a_413(server: Running) -> None:
    status, answer = answer_of(server.port, _zeros_length(5000, b"99999999999", b""))
    assert status == 413, answer[:300]
    assert b"request JSON size of 99999999999 bytes exceeds the maximum allowed" in answer


def test_an_upgrade_request_s_content_length_of_leading_zeros_is_read_too(
    server: Running,
) -> None:
    body = seed_body(np.ones((1, 8), np.float32))
    request = raw_request(
        body,
        headers={
            b"Upgrade": b"websocket",
            b"Connection": b"Upgrade, close",
            b"Content-Length": b"0" * 5000 + b"%d" % len(body),
        },
    )
    status, answer = answer_of(server.port, request)
    assert status == 200, answer[:300]


# -- 6. Accept-Encoding weights -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("accepted", "coding"),
    [
        ("deflate;q=0.5, gzip;q=0.1", "deflate"),
        ("identity, gzip;q=0.5", None),
        ("identity;q=1, deflate;q=0.2, gzip;q=0.1", None),
        ("gzip;q=abc", None),  # a weight that does not parse: the entry is skipped
        ("gzip;q=abc, deflate", "deflate"),
        ("gzip;q=1.5", None),  # past 1: not a qvalue
        ("gzip, deflate", "gzip"),
        ("deflate, gzip", "gzip"),  # a tie: gzip first, as before
        ("gzip", "gzip"),
        ("GZIP ; Q=0.8", "gzip"),
        ("*", "gzip"),
        ("gzip;q=0, *", "deflate"),
        ("*;q=0.5, gzip;q=0.2", "deflate"),  # deflate by '*' above gzip; a tie with identity
        ("identity;q=0", None),  # nothing else allowed: the answer as it is
        ("br", None),
    ],
)
def test_accept_encoding_weights_choose_the_coding(
    server: Running, accepted: str, coding: str | None
) -> None:
    """RFC 9110 12.4.2 and 12.5.3, as Triton's CompressionTypeUsed reads them: the highest
    weight among gzip, deflate and identity wins; an entry whose weight does not parse is
    skipped. Every q > 0 used to count as 'allowed', gzip first."""
    body = seed_body(np.ones((1, 8), np.float32))
    status, headers, _ = server.client.post(
        "/v2/models/seed-mlp/infer", body, headers={"Accept-Encoding": accepted}
    )
    assert status == 200
    assert headers.get("content-encoding") == coding
    assert headers.get("vary") == "accept-encoding"


def test_the_usual_accept_encoding_values_are_read_once(server: Running) -> None:
    from torchplace.serve import app as app_module

    app_module._chosen_coding.cache_clear()
    body = seed_body(np.ones((1, 8), np.float32))
    for _ in range(3):
        server.client.post(
            "/v2/models/seed-mlp/infer", body, headers={"Accept-Encoding": "gzip, deflate"}
        )
    info = app_module._chosen_coding.cache_info()
    assert (info.misses, info.hits) == (1, 2)
