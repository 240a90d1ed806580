"""Round ten: clients that find the protocol at run time, Triton's load tool checking every
answer, and ``curl``'s ``Expect: 100-continue``, against a real `torchplace serve`.

Clients: grpcio-reflection's ``ProtoReflectionDescriptorDatabase`` (what ``grpcurl``,
``grpcui``, Postman and Evans do when given no ``.proto`` file: list the services, fetch the
files that define them, build the messages from those and call), gRPC's reflection protocol
spoken by hand (``grpc.reflection.v1`` and ``v1alpha``), ``perf_analyzer`` (``--input-data``
with ``validation_data``, ``--streaming``, ``--async``) and ``curl``.

Tried this round and found to behave as designed (not repeated here): KServe's SDK 0.21
(``InferenceRESTClient`` v1 and v2, ``InferenceGRPCClient``) and MLServer 1.7 (codecs,
``mlserver infer``), as test_kserve_clients.py, test_conformance_oip2.py and
test_conformance_mlserver.py drive them, in freshly built venvs; ``perf_analyzer`` with
``--shape``, ``--input-data`` (zero, random, JSON files), ``-i grpc --streaming``, ``--async``,
``--request-rate-range``, ``--shared-memory system`` over HTTP and gRPC, ``-b 4`` and
``--grpc-compression-algorithm gzip`` (its JSON data must write floats with a fraction, and it
cannot validate shared-memory outputs, against any server); ``tritonclient.utils``'
``serialize_byte_tensor`` (a BYTES input is a clear 400/``INVALID_ARGUMENT``); ``aiohttp`` and
``httpx`` keep-alive pools of 8 connections, 300 requests at once, reused just before and after
``--keepalive-timeout`` closes them (no error); ``curl --http1.0`` and an ``Expect`` value other
than ``100-continue`` (ignored, as RFC 9110 allows).

What is pinned here:

- the gRPC port offers server reflection (it offered none: ``grpcurl list`` and every client
  that reflects failed with ``UNIMPLEMENTED``): the services listed are those the client can
  describe, the files come with their imports (asked by file, message, service or method), and
  an inference built from the reflected descriptors alone is answered; no token is asked for
  reflection, the calls still need one;
- the reflection stream's answers for a name it does not know, a request that asks for nothing
  and the extension queries, on the stream (``error_response``), which stays open; a stream
  that sends nothing for ``--request-timeout`` is ended with ``DEADLINE_EXCEEDED``;
- perf_analyzer's ``validation_data``: every answer it checks is the model's, bit for bit, over
  HTTP (binary and JSON) and gRPC (stream and async);
- ``Expect: 100-continue`` with a request whose head decides its answer (a missing or wrong
  token, a model or version not served) is answered at once and the body never asked for (it
  was sent ``100 Continue``, so curl uploaded the whole body to hear the refusal).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from torchplace.models import build_model
from torchplace.serve.running import ServerThread

from .conftest import exchange, test_config

grpc = pytest.importorskip("grpc")
from torchplace.serve.proto import reflection_pb2 as reflection  # noqa: E402

TOKEN = "s3cret"
REQUEST_TIMEOUT_S = 2.0
Request = reflection.ServerReflectionRequest
Response = reflection.ServerReflectionResponse


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    token = tmp_path_factory.mktemp("auth") / "token"
    token.write_text(TOKEN + "\n")
    config = test_config(
        device="cpu", auth_token_file=Path(token), request_timeout_s=REQUEST_TIMEOUT_S
    )
    thread = ServerThread(config).start(120)
    try:
        yield thread
    finally:
        thread.stop()


def _reflect(server: ServerThread, requests: list[Any], service: str = "v1") -> list[Any]:
    """The answers of one ``ServerReflectionInfo`` stream that sends ``requests``."""
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        call = channel.stream_stream(
            f"/grpc.reflection.{service}.ServerReflection/ServerReflectionInfo",
            request_serializer=Request.SerializeToString,
            response_deserializer=Response.FromString,
        )
        return list(call(iter(requests), timeout=10))


def _file_names(answer: Any) -> list[str]:
    from google.protobuf import descriptor_pb2

    files = answer.file_descriptor_response.file_descriptor_proto
    return [descriptor_pb2.FileDescriptorProto.FromString(raw).name for raw in files]


def test_a_reflecting_client_lists_describes_and_calls(server: ServerThread) -> None:
    """grpcio-reflection's client, as grpcurl uses reflection: ``list``, ``describe`` each
    service, then a ``ModelInfer`` whose messages come from the reflected files only."""
    pytest.importorskip("grpc_reflection", reason="grpcio-reflection is not installed")
    from google.protobuf import descriptor_pool, message_factory
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = list(database.get_services())
        assert services == [
            "inference.GRPCInferenceService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
        ]
        pool = descriptor_pool.DescriptorPool(database)
        assert all(pool.FindServiceByName(name).methods for name in services)
        method = pool.FindMethodByName("inference.GRPCInferenceService.ModelInfer")
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
        request = request_class(model_name="seed-mlp")
        entry = request.inputs.add(name="input", datatype="FP32", shape=[2, 8])
        entry.contents.fp32_contents.extend(x.ravel().tolist())
        infer = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=request_class.SerializeToString,
            response_deserializer=response_class.FromString,
        )
        with pytest.raises(grpc.RpcError) as refused:
            infer(request, timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answer = infer(request, timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),))
    with torch.inference_mode():
        want = build_model("seed-mlp")(torch.from_numpy(x)).numpy()
    got = np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(2, 2)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("service", ["v1", "v1alpha"])
def test_files_come_with_their_imports_under_both_names(server: ServerThread, service: str) -> None:
    by_symbol, by_file, method, health = _reflect(
        server,
        [
            Request(host="h", file_containing_symbol="inference.ModelInferRequest"),
            Request(file_by_filename="grpc_service.proto"),
            Request(file_containing_symbol="inference.GRPCInferenceService.ModelInfer"),
            Request(file_containing_symbol="grpc.health.v1.Health"),
        ],
        service,
    )
    assert by_symbol.valid_host == "h"
    assert by_symbol.original_request.file_containing_symbol == "inference.ModelInferRequest"
    for answer in (by_symbol, by_file, method):
        assert _file_names(answer) == ["grpc_service.proto", "model_config.proto"]
    assert _file_names(health) == ["health.proto"]


def test_unknown_names_and_empty_requests_are_answered_on_the_open_stream(
    server: ServerThread,
) -> None:
    answers = _reflect(
        server,
        [
            Request(file_containing_symbol="inference.Nope"),
            Request(file_by_filename="nope.proto"),
            Request(),
            Request(all_extension_numbers_of_type="inference.ModelInferRequest"),
            Request(all_extension_numbers_of_type="inference.Nope"),
            Request(
                file_containing_extension=reflection.ExtensionRequest(
                    containing_type="inference.ModelInferRequest", extension_number=100
                )
            ),
            Request(list_services=""),
        ],
    )
    kinds = [answer.WhichOneof("message_response") for answer in answers]
    assert kinds == [
        "error_response",
        "error_response",
        "error_response",
        "all_extension_numbers_response",
        "error_response",
        "error_response",
        "list_services_response",
    ]
    codes = [answers[i].error_response.error_code for i in (0, 1, 2, 4, 5)]
    assert codes == [
        grpc.StatusCode.NOT_FOUND.value[0],
        grpc.StatusCode.NOT_FOUND.value[0],
        grpc.StatusCode.INVALID_ARGUMENT.value[0],
        grpc.StatusCode.NOT_FOUND.value[0],
        grpc.StatusCode.NOT_FOUND.value[0],
    ]
    assert "'inference.Nope'" in answers[0].error_response.error_message
    assert "list_services" in answers[2].error_response.error_message
    numbers = answers[3].all_extension_numbers_response
    assert numbers.base_type_name == "inference.ModelInferRequest"
    assert list(numbers.extension_number) == []


def test_a_silent_reflection_stream_is_ended_after_the_request_timeout(
    server: ServerThread,
) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        call = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=Request.SerializeToString,
            response_deserializer=Response.FromString,
        )

        def silent() -> Iterator[Any]:
            yield Request(list_services="")
            finished.wait(30)  # sends nothing more until the test ends

        finished = threading.Event()
        try:
            answers = call(silent(), timeout=30)
            assert next(answers).WhichOneof("message_response") == "list_services_response"
            with pytest.raises(grpc.RpcError) as ended:
                next(answers)
        finally:
            finished.set()
    assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "--request-timeout" in (ended.value.details() or "")


def test_garbage_on_the_reflection_stream_is_invalid_argument(server: ServerThread) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        call = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=bytes,
            response_deserializer=Response.FromString,
        )
        with pytest.raises(grpc.RpcError) as refused:
            list(call(iter([b"\xff\xff\xff"]), timeout=10))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "grpc.reflection.v1.ServerReflectionRequest" in (refused.value.details() or "")


def _curl(*args: str) -> subprocess.CompletedProcess[str]:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    return subprocess.run(
        [curl, "-sS", "--max-time", "20", *args],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_curl_sends_a_file_after_100_continue(server: ServerThread, tmp_path: Path) -> None:
    """``curl --data-binary @file -H 'Expect: 100-continue'``: the interim answer, then the
    inference's."""
    body = tmp_path / "request.json"
    body.write_text(
        '{"inputs":[{"name":"input","datatype":"FP32","shape":[1,8],"data":[1,2,3,4,5,6,7,8]}]}'
    )
    done = _curl("-i", "--data-binary", f"@{body}", "-H", "Expect: 100-continue",
                 "-H", "Content-Type: application/json", "-H", f"Authorization: Bearer {TOKEN}",
                 f"{server.url}/v2/models/seed-mlp/infer")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("HTTP/1.1 100 Continue\n\nHTTP/1.1 200 OK\n"), done.stdout
    assert '"model_name":"seed-mlp"' in done.stdout


