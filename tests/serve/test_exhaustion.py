"""Resource exhaustion next to well-behaved clients: file descriptors, huge request ids."""

from __future__ import annotations

import asyncio
import socket

import orjson
import pytest

from tests.serve.conftest import Running, eventually, exchange, raw_request, seed_input
from torchplace.serve.http import HttpServer, Request, Response, connection_limit
from torchplace.serve.protocol import MAX_ID_CHARS

_GET = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"


async def _answered(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_GET)
        return await asyncio.wait_for(reader.readuntil(b"ok"), 5.0)
    finally:
        writer.close()


async def _closed(sock: socket.socket, loop: asyncio.AbstractEventLoop) -> bool:
    """Whether the server closed ``sock`` (EOF or reset within a moment)."""
    try:
        return await asyncio.wait_for(loop.sock_recv(sock, 1), 0.5) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_connections_over_the_limit_shed_the_quietest_so_new_clients_are_served() -> None:
    """Idle sockets (and a slowloris) that would take every file descriptor: past the limit the
    quietest connections with no answer due are closed, the oldest first, and a client that
    sends a request is still answered (without the limit, accept() meets EMFILE)."""

    async def main() -> None:
        def handler(request: Request) -> Response:
            return Response(200, b"ok")

        server = HttpServer(handler, max_body_bytes=1024, request_timeout_s=30.0)
        server.max_connections = 40
        await server.start("127.0.0.1", 0)
        loop = asyncio.get_running_loop()
        idle: list[socket.socket] = []
        try:
            for i in range(120):  # three times the limit, each silent (one a slowloris)
                sock = socket.socket()
                sock.setblocking(False)
                await loop.sock_connect(sock, ("127.0.0.1", server.port))
                if i == 0:
                    await loop.sock_sendall(sock, b"GET /x HTTP/1.1\r\n")
                idle.append(sock)
                await asyncio.sleep(0.001)
            for _ in range(5):
                assert b"200" in await _answered(server.port)
            assert len(server.connections) <= 40 + 1
            assert await _closed(idle[0], loop)  # the oldest went first
            assert not await _closed(idle[-1], loop)  # the newest stays
        finally:
            for sock in idle:
                sock.close()
            await server.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_connection_with_an_answer_due_is_never_shed() -> None:
    async def main() -> None:
        futures: list[asyncio.Future[Response]] = []

        def handler(request: Request) -> asyncio.Future[Response]:
            future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
            futures.append(future)
            return future

        server = HttpServer(handler, max_body_bytes=1024, request_timeout_s=30.0)
        server.max_connections = 8
        await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(_GET)
        idle: list[socket.socket] = []
        try:
            for _ in range(50):
                if futures:
                    break
                await asyncio.sleep(0.01)
            for _ in range(30):
                idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
                await asyncio.sleep(0.001)
            futures[0].set_result(Response(200, b"ok"))
            assert b"200" in await asyncio.wait_for(reader.readuntil(b"ok"), 5.0)
        finally:
            writer.close()
            for sock in idle:
                sock.close()
            await server.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_the_connection_limit_leaves_file_descriptors_in_reserve() -> None:
    resource = pytest.importorskip("resource")
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = connection_limit()
    if soft != resource.RLIM_INFINITY:
        assert 16 <= limit <= max(soft - 128, 16)


def test_a_huge_request_id_is_refused_not_echoed(server: Running) -> None:
    body = orjson.dumps({"id": "x" * (MAX_ID_CHARS + 1), "inputs": [seed_input()]})
    answer = exchange(server.port, raw_request(body))
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"over the limit of 4096" in answer
    assert len(answer) < 1024  # not echoed
    for extra in ({"parameters": {}}, {}):  # the general path and the quick one
        body = orjson.dumps({"id": "y" * MAX_ID_CHARS, "inputs": [seed_input()], **extra})
        assert exchange(server.port, raw_request(body)).startswith(b"HTTP/1.1 200")


def test_a_huge_grpc_request_id_is_refused() -> None:
    pytest.importorskip("google.protobuf")
    from torchplace.errors import InputError
    from torchplace.models import TensorSpec
    from torchplace.serve.grpc_codec import decode_infer_request
    from torchplace.serve.proto import grpc_service_pb2 as pb

    message = pb.ModelInferRequest(model_name="m", id="z" * (MAX_ID_CHARS + 1))
    tensor = message.inputs.add(name="input", datatype="FP32", shape=[1, 8])
    tensor.contents.fp32_contents.extend([0.5] * 8)
    with pytest.raises(InputError, match="over the limit of 4096"):
        decode_infer_request(
            message,
            inputs=(TensorSpec("input", "FP32", (-1, 8)),),
            outputs=(TensorSpec("output", "FP32", (-1, 2)),),
            max_rows=64,
        )


def test_large_bodies_read_at_once_are_bounded_and_small_requests_pass() -> None:
    """Clients that send large bodies slowly (or all at once) do not make the server hold more
    than its body budget: past it, a large body waits for those being read; a small request is
    answered meanwhile; the waiting one is read and answered once the first is in."""

    async def main() -> None:
        def handler(request: Request) -> Response:
            return Response(200, b"ok %d" % len(request.body))

        server = HttpServer(handler, max_body_bytes=4 << 20, request_timeout_s=30.0)
        server.body_budget = 3 << 20
        await server.start("127.0.0.1", 0)
        size = 2 << 20
        head = b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % size
        first_r, first_w = await asyncio.open_connection("127.0.0.1", server.port)
        second_r, second_w = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            first_w.write(head + b"a" * (size - 1))  # all but its last byte
            await first_w.drain()
            await eventually(lambda: server.body_reading)
            assert server.body_reading == size
            second_w.write(head + b"b" * size)  # whole, but over the budget: waits
            await eventually(lambda: server.body_waiting)
            assert len(server.body_waiting) == 1
            assert server.body_reading <= server.body_budget
            assert b"200" in await _answered(server.port)  # small requests are not held up
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(second_r.readuntil(b"ok"), 0.3)
            first_w.write(b"a")
            assert b"200" in await asyncio.wait_for(first_r.readuntil(b"ok"), 5.0)
            answer = await asyncio.wait_for(second_r.readuntil(b"ok %d" % size), 5.0)
            assert b"200" in answer
            await eventually(lambda: not server.body_reading)
            assert server.body_reading == 0
            assert not server.body_waiting
        finally:
            first_w.close()
            second_w.close()
            await server.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_client_that_goes_away_mid_body_gives_its_budget_back() -> None:
    async def main() -> None:
        server = HttpServer(
            lambda request: Response(200, b"ok"), max_body_bytes=4 << 20, request_timeout_s=30.0
        )
        await server.start("127.0.0.1", 0)
        try:
            for _ in range(3):
                _, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 3000000\r\n\r\nab")
                await writer.drain()
                await eventually(lambda: server.body_reading)
                assert server.body_reading == 3000000
                writer.transport.abort()
                await eventually(lambda: not server.body_reading)
                assert server.body_reading == 0
        finally:
            await server.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_serving_raises_the_soft_open_file_limit_to_the_hard_one() -> None:
    resource = pytest.importorskip("resource")
    import subprocess
    import sys

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip("the hard limit is too low to tell")
    code = (
        "import resource; from torchplace.serve.http import raise_fd_limit; "
        "raise_fd_limit(); print(*resource.getrlimit(resource.RLIMIT_NOFILE))"
    )

    def lowered() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    out = subprocess.run(
        [sys.executable, "-c", code],
        preexec_fn=lowered,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert int(out[0]) > 256
    assert int(out[1]) == hard
