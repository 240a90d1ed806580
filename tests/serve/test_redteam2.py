"""More hostile and odd clients: each case found by red-teaming a running server, each fixed.

Every request here gets a clear answer; afterwards the server still answers correctly.
"""

from __future__ import annotations

import asyncio
import os
import tracemalloc
import uuid
from pathlib import Path

import numpy as np
import orjson
import pytest

from torchplace.errors import PayloadTooLargeError
from torchplace.models import embedded_model
from torchplace.serve.http import (
    MAX_ERROR_CHARS,
    HttpServer,
    Request,
    Response,
    error_response,
)
from torchplace.serve.protocol_v1 import decode_predict_request
from torchplace.serve.running import ServerThread

from .conftest import (
    INFER,
    StartServer,
    eventually,
    exchange,
    raw_request,
    seed_body,
    seed_input,
)

_GOOD = orjson.dumps({"inputs": [seed_input()]})


def _answer(port: int, payload: bytes) -> tuple[int, bytes]:
    """The status and body of the one answer to ``payload``."""
    reply = exchange(port, payload)
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _still_serves(port: int) -> None:
    status, body = _answer(port, raw_request(_GOOD))
    assert status == 200, body
    assert orjson.loads(body)["outputs"][0]["shape"] == [1, 2]


# -- KServe V1: a columnar body is refused past the rows limit before its rows are built -------
def test_a_columnar_v1_body_past_the_rows_limit_is_refused_before_its_rows_are_built() -> None:
    """``{"inputs": {"input": [0, 0, ...]}}`` of a million rows (2 MB) built a million row
    objects (200 MB; a 64 MB body took gigabytes and half a minute of the event loop) before
    the rows limit refused it."""
    spec = embedded_model("seed-mlp")
    rows = 1_000_000
    body = b'{"inputs":{"input":[' + b"0," * (rows - 1) + b"0]}}"
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLargeError, match=f"{rows} instances is over the limit"):
            decode_predict_request(body, inputs=spec.inputs, outputs=spec.outputs, max_rows=4096)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 << 20, f"{peak >> 20} MB held to refuse a {len(body) >> 20} MB body"


def test_a_columnar_v1_body_past_the_rows_limit_is_413_over_http(
    hostile_server: ServerThread,
) -> None:
    body = b'{"inputs":{"input":[' + b"0," * 5000 + b"0]}}"
    status, answer = _answer(
        hostile_server.port, raw_request(body, path=b"/v1/models/seed-mlp:predict")
    )
    assert status == 413, answer
    assert b"5001 instances is over the limit of 4096 rows" in answer
    _still_serves(hostile_server.port)