@pytest.mark.parametrize(
    ("path", "token", "status", "words"),
    [
        ("/v2/models/seed-mlp/infer", None, 401, "missing bearer token"),
        ("/v2/models/seed-mlp/infer", "wrong", 401, "wrong bearer token"),
        ("/v2/models/nope/infer", None, 401, "missing bearer token"),
        ("/v2/models/nope/infer", TOKEN, 404, "'nope' is not found"),
        ("/v2/models/seed-mlp/versions/7/infer", TOKEN, 404, "version 7 is not found"),
        ("/v1/models/nope:predict", TOKEN, 404, "'nope' is not found"),
        ("/v2/repository/models/seed-mlp/load", "wrong", 401, "wrong bearer token"),
    ],
)
def test_a_request_refused_by_its_head_is_answered_before_curl_uploads(
    server: ServerThread, tmp_path: Path, path: str, token: str | None, status: int, words: str
) -> None:
    """``Expect: 100-continue`` is there so that a server can refuse before the body comes
    (RFC 9110, 10.1.1; curl asks for it with a body over 1 MiB): a missing or wrong token, or
    an inference on a model not served, is answered at once and curl sends none of the body
    (it was sent ``100 Continue`` and made to upload it all, to hear the same refusal)."""
    body = tmp_path / "large.bin"
    body.write_bytes(bytes(3 << 20))
    auth = ["-H", f"Authorization: Bearer {token}"] if token else []
    done = _curl("-o", "/dev/null", "-w", "%{http_code} %{size_upload}", "--data-binary",
                 f"@{body}", "-H", "Expect: 100-continue", "-D", "-", *auth,
                 f"{server.url}{path}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "100 Continue" not in done.stdout
    assert done.stdout.endswith(f"{status} 0"), done.stdout


def test_a_head_refusal_without_a_body_sent_is_the_whole_exchange(server: ServerThread) -> None:
    """The same on the wire: the head alone gets the final answer (no 100), with its
    ``{"error": ...}`` object, and the connection is closed; a request that passes gets 100."""
    head = (
        b"POST /v2/models/nope/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
        b"Authorization: Bearer " + TOKEN.encode() + b"\r\nExpect: 100-continue\r\n\r\n"
    )
    reply = exchange(server.port, head)
    assert reply.startswith(b"HTTP/1.1 404 Not Found\r\n"), reply
    assert b"connection: close" in reply.lower()
    assert reply.endswith(b"is not found; this server serves 'seed-mlp'\"}"), reply
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head.replace(b"/nope/", b"/seed-mlp/"))
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"


