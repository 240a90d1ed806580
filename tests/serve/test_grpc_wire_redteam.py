"""A red-team pass on the gRPC transport the server reads itself (:mod:`torchplace.serve.
grpc_wire`, :mod:`~torchplace.serve.grpc_call`), attacked as gRPC core would have been: by hand
(:mod:`tests.serve.raw_http2`) and with grpcio clients, against a :class:`~torchplace.serve.
grpc_wire.WireServer` serving a few plain handlers; gRPC core's own server (grpcio 1.85) was
asked the same to decide what is right.

Tried and found to behave as designed (not repeated here): frames over the 16 KiB frame size,
CONTINUATION interleaved with another frame, padding as long as the frame, PUSH_PROMISE from a
client, SETTINGS_INITIAL_WINDOW_SIZE past 2^31-1 and a connection WINDOW_UPDATE past it (each a
GOAWAY with its code); several messages on a unary call (the first is answered, as by
gRPC core); a message and its length prefix cut across many DATA frames; a client that never
acknowledges SETTINGS (served); PING and SETTINGS floods from a client that does not read (its
connection is read no further: memory flat); 1,000 connections with 10 streams each opened and
sent no message (27 MiB; other clients served at once). With a real server and
``tritonclient.grpc``: a 1,000-row request of every datatype and its 141 KB answer, uncompressed,
gzip and deflate (equal to the model's); 2,000 requests on one ``ModelStreamInfer`` stream, 300
concurrent calls from the aio client; a drain with a stream and unary calls in flight (every
request answered, the stream ended ``UNAVAILABLE``).

What is pinned here:

- a call's deadline timer is cancelled when the call ends: it kept every finished call (its
  buffers and connection) until the deadline passed, so calls with a deadline of an hour, as
  clients commonly set, grew the server without bound;
- a WINDOW_UPDATE or SETTINGS frame costs the server the calls it lets send, not every call
  waiting: each visited all of them, so 20,000 frames (260 KB) against 2,000 waiting calls held
  the event loop for 8.5 s; the answers still wait exactly on the windows the client gives;
- a client that grants large windows and never reads: streaming handlers wait until it reads
  (one stream of 20,000 answers of 18 KB put 344 MiB in the write buffer); a connection closed
  while such a client holds unread bytes is cut after a few seconds (it stayed open, counted
  against the connection limit, for ever);
- a call whose ``grpc-timeout`` is 0 is ``DEADLINE_EXCEEDED`` before its handler runs, as on
  gRPC core (a handler that could answer at once, its message in the same read, answered OK);
- an answer waiting on a window the client never opens is given up (RST_STREAM CANCEL) at the
  call's deadline, as gRPC core does;
- requests HTTP/2 calls malformed (RFC 9113 section 8.2, 8.3) are reset (RST_STREAM
  PROTOCOL_ERROR): a connection-specific field, a pseudo-header after a regular field, twice,
  unknown, or ``:scheme`` missing; a metadata key in upper case and ``te`` other than
  ``trailers`` get ``INTERNAL`` naming them (gRPC core's ``Illegal header key``); a gzip or
  deflate message cut short or with bytes past its end is ``INTERNAL``, not served truncated;
- a flood of small frames from one client (PING, SETTINGS, PRIORITY, unknown types; half a
  million a second from one process) held every other client's call up by about 100 ms, each
  256 KiB read being handled at once: a connection is read :data:`~torchplace.serve.grpc_wire.
  _FRAMES_PER_PASS` frames per pass of the event loop (the others' calls then took about 5 ms);
- frame-level errors carry the code RFC 9113 gives them (FRAME_SIZE_ERROR for a PING, a
  RST_STREAM, a PRIORITY or a SETTINGS ACK of the wrong size; PROTOCOL_ERROR for a WINDOW_UPDATE
  on an idle stream and SETTINGS_ENABLE_PUSH past 1), and a stream WINDOW_UPDATE of 0 or past
  2^31-1 resets that stream only; a client that shrinks the HPACK table
  (SETTINGS_HEADER_TABLE_SIZE) is told in the next header block that the server's is now 0, as
  RFC 7541 section 4.2 asks (nghttp2-based clients refuse the block otherwise);
- request messages partly arrived hold at most four message limits (256 MiB) of the server,
  all connections together: calls that each sent most of a 40 MiB message and never the rest
  made one connection grow the server by 2.4 GB in 7 s (each partial message was kept, its
  stream window replenished as it came); past the budget a call waits for room, its window
  not replenished, and past 64 waiting a new one is ``RESOURCE_EXHAUSTED``;
- a call opened on a stream id at or below one opened before (a lower id, an id reused after
  its answer or after the client reset it) ends the connection with PROTOCOL_ERROR (RFC 9113
  section 5.1.1): it was dropped silently (as gRPC core does), and its client waited out its
  deadline; frames still on their way to a stream the server reset are ignored; DATA after
  the client's END_STREAM resets the stream (STREAM_CLOSED), trailers carrying a
  pseudo-header reset it (PROTOCOL_ERROR), and a stream that depends on itself is a
  PROTOCOL_ERROR.
"""

