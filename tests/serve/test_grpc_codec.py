"""The gRPC codec: the REST validation rules and messages, typed and raw contents."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("google.protobuf")

from torchplace.errors import InputError, PayloadTooLargeError
from torchplace.models import TensorSpec
from torchplace.serve import grpc_codec
from torchplace.serve.grpc_codec import decode_infer_request, encode_infer_response
from torchplace.serve.proto import grpc_service_pb2 as pb
from torchplace.serve.protocol import _NO_REGIONS, WIRE_DTYPES

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
    response = pb.ModelInferResponse.FromString(
        encode_infer_response(
            model_name="m", model_version="1", request=decoded, results=results, outputs=OUTPUTS
        )
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


def _built(
    model_name: str,
    model_version: str,
    request_id: str | None,
    arrays: dict[str, np.ndarray],
    datatypes: dict[str, str],
    final: bool,
) -> bytes:
    """The same answer made with protobuf's own message API, serialized."""
    response = pb.ModelInferResponse(model_name=model_name, model_version=model_version)
    if request_id is not None:
        response.id = request_id
    if final:
        response.parameters["triton_final_response"].bool_param = True
    for name, array in arrays.items():
        response.outputs.add(name=name, datatype=datatypes[name], shape=array.shape)
        response.raw_output_contents.append(array.astype(WIRE_DTYPES[datatypes[name]]).tobytes())
    return response.SerializeToString()


@pytest.mark.parametrize(
    ("model_name", "version", "request_id", "rows", "width", "final"),
    [
        ("m", "1", None, 1, 2, False),
        ("m", "", "r1", 3, 200, True),  # no version; an id; a length past one varint byte
        ("é" * 70, "12", "x" * 300, 0, 5, False),  # names past 127 bytes; no rows
        ("wide", "1", "", 1000, 512, True),  # an empty id is sent as none; a 2 MB raw entry
    ],
)
def test_answers_are_the_bytes_protobuf_serializes(
    model_name: str, version: str, request_id: str | None, rows: int, width: int, final: bool
) -> None:
    outputs = (TensorSpec("y", "FP32", (-1, width)), TensorSpec("k", "INT64", (-1, 1)))
    results = {
        "y": np.linspace(-1, 1, rows * width, dtype=np.float32).reshape(rows, width),
        "k": np.arange(-rows, 0, dtype=np.int64).reshape(rows, 1),
    }
    decoded = decode_infer_request(
        pb.ModelInferRequest(id=request_id or ""), inputs=(), outputs=outputs, max_rows=10**6
    )
    sent = encode_infer_response(
        model_name=model_name, model_version=version, request=decoded, results=results,
        outputs=outputs, final=final,
    )  # fmt: skip
    datatypes = {"y": "FP32", "k": "INT64"}
    assert sent == _built(model_name, version, decoded.id, results, datatypes, final)
    stream = pb.ModelStreamInferResponse.FromString(grpc_codec.stream_response(sent))
    assert stream.infer_response.SerializeToString() == sent
    assert not stream.error_message


ONE_INPUT = (TensorSpec("x", "FP32", (-1, 3)),)
ONE_OUTPUT = (TensorSpec("y", "FP32", (-1, 3)),)


def _one_input(datatype: str = "FP32", rows: int = 2) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype=datatype, shape=[rows, 3])
    dtype = WIRE_DTYPES[datatype]
    request.raw_input_contents.append(np.arange(rows * 3).astype(dtype).tobytes())
    return request


def _edit(request: pb.ModelInferRequest, change: str) -> None:
    """One way a request can differ from the plainest one (see the test below)."""
    x = request.inputs[0]
    if change == "id":
        request.id = "r7"
    elif change == "long id":
        request.id = "i" * 5000
    elif change == "nan":  # a NaN where the datatype has one (BF16's bits: 0x7fc0)
        values = np.frombuffer(request.raw_input_contents[0], WIRE_DTYPES[x.datatype]).copy()
        if values.dtype.kind == "f" or x.datatype == "BF16":
            values[4] = np.nan if values.dtype.kind == "f" else 0x7FC0
        request.raw_input_contents[0] = values.tobytes()
    elif change == "timeout and priority":
        request.parameters["timeout"].int64_param = 900
        request.parameters["priority"].uint64_param = 1
    elif change == "bad priority":
        request.parameters["priority"].string_param = "high"
    elif change == "triton parameter":
        request.parameters["triton_enable_empty_final_response"].bool_param = True
    elif change == "reserved parameter":
        request.parameters["binary_data_output"].bool_param = True
    elif change == "output":
        request.outputs.add(name="y")
    elif change == "unknown output":
        request.outputs.add(name="z")
    elif change == "output twice":
        request.outputs.add(name="y")
        request.outputs.add(name="y")
    elif change == "wrong name":
        x.name = "w"
    elif change == "wrong datatype":
        x.datatype = "INT32"
    elif change == "short data":
        request.raw_input_contents[0] = request.raw_input_contents[0][:-1]
    elif change == "width":
        x.ClearField("shape")
        x.shape.extend([3, 2])
    elif change == "no rows":
        x.ClearField("shape")
        x.shape.extend([0, 3])
        request.raw_input_contents[0] = b""
    elif change == "three dims":
        x.ClearField("shape")
        x.shape.extend([2, 3, 1])
    elif change == "contents too":
        x.contents.fp32_contents.extend([1.0])
    elif change == "typed":
        request.ClearField("raw_input_contents")
        x.contents.fp32_contents.extend(range(6))
    elif change == "tensor parameter":
        x.parameters["binary_data_size"].int64_param = 24
    elif change == "two raw":
        request.raw_input_contents.append(b"\0" * 4)
    elif change not in ("plain", "too many rows"):
        raise AssertionError(change)


