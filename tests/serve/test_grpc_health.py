"""gRPC's health checking protocol on the gRPC port: Check and Watch, for the server and per
model, with no token asked, NOT_SERVING once the server drains."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchplace.serve.running import ServerThread

from .conftest import test_config

grpc = pytest.importorskip("grpc")
from torchplace.serve.proto import health_pb2 as health  # noqa: E402

Status = health.HealthCheckResponse


def _check(port: int, service: str) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health.HealthCheckRequest.SerializeToString,
            response_deserializer=Status.FromString,
        )
        status: int = call(health.HealthCheckRequest(service=service), timeout=10).status
        return status


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    token = tmp_path_factory.mktemp("auth") / "token"
    token.write_text("s3cret\n")
    thread = ServerThread(test_config(device="cpu", auth_token_file=Path(token))).start(120)
    try:
        yield thread
    finally:
        thread.stop()


@pytest.mark.parametrize("service", ["", "inference.GRPCInferenceService", "seed-mlp"])
def test_check_says_serving_without_a_token(server: ServerThread, service: str) -> None:
    assert _check(server.grpc_port, service) == Status.SERVING


def test_an_unknown_service_is_not_found_and_garbage_invalid(server: ServerThread) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _check(server.grpc_port, "resnet50")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown service 'resnet50'" in caught.value.details()
    address = f"127.0.0.1:{server.grpc_port}"
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary("/grpc.health.v1.Health/Check")(b"\xff\xff", timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_watch_follows_the_drain_and_then_ends() -> None:
    thread = ServerThread(test_config(device="cpu", drain_grace_s=1.0)).start(timeout=120)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{thread.grpc_port}") as channel:
            watch = channel.unary_stream(
                "/grpc.health.v1.Health/Watch",
                request_serializer=health.HealthCheckRequest.SerializeToString,
                response_deserializer=Status.FromString,
            )
            model = watch(health.HealthCheckRequest(service="seed-mlp"), timeout=30)
            unknown = watch(health.HealthCheckRequest(service="nope"), timeout=30)
            assert next(model).status == Status.SERVING
            assert next(unknown).status == Status.SERVICE_UNKNOWN
            stopper = threading.Thread(target=thread.stop)
            stopper.start()
            assert next(model).status == Status.NOT_SERVING
            assert list(model) == []  # the stream ended, so the drain need not wait for it
            stopper.join(30)
            assert not stopper.is_alive()
    finally:
        thread.stop()
