"""The HTTP server and its routes, over real sockets: every status of the error table."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.errors import (
    ConfigError,
    DeviceOutOfMemoryError,
    KernelError,
    OverloadedError,
    TransferError,
)
from torchplace.serve.app import load_token
from torchplace.serve.running import ServerThread

from .conftest import Client, FakeEngine, Running, StartServer, seed_body, test_config

INFER = "/v2/models/seed-mlp/infer"
JSON = {"Content-Type": "application/json"}


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)


def raw_exchange(port: int, payload: bytes, *, read_for: float = 2.0) -> bytes:
    """Send raw bytes, read until the server closes or ``read_for`` passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_for) as sock:
        sock.sendall(payload)
        chunks = []
        deadline = time.monotonic() + read_for
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


# -- health and metadata ---------------------------------------------------------------------
def test_health_and_metadata(server: Running) -> None:
    c = server.client
    assert c.get("/v2/health/live")[0] == 200
    status, _, body = c.get("/v2/health/ready")
    assert (status, orjson.loads(body)) == (200, {"ready": True})
    status, _, body = c.get("/v2")
    meta = orjson.loads(body)
    assert status == 200
    assert meta["name"] == "torchplace"
    assert "binary_tensor_data" in meta["extensions"]
    for path in ("/v2/models/seed-mlp", "/v2/models/seed-mlp/versions/1"):
        status, headers, body = c.get(path)
        assert status == 200
        assert headers["content-type"] == "application/json"
        model = orjson.loads(body)
        assert model["name"] == "seed-mlp"
        assert model["versions"] == ["1"]
        assert model["platform"] == "pytorch"
        assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 8]}]
    for path in ("/v2/models/seed-mlp/ready", "/v2/models/seed-mlp/versions/1/ready"):
        assert c.get(path)[0] == 200
    config = orjson.loads(c.get("/v2/models/seed-mlp/config")[2])
    assert config["max_batch_size"] == 32
    assert config["input"][0]["dims"] == [8]


def test_infer_json_with_and_without_version(server: Running) -> None:
    x = rows(3)
    want = server.engine.reference(x)
    for path in (INFER, "/v2/models/seed-mlp/versions/1/infer", "/v2/models/seed%2Dmlp/infer"):
        status, _headers, body = server.client.post(path, seed_body(x, id="abc"), headers=JSON)
        assert status == 200, body
        doc = orjson.loads(body)
        assert doc["id"] == "abc"
        assert (doc["model_name"], doc["model_version"]) == ("seed-mlp", "1")
        out = doc["outputs"][0]
        assert out["shape"] == [3, 2]
        np.testing.assert_array_equal(np.array(out["data"], np.float32).reshape(3, 2), want)
    assert all(status == 200 for status, _ in server.engine.observed)


def test_kserve_v1_live_list_ready_and_predict(server: Running) -> None:
    """KServe's V1 protocol, as its own ``InferenceRESTClient(protocol="v1")`` calls it."""
    c = server.client
    assert (c.get("/")[0], orjson.loads(c.get("/")[2])) == (200, {"status": "alive"})
    assert orjson.loads(c.get("/v1/models")[2]) == {"models": ["seed-mlp"]}
    status, _, body = c.get("/v1/models/seed-mlp")
    assert (status, orjson.loads(body)) == (200, {"name": "seed-mlp", "ready": True})
    assert c.get("/v1/models/other")[0] == 404
    x = rows(3)
    doc = orjson.dumps({"instances": x.tolist()})
    status, _, body = c.post("/v1/models/seed-mlp:predict", doc, headers=JSON)
    assert status == 200, body
    got = np.array(orjson.loads(body)["predictions"], np.float32)
    np.testing.assert_array_equal(got, server.engine.reference(x))
    status, _, body = c.post("/v1/models/seed-mlp:predict", seed_body(x), headers=JSON)
    assert status == 400
    assert b"/v2/models/{name}/infer" in body
    assert c.get("/v1/models/seed-mlp:predict")[0] == 405
    assert (
        c.post("/v1/models/seed-mlp:explain", doc, headers=JSON)[0] == 501
    )  # KServe: no explainer


