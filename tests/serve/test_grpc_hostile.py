"""Hostile or careless gRPC clients, and model control over both protocols: every call gets
its own status, and the server keeps serving without holding on to what the calls left."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.serve.running import ServerThread

from .conftest import FakeEngine, test_config
from .repository_helpers import explicit_repository

grpc = pytest.importorskip("grpc")
from torchplace.serve.grpc_codec import MAX_DETAILS_BYTES, status_details  # noqa: E402
from torchplace.serve.proto import grpc_service_pb2 as pb  # noqa: E402
from torchplace.serve.proto import health_pb2  # noqa: E402

SERVICE = "/inference.GRPCInferenceService/"


def _call(port: int, method: str, request: Any, answer: Any, timeout: float = 30.0) -> Any:
    """One unary RPC on a fresh channel; the answer, or the grpc.RpcError raised."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        path = method if method.startswith("/") else SERVICE + method
        rpc = channel.unary_unary(
            path,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=answer.FromString,
        )
        try:
            return rpc(request, timeout=timeout)
        except grpc.RpcError as exc:
            return exc


def _infer_request(model: str) -> Any:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="input", datatype="FP32", shape=[1, 8])
    request.raw_input_contents.append(np.full((1, 8), 0.5, np.float32).tobytes())
    return request


def _serves(port: int, model: str) -> None:
    answer = _call(port, "ModelInfer", _infer_request(model), pb.ModelInferResponse)
    assert not isinstance(answer, grpc.RpcError), answer
    assert answer.outputs[0].shape == [1, 2]


def _load(port: int, name: str, config: str | None = None, timeout: float = 60.0) -> Any:
    request = pb.RepositoryModelLoadRequest(model_name=name)
    if config is not None:
        request.parameters["config"].string_param = config
    return _call(port, "RepositoryModelLoad", request, pb.RepositoryModelLoadResponse, timeout)


def _rest(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# -- status details --------------------------------------------------------------------------
def test_status_details_are_cut_to_fit_the_trailer() -> None:
    assert status_details("short") == "short"
    for text in ("x" * 50_000, "\xff" * 10_000, "%" * 9_000, "\U0001f600" * 3_000):
        cut = status_details(text)
        assert cut.startswith(text[:10])
        assert cut.endswith("more characters)")
        encoded = sum(
            1 if " " <= c <= "~" and c != "%" else 3 * len(c.encode()) for c in cut
        )  # the trailer's percent-encoding
        assert encoded <= MAX_DETAILS_BYTES


@pytest.fixture(scope="module")
def fake_server() -> Iterator[ServerThread]:
    with ServerThread(test_config(), engine=FakeEngine()) as thread:
        yield thread


@pytest.mark.parametrize(
    ("method", "request_", "answer", "code"),
    [
        ("ModelMetadata", pb.ModelMetadataRequest(name="m" * 20_000),
         pb.ModelMetadataResponse, "NOT_FOUND"),
        ("ModelConfig", pb.ModelConfigRequest(name="seed-mlp", version="9" * 20_000),
         pb.ModelConfigResponse, "NOT_FOUND"),
        ("ModelStatistics", pb.ModelStatisticsRequest(name="\xff" * 10_000),
         pb.ModelStatisticsResponse, "NOT_FOUND"),
        ("/grpc.health.v1.Health/Check", health_pb2.HealthCheckRequest(service="s" * 20_000),
         health_pb2.HealthCheckResponse, "NOT_FOUND"),
    ],
    ids=["metadata", "config-version", "statistics-latin1", "health"],
)  # fmt: skip
def test_a_long_name_in_a_request_keeps_the_call_s_status(
    fake_server: ServerThread, method: str, request_: Any, answer: Any, code: str
) -> None:
    """The message quotes the name: uncut, the trailer is over the client's limit and the
    client reports RESOURCE_EXHAUSTED ('received metadata size exceeds hard limit')."""
    assert fake_server.grpc_port is not None
    failed = _call(fake_server.grpc_port, method, request_, answer)
    assert isinstance(failed, grpc.RpcError)
    assert failed.code().name == code, failed.details()
    assert failed.details().endswith("more characters)")
    _serves(fake_server.grpc_port, "seed-mlp")


def test_a_long_datatype_keeps_invalid_argument(fake_server: ServerThread) -> None:
    assert fake_server.grpc_port is not None
    request = _infer_request("seed-mlp")
    request.inputs[0].datatype = "\xff" * 10_000
    failed = _call(fake_server.grpc_port, "ModelInfer", request, pb.ModelInferResponse)
    assert isinstance(failed, grpc.RpcError)
    assert failed.code().name == "INVALID_ARGUMENT"
    assert failed.details().startswith("inference input 'input' data-type is")


# -- model control -----------------------------------------------------------------------------
@pytest.fixture
def repository_server(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(explicit_repository(tmp_path)) as thread:
        yield thread


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ("[" * 100_000, "nested too deeply"),
        ('{"a":' * 50_000 + "1" + "}" * 50_000, "nested too deeply"),
        ('{"max_batch_size": "1' + "0" * 5_000 + '"}', "max_batch_size must be an integer"),
        ('{"max_batch_size": 99999999999999999999}', "in the 64-bit range"),
        ('{"max_batch_size": "--5"}', "max_batch_size must be an integer"),
        ('{"instance_group": [{"count": 65}]}', "at most 64 replicas per device"),
        ('{"replicas": 1000}', "at most 64 replicas per device"),
    ],
    ids=["deep-array", "deep-object", "5000-digits", "20-digits", "double-minus",
         "instance-count", "replicas"],
)  # fmt: skip
def test_a_hostile_inline_config_is_invalid_argument_over_both_protocols(
    repository_server: ServerThread, config: str, words: str
) -> None:
    """These were UNKNOWN (RecursionError, ValueError from int()), a torch overflow deep in the
    load, or a load that started a worker thread per replica asked for (``replicas: 100000``
    took over a minute and gigabytes of memory, then failed)."""
    port = repository_server.grpc_port
    assert port is not None
    started = time.monotonic()
    failed = _load(port, "a", config)
    assert isinstance(failed, grpc.RpcError)
    assert failed.code().name == "INVALID_ARGUMENT", failed.details()
    assert words in failed.details()
    body = orjson.dumps({"parameters": {"config": config}})
    status, answer = _rest(repository_server.port, "/v2/repository/models/a/load", body)
    assert status == 400, answer
    assert words in orjson.loads(answer)["error"]
    assert time.monotonic() - started < 20
    _serves(port, "a")