def _perf_analyzer() -> Any:
    """Triton's ``perf_analyzer`` as the benchmarks run it (benchmarks/peers/perf_client.py),
    without installing it; skip when it is not there."""
    name = "torchplace_bench_perf_client"
    module = sys.modules.get(name)
    if module is None:
        path = Path(__file__).resolve().parents[2] / "benchmarks" / "peers" / "perf_client.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None
        assert spec.loader is not None
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    tool = module.ensure(install=False)
    if isinstance(tool, str):
        pytest.skip(f"perf_analyzer: {tool}")
    return tool


def _validation_data(path: Path, shift: float = 0.0) -> Path:
    """perf_analyzer's ``--input-data`` file: two rows of ``seed-mlp`` input and, as
    ``validation_data``, the outputs the model gives them (``shift`` added: a wrong answer).
    Its floats are written with a fraction: perf_analyzer takes ``2`` for no float."""
    rows = np.array([[0.5] * 8, [i + 0.5 for i in range(1, 9)]], np.float32)
    model = build_model("seed-mlp")
    with torch.inference_mode():  # one row at a time, as the server runs them one by one
        outputs = [
            model(torch.from_numpy(row[None]))[0].numpy() + np.float32(shift) for row in rows
        ]
    data = {
        "data": [{"input": row.tolist()} for row in rows],
        "validation_data": [{"output": out.tolist()} for out in outputs],
    }
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "how",
    [
        ["-i", "http"],
        ["-i", "http", "--input-tensor-format", "json", "--output-tensor-format", "json"],
        ["-i", "grpc", "--streaming"],
        ["-i", "grpc", "--async"],
    ],
    ids=["http-binary", "http-json", "grpc-streaming", "grpc-async"],
)
def test_perf_analyzer_validates_every_answer(
    server: ServerThread, tmp_path: Path, how: list[str]
) -> None:
    """``perf_analyzer --input-data FILE`` with ``validation_data``: it compares each answer's
    bytes with the expected output and fails the run at the first that differs (as the
    shifted file shows); run over HTTP (binary and JSON tensors) and gRPC (a stream, and
    asynchronous calls), one request at a time: rows batched together need not give the same
    bits as rows run alone (on any server). Shared-memory outputs it cannot validate (it reads
    the answer's body, which does not hold them), against any server."""
    tool = _perf_analyzer()
    port = server.grpc_port if "grpc" in how else server.port
    base = ["-m", "seed-mlp", "-u", f"127.0.0.1:{port}", *how,
            "-H", f"authorization: Bearer {TOKEN}",
            "--measurement-mode", "count_windows", "--measurement-request-count", "20",
            "--max-trials", "3", "--stability-percentage", "10000"]  # fmt: skip
    good = tool.run([*base, "--input-data", str(_validation_data(tmp_path / "good.json"))], 120)
    assert good.returncode == 0, (good.stdout + good.stderr)[-2000:]
    bad = _validation_data(tmp_path / "bad.json", shift=1.0)
    wrong = tool.run([*base, "--input-data", str(bad)], 120)
    assert wrong.returncode != 0
    assert "Output doesn't match expected output" in wrong.stdout + wrong.stderr
