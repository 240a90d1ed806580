"""An eighth red-team pass: what a few refusals told clients that was not so (a request framed
both by Content-Length and Transfer-Encoding was told how to write a Content-Length; a deadline
past 63 bits was told to be a non-negative integer, which it was; an integer just below
INT64's range was told to write a value it did not send; a whole float among integers was named
by the first integer).

Tried this round and found to behave as designed (not repeated here): pipelines that mix
answers with errors and a ``Connection: close`` part-way, ``Expect: 100-continue`` on refused
requests, HEAD and OPTIONS on every route, repeated and conflicting headers, model loads,
unloads and reloads racing inferences with deadlines, clients that go away mid-batch (metrics
and statistics still add up), a drain while requests are split across batches, gRPC
compression, metadata and deadlines, and NaN, infinities, -0.0, subnormals and 64-bit extremes
of every datatype against the model run in process.

Each test states what a client sent and what the server must answer; afterwards the shared
server still answers a normal inference correctly.
"""

from __future__ import annotations

import socket
import time

import numpy as np
import orjson
import pytest

from torchplace.errors import InputError
from torchplace.models import TensorSpec
from torchplace.serve.protocol import decode_infer_request
from torchplace.serve.running import ServerThread

from .conftest import FakeEngine, StartServer, answer_of, seed_input

pytestmark = pytest.mark.usefixtures("still_serving")

_GOOD = orjson.dumps({"inputs": [seed_input()]})


@pytest.mark.parametrize(
    "fields",
    [
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
    ],
)
def test_a_body_framed_two_ways_is_told_to_send_one(
    hostile_server: ServerThread, fields: bytes
) -> None:
    """A request with both Content-Length and Transfer-Encoding (request smuggling's framing)
    was refused 400 with the hint for a malformed Content-Length ("decimal digits only, one
    value"), though its Content-Length was well formed: now it is told to send one framing."""
    body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(_GOOD), _GOOD)
    payload = (
        b"POST /v2/models/seed-mlp/infer HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\n%s\r\n%s" % (fields, body)
    )
    status, answer = answer_of(hostile_server.port, payload)
    assert status == 400, answer
    message = orjson.loads(answer)["error"]
    assert "can't be present with" in message  # the parser's words first
    assert "a Content-Length, not both" in message
    assert "decimal digits" not in message


@pytest.mark.parametrize(("key", "bound"), [("timeout", 63), ("priority", 64)])
def test_a_schedule_parameter_past_its_bits_is_told_its_bound(
    hostile_server: ServerThread, key: str, bound: int
) -> None:
    """``"timeout": 18446744073709551615`` (a uint64, as a client that sends unsigned
    microseconds writes "no deadline") was told "must be a non-negative integer": it is one.
    The answer now says the bound, as the Inference-Timeout-Us header's answer does."""
    value = 2**bound
    body = orjson.dumps({"inputs": [seed_input()], "parameters": {key: 1}}).replace(
        b'"%s":1' % key.encode(), b'"%s":%d' % (key.encode(), value)
    )
    status, answer = answer_of(
        hostile_server.port,
        b"POST /v2/models/seed-mlp/infer HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
    )
    assert status == 400, answer
    assert f"below 2**{bound}" in orjson.loads(answer)["error"]


def test_a_grpc_timeout_past_63_bits_is_told_its_bound() -> None:
    """The same over gRPC: a ``uint64_param`` timeout of 2**64 - 1."""
    pytest.importorskip("google.protobuf")
    from torchplace.serve import grpc_codec
    from torchplace.serve.proto import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 2]).contents.fp32_contents.extend(
        [1.0, 2.0]
    )
    request.parameters["timeout"].uint64_param = 2**64 - 1
    with pytest.raises(InputError, match=r"'timeout' must be a non-negative integer below 2\*\*63"):
        grpc_codec.decode_infer_request(
            request,
            inputs=(TensorSpec("x", "FP32", (-1, 2)),),
            outputs=(TensorSpec("y", "FP32", (-1, 2)),),
            max_rows=8,
        )


