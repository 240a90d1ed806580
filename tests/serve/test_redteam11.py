"""An eleventh red-team pass: bytes the HTTP parser takes without telling (a header field that
never ends, whitespace before a value, empty lines before a request line, chunk extensions and
leading zeros of a chunk size), a binary request whose JSON length is a few bytes off, and
compressed bodies on the routes other than inference.

Tried this round and found to behave as designed (not repeated here): obs-fold, bare LF and
bare CR line ends, a Content-Length given twice (the same value, or ``5, 5``), ``+5`` and
past 64 bits, chunk extensions of a normal size, ``Transfer-Encoding: Chunked`` (read) and
``identity, chunked`` (501), a space or a vertical tab around a field name, absolute-form
targets of any scheme, ``..`` and ``%2e%2e`` as a model name, invalid percent escapes, ``%00``,
``//v2/...``, CONNECT, TRACE, HTTP/2's preface, an unknown ``Expect``, V1 ``:predict`` spelt
``%3Apredict`` (decoded as Starlette decodes it), versions ``%31``, ``01``, ``+1``, ``1.0``;
the binary extension's raw form (``Inference-Header-Content-Length: 0``, short or empty),
``application/octet-stream``, a gzip binary request, compressed binary and classification
answers, a negative ``binary_data_size``, a header length past the body or given twice;
``Accept-Encoding`` with ``q=0``, ``*`` and ``identity;q=0``; the repository extension with
``..``, ``%2F``, ``\\``, ``~`` and ``%00`` in a model name; over gRPC, ``timeout`` and
``priority`` of every parameter kind and absurd values (the same answers as over REST),
``triton_enable_empty_final_response`` (taken, as Triton's gRPC endpoint takes it), long
parameter names and odd metadata; loads and unloads of a model under three inferring clients
and a metrics scraper (every request answered 200 or 404 "no available versions", counters
never went down, every metrics line well formed).

What is pinned here:

- the parser (httptools) gathers a header field that has not ended in memory and tells it
  only once it ends, and skips whitespace before a value, empty lines before a request line,
  chunk extensions and a size's leading zeros without telling at all: a client could send any
  of them without end (gigabytes, at loopback speed, until ``--request-timeout``), the header
  field growing in memory and copied whole at every read. They are now counted as they
  arrive: a head past 64 KiB (and a little slack for its whitespace) is 431, empty lines past
  64 KiB are 400, and a chunked body's framing past 16 KiB of extensions (Node.js's bound
  since CVE-2024-22019), 64 KiB of trailer fields and 24 bytes a chunk is 413;
- an ``Inference-Header-Content-Length`` one byte short of the JSON, or one byte past it,
  was told only orjson's words (``unexpected end of data``, ``unexpected content after
  document``): it is now told the length it gave and which way it is off; a
  ``binary_data_size`` of ``32.0`` was told "Expected 32, got 32.0", now that it must be an
  integer;
- a repository (index, load, unload) or shared-memory registration body sent with
  ``Content-Encoding: gzip`` was read compressed, and told it was not UTF-8: every route
  now reads a body as inference does (an unknown coding is 415 there too).
"""

from __future__ import annotations

import contextlib
import gzip
import select
import socket
import time
import uuid
from collections.abc import Iterator

import numpy as np
import orjson
import pytest

from torchplace.errors import InputError
from torchplace.models import TensorSpec
from torchplace.serve.protocol import decode_infer_request
from torchplace.serve.running import ServerThread

from .conftest import FakeEngine, answer_of, raw_request, seed_input, test_config

pytestmark = pytest.mark.usefixtures("still_serving")

_GOOD = orjson.dumps({"inputs": [seed_input()]})
_CHUNKED = (
    b"POST /v2/models/seed-mlp/infer HTTP/1.1\r\nHost: localhost\r\n"
    b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
)
#: what a flooding client sends at most: before the fix the server read all of it
_FLOOD_BYTES = 16 << 20


