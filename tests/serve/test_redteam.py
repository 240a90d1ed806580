"""A red-team pass: requests real and hostile clients send that the hostile corpus did not.

Each test names what a client did and what the server must do about it; afterwards the server
still answers a normal inference correctly.
"""

from __future__ import annotations

import gzip
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch

from torchplace.errors import InputError
from torchplace.models import TensorSpec, build_model
from torchplace.serve import protocol
from torchplace.serve.running import ServerThread
from torchplace.serve.shm import SharedMemoryRegions

from .conftest import LIMIT, exchange, raw_request, seed_input

ROW = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)
GOOD = orjson.dumps({"inputs": [seed_input(data=ROW.ravel().tolist())]})


def _chunked(body: bytes, trailer: bytes) -> bytes:
    """``body`` as one chunk, then the last chunk with ``trailer`` as its trailer section."""
    return b"%x\r\n%s\r\n0\r\n%s\r\n\r\n" % (len(body), body, trailer)


def _exchange(port: int, payload: bytes) -> tuple[int, bytes]:
    """Send ``payload`` on a fresh connection; the status and body of the answer."""
    reply = exchange(port, payload)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), reply[:200]
    return int(head[9:12]), body


def _want() -> np.ndarray:
    with torch.inference_mode():
        want: np.ndarray = build_model("seed-mlp")(torch.from_numpy(ROW)).numpy()
    return want


def _assert_answered(status: int, body: bytes) -> None:
    assert status == 200, body[:300]
    got = np.array(orjson.loads(body)["outputs"][0]["data"], np.float32).reshape(1, 2)
    np.testing.assert_allclose(got, _want(), rtol=1e-5, atol=1e-6)


