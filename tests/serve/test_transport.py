"""Hostile and unusual HTTP clients at the transport: half-closed connections, HTTP versions
other than 1.1 and 1.0, chunk sizes over the body limit, request smuggling and malformed framing,
slow headers. Each gets a clear answer or a clean close within a bounded time, and the server
keeps serving everyone else (gRPC's side: test_grpc_transport.py)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.serve.http import HttpServer, Request, Response
from torchplace.serve.running import ServerThread

from .conftest import FakeEngine, raw_request, seed_body, test_config

LIMIT = 1024
_GET = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"


async def _serve(slow: bool = False, **options: float) -> HttpServer:
    """An HttpServer on a free loopback port answering ``ok:`` and the body, at once or from a
    task a moment later (``slow``)."""

    async def later(request: Request) -> Response:
        await asyncio.sleep(0.05)
        return Response(200, b"ok:" + request.body)

    def handler(request: Request) -> Any:
        return later(request) if slow else Response(200, b"ok:" + request.body)

    server = HttpServer(
        handler,
        max_body_bytes=LIMIT,
        request_timeout_s=options.get("request_timeout_s", 30.0),
        keepalive_timeout_s=options.get("keepalive_timeout_s", 60.0),
    )
    await server.start("127.0.0.1", 0)
    return server


async def _talk(
    server: HttpServer, parts: list[bytes], *, half_close: bool = False, limit: float = 5.0
) -> tuple[bytes, float]:
    """Send ``parts`` (a moment apart), maybe shut down writing, and read until the server
    closes (``limit`` seconds at most): what came back, and how long it took."""
    loop = asyncio.get_running_loop()
    with socket.socket() as sock:
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", server.port))
        began = loop.time()
        for index, part in enumerate(parts):
            if index:
                await asyncio.sleep(0.02)
            await loop.sock_sendall(sock, part)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError, ConnectionResetError):
            while chunk := await asyncio.wait_for(loop.sock_recv(sock, 65536), limit):
                chunks.append(chunk)
        return b"".join(chunks), loop.time() - began


# -- half-close ----------------------------------------------------------------------------
@pytest.mark.parametrize("slow", [False, True], ids=["at-once", "from-a-task"])
def test_a_client_that_half_closes_after_asking_to_close_gets_every_answer(slow: bool) -> None:
    """``shutdown(SHUT_WR)`` after the requests (RFC 9112 lets a client end its side first):
    the FIN closed the connection at once and the answers still being made were dropped."""
    requests = _GET + _GET + b"POST /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
    requests += b"Content-Length: 2\r\n\r\nhi"

    async def main() -> None:
        server = await _serve(slow)
        reply, took = await _talk(server, [requests], half_close=True)
        assert reply.count(b"HTTP/1.1 200 OK") == 3, reply
        assert reply.endswith(b"connection: close\r\n\r\nok:hi"), reply
        assert took < 3
        # HTTP/1.0 without keep-alive says the same
        reply, _ = await _talk(server, [b"GET /x HTTP/1.0\r\n\r\n"], half_close=True)
        assert reply.startswith(b"HTTP/1.1 200 OK"), reply
        await server.close()

    asyncio.run(main())


def test_an_inference_request_half_closed_after_it_is_answered() -> None:
    """The same through the whole server: the model's answer comes back."""
    with ServerThread(test_config(), engine=FakeEngine(delay_s=0.1)) as server:
        request = raw_request(seed_body(np.full((1, 8), 0.5, np.float32)))

        async def main() -> bytes:
            loop = asyncio.get_running_loop()
            with socket.socket() as sock:
                sock.setblocking(False)
                await loop.sock_connect(sock, ("127.0.0.1", server.port))
                await loop.sock_sendall(sock, request)
                sock.shutdown(socket.SHUT_WR)
                chunks = []
                while chunk := await asyncio.wait_for(loop.sock_recv(sock, 65536), 10):
                    chunks.append(chunk)
                return b"".join(chunks)

        reply = asyncio.run(main())
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), reply
        assert len(orjson.loads(body)["outputs"][0]["data"]) == 2