def test_infer_binary_in_and_out(server: Running) -> None:
    x = rows(2)
    raw = x.tobytes()
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": [2, 8],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    )
    status, headers, body = server.client.post(
        INFER,
        header + raw,
        headers={
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        },
    )
    assert status == 200, body
    length = int(headers["inference-header-content-length"])
    doc = orjson.loads(body[:length])
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == 16
    got = np.frombuffer(body[length:], np.float32).reshape(2, 2)
    np.testing.assert_array_equal(got, server.engine.reference(x))
    short = header.replace(b'"binary_data_size":64', b'"binary_data_size":60')
    status, _, body = server.client.post(
        INFER,
        short + raw[:60],
        headers={"Inference-Header-Content-Length": str(len(short))},
    )
    assert status == 400
    # Triton's words, which its clients and tests match on, then what the size is for
    assert (
        b"input byte size mismatch for input 'input' for model 'seed-mlp'. Expected 64, got 60:"
        in body
    )


def test_raw_binary_request(server: Running) -> None:
    """Triton's raw binary request: Inference-Header-Content-Length 0, the body one row of the
    one input; every output answered as binary data."""
    x = rows(1)
    raw = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": "0"}
    status, headers, body = server.client.post(INFER, x.tobytes(), headers=raw)
    assert status == 200, body
    length = int(headers["inference-header-content-length"])
    assert orjson.loads(body[:length])["outputs"][0]["shape"] == [1, 2]
    got = np.frombuffer(body[length:], np.float32).reshape(1, 2)
    np.testing.assert_array_equal(got, server.engine.reference(x))
    status, _, body = server.client.post(INFER, x.tobytes()[:-4], headers=raw)
    assert status == 400
    assert b"Expected 32, got 28: the raw body's byte size 28, where shape [1, 8] of FP32" in body


def test_the_models_list(server: Running) -> None:
    status, _, body = server.client.get("/v2/models")
    assert status == 200
    assert orjson.loads(body) == {"models": ["seed-mlp"]}


@pytest.mark.parametrize(
    ("accepted", "coding"),
    [("gzip", "gzip"), ("deflate", "deflate"), ("br, deflate;q=0.5, gzip;q=0", "deflate"),
     ("gzip;q=0, deflate;q=0.0", None), ("identity", None)],
)  # fmt: skip
def test_answers_are_compressed_as_accept_encoding_allows(
    server: Running, accepted: str, coding: str | None
) -> None:
    x = rows(2)
    status, headers, body = server.client.post(
        INFER, seed_body(x), headers={**JSON, "Accept-Encoding": accepted}
    )
    assert status == 200
    assert headers.get("content-encoding") == coding
    if coding is not None:
        body = zlib.decompress(body, 16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS)
    got = np.asarray(orjson.loads(body)["outputs"][0]["data"], np.float32).reshape(2, 2)
    np.testing.assert_allclose(got, server.engine.reference(x), rtol=1e-6)


def test_gzip_request_body(server: Running) -> None:
    x = rows(1)
    status, _, body = server.client.post(
        INFER, gzip.compress(seed_body(x)), headers={**JSON, "Content-Encoding": "gzip"}
    )
    assert status == 200, body


# -- error table -----------------------------------------------------------------------------
def test_unknown_routes_models_versions_are_404(server: Running) -> None:
    c = server.client
    for path, needle in [
        ("/nope", "no route"),
        ("/v2/models/other", "unknown model: 'other'"),
        ("/v2/models/other/infer", "unknown model"),
        ("/v2/models/seed-mlp/versions/7", "'seed-mlp' version 7 is not found"),
        ("/v2/models/seed-mlp/versions/7/infer", "version 7 is not found"),
        ("/v2/models/seed-mlp/bogus", "no route"),
        ("/v2/models/seed-mlp/versions", "missing version"),
    ]:
        status, _, body = c.get(path)
        assert status == 404, path
        assert needle in orjson.loads(body)["error"], (path, body)


def test_wrong_method_is_405_with_allow(server: Running) -> None:
    status, headers, body = server.client.get(INFER)
    assert status == 405
    assert headers["allow"] == "POST"
    assert "use POST" in orjson.loads(body)["error"]
    status, headers, _ = server.client.post("/v2/health/ready", b"{}")
    assert (status, headers["allow"]) == (405, "GET, HEAD")