@pytest.mark.parametrize("name", ["x" * 300, "\xe9" * 200])
def test_a_name_too_long_for_a_directory_is_invalid_argument(
    repository_server: ServerThread, name: str
) -> None:
    """It was an OSError (File name too long) out of the load: gRPC's UNKNOWN."""
    port = repository_server.grpc_port
    assert port is not None
    failed = _load(port, name)
    assert isinstance(failed, grpc.RpcError)
    assert failed.code().name == "INVALID_ARGUMENT", failed.details()
    assert "at most 255 bytes" in failed.details()
    _serves(port, "a")


def test_names_of_unknown_models_are_not_kept(repository_server: ServerThread) -> None:
    """Every name a load or unload named kept a lock in the server, for good: a client could
    grow its memory without end with made-up names."""
    port = repository_server.grpc_port
    assert port is not None
    control = repository_server.app.control
    for i in range(100):
        request = pb.RepositoryModelUnloadRequest(model_name=f"nope-{i}-" + "y" * 1000)
        unloaded = _call(port, "RepositoryModelUnload", request, pb.RepositoryModelUnloadResponse)
        assert not isinstance(unloaded, grpc.RpcError)
        assert isinstance(_load(port, f"nope-{i}"), grpc.RpcError)
    status, _ = _rest(repository_server.port, "/v2/repository/models/gone/unload", b"{}")
    assert status == 200
    assert _load(port, "b") is not None  # a real reload: its lock goes too
    assert control._locks == {}


def test_the_index_forgets_a_failed_config_once_the_model_loads(
    repository_server: ServerThread,
) -> None:
    """A load whose config did not read left an entry without a version, UNAVAILABLE with
    that reason, next to the READY version of every later successful load."""
    port = repository_server.grpc_port
    assert port is not None
    assert isinstance(_load(port, "a", '{"labels": "../secret"}'), grpc.RpcError)
    index = _call(port, "RepositoryIndex", pb.RepositoryIndexRequest(), pb.RepositoryIndexResponse)
    assert any(m.name == "a" and not m.version for m in index.models)  # the failure is shown
    assert not isinstance(_load(port, "a", '{"max_batch_size": 4}'), grpc.RpcError)
    index = _call(port, "RepositoryIndex", pb.RepositoryIndexRequest(), pb.RepositoryIndexResponse)
    entries = [(m.name, m.version, m.state) for m in index.models if m.name == "a"]
    assert entries == [("a", "1", "READY")]


