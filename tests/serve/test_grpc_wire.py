"""The gRPC transport's own parts (:mod:`torchplace.serve.grpc_wire`, :mod:`~torchplace.serve.
h2frames`, :mod:`~torchplace.serve.grpc_call`): the header blocks it writes decode as HPACK,
``grpc-timeout`` and ``grpc-message`` are read and written as gRPC's HTTP/2 protocol says, and
on the wire (a hand-spoken client, :mod:`tests.serve.raw_http2`): answers wait on the client's
flow-control window, PINGs are acknowledged, a request that is not gRPC gets an HTTP status, a
connection that does not speak HTTP/2 is closed with GOAWAY, and the server serves on. On an
in-memory transport: a call's answer is written when the call ends, a streamed answer as it is
made, and calls refused while one read's frames are read in one write at its end."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from torchplace.serve.running import ServerThread

from .conftest import FakeEngine, test_config
from .raw_http2 import (
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    PING,
    PREFACE,
    PROTOCOL_ERROR,
    SETTINGS,
    WINDOW_UPDATE,
    Connection,
    frame,
    grpc_headers,
    grpc_message,
    literal,
)

grpc = pytest.importorskip("grpc")
hpack = pytest.importorskip("hpack")
from torchplace.serve.grpc_call import Call, parse_timeout  # noqa: E402
from torchplace.serve.grpc_wire import Connection as WireConnection  # noqa: E402
from torchplace.serve.grpc_wire import WireLimits, WireServer, _run  # noqa: E402
from torchplace.serve.h2frames import frame as h2_frame  # noqa: E402
from torchplace.serve.h2frames import header_block, percent_encode  # noqa: E402
from torchplace.serve.proto import grpc_service_pb2 as pb  # noqa: E402

from .test_grpc_transport import _infer_request, _still_serves  # noqa: E402

INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with ServerThread(test_config(request_timeout_s=2.0), engine=FakeEngine()) as thread:
        yield thread


def _port(server: ServerThread) -> int:
    port = server.grpc_port
    assert port is not None
    return port


def test_header_blocks_decode_as_hpack() -> None:
    long_value = b"x" * 300  # a length past the 7-bit prefix
    block = header_block(200, ((b"grpc-status", b"0"), (b"grpc-message", long_value)))
    assert hpack.Decoder().decode(block, raw=True) == [
        (b":status", b"200"), (b"grpc-status", b"0"), (b"grpc-message", long_value),
    ]  # fmt: skip
    assert hpack.Decoder().decode(header_block(415, ()), raw=True) == [(b":status", b"415")]


def test_frames_carry_a_24_bit_length_type_flags_and_a_31_bit_stream() -> None:
    assert h2_frame(0, 1, 3, b"abc") == b"\x00\x00\x03\x00\x01\x00\x00\x00\x03abc"
    big = h2_frame(1, 4, 2**31 - 1, b"x" * 70000)  # past 16 bits of length
    assert big[:9] == (70000).to_bytes(3, "big") + b"\x01\x04" + (2**31 - 1).to_bytes(4, "big")
    assert len(big) == 9 + 70000


def test_grpc_message_is_percent_encoded() -> None:
    assert percent_encode("50% done: é\n") == b"50%25 done: %C3%A9%0A"


@pytest.mark.parametrize(
    ("given", "seconds"),
    [(b"1S", 1.0), (b"250m", 0.25), (b"3M", 180.0), (b"2H", 7200.0), (b"5u", 5e-6),
     (b"7n", 7e-9), (b"99999999S", 99999999.0), (b"100", None), (b"S", None),
     (b"123456789S", None), (b"1x", None), (b"-1S", None)],
)  # fmt: skip
def test_grpc_timeout_is_digits_and_a_unit(given: bytes, seconds: float | None) -> None:
    assert parse_timeout(given) == (None if seconds is None else pytest.approx(seconds))


def _call(connection: Connection, stream: int = 1) -> None:
    body = _infer_request().SerializeToString()
    connection.send(frame(HEADERS, END_HEADERS, stream, grpc_headers(INFER))
                    + frame(DATA, END_STREAM, stream, grpc_message(body)))  # fmt: skip


def test_an_answer_waits_on_the_client_s_flow_control_window(server: ServerThread) -> None:
    connection = Connection(_port(server))
    try:  # a window of 10 bytes for each stream: the answer's message is longer
        connection.send(frame(SETTINGS, 0, 0, INITIAL_WINDOW_SIZE.to_bytes(2, "big")
                              + (10).to_bytes(4, "big")))  # fmt: skip
        _call(connection)
        first = connection.read(timeout=1.0)
        sent = [f for f in first if f.kind == DATA and f.stream == 1]
        assert sum(len(f.payload) for f in sent) == 10
        assert not any(f.kind == HEADERS and f.flags & END_STREAM for f in first)
        connection.send(frame(WINDOW_UPDATE, 0, 1, (1 << 20).to_bytes(4, "big")))
        rest = connection.read(lambda f: f.kind == HEADERS and bool(f.flags & END_STREAM))
    finally:
        connection.close()
    data = b"".join(f.payload for f in first + rest if f.kind == DATA and f.stream == 1)
    size = int.from_bytes(data[1:5], "big")
    assert len(data) == 5 + size
    assert pb.ModelInferResponse.FromString(data[5:]).id == "r"
    assert b"grpc-status\x010" in rest[-1].payload


def test_window_credits_for_answered_calls_keep_the_connection_serving(
    server: ServerThread,
) -> None:
    """As a gRPC client does after each answer: a credit to the connection and one to the
    finished stream (ignored, RFC 9113 section 6.9), then the next call is answered."""
    connection = Connection(_port(server))
    try:
        _call(connection)
        connection.read(lambda f: f.kind == HEADERS and bool(f.flags & END_STREAM))
        credit = (1 << 16).to_bytes(4, "big")
        connection.send(frame(WINDOW_UPDATE, 0, 0, credit) + frame(WINDOW_UPDATE, 0, 1, credit))
        _call(connection, stream=3)
        rest = connection.read(lambda f: f.kind == HEADERS and bool(f.flags & END_STREAM))
    finally:
        connection.close()
    assert not any(f.kind == GOAWAY for f in rest)
    assert rest[-1].stream == 3
    assert b"grpc-status\x010" in rest[-1].payload


def test_a_ping_is_acknowledged_with_its_payload(server: ServerThread) -> None:
    connection = Connection(_port(server))
    try:
        connection.send(frame(PING, 0, 0, b"12345678"))
        frames = connection.read(lambda f: f.kind == PING)
    finally:
        connection.close()
    assert (frames[-1].flags, frames[-1].payload) == (1, b"12345678")


@pytest.mark.parametrize(
    ("method", "kind", "status"),
    [("POST", "application/json", "415"), ("GET", "application/grpc", "405")],
)
def test_a_request_that_is_not_grpc_gets_an_http_status(
    server: ServerThread, method: str, kind: str, status: str
) -> None:
    fields = ((":method", method), (":scheme", "http"), (":path", INFER), (":authority", "x"),
              ("content-type", kind))  # fmt: skip
    block = b"".join(literal(name, value) for name, value in fields)
    connection = Connection(_port(server))
    try:
        connection.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, block))
        frames = connection.read(lambda f: f.kind == HEADERS and f.stream == 1)
    finally:
        connection.close()
    assert frames[-1].flags & END_STREAM
    assert hpack.Decoder().decode(frames[-1].payload)[0] == (":status", status)
    _still_serves(_port(server))


def test_a_client_that_does_not_speak_http2_gets_goaway(server: ServerThread) -> None:
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * len(PREFACE))
        received = b""
        while chunk := sock.recv(1 << 16):
            received += chunk
    at = received.find(bytes([GOAWAY]))  # after the server's SETTINGS and WINDOW_UPDATE
    assert at >= 3
    payload = received[at + 6 :]
    assert int.from_bytes(payload[4:8], "big") == PROTOCOL_ERROR
    _still_serves(_port(server))


LIVE = "/inference.GRPCInferenceService/ServerLive"
METADATA = "/inference.GRPCInferenceService/ServerMetadata"


def _answer_of(connection: Connection, stream: int, block: bytes) -> bytes:
    """Send an empty request with header block ``block`` on ``stream``: its answer's message."""
    connection.send(frame(HEADERS, END_HEADERS, stream, block)
                    + frame(DATA, END_STREAM, stream, grpc_message(b"")))  # fmt: skip
    frames = connection.read(lambda f: f.stream == stream and bool(f.flags & END_STREAM))
    data = b"".join(f.payload for f in frames if f.kind == DATA and f.stream == stream)
    assert data, frames
    return data[5:]


