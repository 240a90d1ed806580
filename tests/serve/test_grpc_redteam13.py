"""A thirteenth red-team pass: the gRPC port under HTTP/2 frame-level and gRPC-level abuse,
spoken by hand (:mod:`tests.serve.raw_http2`) and with grpcio clients.

Tried this round and found to behave as designed (not repeated here): CONTINUATION floods
(CVE-2024-27316 style: 20,000 frames of one header block; the stream is refused past the
metadata limit, memory stays flat), SETTINGS floods (100,000 frames: each acknowledged, nothing
kept), PING floods (gRPC core closes the connection), WINDOW_UPDATE of zero and past 2^31-1
(connection errors), an HPACK dynamic table asked to grow to 1 GiB (``INTERNAL``, the limit
named), a stream id near 2^31 and a lower one after it, thousands of half-closed
``ModelStreamInfer`` streams over ten connections, a reflection stream sent 20,000
``file_containing_symbol`` requests whose answers (18 KB each) it never reads and a
``ModelStreamInfer`` stream sent 20,000 requests the same way (held by flow control and the
stream window: memory flat), 300 streams cancelled after 0 to 4 answers beside a stream that
gets all of its 300 answers, ``grpc-timeout`` of zero (``DEADLINE_EXCEEDED``) and of 99,999,999
in every unit (answered), a gzip bomb (refused as a frame over the peer's size before it is
inflated), a message over ``--max-body-bytes`` on a unary call and on a stream, a method name
in Unicode (``UNIMPLEMENTED``), and a channel kept calling across a drain (``UNAVAILABLE`` with
the reason once the drain starts).

What is pinned here:

- HTTP/2 rapid reset (CVE-2023-44487): streams opened and reset at once cost the client
  nothing and the server a call each; on gRPC core 20,000 of them on one connection grew the
  server by 144 MB. A reset stream's call is dropped at once, and the server advertises
  ``SETTINGS_MAX_CONCURRENT_STREAMS``
  (:data:`~torchplace.serve.grpc_server.MAX_STREAMS_PER_CONNECTION`) and refuses the streams
  past it (``REFUSED_STREAM``) while that many are open: test_grpc_transport.py's burst of 1,500
  calls on one channel is all answered;
- the refusals made before a handler runs (a compressed message with no
  ``grpc-encoding``, an unknown encoding, a ``-bin`` header that is not base64, a malformed
  ``grpc-timeout``) each get a status naming what was wrong, and the server keeps serving; a
  message whose length prefix overstates it is ``INVALID_ARGUMENT`` with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from torchplace.serve.running import ServerThread

from .conftest import FakeEngine, test_config
from .raw_http2 import (
    CANCEL,
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    MAX_CONCURRENT_STREAMS,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    Connection,
    Frame,
    frame,
    grpc_headers,
    grpc_message,
    rss_kib,
)

grpc = pytest.importorskip("grpc")
from torchplace.serve.grpc_server import MAX_STREAMS_PER_CONNECTION  # noqa: E402

from .test_grpc_transport import _infer_request as _request  # noqa: E402
from .test_grpc_transport import _still_serves  # noqa: E402

INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def grpc_server() -> Iterator[ServerThread]:
    with ServerThread(test_config(request_timeout_s=2.0), engine=FakeEngine()) as thread:
        yield thread


def _port(server: ServerThread) -> int:
    port = server.grpc_port
    assert port is not None
    return port


@pytest.fixture
def patient_server() -> Iterator[ServerThread]:
    """A server whose calls wait long for their message: the streams left open below must all
    still be open when the last of them arrives, however slowly a busy machine reads them."""
    with ServerThread(test_config(request_timeout_s=60.0), engine=FakeEngine()) as thread:
        yield thread


def test_streams_reset_as_they_open_cost_nothing_and_open_ones_are_bounded(
    patient_server: ServerThread,
) -> None:
    """Rapid reset: 20,000 streams opened and reset at once on one connection grew a server on
    gRPC core by 144 MB (each set up as a call). A reset stream's call is dropped at once, and
    streams that stay open are refused past ``SETTINGS_MAX_CONCURRENT_STREAMS``."""
    port = _port(patient_server)
    connection = Connection(port)
    try:
        settings = connection.read(lambda f: f.kind == SETTINGS and not f.flags & 1)
        advertised = settings[-1].settings()
        assert advertised.get(MAX_CONCURRENT_STREAMS) == MAX_STREAMS_PER_CONNECTION
        before = rss_kib()
        headers = grpc_headers(INFER)
        reset = CANCEL.to_bytes(4, "big")
        batch = bytearray()
        for stream in range(1, 40_001, 2):
            batch += frame(HEADERS, END_HEADERS, stream, headers)
            batch += frame(RST_STREAM, 0, stream, reset)
            if len(batch) > 1 << 16:
                connection.send(bytes(batch))
                batch.clear()
        # then streams that stay open (no message yet): past the bound, refused
        first_open = 40_001
        for stream in range(first_open, first_open + 2 * (MAX_STREAMS_PER_CONNECTION + 8), 2):
            batch += frame(HEADERS, END_HEADERS, stream, headers)
        connection.send(bytes(batch))
        last = first_open + 2 * (MAX_STREAMS_PER_CONNECTION + 7)  # the last stream opened
        frames = connection.read(lambda f: f.kind == RST_STREAM and f.stream == last, 10.0)
    finally:
        connection.close()
    refused = sorted(
        f.stream for f in frames if f.kind == RST_STREAM and f.error_code() == REFUSED_STREAM
    )
    assert refused, "no stream was refused past SETTINGS_MAX_CONCURRENT_STREAMS"
    assert refused[0] == first_open + 2 * MAX_STREAMS_PER_CONNECTION
    assert len(refused) == 8
    _still_serves(port)
    grown_mib = (rss_kib() - before) / 1024
    assert grown_mib < 100, f"the server grew by {grown_mib:.0f} MiB"


def _status(frames: list[Frame]) -> bytes:
    """The last header block of stream 1 (a trailers-only answer, or the trailers)."""
    blocks = [f.payload for f in frames if f.kind == HEADERS and f.stream == 1]
    assert blocks, f"no answer on the stream: {frames!r}"
    return blocks[-1]


_BODY = _request().SerializeToString()


@pytest.mark.parametrize(
    ("extra", "data", "status", "says"),
    [
        ((), grpc_message(_BODY, compressed=True), b"13",
         b"Compression bit set but no encoding configured"),
        ((("grpc-encoding", "zstd-x"),), grpc_message(_BODY, compressed=True), b"13",
         b"grpc-encoding"),
        ((("x-trace-bin", "!!not base64**"),), grpc_message(_BODY), b"13", b"x-trace-bin"),
        ((("grpc-timeout", "abcS"),), grpc_message(_BODY), b"13", b"grpc-timeout"),
        ((("grpc-timeout", "100"),), grpc_message(_BODY), b"13", b"grpc-timeout"),
        ((("grpc-timeout", "0m"),), grpc_message(_BODY), b"4", b"Deadline Exceeded"),
        ((), grpc_message(_BODY[:10], length=len(_BODY)), b"3",
         b"the call ended without a request message"),
    ],
    ids=["compressed-no-encoding", "unknown-encoding", "bin-not-base64", "timeout-malformed",
         "timeout-no-unit", "timeout-zero", "length-prefix-overstated"],
)  # fmt: skip
def test_a_call_gRPC_core_or_the_server_refuses_is_told_why_and_the_server_serves_on(
    grpc_server: ServerThread,
    extra: tuple[tuple[str, str], ...],
    data: bytes,
    status: bytes,
    says: bytes,
) -> None:
    port = _port(grpc_server)
    connection = Connection(port)
    try:
        connection.send(frame(HEADERS, END_HEADERS, 1, grpc_headers(INFER, extra)))
        connection.send(frame(DATA, END_STREAM, 1, data))
        frames = connection.read(
            lambda f: f.stream == 1 and f.kind == HEADERS and bool(f.flags & END_STREAM)
        )
    finally:
        connection.close()
    block = _status(frames)
    assert b"grpc-status" + bytes([len(status)]) + status in block
    assert says in block
    _still_serves(port)
