"""Differential fuzzing of the HTTP server's fast paths against its general ones.

The same byte stream must be answered the same, byte for byte, however it is cut into reads
(whole, at every single byte boundary, a byte at a time: the body's one-part fast path against
its gathering buffer, a chunked body's size line found across reads, the cached ``Host``), and
whether each request is handed to the handler at once (nothing waiting: no queue) or waits in
the pipeline queue behind an answer still due (a handler that answers later).

The connection is driven in memory (:class:`_Wire`, a transport that honours ``pause_reading``),
so a run is microseconds and every cut of a stream can be tried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson
from hypothesis import given
from hypothesis import strategies as st

from tests.serve.fuzzing import FUZZ
from torchplace.serve.http import HttpServer, Request, Response

#: the body limit of the server under test: small, so that generated bodies cross it
_LIMIT = 96
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class _Wire:
    """An in-memory transport: what is written is kept; reading pauses as the server asks."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.paused = False
        self.closed = False

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.out += data

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None: ...

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


def _echo(request: Request) -> Response:
    """What the server handed over, as the answer (the receive time aside)."""
    seen = {
        "method": request.method.decode("latin-1"),
        "path": request.path.decode("latin-1"),
        "query": request.query.decode("latin-1"),
        "headers": sorted(
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.items()
        ),
        "body": request.body.decode("latin-1"),
        "keep_alive": request.keep_alive,
    }
    return Response(200, orjson.dumps(seen))


def _drive(pieces: Sequence[bytes], *, later: bool) -> bytes:
    """Everything the server writes for ``pieces`` fed one read each, the handler answering at
    once or (``later``) through a future settled only once no more can be read."""

    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        due: list[tuple[asyncio.Future[Response], Request]] = []

        def handler(request: Request) -> Response | asyncio.Future[Response]:
            if not later:
                return _echo(request)
            future: asyncio.Future[Response] = loop.create_future()
            due.append((future, request))
            return future

        async def settle() -> bool:
            if not due:
                return False
            future, request = due.pop(0)
            future.set_result(_echo(request))
            for _ in range(3):  # the done callbacks, and what they schedule
                await asyncio.sleep(0)
            return True

        server = HttpServer(handler, max_body_bytes=_LIMIT, request_timeout_s=30.0)
        server.loop = loop
        wire = _Wire()
        conn = server.connection()
        conn.connection_made(wire)  # type: ignore[arg-type]
        for piece in pieces:
            while wire.paused and await settle():
                pass
            if wire.closed or wire.paused:
                break
            conn.data_received(piece)
        while await settle():
            pass
        conn.connection_lost(None)
        return bytes(wire.out)

    return asyncio.run(main())


# ------------------------------------------------------------------------------ the streams
_TOKEN = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=8)


def _cased(name: str, draw: st.DrawFn) -> bytes:
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join(c.upper() if f else c for c, f in zip(name, flips, strict=True)).encode()


@st.composite
def _request(draw: st.DrawFn, last: bool) -> bytes:
    """One request, mostly valid: header case, repeated headers, whitespace around values,
    a body framed by Content-Length (leading zeros too) or chunked (extensions, leading
    zeros, trailer fields), Expect: 100-continue; now and then a framing error or a body
    over the limit."""
    method = draw(st.sampled_from([b"GET", b"POST", b"HEAD", b"OPTIONS"]))
    path = b"/" + draw(_TOKEN).encode()
    if draw(st.booleans()):
        path += b"?" + draw(_TOKEN).encode()
    if draw(st.integers(0, 5)) == 0:
        path += b"#" + draw(_TOKEN).encode()
    version = b"HTTP/1.1" if draw(st.integers(0, 7)) else b"HTTP/1.0"
    headers: list[bytes] = []
    host = draw(st.sampled_from([b"t", b"localhost:8000", b"[::1]:1", b"", None, b"a b"]))
    if host is not None:
        headers.append(_cased("host", draw) + b":" + draw(st.sampled_from([b" ", b""])) + host)
    for _ in range(draw(st.integers(0, 3))):
        value = draw(_TOKEN).encode() + draw(st.sampled_from([b"", b" ", b"\t", b" \t"]))
        headers.append(_cased("x-" + draw(st.sampled_from(["a", "b"])), draw) + b": " + value)
    if draw(st.booleans()):
        headers.append(_cased("content-type", draw) + b": application/json")
    if draw(st.integers(0, 5)) == 0:
        headers.append(_cased("expect", draw) + b": 100-continue")
    if last and draw(st.booleans()):
        headers.append(_cased("connection", draw) + b": close")
    elif version == b"HTTP/1.0" and draw(st.booleans()):
        headers.append(_cased("connection", draw) + b": keep-alive")
    body = draw(st.binary(max_size=24) | st.binary(min_size=_LIMIT - 4, max_size=_LIMIT + 4))
    framing = draw(st.sampled_from(["length", "chunked", "none"]))
    if method == b"GET" and framing == "none":
        body = b""
    payload = b""
    if framing == "length" or (framing == "none" and body):
        zeros = b"0" * draw(st.integers(0, 2))
        headers.append(_cased("content-length", draw) + b": " + zeros + str(len(body)).encode())
        payload = body
    elif framing == "chunked":
        headers.append(_cased("transfer-encoding", draw) + b": chunked")
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
        parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        for part in parts:
            if not part:
                continue
            size = b"0" * draw(st.integers(0, 3)) + b"%x" % len(part)
            ext = b";x=1" if draw(st.integers(0, 4)) == 0 else b""
            payload += size + ext + b"\r\n" + part + b"\r\n"
        payload += b"0\r\n"
        if draw(st.integers(0, 3)) == 0:
            payload += b"Host: trailer\r\nX-A: late\r\n"
        payload += b"\r\n"
    head = b"%s %s %s\r\n" % (method, path, version) + b"".join(h + b"\r\n" for h in headers)
    return head + b"\r\n" + payload


