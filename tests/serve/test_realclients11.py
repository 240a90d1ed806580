"""Round eleven: every method of Triton's own clients, as a user migrating from Triton calls
them, against a real `torchplace serve`.

Clients: ``tritonclient.http``, ``tritonclient.http.aio``, ``tritonclient.grpc`` and
``tritonclient.grpc.aio`` 2.73, unmodified, and KServe's SDK 0.21 (``InferenceRESTClient`` v1
and v2, ``InferenceGRPCClient``) in a venv of its own.

Tried this round and found to behave as designed (not repeated here): the health calls,
server and model metadata, ``get_model_config``, the repository index, statistics (all, per
model, per version, a version or model not loaded is 404/``NOT_FOUND``), system shared memory
(register, status, a region used for an input and an output, a name registered twice, a key
that does not open, unregister one and all), CUDA shared memory (status empty, register
refused naming the alternatives), ``infer`` with JSON and binary tensors, ``model_version``,
``request_id`` (echoed), ``sequence_id``/``sequence_start``/``sequence_end`` (taken, the model
has no state), ``priority``, ``timeout`` (a deadline of 1 us is a 504/``DEADLINE_EXCEEDED`` in
Triton's words), ``parameters`` (``triton_`` ones refused by the client itself), ``headers``,
``query_params``, request and response compression (gzip and deflate, each way, JSON and
binary), ``client_timeout``/``network_timeout``, classification (``class_count``, with labels,
``k`` past the classes), BYTES inputs (a clear 400/``INVALID_ARGUMENT``), ``async_infer`` (with
``concurrency``, gRPC callbacks), ``start_stream``/``async_stream_infer`` (ids, errors on the
stream, ``enable_empty_final_response``, stream headers and compression), ``stream_infer`` of
the aio client, ``load_model`` with an inline config (Triton's own, what ``get_model_config``
answers over REST and gRPC) and with ``files`` (400 naming the fix), ``unload_model`` with
``unload_dependents``, the control calls in mode ``none`` (403/``FAILED_PRECONDITION``), bearer
tokens through ``headers`` and ``register_plugin``, gRPC keepalive pings; the KServe SDK's
health, readiness, v2 JSON and binary inference, v1 ``:predict`` and ``:explain`` (501).

What is pinned here:

- Triton's generate extension, which the server does not serve (nor list in ``/v2``'s
  ``extensions``), is refused saying so and what to use instead (``/infer``): REST 404 ``no
  route ...: Triton's generate extension is not supported by this server ...``. A bare ``no
  route`` left the client to guess why.
- The trace settings calls (Triton's trace extension, served since) on a server started
  without ``--trace-file``: read, and refused saying how when they ask to record.

The inline-config checks of ``load_model(name, config=...)`` this round added (a typo inside
``dynamic_batching``, an instance group, a tensor or the version policy; a policy of two kinds;
instance groups of different counts) are pinned in test_repository_hostile.py.
"""

from __future__ import annotations

import asyncio
import http.client
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from torchplace.serve.running import ServerThread

from .conftest import test_config

NOWHERE = "trace_level TIMESTAMPS has nowhere to write: start the server with --trace-file"
GENERATE = "Triton's generate extension is not supported by this server"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    thread = ServerThread(test_config(model="seed-mlp", device="cpu")).start(timeout=120)
    try:
        yield thread
    finally:
        thread.stop()


def _request(port: int, method: str, path: str, body: object = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        raw = None if body is None else orjson.dumps(body)
        conn.request(method, path, body=raw, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        return response.status, orjson.loads(data) if data else None
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("method", "path", "words", "fix"),
    [
        ("POST", "/v2/models/seed-mlp/generate", GENERATE, "/v2/models/seed-mlp/infer"),
        ("POST", "/v2/models/seed-mlp/generate_stream", GENERATE, "/v2/models/seed-mlp/infer"),
    ],
)
def test_rest_names_an_extension_it_does_not_serve(
    server: ServerThread, method: str, path: str, words: str, fix: str
) -> None:
    status, answer = _request(server.port, method, path, {"text_input": "hi"})
    assert status == 404, answer
    assert answer["error"].startswith(f"no route {path}: {words}"), answer
    assert fix in answer["error"]
    status, metadata = _request(server.port, "GET", "/v2")
    assert status == 200
    assert "generate" not in metadata["extensions"]


def test_rest_other_unknown_routes_are_as_they_were(server: ServerThread) -> None:
    status, answer = _request(server.port, "GET", "/v2/tracing")
    assert status == 404
    assert answer["error"] == "no route /v2/tracing; see /v2/openapi.json for the routes served"
    status, answer = _request(server.port, "POST", "/v2/models/seed-mlp/generated")
    assert (status, answer["error"]) == (404, "no route /v2/models/seed-mlp/generated")
    status, answer = _request(server.port, "POST", "/v2/models/nope/generate")
    assert status == 404
    assert "Request for unknown model: 'nope'" in answer["error"]


_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("update_trace_settings", (), {"settings": {"trace_level": ["TIMESTAMPS"]}}, NOWHERE),
]


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_tritonclient_is_told_why_tracing_cannot_start(server: ServerThread, kind: str) -> None:
    """``tritonclient``'s trace settings calls on a server started without --trace-file: the
    settings are read (level OFF), and turning tracing on is refused saying how
    (400/``INVALID_ARGUMENT``)."""
    module: Any = pytest.importorskip(f"tritonclient.{kind}")
    from tritonclient.utils import InferenceServerException

    port = server.port if kind == "http" else server.grpc_port
    client = module.InferenceServerClient(f"127.0.0.1:{port}")
    code = "400" if kind == "http" else "StatusCode.INVALID_ARGUMENT"
    try:
        settings = client.get_trace_settings(model_name="seed-mlp")
        if kind == "grpc":
            settings = {k: list(v.value) for k, v in settings.settings.items()}
        assert settings["trace_level"] == ["OFF"]
        for name, args, kwargs, words in _CALLS:
            with pytest.raises(InferenceServerException) as caught:
                getattr(client, name)(*args, **kwargs)
            assert caught.value.status() == code, name
            assert words in caught.value.message(), (name, caught.value.message())
        assert client.is_server_ready()
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_aio_tritonclient_is_told_why_tracing_cannot_start(server: ServerThread, kind: str) -> None:
    module: Any = pytest.importorskip(f"tritonclient.{kind}.aio")
    from tritonclient.utils import InferenceServerException

    port = server.port if kind == "http" else server.grpc_port

    async def calls() -> list[Any]:
        client = module.InferenceServerClient(f"127.0.0.1:{port}")
        got: list[Any] = []
        try:
            for name, args, kwargs, _ in _CALLS:
                try:
                    got.append(await getattr(client, name)(*args, **kwargs))
                except InferenceServerException as exc:
                    got.append(exc)
        finally:
            await client.close()
        return got

    got = asyncio.run(calls())
    for (name, _, _, words), answer in zip(_CALLS, got, strict=True):
        assert isinstance(answer, InferenceServerException), (name, answer)
        assert words in answer.message(), (name, answer.message())
