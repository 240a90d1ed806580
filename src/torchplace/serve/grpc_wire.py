"""gRPC over HTTP/2 on the server's own asyncio loop: the transport of
:mod:`torchplace.serve.grpc_server`.

grpc.aio takes about four times the CPU per call that a lean HTTP/2 reader on the loop does
(its C core hands every call across threads and back into Python through several futures): on
a model whose batch computes while the next requests are read, that is what bounds gRPC. This
module reads the frames itself (RFC 9113; header blocks decoded by :mod:`hpack`, and a block of
indexed fields only, what a client sends on every call once its fields are in the dynamic
table, read once for as long as that table stays as it is), hands each
call to the handlers that grpc.aio would run (``grpc.GenericRpcHandler``\\ s, looked up by
path) with a :class:`~torchplace.serve.grpc_call.Call` as their servicer context, and writes
a call's answers as its handler makes them and its status when it ends (what the frames of one
read make, once that read ends; other frames once per pass of the loop).

What it keeps of the protocol, and of gRPC core's server:

- flow control both ways: answers wait on the client's windows (a window frame costs the calls
  it lets send, not every call waiting); a call's stream window is replenished as its handler
  reads (a client that streams faster than the server reads is held), a unary-request call's
  never past its one message (what its client sends after it is dropped, as gRPC core
  ignores it); a client that does not read what was written is read no further and its
  streaming handlers wait;
- fairness: a connection is read :data:`_FRAMES_PER_PASS` frames per pass of the loop;
- a call's deadline (``grpc-timeout``): past it the handler is cancelled and the call ends
  with ``DEADLINE_EXCEEDED`` (an answer still waiting on the client's window then is given up,
  RST_STREAM ``CANCEL``); a stream the client resets (RST_STREAM) cancels its handler;
- bounds: streams per connection (``SETTINGS_MAX_CONCURRENT_STREAMS``; past it
  ``REFUSED_STREAM``), metadata bytes per call, message bytes (``RESOURCE_EXHAUSTED``), the
  bytes of messages partly arrived, all calls together (``max_message_bytes`` times four, at
  least 256 MiB: a message past it waits, see
  :class:`~torchplace.serve.grpc_call.MessageBudget`), open connections (past it a new one is
  closed at once), the time a new connection has to send its preface, and how long one may
  stay open without a call (then GOAWAY);
- the frames written keep to the client's SETTINGS_MAX_FRAME_SIZE (a header block past it goes
  on in CONTINUATION frames), and a status's details to 4 KiB percent-encoded (many quote what
  the client sent);
- frames that come late on a stream this side reset are ignored (RFC 9113 section 5.1) for
  :data:`_RESETS_KEPT_S` seconds after the reset (or the next :data:`_MOST_RESETS_KEPT` resets);
- a protocol error ends the connection with GOAWAY and its code (RFC 9113's), and a connection
  closed while its client leaves bytes unread is cut after :data:`_LINGER_S`; a malformed
  request (a connection-specific field; a pseudo-header unknown, repeated, after a regular field;
  no ``:scheme``; a field value with NUL, CR or LF) is reset (``PROTOCOL_ERROR``); a method no
  handler serves is ``UNIMPLEMENTED``; a request that is not gRPC gets HTTP 415 (wrong content
  type) or 405 (not a POST);
- :meth:`WireServer.stop`: GOAWAY on every connection (no new call is taken), the calls in
  flight get the grace to finish, then are cancelled (``UNAVAILABLE``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, cast

import grpc
from hpack import Decoder
from hpack.exceptions import HPACKError

from torchplace.serve.grpc_call import (
    UNREAD_LIMIT,
    Aborted,
    Call,
    MessageBudget,
    decode_metadata,
    parse_timeout,
)
from torchplace.serve.h2frames import (
    ACK,
    END_HEADERS,
    END_STREAM,
    FRAME_HEAD,
    PADDED,
    PREFACE,
    PRIORITY_FLAG,
    ErrorCode,
    FrameType,
    Setting,
    frame,
    header_block,
    header_frames,
    percent_encode,
    status_details,
)

__all__ = ["Connection", "WireLimits", "WireServer"]

logger = logging.getLogger("torchplace.serve")

#: the frames the server takes (SETTINGS_MAX_FRAME_SIZE: HTTP/2's default)
MAX_FRAME = 16384
#: each stream's receive window, and the connection's
STREAM_WINDOW = UNREAD_LIMIT
CONNECTION_WINDOW = 64 * 1024 * 1024
#: a header block (HEADERS and its CONTINUATIONs) longer than this ends the connection
_MAX_HEADER_BLOCK = 256 * 1024
_WINDOW_MAX = 2**31 - 1
_WINDOW_INCREMENT = struct.Struct(">I")
_GRPC_FIELDS = ((b"content-type", b"application/grpc"),)
_ANSWER_HEADERS = header_block(
    200, (*_GRPC_FIELDS, (b"grpc-accept-encoding", b"identity,deflate,gzip"))
)
_OK_TRAILERS = header_block(200, ((b"grpc-status", b"0"),))[1:]
_PREFIX = b"\x00"
#: an HPACK dynamic table size update to 0 (RFC 7541 section 6.3)
_TABLE_SIZE_0 = b"\x20"
#: request headers that are the protocol's, not the call's metadata
_NOT_METADATA = frozenset((b"content-type", b"te", b"grpc-timeout", b"grpc-encoding",
                           b"grpc-accept-encoding"))  # fmt: skip
#: the pseudo-headers a request may carry, once each and before its other fields
_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))
#: fields HTTP/2 forbids (RFC 9113 section 8.2.2): a request with one is malformed
_CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection",
                                  b"transfer-encoding", b"upgrade"))  # fmt: skip
#: how long a closed connection may take to write what is left to a client that does not read
_LINGER_S = 5.0
#: the frames read from one connection in one pass of the event loop (the other connections
#: and the handlers run between passes)
_FRAMES_PER_PASS = 512
#: the bytes that are each a whole HPACK indexed field (RFC 7541 section 6.1: index 1 to 126);
#: a header block of these only reads the dynamic table, so what it says is the same each time
#: it comes until a block of any other kind is decoded (see Connection._heads)
_INDEXED_FIELDS = bytes(range(0x81, 0xFF))
#: the distinct header blocks a connection keeps read (clients send a handful), and the
#: longest kept (a call's block of indexed fields is a byte a field: about ten)
_MOST_HEADS = 64
_MOST_HEAD_BYTES = 128
#: how long a stream this side reset is remembered at least, its late frames ignored (see
#: _RecentResets): what the client sent before our RST_STREAM reached it comes within an RTT
_RESETS_KEPT_S = 10.0
#: the resets a connection remembers from those seconds, at most (twice this at once: memory
#: against a client that makes the server reset streams as fast as it can open them)
_MOST_RESETS_KEPT = 8192
#: stale entries the stalled-calls heap may hold before it is rebuilt without them
_STALE_ENTRIES = 64


class WireLimits(NamedTuple):
    """The bounds of :class:`WireServer` (see the module docstring)."""

    max_message_bytes: int
    max_streams: int = 4096
    max_metadata_bytes: int = 16 * 1024
    idle_timeout_s: float = 300.0
    handshake_timeout_s: float = 30.0
    max_connections: int = 1024
    #: how long a request message let into the server's budget may take to arrive in full
    message_timeout_s: float = 30.0


class _ProtocolError(Exception):
    def __init__(self, code: ErrorCode, why: str) -> None:
        super().__init__(why)
        self.code = code


class _Details(NamedTuple):  # grpc.HandlerCallDetails, as a generic handler reads it
    method: str
    invocation_metadata: tuple[tuple[str, str | bytes], ...]


def _status_trailers(code: grpc.StatusCode, details: str) -> bytes:
    """The trailers of a status: its details cut to what clients take (many quote what the
    client sent: a header's value, a metadata key)."""
    fields = [(b"grpc-status", str(code.value[0]).encode())]
    if details:
        fields.append((b"grpc-message", percent_encode(status_details(details))))
    return header_block(200, tuple(fields))[1:]


class _RecentResets:
    """The streams this side reset lately, whose late frames are ignored (RFC 9113 section
    5.1: the client may have sent them before our RST_STREAM reached it). Two generations of
    ids, a new one begun when the last is :data:`_RESETS_KEPT_S` old or holds
    :data:`_MOST_RESETS_KEPT`: a reset is remembered at least that long, unless that many
    came after it, with no timer and no clock per stream."""

    def __init__(self) -> None:
        self._new: set[int] = set()
        self._old: set[int] = set()
        self._since = time.monotonic()

    def __len__(self) -> int:
        return len(self._new) + len(self._old)

    def __contains__(self, stream: int) -> bool:
        self._age()
        return stream in self._new or stream in self._old

    def add(self, stream: int) -> None:
        self._age()
        if len(self._new) >= _MOST_RESETS_KEPT:
            self._old, self._new = self._new, set()
        self._new.add(stream)

    def _age(self) -> None:
        """Begin a new generation once this one is :data:`_RESETS_KEPT_S` old, dropping the
        one before (its ids are all older than that). Once it is twice that old, it goes too:
        each of its ids was added within its first :data:`_RESETS_KEPT_S` (a later add would
        have begun a new one), so all are past the time."""
        now = time.monotonic()
        age = now - self._since
        if age >= _RESETS_KEPT_S:
            self._old = self._new if age < 2 * _RESETS_KEPT_S else set()
            self._new, self._since = set(), now


class WireServer:
    """Serves ``handlers`` (grpc.aio's generic handlers) on one listening socket."""

    def __init__(self, handlers: Sequence[grpc.GenericRpcHandler], limits: WireLimits) -> None:
        self.handlers = tuple(handlers)
        self.limits = limits
        self.connections: set[Connection] = set()
        self.stopping = False
        self._methods: dict[bytes, grpc.RpcMethodHandler | None] = {}
        self._listener: asyncio.Server | None = None
        #: the bytes of request messages partly arrived, every connection's calls together
        #: (four message limits, at least 256 MiB: the HTTP server's body budget)
        self.budget = MessageBudget(max(4 * limits.max_message_bytes, 256 << 20))

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port``; the port bound (OSError when it cannot)."""
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(lambda: Connection(self), host, port)
        bound: int = self._listener.sockets[0].getsockname()[1]
        return bound

    def method(self, path: bytes) -> grpc.RpcMethodHandler | None:
        """The handler of ``path`` (``/package.Service/Method``), None when none serves it."""
        if path in self._methods:
            return self._methods[path]
        found = None
        details = _Details(path.decode("latin-1"), ())
        for handler in self.handlers:
            found = handler.service(details)
            if found is not None:
                break
        if len(self._methods) < 1024:  # bounded: clients may ask for any path
            self._methods[path] = found
        return found

    async def stop(self, grace: float | None) -> None:
        """GOAWAY on every connection, the calls in flight get ``grace`` seconds (None: none)
        to finish, then are cancelled and the connections closed."""
        self.stopping = True
        if self._listener is not None:
            self._listener.close()
        for connection in list(self.connections):
            connection.go_away(ErrorCode.NO_ERROR)
        deadline = time.monotonic() + (grace or 0.0)
        while any(c.calls for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            connection.abandon()
        ends = time.monotonic() + 1.0
        while any(c.calls for c in self.connections) and time.monotonic() < ends:
            await asyncio.sleep(0.01)  # the cancelled handlers end
        for connection in list(self.connections):
            connection.close()
        if self._listener is not None:
            await self._listener.wait_closed()


class Connection(asyncio.Protocol):
    """One client's HTTP/2 connection: its frames in, its calls, their answers out."""

    def __init__(self, server: WireServer) -> None:
        self.server = server
        self.limits = server.limits
        self.calls: dict[int, Call] = {}
        self.peer_window = 65535  # the client's SETTINGS_INITIAL_WINDOW_SIZE
        self.peer_frame = 16384  # the client's SETTINGS_MAX_FRAME_SIZE
        self.send_window = 65535  # the connection's, from the client's WINDOW_UPDATEs
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._preface = False
        self._decoder = Decoder()
        self._decoder.max_header_list_size = _MAX_HEADER_BLOCK
        #: header blocks of indexed fields only, read: a client sends the same few again and
        #: again (the same method, authority, content type), each costing a decode and a check
        #: of every field; emptied when a block that may change the dynamic table is decoded
        self._heads: dict[bytes, _Head] = {}
        self._last_stream = 0
        #: streams this side reset (RST_STREAM) lately, while the client might still be
        #: sending on them: their late frames are ignored (RFC 9113 section 5.1); a frame on
        #: any other closed stream is the client's error
        self._reset_out = _RecentResets()
        self._headers: tuple[int, int, bytearray] | None = None  # a block awaiting CONTINUATION
        self._received = 0  # connection-window bytes not yet credited back
        self._out: list[bytes] = []
        self._flush_soon = False
        self._reading = False  # in _read: what the frames make is written once at its end
        #: calls with answer bytes waiting on the connection's window (oldest first)
        self._blocked: OrderedDict[int, Call] = OrderedDict()
        #: calls with answer bytes waiting on their stream's window: a heap of [the
        #: ``peer_window`` the call needs to send again, a tie-breaker, the call or None once
        #: stale], so that a SETTINGS frame only touches the calls it lets send
        self._stalled: list[list[Any]] = []
        self._stale = 0
        self._order = itertools.count()
        self.paused = False  # the client does not read what was written: handlers wait
        self._backlog = False  # frames left unread until the loop's next pass
        #: the HPACK dynamic table size the client allows our header blocks (never used), and
        #: whether the next block must say it is now 0
        self._table_size = 4096
        self._table_update = False
        self._going_away = False
        self._active = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport = transport
        if len(self.server.connections) >= self.limits.max_connections or self.server.stopping:
            transport.abort()
            return
        self.server.connections.add(self)
        settings = b"".join(
            int(key).to_bytes(2, "big") + value.to_bytes(4, "big")
            for key, value in (
                (Setting.MAX_CONCURRENT_STREAMS, self.limits.max_streams),
                (Setting.INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (Setting.MAX_HEADER_LIST_SIZE, self.limits.max_metadata_bytes),
            )
        )
        grow = (CONNECTION_WINDOW - 65535).to_bytes(4, "big")
        transport.write(frame(FrameType.SETTINGS, 0, 0, settings)
                        + frame(FrameType.WINDOW_UPDATE, 0, 0, grow))  # fmt: skip
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.limits.handshake_timeout_s, self._check_idle)

    def pause_writing(self) -> None:
        """The client reads slower than the server writes: read no more of it (what it sends
        would only queue more answers, acknowledgements among them), and streaming handlers
        wait (:meth:`Call.sent`), until it catches up."""
        self.paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        transport = self._transport
        if not self._backlog and transport is not None and not transport.is_closing():
            transport.resume_reading()
        for call in list(self.calls.values()):
            call.writable()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        self.abandon(reset=True)
        for call in self.calls.values():  # a call answered already has no handler to end it
            call.release()
            call.ended()
        self._transport = None

    def _check_idle(self) -> None:
        """The handshake timer, then the idle one: a connection with no preface by the
        handshake timeout, or no call for the idle timeout, is closed."""
        if self._transport is None:
            return
        if not self._preface:
            self._transport.abort()
            return
        loop = asyncio.get_running_loop()
        quiet = time.monotonic() - self._active
        idle = self.limits.idle_timeout_s
        if not self.calls and quiet >= idle:
            self.go_away(ErrorCode.NO_ERROR)
            self.close()
            return
        self._timer = loop.call_later(idle if self.calls else idle - quiet, self._check_idle)

    def go_away(self, code: ErrorCode, why: str = "") -> None:
        """Tell the client no call past the last one it opened will be taken."""
        if self._transport is None or self._going_away:
            return
        self._going_away = True
        payload = self._last_stream.to_bytes(4, "big") + int(code).to_bytes(4, "big")
        self._send(frame(FrameType.GOAWAY, 0, 0, payload + why.encode()[:256]))
        self._write_out()

    def abandon(self, reset: bool = False) -> None:
        """Cancel every call's handler (``reset``: the connection is gone, and with it the
        calls' deadlines)."""
        for call in list(self.calls.values()):
            call.reset = call.reset or reset
            if reset and call.timer is not None:
                call.timer.cancel()
            if call.task is not None and not call.task.done():
                call.task.cancel()

    def close(self) -> None:
        """Close the connection once what is written is sent (cut after :data:`_LINGER_S`
        when the client does not read it)."""
        if self._transport is not None:
            self._write_out()
            self._transport.close()
            if self._transport.get_write_buffer_size():
                asyncio.get_running_loop().call_later(_LINGER_S, self._cut)

    def _cut(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # -- reading ---------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._backlog:  # else it is read on the loop's next pass (_catch_up)
            self._read()

    def _read(self) -> None:
        """Read what the buffer holds (the preface first) and write the answers; a protocol
        error ends the connection."""
        self._reading = True
        try:
            if self._preface or self._read_preface():
                self._read_frames()
        except _ProtocolError as exc:
            self.go_away(exc.code, str(exc))
            self.close()
        finally:
            self._reading = False
        self._write_out()

    def _read_preface(self) -> bool:
        """Take the client's connection preface off the buffer; False until all of it came."""
        buffer = self._buffer
        if len(buffer) < len(PREFACE):
            if not PREFACE.startswith(bytes(buffer)):
                raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 preface")
            return False
        if buffer[: len(PREFACE)] != PREFACE:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 preface")
        del buffer[: len(PREFACE)]
        self._preface = True
        self._active = time.monotonic()
        return True

    def _read_frames(self) -> None:
        """The whole frames in the buffer, up to :data:`_FRAMES_PER_PASS`: past them the
        connection is read no further until the loop's next pass (so that a client's flood of
        small frames holds the other clients up by that many frames, not by all it sent)."""
        buffer = self._buffer
        view = memoryview(buffer)
        position, end, left = 0, len(buffer), _FRAMES_PER_PASS
        try:
            while end - position >= 9 and self._transport is not None:
                if not left:
                    self._defer()
                    break
                left -= 1
                high, low, kind, flags, stream = FRAME_HEAD.unpack_from(buffer, position)
                size = high << 16 | low
                if size > MAX_FRAME:
                    raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, f"a frame of {size} B")
                if end - position < 9 + size:
                    break
                stream &= _WINDOW_MAX
                if (
                    kind == FrameType.WINDOW_UPDATE
                    and size == 4
                    and self._window_credit(stream, buffer, position + 9)
                ):
                    position += 13  # taken without a payload copy: see _window_credit
                    continue
                payload = bytes(view[position + 9 : position + 9 + size])
                position += 9 + size
                self._frame(kind, flags, stream, payload)
        finally:
            view.release()
            del buffer[:position]

    def _defer(self) -> None:
        if not self._backlog and self._transport is not None:
            self._backlog = True
            self._transport.pause_reading()
            asyncio.get_running_loop().call_soon(self._catch_up)

    def _catch_up(self) -> None:
        """The loop's next pass: the frames left from the last read, then read on."""
        self._backlog = False
        if self._transport is None:
            return
        self._read()
        transport = self._transport
        if not self._backlog and not self.paused and transport and not transport.is_closing():
            transport.resume_reading()

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if self._headers is not None and kind != FrameType.CONTINUATION:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "a header block was cut off")
        if kind == FrameType.DATA:
            self._data(flags, stream, payload)
        elif kind == FrameType.HEADERS:
            self._header_frame(flags, stream, payload)
        elif kind == FrameType.CONTINUATION:
            self._continuation(flags, stream, payload)
        elif kind == FrameType.SETTINGS:
            self._settings(flags, stream, payload)
        elif kind == FrameType.WINDOW_UPDATE:
            self._window_update(stream, payload)
        elif kind == FrameType.RST_STREAM:
            self._reset(stream, payload)
        elif kind == FrameType.PING:
            if stream:
                raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, f"a PING of {len(payload)} B")
            if not flags & ACK:
                self._send(frame(FrameType.PING, ACK, 0, payload))
        elif kind == FrameType.GOAWAY:
            self._going_away = True  # the client opens no more streams
        elif kind == FrameType.PUSH_PROMISE:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "a client may not push")
        elif kind == FrameType.PRIORITY and not stream:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
        elif kind == FrameType.PRIORITY and len(payload) != 5:
            raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, f"a PRIORITY of {len(payload)} B")
        elif kind == FrameType.PRIORITY:
            _own_dependency(stream, payload)
        # PRIORITY and unknown frame types are ignored (RFC 9113 sections 5.3.2, 5.5)

    def _data(self, flags: int, stream: int, payload: bytes) -> None:
        if not stream:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        flow = len(payload)  # padding included
        self._received += flow
        if self._received > CONNECTION_WINDOW:
            raise _ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "DATA past the connection window")
        if self._received >= CONNECTION_WINDOW // 2:
            self._send(frame(FrameType.WINDOW_UPDATE, 0, 0, self._received.to_bytes(4, "big")))
            self._received = 0
        if flags & PADDED:
            payload = _unpad(payload)
        call = self.calls.get(stream)
        if call is None:
            if stream > self._last_stream:
                raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, f"DATA on idle stream {stream}")
            self._on_closed(stream, "DATA")  # late DATA on a stream this side reset: dropped
            return
        if call.remote_closed:  # after the client's END_STREAM (section 5.1, half-closed)
            self.reset_stream(call, ErrorCode.STREAM_CLOSED)
            return
        if call.finished:  # its status is decided (its answer may wait on the client's window)
            if flags & END_STREAM:  # what more it sends is not read, nor held
                call.end_of_requests()
            return
        call.withheld += flow
        if call.withheld > STREAM_WINDOW:
            self._send_reset(stream, ErrorCode.FLOW_CONTROL_ERROR)
            self._drop(stream)
            return
        ending = call.feed(payload)
        if ending is not None:
            self._end_stream_call(call, *ending)
        elif flags & END_STREAM:
            call.end_of_requests()
        elif call.unread < UNREAD_LIMIT and call.withheld >= STREAM_WINDOW // 4 and not call.wanted:
            self.credit(call)  # else credited as the handler reads, or its message is let in

    def credit(self, call: Call) -> None:
        """Give back a call's withheld stream window (its handler read what held it); none
        to a call whose handler reads no more (its withheld bytes still count against the
        window, so a client that sends past it is reset)."""
        if not call.reading:
            return
        if call.withheld and not call.remote_closed and call.stream in self.calls:
            self._send(frame(FrameType.WINDOW_UPDATE, 0, call.stream,
                             call.withheld.to_bytes(4, "big")))  # fmt: skip
            self._flush_later()
        call.withheld = 0

    def _header_frame(self, flags: int, stream: int, payload: bytes) -> None:
        if not stream:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & PADDED:
            payload = _unpad(payload)
        if flags & PRIORITY_FLAG:
            _own_dependency(stream, payload)
            payload = payload[5:]
        if flags & END_HEADERS:
            self._headers_done(flags, stream, payload)
        else:
            self._headers = (stream, flags, bytearray(payload))

    def _continuation(self, flags: int, stream: int, payload: bytes) -> None:
        if self._headers is None or self._headers[0] != stream:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "CONTINUATION out of place")
        _, first, block = self._headers
        block += payload
        if len(block) > _MAX_HEADER_BLOCK:
            raise _ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, "a header block over 256 KiB")
        if flags & END_HEADERS:
            self._headers = None
            self._headers_done(first, stream, bytes(block))

    def _headers_done(self, flags: int, stream: int, block: bytes) -> None:
        call = self.calls.get(stream)
        if call is not None or stream <= self._last_stream:  # trailers of a request
            fields = self._decode(block)  # decoded whatever follows: the HPACK table moves on
            if call is None:
                self._on_closed(stream, "HEADERS")
            elif call.remote_closed:
                self.reset_stream(call, ErrorCode.STREAM_CLOSED)  # after the client's END_STREAM
            elif any(name.startswith(b":") for name, _ in fields):
                self.reset_stream(call, ErrorCode.PROTOCOL_ERROR)  # pseudo-headers: malformed
            elif flags & END_STREAM:
                call.end_of_requests()
            else:
                self._end_stream_call(call, grpc.StatusCode.INTERNAL, "trailers without END_STREAM")
            return
        head = self._heads.get(block)
        if head is None:
            head = _read_head(self._decode(block))
            if len(block) <= _MOST_HEAD_BYTES and not block.translate(None, _INDEXED_FIELDS):
                if len(self._heads) >= _MOST_HEADS:
                    self._heads.clear()
                self._heads[block] = head
        if stream % 2 == 0:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, f"a client stream id {stream} is even")
        self._last_stream = stream
        self._open(stream, head, bool(flags & END_STREAM))

    def _on_closed(self, stream: int, kind: str) -> None:
        """A frame on a closed stream at or below the last one opened: ignored when this side
        reset the stream (the client may have sent it before the reset reached it), else a
        connection error: a new stream's id must exceed every earlier one, and a stream the
        client ended or reset takes no more (RFC 9113 sections 5.1, 5.1.1)."""
        if stream in self._reset_out:
            return
        raise _ProtocolError(
            ErrorCode.STREAM_CLOSED if kind == "DATA" else ErrorCode.PROTOCOL_ERROR,
            f"{kind} on stream {stream}, which is closed (streams opened so far reach "
            f"{self._last_stream}; a new one needs a higher odd id)",
        )

    def _send_reset(self, stream: int, code: ErrorCode) -> None:
        """RST_STREAM ``code`` on ``stream``, remembered: the client's frames already on their
        way are ignored when they come (see :class:`_RecentResets`)."""
        self._send(frame(FrameType.RST_STREAM, 0, stream, int(code).to_bytes(4, "big")))
        self._reset_out.add(stream)

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """A header block's fields. A block that is not all indexed fields may change the
        dynamic table, on which the cached heads' meaning rests: they are dropped."""
        try:
            fields = self._decoder.decode(block, raw=True)
        except HPACKError as exc:
            raise _ProtocolError(ErrorCode.COMPRESSION_ERROR, f"a header block: {exc}") from None
        if block.translate(None, _INDEXED_FIELDS):
            self._heads.clear()
        return cast("list[tuple[bytes, bytes]]", fields)

    def _open(self, stream: int, head: _Head, ended: bool) -> None:
        """A new call: check it, find its handler, run it."""
        if self._going_away or len(self.calls) >= self.limits.max_streams:
            self._send_reset(stream, ErrorCode.REFUSED_STREAM)
            return
        self._active = opened = time.monotonic()
        if head.unlawful:  # a malformed request: a stream error
            self._send_reset(stream, ErrorCode.PROTOCOL_ERROR)
            return
        if head.refusal is not None:
            self._headers_out(END_HEADERS | END_STREAM, stream, head.refusal)
            if not ended:  # answered: what more the client sends is not wanted (section 8.1)
                self._send_reset(stream, ErrorCode.NO_ERROR)
            return
        timeout = head.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        call = Call(self, stream, head.metadata, deadline, head.encoding,
                    self.limits.max_message_bytes, opened)  # fmt: skip
        self.calls[stream] = call
        if ended:
            call.end_of_requests()
        if head.size > self.limits.max_metadata_bytes:
            why = (
                f"the call's metadata is {head.size} bytes, past the hard limit of "
                f"{self.limits.max_metadata_bytes}; send less metadata"
            )
            self._end_stream_call(call, grpc.StatusCode.RESOURCE_EXHAUSTED, why)
            return
        if head.malformed:
            self._end_stream_call(call, grpc.StatusCode.INTERNAL, head.malformed)
            return
        handler = self.server.method(head.path)
        if handler is None:
            self._end_stream_call(call, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        if timeout == 0:  # a deadline past already: its handler does not run (as gRPC core)
            self._end_stream_call(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            return
        loop = asyncio.get_running_loop()
        call.task = loop.create_task(_run(call, handler))
        if timeout is not None:
            call.timer = loop.call_later(timeout, _expire, call)

    def _settings(self, flags: int, stream: int, payload: bytes) -> None:
        if stream:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a SETTINGS frame of odd length")
        grew = False
        for at in range(0, len(payload), 6):
            key = int.from_bytes(payload[at : at + 2], "big")
            value = int.from_bytes(payload[at + 2 : at + 6], "big")
            if key == Setting.INITIAL_WINDOW_SIZE:
                if value > _WINDOW_MAX:
                    raise _ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "a window over 2^31-1")
                grew = grew or value > self.peer_window
                self.peer_window = value  # every stream's window moves with it (Call.window)
            elif key == Setting.MAX_FRAME_SIZE:
                if not 16384 <= value <= 16777215:
                    raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, f"a frame size of {value}")
                self.peer_frame = value
            elif key == Setting.HEADER_TABLE_SIZE and value < self._table_size:
                self._table_size, self._table_update = 0, True
            elif key == Setting.ENABLE_PUSH and value > 1:
                raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH of {value}")
        self._send(frame(FrameType.SETTINGS, ACK, 0))
        if grew:
            self._pump_stalled()

    def _window_credit(self, stream: int, buffer: bytearray, at: int) -> bool:
        """The common WINDOW_UPDATE (its 4-byte payload at ``at``) taken on the spot, without
        a copy (a client sends two per answer it reads: its connection's and the finished
        stream's): outside a header block, a credit to an open connection window that stays
        lawful, or to a stream already closed (ignored, RFC 9113 section 6.9). False leaves
        the frame to :meth:`_frame`, which checks and answers everything else."""
        if self._headers is not None:
            return False
        increment = _WINDOW_INCREMENT.unpack_from(buffer, at)[0] & _WINDOW_MAX
        if not increment:
            return False
        if not stream:
            if self.send_window <= 0 or self.send_window + increment > _WINDOW_MAX:
                return False
            self.send_window += increment
            return True
        return stream not in self.calls and stream <= self._last_stream

    def _window_update(self, stream: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE")
        increment = int.from_bytes(payload, "big") & _WINDOW_MAX
        if not stream:
            if not increment:
                raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            if self.send_window + increment > _WINDOW_MAX:
                raise _ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "a window over 2^31-1")
            opened = self.send_window <= 0  # else no call waits on it (they wait on streams)
            self.send_window += increment
            if opened:
                self._pump_all()
            return
        call = self.calls.get(stream)
        if call is None:
            if stream > self._last_stream:
                raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle {stream}")
            return
        if not increment:  # a stream error (RFC 9113 section 6.9)
            self.reset_stream(call, ErrorCode.PROTOCOL_ERROR)
        elif self.peer_window + call.window + increment > _WINDOW_MAX:
            self.reset_stream(call, ErrorCode.FLOW_CONTROL_ERROR)
        else:
            call.window += increment
            if call.stall is not None:
                self._unstall(call)
            self._pump(call)

    def _reset(self, stream: int, payload: bytes) -> None:
        if not stream:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise _ProtocolError(ErrorCode.FRAME_SIZE_ERROR, f"a RST_STREAM of {len(payload)} B")
        if stream > self._last_stream:
            raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream}")
        self._drop(stream)

    def _drop(self, stream: int) -> None:
        """Forget a reset stream's call and cancel its handler (nothing more is sent on it)."""
        call = self.calls.get(stream)
        if call is not None:
            self.forget(call)
            call.reset = True
            call.writable()
            if call.task is not None:
                call.task.cancel()

    # -- writing ---------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        self._out.append(data)

    def _headers_out(self, flags: int, stream: int, block: bytes) -> None:
        if self._table_update:  # the client shrank the HPACK table: say ours is 0 (RFC 7541 4.2)
            self._table_update = False
            block = _TABLE_SIZE_0 + block
        self._send(header_frames(flags, stream, block, self.peer_frame))

    def _flush_later(self) -> None:
        if not self._flush_soon:
            self._flush_soon = True
            asyncio.get_running_loop().call_soon(self._write_out)

    def _write_out(self) -> None:
        self._flush_soon = False
        if self._out:
            out, self._out = self._out, []
            if self._transport is not None and not self._transport.is_closing():
                self._transport.write(b"".join(out))

    def answer(self, call: Call, message: bytes) -> None:
        """One answer message of ``call``, sent as its windows allow; the caller then ends the
        call (:meth:`finish`) or calls :meth:`flush`, so that each answer is written as it is
        made (a client that does not read then pauses the handlers: see ``pause_writing``)."""
        if call.reset:
            return
        if not call.headers_sent:
            call.headers_sent = True
            self._headers_out(END_HEADERS, call.stream, _ANSWER_HEADERS)
        data = _PREFIX + len(message).to_bytes(4, "big") + message
        size = len(data)
        if (  # the common answer: one frame the windows take now, sent without the queue
            not call.pending
            and size <= self.peer_frame
            and size <= self.send_window
            and size <= self.peer_window + call.window
        ):
            self._send_data(call, data)
            call.writable()
            return
        call.pending += data
        self._pump(call)

    def finish(self, call: Call, code: grpc.StatusCode, details: str = "") -> None:
        """End ``call`` with its status (after its answer bytes), written at once: when a batch's
        calls end in one pass of the loop, the client takes up the first answers (and sends its
        next requests) while the later ones are made, instead of all of them after the last.
        Calls refused while their frames are read are written together once the read ends: a
        client's read of many bad calls costs one write, not one each."""
        if call.finished or call.reset:
            return
        call.finished = True
        if not call.headers_sent and not call.pending:
            block = _ANSWER_HEADERS + (_OK_TRAILERS if code == grpc.StatusCode.OK
                                       else _status_trailers(code, details))  # fmt: skip
            self._headers_out(END_HEADERS | END_STREAM, call.stream, block)
            self._closed(call)
        else:
            call.trailers = (
                _OK_TRAILERS if code == grpc.StatusCode.OK else _status_trailers(code, details)
            )
            self._pump(call)
        self.flush()

    def flush(self) -> None:
        """Write what is waiting now, or, while a read's frames are read, once the read ends."""
        if self._reading:
            self._flush_later()
        else:
            self._write_out()

    def _end_stream_call(self, call: Call, code: grpc.StatusCode, details: str) -> None:
        """End a call from the wire side: its status, and its handler cancelled."""
        self.finish(call, code, details)
        if call.task is not None:
            call.task.cancel()

    def message_overdue(self, call: Call) -> None:
        """``call``'s message, let into the server's budget, did not arrive in full within
        ``message_timeout_s``: the call ends, and its room goes to the calls waiting (a client
        that paused, or meant to hold the room, keeps no other's message waiting long)."""
        size, timeout = call.reserved, self.server.limits.message_timeout_s
        call.release()
        if self.calls.get(call.stream) is call:
            self._end_stream_call(call, grpc.StatusCode.DEADLINE_EXCEEDED, (
                f"the request message of {size} bytes did not arrive in full within "
                f"{timeout:g} s (--request-timeout); send it without pausing, or raise "
                "--request-timeout"
            ))  # fmt: skip

    def reset_stream(self, call: Call, code: ErrorCode) -> None:
        """End ``call``'s stream with RST_STREAM ``code``: nothing more is sent on it."""
        self._send_reset(call.stream, code)
        self._drop(call.stream)
        self._flush_later()

    def forget(self, call: Call) -> None:
        """The call is over: drop it, its place in the queues and its deadline."""
        self.calls.pop(call.stream, None)
        self._blocked.pop(call.stream, None)
        call.release()
        call.ended()
        if call.stall is not None:
            self._unstall(call)
        if call.timer is not None:
            call.timer.cancel()

    def _closed(self, call: Call) -> None:
        """The call's last frame is out: forget it (and reset a request stream the client
        is still sending on: it has its answer)."""
        self.forget(call)
        if not call.remote_closed:
            self._send_reset(call.stream, ErrorCode.NO_ERROR)
        if not self.calls:
            self._active = time.monotonic()

    def _send_data(self, call: Call, data: bytes) -> None:
        """A DATA frame of ``call``'s answer bytes, taken from both windows it spends."""
        self._send(frame(FrameType.DATA, 0, call.stream, data))
        call.window -= len(data)
        self.send_window -= len(data)

    def _pump(self, call: Call) -> None:
        """Send what the windows allow of ``call``'s answer bytes, then its trailers."""
        pending = call.pending
        while pending:
            room = min(len(pending), self.peer_window + call.window, self.send_window,
                       self.peer_frame)  # fmt: skip
            if room <= 0:
                if self.peer_window + call.window <= 0:
                    self._stall(call)
                else:
                    self._blocked[call.stream] = call
                return
            self._send_data(call, bytes(pending[:room]))
            del pending[:room]
        self._blocked.pop(call.stream, None)
        call.writable()
        if call.trailers is not None:
            self._headers_out(END_HEADERS | END_STREAM, call.stream, call.trailers)
            call.trailers = None
            self._closed(call)

    def _pump_all(self) -> None:
        """The connection's window opened: the calls waiting on it send, oldest first (each
        visit sends, or moves the call to wait on its stream)."""
        blocked = self._blocked
        while blocked and self.send_window > 0:
            self._pump(blocked.popitem(last=False)[1])
        self._flush_later()

    def _stall(self, call: Call) -> None:
        """``call`` waits on its stream's window: until a WINDOW_UPDATE on its stream, or a
        SETTINGS_INITIAL_WINDOW_SIZE past ``-call.window``."""
        if call.stall is None:
            call.stall = [-call.window, next(self._order), call]
            heapq.heappush(self._stalled, call.stall)

    def _unstall(self, call: Call) -> None:
        assert call.stall is not None
        call.stall[2] = None  # left in the heap, skipped (rebuilt once mostly stale)
        call.stall = None
        self._stale += 1
        if self._stale > _STALE_ENTRIES and 2 * self._stale > len(self._stalled):
            self._stalled = [entry for entry in self._stalled if entry[2] is not None]
            heapq.heapify(self._stalled)
            self._stale = 0

    def _pump_stalled(self) -> None:
        """SETTINGS_INITIAL_WINDOW_SIZE grew: the stalled calls it gives room to send."""
        stalled = self._stalled
        while stalled and stalled[0][0] < self.peer_window:
            call: Call | None = heapq.heappop(stalled)[2]
            if call is None:
                self._stale -= 1
                continue
            call.stall = None
            self._pump(call)
        self._flush_later()