def test_a_block_of_indexed_fields_means_what_the_dynamic_table_holds_when_it_comes(
    server: ServerThread,
) -> None:
    """A header block of indexed fields only is read once and remembered (clients send the
    same few blocks again and again); the same bytes after the client changed its dynamic
    table are read anew."""
    post_http = bytes([0x80 | 3, 0x80 | 6])  # static :method POST, :scheme http
    grpc_type = literal("content-type", "application/grpc", indexed=True)
    again = post_http + bytes([0x80 | 63, 0x80 | 62])  # the :path, then the content type
    connection = Connection(_port(server))
    try:
        first = post_http + literal(":path", LIVE, indexed=True) + grpc_type
        live = pb.ServerLiveResponse.FromString(_answer_of(connection, 1, first))
        assert live.live
        for stream in (3, 5):  # read, then remembered
            assert _answer_of(connection, stream, again) == live.SerializeToString()
        changed = post_http + literal(":path", METADATA, indexed=True) + grpc_type
        _answer_of(connection, 7, changed)
        metadata = pb.ServerMetadataResponse.FromString(_answer_of(connection, 9, again))
    finally:
        connection.close()
    assert metadata.name == "torchplace"


class _Written:
    """A transport that keeps what is written to it."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return False

    def abort(self) -> None: ...


def test_an_ended_call_is_written_before_the_next_answer_is_made() -> None:
    """Calls that end in one pass of the loop (a batch's answers) are each written when they
    end: the client takes up the first while the later ones are made."""
    asyncio.run(_answer_two_calls())


async def _answer_two_calls() -> None:
    connection = WireConnection(WireServer((), WireLimits(max_message_bytes=1 << 20)))
    transport = _Written()
    connection.connection_made(transport)  # type: ignore[arg-type]
    calls = [Call(connection, stream, (), None, b"identity", 1 << 20) for stream in (1, 3)]
    for call in calls:
        connection.calls[call.stream] = call
    try:
        for call in calls:
            before = len(transport.writes)
            connection.answer(call, b"answer %d" % call.stream)
            connection.finish(call, grpc.StatusCode.OK)
            written = transport.writes[before:]
            assert len(written) == 1, written  # the answer and its trailers, at once
            data = [f for f in _frames(written[0]) if f[0] == DATA]
            assert [f[2] for f in data] == [grpc_message(b"answer %d" % call.stream)]
            assert call.stream not in connection.calls  # its status went with it
    finally:
        connection.connection_lost(None)


def test_a_streamed_answer_is_written_before_the_next_is_made() -> None:
    """A streaming handler's answer goes out as it is made, as a call's end does."""
    asyncio.run(_stream_two_answers())


async def _stream_two_answers() -> None:
    connection = WireConnection(WireServer((), WireLimits(max_message_bytes=1 << 20)))
    transport = _Written()
    connection.connection_made(transport)  # type: ignore[arg-type]
    call = Call(connection, 1, (), None, b"identity", 1 << 20)
    connection.calls[1] = call
    call.end_of_requests()
    seen: list[bytes] = []

    async def answers(requests: Any, context: Any) -> AsyncIterator[bytes]:
        yield b"first"
        seen.append(b"".join(transport.writes))  # what the client has when the next is made
        yield b"second"

    try:
        await _run(call, grpc.stream_stream_rpc_method_handler(answers))
    finally:
        connection.connection_lost(None)
    assert grpc_message(b"first") in seen[0]
    assert grpc_message(b"second") not in seen[0]
    assert grpc_message(b"second") in b"".join(transport.writes)


def test_calls_refused_in_one_read_are_written_once() -> None:
    """Calls that end while the frames of one read are read (here: a method no handler
    serves) are written together when the read ends."""
    asyncio.run(_refuse_three_calls())


async def _refuse_three_calls() -> None:
    connection = WireConnection(WireServer((), WireLimits(max_message_bytes=1 << 20)))
    transport = _Written()
    connection.connection_made(transport)  # type: ignore[arg-type]
    try:
        settings = len(transport.writes)
        calls = b"".join(frame(HEADERS, END_HEADERS | END_STREAM, stream, grpc_headers(INFER))
                         for stream in (1, 3, 5))  # fmt: skip
        connection.data_received(PREFACE + frame(SETTINGS, 0, 0) + calls)
        written = transport.writes[settings:]
        assert len(written) == 1, written
        ended = [f for f in _frames(written[0]) if f[0] == HEADERS]
        assert [stream for _, stream, _ in ended] == [1, 3, 5]
        assert all(b"grpc-status\x0212" in payload for _, _, payload in ended)  # UNIMPLEMENTED
    finally:
        connection.connection_lost(None)


def _frames(data: bytes) -> list[tuple[int, int, bytes]]:
    """The (type, stream, payload) of each HTTP/2 frame in ``data``."""
    frames = []
    while data:
        size = int.from_bytes(data[:3], "big")
        stream = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
        frames.append((data[3], stream, data[9 : 9 + size]))
        data = data[9 + size :]
    return frames