def test_head_is_the_get_without_its_body(server: Running) -> None:
    _, _, body = server.client.get("/v2/models/seed-mlp")
    payload = (
        b"HEAD /v2/models/seed-mlp HTTP/1.1\r\nHost: x\r\n\r\n"
        b"HEAD /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    reply = raw_exchange(server.port, payload)
    heads = reply.split(b"\r\n\r\n")
    assert heads[0].startswith(b"HTTP/1.1 200 OK")
    assert b"content-length: %d" % len(body) in heads[0]
    assert heads[1].startswith(b"HTTP/1.1 200 OK")  # no body came between the two answers
    assert heads[2].startswith(b"HTTP/1.1 200 OK")


def test_an_http_1_0_client_keeps_the_connection_only_when_it_asks(server: Running) -> None:
    """``ab -k`` speaks HTTP/1.0 with ``Connection: Keep-Alive`` and reuses the connection
    only when the answer says keep-alive too; without it, HTTP/1.0 closes."""
    kept = raw_exchange(
        server.port,
        b"GET /v2/health/live HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"
        b"GET /v2/health/ready HTTP/1.0\r\n\r\n",
    )
    first, second = kept.split(b"HTTP/1.1 200 OK")[1:]
    assert b"connection: keep-alive" in first
    assert b"connection: close" in second
    assert second.endswith(b'{"ready":true}')


def test_a_request_target_in_absolute_form_is_routed_by_its_path(server: Running) -> None:
    body = seed_body(rows(1), id="abs")
    reply = raw_exchange(
        server.port,
        b"POST http://127.0.0.1:%d%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
        % (server.port, INFER.encode(), len(body), body),
    )
    assert reply.startswith(b"HTTP/1.1 200 OK")
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["id"] == "abs"


def test_bad_input_is_400_naming_the_input(server: Running) -> None:
    body = orjson.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 7], "data": [0.0] * 7}]}
    )
    status, _, reply = server.client.post(INFER, body, headers=JSON)
    assert status == 400
    assert "input 'input'" in orjson.loads(reply)["error"]
    assert server.engine.calls == 0  # never reached the engine
    assert server.engine.observed[-1][0] == 400


def test_wrong_content_type_is_415(server: Running) -> None:
    status, _, reply = server.client.post(
        INFER, seed_body(rows(1)), headers={"Content-Type": "text/html"}
    )
    assert status == 415
    assert "application/json" in orjson.loads(reply)["error"]


@pytest.mark.parametrize(
    "ctype", ["application/x-www-form-urlencoded", "application/vnd.api+json; charset=utf-8"]
)
def test_a_json_body_under_another_label_is_read_as_json(server: Running, ctype: str) -> None:
    """``curl -d '{...}'`` without ``-H 'Content-Type: application/json'`` labels the body
    form-encoded; Triton reads it as JSON, and so does the server, as it does a ``+json`` type."""
    body = seed_body(rows(2))
    status, _, reply = server.client.post(INFER, body, headers={"Content-Type": ctype})
    assert status == 200, reply
    _, _, plain = server.client.post(INFER, body)
    assert orjson.loads(reply)["outputs"] == orjson.loads(plain)["outputs"]


def test_body_over_limit_is_413(start_server: StartServer) -> None:
    running = start_server(max_body_bytes=4096)
    big = seed_body(rows(32))  # ~ 8 KB of JSON
    assert len(big) > 4096
    status, _headers, reply = running.client.post(INFER, big, headers=JSON)
    assert status == 413
    assert "4096" in orjson.loads(reply)["error"]
    # chunked bodies are counted as they arrive
    chunked = (
        b"POST "
        + INFER.encode()
        + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (1000, b"x" * 1000) for _ in range(6))
        + b"0\r\n\r\n"
    )
    assert raw_exchange(running.port, chunked).startswith(b"HTTP/1.1 413")
    # a small gzip body that inflates past the limit
    bomb = gzip.compress(b" " * 100_000)
    status, _, reply = running.client.post(INFER, bomb, headers={"Content-Encoding": "gzip"})
    assert status == 413
    assert running.client.get("/v2/health/ready")[0] == 200


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (OverloadedError("queue full"), 503),
        (DeviceOutOfMemoryError("one row does not fit"), 507),
        (TransferError("h2d failed"), 500),
        (KernelError("forward failed"), 500),
        (RuntimeError("a bug"), 500),
    ],
)
def test_engine_errors_map_to_statuses(
    start_server: StartServer, error: Exception, status: int
) -> None:
    running = start_server(FakeEngine(fail_with=error))  # type: ignore[arg-type]
    got, headers, body = running.client.post(INFER, seed_body(rows(1)), headers=JSON)
    assert got == status
    assert orjson.loads(body)["error"]
    if status == 503:
        assert headers["retry-after"] == "1"
    assert running.client.get("/v2/health/live")[0] == 200


def test_not_ready_is_503_with_retry_after(start_server: StartServer) -> None:
    running = start_server(FakeEngine(ready=False))
    status, headers, _ = running.client.get("/v2/health/ready")
    assert (status, headers["retry-after"]) == (503, "1")
    assert running.client.get("/v2/models/seed-mlp/ready")[0] == 503
    status, headers, body = running.client.post(INFER, seed_body(rows(1)), headers=JSON)
    assert (status, headers["retry-after"]) == (503, "1")
    assert "not ready" in orjson.loads(body)["error"]


