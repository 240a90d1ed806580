"""The HTTP server's contract with a handler that answers later through a future."""

from __future__ import annotations

import asyncio
import socket
import tracemalloc
from collections.abc import Callable

from torchplace.serve.http import Handler, HttpServer, Request, Response

_GET = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"


async def _serve(futures: list[asyncio.Future[Response]], timeout_s: float = 30.0) -> HttpServer:
    loop = asyncio.get_running_loop()

    def handler(request: Request) -> asyncio.Future[Response]:
        future: asyncio.Future[Response] = loop.create_future()
        futures.append(future)
        return future

    return await _serve_with(handler, request_timeout_s=timeout_s)


async def _serve_with(handler: Handler, **options: float) -> HttpServer:
    settings: dict[str, float] = {"max_body_bytes": 1024, "request_timeout_s": 30.0, **options}
    server = HttpServer(
        handler,
        max_body_bytes=int(settings["max_body_bytes"]),
        request_timeout_s=settings["request_timeout_s"],
        keepalive_timeout_s=settings.get("keepalive_timeout_s", 60.0),
    )
    await server.start("127.0.0.1", 0)
    return server


async def _read_all(reader: asyncio.StreamReader, limit: float = 5.0) -> bytes:
    """Everything until the server closes the connection (within ``limit`` seconds)."""
    return await asyncio.wait_for(reader.read(), limit)


async def _exchange(server: HttpServer, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(payload)
    try:
        return await _read_all(reader)
    finally:
        writer.close()


async def _until(check: Callable[[], object], limit: float = 5.0) -> None:
    end = asyncio.get_running_loop().time() + limit
    while not check():
        assert asyncio.get_running_loop().time() < end, "timed out"
        await asyncio.sleep(0.01)


async def _connected(server: HttpServer, receive_buffer: int = 0) -> socket.socket:
    """A non-blocking socket connected to ``server``; a small ``receive_buffer`` makes a client
    whose unread answers back up quickly."""
    sock = socket.socket()
    if receive_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.port))
    return sock


async def _sent(
    futures: list[asyncio.Future[Response]], timeout_s: float = 30.0
) -> tuple[HttpServer, asyncio.StreamReader, asyncio.StreamWriter]:
    """A server, and a connection whose GET its handler has taken (a future in ``futures``)."""
    server = await _serve(futures, timeout_s)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(_GET)
    await _until(lambda: futures)
    return server, reader, writer


def test_a_future_settled_later_is_the_answer_and_nothing_else_runs_a_task() -> None:
    async def main() -> None:
        futures: list[asyncio.Future[Response]] = []
        server, reader, writer = await _sent(futures)
        assert server.in_flight == 1
        assert asyncio.all_tasks() == {asyncio.current_task()}  # the server made no task
        futures[0].set_result(Response(200, b'{"ok":true}'))
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert await reader.readexactly(11) == b'{"ok":true}'
        await _until(lambda: server.in_flight == 0)
        writer.close()
        await server.close()

    asyncio.run(main())


def test_a_client_that_goes_away_cancels_the_future() -> None:
    async def main() -> None:
        futures: list[asyncio.Future[Response]] = []
        server, _, writer = await _sent(futures)
        writer.close()
        await _until(futures[0].cancelled)
        await server.close()

    asyncio.run(main())


def test_a_request_past_its_timeout_cancels_the_future_and_gets_503() -> None:
    async def main() -> None:
        futures: list[asyncio.Future[Response]] = []
        server, reader, writer = await _sent(futures, timeout_s=0.2)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)  # the 1 s ticker
        assert head.startswith(b"HTTP/1.1 503")
        assert b"retry-after: 1" in head
        assert futures[0].cancelled()
        writer.close()
        await server.close()

    asyncio.run(main())


def test_a_pipelining_client_is_read_no_further_than_a_body_limit_of_waiting_requests() -> None:
    """While a request is answered, the connection's waiting requests may hold a body limit
    (1,024 bytes here) at most: then reading stops until they are answered, in order."""

    async def main() -> None:
        futures: list[asyncio.Future[Response]] = []
        server, reader, writer = await _sent(futures)
        (connection,) = server.connections
        post = b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 600\r\n\r\n" + b"x" * 600
        for sent in range(5):
            writer.write(post)
            await writer.drain()
            if sent < 2:  # one packet each, so that the server stops between them
                await _until(lambda n=sent + 1: len(connection._pending) == n)
        await asyncio.sleep(0.1)  # time to read the rest, were it to
        assert len(connection._pending) == 2  # 1,200 bytes waiting: the rest is not read
        assert connection._paused_reading
        for answered in range(6):
            await _until(lambda n=answered: len(futures) > n)
            futures[answered].set_result(Response(200, b"%d" % answered))
        for answered in range(6):
            await reader.readuntil(b"\r\n\r\n")
            assert await reader.readexactly(1) == b"%d" % answered
        assert not connection._paused_reading
        writer.close()
        await server.close()

    asyncio.run(main())


