"""Differential fuzzing of the gRPC codec against the REST one.

One request, drawn at random (inputs of every datatype, values each datatype holds exactly, an
id, the schedule parameters, the outputs asked for), is written four ways: REST JSON ``data``,
REST binary tensor data, a ``ModelInferRequest`` with ``raw_input_contents`` and one with the
typed ``contents`` fields (where the datatype has one). Decoded, the four must be alike: the same
arrays (dtype, shape, every bit), id, rows, outputs and parameters. With one fault put in (a
wrong datatype, shape, name or parameter, too many rows, an input missing or given twice, an
output unknown, twice, or ranked that cannot be), they must be refused alike: the same error
type, status and message, as the gRPC codec promises (the REST rules, in the same words).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

pytest.importorskip("google.protobuf")

from tests.serve.fuzzing import FUZZ, array_bits, exact_values
from torchplace.errors import ServeError
from torchplace.models import TensorSpec
from torchplace.serve import grpc_codec, protocol
from torchplace.serve.proto import grpc_service_pb2 as pb
from torchplace.serve.protocol import WIRE_DTYPES

DATATYPES = tuple(sorted(WIRE_DTYPES))
OUTPUTS = (TensorSpec("y", "FP32", (-1, 2)), TensorSpec("b", "BOOL", (-1,)))
MAX_ROWS = 4
#: the typed contents field of each datatype (FP16 and BF16 have none)
TYPED = grpc_codec._CONTENTS


@dataclass
class _Tensor:
    name: str
    datatype: str
    shape: list[int]
    values: list[Any]
    #: the datatype the values are of, and are written as (``datatype`` may be a wrong one)
    wire: str = ""

    def __post_init__(self) -> None:
        self.wire = self.wire or self.datatype


@dataclass
class _Case:
    """One request, as the client means it (each writer below puts it on a wire)."""

    specs: tuple[TensorSpec, ...]
    tensors: list[_Tensor]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: list[tuple[str, int]] = field(default_factory=list)  # (name, classification)


_FAULTS = (
    "none",
    "datatype",
    "shape",
    "rows",
    "unknown input",
    "missing input",
    "input twice",
    "long id",
    "timeout",
    "priority",
    "reserved",
    "unknown output",
    "output twice",
    "classes of BOOL",
)


@st.composite
def _case(draw: st.DrawFn) -> tuple[_Case, str]:
    count = draw(st.integers(1, 3))
    specs = tuple(
        TensorSpec(name, draw(st.sampled_from(DATATYPES)), (-1, draw(st.integers(1, 3))))
        for name in ("x", "w", "v")[:count]
    )
    rows = draw(st.integers(1, MAX_ROWS))
    tensors = []
    for spec in specs:
        shape = [rows, spec.shape[1]]
        size = rows * spec.shape[1]
        values = draw(st.lists(exact_values(spec.datatype), min_size=size, max_size=size))
        tensors.append(_Tensor(spec.name, spec.datatype, shape, values))
    case = _Case(specs, draw(st.permutations(tensors)))
    if draw(st.booleans()):
        case.id = draw(st.text(min_size=1, max_size=12))
    if draw(st.booleans()):
        case.parameters["timeout"] = draw(st.integers(0, 2**63 - 1))
    if draw(st.booleans()):
        case.parameters["priority"] = draw(st.integers(0, 2**64 - 1))
    if draw(st.booleans()):
        case.outputs = [
            (n, draw(st.sampled_from([0, 1, 2])) if n == "y" else 0)
            for n in draw(st.permutations(["y", "b"]))[: draw(st.integers(1, 2))]
        ]
    fault = draw(st.sampled_from(_FAULTS))
    first = case.tensors[0]
    if fault == "datatype":
        first.datatype = draw(st.sampled_from([d for d in DATATYPES if d != first.datatype]))
    elif fault == "shape":
        first.shape = [rows, first.shape[1], 1]
    elif fault == "rows":
        extra = (MAX_ROWS + 1 - rows) * first.shape[1]
        for tensor in case.tensors:
            more = draw(
                st.lists(exact_values(tensor.datatype), min_size=extra, max_size=extra)
                if tensor is first
                else st.just([])
            )
            tensor.values += more
        for tensor in case.tensors:  # every input past the limit, so that rows still agree
            width = tensor.shape[1]
            pad = (MAX_ROWS + 1) * width - len(tensor.values)
            tensor.values += [tensor.values[0]] * pad
            tensor.shape = [MAX_ROWS + 1, width]
    elif fault == "unknown input":
        first.name = draw(st.sampled_from(["q", "X", ""]))
    elif fault == "missing input":
        case.tensors.pop(draw(st.integers(0, len(case.tensors) - 1)))
    elif fault == "input twice":
        case.tensors.append(_Tensor(first.name, first.datatype, first.shape, first.values))
    elif fault == "long id":
        case.id = "i" * 4097
    elif fault == "timeout":
        case.parameters["timeout"] = draw(st.sampled_from([-1, 2**63, True, "5", 1.5]))
    elif fault == "priority":
        case.parameters["priority"] = draw(st.sampled_from([-3, 2**64 - 1, False, "high"]))
    elif fault == "reserved":
        case.parameters["triton_x"] = 1
    elif fault == "unknown output":
        case.outputs.append(("nope", 0))
    elif fault == "output twice":
        case.outputs += [("y", 0), ("y", 0)]
    elif fault == "classes of BOOL":
        case.outputs = [("b", 2)]
    return case, fault


# ------------------------------------------------------------------------------ the writers
def _raw(tensor: _Tensor) -> bytes:
    if tensor.wire == "BF16":
        bits = np.array(tensor.values, np.float32).view(np.uint32) >> 16
        return bits.astype("<u2").tobytes()
    return np.array(tensor.values, dtype=WIRE_DTYPES[tensor.wire]).tobytes()


def _rest(case: _Case, binary: bool) -> tuple[bytes, int | None]:
    entries, chunks = [], []
    for tensor in case.tensors:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": tensor.shape,
        }
        if binary:
            raw = _raw(tensor)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = tensor.values
        entries.append(entry)
    doc: dict[str, Any] = {"inputs": entries}
    if case.id:
        doc["id"] = case.id
    if case.parameters:
        doc["parameters"] = case.parameters
    if case.outputs:
        doc["outputs"] = [
            {"name": n, **({"parameters": {"classification": c}} if c else {})}
            for n, c in case.outputs
        ]
    header = orjson.dumps(doc)
    if not binary:
        return header, None
    return header + b"".join(chunks), len(header)


def _parameter(target: Any, value: Any) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        if value < 0 or value < 2**63:
            target.int64_param = value
        else:
            target.uint64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = value


def _grpc(case: _Case, typed: bool) -> Any:
    request = pb.ModelInferRequest(model_name="m", id=case.id)
    for tensor in case.tensors:
        entry = request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        if typed:
            getattr(entry.contents, TYPED[tensor.wire]).extend(tensor.values)
        else:
            request.raw_input_contents.append(_raw(tensor))
    for key, value in case.parameters.items():
        _parameter(request.parameters[key], value)
    for name, classes in case.outputs:
        output = request.outputs.add(name=name)
        if classes:
            output.parameters["classification"].int64_param = classes
    return request


# ------------------------------------------------------------------------------ the answers
def _outcome(decode: Any) -> tuple[Any, ...]:
    try:
        request = decode()
    except ServeError as exc:
        return ("error", type(exc).__name__, exc.status, str(exc))
    arrays = array_bits(request.inputs)
    # which outputs and how many classes (binary or not is each protocol's own default)
    outputs = None if request.outputs is None else [(o.name, o.classes) for o in request.outputs]
    return ("ok", request.id, arrays, request.rows, outputs, request.timeout_us, request.priority)


def _answers(case: _Case) -> dict[str, tuple[Any, ...]]:
    common: dict[str, Any] = {
        "inputs": case.specs,
        "outputs": OUTPUTS,
        "max_rows": MAX_ROWS,
        "model": "m",
    }
    found = {}
    for way, binary in (("REST JSON", False), ("REST binary", True)):
        body, header_length = _rest(case, binary)
        found[way] = _outcome(
            lambda body=body, header_length=header_length: protocol.decode_infer_request(
                body, header_length=header_length, **common
            )
        )
    ways = [("gRPC raw", False)]
    if all(t.wire in TYPED for t in case.tensors):
        ways.append(("gRPC typed", True))
    for way, typed in ways:
        message = pb.ModelInferRequest.FromString(_grpc(case, typed).SerializeToString())
        found[way] = _outcome(
            lambda message=message: grpc_codec.decode_infer_request(message, **common)
        )
    return found


@FUZZ
@given(_case())
def test_rest_and_grpc_decode_one_request_alike(drawn: tuple[_Case, str]) -> None:
    case, fault = drawn
    answers = _answers(case)
    first = answers["REST JSON"]
    event(f"{fault}: {first[0]} in {len(answers)} ways")
    for way, answer in answers.items():
        assert answer == first, (fault, way, answer, first)
    if fault == "none":
        assert first[0] == "ok", first
    elif fault not in ("priority", "timeout"):  # some of their values are valid
        assert first[0] == "error", (fault, first)
