"""One gRPC call on :mod:`torchplace.serve.grpc_wire`'s HTTP/2 connections: its request messages
as they arrive, its answers and status as the handler gives them, and the servicer context
the handlers of :mod:`torchplace.serve.grpc_server` use (``read``, ``abort``,
``invocation_metadata``, ``time_remaining``, ``done``), as grpc.aio's ``ServicerContext`` has
them.

A request message is read off the wire in gRPC's framing (a compressed flag, a 4-byte length,
the bytes): a message over the size limit ends the call with ``RESOURCE_EXHAUSTED``, one sent
compressed is inflated within the same limit (``gzip``, ``deflate``; a compressed stream cut
short or with bytes past its end is ``INTERNAL``), one in an encoding the server does not know
ends it with ``INTERNAL``, as does a compressed flag other than 0 or 1 (gRPC core's "Bad GRPC
frame type"). Answers are sent uncompressed.

A message that has begun to arrive but not ended holds the bytes its length prefix announces
in the server's :class:`MessageBudget` (every call of every connection together), until it ends
or its call does: a message that does not fit waits, its stream's flow-control window not
replenished (its client sends no more of it), until earlier ones are in; past
:data:`MAX_WAITING` such calls, a new one ends with ``RESOURCE_EXHAUSTED``. A message let in
must arrive in full within the server's ``message_timeout_s`` (``--request-timeout``), or its
call ends with ``DEADLINE_EXCEEDED`` and its room goes to those waiting. Without it, a client
that opened calls and sent most of a large message on each (never the rest) made the server
hold all of it: gigabytes from one connection in seconds.

A call whose handler takes one request message (a unary-request method: the transport's own,
or :mod:`~torchplace.serve.grpc_read`'s) reads no more once it has it (:meth:`Call.stop_reading`):
what the client sends after it is dropped as it arrives and its stream's window is not
replenished, as gRPC core does (it answers the first message and ignores the rest). Without
it, such a call held every message that came after its first (a health ``Watch`` stays open):
one connection of 50 of them made the server hold 350 MiB in 3 s.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import re
import time
import zlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

if TYPE_CHECKING:
    from torchplace.serve.grpc_wire import Connection

__all__ = ["MAX_WAITING", "Aborted", "Call", "MessageBudget", "parse_timeout"]

_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
#: bytes of complete messages a call holds unread before the client is told to wait (its
#: stream's flow-control window is not replenished past it)
UNREAD_LIMIT = 4 * 1024 * 1024
#: calls whose message waits for room in the server's MessageBudget, at most (each may have sent
#: up to its stream's window of it meanwhile); past it a new one ends with RESOURCE_EXHAUSTED
MAX_WAITING = 64
_WBITS = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
#: a legal metadata key (gRPC's HTTP/2 protocol; HTTP/2 forbids upper case in field names)
_KEY = re.compile(rb"[0-9a-z_.\-]+")


class Aborted(Exception):
    """What :meth:`Call.abort` raises: the call ends with ``code`` and ``details``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class MessageBudget:
    """Bytes of request messages that have begun to arrive but not ended, all calls of a server
    together (see the module docstring): a message is let in when it fits in :attr:`limit`
    (or nothing else is arriving), else its call waits, first come first served."""

    def __init__(self, limit: int, max_waiting: int = MAX_WAITING) -> None:
        self.limit = limit
        self.max_waiting = max_waiting
        self.reserved = 0
        self.waiting: collections.deque[Call] = collections.deque()

    def reserve(self, call: Call, size: int) -> tuple[grpc.StatusCode, str] | None:
        """Count ``call``'s message of ``size`` bytes, or have it wait; the status the call
        must end with when too many wait already."""
        if not self.reserved or self.reserved + size <= self.limit:
            self.reserved += size
            call.reserved = size
            call.hold()
            return None
        if len(self.waiting) >= self.max_waiting:
            return grpc.StatusCode.RESOURCE_EXHAUSTED, (
                f"the server is receiving {self.reserved} bytes of request messages already, "
                f"the most it holds at once is {self.limit} (4 times --max-body-bytes, at "
                f"least 256 MiB), and {len(self.waiting)} more wait; retry shortly, or send "
                "smaller messages"
            )
        call.wanted = size
        self.waiting.append(call)
        return None

    def release(self, call: Call) -> None:
        """``call``'s message is in, or the call is over: let the waiting ones in."""
        if call.wanted:
            call.wanted = 0
            with contextlib.suppress(ValueError):
                self.waiting.remove(call)
            return
        self.reserved -= call.reserved
        call.reserved = 0
        waiting = self.waiting
        while waiting and (not self.reserved or self.reserved + waiting[0].wanted <= self.limit):
            admitted = waiting.popleft()
            self.reserved += admitted.wanted
            admitted.reserved, admitted.wanted = admitted.wanted, 0
            admitted.admitted()


