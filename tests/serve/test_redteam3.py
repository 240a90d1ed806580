"""A third red-team pass over REST: header values with the optional whitespace RFC 9110 allows
around them, HTTP/1.0 persistence, chunk size lines split across reads, absolute-form targets,
and what a load request's inline configuration can make the server allocate.

Each test states what a client sent and what the server must do; afterwards the shared server
still answers a normal inference correctly.
"""

from __future__ import annotations

import gzip
import math
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.serve.datatypes import HOST_DTYPES
from torchplace.serve.running import ServerThread

from .conftest import LIMIT, exchange, raw_request, seed_input
from .repository_helpers import explicit_repository, infer_body

_GOOD = orjson.dumps({"inputs": [seed_input()]})
_ROW = np.full(8, 0.5, "<f4").tobytes()
_BINARY_HEADER = orjson.dumps(
    {"inputs": [seed_input(data=None, parameters={"binary_data_size": len(_ROW)})]}
)


def _answer(port: int, payload: bytes) -> tuple[int, bytes, bytes]:
    """The status, head and body of the one answer to ``payload`` (a fresh connection)."""
    reply = exchange(port, payload)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), reply[:200]
    return int(head[9:12]), head, body


def _served(status: int, body: bytes) -> None:
    assert status == 200, body[:300]
    assert orjson.loads(body)["outputs"][0]["shape"] == [1, 2]


def _read_within(sock: socket.socket, seconds: float) -> bytes:
    """What the server sends on ``sock`` within ``seconds`` (until it closes)."""
    sock.settimeout(0.1)
    got = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        got.append(chunk)
    return b"".join(got)


@pytest.fixture(autouse=True)
def _still_serving(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the shared server, a normal inference is still answered."""
    yield
    if "hostile_server" in request.fixturenames:
        port = request.getfixturevalue("hostile_server").port
        status, _, body = _answer(port, raw_request(_GOOD))
        _served(status, body)


# -- optional whitespace after a field value (RFC 9110 5.5: not part of the value) ----------
def test_a_content_length_with_trailing_whitespace_over_the_limit_is_413_at_once(
    hostile_server: ServerThread,
) -> None:
    """``Content-Length: 1000000 `` (a space after the number, which the field's grammar
    allows: OWS around a field value is not part of it). The parser takes the length, but
    the server's own check (``length.isdigit()`` on the raw value) did not: no 413 before the
    body (the client waited for nothing until the request timeout), and a large body so
    declared was not counted against the server's body budget either."""
    with socket.create_connection(("127.0.0.1", hostile_server.port), timeout=5) as sock:
        declared = str(LIMIT * 16).encode() + b" "
        sock.sendall(raw_request(b"", headers={b"Content-Length": declared}))
        reply = _read_within(sock, 2.0)
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:300] or "no answer within 2 s"
    assert b"exceeds the maximum allowed input size" in reply


@pytest.mark.parametrize(
    ("name", "value", "body", "extra"),
    [
        ("content-encoding", b"gzip ", gzip.compress(_GOOD), {}),
        ("content-encoding", b"gzip\t", gzip.compress(_GOOD), {}),
        (
            "inference-header-content-length",
            str(len(_BINARY_HEADER)).encode() + b" ",
            _BINARY_HEADER + _ROW,
            {b"Content-Type": b"application/octet-stream"},
        ),
        ("inference-timeout-us", b"5000000 ", _GOOD, {}),
    ],
    ids=["content-encoding-space", "content-encoding-tab", "header-length-space", "timeout-space"],
)
def test_a_field_value_with_trailing_whitespace_means_the_value_without_it(
    hostile_server: ServerThread, name: str, value: bytes, body: bytes, extra: dict[bytes, bytes]
) -> None:
    """The parser strips the whitespace before a value but keeps the whitespace after it, and
    the server compared the raw value: ``Content-Encoding: gzip `` was 415 (``'gzip ' is not
    supported``), ``Inference-Header-Content-Length: 108 `` and ``Inference-Timeout-Us:
    5000000 `` were 400 (not a number). RFC 9110 5.5: a field value does not include leading
    or trailing whitespace; a proxy or client library that pads a value is conformant."""
    headers = {name.encode(): value, **extra}
    status, _, answer = _answer(hostile_server.port, raw_request(body, headers=headers))
    _served(status, answer)


