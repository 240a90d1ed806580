"""A sixteenth red-team pass on the gRPC transport (:mod:`torchplace.serve.grpc_wire`,
:mod:`~torchplace.serve.grpc_call`), its findings pinned on an in-memory transport: the frames a
client sends are handed to a :class:`~torchplace.serve.grpc_wire.Connection` as read, and what
it writes is kept.

What is pinned here:

- a call whose handler takes one request message (a unary-request method: health ``Watch``,
  registered through :mod:`~torchplace.serve.grpc_read`, or the transport's own unary
  handlers) held every complete message its client sent after the first, and had its stream
  window given back for them: one unauthenticated connection of 50 ``Watch`` streams made the
  server hold 356 MiB in 3 s. Once the handler has its message, what more comes is dropped as
  it arrives and its window is not replenished (gRPC core 1.85, asked the same, answers the
  first message, ends no call for the rest and grants them no window); past the window the
  stream is reset (FLOW_CONTROL_ERROR), and a message begun after the first holds nothing of
  the server's budget;
- no frame the server writes exceeds the client's SETTINGS_MAX_FRAME_SIZE (RFC 9113 section
  4.2): a header block past it goes on in CONTINUATION frames; and a status's details, which
  often quote what the client sent (a ``te`` of 15,800 bytes came back as one 94,958-byte
  HEADERS frame), are cut to 4 KiB percent-encoded;
- frames late on a stream the server reset are ignored for a time (RFC 9113 section 5.1): past
  1,024 resets, a late DATA on an early stream ended the whole connection (GOAWAY
  STREAM_CLOSED), taking its other calls with it. Resets are remembered for
  :data:`~torchplace.serve.grpc_wire._RESETS_KEPT_S` seconds, or
  :data:`~torchplace.serve.grpc_wire._MOST_RESETS_KEPT` more resets, whichever ends later.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import pytest

from .raw_http2 import (
    DATA,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
    grpc_headers,
    grpc_message,
    literal,
)

grpc = pytest.importorskip("grpc")
hpack = pytest.importorskip("hpack")
from torchplace.serve import grpc_wire  # noqa: E402
from torchplace.serve.grpc_read import unary_stream_handler  # noqa: E402
from torchplace.serve.grpc_wire import STREAM_WINDOW, WireLimits, WireServer  # noqa: E402

CONTINUATION = 0x9
MAX_FRAME_SIZE = 0x5
STREAM_CLOSED = 0x5
#: a client's frames of one header block: the default SETTINGS_MAX_FRAME_SIZE
MAX_FRAME = 16384


async def _watch(request: bytes, context: Any) -> AsyncIterator[bytes]:
    """As health ``Watch``: one answer, then open until the client goes."""
    yield b"first"
    await asyncio.Event().wait()


async def _sink(requests: AsyncIterator[bytes], context: Any) -> bytes:
    """A request-streaming handler that reads every message."""
    count = 0
    async for _ in requests:
        count += 1
    return b"%d" % count


async def _echo(request: bytes, context: Any) -> bytes:
    return request


async def _abort(request: bytes, context: Any) -> bytes:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no model named " + "\xe9" * 10000)


class _Handlers(grpc.GenericRpcHandler):
    def service(self, details: Any) -> Any:
        return {
            "/t.T/Watch": unary_stream_handler(_watch, 5.0),  # the server's own, as Watch is
            "/t.T/Plain": grpc.unary_stream_rpc_method_handler(_watch),
            "/t.T/Sink": grpc.stream_unary_rpc_method_handler(_sink),
            "/t.T/Echo": grpc.unary_unary_rpc_method_handler(_echo),
            "/t.T/Abort": grpc.unary_unary_rpc_method_handler(_abort),
        }.get(details.method)


class _Transport:
    """An asyncio transport that keeps what is written to it."""

    def __init__(self) -> None:
        self.written = bytearray()

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


class _Client:
    """One connection to a WireServer (64 MiB messages, its default) in memory: ``send``
    hands bytes to it as read, ``frames`` parses what it wrote since the last call."""

    def __init__(self) -> None:
        limits = WireLimits(max_message_bytes=64 << 20)
        self.server = WireServer([_Handlers()], limits)
        self.connection = grpc_wire.Connection(self.server)
        self.transport = _Transport()
        self.connection.connection_made(self.transport)  # type: ignore[arg-type]
        self.connection.data_received(PREFACE + frame(SETTINGS, 0, 0))
        self.frames()

    def send(self, data: bytes) -> None:
        self.connection.data_received(data)

    async def settle(self) -> None:
        """Let the handlers, and the frames left to the loop's next pass, run."""
        for _ in range(20):
            await asyncio.sleep(0)

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        """The (type, flags, stream, payload) of each frame written since the last call."""
        data, frames = bytes(self.transport.written), []
        self.transport.written.clear()
        while data:
            size = int.from_bytes(data[:3], "big")
            stream = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
            frames.append((data[3], data[4], stream, data[9 : 9 + size]))
            data = data[9 + size :]
        return frames

    def close(self) -> None:
        self.connection.connection_lost(None)