@st.composite
def _stream(draw: st.DrawFn) -> bytes:
    """One to three requests pipelined, with empty lines between them now and then."""
    count = draw(st.integers(1, 3))
    parts = []
    for index in range(count):
        if index and draw(st.integers(0, 4)) == 0:
            parts.append(b"\r\n")
        parts.append(draw(_request(last=index == count - 1)))
    return b"".join(parts)


# ------------------------------------------------------------------------------ the tests
@FUZZ
@given(_stream())
def test_a_stream_is_answered_the_same_however_it_is_cut_into_reads(stream: bytes) -> None:
    """Split at every byte boundary, and fed a byte at a time, a stream gets the answers it
    gets whole."""
    whole = _drive([stream], later=False)
    assert whole, stream
    for cut in range(1, len(stream)):
        split = _drive([stream[:cut], stream[cut:]], later=False)
        assert split == whole, (cut, stream)
    bytewise = _drive([stream[i : i + 1] for i in range(len(stream))], later=False)
    assert bytewise == whole, stream


@FUZZ
@given(_stream(), st.lists(st.integers(1, 40), min_size=1, max_size=8))
def test_a_queued_request_is_answered_as_one_handled_at_once(
    stream: bytes, sizes: list[int]
) -> None:
    """Requests that wait in the pipeline queue behind an answer still due (the general path)
    get the answers the requests handed over at once (the fast path) get, in the same order;
    only when a 100 Continue goes out may differ."""
    pieces, at = [], 0
    for size in sizes * (len(stream) // max(1, sum(sizes)) + 1):
        if at >= len(stream):
            break
        pieces.append(stream[at : at + size])
        at += size
    pieces.append(stream[at:])
    now = _drive(pieces, later=False).replace(_CONTINUE, b"")
    later = _drive(pieces, later=True).replace(_CONTINUE, b"")
    assert later == now, stream


def test_a_chunk_size_line_cut_anywhere_is_read_whole() -> None:
    """A chunked body whose size lines come across reads, cut at each byte: a chunk that fits
    is never refused as over the limit, and one that does not is always refused."""
    fits = b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    fits += b"0010;e=1\r\n" + b"a" * 16 + b"\r\n" + b"00" + b"%x" % (_LIMIT - 16)
    fits += b"\r\n" + b"b" * (_LIMIT - 16) + b"\r\n0\r\n\r\n"
    over = fits.replace(b"00" + b"%x" % (_LIMIT - 16), b"%x" % (_LIMIT - 15))
    for stream, status in ((fits, b"HTTP/1.1 200 "), (over, b"HTTP/1.1 413 ")):
        for cut in range(1, len(stream)):
            answer = _drive([stream[:cut], stream[cut:]], later=False)
            assert answer.startswith(status), (cut, answer[:120])


def test_a_chunk_over_the_limit_is_refused_in_the_same_words_however_it_arrives() -> None:
    """Regression: a chunk past the body limit was refused as 'request body is over the
    limit' when its data came with its size line, and as 'chunked request body announces a
    chunk of N bytes' when its data came in a later read: the answer hung on how the client's
    writes were cut."""
    stream = b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    stream += b"%x\r\n" % (_LIMIT + 1) + b"a" * (_LIMIT + 1) + b"\r\n0\r\n\r\n"
    whole = _drive([stream], later=False)
    assert whole.startswith(b"HTTP/1.1 413 ")
    assert b"request body is over the limit of 96 bytes (--max-body-bytes)" in whole
    cut = stream.index(b"aaaa") + 10
    assert _drive([stream[:cut], stream[cut:]], later=False) == whole