CHANGES = ["plain", "too many rows", "id", "long id", "nan", "timeout and priority", "bad priority",
           "triton parameter", "reserved parameter", "output", "unknown output", "output twice",
           "wrong name", "wrong datatype", "short data", "width", "no rows", "three dims",
           "contents too", "typed", "tensor parameter", "two raw"]  # fmt: skip


def _outcome(read, request: pb.ModelInferRequest, inputs: tuple[TensorSpec, ...]):  # type: ignore[no-untyped-def]
    try:
        decoded = read(request, inputs, ONE_OUTPUT, 4, False, _NO_REGIONS)
    except (InputError, PayloadTooLargeError) as exc:
        return type(exc), str(exc)
    arrays = {name: (a.dtype, a.shape, a.tobytes()) for name, a in decoded.inputs.items()}
    return (decoded.id, arrays, decoded.rows, decoded.outputs, decoded.binary_output,
            decoded.timeout_us, decoded.priority)  # fmt: skip


@pytest.mark.parametrize("datatype", ["FP32", "FP16", "INT64", "UINT8", "BOOL", "BF16"])
@pytest.mark.parametrize("change", CHANGES)
def test_the_quick_read_of_a_one_input_request_is_the_general_one(
    datatype: str, change: str
) -> None:
    """A one-input model's requests are read by a quick path first: whatever it answers (a
    request, or a refusal) is what the general path answers."""
    inputs = (TensorSpec("x", datatype, (-1, 3)),)
    request = _one_input(datatype, rows=5 if change == "too many rows" else 2)
    _edit(request, change)
    general = _outcome(grpc_codec._decode_request, request, inputs)
    both = _outcome(
        lambda r, i, o, m, n, s: decode_infer_request(
            r, inputs=i, outputs=o, max_rows=m, allow_nan=n, regions=s
        ),
        request,
        inputs,
    )
    assert both == general


def test_the_quick_read_takes_the_common_request_and_leaves_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It is a quick path indeed: the decode reads the plain request by it, never by the
    general path, and one it declines is not read by it."""
    plain = _one_input()
    _edit(plain, "triton parameter")
    _edit(plain, "output")

    def general(*args: object) -> None:
        raise AssertionError("the general decode ran")

    with monkeypatch.context() as patched:
        patched.setattr(grpc_codec, "_decode_request", general)
        quick = decode_infer_request(
            plain, inputs=ONE_INPUT, outputs=ONE_OUTPUT, max_rows=4, allow_nan=False
        )
    assert quick.rows == 2
    np.testing.assert_array_equal(quick.inputs["x"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert quick.outputs is not None
    assert [o.name for o in quick.outputs] == ["y"]
    typed = _one_input()
    _edit(typed, "typed")
    assert grpc_codec._quick_request(typed, ONE_INPUT[0], ONE_OUTPUT, 4, False, _NO_REGIONS) is None


def test_one_output_asked_by_name_alone_is_read_as_the_general_path_reads_it() -> None:
    """The common ask (one output, by name, no parameters) is read by a shortcut: it gives what
    the general reading of the same entry gives, and leaves a name not served to it."""
    asked = pb.ModelInferRequest()
    asked.outputs.add(name="y")
    both = pb.ModelInferRequest()
    both.outputs.add(name="y")
    both.outputs.add(name="b")
    alone = grpc_codec._requested(asked.outputs, OUTPUTS, _NO_REGIONS)
    general = grpc_codec._requested(both.outputs, OUTPUTS, _NO_REGIONS)
    assert alone is not None
    assert general is not None
    assert alone == general[:1]
    assert (alone[0].target, alone[0].classes, alone[0].binary) == (None, 0, True)
    unknown = pb.ModelInferRequest()
    unknown.outputs.add(name="z")
    with pytest.raises(InputError, match="'z'"):
        grpc_codec._requested(unknown.outputs, OUTPUTS, _NO_REGIONS)