def test_a_client_that_reads_no_answers_is_read_no_further_and_dropped_after_the_timeout() -> None:
    """While the answers pile up unread (the write buffer over its high-water mark), nothing
    more is read from the connection; stalled past the request timeout, it is closed."""
    big = Response(200, b"x" * (16 << 20))  # more than the kernel's socket buffers take

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await _serve_with(lambda request: big, request_timeout_s=0.5)
        with await _connected(server, 4096) as sock:
            await loop.sock_sendall(sock, _GET * 3)
            await _until(lambda: any(c._write_paused for c in server.connections))
            (connection,) = server.connections
            assert connection._paused_reading  # its answers wait: it is not read
            waiting = len(connection._pending)
            await loop.sock_sendall(sock, b"POST /x HTTP/1.1\r\nHost: t\r\n\r\n" + _GET)
            await asyncio.sleep(0.2)
            assert len(connection._pending) == waiting
            await _until(lambda: not server.connections)  # 0.5 s stalled, and the 1 s ticker
        await server.close()

    asyncio.run(main())


def test_a_body_of_many_small_chunks_is_held_in_one_buffer_up_to_the_limit_exactly() -> None:
    size = 512 * 1024
    bodies: list[bytes] = []

    def handler(request: Request) -> Response:
        bodies.append(request.body)
        return Response(200)

    head = b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    # each chunk a bytes object of its own in the parser; 65,536 of them, the most a body may
    # have (http._MAX_CHUNKS)
    payload = head + b"8\r\nxxxxxxxx\r\n" * (size // 8) + b"0\r\n\r\n"

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await _serve_with(handler, max_body_bytes=size)
        with await _connected(server) as sock:
            tracemalloc.start()
            try:
                await loop.sock_sendall(sock, payload)
                await _until(lambda: bodies)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak < 4 * size, peak  # one buffer, not a quarter of a million objects
            assert bodies == [b"x" * size]
            assert type(bodies[0]) is bytes
        over = await _exchange(server, head + b"%x\r\n%s\r\n1\r\nx\r\n" % (size, b"x" * size))
        assert over.startswith(b"HTTP/1.1 413")
        assert b"over the limit of %d bytes" % size in over
        await server.close()

    asyncio.run(main())


def test_a_refused_request_is_answered_after_the_requests_before_it() -> None:
    """RFC 9112, 9.3.2: answers in request order. A malformed request, or one over the body
    limit, pipelined behind one being answered: that one's answer first, then the refusal."""
    refused = [
        (b"GET /x HTTP/1.1\r\nHost x\r\n\r\n", b"HTTP/1.1 400", b"malformed"),
        (b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n", b"HTTP/1.1 413", b"5000"),
    ]

    async def main(second: bytes, status: bytes, words: bytes) -> None:
        futures: list[asyncio.Future[Response]] = []
        server = await _serve(futures)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(_GET + second)
        await _until(lambda: futures)
        await asyncio.sleep(0.1)
        (connection,) = server.connections
        assert not futures[0].cancelled()
        assert connection._paused_reading  # nothing after the refused request is read
        futures[0].set_result(Response(200, b'"first"'))
        reply = await _read_all(reader)
        first, _, rest = reply.partition(b'"first"')
        assert first.startswith(b"HTTP/1.1 200")
        assert rest.startswith(status)
        assert words in rest
        assert b"connection: close" in rest
        writer.close()
        await server.close()

    for second, status, words in refused:
        asyncio.run(main(second, status, words))


def test_empty_lines_do_not_keep_a_connection_open() -> None:
    """Blank lines between requests are not activity: the idle connection closes after the
    keep-alive timeout; a request begun after them must still arrive within the request one."""

    async def main() -> None:
        server = await _serve_with(
            lambda request: Response(200), keepalive_timeout_s=0.5, request_timeout_s=0.5
        )
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)

        async def blank_lines() -> None:
            while True:
                writer.write(b"\r\n")
                await asyncio.sleep(0.2)

        task = asyncio.get_running_loop().create_task(blank_lines())
        try:
            assert await _read_all(reader, 4.0) == b""  # closed, nothing said
        finally:
            task.cancel()
            writer.close()
        begun = await _exchange(server, b"\r\n\r\nGET /x HTT")
        assert begun.startswith(b"HTTP/1.1 408")
        await server.close()

    asyncio.run(main())


def test_100_continue_goes_only_to_an_http_1_1_request_still_waiting_for_it_in_order() -> None:
    ask = b"Host: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n"

    async def main() -> None:
        futures: list[asyncio.Future[Response]] = []
        server = await _serve(futures)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        # pipelined behind an unanswered GET, body not sent: its 100 comes after that answer
        writer.write(_GET + b"POST /x HTTP/1.1\r\n" + ask + b"\r\n")
        await _until(lambda: futures)
        futures[0].set_result(Response(200, b"1"))
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        assert await reader.readexactly(1) == b"1"
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        # its body, then one that asks for 100 with no body and is answered in turn: no 100
        writer.write(b"hello" + b"GET /x HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n\r\n")
        await _until(lambda: len(futures) == 2)
        futures[1].set_result(Response(200, b"2"))
        await _until(lambda: len(futures) == 3)
        futures[2].set_result(Response(200, b"3", close=True))
        rest = await _read_all(reader)
        assert b"100 Continue" not in rest
        assert rest.count(b"HTTP/1.1 200") == 2
        writer.close()
        # HTTP/1.0 never gets a 1xx (RFC 9110, 15.2)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /x HTTP/1.0\r\n" + ask + b"\r\nhello")
        await _until(lambda: len(futures) == 4)
        futures[3].set_result(Response(200, b"4"))
        assert (await _read_all(reader)).startswith(b"HTTP/1.1 200")
        writer.close()
        await server.close()

    asyncio.run(main())


def test_framing_that_rfc_9112_forbids_is_refused_and_the_connection_closed() -> None:
    then = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"  # never answered: the connection closes first
    chunked = b"\r\n\r\n2\r\nok\r\n0\r\n\r\n" + then
    cases = [
        (b"GET /x HTTP/1.1\r\n\r\n" + then, b"400", b"no Host header"),
        (b"GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n" + then, b"400", b"more than one Host"),
        (
            b"POST /x HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked" + chunked,
            b"400",
            b"HTTP/1.0",
        ),
        (
            b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked" + chunked,
            b"501",
            b"gzip",
        ),
    ]

    async def main() -> None:
        server = await _serve_with(lambda request: Response(200, b"ok"))
        for payload, status, words in cases:
            reply = await _exchange(server, payload)
            assert reply.startswith(b"HTTP/1.1 " + status), (payload, reply)
            assert words in reply
            assert b"HTTP/1.1 200" not in reply
        assert (await _exchange(server, b"GET /x HTTP/1.0\r\n\r\n")).startswith(b"HTTP/1.1 200")
        await server.close()

    asyncio.run(main())


def test_an_unknown_method_is_501_and_garbage_is_400() -> None:
    """RFC 9110, 9.1: a method the server does not recognize is 501, not a malformed request;
    a request line that is not one stays a 400."""
    first = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"
    cases = [
        (b"BREW /pot HTTP/1.1\r\nHost: t\r\n\r\n", b"501", b"'BREW' is not implemented"),
        (first + b"FROB /x HTTP/1.1\r\nHost: t\r\n\r\n", b"501", b"'FROB'"),  # pipelined
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"400", b"malformed HTTP request"),
        (b"G@T /x HTTP/1.1\r\nHost: t\r\n\r\n", b"400", b"malformed HTTP request"),
    ]

    async def main() -> None:
        server = await _serve_with(lambda request: Response(200, b"ok"))
        for payload, status, words in cases:
            reply = await _exchange(server, payload)
            last = reply[reply.rfind(b"HTTP/1.1 ") :]
            assert last.startswith(b"HTTP/1.1 " + status), (payload, reply)
            assert words in last, reply
            assert b"connection: close" in last.lower()
        await server.close()

    asyncio.run(main())