@pytest.fixture(autouse=True)
def _still_serving(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the server, a normal inference is still answered right."""
    yield
    if "hostile_server" in request.fixturenames:
        port = request.getfixturevalue("hostile_server").port
        _assert_answered(*_exchange(port, raw_request(GOOD)))


# -- trailer fields ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "trailer",
    [
        b"Content-Type: text/html",
        b"Host: elsewhere",
        b"Content-Encoding: gzip",
        b"Inference-Header-Content-Length: 0",
        b"Authorization: Bearer nothing",
        b"X-Checksum: abc",
    ],
)
def test_trailer_fields_do_not_change_how_a_chunked_request_is_read(
    hostile_server: ServerThread, trailer: bytes
) -> None:
    """RFC 9110, 6.5.1: trailer fields are not header fields; a Content-Type (or Host, or
    Content-Encoding...) sent after the body does not make a valid request a 415 or a 400."""
    payload = raw_request(_chunked(GOOD, trailer), headers={b"Transfer-Encoding": b"chunked"})
    _assert_answered(*_exchange(hostile_server.port, payload))


def test_trailer_fields_still_count_towards_the_head_limit(hostile_server: ServerThread) -> None:
    trailer = b"\r\n".join(b"X-Pad-%d: %s" % (i, b"x" * 1000) for i in range(80))
    payload = raw_request(_chunked(GOOD, trailer), headers={b"Transfer-Encoding": b"chunked"})
    status, body = _exchange(hostile_server.port, payload)
    assert status == 431, body
    assert b"over the limit" in body


# -- content codings --------------------------------------------------------------------------
def _gzip(body: bytes, coding: bytes = b"gzip") -> bytes:
    return raw_request(body, headers={b"Content-Encoding": coding})


def test_a_gzip_body_of_several_members_is_read_whole(hostile_server: ServerThread) -> None:
    """RFC 1952: a gzip body is a series of members (what concatenating gzip files, or a
    writer that flushes members as it streams, sends); every member is the body."""
    third = len(GOOD) // 3
    parts = (GOOD[:third], GOOD[third : 2 * third], GOOD[2 * third :])
    _assert_answered(*_exchange(hostile_server.port, _gzip(b"".join(map(gzip.compress, parts)))))


def test_x_gzip_is_read_as_gzip(hostile_server: ServerThread) -> None:
    """RFC 9110, 8.4.1.3: a recipient should take x-gzip as gzip."""
    _assert_answered(*_exchange(hostile_server.port, _gzip(gzip.compress(GOOD), b"x-gzip")))


def test_zero_padding_after_a_gzip_body_is_ignored_as_gzip_does(
    hostile_server: ServerThread,
) -> None:
    _assert_answered(*_exchange(hostile_server.port, _gzip(gzip.compress(GOOD) + bytes(16))))


@pytest.mark.parametrize(
    ("coding", "body", "words"),
    [
        (b"gzip", gzip.compress(GOOD) + b"trailing junk", b"after the end of its compressed"),
        (b"gzip", gzip.compress(GOOD)[:-8], b"ends before its compressed data does"),
        (b"gzip", gzip.compress(GOOD)[:30], b"ends before its compressed data does"),
        (b"deflate", zlib.compress(GOOD) + zlib.compress(GOOD), b"after the end of its"),
        (b"deflate", zlib.compress(GOOD)[:-4], b"ends before its compressed data does"),
    ],
    ids=["gzip trailing junk", "gzip no trailer", "gzip cut", "deflate twice", "deflate cut"],
)
def test_a_compressed_body_cut_short_or_followed_by_junk_is_a_clear_400(
    hostile_server: ServerThread, coding: bytes, body: bytes, words: bytes
) -> None:
    """Not silently read in part (a body missing its checksum trailer, or with bytes after
    its end, was taken as if it were whole)."""
    status, answer = _exchange(hostile_server.port, _gzip(body, coding))
    assert status == 400, answer
    assert words in answer, answer
    assert coding in answer


def test_raw_deflate_is_told_what_deflate_means(hostile_server: ServerThread) -> None:
    packer = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    status, answer = _exchange(
        hostile_server.port, _gzip(packer.compress(GOOD) + packer.flush(), b"deflate")
    )
    assert status == 400, answer
    assert b"zlib format" in answer


def test_a_bomb_of_many_empty_gzip_members_is_refused_quickly(hostile_server: ServerThread) -> None:
    """An empty member is 20 bytes: a body of thousands of them is refused by count, not
    inflated one by one on the event loop."""
    bomb = gzip.compress(b"") * (LIMIT // 24)
    began = time.monotonic()
    status, answer = _exchange(hostile_server.port, _gzip(bomb))
    assert time.monotonic() - began < 2.0
    assert status == 400, answer
    assert b"members" in answer


# -- shared memory ----------------------------------------------------------------------------
def test_a_shared_memory_input_of_the_wrong_size_is_refused_before_it_is_read(
    tmp_path: Path,
) -> None:
    """An input whose ``shared_memory_byte_size`` does not match its shape is refused without
    reading the region: the server copied all of it first (a 512 MB region, 512 MB of memory
    per such request)."""
    size = 64 << 20
    with (tmp_path / "big").open("wb") as handle:
        handle.truncate(size)  # sparse: costs no memory or disk until read
    regions = SharedMemoryRegions(allowed=True, root=tmp_path)
    regions.register("big", "/big", 0, size)
    entry = seed_input(data=None, parameters={"shared_memory_region": "big",
                                             "shared_memory_byte_size": size})  # fmt: skip
    spec = TensorSpec("input", "FP32", (-1, 8))
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=r"Expected 32, got 67108864"):
            protocol.decode_infer_request(
                orjson.dumps({"inputs": [entry]}),
                inputs=(spec,),
                outputs=(TensorSpec("output", "FP32", (-1, 2)),),
                max_rows=8,
                regions=regions,
            )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        regions.unregister()
    assert peak < 1 << 20, peak


# -- routes -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path"),
    [
        (b"POST", b"/v2/models/seed-mlp/versions//infer"),
        (b"GET", b"/v2/models/seed-mlp/versions/"),
        (b"GET", b"/v2/models/seed-mlp/versions//ready"),
    ],
)
def test_an_empty_version_is_not_the_default_one(
    hostile_server: ServerThread, method: bytes, path: bytes
) -> None:
    """``/versions//infer`` names no version: a 404 that says so, not the latest version's
    answer (the client meant some version and built its path wrong)."""
    status, answer = _exchange(hostile_server.port, raw_request(GOOD, path=path, method=method))
    assert status == 404, answer
    assert b"version" in answer


# -- JSON amplification -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "item", [0.5, 0, "", {}, []], ids=["floats", "ints", "strings", "objects", "arrays"]
)
def test_data_with_far_more_entries_than_the_shape_is_refused_before_numpy_reads_it(
    monkeypatch: pytest.MonkeyPatch, item: object
) -> None:
    """A body of millions of entries for a shape of 8 values: numpy turned them all into an
    array (seconds of the event loop, and gigabytes, for a 60 MB body) before the count was
    compared; the count of entries alone already tells."""
    converted: list[int] = []
    real_array = np.array

    def spy(data: Any, *args: Any, **kwargs: Any) -> Any:
        converted.append(len(data) if isinstance(data, list) else 0)
        return real_array(data, *args, **kwargs)

    monkeypatch.setattr(np, "array", spy)
    body = orjson.dumps({"inputs": [seed_input(data=[item] * 100_000)]})
    spec = TensorSpec("input", "FP32", (-1, 8))
    with pytest.raises(InputError, match=r"shape \[1, 8\] needs 8 values but 'data' holds 100000"):
        protocol.decode_infer_request(
            body, inputs=(spec,), outputs=(TensorSpec("output", "FP32", (-1, 2)),), max_rows=8
        )
    assert max(converted, default=0) < 1000


# -- outputs JSON cannot carry ----------------------------------------------------------------
def _overflowing_row() -> list[float]:
    """FP32 inputs in range whose first hidden unit's exact value is past FP32's largest: each
    input at the limit, with the sign of its weight on that unit (the weights' magnitudes sum
    above 1), so the model overflows whatever order the sums are taken in."""
    weight = build_model("seed-mlp")[0].weight.detach()
    unit = int(weight.abs().sum(dim=1).argmax())
    assert float(weight[unit].abs().sum()) > 1.01
    return [3.4e38 if w >= 0 else -3.4e38 for w in weight[unit].tolist()]


_ROW = _overflowing_row()
_HUGE = orjson.dumps({"inputs": [seed_input(data=_ROW)]})  # in range; the model overflows


def test_outputs_json_cannot_carry_are_a_400_that_says_to_ask_for_binary(
    hostile_server: ServerThread,
) -> None:
    """Valid FP32 inputs that the model takes to infinity: a JSON answer cannot carry the
    result, which only the client can change (ask for binary data, or send other values), so
    it is told with a 4xx, not a 500 (a 500 says the server failed)."""
    status, body = _exchange(hostile_server.port, raw_request(_HUGE))
    assert status == 400, body
    assert b'\\"binary_data\\": true' in body
    v1 = orjson.dumps({"instances": [_ROW]})
    status, body = _exchange(
        hostile_server.port, raw_request(v1, path=b"/v1/models/seed-mlp:predict")
    )
    assert status == 400, body
    binary = orjson.loads(_HUGE) | {"parameters": {"binary_data_output": True}}
    status, body = _exchange(hostile_server.port, raw_request(orjson.dumps(binary)))
    assert status == 200, body