class _Head(NamedTuple):
    """What a request's header block says of its call (see :func:`_read_head`)."""

    unlawful: bool  # malformed as HTTP/2 (RFC 9113 section 8.3): the stream is reset
    refusal: bytes | None  # the answer to a request that is not a gRPC call
    malformed: str  # why the call ends at once with INTERNAL ("" when it does not)
    size: int  # the metadata's size as gRPC core counts it
    metadata: tuple[tuple[str, str | bytes], ...]
    path: bytes
    encoding: bytes
    timeout: float | None  # grpc-timeout in seconds


def _read_head(fields: Iterable[tuple[bytes, bytes]]) -> _Head:
    """Check a request's header fields and read what its call needs of them."""
    pseudo: dict[bytes, bytes] = {}
    metadata: list[tuple[str, str | bytes]] = []
    headers: dict[bytes, bytes] = {}
    size, malformed, unlawful = 0, "", False
    for name, value in fields:
        size += len(name) + len(value) + 32
        # RFC 9113 section 8.2.1: a field value with NUL, CR or LF makes the request malformed
        unlawful = unlawful or b"\0" in value or b"\r" in value or b"\n" in value
        if name.startswith(b":"):  # RFC 9113 section 8.3: known, once, before the rest
            unlawful = unlawful or bool(headers) or name in pseudo or name not in _PSEUDO
            pseudo[name] = value
        else:
            headers[name] = value
            if name not in _NOT_METADATA:
                unlawful = unlawful or name in _CONNECTION_SPECIFIC
                try:
                    metadata.append(decode_metadata(name, value))
                except ValueError as exc:
                    malformed = str(exc)
    unlawful = unlawful or b":scheme" not in pseudo
    if headers.get(b"te", b"trailers") != b"trailers":
        malformed = (
            f"te {headers[b'te'].decode('latin-1')!r} is not allowed; send te: trailers or no te"
        )
    given = headers.get(b"grpc-timeout")
    timeout = None if given is None else parse_timeout(given)
    if given is not None and timeout is None:
        malformed = (
            f"grpc-timeout {given.decode('latin-1')!r} is malformed; send up to 8 digits "
            "and a unit (H, M, S, m, u, n)"
        )
    return _Head(
        unlawful=unlawful,
        refusal=None if unlawful else _refusal(pseudo, headers),
        malformed=malformed,
        size=size,
        metadata=tuple(metadata),
        path=pseudo.get(b":path", b""),
        encoding=headers.get(b"grpc-encoding", b"identity"),
        timeout=timeout,
    )