def test_a_client_reading_a_large_answer_steadily_gets_all_of_it_past_the_timeout() -> None:
    """The stall clock restarts whenever the client takes some of its answer: a slow but steady
    reader is not a gone one (it was dropped after the request timeout, mid-answer)."""
    size = 6 << 20
    big = Response(200, b"x" * size)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await _serve_with(lambda request: big, request_timeout_s=0.5)
        with await _connected(server, 65536) as sock:
            await loop.sock_sendall(
                sock, b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
            )
            got = 0
            began = loop.time()
            while chunk := await loop.sock_recv(sock, 65536):
                got += len(chunk)
                await asyncio.sleep(0.02)  # about 3 MB/s at most: seconds for the answer
            assert loop.time() - began > 1.0  # longer than the timeout, twice over
            assert got > size  # the whole body (and its head) arrived
        await server.close()

    asyncio.run(main())


def test_a_request_the_server_stopped_reading_is_not_timed_out_as_slow() -> None:
    """Queue full: the server stops reading, with the next request half read. Answering the
    queue takes longer than the request timeout; that request is still answered, not 408."""

    async def slow(request: Request) -> Response:
        await asyncio.sleep(0.1)
        return Response(200)

    async def main() -> None:
        server = await _serve_with(slow, request_timeout_s=0.5)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(_GET * 40 + _GET[:10])  # 40 x 0.1 s of answers: past the timeout
        await asyncio.sleep(0.2)
        writer.write(_GET[10:].replace(b"Host: t", b"Host: t\r\nConnection: close"))
        answers = await _read_all(reader, limit=10.0)
        writer.close()
        assert answers.count(b"HTTP/1.1 200") == 41
        assert b" 408 " not in answers
        await server.close()

    asyncio.run(main())