def test_a_client_gone_from_a_kept_alive_connection_still_withdraws_its_request() -> None:
    """A FIN while a keep-alive request is answered is the client going away: its work is
    cancelled, as before (half-close support must not compute abandoned requests)."""
    futures: list[asyncio.Future[Response]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def handler(request: Request) -> asyncio.Future[Response]:
            futures.append(loop.create_future())
            return futures[-1]

        server = HttpServer(handler, max_body_bytes=LIMIT, request_timeout_s=30.0)
        await server.start("127.0.0.1", 0)
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(_GET)
        end = loop.time() + 5
        while not futures and loop.time() < end:
            await asyncio.sleep(0.01)
        writer.close()
        while not futures[0].cancelled() and loop.time() < end:
            await asyncio.sleep(0.01)
        assert futures[0].cancelled()
        await server.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("parts", "words"),
    [
        ([b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Le"], b"request line or headers cut short"),
        ([b"GET /x HTT"], b"request line or headers cut short"),
        (
            [b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 20\r\n\r\nhi"],
            b"body cut short after 2 bytes",
        ),
        (
            [b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"],
            b"body cut short after 2 bytes",
        ),
        ([_GET + b"GET /y HTTP/1.1\r\nHo"], b"request line or headers cut short"),
    ],
    ids=["headers", "request-line", "body", "chunked-body", "after-a-request"],
)
def test_a_client_that_half_closes_mid_request_gets_400_at_once(
    parts: list[bytes], words: bytes
) -> None:
    """It was closed without a word; now it is told why (after any earlier answer)."""

    async def main() -> None:
        server = await _serve(request_timeout_s=30.0)
        reply, took = await _talk(server, parts, half_close=True)
        assert took < 3, "waited for the request timeout"
        if parts[0].startswith(_GET):
            assert reply.startswith(b"HTTP/1.1 200 OK"), reply
            reply = reply[reply.index(b"ok:") + 3 :]
        assert reply.startswith(b"HTTP/1.1 400 "), reply
        assert b"connection: close" in reply
        assert words in reply, reply
        await server.close()

    asyncio.run(main())


# -- HTTP versions -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "request_line",
    [
        b"GET /x HTTP/2.0",
        b"GET /x HTTP/0.9",
        b"GET /x HTTP/3.0",
        b"GET /x HTTP/1.2",
        b"GET /x HTTP/9.9",
    ],
)
@pytest.mark.parametrize("connection", [b"", b"Connection: keep-alive\r\n"], ids=["", "ka"])
def test_a_version_other_than_1_1_and_1_0_gets_505_and_close(
    request_line: bytes, connection: bytes
) -> None:
    """HTTP/2.0 and 0.9 were answered 200 as if they were HTTP/1.1; 3.0 got a 400."""
    payload = request_line + b"\r\nHost: t\r\n" + connection + b"\r\n" + _GET

    async def main() -> None:
        server = await _serve()
        reply, took = await _talk(server, [payload])
        assert reply.startswith(b"HTTP/1.1 505 HTTP Version Not Supported\r\n"), reply
        assert b"connection: close\r\n" in reply
        assert b"send HTTP/1.1" in reply
        assert b" 200 " not in reply  # the request after it is not read
        assert took < 3
        await server.close()

    asyncio.run(main())


def test_http_1_0_still_works_and_keeps_alive_only_when_asked() -> None:
    async def main() -> None:
        server = await _serve()
        reply, took = await _talk(server, [b"GET /x HTTP/1.0\r\n\r\n"])
        assert reply.startswith(b"HTTP/1.1 200 OK")
        assert b"connection: close" in reply
        assert took < 3  # closed after the answer
        kept = b"GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
        reply, _ = await _talk(server, [kept, kept, b"GET /x HTTP/1.0\r\n\r\n"])
        assert reply.count(b"HTTP/1.1 200 OK") == 3, reply
        assert reply.count(b"connection: keep-alive") == 2
        assert reply.count(b"connection: close") == 1
        reply, _ = await _talk(server, [b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"])
        assert reply.startswith(b"HTTP/1.1 200 OK")
        await server.close()

    asyncio.run(main())


# -- chunk sizes -------------------------------------------------------------------------------
_CHUNKED = b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    "parts",
    [
        [_CHUNKED + b"ffffff\r\nabc"],
        [_CHUNKED + b"401\r\n"],
        [_CHUNKED + b"401;name=value\r\n"],
        [_CHUNKED + b"200\r\n" + b"x" * 512 + b"\r\n201\r\nab"],
        [_CHUNKED[:-2], b"\r\n40", b"1", b"\r", b"\nab"],
        [_CHUNKED + b"fff", b"fff\r\n", b"abc"],
        [_GET + _CHUNKED + b"7fffffff\r\n"],
    ],
    ids=["one-write", "exactly-one-over", "extension", "second-chunk", "byte-by-byte",
         "split-size", "after-a-request"],
)  # fmt: skip
def test_a_chunk_announced_over_the_body_limit_is_413_at_once(parts: list[bytes]) -> None:
    """It waited for the request timeout (408), holding the connection meanwhile."""

    async def main() -> None:
        server = await _serve(request_timeout_s=30.0)
        reply, took = await _talk(server, parts)
        assert took < 3, "waited for the request timeout"
        if parts[0].startswith(_GET):
            reply = reply[reply.index(b"ok:") + 3 :]
        assert reply.startswith(b"HTTP/1.1 413 "), reply
        assert b"connection: close\r\n" in reply
        assert b"over the limit of 1024 bytes" in reply
        await server.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    "parts",
    [
        [_CHUNKED + b"400\r\n" + b"x" * 1024 + b"\r\n0\r\n\r\n"],
        [
            _CHUNKED + b"200\r\n",
            b"x" * 512,
            b"\r\n1ff\r\n" + b"x" * 511,
            b"\r\n1\r\nx\r\n0\r\n\r\n",
        ],
        [_CHUNKED + b"0" * 80 + b"4;", b"a=b\r\nxxxx\r\n0\r\n\r\n"],
        [_CHUNKED + b"".join(b"1\r\nx\r\n" for _ in range(1024)) + b"0\r\n\r\n"],
    ],
    ids=["exactly-the-limit", "in-pieces", "leading-zeros", "many-tiny-chunks"],
)
def test_chunked_bodies_up_to_the_limit_are_read_whole(parts: list[bytes]) -> None:
    async def main() -> None:
        server = await _serve()
        payload = [p.replace(b"Host: t\r\n", b"Host: t\r\nConnection: close\r\n") for p in parts]
        reply, _ = await _talk(server, payload)
        assert reply.startswith(b"HTTP/1.1 200 OK"), reply[:300]
        assert reply.endswith(b"ok:" + b"x" * reply.count(b"x")), reply[:300]
        await server.close()

    asyncio.run(main())


# -- smuggling and malformed framing (these held already; kept so that they stay so) ----------
_FRAMING = [
    ("two content-lengths", b"Content-Length: 2\r\nContent-Length: 3\r\n\r\nhi", 400),
    ("same content-length twice", b"Content-Length: 2\r\nContent-Length: 2\r\n\r\nhi", 400),
    ("content-length list", b"Content-Length: 2, 2\r\n\r\nhi", 400),
    ("content-length and chunked", b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"0\r\n\r\n", 400),
    ("chunked and content-length", b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
     b"0\r\n\r\n", 400),
    ("chunked twice", b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"0\r\n\r\n", 400),
    ("chunked not last", b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", 400),
    ("absurd content-length", b"Content-Length: 99999999999999999999999999\r\n\r\nhi", 400),
    ("negative content-length", b"Content-Length: -1\r\n\r\nhi", 400),
    ("signed content-length", b"Content-Length: +2\r\n\r\nhi", 400),
    ("content-length over the limit", b"Content-Length: 5000\r\n\r\n", 413),
    ("space before colon", b"Content-Length : 2\r\n\r\nhi", 400),
    ("obs-fold", b"X-A: a\r\n  folded\r\n\r\n", 400),
    ("NUL in a header", b"X-A: a\x00b\r\n\r\n", 400),
    ("bare LF line ends", b"X-A: a\nX-B: b\n\n", 400),
    ("chunk size overflow", b"Transfer-Encoding: chunked\r\n\r\nfffffffffffffffffffff\r\nhi", 400),
    ("expect 100-continue over the limit", b"Expect: 100-continue\r\nContent-Length: 5000\r\n"
     b"\r\n", 413),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "tail", "status"), _FRAMING, ids=[name for name, _, _ in _FRAMING]
)
def test_ambiguous_or_malformed_framing_is_refused_and_closed(
    name: str, tail: bytes, status: int
) -> None:
    async def main() -> None:
        server = await _serve()
        payload = b"POST /x HTTP/1.1\r\nHost: t\r\n" + tail + _GET
        reply, took = await _talk(server, [payload])
        assert reply.startswith(b"HTTP/1.1 %d " % status), (name, reply)
        assert b"connection: close\r\n" in reply
        assert b"100 Continue" not in reply
        assert b" 200 " not in reply  # nothing after it is read as a request
        assert took < 3
        await server.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    "target", [b"/x\x00y", b"/x y", b"/x\x7fy", b"/x\ty"], ids=["nul", "space", "del", "tab"]
)
def test_control_characters_in_the_target_are_400(target: bytes) -> None:
    async def main() -> None:
        server = await _serve()
        reply, _ = await _talk(server, [b"GET " + target + b" HTTP/1.1\r\nHost: t\r\n\r\n"])
        assert reply.startswith(b"HTTP/1.1 400 "), reply
        await server.close()

    asyncio.run(main())


def test_a_bad_request_in_a_pipeline_is_answered_in_order_and_ends_it() -> None:
    bad = b"GET /b HTTP/1.1\r\nHost t\r\n\r\n"

    async def main() -> None:
        server = await _serve(slow=True)
        reply, _ = await _talk(server, [_GET + _GET + bad + _GET])
        statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", reply)
        assert statuses == [b"200", b"200", b"400"], reply
        await server.close()

    asyncio.run(main())


def test_slowloris_headers_get_408_while_others_are_served() -> None:
    """Headers a byte at a time never reset the clock: 408 at the request timeout."""
    closing = _GET.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")

    async def main() -> None:
        server = await _serve(request_timeout_s=1.0)
        loop = asyncio.get_running_loop()
        with socket.socket() as sock:
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", server.port))
            began = loop.time()
            trickle = iter(b"GET /x HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 1000)
            reply = b""
            for sent in range(100):  # until the answer comes (5 s at most)
                with contextlib.suppress(BlockingIOError):
                    reply = sock.recv(65536)
                if reply:
                    break
                await loop.sock_sendall(sock, bytes([next(trickle)]))
                await asyncio.sleep(0.05)
                if sent % 10 == 0:
                    other, _ = await _talk(server, [closing])
                    assert other.startswith(b"HTTP/1.1 200 "), "another client waited"
            assert reply.startswith(b"HTTP/1.1 408 "), reply
            assert 0.9 < loop.time() - began < 4
        await server.close()

    asyncio.run(main())


def test_absurdly_many_small_headers_are_bounded_by_the_head_limit() -> None:
    async def main() -> None:
        server = await _serve()
        many = b"".join(b"X-%d: a\r\n" % i for i in range(20_000))
        reply, took = await _talk(server, [b"GET /x HTTP/1.1\r\nHost: t\r\n" + many + b"\r\n"])
        assert reply.startswith(b"HTTP/1.1 431 "), reply
        assert took < 3
        await server.close()

    asyncio.run(main())