def _own_dependency(stream: int, payload: bytes) -> None:
    """A priority (of HEADERS or a PRIORITY frame) that makes a stream depend on itself: an
    error (RFC 9113 section 5.3.1), taken here for the connection (section 5.4.1 allows it)."""
    if len(payload) >= 4 and int.from_bytes(payload[:4], "big") & _WINDOW_MAX == stream:
        raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, f"stream {stream} depends on itself")


def _unpad(payload: bytes) -> bytes:
    if not payload or payload[0] >= len(payload):
        raise _ProtocolError(ErrorCode.PROTOCOL_ERROR, "padding past the frame's end")
    return payload[1 : len(payload) - payload[0]]


def _refusal(pseudo: dict[bytes, bytes], headers: dict[bytes, bytes]) -> bytes | None:
    """The header block answering a request that is not a gRPC call, None for a call."""
    if pseudo.get(b":method") != b"POST":
        status, why = 405, "gRPC requires the POST method"
    elif not headers.get(b"content-type", b"").startswith(b"application/grpc"):
        status, why = 415, "the content type is not application/grpc"
    elif not pseudo.get(b":path", b"").startswith(b"/"):
        status, why = 404, "no :path"
    else:
        return None
    code = grpc.StatusCode.UNIMPLEMENTED if status != 405 else grpc.StatusCode.INTERNAL
    return header_block(status, ((b"grpc-status", str(code.value[0]).encode()),
                                 (b"grpc-message", why.encode())))  # fmt: skip