def _settings(key: int, value: int) -> bytes:
    return frame(SETTINGS, 0, 0, key.to_bytes(2, "big") + value.to_bytes(4, "big"))


def _goaway(frames: list[tuple[int, int, int, bytes]]) -> int | None:
    codes = [int.from_bytes(p[4:8], "big") for kind, _, _, p in frames if kind == GOAWAY]
    return codes[-1] if codes else None


def _status(frames: list[tuple[int, int, int, bytes]], stream: int) -> tuple[str, bytes]:
    """The status of ``stream`` (its header block, CONTINUATIONs joined): code, raw details."""
    block, ended = b"", False
    for kind, flags, on, payload in frames:
        if on == stream and kind in (HEADERS, CONTINUATION):
            block = payload if kind == HEADERS else block + payload
            ended = ended or (kind == HEADERS and bool(flags & END_STREAM))
    assert ended, f"no status on stream {stream}"
    fields = dict(hpack.Decoder().decode(block, raw=True))
    return fields[b"grpc-status"].decode(), fields.get(b"grpc-message", b"")


# -- a unary-request call holds nothing of what its client sends after its message -----------
@pytest.mark.parametrize("path", ["/t.T/Watch", "/t.T/Plain"], ids=["grpc_read", "transport"])
def test_messages_after_a_unary_call_s_one_are_dropped_and_get_no_window(path: str) -> None:
    asyncio.run(_send_past_the_one_message(path))