def test_expect_100_continue_with_trailing_whitespace_still_gets_its_100(
    hostile_server: ServerThread,
) -> None:
    """``Expect: 100-continue `` (a trailing space): the server compared the raw value, so no
    100 came and a client that waits for it (as curl does, for a second) stalled before
    sending its body."""
    with socket.create_connection(("127.0.0.1", hostile_server.port), timeout=5) as sock:
        headers = {b"Expect": b"100-continue ", b"Content-Length": str(len(_GOOD)).encode()}
        sock.sendall(raw_request(b"", headers=headers))
        interim = _read_within(sock, 1.5)
        assert interim.startswith(b"HTTP/1.1 100 "), interim[:200] or "no 100 within 1.5 s"
        sock.sendall(_GOOD)
        reply = interim + _read_within(sock, 3.0)
    final = reply[reply.index(b"\r\n\r\n") + 4 :]
    head, _, body = final.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), final[:300]
    _served(200, body)


# -- HTTP/1.0 persistence -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "connection", [b"keep-alive ", b"close-later, keep-alive", b"Keep-Alive, TE"]
)
def test_an_http_1_0_connection_kept_open_is_said_to_be_kept(
    hostile_server: ServerThread, connection: bytes
) -> None:
    """An HTTP/1.0 request whose ``Connection`` field holds the ``keep-alive`` option among
    others, or with whitespace after it. The parser reads the option and the server kept the
    connection open, but its answer said ``Connection: keep-alive`` only when the raw value was
    exactly ``keep-alive``: the answer then told an HTTP/1.0 client that the connection closes
    (RFC 9112 9.3: without the option in the response it does not persist), while the server
    held it open until the keep-alive timeout. The answer must say keep-alive, or the server
    must close the connection after it."""
    request = b"GET /v2/health/live HTTP/1.0\r\nConnection: " + connection + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", hostile_server.port), timeout=5) as sock:
        sock.sendall(request)
        started = time.monotonic()
        reply = _read_within(sock, 2.5)
        waited = time.monotonic() - started
        head = reply.partition(b"\r\n\r\n")[0]
        assert head.startswith(b"HTTP/1.1 200 "), reply[:300]
        if b"\r\nconnection: keep-alive" in head.lower():
            sock.sendall(request)  # said to be kept: it is, and answers the next request
            again = _read_within(sock, 2.0)
            assert again.startswith(b"HTTP/1.1 200 "), again[:300]
            return
    assert waited < 2.0, (
        f"the answer did not say keep-alive, yet the server kept the connection open "
        f"(Connection: {connection!r}): {reply[:300]!r}"
    )