def parse_timeout(value: bytes) -> float | None:
    """``grpc-timeout`` (up to 8 digits and a unit) in seconds; None when it does not parse."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    unit = _UNITS.get(chr(value[-1]))
    return None if unit is None else int(value[:-1]) * unit


class Call:
    """One stream: its request messages (:meth:`read`), its metadata and deadline, and how it
    ends (:meth:`abort`, or the connection's ``finish``)."""

    def __init__(
        self,
        connection: Connection,
        stream: int,
        metadata: tuple[tuple[str, str | bytes], ...],
        deadline: float | None,
        encoding: bytes,
        max_message_bytes: int,
        opened: float | None = None,
    ) -> None:
        self.connection = connection
        self.stream = stream
        self.metadata = metadata
        self.deadline = deadline
        self.encoding = encoding
        self.max_message_bytes = max_message_bytes
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None  # its deadline
        #: ``time.monotonic()`` when its headers were read (GRPC_WAITREAD_START in a trace)
        self.opened = opened
        #: told once the call is over, whether its last frame went out (True) or not
        self.on_end: Callable[[bool], None] | None = None
        #: the answer bytes not yet sent (flow control), and the trailers to send after them
        self.pending = bytearray()
        self.trailers: bytes | None = None
        #: the client's WINDOW_UPDATEs to this stream less the bytes sent on it: its send
        #: window is the connection's ``peer_window`` plus this, so that a SETTINGS frame
        #: changing ``peer_window`` changes every stream's window at once
        self.window = 0
        self.stall: list[Any] | None = None  # its entry in the connection's stalled calls
        self.headers_sent = False
        self.finished = False  # the status is decided (sent or waiting behind answer bytes)
        self.remote_closed = False  # the client sent END_STREAM
        self.reset = False  # the client reset it, or the connection went
        self.expired = False  # its deadline passed
        self.unread = 0  # bytes of complete messages not read yet
        self.reading = True  # False once its handler reads no more (see stop_reading)
        self.withheld = 0  # flow-control credit held back while too much is unread
        #: the bytes the message arriving now holds in the server's MessageBudget, or waits for
        self.reserved = 0
        self.wanted = 0
        self._budget: MessageBudget = connection.server.budget
        self._overdue: asyncio.TimerHandle | None = None  # when the message let in must be in
        self._buffer = bytearray()
        self._messages: collections.deque[bytes] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None

    # -- the wire side ---------------------------------------------------------------------
    def feed(self, data: bytes) -> tuple[grpc.StatusCode, str] | None:
        """Bytes of the request stream; the status the call must end with, if it must."""
        if not self.reading:  # no handler reads them: dropped, not held
            return None
        buffer = self._buffer
        buffer += data
        while len(buffer) >= 5:
            if buffer[0] > 1:  # gRPC core's words: the flag is 0 or 1, nothing else
                return grpc.StatusCode.INTERNAL, (
                    f"Bad GRPC frame type 0x{buffer[0]:02x}: a message's first byte is its "
                    "compressed flag, 0 (not compressed) or 1 (compressed with the call's "
                    "grpc-encoding); send 0 or 1"
                )
            size = int.from_bytes(buffer[1:5], "big")
            if size > self.max_message_bytes:
                return (
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"Received message larger than max ({size} vs. {self.max_message_bytes})",
                )
            if len(buffer) < 5 + size:
                if not (self.reserved or self.wanted):
                    refused = self._budget.reserve(self, 5 + size)
                    if refused is not None:
                        return refused
                break
            compressed = buffer[0]
            message = bytes(buffer[5 : 5 + size])
            del buffer[: 5 + size]
            self.release()
            if compressed:
                inflated = self._inflate(message)
                if not isinstance(inflated, bytes):
                    return inflated
                message = inflated
            self._messages.append(message)
            self.unread += len(message)
        self._wake()
        return None

    def _inflate(self, message: bytes) -> bytes | tuple[grpc.StatusCode, str]:
        internal = grpc.StatusCode.INTERNAL
        if self.encoding == b"identity":
            return internal, (
                "Compression bit set but no encoding configured: send the call's grpc-encoding "
                "(gzip or deflate), or the message uncompressed"
            )
        wbits = _WBITS.get(self.encoding)
        if wbits is None:
            name = self.encoding.decode("latin-1")
            return internal, (
                f"the message is compressed with grpc-encoding {name!r}, which this server "
                "does not know; use gzip or deflate"
            )
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(message, self.max_message_bytes + 1)
        except zlib.error as exc:
            return internal, f"the compressed message does not inflate ({exc})"
        if len(out) > self.max_message_bytes:
            return grpc.StatusCode.RESOURCE_EXHAUSTED, (
                f"Received message larger than max (more than {self.max_message_bytes} bytes "
                "once inflated)"
            )
        if not inflater.eof or inflater.unused_data:
            name = self.encoding.decode("latin-1")
            return internal, (
                f"the {name} message is cut short or has bytes past its end; send the whole "
                "compressed stream, and only it, in the message"
            )
        return out

    def hold(self) -> None:
        """Its message is let into the budget: it has the server's ``message_timeout_s`` to
        arrive in full (see :meth:`Connection.message_overdue`)."""
        self._overdue = asyncio.get_running_loop().call_later(
            self.connection.server.limits.message_timeout_s, self.connection.message_overdue, self
        )

    def admitted(self) -> None:
        """The message that waited for room in the budget is let in: the client may send
        the rest of it."""
        self.hold()
        if self.withheld and self.unread < UNREAD_LIMIT:
            self.connection.credit(self)

    def release(self) -> None:
        """Its message is in, or the call is over: its room in the budget, or its place in the
        budget's queue, goes to the calls waiting."""
        if self._overdue is not None:
            self._overdue.cancel()
            self._overdue = None
        if self.reserved or self.wanted:
            self._budget.release(self)

    def stop_reading(self) -> None:
        """Its handler reads no more request messages (a unary-request method has its one):
        those arrived and any to come are dropped, and its stream's window is not replenished
        for them (:meth:`Connection.credit`), so that a call left open (a health ``Watch``)
        holds nothing of what its client sends on. gRPC core does the same: it answers the
        first message, ends no call for the others, and grants them no window."""
        self.reading = False
        self.release()  # a second message begun gives its room in the budget back
        self._messages.clear()
        self._buffer.clear()
        self.unread = 0

    def end_of_requests(self) -> None:
        """The client sent END_STREAM (a message cut short is dropped)."""
        self.remote_closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def writable(self) -> None:
        """Answer bytes went out; wakes a handler waiting to send more."""
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    # -- the servicer context --------------------------------------------------------------
    async def read(self) -> Any:
        """The next request message, or ``grpc.aio.EOF`` once the client sent its last."""
        while not self._messages:
            if self.remote_closed or self.reset:
                return grpc.aio.EOF
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.read_nowait()

    def read_nowait(self) -> bytes | None:
        """The next request message if it has arrived whole, else None (without waiting:
        a unary call's message usually comes with its headers)."""
        if not self._messages:
            return None
        message = self._messages.popleft()
        self.unread -= len(message)
        if self.withheld >= UNREAD_LIMIT // 4 and self.unread < UNREAD_LIMIT and not self.wanted:
            self.connection.credit(self)
        return message

    async def requests(self) -> AsyncIterator[bytes]:
        """The request messages, as a request-streaming handler iterates them."""
        while (message := await self.read()) is not grpc.aio.EOF:
            yield message

    async def sent(self) -> None:
        """Wait while too many answer bytes of this call wait on the client's window, or
        the client does not read what the connection wrote already."""
        while (len(self.pending) > UNREAD_LIMIT or self.connection.paused) and not self.reset:
            self._drained = asyncio.get_running_loop().create_future()
            try:
                await self._drained
            finally:
                self._drained = None

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise Aborted(code, details)

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self.metadata

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)

    def done(self) -> bool:
        return self.finished or self.reset

    def ended(self) -> None:
        """The call is over (its last frame out, or the stream or connection gone): tell
        :attr:`on_end`, once."""
        hook, self.on_end = self.on_end, None
        if hook is not None:
            hook(self.finished and not self.reset)


def decode_metadata(name: bytes, value: bytes) -> tuple[str, str | bytes]:
    """A metadata entry as grpc.aio gives it: a ``-bin`` key's value base64-decoded to bytes,
    any other's as text; ValueError naming the key when it is not a legal key (as gRPC core's
    ``Illegal header key``) or a ``-bin`` value is not base64."""
    key = name.decode("latin-1")
    if _KEY.fullmatch(name) is None:
        raise ValueError(
            f"Illegal header key: {key!r}; metadata keys are lower-case letters, digits, "
            "'-', '_' and '.'"
        )
    if key.endswith("-bin"):
        try:
            return key, base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)
        except ValueError:
            raise ValueError(
                f"metadata {key!r} is not base64; a key ending in -bin carries base64"
            ) from None
    return key, value.decode("latin-1")