def _decode_int64(value: bytes) -> None:
    body = b'{"inputs":[{"name":"x","datatype":"INT64","shape":[1,3],"data":[1,%s,2]}]}' % value
    decode_infer_request(
        body,
        inputs=(TensorSpec("x", "INT64", (-1, 3)),),
        outputs=(TensorSpec("y", "FP32", (-1, 3)),),
        max_rows=8,
    )


def test_an_integer_just_below_int64_s_range_is_not_told_to_write_another_value() -> None:
    """-9223372036854775809 (one below INT64's range, written as a JSON integer) parses as the
    float -2**63, and was told "'data' holds numbers written as floats ...; write them as JSON
    integers (-9223372036854775808)": a value the client did not send, as the fix. Now the
    answer says that an integer below the range reads as that float."""
    with pytest.raises(InputError) as err:
        _decode_int64(b"-9223372036854775809")
    message = str(err.value)
    assert "an integer below INT64's range" in message
    assert "write them as JSON integers" not in message
    _decode_int64(b"-9223372036854775808")  # the bound itself is served


@pytest.mark.parametrize("data", [b"1,5.0,2", b"[1],[5.0],[2]"])
def test_a_whole_float_among_integers_is_the_value_named(data: bytes) -> None:
    """``[1, 5.0, 2]`` for an INT64 input was told "numbers written as floats (such as 1.0)
    ...; write them as JSON integers (1)": 1 was written as an integer; 5.0 was not."""
    shape = b"[1,3]" if not data.startswith(b"[") else b"[3,1]"
    body = b'{"inputs":[{"name":"x","datatype":"INT64","shape":%s,"data":[%s]}]}' % (shape, data)
    spec = TensorSpec("x", "INT64", (-1, 3) if shape == b"[1,3]" else (-1, 1))
    with pytest.raises(InputError, match=r"such as 5\.0\), not INT64 integers.*\(5\)"):
        decode_infer_request(
            body, inputs=(spec,), outputs=(TensorSpec("y", "FP32", (-1, 1)),), max_rows=8
        )


def test_a_request_waiting_for_its_100_behind_a_pipelined_one_is_timed_from_the_100(
    start_server: StartServer,
) -> None:
    """A client pipelined a request behind one that took 2 s, the second with
    ``Expect: 100-continue``, and sent its body once the 100 came (as it must wait to). The
    408 clock had run from its headers, so a body that took 2.5 s to send after the 100 was
    refused 408 ("not received within 3 s") though it had been sending for less than that.
    """
    server = start_server(FakeEngine(delay_s=2.0), request_timeout_s=3.0)
    first = (
        b"POST /v2/models/seed-mlp/infer HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(_GOOD), _GOOD)
    )
    second = (
        b"POST /v2/models/seed-mlp/infer HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
        b"Content-Length: %d\r\n\r\n" % len(_GOOD)
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(first + second)
        got = b""
        while b"100 Continue" not in got:  # after the first answer
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk
        assert got.startswith(b"HTTP/1.1 200 "), got[:200]
        half = len(_GOOD) // 2
        sock.sendall(_GOOD[:half])
        time.sleep(2.5)  # past a tick of the server's clock: 4.5 s after its headers came
        sock.sendall(_GOOD[half:])
        rest = b""
        while chunk := sock.recv(65536):
            rest += chunk
    assert rest.startswith(b"HTTP/1.1 200 "), rest[:300]


def test_still_serving_after_all_of_the_above(hostile_server: ServerThread) -> None:
    status, answer = answer_of(
        hostile_server.port,
        b"POST /v2/models/seed-mlp/infer HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(_GOOD), _GOOD),
    )
    assert status == 200, answer
    assert np.asarray(orjson.loads(answer)["outputs"][0]["data"]).shape == (2,)
