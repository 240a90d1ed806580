"""The HTTP server's contract with a handler that answers later through a future."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from torchplace.serve.http import HttpServer, Request, Response

_GET = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"


async def _serve(futures: list[asyncio.Future[Response]], timeout_s: float = 30.0) -> HttpServer:
    loop = asyncio.get_running_loop()

    def handler(request: Request) -> asyncio.Future[Response]:
        future: asyncio.Future[Response] = loop.create_future()
        futures.append(future)
        return future

    server = HttpServer(handler, max_body_bytes=1024, request_timeout_s=timeout_s)
    await server.start("127.0.0.1", 0)
    return server


async def _until(check: Callable[[], object], limit: float = 5.0) -> None:
    end = asyncio.get_running_loop().time() + limit
    while not check():
        assert asyncio.get_running_loop().time() < end, "timed out"
        await asyncio.sleep(0.01)


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
