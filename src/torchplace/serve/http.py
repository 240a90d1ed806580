"""A small, fast HTTP/1.1 server on asyncio + httptools, with no framework in the way.

One :class:`HttpServer` owns the listening socket and its connections. Each connection parses
with ``httptools`` (keep-alive, pipelining: requests on one connection are answered in order,
``Content-Length`` and chunked request bodies, whose trailer fields count towards the head limit
and are dropped, never merged into the headers, ``Expect: 100-continue``), enforces the body
limit while reading (413 before the body is read when ``Content-Length`` says so), and hands each
complete :class:`Request` to the handler, which returns a :class:`Response`, a coroutine of one
(run as a task) or a future or :class:`~torchplace.serve.ticket.Ticket` the handler settles (no
task at all: the cheapest way to answer later, a ticket's answer written in the call that
settles it; cancelling it is how the server says the client went away or the request timed out;
one that ends cancelled otherwise, its client still there, is answered 503).
A one-second ticker answers requests that run past the request timeout (503; not those whose
handler cleared :attr:`Request.timed`, such as a model load), drops clients that
send a request more slowly than that (408) or leave their answers unread that long (also
after the connection was closed with part of an answer unsent), and closes idle keep-alive
connections (empty lines between requests do not count as activity; a client that asks for
keep-alive is told how long in ``Keep-Alive: timeout=``).

What one connection can make the server hold is bounded: its waiting requests hold one body limit
at most (then reading stops until they are answered), and while the transport's write buffer is
over its high-water mark (a client that does not read its answers) no further request is handled
and the connection is not read. A body arrives into one buffer however it is chunked. Bytes no
parser callback counts are counted as they arrive: a head cut across reads (a field that has
not ended is gathered by the parser, unseen), empty lines before a request line, a chunked
body's framing (chunk extensions, leading zeros of a size).
Answers go out in request order: a request that is refused (malformed, body over the limit, a
version other than HTTP/1.1 and 1.0: 505) is answered after the requests before it, and then the
connection closes. A chunk whose size line takes the body over the limit is refused at once.
A client that shuts down its sending side after a request asking to close is still answered
(see :meth:`_Connection.eof_received`); one that does so mid-request is told 400.

Status lines and common headers are pre-encoded; a response is one ``transport.write``.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import errno
import logging
import re
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, TypeAlias

import httptools
import orjson

from torchplace.errors import ConfigError
from torchplace.serve.listener import close_listener
from torchplace.serve.ticket import TIMED_OUT, Ticket

__all__ = [
    "MAX_ERROR_CHARS",
    "Answer",
    "Handler",
    "HttpServer",
    "Request",
    "Response",
    "connection_limit",
    "error_response",
    "grpc_connection_limit",
    "raise_fd_limit",
]

logger = logging.getLogger("torchplace.serve.http")

_STATUS_LINES: dict[int, bytes] = {
    s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus
}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_JSON = b"application/json"
_PIPELINE_DEPTH = 32  # complete requests queued on one connection before we stop reading
_NOT_ZERO = re.compile(rb"[^0]")
_MAX_HEAD_BYTES = 64 * 1024  # request line + headers; more gets 431 (414: the target alone)
#: what a head may take in raw bytes past its fields' own (the request line's method and
#: version, CRLFs, whitespace around values): counted as the bytes arrive, since the parser
#: gathers a field that has not ended in memory and tells it only once it ends
_HEAD_SLACK = 4 * 1024
#: the chunk extensions one chunked body may carry in all (as Node.js bounds them since
#: CVE-2024-22019), besides what each chunk's size line and CRLFs take (_CHUNK_FRAMING)
_MAX_CHUNK_EXTENSIONS = 16 * 1024
_CHUNK_FRAMING = 24  # a chunk's own framing, at most: 16 hex digits, 2 CRLFs, a few zeros
#: the non-empty chunks one chunked body may have (Triton's kMaxChunkedChunks): each costs
#: parser callbacks on the event loop, so tiny chunks would stall it for seconds per request
_MAX_CHUNKS = 65536
_LINGER_S = 1.0  # how long a rejected connection's remaining input is drained before closing
#: a request line (RFC 9112, 3), its method a token: the parser refuses a method it does not
#: know as it refuses garbage, and an unknown method is answered 501 (RFC 9110, 9.1), not 400
_REQUEST_LINE = re.compile(
    rb"(?:^|\n)([!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}) [^ \r\n]+ HTTP/1\.[01]\r?\n"
)
#: a valid Host value (RFC 9112 3.2, RFC 3986 3.2.2): an IP literal in brackets, or a name or
#: IPv4 address (empty allowed), then an optional port; no comma (two Host fields, joined)
_HOST = re.compile(rb"(?:\[[0-9A-Za-z:._~!$&'()*+;=%-]+\]|[0-9A-Za-z._~!$&'()*+;=%-]*)(?::[0-9]*)?")


def _bind_error(host: str, port: int, exc: OSError) -> str:
    """Why ``host:port`` cannot be listened on, and what to change."""
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {where}: the port is already in use; stop the process that holds "
            "it or pick another --port (--port 0 picks a free one)"
        )
    if isinstance(exc, socket.gaierror):
        return (
            f"cannot listen on {where}: host {host!r} does not resolve ({exc.strerror}); "
            "give an address of this machine with --host, such as 127.0.0.1"
        )
    if exc.errno == errno.EACCES:
        return (
            f"cannot listen on {where}: permission denied (ports below 1024 need privileges); "
            "pick a --port of 1024 or more"
        )
    reason = exc.strerror or str(exc)
    return (
        f"cannot listen on {where}: {reason}; give an address of this machine with --host "
        "(such as 127.0.0.1) and a free --port"
    )


@dataclass(slots=True)
class Request:
    """One parsed HTTP request; ``headers`` keys are lower-case bytes."""

    method: bytes
    path: bytes
    query: bytes
    headers: dict[bytes, bytes]
    body: bytes
    keep_alive: bool
    received: float
    #: answered within the server's request timeout (a handler clears it for work that takes
    #: as long as it takes, such as a model load: the client still going away cancels it)
    timed: bool = True
    #: the body with its Content-Encoding undone off the event loop, or the error that undoing
    #: it raised (a handler sets it before it reads the body; None: not done)
    inflated: bytes | Exception | None = None


@dataclass(slots=True)
class Response:
    """A response: status, body, content type and any extra ``(name, value)`` headers."""

    status: int
    body: bytes = b""
    content_type: bytes = _JSON
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    close: bool = False


#: the longest error message answered (characters): past it the message is cut, so that a value
#: it quotes from the request (a name, a shape of millions of entries) is not echoed back whole
MAX_ERROR_CHARS = 16 * 1024


def error_response(
    status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> Response:
    """An OIP error object ``{"error": message}`` with the given status (the message cut to
    :data:`MAX_ERROR_CHARS`)."""
    if len(message) > MAX_ERROR_CHARS:
        cut = len(message) - MAX_ERROR_CHARS
        message = f"{message[:MAX_ERROR_CHARS]}... ({cut} more characters)"
    return Response(status, orjson.dumps({"error": message}), _JSON, headers or [])


#: a handler answers at once, or later: with a coroutine (run as a task) or a future it settles
Answer: TypeAlias = (
    "Response | Coroutine[Any, Any, Response] | asyncio.Future[Response] | Ticket[Response]"
)
Handler = Callable[[Request], Answer]


def _unsent(transport: asyncio.BaseTransport) -> int:
    """Bytes written to the connection that the client has not taken yet: the transport's
    buffer and, on Linux, the socket's send queue (where a steadily reading client's progress
    shows first)."""
    unsent = transport.get_write_buffer_size()  # type: ignore[attr-defined]
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(ImportError, AttributeError, OSError, ValueError):
            import fcntl  # Unix only
            import termios

            queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
            unsent += int.from_bytes(queued, sys.byteorder)
    return int(unsent)


#: a body this large or larger (by Content-Length, or a chunked one once it has come this far)
#: counts against HttpServer.body_budget
_LARGE_BODY = 1_000_000
#: while other bodies wait for room in that budget, one that holds room must come at least
#: this fast (bytes a second, over each _BODY_STALL_S), or it is refused with 408: a client
#: that declares a large body and sends none holds no one up for the whole request timeout
_BODY_MIN_RATE = 64 << 10
_BODY_STALL_S = 2.0
#: file descriptors kept for everything but HTTP connections (gRPC, model files, shared memory)
_FD_RESERVE = 128


def raise_fd_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (as Go and nginx do:
    the soft limit, often 1,024, would cap the connections served); the limit now."""
    try:
        import resource  # Unix only
    except ImportError:
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard  # the hard limit is kept
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return int(soft)


