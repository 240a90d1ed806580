"""The gRPC codec: the REST validation rules and messages, typed and raw contents."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("google.protobuf")

from torchplace.errors import InputError, PayloadTooLargeError
from torchplace.models import TensorSpec
from torchplace.serve.grpc_codec import decode_infer_request, encode_infer_response
from torchplace.serve.proto import grpc_service_pb2 as pb

INPUTS = (TensorSpec("x", "FP32", (-1, 2)), TensorSpec("n", "INT8", (-1, 2)))
OUTPUTS = (TensorSpec("y", "FP32", (-1, 2)), TensorSpec("b", "BF16", (-1, 1)))


def _request(typed: bool = True) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", id="r1")
    x = request.inputs.add(name="x", datatype="FP32", shape=[2, 2])
    n = request.inputs.add(name="n", datatype="INT8", shape=[2, 2])
    if typed:
        x.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
        n.contents.int_contents.extend([-128, 0, 5, 127])
    else:
        request.raw_input_contents.append(np.arange(4, dtype="<f4").tobytes())
        request.raw_input_contents.append(np.array([-128, 0, 5, 127], "i1").tobytes())
    return request


def _decode(request: pb.ModelInferRequest, max_rows: int = 64):  # type: ignore[no-untyped-def]
    return decode_infer_request(request, inputs=INPUTS, outputs=OUTPUTS, max_rows=max_rows)


@pytest.mark.parametrize("typed", [True, False], ids=["typed", "raw"])
def test_typed_and_raw_contents_decode_to_the_same_arrays(typed: bool) -> None:
    decoded = _decode(_request(typed))
    assert decoded.id == "r1"
    assert decoded.rows == 2
    assert decoded.inputs["n"].dtype == np.int8
    np.testing.assert_array_equal(decoded.inputs["n"], [[-128, 0], [5, 127]])
    want = [[1.0, 2.0], [3.0, 4.0]] if typed else [[0.0, 1.0], [2.0, 3.0]]
    np.testing.assert_array_equal(decoded.inputs["x"], np.array(want, np.float32))


def test_parameters_timeout_and_priority() -> None:
    request = _request()
    request.parameters["timeout"].int64_param = 1500
    request.parameters["priority"].uint64_param = 2
    decoded = _decode(request)
    assert (decoded.timeout_us, decoded.priority) == (1500, 2)
    request.parameters["priority"].string_param = "high"
    with pytest.raises(InputError, match="parameter 'priority' must be a non-negative integer"):
        _decode(request)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.inputs[1].contents.int_contents.__setitem__(0, 300),
         "value 300 is out of range for INT8"),
        (lambda r: r.inputs[0].contents.fp32_contents.append(5.0),
         r"shape \[2, 2\] needs 4 values but fp32_contents holds 5"),
        (lambda r: setattr(r.inputs[0], "datatype", "FP64"),
         "inference input 'x' data-type is 'FP64', but the model expects 'FP32'"),
        (lambda r: r.inputs[0].contents.fp32_contents.__setitem__(0, float("nan")),
         "NaN or infinite values are not allowed"),
        (lambda r: r.inputs.add(name="z", datatype="FP32", shape=[2, 2]), "unexpected inference input 'z'"),
        (lambda r: r.outputs.add(name="q"), "unexpected inference output 'q'"),
        (lambda r: r.raw_input_contents.append(b"1234"),
         "has 2 inputs but 1 raw_input_contents"),
        (lambda r: r.raw_input_contents.extend([b"\0" * 16, b"\0" * 4]),
         "input 'x' has both contents and raw_input_contents; send one"),
        (lambda r: r.inputs[0].contents.ClearField("fp32_contents")
         or r.inputs[0].contents.int_contents.extend([1, 2, 3, 4]),
         r"fp32_contents holds 0 \(FP32 goes in fp32_contents, not int_contents\)"),
    ],
)  # fmt: skip
def test_bad_requests_get_the_rest_messages(edit, message: str) -> None:  # type: ignore[no-untyped-def]
    request = _request()
    edit(request)
    with pytest.raises(InputError, match=message):
        _decode(request)


def test_a_raw_tensor_of_the_wrong_size_is_told_in_triton_s_words_with_the_model() -> None:
    request = _request(typed=False)
    request.raw_input_contents[0] = b"\0" * 12
    with pytest.raises(InputError) as info:
        decode_infer_request(request, inputs=INPUTS, outputs=OUTPUTS, max_rows=8, model="m")
    assert str(info.value).startswith(
        "input byte size mismatch for input 'x' for model 'm'. Expected 16, got 12: "
    )


def test_too_many_rows_is_payload_too_large() -> None:
    with pytest.raises(PayloadTooLargeError, match="--max-request-rows"):
        _decode(_request(), max_rows=1)


def test_outputs_are_raw_little_endian_bf16_rounded() -> None:
    decoded = _decode(_request())
    results = {
        "y": np.array([[1.5, 2.5], [3.5, 4.5]], np.float32),
        "b": np.array([[1.0], [1.00390625 + 1e-4]], np.float32),
    }
    response = encode_infer_response(
        model_name="m", model_version="1", request=decoded, results=results, outputs=OUTPUTS
    )
    assert (response.model_name, response.model_version, response.id) == ("m", "1", "r1")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("y", "FP32", [2, 2]),
        ("b", "BF16", [2, 1]),
    ]
    y = np.frombuffer(response.raw_output_contents[0], "<f4").reshape(2, 2)
    np.testing.assert_array_equal(y, results["y"])
    bits = np.frombuffer(response.raw_output_contents[1], "<u2")
    assert list(bits) == [0x3F80, 0x3F81]  # 1.0, and the next bfloat16 up