async def _send_past_the_one_message(path: str) -> None:
    client = _Client()
    try:  # as the red team's client: no window for answers, a Watch with its empty request
        client.send(_settings(INITIAL_WINDOW_SIZE, 0)
                    + frame(HEADERS, END_HEADERS, 1, grpc_headers(path))
                    + frame(DATA, 0, 1, grpc_message(b"")))  # fmt: skip
        await client.settle()
        call = client.connection.calls[1]
        # complete messages, as many as the stream's window (4 MiB) lets the client send
        piece = grpc_message(b"x" * 16000)
        for _ in range((STREAM_WINDOW - 5) // len(piece)):
            client.send(frame(DATA, 0, 1, piece))
            await client.settle()
        client.send(frame(DATA, 0, 1, grpc_message(b"\0" * 100, length=60 << 20)))
        await client.settle()
        frames = client.frames()
        assert not [f for f in frames if f[0] == WINDOW_UPDATE and f[2] == 1]  # was: 3 MiB more
        assert call.unread == 0  # was: 4 MiB held
        assert client.server.budget.reserved == 0  # was: 60 MiB for it
        assert not [f for f in frames if f[2] == 1 and (f[0] == RST_STREAM or f[1] & END_STREAM)]
        assert client.connection.calls.get(1) is call  # the Watch goes on
        # past the window: the stream is reset; the connection goes on, and a request-streaming
        # call on it is given its window back as its handler reads
        client.send(frame(DATA, 0, 1, piece) * 2)
        client.send(frame(HEADERS, END_HEADERS, 3, grpc_headers("/t.T/Sink")))
        for _ in range(STREAM_WINDOW // 2 // len(piece)):
            client.send(frame(DATA, 0, 3, piece))
            await client.settle()
        frames = client.frames()
        assert (RST_STREAM, 1, FLOW_CONTROL_ERROR.to_bytes(4, "big")) in [
            (kind, stream, payload) for kind, _, stream, payload in frames
        ]
        assert [f for f in frames if f[0] == WINDOW_UPDATE and f[2] == 3]
        assert _goaway(frames) is None
    finally:
        client.close()


# -- no frame past the client's SETTINGS_MAX_FRAME_SIZE ----------------------------------------
_LONG = b"\xe9" * 15800  # each %C3%A9 in grpc-message: 94,800 bytes quoted whole


@pytest.mark.parametrize(
    ("path", "extra", "message", "said"),
    [
        ("/t.T/Echo", [(b"te", _LONG)], grpc_message(b"hi"), b"te '"),
        ("/t.T/Echo", [(b"grpc-timeout", _LONG)], grpc_message(b"hi"), b"grpc-timeout '"),
        ("/t.T/Echo", [(b"grpc-encoding", _LONG)], grpc_message(b"hi", compressed=True),
         b"the message is compressed with grpc-encoding '"),
        ("/t.T/Echo", [(_LONG, b"v")], grpc_message(b"hi"), b"Illegal header key: '"),
        ("/t.T/Abort", [], grpc_message(b"hi"), b"no model named "),
    ],
    ids=["te", "grpc-timeout", "grpc-encoding", "metadata-key", "handler-abort"],
)  # fmt: skip
def test_a_status_quoting_a_long_value_is_cut_and_fits_the_frame_size(
    path: str, extra: list[tuple[bytes, bytes]], message: bytes, said: bytes
) -> None:
    asyncio.run(_long_status(path, extra, message, said))


async def _long_status(
    path: str, extra: list[tuple[bytes, bytes]], message: bytes, said: bytes
) -> None:
    client = _Client()
    try:  # the client's header block is past its own frame size too: HEADERS, CONTINUATION
        block = grpc_headers(path) + hpack.Encoder().encode(extra, huffman=False)
        client.send(frame(HEADERS, 0, 1, block[:MAX_FRAME])
                    + frame(CONTINUATION, END_HEADERS, 1, block[MAX_FRAME:])
                    + frame(DATA, END_STREAM, 1, message))  # fmt: skip
        await client.settle()
        frames = client.frames()
    finally:
        client.close()
    assert max(len(payload) for *_, payload in frames) <= MAX_FRAME
    code, details = _status(frames, 1)
    assert code in ("3", "13"), (code, details[:100])  # INVALID_ARGUMENT, INTERNAL
    assert len(details) <= 4096  # percent-encoded, as the trailer carries it
    assert details.startswith(said)
    assert details.endswith(b" more characters)")
    assert "\xe9" in urllib.parse.unquote(details.decode())  # quoted, percent-encoded


def test_a_header_block_past_the_client_s_frame_size_goes_on_in_continuations() -> None:
    asyncio.run(_split_header_block())


async def _split_header_block() -> None:
    client = _Client()
    try:  # a client that takes frames of 20,000 bytes: a block of 50,000 is three frames
        client.send(_settings(MAX_FRAME_SIZE, 20000))
        client.frames()
        block = literal("grpc-message", "m" * 49990)
        client.connection._headers_out(END_HEADERS | END_STREAM, 1, block)
        client.connection.flush()
        frames = client.frames()
    finally:
        client.close()
    assert [(kind, flags, len(payload)) for kind, flags, _, payload in frames] == [
        (HEADERS, END_STREAM, 20000),
        (CONTINUATION, 0, 20000),
        (CONTINUATION, END_HEADERS, len(block) - 40000),
    ]
    assert b"".join(payload for *_, payload in frames) == block
    assert hpack.Decoder().decode(block, raw=True) == [(b"grpc-message", b"m" * 49990)]


# -- frames late on a stream the server reset --------------------------------------------------
_RESETS = 1100  # past the 1,024 kept before


def _reset_many(client: _Client) -> list[int]:
    """Calls the server ends at once (no handler serves the method) while their clients may
    still send (no END_STREAM): each is answered UNIMPLEMENTED and reset."""
    streams = [1 + 2 * i for i in range(_RESETS)]
    client.send(b"".join(frame(HEADERS, END_HEADERS, s, grpc_headers("/t.T/NoSuch"))
                         for s in streams))  # fmt: skip
    return streams


def test_frames_late_on_any_stream_reset_lately_are_ignored() -> None:
    asyncio.run(_late_after_many_resets())


async def _late_after_many_resets() -> None:
    client = _Client()
    try:
        streams = _reset_many(client)
        await client.settle()
        frames = client.frames()
        assert sum(1 for f in frames if f[0] == RST_STREAM) == _RESETS
        # the first one's message, on its way before the reset reached the client
        client.send(frame(DATA, END_STREAM, streams[0], grpc_message(b"x" * 100)))
        after = streams[-1] + 2
        client.send(frame(HEADERS, END_HEADERS, after, grpc_headers("/t.T/Echo"))
                    + frame(DATA, END_STREAM, after, grpc_message(b"served")))  # fmt: skip
        await client.settle()
        frames = client.frames()
        assert _goaway(frames) is None
        assert _status(frames, after) == ("0", b"")
        # a stream never opened, below the last opened, is still the client's error
        client.send(frame(HEADERS, END_HEADERS, streams[-1] + 1, grpc_headers("/t.T/Echo")))
        assert _goaway(client.frames()) is not None
    finally:
        client.close()


@pytest.mark.parametrize(
    ("seconds", "most", "wait"), [(0.05, 8192, 0.15), (10.0, 64, 0.0)], ids=["time", "count"]
)
def test_resets_are_remembered_for_a_bounded_time_and_number(
    monkeypatch: pytest.MonkeyPatch, seconds: float, most: int, wait: float
) -> None:
    """What bounds the memory: once a reset is older than ``_RESETS_KEPT_S`` and
    ``_MOST_RESETS_KEPT`` resets came after it, a frame on its stream is the client's error
    again (STREAM_CLOSED, as before), and no more than twice that many are kept."""
    monkeypatch.setattr(grpc_wire, "_RESETS_KEPT_S", seconds)
    monkeypatch.setattr(grpc_wire, "_MOST_RESETS_KEPT", most)
    asyncio.run(_late_past_the_bounds(most, wait))


async def _late_past_the_bounds(most: int, wait: float) -> None:
    client = _Client()
    try:
        streams = _reset_many(client)
        await client.settle()
        assert len(client.connection._reset_out) <= 2 * most
        client.send(frame(DATA, END_STREAM, streams[-1], grpc_message(b"late")))  # kept
        assert _goaway(client.frames()) is None
        await asyncio.sleep(wait)
        client.send(frame(DATA, END_STREAM, streams[0], grpc_message(b"too late")))
        assert _goaway(client.frames()) == STREAM_CLOSED
    finally:
        client.close()