def _expire(call: Call) -> None:
    """The call's deadline passed: cancel its handler (it ends with DEADLINE_EXCEEDED), or,
    when its answer is waiting on a window the client does not open, reset its stream."""
    if not call.done() and call.task is not None and not call.task.done():
        call.expired = True
        call.task.cancel()
    elif call.connection.calls.get(call.stream) is call:
        call.connection.reset_stream(call, ErrorCode.CANCEL)


async def _run(call: Call, handler: grpc.RpcMethodHandler) -> None:
    """Run ``handler`` on ``call`` and end the call with its status."""
    connection = call.connection
    serialize: Callable[[Any], bytes] = handler.response_serializer or _identity
    deserialize = handler.request_deserializer
    try:
        if handler.request_streaming:  # the request messages as they come, parsed if asked
            requests: Any = call.requests() if deserialize is None else _mapped(call, deserialize)
        else:
            message = await call.read()
            call.stop_reading()  # its one message: what more the client sends is dropped
            if message is grpc.aio.EOF:
                raise Aborted(grpc.StatusCode.INTERNAL, "the call ended without a request message")
            requests = message if deserialize is None else deserialize(message)
        if handler.response_streaming:
            behaviour = handler.stream_stream if handler.request_streaming else handler.unary_stream
            async for answer in behaviour(requests, call):
                connection.answer(call, serialize(answer))
                connection.flush()  # as a call's end is (see Connection.finish)
                await call.sent()
        else:
            behaviour = handler.stream_unary if handler.request_streaming else handler.unary_unary
            connection.answer(call, serialize(await behaviour(requests, call)))
        connection.finish(call, grpc.StatusCode.OK)
    except Aborted as exc:
        connection.finish(call, exc.code, exc.details)
    except asyncio.CancelledError:
        if call.expired:
            connection.finish(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        elif not call.reset:
            connection.finish(call, grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
        else:
            connection.forget(call)
    except Exception as exc:
        logger.exception("gRPC call %s failed", call.stream)
        connection.finish(call, grpc.StatusCode.UNKNOWN, f"Unexpected error: {type(exc).__name__}")


async def _mapped(call: Call, deserialize: Callable[[bytes], Any]) -> Any:
    async for message in call.requests():
        yield deserialize(message)


def _identity(data: bytes) -> bytes:
    return data