from __future__ import annotations

import asyncio
import gc
import gzip
import socket
import threading
import time
import weakref
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from .raw_http2 import (
    ACK,
    CANCEL,
    DATA,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADER_TABLE_SIZE,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    PING,
    PREFACE,
    PRIORITY,
    PROTOCOL_ERROR,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    Connection,
    Frame,
    frame,
    grpc_headers,
    grpc_message,
    literal,
)

grpc = pytest.importorskip("grpc")
hpack = pytest.importorskip("hpack")
from torchplace.serve import grpc_wire  # noqa: E402
from torchplace.serve.grpc_call import Call  # noqa: E402
from torchplace.serve.grpc_wire import WireLimits, WireServer  # noqa: E402


async def _echo(request: bytes, context: Any) -> bytes:
    return request


async def _big(request: bytes, context: Any) -> bytes:
    return b"z" * int(request)


class _Many:
    """A server-streaming handler that counts the answers it has given."""

    def __init__(self) -> None:
        self.given = 0

    async def __call__(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        for _ in range(int(request)):
            self.given += 1
            yield b"y" * 18000


class _Handlers(grpc.GenericRpcHandler):
    def __init__(self) -> None:
        self.many = _Many()

    def service(self, details: Any) -> Any:
        return {
            "/t.T/Echo": grpc.unary_unary_rpc_method_handler(_echo),
            "/t.T/Big": grpc.unary_unary_rpc_method_handler(_big),
            "/t.T/Many": grpc.unary_stream_rpc_method_handler(self.many),
        }.get(details.method)


class _Served:
    """A WireServer on its own loop in a thread."""

    def __init__(self, limits: WireLimits) -> None:
        self.handlers = _Handlers()
        self.loop = asyncio.new_event_loop()
        self.server = WireServer([self.handlers], limits)
        self.port = 0
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.port = self.loop.run_until_complete(self.server.start("127.0.0.1", 0))
        started.set()
        self.loop.run_forever()

    def on_loop(self, function: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return function()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    def server_call(self, stream: int) -> Call | None:
        """The call on ``stream`` of the server's one connection (None if it has none)."""
        calls = [c.calls.get(stream) for c in self.server.connections]
        return next((call for call in calls if call is not None), None)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(0.0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def served() -> Iterator[_Served]:
    served = _Served(WireLimits(max_message_bytes=1 << 20))
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture
def served_large() -> Iterator[_Served]:
    """A server whose messages may be 64 MiB, the server's default --max-body-bytes."""
    served = _Served(WireLimits(max_message_bytes=64 << 20))
    try:
        yield served
    finally:
        served.stop()


def _until(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    ends = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > ends:
            return False
        time.sleep(0.02)
    return True


def _call(stream: int, path: str, body: bytes, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    return frame(HEADERS, END_HEADERS, stream, grpc_headers(path, extra)) + frame(
        DATA, END_STREAM, stream, grpc_message(body)
    )


def _settings(key: int, value: int) -> bytes:
    return frame(SETTINGS, 0, 0, key.to_bytes(2, "big") + value.to_bytes(4, "big"))


def _status(frames: list[Frame], stream: int = 1) -> tuple[str | None, str]:
    for got in frames:
        if got.kind == HEADERS and got.stream == stream and got.flags & END_STREAM:
            fields = dict(hpack.Decoder().decode(got.payload))
            return fields.get("grpc-status"), fields.get("grpc-message", "")
    return None, ""


def _ended(stream: int) -> Callable[[Frame], bool]:
    return lambda f: (
        f.stream == stream
        and (f.kind == RST_STREAM or (f.kind == HEADERS and bool(f.flags & END_STREAM)))
    )


def _still_serves(port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        assert channel.unary_unary("/t.T/Echo")(b"still", timeout=10) == b"still"


def test_a_finished_call_s_deadline_does_not_keep_it(
    served: _Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: weakref.WeakSet[Call] = weakref.WeakSet()

    class Counted(Call):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            made.add(self)

    monkeypatch.setattr(grpc_wire, "Call", Counted)
    with grpc.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        echo = channel.unary_unary("/t.T/Echo")
        for _ in range(300):
            assert echo(b"x" * 1000, timeout=3600) == b"x" * 1000

    def live_calls() -> int:
        gc.collect()
        return len(made)

    assert _until(lambda: served.on_loop(live_calls) == 0, 5.0), served.on_loop(live_calls)


def test_window_frames_touch_only_the_calls_they_let_send(
    served: _Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    pumps = [0]
    pump = grpc_wire.Connection._pump

    def counted(self: grpc_wire.Connection, call: Call) -> None:
        pumps[0] += 1
        pump(self, call)

    monkeypatch.setattr(grpc_wire.Connection, "_pump", counted)
    connection = Connection(served.port)
    try:  # 500 answers that wait on stream windows of 0, then a flood of window frames
        calls = b"".join(_call(1 + 2 * i, "/t.T/Big", b"100") for i in range(500))
        connection.send(_settings(INITIAL_WINDOW_SIZE, 0) + calls)
        assert _until(lambda: pumps[0] >= 1000)  # each answer, then its trailers
        before = pumps[0]
        flood = frame(WINDOW_UPDATE, 0, 0, (1).to_bytes(4, "big")) * 5000
        flood += (_settings(INITIAL_WINDOW_SIZE, 0) + frame(SETTINGS, 0, 0)) * 2500
        connection.send(flood + frame(PING, 0, 0, b"flooded!"))
        frames = connection.read(lambda f: f.kind == PING and f.payload == b"flooded!", 30)
        assert frames[-1].payload == b"flooded!"
        assert pumps[0] - before < 100  # it was 500 per frame: 5,000,000
        # a window that lets every call send: every call is answered
        connection.send(_settings(INITIAL_WINDOW_SIZE, 1 << 20))
        done: set[int] = set()

        def all_done(got: Frame) -> bool:
            if _status([got], got.stream)[0] == "0":
                done.add(got.stream)
            return len(done) == 500

        connection.read(all_done, 30)
        assert len(done) == 500
    finally:
        connection.close()


def test_answers_wait_exactly_on_the_windows_given(served: _Served) -> None:
    connection = Connection(served.port)

    def sent(frames: list[Frame]) -> int:
        return sum(len(f.payload) for f in frames if f.kind == DATA and f.stream == 1)

    try:
        connection.send(_settings(INITIAL_WINDOW_SIZE, 10) + _call(1, "/t.T/Big", b"100000"))
        assert sent(connection.read(timeout=0.5)) == 10
        connection.send(_settings(INITIAL_WINDOW_SIZE, 5))  # the stream's window: -5
        assert sent(connection.read(timeout=0.5)) == 0
        connection.send(_settings(INITIAL_WINDOW_SIZE, 25))  # 15 more
        assert sent(connection.read(timeout=0.5)) == 15
        connection.send(frame(WINDOW_UPDATE, 0, 1, (7).to_bytes(4, "big")))
        assert sent(connection.read(timeout=0.5)) == 7
        connection.send(frame(WINDOW_UPDATE, 0, 1, (1 << 20).to_bytes(4, "big")))
        # the connection's window (65,535) holds the rest, until it is opened
        assert sent(rest := connection.read(timeout=0.5)) == 65535 - 32
        assert _status(rest) == (None, "")
        connection.send(frame(WINDOW_UPDATE, 0, 0, (1 << 20).to_bytes(4, "big")))
        last = connection.read(_ended(1))
        assert sent(last) == 100005 - 65535
        assert _status(last) == ("0", "")
    finally:
        connection.close()


def _stuck_client(port: int, body: bytes) -> socket.socket:
    """A client that grants every window and reads nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    most = 2**31 - 1
    sock.sendall(PREFACE + _settings(INITIAL_WINDOW_SIZE, most)
                 + frame(WINDOW_UPDATE, 0, 0, (most - 65535).to_bytes(4, "big")) + body)  # fmt: skip
    return sock


def test_a_client_that_does_not_read_holds_its_streaming_handler(served: _Served) -> None:
    sock = _stuck_client(served.port, _call(1, "/t.T/Many", b"20000"))
    try:
        assert _until(
            lambda: served.on_loop(lambda: any(c.paused for c in served.server.connections))
        )
        time.sleep(0.5)
        given = served.handlers.many.given
        buffered = served.on_loop(
            lambda: sum(
                c._transport.get_write_buffer_size()
                for c in served.server.connections
                if c._transport is not None
            )
        )
        assert given < 1000  # 20,000 answers of 18 KB were all given, 360 MB in memory
        assert buffered < 4 << 20
    finally:
        sock.close()
    _still_serves(served.port)


def test_a_closed_connection_whose_client_does_not_read_is_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(grpc_wire, "_LINGER_S", 0.3)
    served = _Served(WireLimits(1 << 20, idle_timeout_s=0.5, handshake_timeout_s=0.5))
    sock = _stuck_client(served.port, b"")
    sock.settimeout(0.2)
    pings = frame(PING, 0, 0, b"12345678") * 4096
    try:  # acknowledgements it does not read, until the server reads no more of it
        for _ in range(200):
            try:
                sock.sendall(pings)
            except OSError:  # the server reads no more (or already cut it)
                break
        # its idle timeout closes it: what it did not read does not keep it open
        assert _until(lambda: served.on_loop(lambda: len(served.server.connections)) == 0)
    finally:
        sock.close()
        served.stop()


def test_an_answer_the_client_never_lets_out_ends_at_the_deadline(served: _Served) -> None:
    connection = Connection(served.port)
    try:
        connection.send(_settings(INITIAL_WINDOW_SIZE, 0)
                        + _call(1, "/t.T/Big", b"1000", (("grpc-timeout", "300m"),)))  # fmt: skip
        frames = connection.read(_ended(1), timeout=10)
        assert (frames[-1].kind, frames[-1].error_code()) == (RST_STREAM, CANCEL)
        assert served.on_loop(lambda: sum(len(c.calls) for c in served.server.connections)) == 0
    finally:
        connection.close()


def _block(*fields: tuple[str, str]) -> bytes:
    return b"".join(literal(name, value) for name, value in fields)


_REQUEST = ((":method", "POST"), (":scheme", "http"), (":path", "/t.T/Echo"),
            (":authority", "x"), ("content-type", "application/grpc"))  # fmt: skip


@pytest.mark.parametrize(
    "block",
    [
        _block(*_REQUEST, ("connection", "keep-alive")),
        _block(*_REQUEST, ("transfer-encoding", "chunked")),
        _block(*_REQUEST[:2], ("content-type", "application/grpc"), *_REQUEST[2:4]),
        _block(*_REQUEST, (":path", "/t.T/Echo")),
        _block(*_REQUEST[:4], (":status", "200"), _REQUEST[4]),
        _block(_REQUEST[0], *_REQUEST[2:]),
    ],
    ids=[
        "connection",
        "transfer-encoding",
        "pseudo-after-regular",
        "pseudo-twice",
        "response-pseudo",
        "no-scheme",
    ],
)
def test_a_malformed_request_is_reset(served: _Served, block: bytes) -> None:
    connection = Connection(served.port)
    try:
        connection.send(frame(HEADERS, END_HEADERS, 1, block)
                        + frame(DATA, END_STREAM, 1, grpc_message(b"hi")))  # fmt: skip
        frames = connection.read(_ended(1))
    finally:
        connection.close()
    assert (frames[-1].kind, frames[-1].error_code()) == (RST_STREAM, PROTOCOL_ERROR)
    _still_serves(served.port)


_GZIP = gzip.compress(b"hello" * 100)


@pytest.mark.parametrize(
    ("extra", "message", "said"),
    [
        ((("X-Token", "a"),), grpc_message(b"hi"), "Illegal header key: 'X-Token'"),
        ((("te", "gzip"),), grpc_message(b"hi"), "te 'gzip' is not allowed"),
        ((("grpc-encoding", "gzip"),), grpc_message(_GZIP[:-12], compressed=True), "cut short"),
        ((("grpc-encoding", "gzip"),), grpc_message(_GZIP + b"!", compressed=True), "past its"),
        ((("grpc-encoding", "deflate"),),
         grpc_message(zlib.compress(b"hello")[:-3], compressed=True), "cut short"),
    ],
    ids=["upper-case-key", "te", "gzip-cut", "gzip-trailing", "deflate-cut"],
)  # fmt: skip
def test_a_call_gRPC_core_refuses_is_internal_with_the_reason(
    served: _Served, extra: tuple[tuple[str, str], ...], message: bytes, said: str
) -> None:
    connection = Connection(served.port)
    try:
        connection.send(frame(HEADERS, END_HEADERS, 1, grpc_headers("/t.T/Echo", extra))
                        + frame(DATA, END_STREAM, 1, message))  # fmt: skip
        code, details = _status(connection.read(_ended(1)))
    finally:
        connection.close()
    assert code == "13"
    assert said in details


@pytest.mark.parametrize(
    ("sent", "code"),
    [
        (frame(PING, 0, 0, b"1234567"), FRAME_SIZE_ERROR),
        (frame(SETTINGS, ACK, 0, b"\0" * 6), FRAME_SIZE_ERROR),
        (_settings(ENABLE_PUSH, 2), PROTOCOL_ERROR),
        (frame(HEADERS, END_HEADERS, 1, grpc_headers("/t.T/Echo"))
         + frame(RST_STREAM, 0, 1, b"\0\0\0"), FRAME_SIZE_ERROR),
        (frame(PRIORITY, 0, 1, b"\0\0\0\0"), FRAME_SIZE_ERROR),
        (frame(PRIORITY, 0, 3, (3).to_bytes(4, "big") + b"\x10"), PROTOCOL_ERROR),
        (frame(WINDOW_UPDATE, 0, 7, (10).to_bytes(4, "big")), PROTOCOL_ERROR),
        (frame(WINDOW_UPDATE, 0, 0, (0).to_bytes(4, "big")), PROTOCOL_ERROR),
    ],
    ids=["ping-size", "settings-ack-payload", "enable-push", "rst-size", "priority-size",
         "priority-on-itself", "window-update-idle-stream", "connection-window-update-0"],
)  # fmt: skip
def test_connection_errors_carry_rfc_9113_s_code(served: _Served, sent: bytes, code: int) -> None:
    connection = Connection(served.port)
    try:
        connection.send(sent)
        frames = connection.read(lambda f: f.kind == GOAWAY)
    finally:
        connection.close()
    assert frames[-1].kind == GOAWAY
    assert int.from_bytes(frames[-1].payload[4:8], "big") == code
    _still_serves(served.port)


@pytest.mark.parametrize(
    ("increment", "code"), [(0, PROTOCOL_ERROR), (2**31 - 1, FLOW_CONTROL_ERROR)]
)
def test_a_bad_stream_window_update_resets_that_stream_only(
    served: _Served, increment: int, code: int
) -> None:
    connection = Connection(served.port)
    try:
        connection.send(frame(HEADERS, END_HEADERS, 1, grpc_headers("/t.T/Echo"))
                        + frame(WINDOW_UPDATE, 0, 1, increment.to_bytes(4, "big")))  # fmt: skip
        frames = connection.read(_ended(1))
        assert (frames[-1].kind, frames[-1].error_code()) == (RST_STREAM, code)
        connection.send(_call(3, "/t.T/Echo", b"on"))
        assert _status(connection.read(_ended(3)), 3) == ("0", "")
    finally:
        connection.close()


@pytest.mark.parametrize("compression", ["Gzip", "Deflate"])
def test_grpcio_compressed_calls_and_answers_past_the_window(
    served: _Served, compression: str
) -> None:
    body = bytes(range(256)) * 800  # 200 KB, past the 64 KiB windows
    with grpc.insecure_channel(
        f"127.0.0.1:{served.port}", compression=getattr(grpc.Compression, compression)
    ) as channel:
        assert channel.unary_unary("/t.T/Echo")(body, timeout=10) == body
        assert len(channel.unary_unary("/t.T/Big")(b"900000", timeout=10)) == 900000
        many = list(channel.unary_stream("/t.T/Many")(b"300", timeout=30))
    assert len(many) == 300


def test_a_flood_of_small_frames_is_read_a_pass_at_a_time(
    served: _Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grpc_wire, "_FRAMES_PER_PASS", 8)
    passes: list[int] = []
    read_frames, on_frame = grpc_wire.Connection._read_frames, grpc_wire.Connection._frame
    counted = [0]

    def read_pass(self: grpc_wire.Connection) -> None:
        counted[0] = 0
        read_frames(self)
        passes.append(counted[0])

    def one_frame(self: grpc_wire.Connection, *args: Any) -> None:
        counted[0] += 1
        on_frame(self, *args)

    monkeypatch.setattr(grpc_wire.Connection, "_read_frames", read_pass)
    monkeypatch.setattr(grpc_wire.Connection, "_frame", one_frame)
    connection = Connection(served.port)
    try:  # every frame is still read, in order: 3,000 PINGs, then a call
        connection.send(frame(PING, 0, 0, b"pingpong") * 3000 + _call(1, "/t.T/Echo", b"last"))
        frames = connection.read(_ended(1), timeout=30)
    finally:
        connection.close()
    assert sum(1 for f in frames if f.kind == PING and f.flags & ACK) == 3000
    assert _status(frames) == ("0", "")
    assert len(passes) > 3000 // 8
    assert max(passes) <= 8


def test_a_client_that_shrinks_the_hpack_table_is_told_ours_is_empty(served: _Served) -> None:
    connection = Connection(served.port)
    try:  # RFC 7541 section 4.2: the next header block starts with a table size update
        connection.send(_settings(HEADER_TABLE_SIZE, 0) + _call(1, "/t.T/Echo", b"one"))
        first = connection.read(_ended(1))
        connection.send(_call(3, "/t.T/Echo", b"two"))
        second = connection.read(_ended(3))
    finally:
        connection.close()
    blocks = [f.payload for f in first + second if f.kind == HEADERS]
    assert [block[0] == 0x20 for block in blocks] == [True, False, False, False]
    decoder = hpack.Decoder()  # the blocks decode in order on one connection's table
    assert [dict(decoder.decode(block)).get("grpc-status") for block in blocks] == [
        None, "0", None, "0",
    ]  # fmt: skip


def test_a_deadline_past_already_is_deadline_exceeded_before_the_handler_runs(
    served: _Served,
) -> None:
    connection = Connection(served.port)
    try:  # the message comes with the headers: a handler that ran would answer at once
        connection.send(_call(1, "/t.T/Echo", b"hi", (("grpc-timeout", "0n"),)))
        code, details = _status(connection.read(_ended(1)))
    finally:
        connection.close()
    assert (code, details) == ("4", "Deadline Exceeded")


def _partial_messages(streams: list[int], announced: int, sent: int) -> bytes:
    """Calls on ``streams``, each sending the first ``sent`` bytes of an ``announced``-byte
    message (and never the rest), a DATA frame of at most 16 KiB at a time."""
    out = [frame(HEADERS, END_HEADERS, s, grpc_headers("/t.T/Echo")) for s in streams]
    body = grpc_message(b"\0" * (sent - 5), length=announced)
    for stream in streams:
        out += [frame(DATA, 0, stream, body[i : i + 16384]) for i in range(0, len(body), 16384)]
    return b"".join(out)


def test_messages_partly_sent_hold_at_most_the_budget(served_large: _Served) -> None:
    """Calls that each send most of a large message, never the rest, made the server hold all
    of it (one connection: 2.4 GB in 7 s). Messages partly arrived now hold at most four
    message limits (256 MiB) together: past it a call waits, its stream window not replenished
    (so its client sends no more), let in first come first served; past 64 waiting, a new one
    is RESOURCE_EXHAUSTED saying why."""
    limit = 64 << 20
    fit = (4 * limit) // limit  # the budget: four messages of the limit
    waiting = 64  # grpc_call.MAX_WAITING
    streams = [1 + 2 * i for i in range(fit + waiting + 3)]
    connection = Connection(served_large.port, timeout=30)
    try:  # a bit over a quarter of the stream window each: an admitted call is credited
        connection.send(_partial_messages(streams, limit - 5, (1 << 20) + 16384))
        frames = connection.read(timeout=1.0)
        credited = sorted({f.stream for f in frames if f.kind == WINDOW_UPDATE and f.stream})
        assert credited == streams[:fit]
        refused = [s for s in streams if _status(frames, s)[0] is not None]
        assert refused == streams[fit + waiting :]
        code, details = _status(frames, refused[0])
        assert code == "8", (code, details)  # RESOURCE_EXHAUSTED
        assert "retry shortly" in details
        assert f"most it holds at once is {4 * limit}" in details
        # the first call goes: the first that waited is let in and may send the rest
        connection.send(frame(RST_STREAM, 0, streams[0], (8).to_bytes(4, "big")))
        frames = connection.read(lambda f: f.kind == WINDOW_UPDATE and f.stream > 0)
        assert [f.stream for f in frames if f.kind == WINDOW_UPDATE and f.stream] == [streams[fit]]
    finally:
        connection.close()

    def budget() -> tuple[int, int]:
        held = served_large.server.budget
        return held.reserved, len(held.waiting)

    assert _until(lambda: served_large.on_loop(budget) == (0, 0)), served_large.on_loop(budget)
    _still_serves(served_large.port)


def test_a_call_answered_holds_nothing_of_what_its_client_sends_after(
    served_large: _Served,
) -> None:
    """A unary call answered, its answer waiting on a window the client does not open, kept
    reading what the client sent on: a large message begun then would hold the server's budget
    for as long as the connection stayed open. What comes after the status is decided is
    dropped, as gRPC core does."""
    connection = Connection(served_large.port)
    try:  # no window for answers: the call is answered but its answer cannot go out
        connection.send(_settings(INITIAL_WINDOW_SIZE, 0))
        connection.send(frame(HEADERS, END_HEADERS, 1, grpc_headers("/t.T/Echo")))
        connection.send(frame(DATA, 0, 1, grpc_message(b"first")))

        def answered() -> bool:
            call = served_large.server_call(1)
            return call is not None and call.finished

        assert _until(lambda: bool(served_large.on_loop(answered)))
        connection.send(frame(DATA, 0, 1, grpc_message(b"\0" * 16000, length=60 << 20)))
        connection.read(timeout=0.5)
        assert served_large.on_loop(lambda: served_large.server.budget.reserved) == 0
    finally:
        connection.close()
    _still_serves(served_large.port)


def test_a_message_let_into_the_budget_must_arrive_within_the_message_timeout() -> None:
    """Calls holding the whole budget and sending no more would keep every other large
    message waiting for as long as their connection stays open. A message let in has
    ``message_timeout_s`` (``--request-timeout``) to arrive in full, or its call ends with
    DEADLINE_EXCEEDED saying why, and the first call waiting is let in."""
    limit = 64 << 20
    served = _Served(WireLimits(max_message_bytes=limit, message_timeout_s=0.5))
    streams = [1, 3, 5, 7, 9]  # the budget holds four messages of the limit: the fifth waits
    connection = Connection(served.port, timeout=30)
    try:
        connection.send(_partial_messages(streams, limit - 5, (1 << 20) + 16384))
        frames = connection.read(timeout=2.0)  # until no byte comes for 2 s
        for stream in streams:
            code, details = _status(frames, stream)
            assert code == "4", (stream, code, details)  # DEADLINE_EXCEEDED
            assert f"request message of {limit} bytes did not arrive" in details
            assert "--request-timeout" in details
        # the fifth was let in (its window replenished) once the first four went
        credited = [f.stream for f in frames if f.kind == WINDOW_UPDATE and f.stream]
        assert credited == streams

        def budget() -> tuple[int, int]:
            held = served.server.budget
            return held.reserved, len(held.waiting)

        assert served.on_loop(budget) == (0, 0)
    finally:
        connection.close()
        served.stop()


STREAM_CLOSED = 0x5


def _goaway_code(frames: list[Frame]) -> int | None:
    away = [f for f in frames if f.kind == GOAWAY]
    return int.from_bytes(away[-1].payload[4:8], "big") if away else None


@pytest.mark.parametrize(
    "sent",
    [
        _call(5, "/t.T/Echo", b"five") + _call(3, "/t.T/Echo", b"three"),
        _call(1, "/t.T/Echo", b"one"),
        frame(HEADERS, END_HEADERS, 1, grpc_headers("/t.T/Echo"))
        + frame(RST_STREAM, 0, 1, CANCEL.to_bytes(4, "big")),
    ],
    ids=["lower-id", "id-reused-after-answer", "id-reused-after-reset"],
)
def test_a_call_on_a_closed_stream_ends_the_connection_at_once(
    served: _Served, sent: bytes
) -> None:
    """A new stream's id must exceed every earlier one (RFC 9113 section 5.1.1): a call opened
    on a lower or a used id got no answer at all, and its client waited out its deadline."""
    connection = Connection(served.port)
    try:
        connection.send(sent)
        if b"five" not in sent:  # stream 1 answered or reset, then opened again
            connection.read(timeout=0.5)
            connection.send(_call(1, "/t.T/Echo", b"again"))
        frames = connection.read(lambda f: f.kind == GOAWAY)
    finally:
        connection.close()
    assert _goaway_code(frames) == PROTOCOL_ERROR
    _still_serves(served.port)


def test_frames_late_on_a_stream_the_server_reset_are_ignored(served: _Served) -> None:
    connection = Connection(served.port)
    try:  # a malformed request is reset; the rest of its message was on its way already
        connection.send(frame(HEADERS, END_HEADERS, 1, _block(*_REQUEST, ("connection", "x"))))
        frames = connection.read(_ended(1))
        assert (frames[-1].kind, frames[-1].error_code()) == (RST_STREAM, PROTOCOL_ERROR)
        connection.send(frame(DATA, 0, 1, grpc_message(b"late")) + frame(HEADERS, 5, 1, b""))
        connection.send(_call(3, "/t.T/Echo", b"next"))
        frames = connection.read(_ended(3))
    finally:
        connection.close()
    assert _status(frames, 3) == ("0", "")
    assert _goaway_code(frames) is None


def test_trailers_with_a_pseudo_header_reset_the_stream(served: _Served) -> None:
    connection = Connection(served.port)
    try:  # RFC 9113 section 8.1: pseudo-headers in trailers make the request malformed
        connection.send(frame(HEADERS, END_HEADERS, 1, grpc_headers("/t.T/Echo"))
                        + frame(DATA, 0, 1, grpc_message(b"hi"))
                        + frame(HEADERS, END_HEADERS | END_STREAM, 1,
                                literal(":path", "/t.T/Echo")))  # fmt: skip
        frames = connection.read(_ended(1))
    finally:
        connection.close()
    assert (frames[-1].kind, frames[-1].error_code()) == (RST_STREAM, PROTOCOL_ERROR)


def test_data_after_the_clients_end_of_stream_resets_the_stream(served: _Served) -> None:
    connection = Connection(served.port)
    try:  # no window for answers: the call stays open after the client's END_STREAM
        connection.send(_settings(INITIAL_WINDOW_SIZE, 0) + _call(1, "/t.T/Echo", b"hi"))

        def answered() -> bool:
            call = served.server_call(1)
            return call is not None and call.finished

        assert _until(lambda: bool(served.on_loop(answered)))
        connection.send(frame(DATA, 0, 1, grpc_message(b"more")))
        frames = connection.read(lambda f: f.kind == RST_STREAM and f.stream == 1)
    finally:
        connection.close()
    assert frames[-1].error_code() == STREAM_CLOSED


def test_a_stream_that_depends_on_itself_is_a_protocol_error(served: _Served) -> None:
    connection = Connection(served.port)
    try:  # RFC 9113 section 5.3.1, in a HEADERS frame's priority
        priority = (1).to_bytes(4, "big") + b"\x10"
        connection.send(frame(HEADERS, END_HEADERS | 0x20, 1,
                              priority + grpc_headers("/t.T/Echo")))  # fmt: skip
        frames = connection.read(lambda f: f.kind == GOAWAY)
    finally:
        connection.close()
    assert _goaway_code(frames) == PROTOCOL_ERROR
