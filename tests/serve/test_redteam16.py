"""Round 16 of hostile HTTP clients: a declared body that never comes, chunked bodies, a small
compressed body that inflates to many MiB, and an upload cut off by a drain."""

from __future__ import annotations

import asyncio
import gzip
import socket
import threading
import time

import numpy as np
import orjson
import pytest

from tests.serve.conftest import (
    Running,
    StartServer,
    eventually,
    raw_request,
    seed_body,
    seed_input,
)
from torchplace.serve import app as app_module
from torchplace.serve import http as http_module
from torchplace.serve.http import HttpServer, Request, Response


def _echo(request: Request) -> Response:
    return Response(200, b"ok %d" % len(request.body))


def test_a_declared_body_that_does_not_come_loses_its_room_to_one_that_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that declares a large body and sends none holds its room in the body budget
    only while it keeps sending: when another body waits for that room, the stalled one is
    told 408 after the stall window, not after the whole request timeout."""
    monkeypatch.setattr(http_module, "_BODY_STALL_S", 0.2)

    async def main() -> None:
        server = HttpServer(_echo, max_body_bytes=4 << 20, request_timeout_s=30.0)
        server.body_budget = 3 << 20
        await server.start("127.0.0.1", 0)
        size = 2 << 20
        head = b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % size
        idle_r, idle_w = await asyncio.open_connection("127.0.0.1", server.port)
        live_r, live_w = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            idle_w.write(head)  # and no body
            await eventually(lambda: server.body_reading)
            live_w.write(head + b"b" * size)
            await eventually(lambda: server.body_waiting)
            assert len(server.body_waiting) == 1
            started = time.monotonic()
            answer = await asyncio.wait_for(live_r.readuntil(b"ok %d" % size), 10.0)
            assert b"200" in answer
            assert time.monotonic() - started < 5.0  # not the 30 s request timeout
            refused = await asyncio.wait_for(idle_r.read(), 5.0)
            assert refused.startswith(b"HTTP/1.1 408"), refused
            assert b"KiB/s" in refused
            await eventually(lambda: not server.body_reading)
            assert server.body_reading == 0
        finally:
            idle_w.close()
            live_w.close()
            await server.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_slow_body_alone_is_held_to_the_request_timeout_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With nobody waiting for room, a large body may pause (a slow link): it is read whole."""
    monkeypatch.setattr(http_module, "_BODY_STALL_S", 0.1)

    async def main() -> None:
        server = HttpServer(_echo, max_body_bytes=4 << 20, request_timeout_s=30.0)
        await server.start("127.0.0.1", 0)
        size = 2 << 20
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % size)
            writer.write(b"a" * (size // 2))
            await asyncio.sleep(1.5)  # past a tick and the stall window
            writer.write(b"a" * (size - size // 2))
            answer = await asyncio.wait_for(reader.readuntil(b"ok %d" % size), 5.0)
            assert b"200" in answer
        finally:
            writer.close()
            await server.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_chunked_bodies_count_against_the_body_budget() -> None:
    """A chunked body's length is unknown until its last chunk: once it is large it takes room
    for the most it may be, and past the budget the next one waits instead of being read."""

    async def main() -> None:
        server = HttpServer(_echo, max_body_bytes=2 << 20, request_timeout_s=30.0)
        server.body_budget = 3 << 20
        await server.start("127.0.0.1", 0)
        head = b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        chunk = b"%x\r\n" % (600 << 10) + b"c" * (600 << 10) + b"\r\n"
        streams = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
        try:
            for _, writer in streams:
                writer.write(head + chunk * 2)  # 1.2 MiB each: large
                await eventually(lambda: server.body_reading or server.body_waiting)
            await eventually(lambda: server.body_waiting)
            assert server.body_reading == 2 << 20  # the first, at the body limit
            assert len(server.body_waiting) == 1  # the second is not read meanwhile
            for _, writer in streams:
                writer.write(b"0\r\n\r\n")
            for reader, _ in streams:
                answer = await asyncio.wait_for(reader.readuntil(b"ok %d" % (1200 << 10)), 5.0)
                assert b"200" in answer
            await eventually(lambda: not server.body_reading)
            assert server.body_reading == 0
            assert not server.body_waiting
        finally:
            for _, writer in streams:
                writer.close()
            await server.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_refused_body_is_let_go_at_once() -> None:
    async def main() -> None:
        server = HttpServer(_echo, max_body_bytes=2 << 20, request_timeout_s=30.0)
        await server.start("127.0.0.1", 0)
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2000000\r\n\r\n")
            writer.write(b"a" * 1_500_000)
            await eventually(lambda: server.body_reading)
            (conn,) = server.connections
            await eventually(lambda: len(conn._body) == 1_500_000)
            conn._reject(Response(400, b"no"))
            assert conn._body == b""
            assert server.body_reading == 0
        finally:
            writer.close()
            await server.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def _off_loop(calls: list[bool]) -> object:
    inflate = app_module._inflate

    def recording(*args: object) -> bytes:
        try:
            asyncio.get_running_loop()
            calls.append(False)  # on the event loop's thread
        except RuntimeError:
            calls.append(True)
        return inflate(*args)  # type: ignore[arg-type]

    return recording


def test_a_large_compressed_body_is_inflated_off_the_event_loop(
    server: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(app_module, "_inflate", _off_loop(calls))
    x = np.full((1, 8), 0.25, np.float32)
    plain = seed_body(x)
    big = gzip.compress(plain[:-1] + b" " * (4 << 20) + plain[-1:])  # 4 MiB of spaces
    small = gzip.compress(plain)
    assert len(big) >= app_module._INFLATE_OFF_LOOP > len(small)
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    answers = [
        server.client.post("/v2/models/seed-mlp/infer", b, headers=headers) for b in (big, small)
    ]
    assert [status for status, _, _ in answers] == [200, 200]
    assert answers[0][2] == answers[1][2]
    assert calls == [True, False]  # the large one in a worker thread, the small one inline


def test_an_inflated_body_over_the_limit_is_refused_as_before(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(app_module, "_inflate", _off_loop(calls))
    running = start_server(max_body_bytes=1 << 20)
    bomb = gzip.compress(b" " * (4 << 20))
    status, _, body = running.client.post(
        "/v2/models/seed-mlp/infer",
        bomb,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert status == 413, body
    assert b"Decompressed data size exceeds the maximum allowed value" in body
    assert calls == [True]  # inflated once, in a worker thread; the route told the error
    status, _, _ = running.client.post(
        "/v2/models/seed-mlp/infer", orjson.dumps({"inputs": [seed_input()]})
    )
    assert status == 200


def test_a_drain_reads_a_body_still_arriving_and_answers_it(start_server: StartServer) -> None:
    """SIGTERM while a client uploads: its request is read whole and answered 503 with
    Connection: close within the drain timeout, not cut off with no answer."""
    running = start_server(drain_timeout_s=10.0)
    body = seed_body(np.ones((1, 8), np.float32))
    body = body[:-1] + b" " * 3_000_000 + body[-1:]
    request = raw_request(body, headers={b"Connection": b"keep-alive"})
    sock = socket.create_connection(("127.0.0.1", running.port), timeout=10)
    try:
        sock.sendall(request[: len(request) // 2])
        stopper = threading.Thread(target=running.thread.stop)
        stopper.start()
        time.sleep(1.5)  # past the drain's close of idle connections
        sock.sendall(request[len(request) // 2 :])
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        stopper.join(15)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"connection: close" in answer.lower()
    finally:
        sock.close()


def test_the_drain_still_ends_at_its_timeout_for_a_body_that_never_comes(
    start_server: StartServer,
) -> None:
    running = start_server(drain_timeout_s=1.0)
    sock = socket.create_connection(("127.0.0.1", running.port), timeout=10)
    try:
        sock.sendall(
            b"POST /v2/models/seed-mlp/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 99\r\n\r\n"
        )
        started = time.monotonic()
        running.thread.stop()
        assert time.monotonic() - started < 5.0
    finally:
        sock.close()
