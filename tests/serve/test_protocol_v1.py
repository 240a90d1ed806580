"""KServe's V1 protocol: rows in, rows out, checked as the OIP request they stand for."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from torchplace.errors import InputError, PayloadTooLargeError
from torchplace.models import TensorSpec
from torchplace.serve.protocol_v1 import decode_predict_request, encode_predict_response

ONE_IN = (TensorSpec("x", "FP32", (-1, 2, 2)),)
TWO_IN = (TensorSpec("a", "FP32", (-1, 2)), TensorSpec("n", "INT8", (-1,)))
ONE_OUT = (TensorSpec("y", "FP32", (-1, 2)),)
TWO_OUT = (TensorSpec("y", "FP32", (-1, 2)), TensorSpec("b", "BF16", (-1,)))


def _decode(doc: object, inputs: tuple[TensorSpec, ...] = ONE_IN, max_rows: int = 8):  # type: ignore[no-untyped-def]
    return decode_predict_request(
        orjson.dumps(doc), inputs=inputs, outputs=ONE_OUT, max_rows=max_rows
    )


def test_rows_of_one_input_stack_into_its_tensor() -> None:
    rows = [[[1, 2], [3, 4]], [[5, 6], [7, 8.5]]]
    for key in ("instances", "inputs"):
        decoded = _decode({key: rows})
        assert decoded.rows == 2
        assert decoded.inputs["x"].dtype == np.float32
        np.testing.assert_array_equal(decoded.inputs["x"], np.array(rows, np.float32))
    named = _decode({"instances": [{"x": row} for row in rows]})
    np.testing.assert_array_equal(named.inputs["x"], np.array(rows, np.float32))


def test_rows_of_several_inputs_name_them() -> None:
    decoded = _decode({"instances": [{"a": [1, 2], "n": 3}, {"a": [4, 5], "n": -6}]}, TWO_IN)
    np.testing.assert_array_equal(decoded.inputs["a"], [[1, 2], [4, 5]])
    np.testing.assert_array_equal(decoded.inputs["n"], np.array([3, -6], np.int8))
    with pytest.raises(InputError, match="instance 1 has no input 'n'"):
        _decode({"instances": [{"a": [1, 2], "n": 3}, {"a": [4, 5]}]}, TWO_IN)
    with pytest.raises(InputError, match="give each instance as an object naming them"):
        _decode({"instances": [[1, 2]]}, TWO_IN)


def test_the_columnar_form_gives_each_inputs_rows_under_its_name() -> None:
    decoded = _decode({"inputs": {"a": [[1, 2], [4, 5]], "n": [3, -6]}}, TWO_IN)
    assert decoded.rows == 2
    np.testing.assert_array_equal(decoded.inputs["a"], [[1, 2], [4, 5]])
    np.testing.assert_array_equal(decoded.inputs["n"], np.array([3, -6], np.int8))
    with pytest.raises(InputError, match=r"the same number of rows; got \{'a': 2, 'n': 1\}"):
        _decode({"inputs": {"a": [[1, 2], [4, 5]], "n": [3]}}, TWO_IN)
    for columns in ({}, {"a": []}, {"a": 3}):
        with pytest.raises(InputError, match="maps each input name to a non-empty array"):
            _decode({"inputs": columns}, TWO_IN)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"instances": []}, "a non-empty array with one entry per row"),
        ({"rows": [[1]]}, "a non-empty array with one entry per row"),
        ([[1, 2]], "a non-empty array with one entry per row"),
        ({"instances": [[[1, 2], [3]]]}, "must be a flat or regularly nested array"),
        (
            {"instances": [[[1, 2]]]},
            r"unexpected shape for input 'x'. Expected \[-1,2,2\], got \[1,1,2\]",
        ),
        ({"instances": [[["a", "b"], ["c", "d"]]]}, "holds strings"),
        (
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2, 2], "data": [1] * 4}]},
            r"Open Inference Protocol \(v2\) request; send it to /v2/models/\{name\}/infer",
        ),
    ],
)
def test_bad_rows_get_the_oip_messages(doc: object, message: str) -> None:
    with pytest.raises(InputError, match=message):
        _decode(doc)


def test_more_rows_than_the_limit_is_413() -> None:
    with pytest.raises(PayloadTooLargeError):
        _decode({"instances": [[[0, 0], [0, 0]]] * 9})
    # counted before anything is built from them (a body of millions of rows stays cheap)
    with pytest.raises(PayloadTooLargeError, match="10 instances is over the limit of 8"):
        _decode({"instances": [0] * 10})


def test_instances_nested_too_deeply_are_a_400() -> None:
    body = b'{"instances":' + b"[" * 252 + b"0.5" + b"]" * 252 + b"}"  # orjson reads it
    with pytest.raises(InputError, match="nested too deeply"):
        decode_predict_request(body, inputs=ONE_IN, outputs=ONE_OUT, max_rows=8)


@pytest.mark.parametrize("body", [b"{oops", b'{"instances": [[[1, 2], [3, NaN]]]}'])
def test_not_json_is_a_clear_400(body: bytes) -> None:
    with pytest.raises(InputError, match="not valid JSON"):
        decode_predict_request(body, inputs=ONE_IN, outputs=ONE_OUT, max_rows=8)


def test_predictions_are_one_entry_per_row() -> None:
    y = np.array([[0.5, 1.0], [2.0, -3.25]], np.float32)
    assert orjson.loads(encode_predict_response({"y": y}, ONE_OUT)) == {
        "predictions": [[0.5, 1.0], [2.0, -3.25]]
    }
    b = np.array([1.00390625, 3.0], np.float32)  # 1 + 2**-8 rounds to 1.0 in bfloat16
    assert orjson.loads(encode_predict_response({"y": y, "b": b}, TWO_OUT)) == {
        "predictions": [{"y": [0.5, 1.0], "b": 1.0}, {"y": [2.0, -3.25], "b": 3.0}]
    }


def test_both_instances_and_inputs_is_a_400_naming_both() -> None:
    """Both forms at once was answered from 'instances', 'inputs' silently dropped (TF Serving,
    whose V1 form this is, refuses the pair)."""
    with pytest.raises(InputError, match="both 'instances' and 'inputs'; send one of them"):
        _decode({"instances": [[[1, 2], [3, 4]]], "inputs": [[[5, 6], [7, 8]]]})


@pytest.mark.parametrize(
    ("doc", "inputs"),
    [
        ({"instances": [{"a": [1, 2], "n": 3, "nn": 4}]}, TWO_IN),
        ({"instances": [{"x": [[1, 2], [3, 4]], "nn": 4}]}, ONE_IN),
        ({"inputs": {"a": [[1, 2]], "n": [3], "nn": [4]}}, TWO_IN),
    ],
)
def test_a_named_value_the_model_does_not_take_is_a_400(
    doc: object, inputs: tuple[TensorSpec, ...]
) -> None:
    """A misspelled or extra input name was dropped silently, and the rest answered."""
    with pytest.raises(InputError, match=r"input 'nn', which the model does not take; it takes"):
        _decode(doc, inputs)


def test_nan_predictions_name_the_v2_route_not_binary_data() -> None:
    """V1 has no binary_data; the message told a V1 client to ask for it."""
    y = np.array([[np.nan, 1.0]], np.float32)
    with pytest.raises(InputError) as caught:
        encode_predict_response({"y": y}, ONE_OUT, model="m")
    message = str(caught.value)
    assert "output 'y' holds NaN or infinite values" in message
    assert "/v2/models/m/infer" in message
    assert '"binary_data": true' in message


@pytest.mark.parametrize(
    "b", [np.zeros((3,), np.float32), np.float32(0.0) + np.zeros((), np.float32)]
)
def test_outputs_without_a_shared_batch_cannot_be_rows(b: np.ndarray) -> None:
    """Outputs of different lengths lost the longer one's extra rows (or failed with an
    IndexError, a 500) instead of saying V1 rows cannot carry them."""
    y = np.zeros((2, 2), np.float32)
    with pytest.raises(InputError, match=r"outputs do not share a batch dimension .*'y': 2"):
        encode_predict_response({"y": y, "b": b}, TWO_OUT, model="m")


@pytest.mark.parametrize(
    ("doc", "inputs", "message"),
    [
        (
            {"instances": [[[1, 2], [3, 4]], [[1, 2]]]},
            ONE_IN,
            r"instance 1 gives input 'x' in shape \[1, 2\], where instance 0 gives \[2, 2\]; "
            r"give every instance the same shape \(the model takes \[2, 2\] per instance\)",
        ),
        (
            {"instances": [{"a": [1, 2], "n": 1}, {"a": [1, 2, 3], "n": 2}]},
            TWO_IN,
            r"instance 1 gives input 'a' in shape \[3\], where instance 0 gives \[2\]",
        ),
    ],
)
def test_instances_of_uneven_shapes_name_the_one_that_differs(
    doc: object, inputs: tuple[TensorSpec, ...], message: str
) -> None:
    with pytest.raises(InputError, match=message):
        _decode(doc, inputs)
