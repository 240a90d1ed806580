"""HTTP/2 frames as gRPC's server side writes them (RFC 9113), and the few header blocks it
sends (HPACK, RFC 7541, literals only).

A gRPC server sends the same few headers on every call: ``:status``, ``content-type``,
``grpc-accept-encoding``, and the trailers ``grpc-status`` and ``grpc-message``. They are
written as literals that never enter the HPACK dynamic table, so what the client asks of the
table (``SETTINGS_HEADER_TABLE_SIZE``) never matters and the blocks are built once.
Decoding what clients send is :mod:`hpack`'s (Huffman codes and the dynamic table).
"""

from __future__ import annotations

import struct
from enum import IntEnum

__all__ = [
    "ACK",
    "END_HEADERS",
    "END_STREAM",
    "FRAME_HEAD",
    "MAX_DETAILS_BYTES",
    "PADDED",
    "PREFACE",
    "PRIORITY_FLAG",
    "ErrorCode",
    "FrameType",
    "Setting",
    "frame",
    "header_block",
    "header_frames",
    "percent_encode",
    "status_details",
]

#: what a client sends first (RFC 9113 section 3.4)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20


class FrameType(IntEnum):
    DATA = 0
    HEADERS = 1
    PRIORITY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PUSH_PROMISE = 5
    PING = 6
    GOAWAY = 7
    WINDOW_UPDATE = 8
    CONTINUATION = 9


class Setting(IntEnum):
    HEADER_TABLE_SIZE = 1
    ENABLE_PUSH = 2
    MAX_CONCURRENT_STREAMS = 3
    INITIAL_WINDOW_SIZE = 4
    MAX_FRAME_SIZE = 5
    MAX_HEADER_LIST_SIZE = 6


class ErrorCode(IntEnum):
    NO_ERROR = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2
    FLOW_CONTROL_ERROR = 3
    SETTINGS_TIMEOUT = 4
    STREAM_CLOSED = 5
    FRAME_SIZE_ERROR = 6
    REFUSED_STREAM = 7
    CANCEL = 8
    COMPRESSION_ERROR = 9
    ENHANCE_YOUR_CALM = 11


#: a frame's 9-byte header (RFC 9113 section 4.1): length (24 bits, as its high byte and low
#: 16), type, flags, stream (the reserved bit included: a reader masks it off)
FRAME_HEAD = struct.Struct(">BHBBI")


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame: its 9-byte header, then ``payload``."""
    size = len(payload)
    return FRAME_HEAD.pack(size >> 16, size & 0xFFFF, kind, flags, stream) + payload


def header_frames(flags: int, stream: int, block: bytes, max_frame: int) -> bytes:
    """A header block as one HEADERS frame, or, past ``max_frame`` bytes (the client's
    SETTINGS_MAX_FRAME_SIZE, which no frame may exceed: RFC 9113 section 4.2), as HEADERS
    then CONTINUATION frames: END_STREAM (of ``flags``) stays on the HEADERS, END_HEADERS
    moves to the last frame."""
    if len(block) <= max_frame:
        return frame(FrameType.HEADERS, flags, stream, block)
    size = len(block)
    out = [frame(FrameType.HEADERS, flags & ~END_HEADERS, stream, block[:max_frame])]
    for start in range(max_frame, size, max_frame):
        last = flags & END_HEADERS if start + max_frame >= size else 0
        out.append(frame(FrameType.CONTINUATION, last, stream, block[start : start + max_frame]))
    return b"".join(out)


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer with a ``prefix_bits`` prefix (RFC 7541 section 5.1)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A literal header field without indexing, with a new name, neither Huffman-coded."""
    return b"\x00" + _integer(len(name), 7) + name + _integer(len(value), 7) + value


def header_block(status: int, fields: tuple[tuple[bytes, bytes], ...]) -> bytes:
    """``:status`` (the static table's entry for 200, a literal else) then ``fields``."""
    head = b"\x88" if status == 200 else _literal(b":status", str(status).encode())
    return head + b"".join(_literal(name, value) for name, value in fields)


#: the most bytes an error's message takes in the ``grpc-message`` trailer, percent-encoded:
#: clients refuse trailers over 8 KiB (16 KiB hard), and would then report the call as
#: RESOURCE_EXHAUSTED instead of its status, so a message that quotes a long client-given
#: string (a model name, a datatype, a header's value) is cut to this
MAX_DETAILS_BYTES = 4096


def status_details(message: str, limit: int = MAX_DETAILS_BYTES) -> str:
    """``message`` as an RPC status's details: cut, with a note of what was left out, where its
    percent-encoded form (what the ``grpc-message`` trailer carries) is over ``limit`` bytes.
    A message cut once is left as it is (the transport cuts every status it writes, and a
    handler's may have been cut already)."""
    if len(message) * 12 <= limit:  # quick: even all 4-byte UTF-8, each byte as %XX, fits
        return message
    size, cut = 0, 0
    for index, char in enumerate(message):
        literal = " " <= char <= "~" and char != "%"
        size += 1 if literal else 3 * len(char.encode("utf-8", "surrogatepass"))
        if size <= limit - 64:  # room for the note
            cut = index + 1
        elif size > limit:
            return f"{message[:cut]}... ({len(message) - cut} more characters)"
    return message


def percent_encode(message: str) -> bytes:
    """``grpc-message``'s encoding: UTF-8, then every byte outside printable ASCII, and ``%``,
    as ``%XX`` (gRPC's HTTP/2 protocol)."""
    out = bytearray()
    for byte in message.encode("utf-8", "replace"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)
