"""Hostile gRPC requests found by a red-team pass: data a request carries that the server must
refuse, in Triton's words, rather than quietly leave out."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from torchplace.serve.running import ServerThread

from .conftest import FakeEngine, test_config

grpc = pytest.importorskip("grpc")
from torchplace.serve.proto import grpc_service_pb2 as pb  # noqa: E402

INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread(test_config(), engine=FakeEngine()) as thread:
        yield thread


def _infer(server: ServerThread, request: Any) -> Any:
    """The ModelInfer answer, or the grpc.RpcError raised."""
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        rpc = channel.unary_unary(
            INFER,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        try:
            return rpc(request, timeout=30)
        except grpc.RpcError as exc:
            return exc


def _typed_request() -> Any:
    request = pb.ModelInferRequest(model_name="seed-mlp")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 8])
    tensor.contents.fp32_contents.extend([0.5] * 8)
    return request


def _refused(answer: Any, *words: str) -> None:
    assert isinstance(answer, grpc.RpcError), "the request was answered"
    assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT, answer.details()
    for word in words:
        assert word in answer.details()


def test_typed_contents_in_a_second_field_are_refused_not_ignored(server: ServerThread) -> None:
    """Triton refuses values in a contents field other than the datatype's ('unexpected
    explicit tensor data'); they were dropped and the request answered from fp32_contents."""
    request = _typed_request()
    request.inputs[0].contents.int_contents.extend([7] * 8)
    _refused(_infer(server, request), "unexpected explicit tensor data", "int_contents")
    assert not isinstance(_infer(server, _typed_request()), grpc.RpcError)


@pytest.mark.parametrize("key", ["shared_memory_byte_size", "shared_memory_offset"])
@pytest.mark.parametrize("where", ["input", "output"])
def test_a_shared_memory_size_or_offset_without_a_region_is_refused(
    server: ServerThread, key: str, where: str
) -> None:
    """Triton refuses them ('can not be specified without 'shared_memory_region''): with the
    region's name misspelt, the output came back in the message and the client read its region,
    which nothing had written."""
    request = _typed_request()
    tensor = request.inputs[0] if where == "input" else request.outputs.add(name="output")
    tensor.parameters["shared_memory_regoin"].string_param = "region"  # the misspelling
    tensor.parameters[key].int64_param = 8
    _refused(_infer(server, request), key, "without 'shared_memory_region'", repr(where))


def test_a_region_named_by_a_number_is_refused_as_such(server: ServerThread) -> None:
    """It was told '0 inputs outside shared memory but 1 raw_input_contents'."""
    request = pb.ModelInferRequest(model_name="seed-mlp")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 8])
    tensor.parameters["shared_memory_region"].int64_param = 3
    request.raw_input_contents.append(np.zeros(8, "<f4").tobytes())
    _refused(_infer(server, request), "'shared_memory_region' must be a string_param", "3")


def test_an_output_without_shared_memory_parameters_is_still_answered(server: ServerThread) -> None:
    request = _typed_request()
    request.outputs.add(name="output").parameters["binary_data"].bool_param = True
    answer = _infer(server, request)
    assert not isinstance(answer, grpc.RpcError), answer
    with torch.no_grad():
        want = FakeEngine().module(torch.full((1, 8), 0.5)).numpy()
    got = np.frombuffer(answer.raw_output_contents[0], "<f4").reshape(1, 2)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_registration_past_the_most_regions_is_resource_exhausted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A limit reached, not a malformed request: it was INVALID_ARGUMENT."""
    from multiprocessing import shared_memory

    import torchplace.serve.shm as shm

    monkeypatch.setattr(shm, "MAX_REGIONS", 1)
    block = shared_memory.SharedMemory(create=True, size=64)
    register = "/inference.GRPCInferenceService/SystemSharedMemoryRegister"
    try:
        config = test_config(allow_client_shm=True)
        with (
            ServerThread(config, engine=FakeEngine()) as server,
            grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel,
        ):
            rpc = channel.unary_unary(register, lambda m: m.SerializeToString())

            def request(name: str) -> Any:
                key = f"/{block.name}"
                return pb.SystemSharedMemoryRegisterRequest(name=name, key=key, byte_size=64)

            rpc(request("first"), timeout=30)
            with pytest.raises(grpc.RpcError) as caught:
                rpc(request("second"), timeout=30)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details()
        assert "1 shared memory regions are registered" in caught.value.details()
    finally:
        block.close()
        block.unlink()