def _flood(port: int, prefix: bytes, filler: bytes) -> tuple[bytes, int]:
    """Send ``prefix`` then ``filler`` over and over (up to :data:`_FLOOD_BYTES`) until the
    server answers; its answer (empty if none came within 10 s) and the bytes sent."""
    block = filler * (65536 // len(filler))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(prefix)
        sock.setblocking(False)
        sent, answer, deadline = 0, b"", time.monotonic() + 10
        while time.monotonic() < deadline:
            can_read, can_write, _ = select.select(
                [sock], [sock] if sent < _FLOOD_BYTES else [], [], 1
            )
            if can_read:
                with contextlib.suppress(ConnectionResetError):
                    answer = sock.recv(65536)
                break
            if can_write:
                try:
                    sent += sock.send(block)
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    break
    return answer, sent


def _status_and_error(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), answer[:200]
    status = int(head[9:12])
    return status, orjson.loads(body)["error"] if body.startswith(b"{") else ""


# -- bytes the parser takes without telling ------------------------------------------------------
@pytest.mark.parametrize(
    ("prefix", "filler"),
    [
        (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Pad: ", b"a"),  # a value never ending
        (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Pad:", b" "),  # whitespace before it
        (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Pad: a", b"\t"),  # and after it
        (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-", b"p"),  # a name never ending
        (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nContent-Length: 0", b"0"),
    ],
    ids=["value", "space-before", "tab-after", "name", "length-zeros"],
)
def test_a_header_field_that_never_ends_is_431_as_it_arrives(
    hostile_server: ServerThread, prefix: bytes, filler: bytes
) -> None:
    """Before: nothing was counted until the field ended (the value grew in the parser's
    memory, copied at every read) and the client was told 408 after --request-timeout."""
    answer, sent = _flood(hostile_server.port, prefix, filler)
    status, message = _status_and_error(answer)
    assert status == 431, answer[:300]
    assert "over the limit of 65536 bytes" in message
    assert sent < _FLOOD_BYTES


def test_empty_lines_without_end_are_400_not_read_for_the_keep_alive_timeout(
    hostile_server: ServerThread,
) -> None:
    answer, sent = _flood(hostile_server.port, b"", b"\r\n")
    status, message = _status_and_error(answer)
    assert status == 400, answer[:300]
    assert message.startswith("over 65536 bytes of empty lines and no request line; send a")
    assert sent < _FLOOD_BYTES


@pytest.mark.parametrize(
    ("prefix", "filler"),
    [
        (b"1;", b"e"),  # an extension name without end
        (b"1;e=", b"v"),  # its value
        (b'1;e="', b"v"),  # a quoted value
        (b"", b"0"),  # the leading zeros of a size
    ],
    ids=["name", "value", "quoted", "zeros"],
)
def test_chunk_framing_without_end_is_413(
    hostile_server: ServerThread, prefix: bytes, filler: bytes
) -> None:
    """Node.js's CVE-2024-22019: chunk extensions read without a bound; here, too, and a
    size's leading zeros (the body limit never neared: they are not body bytes)."""
    answer, sent = _flood(hostile_server.port, _CHUNKED + prefix, filler)
    status, message = _status_and_error(answer)
    assert status == 413, answer[:300]
    assert message.startswith("the chunked body's framing (chunk size lines, chunk extensions")
    assert "send chunk extensions of at most 16384 bytes in all, or none" in message
    assert sent < _FLOOD_BYTES


def test_a_body_of_one_byte_chunks_and_long_heads_are_still_read(
    hostile_server: ServerThread,
) -> None:
    """The bounds leave real clients alone: a body sent a byte a chunk (six bytes of framing a
    byte, over several reads), with an extension on every chunk; a head of 60 KiB sent a few
    bytes at a time; empty lines before a request."""
    body = _GOOD + b" " * (60_000 - len(_GOOD))  # JSON whitespace: under the 64 KiB limit
    chunks = b"".join(b"1;k=v\r\n%c\r\n" % byte for byte in body) + b"0\r\nX-T: 1\r\n\r\n"
    status, answer = answer_of(
        hostile_server.port,
        _CHUNKED.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + chunks,
    )
    assert status == 200, answer[:300]
    head = raw_request(_GOOD, headers={b"X-Pad": b"p" * 60_000})
    with socket.create_connection(("127.0.0.1", hostile_server.port), timeout=10) as sock:
        sock.sendall(b"\r\n" * 1000)
        for start in range(0, len(head), 4096):  # a head over many reads
            sock.sendall(head[start : start + 4096])
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200 "), reply[:300]


# -- the binary tensor extension: the JSON's length a few bytes off ------------------------------
_SPEC = (TensorSpec("input", "FP32", (-1, 8)),)
_OUT = (TensorSpec("output", "FP32", (-1, 2)),)
_RAW = np.full((1, 8), 0.5, np.float32).tobytes()


def _binary_error(header: dict[str, object], header_length: int | None = None) -> str:
    json_part = orjson.dumps(header)
    length = len(json_part) if header_length is None else header_length
    with pytest.raises(InputError) as caught:
        decode_infer_request(
            json_part + _RAW, inputs=_SPEC, outputs=_OUT, max_rows=8, header_length=length
        )
    return str(caught.value)


def _binary_header(size: object = 32) -> dict[str, object]:
    entry = {"name": "input", "datatype": "FP32", "shape": [1, 8]}
    return {"inputs": [{**entry, "parameters": {"binary_data_size": size}}]}


def test_a_json_length_one_byte_short_is_told_it_cuts_the_json_short() -> None:
    length = len(orjson.dumps(_binary_header())) - 1
    message = _binary_error(_binary_header(), length)
    assert message.startswith("request body is not valid JSON: unexpected end of data")
    assert f"Inference-Header-Content-Length {length} cuts the JSON header short" in message
    assert "give the JSON header's exact length in bytes" in message


@pytest.mark.parametrize("extra", [1, 32])
def test_a_json_length_past_the_json_is_told_where_the_json_ends(extra: int) -> None:
    json_length = len(orjson.dumps(_binary_header()))
    message = _binary_error(_binary_header(), json_length + extra)
    assert message.startswith("request body is not valid JSON: unexpected content after")
    assert (
        f"Inference-Header-Content-Length {json_length + extra} is longer than the JSON header "
        f"(something follows it at byte {json_length})"
    ) in message


@pytest.mark.parametrize("size", [32.0, "32", True])
def test_a_binary_data_size_that_is_not_an_integer_is_told_to_be_one(size: object) -> None:
    message = _binary_error(_binary_header(size))
    assert message.startswith("input byte size mismatch for input 'input'. Expected 32, got ")
    assert "is not an integer; give the byte count as an integer" in message
    assert "takes 32 bytes" in message


def test_a_binary_request_whose_lengths_match_still_decodes() -> None:
    json_part = orjson.dumps(_binary_header())
    decoded = decode_infer_request(
        json_part + _RAW, inputs=_SPEC, outputs=_OUT, max_rows=8, header_length=len(json_part)
    )
    np.testing.assert_array_equal(decoded.inputs["input"], np.full((1, 8), 0.5, np.float32))


# -- compressed bodies on every route ------------------------------------------------------------
def _post(port: int, path: bytes, body: bytes, coding: bytes) -> tuple[int, bytes]:
    headers = {b"Content-Encoding": coding}
    return answer_of(port, raw_request(body, path=path, headers=headers))


def test_a_gzip_repository_index_body_is_read_as_json(hostile_server: ServerThread) -> None:
    index = b"/v2/repository/index"
    status, answer = _post(hostile_server.port, index, gzip.compress(b'{"ready": true}'), b"gzip")
    assert status == 200, answer
    assert {entry["name"] for entry in orjson.loads(answer)} == {"seed-mlp"}
    status, answer = _post(hostile_server.port, index, gzip.compress(b'{"ready": 3}'), b"gzip")
    assert (status, orjson.loads(answer)["error"]) == (
        400,
        "Invalid value for 'ready': expected a boolean, got 3",
    )
    status, answer = _post(hostile_server.port, index, b'{"ready": true}', b"br")
    assert status == 415, answer
    assert orjson.loads(answer)["error"].startswith("content encoding 'br' is not supported")


@pytest.fixture(scope="module")
def shm_server() -> Iterator[ServerThread]:
    engine = FakeEngine()
    with ServerThread(test_config(allow_client_shm=True), engine=engine) as thread:  # type: ignore[arg-type]
        yield thread


def test_a_gzip_shared_memory_registration_registers(shm_server: ServerThread) -> None:
    shm = pytest.importorskip("tritonclient.utils.shared_memory")
    key = f"/tp_rt11_{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region("rt11", key, 64)
    try:
        body = gzip.compress(orjson.dumps({"key": key, "offset": 0, "byte_size": 64}))
        path = b"/v2/systemsharedmemory/region/rt11/register"
        status, answer = _post(shm_server.port, path, body, b"gzip")
        assert status == 200, answer
        request = raw_request(b"", method=b"GET", path=b"/v2/systemsharedmemory/status")
        status, answer = answer_of(shm_server.port, request)
        assert [r["key"] for r in orjson.loads(answer)] == [key]
        path = b"/v2/systemsharedmemory/unregister"
        assert answer_of(shm_server.port, raw_request(b"", path=path))[0] == 200
    finally:
        shm.destroy_shared_memory_region(handle)