# -- the large-body budget holds for a request that asks for a protocol upgrade ----------------
def test_an_upgrade_request_s_large_body_counts_against_the_body_budget() -> None:
    """An ``Upgrade`` request's body is read after the parser hands the request over; its
    reservation in the body budget was given back then, before the body came: many such
    clients could each make the server hold a body limit, past the budget."""

    async def main() -> None:
        server = HttpServer(
            lambda request: Response(200, b"ok %d" % len(request.body)),
            max_body_bytes=4 << 20,
            request_timeout_s=30.0,
        )
        server.body_budget = 3 << 20
        await server.start("127.0.0.1", 0)
        size = 2 << 20
        head = (
            b"POST /x HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Content-Length: %d\r\n\r\n" % size
        )
        first_r, first_w = await asyncio.open_connection("127.0.0.1", server.port)
        second_r, second_w = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            first_w.write(head + b"a" * (size // 2))
            await first_w.drain()
            await asyncio.sleep(0.2)
            assert server.body_reading == size  # held while the body comes
            second_w.write(head)
            await second_w.drain()
            await eventually(lambda: server.body_waiting)
            assert len(server.body_waiting) == 1  # over the budget: waits its turn
            first_w.write(b"a" * (size - size // 2))
            assert b"ok %d" % size in await asyncio.wait_for(first_r.readuntil(b"ok %d" % size), 5)
            second_w.write(b"b" * size)
            assert b"ok %d" % size in await asyncio.wait_for(second_r.readuntil(b"ok %d" % size), 5)
            await eventually(lambda: not server.body_reading)
            assert server.body_reading == 0
            assert not server.body_waiting
        finally:
            first_w.close()
            second_w.close()
            await server.close()

    asyncio.run(asyncio.wait_for(main(), 30))


# -- a handler whose work was cancelled by something else is still answered --------------------
def test_a_request_whose_work_is_cancelled_elsewhere_is_answered_503_and_the_next_served() -> None:
    """A handler's coroutine that ended cancelled, not by the server (the work it awaited was
    cancelled: a load's task, an engine's future), was taken for a client gone away: no answer,
    and the requests pipelined after it waited until the connection idled out."""

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def handler_coro(request: Request) -> Response:
            if request.path == b"/cancelled":
                work: asyncio.Future[None] = loop.create_future()
                loop.call_later(0.01, work.cancel)
                await work
            return Response(200, b"ok")

        server = HttpServer(handler_coro, max_body_bytes=1 << 20, request_timeout_s=30.0)
        await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(
                b"GET /cancelled HTTP/1.1\r\nHost: t\r\n\r\n"
                b"GET /fine HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
            )
            answers = await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
            await server.close()
        first, _, second = answers.partition(b"HTTP/1.1 200")
        assert first.startswith(b"HTTP/1.1 503 "), answers
        assert b"the request was cancelled before it was answered; retry" in first
        assert b"retry-after: 1" in first
        assert second.endswith(b"ok"), answers
        assert server.in_flight == 0

    asyncio.run(asyncio.wait_for(main(), 30))


# -- the request target -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("target", "method", "body"),
    [
        (INFER + b"#results", b"POST", _GOOD),
        (INFER + b"?a=1#b?c", b"POST", _GOOD),
        (b"/v2/health/ready#", b"GET", b""),
    ],
)
def test_a_fragment_in_the_request_target_is_not_part_of_the_route(
    hostile_server: ServerThread, target: bytes, method: bytes, body: bytes
) -> None:
    """A fragment is the client's own (RFC 3986, 3.5): it was read as part of the path (404
    "no route .../infer#results", or an unknown model 'seed-mlp#infer')."""
    status, answer = _answer(hostile_server.port, raw_request(body, path=target, method=method))
    assert status == 200, answer


def test_options_asterisk_says_the_methods_and_another_method_on_it_is_400(
    hostile_server: ServerThread,
) -> None:
    """``OPTIONS *`` (RFC 9110, 9.3.7) was a 404 "no route *", and so was ``GET *``, which the
    asterisk-form does not allow (RFC 9112, 3.2.4)."""
    reply = exchange(hostile_server.port, raw_request(b"", method=b"OPTIONS", path=b"*"))
    assert reply.startswith(b"HTTP/1.1 200 "), reply
    assert b"\r\nallow: GET, HEAD, POST\r\n" in reply
    assert reply.endswith(b"\r\n\r\n")  # no body
    for method in (b"GET", b"POST"):
        status, answer = _answer(hostile_server.port, raw_request(b"", method=method, path=b"*"))
        assert status == 400, answer
        assert b"the request target '*' is only for OPTIONS" in answer


# -- bodies that are not UTF-8 ----------------------------------------------------------------
_DOC = '{"inputs":[{"name":"input","datatype":"FP32","shape":[1,8],"data":[0,0,0,0,0,0,0,0]}]}'


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (_DOC.encode("utf-16"), b"the body is UTF-16 (it starts with a UTF-16 byte order mark)"),
        (_DOC.encode("utf-32"), b"the body is UTF-32"),
        (_DOC.encode("utf-16-le"), b"it looks UTF-16 or UTF-32 encoded"),
        (b'{"id":"\xff\xfe",' + _DOC.encode()[1:], b"byte 7 (ff) is not valid UTF-8"),
        (b'{"id":"caf\xe9",' + _DOC.encode()[1:], b"byte 10 (e9) is not valid UTF-8"),
    ],
    ids=["utf-16", "utf-32", "utf-16 without a mark", "invalid byte", "latin-1"],
)
def test_a_body_that_is_not_utf8_is_told_so_and_where(
    hostile_server: ServerThread, body: bytes, said: bytes
) -> None:
    """orjson's words were "str is not valid UTF-8: surrogates not allowed: line 1 column 1
    (char 0)" for any of these: no surrogate was sent, and the place was wrong."""
    status, answer = _answer(hostile_server.port, raw_request(body))
    assert status == 400, answer
    assert said in answer
    assert b"send as UTF-8" in answer or b"sent as UTF-8" in answer
    assert b"surrogate" not in answer
    _still_serves(hostile_server.port)


def test_invalid_utf8_in_a_v1_or_repository_body_is_told_the_same(
    hostile_server: ServerThread,
) -> None:
    body = b'{"instances":[["\xff"]]}'
    for path in (b"/v1/models/seed-mlp:predict", b"/v2/repository/index"):
        status, answer = _answer(hostile_server.port, raw_request(body, path=path))
        assert status == 400, answer
        assert b"byte 16 (ff) is not valid UTF-8" in answer, answer


# -- values quoted in error messages are cut, not echoed back whole ----------------------------
_MANY = [7] * 20_000


@pytest.mark.parametrize(
    ("entry", "extra", "said"),
    [
        (seed_input(shape=[-1] * 20_000), {}, b"got [-1, -1, -1,"),
        (seed_input(shape=[1] * 20_000), {}, b"got [1,1,1,1,"),
        (seed_input(datatype="F" * 50_000), {}, b"data-type is 'FFFF"),
        (seed_input(name="n" * 50_000), {}, b"unexpected inference input 'nnnn"),
        (seed_input(), {"outputs": [{"name": "o" * 50_000}]}, b"inference output 'oooo"),
        (seed_input(), {"parameters": {"timeout": _MANY}}, b"got [7, 7, 7,"),
        (
            seed_input(),
            {"outputs": [{"name": "output", "parameters": {"classification": _MANY}}]},
            b"got [7, 7, 7,",
        ),
    ],
    ids=["shape", "shape too long", "datatype", "input", "output", "timeout", "classification"],
)
def test_a_huge_value_is_quoted_cut_in_its_error(
    hostile_server: ServerThread, entry: dict[str, object], extra: dict[str, object], said: bytes
) -> None:
    """Each was quoted whole: a 60 KB shape came back as a 100 KB message (a 9 MB one as 30 MB,
    after a second of the event loop spent on its repr)."""
    body = orjson.dumps({"inputs": [entry], **extra})
    status, answer = _answer(hostile_server.port, raw_request(body))
    assert status == 400, answer[:300]
    assert said in answer
    assert len(answer) < 1000, f"a {len(body)}-byte request got a {len(answer)}-byte error"


def test_a_binary_data_size_that_is_not_a_number_is_quoted_cut(
    hostile_server: ServerThread,
) -> None:
    header = orjson.dumps(
        {"inputs": [seed_input(data=None, parameters={"binary_data_size": _MANY})]}
    )
    payload = raw_request(
        header + bytes(32),
        headers={
            b"Content-Type": b"application/octet-stream",
            b"Inference-Header-Content-Length": str(len(header)).encode(),
        },
    )
    status, answer = _answer(hostile_server.port, payload)
    assert status == 400, answer[:300]
    assert b"Expected 32, got [7, 7," in answer
    assert len(answer) < 1000


def test_a_columnar_v1_body_of_many_uneven_inputs_is_quoted_cut(
    hostile_server: ServerThread,
) -> None:
    columns = {"input": [[0.5] * 8], **{f"x{i}": [0, 0] for i in range(3000)}}
    body = orjson.dumps({"inputs": columns})
    status, answer = _answer(
        hostile_server.port, raw_request(body, path=b"/v1/models/seed-mlp:predict")
    )
    assert status == 400, answer[:300]
    assert b"the same number of rows; got {'input': 1, 'x0': 2," in answer
    assert len(answer) < 1000


def test_an_error_message_is_answered_cut_to_a_bound() -> None:
    response = error_response(400, "x" * 100_000)
    message = orjson.loads(response.body)["error"]
    assert message.startswith("x" * MAX_ERROR_CHARS)
    assert message.endswith(f"... ({100_000 - MAX_ERROR_CHARS} more characters)")
    assert error_response(400, "short").body == b'{"error":"short"}'


# -- shared memory: a region's name in the path is percent-decoded once --------------------------
@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_a_region_name_in_the_path_is_percent_decoded_once(start_server: StartServer) -> None:
    """tritonclient quotes the region name into the path: 'r%41' comes as 'r%2541'. The path
    was decoded twice, so the region was registered as 'rA' and the client's requests naming
    'r%41' did not find it."""
    key = f"torchplace-test-{uuid.uuid4().hex}"
    Path("/dev/shm", key).write_bytes(bytes(64))
    try:
        server = start_server(allow_client_shm=True)
        region = b"/v2/systemsharedmemory/region/r%2541"
        register = orjson.dumps({"key": f"/{key}", "offset": 0, "byte_size": 32})
        status, answer = _answer(server.port, raw_request(register, path=region + b"/register"))
        assert status == 200, answer
        status, answer = _answer(
            server.port, raw_request(b"", method=b"GET", path=region + b"/status")
        )
        assert status == 200, answer
        assert [r["name"] for r in orjson.loads(answer)] == ["r%41"]
        status, answer = _answer(server.port, raw_request(b"", path=region + b"/unregister"))
        assert status == 200, answer
        status, answer = _answer(
            server.port, raw_request(b"", method=b"GET", path=b"/v2/systemsharedmemory/status")
        )
        assert orjson.loads(answer) == []
    finally:
        os.unlink(Path("/dev/shm", key))


def test_still_serving_after_all_of_the_above(hostile_server: ServerThread) -> None:
    body = seed_body(np.full((3, 8), 0.25, np.float32))
    status, answer = _answer(hostile_server.port, raw_request(body))
    assert status == 200, answer
    assert orjson.loads(answer)["outputs"][0]["shape"] == [3, 2]