# -- chunk size lines ---------------------------------------------------------------------------
def test_a_long_chunk_size_line_split_across_reads_is_still_checked_against_the_limit(
    hostile_server: ServerThread,
) -> None:
    """A chunk size line of 70 zeros and then ``10000000`` (a 256 MiB chunk, far over the body
    limit), sent in pieces. The size is read from what the server keeps of the line, and it
    kept only the line's first 64 bytes across reads: the digits that came later were lost,
    the chunk read as size 0, and instead of the promised 413 at once the client was left
    waiting until the request timeout."""
    with socket.create_connection(("127.0.0.1", hostile_server.port), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(raw_request(b"", headers={b"Transfer-Encoding": b"chunked"}))
        for piece in (b"5\r\nhello\r\n", b"0" * 70, b"1", b"0000000\r\n" + b"x" * 100):
            time.sleep(0.05)  # each piece its own read on the server
            sock.sendall(piece)
        reply = _read_within(sock, 2.0)
    assert reply.startswith(b"HTTP/1.1 413 "), reply[:300] or "no answer within 2 s"
    # only the announced size can have told: the 100 bytes sent are far under the limit
    assert b"limit of 65536 bytes (--max-body-bytes)" in reply


# -- absolute-form targets ----------------------------------------------------------------------
@pytest.mark.parametrize("scheme", [b"HTTP", b"Http", b"HTTPS"])
def test_an_absolute_form_target_is_routed_whatever_the_case_of_its_scheme(
    hostile_server: ServerThread, scheme: bytes
) -> None:
    """``POST HTTP://localhost/v2/models/seed-mlp/infer``: a URI's scheme is case-insensitive
    (RFC 3986 3.1, RFC 9110 4.2.3) and the absolute form is routed by its path, but only the
    lower-case schemes were recognised: 404 ``no route HTTP://localhost/v2/...``."""
    target = scheme + b"://localhost/v2/models/seed-mlp/infer"
    status, _, body = _answer(hostile_server.port, raw_request(_GOOD, path=target))
    _served(status, body)


# -- what a load request's inline configuration can make the server allocate ------------------
_GIB = 1 << 30


@pytest.fixture
def repository_server(tmp_path: Path) -> Iterator[ServerThread]:
    with ServerThread(explicit_repository(tmp_path)) as thread:
        yield thread


def test_an_inline_config_cannot_make_a_load_allocate_gigabytes_for_its_dry_run(
    repository_server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load request's inline config (Triton's ``max_batch_size`` and ``input`` dims, as
    ``tritonclient``'s ``load_model(config=...)`` sends them) sets the batch the replica
    stages and dry-runs at start: ``max_batch_size`` up to 1,048,576 times a row of any size.
    One request with ``max_batch_size: 1048576`` and 2,000 FP32 values a row made the server
    stage and dry-run an 8 GiB batch (its peak memory went from 0.9 to 8.3 GB; a few thousand
    more values a row and the process is killed for memory), though the load then failed
    anyway. The inline ``replicas`` are capped for the same reason (each a copy of the model);
    the batch an inline config asks the server to hold must be bounded too, and refused (400,
    saying so) before anything is allocated.

    Here the staging of a batch over 1 GiB is intercepted (and refused with MemoryError, so
    the test itself allocates nothing): it must never be asked for."""
    from torchplace.serve import replica
    from torchplace.serve.staging import StagingBuffers

    real = StagingBuffers
    asked: list[int] = []

    def guarded(inputs: Any, max_rows: int, **kwargs: Any) -> Any:
        size = sum(
            max_rows * math.prod(max(d, 1) for d in s.shape[1:]) * HOST_DTYPES[s.datatype].itemsize
            for s in inputs
        )
        if size > _GIB:
            asked.append(size)
            raise MemoryError(f"test: a {size}-byte staging buffer was asked for")
        return real(inputs, max_rows, **kwargs)

    monkeypatch.setattr(replica, "StagingBuffers", guarded)
    config = orjson.dumps(
        {
            "max_batch_size": 1048576,
            "input": [{"name": "input", "data_type": "TYPE_FP32", "dims": [2000]}],
        }
    ).decode()
    body = orjson.dumps({"parameters": {"config": config}})
    status, _, answer = _answer(
        repository_server.port,
        raw_request(body, path=b"/v2/repository/models/b/load"),
    )
    assert not asked, (
        f"the load staged a batch of {asked[0] / _GIB:.1f} GiB for its dry run "
        f"(answered {status}: {answer[:200]!r})"
    )
    assert status == 400, answer
    # the other model is untouched and still serves
    status, _, answer = _answer(
        repository_server.port,
        raw_request(orjson.dumps(infer_body()), path=b"/v2/models/a/infer"),
    )
    assert status == 200, answer