def connection_limit() -> int:
    """Open HTTP connections to allow before the quietest are shed: the open file limit less a
    reserve (an eighth of it, at least 128), so that accept() does not fail with EMFILE."""
    soft = _open_file_limit()
    if soft is None:
        return sys.maxsize
    return max(soft - max(_FD_RESERVE, soft // 8), 16)


def grpc_connection_limit() -> int:
    """Open gRPC connections to allow (past it gRPC core closes new ones at once): half of the
    reserve :func:`connection_limit` leaves, so that idle gRPC connections cannot take the file
    descriptors that HTTP connections, model files and shared memory need."""
    soft = _open_file_limit()
    if soft is None:
        return 2**31 - 1  # gRPC core reads it as a C int
    return min(max(max(_FD_RESERVE, soft // 8) // 2, 16), 2**31 - 1)


def _open_file_limit() -> int | None:
    """This process's soft limit on open files; None when there is none to read."""
    try:
        import resource
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _keep_alive_asked(connection: bytes | None) -> bool:
    """``Connection`` lists the ``keep-alive`` option (a comma-separated list of tokens in any
    case, RFC 9110 7.6.1)."""
    if connection is None:
        return False
    return b"keep-alive" in [token.strip() for token in connection.lower().split(b",")]


def _body_over(limit: int) -> str:
    """The 413 for a body found over ``limit`` as it is read (one message however the reads
    were cut: a chunk seen whole, or refused by its size line before its data came)."""
    return (  # Triton's words first (its clients and tests match on them)
        f"request JSON size exceeds the maximum allowed input size of {limit} bytes; "
        f"request body is over the limit of {limit} bytes (--max-body-bytes); send less"
    )


def _malformed(data: bytes, exc: Exception) -> Response:
    """The 400 (or 505) for what the parser refused."""
    if data.startswith(b"PRI * HTTP/2"):
        return error_response(
            400,
            "this port speaks HTTP/1.1, not HTTP/2 with prior knowledge; gRPC clients "
            "connect to the gRPC port (--grpc-port)",
        )
    if "HTTP version" in str(exc):
        return _version_not_supported("the request line's HTTP version")
    if isinstance(exc, httptools.HttpParserInvalidMethodError):
        method = _unknown_method(data)
        if method is not None:  # a well-formed request line whose method nobody here knows
            return error_response(
                501,
                f"method {method!r} is not implemented; this server answers GET, HEAD, POST and "
                "OPTIONS (see /v2/openapi.json for what each route takes)",
            )
    return error_response(400, f"malformed HTTP request: {exc}; {_parser_hint(data, str(exc))}")


#: what to send instead, by the words of the parser's refusal (llhttp's, lower-cased); the first
#: match is told, after the parser's own words
_PARSER_HINTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("header token", "header field char"),
        "a header field name is a token (letters, digits and !#$%&'*+-.^_`|~, RFC 9110 5.1) "
        "followed at once by a colon",
    ),
    (
        ("header value char",),
        "a header field value holds no control characters such as NUL, CR, LF or DEL "
        "(RFC 9110, 5.5)",
    ),
    (
        ("whitespace after header value",),
        "each header field is one line: a field folded onto the next line (obs-fold, RFC 9112 "
        "5.2) is not accepted",
    ),
    (
        ("duplicate content-length",),
        "send one Content-Length field, with the body's size in bytes",
    ),
    (
        # llhttp's "Content-Length can't be present with Transfer-Encoding" (or the reverse):
        # the framing is two ways at once, whatever the Content-Length's digits are
        ("be present with",),
        "send Transfer-Encoding: chunked or a Content-Length, not both (RFC 9112, 6.3)",
    ),
    (
        ("content-length overflow",),
        "that Content-Length is far over the body limit (--max-body-bytes); send less",
    ),
    (
        ("content-length",),
        "Content-Length is the body's size in bytes: decimal digits only, one value",
    ),
    (
        ("transfer-encoding",),
        "send Transfer-Encoding: chunked (once, chunked last) or a Content-Length, not both",
    ),
    (
        ("chunk",),
        "a chunked body is chunks of 'SIZE-IN-HEX CRLF DATA CRLF' ended by '0 CRLF CRLF' "
        "(RFC 9112, 7.1)",
    ),
    (
        (" lf", " cr"),
        "end the request line, each header field and each chunk line with CRLF",
    ),
    (
        ("url", "schema", "host"),
        "the request target is a path such as /v2/models/NAME/infer, its bytes other than "
        "letters, digits and -._~!$&'()*+,;=:@/? percent-encoded (RFC 3986)",
    ),
)
#: how a request line is written (the hint for refusals of the request line itself)
_REQUEST_LINE_HINT = (
    "a request starts with a line 'METHOD /path HTTP/1.1' (single spaces, the method in upper "
    "case) ending in CRLF, then the header fields and an empty line (RFC 9112)"
)


def _content_length(value: bytes) -> int:
    """A ``Content-Length`` as a number: its leading zeros dropped first, which RFC 9110 8.6's
    ``1*DIGIT`` allows any number of, and which would take it past the 4,300 digits ``int()``
    reads (Python's integer-string conversion limit: a ValueError inside the parser's callback,
    a 400 that named nothing). The parser lets no value of 2**64 or more through (20 digits);
    one would read as 2**64 here, over any body limit."""
    digits = value.lstrip(b"0")
    return int(digits or b"0") if len(digits) <= 20 else 1 << 64


def _parser_hint(data: bytes, reason: str) -> str:
    """What to send instead of what the parser refused (``reason``, its words), and a line of
    ``data`` that shows it where one can be found."""
    if data.startswith(b"\x16\x03"):  # a TLS ClientHello: an https:// URL for this port
        return "this port speaks plain HTTP, not TLS: use an http:// URL"
    words = reason.lower()
    hint = next(
        (text for keys, text in _PARSER_HINTS if any(key in words for key in keys)),
        _REQUEST_LINE_HINT,
    )
    if "header" in words:
        line = _bad_field_line(data)
        if line is not None:
            return f"{hint}; malformed field line: {line[:100].decode('latin-1')!r}"
    return hint


#: a header field line as RFC 9112 5 writes it (no obs-fold): name, colon, value
_FIELD_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[ \t]*[\x21-\x7e\x80-\xff \t]*")


def _bad_field_line(data: bytes) -> bytes | None:
    """The first malformed header field line after the last request line in ``data`` (None
    when there is none: the head being parsed began in earlier data, and a line's start may
    be missing)."""
    start = data.rfind(b" HTTP/1.")  # in a request line, its end next
    start = data.find(b"\n", start) + 1 if start >= 0 else 0
    if not start:
        return None
    for line in data[start:].split(b"\r\n"):
        if not line:
            return None  # the end of the head
        if _FIELD_LINE.fullmatch(line) is None:
            return line
    return None


def _no_tunnel(request: Request) -> Response:
    """501 for CONNECT (RFC 9110, 9.3.6): this server is no proxy, and what a client sends
    after it is tunnel data, not requests: the connection closes after the answer."""
    target = request.path[:200].decode("latin-1")
    return error_response(
        501,
        f"CONNECT {target!r} is not implemented: this server is an inference server, not a "
        "proxy; send GET, HEAD, POST or OPTIONS to it directly",
    )


def _unknown_method(data: bytes) -> str | None:
    """The method of the first well-formed request line in ``data`` that the parser does not
    know (the one it refused; the lines before it were parsed), or None: the refusal was of
    something that is not a request line."""
    for line in _REQUEST_LINE.finditer(data):
        try:
            httptools.HttpRequestParser(_Ignored()).feed_data(line[1] + b" / HTTP/1.1\r\n")
        except httptools.HttpParserInvalidMethodError:
            return line[1].decode("ascii")
    return None


class _Ignored:
    """A parser's protocol that takes no callbacks."""


def _version_not_supported(what: str) -> Response:
    """505 (RFC 9110, 15.6.6) for a request line that is not HTTP/1.1 or HTTP/1.0."""
    return error_response(
        505,
        f"{what} is not supported; send HTTP/1.1 (or HTTP/1.0) requests to this port "
        "(HTTP/2 and gRPC clients connect to the gRPC port, --grpc-port)",
    )


class _Connection(asyncio.Protocol):
    __slots__ = (
        "_body",
        "_body_mark",
        "_body_mark_at",
        "_body_reserved",
        "_body_wait",
        "_busy",
        "_chunk_mark",
        "_chunk_open",
        "_chunked",
        "_chunks",
        "_current",
        "_expect_continue",
        "_final",
        "_head_size",
        "_headers",
        "_host",
        "_in_trailers",
        "_last_active",
        "_line_start",
        "_parser",
        "_paused_reading",
        "_pending",
        "_pending_bytes",
        "_queue_full",
        "_raw",
        "_reading_since",
        "_rejected",
        "_server",
        "_task_started",
        "_timed_out",
        "_transport",
        "_upgrade_body",
        "_url",
        "_write_paused",
        "_write_paused_since",
        "_write_unsent",
    )

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._host = b""  # the last Host value found valid: checked once, not every request
        self._head_size = 0
        self._in_trailers = False  # the fields arriving are a chunked body's trailer section
        #: the body so far: the first part as it came, then one bytearray for all of them
        self._body: bytes | bytearray = b""
        self._expect_continue = False  # the request being read asked for 100 and has not had it
        self._rejected = False
        self._final: Response | None = None  # the refusal to send once earlier answers are out
        self._pending: deque[Request] = deque()
        self._pending_bytes = 0  # the bodies of the requests in _pending
        self._busy: Request | None = None  # the request whose answer is being made
        self._current: asyncio.Future[Response] | Ticket[Response] | None = None
        self._task_started = 0.0
        self._timed_out = False
        self._reading_since = 0.0
        self._last_active = time.monotonic()
        self._paused_reading = False  # the transport is not being read
        self._queue_full = False  # too many requests waiting: a reason not to read
        self._write_paused = False  # the write buffer is over its high-water mark: another reason
        self._write_paused_since = 0.0  # when the client last read any of its answers (0: not
        # stalled)
        self._write_unsent = 0  # bytes waiting in the write buffer then
        #: an Upgrade request whose body the parser left unread: (request, bytes still due);
        #: the body gathers in ``_body`` meanwhile
        self._upgrade_body: tuple[Request, int] | None = None
        self._chunked = False  # the request being read has a chunked body
        self._chunks = 0  # the chunks of that body so far
        #: raw bytes that no parser callback counts: empty lines before a request line, a
        #: head being read, or a chunked body's framing; -1: that part began in the data being
        #: parsed, which may hold what came before it, and is counted from the next data on
        self._raw = 0
        self._chunk_open = False  # a chunk's size line was read in this data, not all its data
        self._chunk_mark = 0  # the body's length before that chunk
        self._line_start = b""  # the start of the last line of what was read (chunked only)
        self._body_reserved = 0  # the large body being read, counted in the server's budget
        self._body_wait = False  # waiting for room in that budget: not read meanwhile
        #: while others wait for that budget, the body's length when its rate was last
        #: checked, and when (0.0: not being checked; see _body_stalled)
        self._body_mark = 0
        self._body_mark_at = 0.0

    # -- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        connections = self._server.connections
        connections.add(self)
        if len(connections) > self._server.max_connections:
            self._server.shed_idle(keep=self)

    def quiet_since(self) -> float | None:
        """When this connection last did anything, if no answer is due on it (it may be shed
        for a new one); None while a request is being answered or waits."""
        if self._busy or self._pending or self._rejected or self._transport is None:
            return None
        return self._reading_since or self._last_active

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._release_body()
        self._transport = None
        self._pending.clear()
        self._pending_bytes = 0
        if self._current is not None and not self._current.done():
            self._current.cancel()

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        while data and not self._rejected:
            if self._upgrade_body is not None:
                data = self._read_upgrade_body(data)
                continue
            try:
                body = len(self._body) if self._chunked else 0
                self._parser.feed_data(data)
                if self._chunked:
                    # its framing: what of the data is not chunk data (see _framing_limit)
                    self._count_raw(len(data) - (len(self._body) - body), self._framing_limit())
                    self._track_chunks(data)
                elif self._reading_since:
                    if not self._in_trailers:  # a head cut across reads
                        self._count_raw(len(data), _MAX_HEAD_BYTES + _HEAD_SLACK)
                elif data[0] == 13 or data[0] == 10:  # empty lines, and no request line yet
                    self._count_raw(len(data), _MAX_HEAD_BYTES)
                return
            except httptools.HttpParserUpgrade as exc:
                # Upgrade is ignored (RFC 9110, 7.8): the request is answered over HTTP/1.1,
                # and what follows it is HTTP/1.1 again, for a fresh parser (CONNECT is
                # refused and the connection closed: see _no_tunnel)
                self._parser = httptools.HttpRequestParser(self)
                data = data[exc.args[0] :]
            except httptools.HttpParserError as exc:
                if not self._rejected:
                    self._reject(_malformed(data, exc))
                return

    def _framing_limit(self) -> int:
        """What a chunked body's framing (size lines, chunk extensions, CRLFs, trailer fields)
        may take: the parser reads any amount of chunk extensions or leading zeros of a size,
        which a client could send for as long as the request timeout, never nearing the body
        limit."""
        return _MAX_CHUNK_EXTENSIONS + _MAX_HEAD_BYTES + _CHUNK_FRAMING * self._chunks

    def _count_raw(self, size: int, limit: int) -> None:
        """Count ``size`` more raw bytes (see ``_raw``) of the part being read, refused past
        ``limit``: a head as too large (431), a chunked body's framing as too large (413),
        empty lines as what they are (400)."""
        if self._raw < 0:
            self._raw = 0
            return
        self._raw += size
        if self._raw <= limit:
            return
        if self._chunked:
            self._refuse(
                413,
                f"the chunked body's framing (chunk size lines, chunk extensions and trailer "
                f"fields) is over {limit} bytes for its {self._chunks} chunks; send chunk "
                f"extensions of at most {_MAX_CHUNK_EXTENSIONS} bytes in all, or none",
            )
        if self._reading_since:
            self._head_too_large()
        self._refuse(
            400,
            f"over {limit} bytes of empty lines and no request line; send a request "
            "('METHOD /path HTTP/1.1'), or close the connection",
        )

    def _read_upgrade_body(self, data: bytes) -> bytes:
        """Take the body the parser skipped for an Upgrade request; return what follows it."""
        assert self._upgrade_body is not None
        request, due = self._upgrade_body
        taken = data[:due]
        self._add_body(taken)
        if len(taken) < due:
            self._upgrade_body = (request, due - len(taken))
            return b""
        request.body = bytes(self._body)
        self._body = b""
        self._upgrade_body = None
        self._release_body()
        self._reading_since = 0.0
        self._queue(request)
        return data[due:]

    def eof_received(self) -> bool | None:
        """The client closed its sending side. A FIN cannot tell a half-close
        (``shutdown(SHUT_WR)``) from a client that closed and went away, so the last request
        decides: if it asked to close the connection (``Connection: close``, HTTP/1.0 without
        keep-alive), the client has said it sends nothing more and waits for its answers, which
        are sent, then the connection closes; a FIN on a connection kept alive while an answer
        is still due is the client going away (as nginx and Go take it), and its requests are
        withdrawn, never computed. A request cut short is answered 400 either way."""
        if self._rejected:  # a refusal waits for earlier answers, or the connection lingers
            return True if self._final is not None else None
        if self._reading_since or self._upgrade_body is not None:
            if self._in_trailers or self._upgrade_body is not None:  # the headers were read
                what = f"its body cut short after {len(self._body)} bytes"
            else:
                what = "its request line or headers cut short"
            self._reject(
                error_response(
                    400,
                    f"the client closed its side of the connection before the request was "
                    f"complete ({what}); send the whole request before shutting down writing",
                )
            )
            return True  # closed once the answer is out (see _linger)
        last = self._pending[-1] if self._pending else self._busy
        if last is None or last.keep_alive:
            return None  # nothing to answer, or nobody waiting for it: close
        return True  # the last answer closes the connection

    def pause_writing(self) -> None:
        """The client is not reading its answers: handle and read nothing more until it does."""
        self._write_paused = True
        self._write_paused_since = time.monotonic()
        if self._transport is not None:
            self._write_unsent = _unsent(self._transport)
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._write_paused_since = 0.0
        self._update_reading()
        self._next()

    def _update_reading(self) -> None:
        """Read the connection unless its output is stalled, too many requests wait, or a
        refusal waits for earlier answers (and reading would parse what follows it)."""
        hold = self._write_paused or self._queue_full or self._final is not None or self._body_wait
        if hold != self._paused_reading and self._transport is not None:
            if hold:
                self._transport.pause_reading()
            else:
                self._transport.resume_reading()
                if self._reading_since:  # a request we stopped reading: its clock starts again
                    self._reading_since = time.monotonic()
            self._paused_reading = hold

    # -- httptools callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        # the rest of the per-message state is reset when the previous message completes
        self._expect_continue = False
        self._in_trailers = False
        self._reading_since = time.monotonic()
        self._raw = -1  # see _raw: the data it began in is not counted

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if self._head_size > _MAX_HEAD_BYTES:
            self._head_too_large(414, "the request target")

    def _head_too_large(self, status: int = 431, what: str = "request line and headers") -> None:
        self._reject(error_response(status, f"{what} is over the limit of {_MAX_HEAD_BYTES} bytes"))
        raise httptools.HttpParserError("headers too large")

    def on_header(self, name: bytes, value: bytes) -> None:
        """A header field, kept; or a chunked body's trailer field, counted towards the head
        limit and dropped: trailer fields are not merged into the header section (RFC 9110,
        6.5.1), so a ``Content-Type`` or ``Host`` sent after the body changes nothing."""
        self._head_size += len(name) + len(value) + 4
        if self._head_size > _MAX_HEAD_BYTES:
            self._head_too_large()
        if self._in_trailers:
            return
        # the parser drops whitespace before a value, not after it; neither is part of the
        # value (RFC 9110, 5.5): `Content-Length: 10 ` is 10, `gzip\t` is gzip
        value = value.rstrip(b" \t")
        key = name.lower()
        headers = self._headers
        if key in headers:
            headers[key] += b"," + value
        else:
            headers[key] = value

    def on_headers_complete(self) -> None:
        self._in_trailers = True  # any field from now on is a trailer field
        headers = self._headers
        # HTTP/1.1 keeps the connection by default, and only 1.1 does: any other version
        # (llhttp also reads 0.9 and 2.0) says Connection: keep-alive or does not keep it
        if b"connection" in headers or not self._parser.should_keep_alive():
            self._check_version()
        length = headers.get(b"content-length")
        size = None
        if length is not None and length.isdigit():
            size, limit = _content_length(length), self._server.max_body_bytes
            if size > limit:
                self._refuse(
                    413,
                    f"request JSON size of {size} bytes exceeds the maximum allowed input "
                    f"size of {limit} bytes (the request body, over --max-body-bytes); send less",
                )
            elif size >= _LARGE_BODY:
                self._reserve_body(size)
        coding = headers.get(b"transfer-encoding")
        if coding is not None:
            self._check_transfer_coding(coding)
        if b"expect" in headers:
            self._continue(headers[b"expect"], length is not None and size != 0)

    def _reserve_body(self, length: int) -> None:
        """Count a large body against the server's :attr:`HttpServer.body_budget` before it is
        read; over the budget, the connection is not read (its request clock stopped) until
        bodies already being read are in (see :meth:`HttpServer.release_body`)."""
        server = self._server
        self._body_reserved = length
        if server.body_reading and server.body_reading + length > server.body_budget:
            self._body_wait = True
            server.body_waiting.append(self)
            self._update_reading()
        else:
            server.body_reading += length

    def _release_body(self) -> None:
        if self._body_reserved:
            self._server.release_body(self)

    def _check_version(self) -> None:
        """HTTP/1.1 or 1.0; any other version is refused with 505 (RFC 9110, 15.6.6), not
        answered as if it were 1.1."""
        version = self._parser.get_http_version()
        if version != "1.1" and version != "1.0":
            self._reject(_version_not_supported(f"HTTP/{version}"))
            raise httptools.HttpParserError("HTTP version not supported")

    def _refuse(self, status: int, message: str) -> None:
        """Refuse the request being parsed (see :meth:`_reject`) and stop parsing."""
        self._reject(error_response(status, message))
        raise httptools.HttpParserError(message)

    def _check_transfer_coding(self, coding: bytes) -> None:
        """Chunked is the one transfer coding read here, and only from HTTP/1.1 (RFC 9112, 6.1)."""
        if self._parser.get_http_version() == "1.0":
            self._refuse(
                400,
                "Transfer-Encoding in an HTTP/1.0 request is faulty framing; send the body "
                "with a Content-Length, or use HTTP/1.1",
            )
        if [c.strip() for c in coding.lower().split(b",")] != [b"chunked"]:
            self._refuse(
                501,
                f"transfer coding {coding.decode('latin-1')!r} is not supported; send the body "
                "with a Content-Length or Transfer-Encoding: chunked (for gzip, use "
                "Content-Encoding: gzip)",
            )
        self._chunked = True  # chunk sizes are checked against the limit as they are read
        self._chunks = 0
        self._raw = -1  # its framing is counted from the data after its head's on

    def _continue(self, expect: bytes, has_body: bool) -> None:
        """``Expect: 100-continue``: say 100 now if the request is next to be answered, else
        after the answer before it, if its body has not arrived by then (see :meth:`_write`);
        never to HTTP/1.0 (RFC 9110, 10.1.1). A request the server's :attr:`expect_check`
        answers from its head alone (a missing token, a model not served) is answered so at
        once, and the connection closed, instead of its client being asked for the body."""
        if expect.lower() != b"100-continue" or self._parser.get_http_version() == "1.0":
            return
        if not has_body and b"transfer-encoding" not in self._headers:
            return  # nothing to wait for: the final answer is next
        check = self._server.expect_check
        if check is not None:
            path = self._url.partition(b"?")[0].partition(b"#")[0]
            head = Request(self._parser.get_method(), path, b"", self._headers, b"", False, 0.0)
            refused = check(head)
            if refused is not None:  # answered now; the body it would have sent is not asked for
                self._reject(refused)
                raise httptools.HttpParserError("refused before its body was sent")
        if self._transport is not None and not self._pending and not self._busy:
            self._transport.write(_CONTINUE)
        else:
            self._expect_continue = True

    def on_chunk_header(self) -> None:
        self._chunks += 1
        if self._chunks > _MAX_CHUNKS + 1:  # the last, empty, chunk is not counted
            self._refuse(
                400,
                f"Chunked request body exceeds maximum of {_MAX_CHUNKS} non-empty chunks. "
                "Send fewer or larger HTTP chunks.",
            )
        self._chunk_open = True
        self._chunk_mark = len(self._body)

    def on_chunk_complete(self) -> None:
        self._chunk_open = False

    def _track_chunks(self, data: bytes) -> None:
        """After ``data`` of a chunked body is parsed: a chunk whose size line came in it and
        whose data has not all come yet is refused at once (413) if its size, which the parser
        does not tell, takes the body over the limit, rather than waited for until the request
        times out. The size line is the one ending where that chunk's data in ``data`` starts;
        its start may have come in earlier data (``_line_start``)."""
        if self._chunk_open:
            self._chunk_open = False
            got = len(self._body) - self._chunk_mark  # that chunk's data, all at the end
            head = self._line_start + data[: len(data) - got]
            line = head[head.rfind(b"\n", 0, len(head) - 1) + 1 :]
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                size = 0  # the parser read it; whatever it is, on_body still counts the bytes
            limit = self._server.max_body_bytes
            if self._chunk_mark + size > limit:
                # in on_body's words: whether the chunk's data came with its size line or
                # after it (how the client's writes were cut) must not change the answer
                self._reject(error_response(413, _body_over(limit)))
                return
        end = data.rfind(b"\n")
        if end >= 0:
            self._line_start = b""
        kept = self._line_start
        if len(kept) < 64:
            start = end + 1
            if not kept:  # leading zeros say nothing of a size, and may go on for any length
                digit = _NOT_ZERO.search(data, start)
                start = digit.start() if digit else len(data)
            self._line_start = kept + data[start : start + 64 - len(kept)]

    def on_body(self, body: bytes) -> None:
        limit = self._server.max_body_bytes
        size = len(self._body) + len(body)
        if size > limit:
            self._refuse(413, _body_over(limit))
        if self._chunked and size >= _LARGE_BODY and not self._body_reserved:
            # its length is unknown until its last chunk: room for the most it may be
            self._reserve_body(limit)
        self._add_body(body)

    def _add_body(self, part: bytes) -> None:
        """One buffer for the body however many parts it comes in (a bytes object each)."""
        if not self._body:
            self._body = part  # one part, no copy: the common case
        elif isinstance(self._body, bytearray):
            self._body += part
        else:
            self._body = bytearray(self._body) + part

    def on_message_complete(self) -> None:
        parser = self._parser
        self._expect_continue = False  # its body is here: no 100 for it any more
        self._chunked = False
        # what follows the message in the data being parsed is no empty line (the data may
        # hold the message's own end): it is counted from the next data on
        self._raw = -1
        host = self._headers.get(b"host")
        if host != self._host:
            if host is None or _HOST.fullmatch(host) is None:
                self._check_host(host)
            else:
                self._host = host
        url = self._url
        fragment = url.find(b"#")
        if fragment >= 0:  # a fragment is the client's own (RFC 3986, 3.5), never a route's part
            url = url[:fragment]
        mark = url.find(b"?")
        path, query = (url, b"") if mark < 0 else (url[:mark], url[mark + 1 :])
        body = self._body
        request = Request(
            parser.get_method(),
            path,
            query,
            self._headers,
            body if isinstance(body, bytes) else bytes(body),
            parser.should_keep_alive(),
            self._reading_since,
        )
        self._url = b""
        self._headers = {}
        self._head_size = 0
        self._body = b""
        if parser.should_upgrade():
            if request.method == b"CONNECT":
                self._reject(_no_tunnel(request))
                return
            if self._body_skipped(request):
                return  # a large body still to come keeps its place in the budget until in
        if self._body_reserved:
            self._release_body()
        self._reading_since = 0.0
        self._queue(request)

    def _check_host(self, host: bytes | None) -> None:
        """One Host field, and in HTTP/1.1 at least one, with a valid value (RFC 9112, 3.2);
        checked once the request is complete, so that a slow one is still told 408."""
        if host is None and self._parser.get_http_version() == "1.0":
            return
        # find, not `in`: bytes' `in` first tries its operand as an int and raises inside
        if host is not None and host.find(b",") < 0:
            self._refuse(
                400,
                f"the Host header {host[:200].decode('latin-1')!r} is not a valid host and "
                "optional port (RFC 9112, 3.2); send the server's name or address, such as "
                "Host: localhost:8000",
            )
        what = "no Host header" if host is None else "more than one Host header"
        self._refuse(
            400, f"request has {what}; an HTTP/1.1 request needs exactly one (RFC 9112, 3.2)"
        )

    def _body_skipped(self, request: Request) -> bool:
        """An Upgrade request's declared body, which the parser does not read: read by
        :meth:`_read_upgrade_body` (True), or refused when chunked."""
        if b"transfer-encoding" in request.headers:
            self._reject(
                error_response(
                    400,
                    "a request that asks for a protocol upgrade cannot have a chunked body "
                    "here; send it without the Upgrade header, or with a Content-Length",
                )
            )
            return True
        length = _content_length(request.headers.get(b"content-length", b"0"))
        if length:
            self._upgrade_body = (request, length)
        return length > 0

    def _queue(self, request: Request) -> None:
        """Queue a complete request; stop reading the connection while it has too many, or
        a body limit's worth of them, waiting (a pipelining client cannot make the server
        hold more than that)."""
        if not (self._busy or self._pending or self._write_paused) and self._transport is not None:
            self._handle(request)  # nothing waits before it: the common case, no queue
            return
        self._pending.append(request)
        self._pending_bytes += len(request.body)
        full = self._pending_bytes >= self._server.max_body_bytes
        if full or len(self._pending) >= _PIPELINE_DEPTH:
            self._queue_full = True
            self._update_reading()
        if not self._busy:
            self._next()

    # -- request handling ------------------------------------------------------------------
    def _next(self) -> None:
        while self._pending and not self._busy and not self._write_paused:
            if self._transport is None:
                return
            request = self._pending.popleft()
            self._pending_bytes -= len(request.body)
            if (
                self._queue_full
                and len(self._pending) < _PIPELINE_DEPTH // 2
                and self._pending_bytes < self._server.max_body_bytes // 2
            ):
                self._queue_full = False
                self._update_reading()
            self._handle(request)
        if self._final is not None and not self._pending and not self._busy:
            self._send_final()

    def _handle(self, request: Request) -> None:
        """Hand a request to the handler: its answer written now, or when it is settled."""
        self._server.in_flight += 1
        try:
            result = self._server.handler(request)
        except Exception:
            logger.exception("request handler failed")
            result = error_response(500, "internal server error")
        if isinstance(result, Response):
            self._server.in_flight -= 1
            self._write(result, request)
            return
        self._busy = request
        self._timed_out = False
        self._task_started = time.monotonic()
        if not isinstance(result, (Ticket, asyncio.Future)):
            result = self._server.loop.create_task(result)
        self._current = result
        result.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[Response] | Ticket[Response]) -> None:
        """The answer to the busy request is settled (one request is answered at a time)."""
        request = self._busy
        assert request is not None  # set by _handle until this answer is settled
        self._busy = None
        self._current = None
        self._server.in_flight -= 1
        try:
            response = task.result()
        except asyncio.CancelledError:
            if self._timed_out:
                seconds = self._server.request_timeout_s
                response = error_response(
                    503,
                    f"request timed out after {seconds:g} s; retry later",
                    [(b"retry-after", b"1")],
                )
            elif self._transport is None:
                return  # the connection went away
            else:  # cancelled by something else (the work it awaited was): still answered
                response = error_response(
                    503,
                    "the request was cancelled before it was answered; retry",
                    [(b"retry-after", b"1")],
                )
        except Exception as exc:
            logger.error("request handler failed", exc_info=exc)
            response = error_response(500, "internal server error")
        self._write(response, request)
        self._next()

    def _write(self, response: Response, request: Request) -> None:
        transport = self._transport
        if transport is None:
            return
        close = response.close or not request.keep_alive
        status = _STATUS_LINES.get(response.status) or f"HTTP/1.1 {response.status} \r\n".encode()
        head = [
            b"%scontent-type: %s\r\ncontent-length: %d\r\n%s"
            % (status, response.content_type, len(response.body), self._server.date_header)
        ]
        for name, value in response.headers:
            head += (name, b": ", value, b"\r\n")
        if close:
            head.append(b"connection: close\r\n")
        elif _keep_alive_asked(request.headers.get(b"connection")):
            # said back: an HTTP/1.0 client keeps the connection only when the answer says so;
            # with how long an idle one is kept (Keep-Alive, RFC 2068 19.7.1.1), so that a
            # client that reads it (Node.js's http.Agent) drops it before the server does
            head.append(self._server.keep_alive_header)
        head.append(b"\r\n")
        if request.method != b"HEAD":  # a HEAD answer is the GET's head, without its body
            head.append(response.body)
        transport.write(b"".join(head))
        self._last_active = time.monotonic()
        if close:
            self._pending.clear()
            self._pending_bytes = 0
            self._final = None
            self._linger(transport)
        elif self._expect_continue and not self._pending:
            # The request being read asked for 100 while earlier ones were answered, and
            # its body has not arrived yet: this was the last answer before it.
            transport.write(_CONTINUE)
            self._expect_continue = False
            # its client waited for this 100 to send the body: the request's clock (408)
            # starts now, not when its headers came in behind the answers before it
            self._reading_since = time.monotonic()

    def _reject(self, response: Response) -> None:
        """Answer a request we will not read any further, after the requests before it (in
        order, RFC 9112 9.3.2), then close the connection; the connection is not read meanwhile.
        """
        self._rejected = True
        self._expect_continue = False
        self._release_body()
        self._body = b""  # what came of the refused request's body is never read
        response.headers.append((b"connection", b"close"))
        response.close = False
        self._final = response
        if self._busy or self._pending:
            self._update_reading()
        else:
            self._send_final()

    def _send_final(self) -> None:
        """Send the refusal and close. The rest of the input is read and dropped for a moment
        first (closing at once with unread data would reset the connection before the client
        reads the answer)."""
        response, self._final = self._final, None
        transport = self._transport
        if transport is None or response is None:
            return
        self._write(response, Request(b"", b"", b"", {}, b"", True, 0.0))
        self._linger(transport)

    def _linger(self, transport: asyncio.Transport) -> None:
        """Close in stages (RFC 9112 9.6): no more answers, the rest of the input read and
        dropped for a moment, then close (closing at once with unread input would reset the
        connection, which can erase the answer before the client reads it)."""
        self._rejected = True  # what still arrives is dropped
        self._queue_full = False
        self._update_reading()
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(_LINGER_S, transport.close)

    # -- ticker ----------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        timeout = self._server.request_timeout_s
        transport = self._transport
        if transport is None:
            return
        if self._write_paused or (
            # closed (idle, or its last answer said so) with answers still in the buffer,
            # under the high-water mark: close() waits for a client that may never read them
            transport.is_closing() and transport.get_write_buffer_size()
        ):
            unsent = _unsent(transport)
            if not self._write_paused_since or unsent < self._write_unsent:
                # stalled just now, or the client read some: it is slow, not gone
                self._write_unsent, self._write_paused_since = unsent, now
            elif now - self._write_paused_since > timeout:
                transport.abort()  # close() would wait for the client to read it all
        elif (
            self._busy
            and self._current is not None
            and self._busy.timed
            and now - self._task_started > timeout
        ):
            self._timed_out = True
            self._current.cancel(TIMED_OUT)
        elif self._rejected:
            return
        elif self._body_stalled(now):
            self._reject(
                error_response(
                    408,
                    f"request body arriving at under {_BODY_MIN_RATE >> 10} KiB/s while other "
                    "large bodies wait for room; closing. Send the body without pauses, or "
                    "retry",
                )
            )
        elif (
            self._reading_since and not self._paused_reading and now - self._reading_since > timeout
        ):
            self._reject(error_response(408, f"request not received within {timeout:g} s; closing"))
        elif (
            not self._busy
            and not self._pending
            and not self._reading_since
            and now - self._last_active > self._server.keepalive_timeout_s
        ):
            transport.close()

    def _body_stalled(self, now: float) -> bool:
        """This connection holds room in the body budget that others wait for, and its body
        came slower than :data:`_BODY_MIN_RATE` over the last :data:`_BODY_STALL_S` (checked
        only while some connection waits, so a slow client alone is held to the request
        timeout only)."""
        if not self._body_reserved or self._body_wait or not self._server.body_waiting:
            self._body_mark_at = 0.0
            return False
        size = len(self._body)
        if not self._body_mark_at:
            self._body_mark, self._body_mark_at = size, now
            return False
        elapsed = now - self._body_mark_at
        if elapsed < _BODY_STALL_S:
            return False
        if size - self._body_mark < _BODY_MIN_RATE * elapsed:
            return True
        self._body_mark, self._body_mark_at = size, now
        return False

    def receiving(self) -> bool:
        """A request whose head is in and whose body is still arriving (closing now would
        leave its client not knowing whether it ran)."""
        if self._rejected or self._transport is None:
            return False
        return (bool(self._reading_since) and self._in_trailers) or self._upgrade_body is not None

    def unsent(self) -> bool:
        """Answers written that are still in the transport's buffer (lost if it closed now)."""
        transport = self._transport
        return transport is not None and transport.get_write_buffer_size() > 0

    def close_if_idle(self) -> None:
        if self._transport is not None and not self._busy and not self._pending:
            self._transport.close()


class HttpServer:
    """Serve ``handler`` over HTTP/1.1; :meth:`start` binds, :meth:`close` stops."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_body_bytes: int,
        request_timeout_s: float,
        keepalive_timeout_s: float = 60.0,
    ) -> None:
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.keep_alive_header = b""
        self.keepalive_timeout_s = keepalive_timeout_s
        self.connections: set[_Connection] = set()
        self.in_flight = 0
        self.draining = False
        self.date_header = b""
        #: asked, for a request that expects ``100-continue``, before the 100 is sent: the
        #: answer it gets whatever its body, given its head (a Request without a body), or None
        self.expect_check: Callable[[Request], Response | None] | None = None
        self.loop: asyncio.AbstractEventLoop  # set by start(), before any connection exists
        #: open connections past which the quietest are closed (see :meth:`shed_idle`); start()
        #: sets it below the file descriptor limit unless it was set
        self.max_connections = sys.maxsize
        #: bytes of large bodies (a MB or more, by Content-Length) read at once, all connections
        #: together: four body limits (at least 256 MiB); past it a connection waits its turn
        self.body_budget = max(4 * max_body_bytes, 256 << 20)
        self.body_reading = 0
        self.body_waiting: deque[_Connection] = deque()
        self._server: asyncio.base_events.Server | None = None
        self._ticker: asyncio.TimerHandle | None = None

    @property
    def keepalive_timeout_s(self) -> float:
        """Seconds an idle keep-alive connection is kept (closed within a second after)."""
        return self._keepalive_timeout_s

    @keepalive_timeout_s.setter
    def keepalive_timeout_s(self, seconds: float) -> None:
        self._keepalive_timeout_s = seconds
        #: said to a client that asks to keep the connection: whole seconds, rounded down,
        #: so that it is never told more time than it has
        self.keep_alive_header = b"connection: keep-alive\r\nkeep-alive: timeout=%d\r\n" % int(
            min(max(seconds, 0.0), 2**31 - 1)
        )

    @property
    def port(self) -> int:
        """The bound port (useful after binding port 0)."""
        assert self._server is not None, "start() the server first"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, host: str, port: int, **kwargs: Any) -> None:
        """Bind and start accepting connections."""
        loop = asyncio.get_running_loop()
        self.loop = loop
        try:
            self._server = await loop.create_server(
                self.connection, host, port, reuse_address=True, backlog=2048, **kwargs
            )
        except OSError as exc:
            raise ConfigError(_bind_error(host, port, exc)) from None
        if self.max_connections == sys.maxsize:
            self.max_connections = connection_limit()
        self._tick()

    def connection(self) -> asyncio.Protocol:
        """A new connection's protocol (the listener's factory; an in-process driver, such as
        ``benchmarks/serve_profile.py``, feeds one a transport of its own). Call after
        :meth:`start`."""
        return _Connection(self)

    def release_body(self, conn: _Connection) -> None:
        """``conn``'s large body is in (or refused, or its client gone): let the connections
        waiting for room in :attr:`body_budget` read theirs, first come first served."""
        if conn._body_wait:
            conn._body_wait = False
            with contextlib.suppress(ValueError):
                self.body_waiting.remove(conn)
        else:
            self.body_reading -= conn._body_reserved
        conn._body_reserved = 0
        waiting = self.body_waiting
        while waiting:
            nxt = waiting[0]
            if self.body_reading and self.body_reading + nxt._body_reserved > self.body_budget:
                break
            waiting.popleft()
            self.body_reading += nxt._body_reserved
            nxt._body_wait = False
            nxt._update_reading()

    def shed_idle(self, keep: _Connection | None = None) -> None:
        """Over :attr:`max_connections`: close the quietest eighth of the connections with no
        answer due (idle keep-alive connections, clients that connect and send nothing or
        send a request a byte at a time), least recently active first, so that file
        descriptors are left for clients that send requests. Batched, so that the scan is
        paid once per many new connections."""
        quiet = [
            (since, c)
            for c in self.connections
            if c is not keep and (since := c.quiet_since()) is not None
        ]
        if not quiet:
            return
        quiet.sort(key=lambda pair: pair[0])
        count = max(1, len(self.connections) - self.max_connections, len(self.connections) // 8)
        for _, conn in quiet[:count]:
            if conn._transport is not None:
                conn._transport.abort()
        logger.warning(
            "%d connections open, over the limit of %d (from the open file limit): closed "
            "the %d quietest with no answer due",
            len(self.connections),
            self.max_connections,
            min(count, len(quiet)),
        )

    def _tick(self) -> None:
        now = time.monotonic()
        self.date_header = b"date: " + email.utils.formatdate(usegmt=True).encode() + b"\r\n"
        for conn in list(self.connections):
            conn.tick(now)
        self._ticker = asyncio.get_running_loop().call_later(1.0, self._tick)

    @property
    def unsent(self) -> bool:
        """Some connection still has answers in its transport's buffer (a slow reader)."""
        return any(conn.unsent() for conn in self.connections)

    @property
    def receiving(self) -> bool:
        """Some connection is still receiving a request's body (a drain waits for it, then
        answers it 503 with ``Connection: close``)."""
        return any(conn.receiving() for conn in self.connections)

    def stop_accepting(self) -> None:
        """Close the listening socket at once; open connections stay."""
        if self._server is not None:
            self._server.close()

    async def close_listener(self, timeout: float = 2.0) -> None:
        """Stop taking connections and close the listening socket without resetting any that
        the kernel already accepted (see :mod:`torchplace.serve.listener`); open connections
        stay."""
        if self._server is not None:
            await close_listener(self._server, timeout)

    async def close(self) -> None:
        """Stop accepting, close every connection and wait for the socket to go."""
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self.stop_accepting()
        for conn in list(self.connections):
            conn.close_if_idle()
        for conn in list(self.connections):
            if conn._transport is not None:
                conn._transport.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)
            self._server = None
