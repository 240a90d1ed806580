"""A bare HTTP/2 client for hostile gRPC tests: frames written by hand, headers as HPACK literals.

Just enough of RFC 9113 and RFC 7541 to send what a well-behaved library never would (streams
reset as soon as they are opened, a message whose length prefix overstates it, headers gRPC core
must refuse) and to read the server's frames back. No HPACK decoding: a test looks for bytes in
a header block (the server's literals, such as ``grpc-status``, are plain text).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "ACK",
    "CANCEL",
    "DATA",
    "ENABLE_PUSH",
    "END_HEADERS",
    "END_STREAM",
    "FLOW_CONTROL_ERROR",
    "FRAME_SIZE_ERROR",
    "GOAWAY",
    "HEADERS",
    "HEADER_TABLE_SIZE",
    "INITIAL_WINDOW_SIZE",
    "MAX_CONCURRENT_STREAMS",
    "PING",
    "PREFACE",
    "PRIORITY",
    "PROTOCOL_ERROR",
    "REFUSED_STREAM",
    "RST_STREAM",
    "SETTINGS",
    "WINDOW_UPDATE",
    "Connection",
    "Frame",
    "frame",
    "grpc_headers",
    "grpc_message",
    "literal",
    "rss_kib",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PING, GOAWAY, WINDOW_UPDATE = 0x6, 0x7, 0x8
#: flags
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
#: SETTINGS parameters
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE = 0x1, 0x2, 0x3, 0x4
#: error codes (RST_STREAM, GOAWAY)
PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = (
    0x1,
    0x3,
    0x6,
    0x7,
    0x8,
)


@dataclass(frozen=True)
class Frame:
    kind: int
    flags: int
    stream: int
    payload: bytes

    def settings(self) -> dict[int, int]:
        """A SETTINGS frame's values by identifier."""
        pairs = (
            struct.unpack(">HI", self.payload[i : i + 6]) for i in range(0, len(self.payload), 6)
        )
        return dict(pairs)

    def error_code(self) -> int:
        """A RST_STREAM frame's error code."""
        return int(struct.unpack(">I", self.payload[:4])[0])


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def _integer(value: int, prefix_bits: int) -> bytes:
    """An HPACK integer with a ``prefix_bits`` prefix (RFC 7541, 5.1), first byte's flags 0."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out = bytearray([limit])
    value -= limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: str, value: str | bytes, *, indexed: bool = False) -> bytes:
    """A header as an HPACK literal with a new name, no Huffman coding; without indexing, or
    (``indexed``) added to the dynamic table, as its entry 62, the others moving up one."""
    raw = value.encode() if isinstance(value, str) else value
    kind = b"\x40" if indexed else b"\0"
    return kind + _integer(len(name), 7) + name.encode() + _integer(len(raw), 7) + raw


def grpc_headers(path: str, extra: Iterable[tuple[str, str | bytes]] = ()) -> bytes:
    """The header block of a gRPC call to ``path`` (a ``/service/method``)."""
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path),
              (":authority", "127.0.0.1"), ("content-type", "application/grpc"),
              ("te", "trailers"), *extra]  # fmt: skip
    return b"".join(literal(name, value) for name, value in fields)


def grpc_message(body: bytes, *, compressed: bool = False, length: int | None = None) -> bytes:
    """``body`` in gRPC's length-prefixed framing (``length``: a prefix that lies)."""
    size = len(body) if length is None else length
    return bytes([1 if compressed else 0]) + struct.pack(">I", size) + body


class Connection:
    """One HTTP/2 connection over TCP: the preface and an empty SETTINGS are sent at once; the
    server's SETTINGS are acknowledged as they are read."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        self._buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(
        self, until: Callable[[Frame], bool] | None = None, timeout: float = 5.0
    ) -> list[Frame]:
        """Frames until one satisfies ``until``, the connection closes or ``timeout`` seconds
        pass without a byte."""
        self.sock.settimeout(timeout)
        frames: list[Frame] = []
        while True:
            while len(self._buffer) >= 9:
                size = int.from_bytes(self._buffer[:3], "big")
                if len(self._buffer) < 9 + size:
                    break
                head, self._buffer = self._buffer[: 9 + size], self._buffer[9 + size :]
                stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                got = Frame(head[3], head[4], stream, head[9:])
                frames.append(got)
                if got.kind == SETTINGS and not got.flags & ACK:
                    self.sock.sendall(frame(SETTINGS, ACK, 0))
                if until is not None and until(got):
                    return frames
            try:
                chunk = self.sock.recv(1 << 16)
            except (TimeoutError, ConnectionError):
                return frames
            if not chunk:
                return frames
            self._buffer += chunk

    def close(self) -> None:
        self.sock.close()


def rss_kib() -> int:
    """This process's resident set size, in KiB (Linux's /proc)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")