# -- HTTP mechanics --------------------------------------------------------------------------
def test_pipelined_requests_are_answered_in_order(server: Running) -> None:
    bodies = [seed_body(rows(1, seed=i), id=str(i)) for i in range(5)]
    payload = (
        b"".join(
            b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (INFER.encode(), len(b), b)
            for b in bodies
        )
        + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    reply = raw_exchange(server.port, payload)
    assert reply.count(b"HTTP/1.1 200 OK") == 6
    ids = [
        json.loads(
            part.split(b"\r\n\r\n", 1)[1][
                : int(part.split(b"content-length: ")[1].split(b"\r\n")[0])
            ]
        )["id"]
        for part in reply.split(b"HTTP/1.1 200 OK")[1:6]
    ]
    assert ids == ["0", "1", "2", "3", "4"]


def test_expect_100_continue_and_chunked_body(server: Running) -> None:
    body = seed_body(rows(1))
    head = (
        b"POST " + INFER.encode() + b" HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(head)
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
        half = len(body) // 2
        for part in (body[:half], body[half:]):
            sock.sendall(b"%x\r\n%s\r\n" % (len(part), part))
        sock.sendall(b"0\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200 OK")
    assert b'"shape":[1,2]' in reply


def test_an_upgrade_is_ignored_and_the_request_answered_over_http_1_1(server: Running) -> None:
    """``curl --http2`` on http:// asks for h2c on a POST with a body; a WebSocket client
    asks on a GET. Each gets one HTTP/1.1 answer, and the connection goes on."""
    body = seed_body(rows(1), id="h2c")
    post = (
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n%s" % (INFER.encode(), len(body), body)
    )
    websocket = (
        b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
        b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    last = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(post[:-10])  # the body arrives after the parser stopped at the Upgrade
        time.sleep(0.05)
        sock.sendall(post[-10:] + websocket + last)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.count(b"HTTP/1.1 ") == 3
    answers = reply.split(b"HTTP/1.1 ")[1:]
    assert all(a.startswith(b"200 OK") for a in answers), reply
    assert json.loads(answers[0].split(b"\r\n\r\n", 1)[1])["id"] == "h2c"
    assert answers[1].endswith(b'{"ready":true}')


def test_upgrade_with_a_chunked_body_and_http2_are_one_clear_400(server: Running) -> None:
    chunked = raw_exchange(
        server.port,
        b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: Upgrade\r\n"
        b"Upgrade: h2c\r\n\r\n2\r\n{}\r\n0\r\n\r\n" % INFER.encode(),
    )
    assert chunked.count(b"HTTP/1.1 ") == 1
    assert chunked.startswith(b"HTTP/1.1 400")
    assert b"cannot have a chunked body here" in chunked
    preface = raw_exchange(server.port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert preface.startswith(b"HTTP/1.1 400")
    assert b"--grpc-port" in preface


def test_malformed_http_is_400_and_server_lives(server: Running) -> None:
    reply = raw_exchange(server.port, b"THIS IS NOT HTTP\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400")
    assert b"malformed HTTP" in reply
    assert server.client.get("/v2/health/ready")[0] == 200


def test_slow_request_gets_408(start_server: StartServer) -> None:
    running = start_server(request_timeout_s=0.5)
    with socket.create_connection(("127.0.0.1", running.port), timeout=5) as sock:
        sock.sendall(b"POST " + INFER.encode() + b" HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408")


def test_request_that_runs_too_long_gets_503(start_server: StartServer) -> None:
    running = start_server(FakeEngine(delay_s=5.0), request_timeout_s=0.5)
    began = time.monotonic()
    status, headers, body = running.client.post(INFER, seed_body(rows(1)), headers=JSON)
    assert status == 503
    assert "timed out" in orjson.loads(body)["error"]
    assert headers["retry-after"] == "1"
    assert time.monotonic() - began < 3.0


# -- auth ------------------------------------------------------------------------------------
def test_bearer_token(start_server: StartServer, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    running = start_server(auth_token_file=token_file)
    c = running.client
    assert c.get("/v2/health/ready")[0] == 200  # probes stay open
    status, headers, body = c.post(INFER, seed_body(rows(1)), headers=JSON)
    assert status == 401
    assert headers["www-authenticate"].startswith("Bearer")
    assert "missing bearer token" in orjson.loads(body)["error"]
    wrong = {**JSON, "Authorization": "Bearer nope"}
    assert c.post(INFER, seed_body(rows(1)), headers=wrong)[0] == 401
    good = {**JSON, "Authorization": "Bearer s3cret-token"}
    assert c.post(INFER, seed_body(rows(1)), headers=good)[0] == 200
    for scheme in ("bearer", "BEARER"):  # the scheme in any case (RFC 9110 11.1)
        spelled = {**JSON, "Authorization": f"{scheme} s3cret-token"}
        assert c.post(INFER, seed_body(rows(1)), headers=spelled)[0] == 200
    for value in ("Basic s3cret-token", "s3cret-token", "Bearer s3cret-token-and-more"):
        assert c.post(INFER, seed_body(rows(1)), headers={**JSON, "Authorization": value})[0] == 401
    assert c.get("/v2/models/seed-mlp", headers=good)[0] == 200
    assert c.get("/v2/models/seed-mlp")[0] == 401
    assert c.get("/metrics")[0] == 401
    assert c.get("/v2/models/other", headers=good)[0] == 404


def test_token_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_token(tmp_path / "missing")
    bad = tmp_path / "bad"
    bad.write_text("two words")
    with pytest.raises(ConfigError, match="printable token"):
        load_token(bad)


def test_port_in_use_is_a_config_error_naming_the_port() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        thread = ServerThread(test_config(port=port), engine=FakeEngine())
        with pytest.raises(ConfigError, match=rf"127\.0\.0\.1:{port}.*already in use.*--port"):
            thread.start()
        thread.stop()


def test_unresolvable_host_is_a_config_error_naming_the_host() -> None:
    thread = ServerThread(test_config(host="nosuchhost.invalid", port=0), engine=FakeEngine())
    with pytest.raises(ConfigError, match=r"'nosuchhost\.invalid' does not resolve.*--host"):
        thread.start()
    thread.stop()


# -- metrics and openapi ---------------------------------------------------------------------
def test_metrics_route(server: Running, start_server: StartServer) -> None:
    status, headers, body = server.client.get("/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    own = server.engine.metrics_text()
    assert body.startswith(own)  # the engine's series, then Triton's gauges of the host
    assert all(
        line.startswith((b"# HELP nv_", b"# TYPE nv_", b"nv_"))
        for line in body[len(own) :].splitlines()
    )
    off = start_server(metrics=False)
    assert off.client.get("/metrics")[0] == 404


def test_openapi_document(server: Running) -> None:
    status, _, body = server.client.get("/v2/openapi.json")
    doc = orjson.loads(body)
    assert status == 200
    assert doc["openapi"].startswith("3.0")
    for path in (
        "/v2/health/live",
        "/v2/health/ready",
        "/v2",
        "/v2/models/{MODEL_NAME}",
        "/v2/models/{MODEL_NAME}/versions/{MODEL_VERSION}/infer",
    ):
        assert path in doc["paths"]
    assert doc["components"]["schemas"]["request_input"]["properties"]["name"]["enum"] == ["input"]


# -- drain -----------------------------------------------------------------------------------
def test_drain_finishes_in_flight_and_refuses_new() -> None:
    engine = FakeEngine(delay_s=1.0)
    thread = ServerThread(test_config(drain_grace_s=1.0), engine=engine).start()
    client = Client("127.0.0.1", thread.port)
    results: dict[str, Any] = {}

    def slow() -> None:
        results["slow"] = client.post(INFER, seed_body(rows(1)), headers=JSON)

    worker = threading.Thread(target=slow)
    worker.start()
    deadline = time.monotonic() + 5
    while not engine.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    stopper = threading.Thread(target=thread.stop)
    stopper.start()
    time.sleep(0.2)
    status, headers, _body = client.post(INFER, seed_body(rows(1)), headers=JSON)
    assert status == 503
    assert headers["connection"] == "close"
    assert client.get("/v2/health/ready")[0] == 503
    assert client.get("/v2/health/live")[0] == 200
    worker.join(10)
    stopper.join(10)
    assert results["slow"][0] == 200
    assert engine.drained
    assert engine.stopped
    with pytest.raises(ConnectionRefusedError):
        client.get("/v2/health/live")


@pytest.mark.parametrize("length", ["12x", "9" * 4301])
def test_a_header_length_that_is_no_byte_count_is_a_400(server: Running, length: str) -> None:
    headers = {**JSON, "Inference-Header-Content-Length": length}
    status, _, body = server.client.post(INFER, seed_body(rows(1)), headers=headers)
    assert status == 400
    assert b"Inference-Header-Content-Length" in body