def test_a_load_that_fails_after_its_engine_started_stops_it(
    repository_server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure between the engine's start and its handle (a setting its documents cannot
    express, such as max_delay_ms = 1e308) left the engine running: a worker thread per
    replica, per failed load."""
    import torchplace.serve.reload as reload

    built: list[Any] = []

    def failing(engine: Any) -> Any:
        built.append(engine)
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(reload, "ModelHandle", failing)
    port = repository_server.grpc_port
    assert port is not None

    def workers() -> int:  # replica worker threads (the executor's idle threads may vary)
        return sum(t.name.startswith("torchplace-replica") for t in threading.enumerate())

    before = workers()
    for _ in range(3):
        failed = _load(port, "a", '{"max_batch_size": 4}')
        assert isinstance(failed, grpc.RpcError)
        assert "OverflowError" in failed.details()
    assert len(built) == 3
    assert not any(engine.is_live() for engine in built)  # stopped
    assert workers() <= before
    monkeypatch.undo()
    _serves(port, "a")


def test_a_cancelled_unload_still_stops_the_old_version(repository_server: ServerThread) -> None:
    """A client whose unload (or load) call ends before the drain (its deadline, a cancel)
    cancelled the switch halfway: the replaced version was unpublished but never stopped, its
    replicas and its memory reservation kept for good."""
    port = repository_server.grpc_port
    assert port is not None
    control = repository_server.app.control
    handle = control.registry.get("a").enter()  # a request in flight holds the drain up
    owner = handle.views["memory"]
    try:
        request = pb.RepositoryModelUnloadRequest(model_name="a")
        failed = _call(
            port, "RepositoryModelUnload", request, pb.RepositoryModelUnloadResponse, timeout=0.3
        )
        assert isinstance(failed, grpc.RpcError)
        assert failed.code().name == "DEADLINE_EXCEEDED"
    finally:
        handle.leave()
    deadline = time.monotonic() + 10
    while handle.engine.is_live() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not handle.engine.is_live()
    assert owner not in control.memory.reserved
    assert not isinstance(_load(port, "a"), grpc.RpcError)
    _serves(port, "a")


# -- streams ---------------------------------------------------------------------------------
def test_a_stream_that_is_not_read_is_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that sends large messages (here a 1 MiB id, echoed in each answer) and never
    reads had 128 of them and their answers held: up to 16 GiB at 64 MiB a message. Now the
    stream is read no further past the byte window."""
    import torchplace.serve.grpc_server as grpc_server
    import torchplace.serve.protocol as protocol

    monkeypatch.setattr(grpc_server, "STREAM_WINDOW_BYTES", 8 << 20)
    monkeypatch.setattr(protocol, "MAX_ID_CHARS", 2 << 20)  # the id is only a large payload here
    engine = FakeEngine()
    with ServerThread(test_config(max_body_bytes=4 << 20), engine=engine) as server:
        channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        try:
            stream = channel.stream_stream(
                SERVICE + "ModelStreamInfer",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.ModelStreamInferResponse.FromString,
            )

            def requests() -> Iterator[Any]:
                for i in range(60):
                    request = _infer_request("seed-mlp")
                    request.id = f"{i}:" + "x" * (1 << 20)
                    yield request

            call = stream(requests(), timeout=30)  # never read
            deadline = time.monotonic() + 3
            while engine.calls < 60 and time.monotonic() < deadline:
                time.sleep(0.05)
            # (8 MiB + one message) / (1 MiB in + 1 MiB out), and what the transport buffers
            assert 1 <= engine.calls <= 20
            _serves(server.grpc_port or 0, "seed-mlp")  # other clients are served
            answered = [answer.infer_response.id.split(":")[0] for answer in call]
            assert answered == [str(i) for i in range(60)]  # once read, every one answered
        finally:
            channel.close()
