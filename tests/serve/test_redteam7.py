"""A seventh red-team pass: gRPC calls and streams held open by the thousand over one
connection, and HTTP requests the parser refuses, which were told in the parser's words only.

Each test states what a client sent and what the server must answer; afterwards the shared
server still answers a normal inference correctly.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.serve.running import ServerThread

from .conftest import FakeEngine, answer_of, raw_request, seed_input, test_config

_GOOD = orjson.dumps({"inputs": [seed_input()]})
_SERVICE = "/inference.GRPCInferenceService/"

pytestmark = pytest.mark.usefixtures("still_serving")


# -- gRPC: calls that wait on their clients are bounded in number ------------------------------
def _infer(model: str = "seed-mlp", request_id: str = "") -> bytes:
    from torchplace.serve.proto import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="input", datatype="FP32", shape=[1, 8])
    request.raw_input_contents.append(np.full((1, 8), 0.5, np.float32).tobytes())
    data: bytes = request.SerializeToString()
    return data


async def _outcome(call: Any) -> str:
    """How a stream or call the client left open ended: its status code's name, or 'open'."""
    grpc = pytest.importorskip("grpc")
    if not hasattr(call, "read"):  # a call with one answer: ended or not, without waiting
        return str((await call.code()).name) if call.done() else "open"
    try:
        async with asyncio.timeout(0.5):
            while await call.read() is not grpc.aio.EOF:
                pass
            return str((await call.code()).name)
    except TimeoutError:
        return "open"
    except grpc.aio.AioRpcError as exc:
        return str(exc.code().name)


async def _details(calls: list[Any], code: str) -> str:
    for call in calls:
        if call.done() and (await call.code()).name == code:
            return str(await call.details())
    raise AssertionError(f"no call ended {code}")


@pytest.fixture
def small_call_limit(monkeypatch: pytest.MonkeyPatch) -> int:
    """The most gRPC calls waiting on their clients, lowered to 20 for the servers started."""
    pytest.importorskip("grpc")
    import torchplace.serve.grpc_read as grpc_read

    monkeypatch.setattr(grpc_read, "MAX_OPEN_CALLS", 20)
    return 20


def test_idle_streams_past_the_limit_are_ended_quietest_first(small_call_limit: int) -> None:
    """One connection opened streams by the thousand (ModelStreamInfer), sent one request on
    each, read its answer and then nothing more: each open stream held tens of KB of the
    server's memory (its call in gRPC core, a reader task, a queue, a timer) for the keep-alive
    timeout, and nothing bounded how many (10,000 streams: 300 MB). Now past the limit the
    quietest are ended with RESOURCE_EXHAUSTED and a message that says why."""
    import grpc

    async def attack(port: int) -> tuple[list[str], str]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            open_stream = channel.stream_stream(_SERVICE + "ModelStreamInfer")
            calls = []
            for i in range(3 * small_call_limit):
                call = open_stream()
                await call.write(_infer(request_id=str(i)))
                await call.read()  # its answer: the stream is idle from now on
                calls.append(call)
            outcomes = [await _outcome(call) for call in calls]
            message = await _details(calls, "RESOURCE_EXHAUSTED")
            answer = await channel.unary_unary(_SERVICE + "ModelInfer")(_infer(), timeout=10)
            assert answer  # a new call is served
            for call in calls:
                call.cancel()
            return outcomes, message

    with ServerThread(test_config(), engine=FakeEngine()) as server:
        outcomes, message = asyncio.run(attack(server.grpc_port or 0))
    assert outcomes.count("open") <= small_call_limit
    assert outcomes.count("RESOURCE_EXHAUSTED") >= 2 * small_call_limit
    assert set(outcomes[-small_call_limit // 2 :]) == {"open"}  # the newest are kept
    assert "waited longest" in message
    assert f"at most {small_call_limit} gRPC calls" in message


def test_unary_calls_that_never_send_their_message_are_ended_past_the_limit(
    small_call_limit: int,
) -> None:
    """Unary calls opened without their request message are each held until the request
    timeout (30 s by default), and a client can open thousands a second on one connection.
    Past the limit the oldest are ended at once (RESOURCE_EXHAUSTED), not left to hold memory
    until their timeout."""
    import grpc

    async def attack(port: int) -> list[str]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            # request-streaming from the client's side: the call opens, no message is sent
            open_call = channel.stream_unary(_SERVICE + "ModelInfer")
            calls = [open_call() for _ in range(3 * small_call_limit)]
            for call in calls:
                await call.wait_for_connection()
            # the server ends the surplus as each new call arrives: wait (bounded) until it has
            deadline = asyncio.get_running_loop().time() + 20
            while sum(c.done() for c in calls) < 2 * small_call_limit:
                if asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # and none more is ended after
            outcomes = [await _outcome(call) for call in calls]
            for call in calls:
                call.cancel()
            return outcomes

    with ServerThread(test_config(request_timeout_s=30.0), engine=FakeEngine()) as server:
        outcomes = asyncio.run(attack(server.grpc_port or 0))
    assert outcomes.count("open") <= small_call_limit
    assert outcomes.count("RESOURCE_EXHAUSTED") >= 2 * small_call_limit


def test_a_new_stream_is_refused_when_every_open_one_is_busy(small_call_limit: int) -> None:
    """When every counted call is computing (none to end), a new stream is refused with a
    reason rather than let the count grow without bound; those in flight are answered, and a
    unary call is still served."""
    import grpc

    async def attack(port: int) -> tuple[list[str], str]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            open_stream = channel.stream_stream(_SERVICE + "ModelStreamInfer")
            busy = []
            for i in range(small_call_limit):
                call = open_stream()
                await call.write(_infer(request_id=str(i)))
                busy.append(call)
            await asyncio.sleep(0.3)  # all of them in the engine
            extra = open_stream()
            refused = await _outcome(extra)
            message = await _details([extra], "RESOURCE_EXHAUSTED")
            # a unary call is let in (and would only be ended if it waited for its message)
            unary = await channel.unary_unary(_SERVICE + "ModelInfer")(_infer(), timeout=10)
            assert unary
            answered = [await call.read() for call in busy]
            for call in [*busy, extra]:
                call.cancel()
            return [refused, *(type(a).__name__ for a in answered)], message

    engine = FakeEngine(delay_s=1.5)
    with ServerThread(test_config(), engine=engine) as server:
        outcomes, message = asyncio.run(attack(server.grpc_port or 0))
    assert outcomes[0] == "RESOURCE_EXHAUSTED"
    assert "none of them is idle" in message
    assert "retry" in message
    assert all(kind == "bytes" for kind in outcomes[1:])


def test_health_watches_past_the_limit_are_ended(small_call_limit: int) -> None:
    """A health Watch waits on the server for as long as the client keeps it, so it counts
    with the rest: watches opened by the thousand end the oldest past the limit."""
    import grpc

    from torchplace.serve.proto import health_pb2

    async def attack(port: int) -> list[str]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            watch = channel.unary_stream("/grpc.health.v1.Health/Watch")
            request = health_pb2.HealthCheckRequest(service="").SerializeToString()
            calls = []
            for _ in range(2 * small_call_limit):
                call = watch(request)
                await call.read()  # SERVING: the watch now waits for a change
                calls.append(call)
            outcomes = [await _outcome(call) for call in calls]
            for call in calls:
                call.cancel()
            return outcomes

    with ServerThread(test_config(), engine=FakeEngine()) as server:
        outcomes = asyncio.run(attack(server.grpc_port or 0))
    assert outcomes.count("open") <= small_call_limit
    assert "RESOURCE_EXHAUSTED" in outcomes


# -- gRPC: idle connections cannot take every file descriptor ---------------------------------
def _alive(sockets: list[Any]) -> int:
    """How many of ``sockets`` the server has not closed."""
    count = 0
    for sock in sockets:
        sock.setblocking(False)
        try:
            count += bool(sock.recv(4096))  # its SETTINGS: open
        except BlockingIOError:
            count += 1
        except OSError:
            pass
    return count


def test_idle_grpc_connections_are_bounded_and_those_that_say_nothing_time_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Connections to the gRPC port that send the HTTP/2 preface and no call, or nothing at
    all, were kept without bound (for 60 s, and 120 s), each a file descriptor: with the open
    file limit at 400, 600 of them took every descriptor, and the HTTP port stopped answering
    at all (accept failed) as the gRPC port did. Now gRPC connections are bounded to half the
    descriptors the HTTP server leaves (here lowered to 8; new ones are closed at once), and a
    connection that sends nothing is closed after --request-timeout."""
    import socket
    import time

    pytest.importorskip("grpc")
    import torchplace.serve.grpc_server as grpc_server

    monkeypatch.setattr(grpc_server, "grpc_connection_limit", lambda: 8)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    config = test_config(request_timeout_s=1.0)
    with ServerThread(config, engine=FakeEngine()) as server:
        address = ("127.0.0.1", server.grpc_port or 0)
        talking = [socket.create_connection(address, timeout=5) for _ in range(20)]
        for sock in talking:
            sock.sendall(preface)
        deadline = time.monotonic() + 10  # the surplus is closed as it comes: wait for it
        while _alive(talking) > 8 and time.monotonic() < deadline:
            time.sleep(0.2)
        try:
            assert _alive(talking) <= 8
            assert answer_of(server.port, raw_request(_GOOD))[0] == 200
        finally:
            for sock in talking:
                sock.close()
        time.sleep(0.5)  # those closed above are gone
        silent = [socket.create_connection(address, timeout=5) for _ in range(3)]
        try:
            deadline = time.monotonic() + 8
            while _alive(silent) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _alive(silent) == 0  # --request-timeout (1 s) to send the preface
        finally:
            for sock in silent:
                sock.close()


# -- gRPC: a message of millions of tiny entries is refused before it is built ---------------
def _grpc_answer(port: int, data: bytes) -> tuple[str, str, float]:
    """One ModelInfer call of ``data`` (any bytes): its status code's name, details, seconds."""
    import time

    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(_SERVICE + "ModelInfer")
        started = time.monotonic()
        try:
            call(data, timeout=60)
        except grpc.RpcError as exc:
            return exc.code().name, exc.details() or "", time.monotonic() - started
        return "OK", "", time.monotonic() - started


def test_a_message_of_millions_of_empty_entries_is_refused_before_it_is_built() -> None:
    """``inputs {}`` is 2 bytes on the wire and some 80 bytes once parsed, and each was then
    read as an object: a 64 MiB ModelInferRequest of them (under the default message limit)
    took the server to 11 GB and stalled every client for over a minute. Here 8 MiB of them
    (4 million entries), and 1 million empty strings in one input's ``bytes_contents``, are
    refused as messages of too many fields, before the parser builds them."""
    pytest.importorskip("grpc")
    from torchplace.serve.grpc_codec import MAX_MESSAGE_FIELDS
    from torchplace.serve.proto import grpc_service_pb2 as pb

    flood = b"\n\x08seed-mlp" + b"\x2a\x00" * (4 << 20)
    strings = pb.ModelInferRequest.FromString(_infer())
    strings.inputs[0].contents.bytes_contents.extend([b""] * (1 << 20))
    with ServerThread(test_config(max_body_bytes=16 << 20), engine=FakeEngine()) as server:
        port = server.grpc_port or 0
        for data in (flood, strings.SerializeToString()):
            code, details, seconds = _grpc_answer(port, data)
            assert code == "INVALID_ARGUMENT", details
            assert f"more than {MAX_MESSAGE_FIELDS} fields" in details
            assert seconds < 5
        assert _grpc_answer(port, _infer())[0] == "OK"


def test_a_shape_of_millions_of_dimensions_is_refused_without_reading_it() -> None:
    """A packed ``shape`` of 8 million dimensions is one field; it was made into a Python list
    and each dimension checked before the rank was compared. The rank is compared first."""
    pytest.importorskip("grpc")
    from torchplace.serve.proto import grpc_service_pb2 as pb

    request = pb.ModelInferRequest.FromString(_infer())
    request.inputs[0].shape.extend([1] * (8 << 20))
    with ServerThread(test_config(max_body_bytes=16 << 20), engine=FakeEngine()) as server:
        code, details, _ = _grpc_answer(server.grpc_port or 0, request.SerializeToString())
    assert code == "INVALID_ARGUMENT"
    assert "unexpected shape for input 'input'" in details
    assert f"{(8 << 20) + 2} dimensions, where it has 2" in details


def test_more_entries_than_the_model_has_are_refused_by_count() -> None:
    """Thousands of ``inputs``, ``outputs`` or ``raw_input_contents`` entries in a message
    under the walked size were each read before the first wrong one was told."""
    pytest.importorskip("grpc")
    from torchplace.serve.proto import grpc_service_pb2 as pb

    raws = pb.ModelInferRequest.FromString(_infer())
    raws.raw_input_contents.extend([b""] * 3000)
    outputs = pb.ModelInferRequest.FromString(_infer())
    for _ in range(3000):
        outputs.outputs.add(name="output")
    with ServerThread(test_config(), engine=FakeEngine()) as server:
        port = server.grpc_port or 0
        code, details, _ = _grpc_answer(port, raws.SerializeToString())
        assert code == "INVALID_ARGUMENT"
        assert "3001 raw_input_contents but the model takes 1 inputs" in details
        code, details, _ = _grpc_answer(port, outputs.SerializeToString())
        assert code == "INVALID_ARGUMENT"
        assert "output 'output' already exists in request" in details


# -- BF16: a JSON number past bfloat16's range is infinite, as FP16's past float16's is -------
def test_a_bf16_number_past_bfloat16_s_range_is_refused_as_infinite() -> None:
    """A BF16 input's JSON numbers are held as float32 until the model gets them as bfloat16,
    and the check for infinite values looked at the float32: 3.4e38 (finite in float32, past
    bfloat16's largest, 3.39e38) passed, the model computed on infinity, and a binary answer
    carried it back (a JSON one was refused as "the model's result"), where FP16's 70000 is
    refused as the input it is. Now it is refused the same way, naming BF16's range."""
    from .datatype_model import ALL, WIDTH

    name = "tests.serve.datatype_model-build"
    config = test_config(model="tests.serve.datatype_model:build", device="cpu")

    def body(bf16: list[float]) -> bytes:
        inputs = [
            {"name": f"in_{dt}", "datatype": dt, "shape": [1, WIDTH],
             "data": bf16 if dt == "BF16" else [True if dt == "BOOL" else 1] * WIDTH}
            for dt in ALL
        ]  # fmt: skip
        outputs = [{"name": "out_BF16", "parameters": {"binary_data": True}}]
        return orjson.dumps({"inputs": inputs, "outputs": outputs})

    with ServerThread(config).start(timeout=120) as server:
        path = f"/v2/models/{name}/infer".encode()
        for value in (3.4e38, -3.4e38, 3.3962e38):
            status, answer = answer_of(server.port, raw_request(body([1.0, value, 1.0]), path=path))
            assert status == 400, answer
            message = orjson.loads(answer)["error"]
            assert "in_BF16" in message
            assert "BF16's range (±3.39e+38)" in message, message
            assert "flat index 1" in message
        # the largest number that rounds to a finite bfloat16 is still taken
        status, answer = answer_of(server.port, raw_request(body([1.0, 3.3961e38, 1.0]), path=path))
        assert status == 200, answer


# -- HTTP: what the parser refuses is told with the fix, and the line at fault -------------------
_HEAD = b"GET /v2/health/ready HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
_CHUNKED = (
    b"POST /v2/models/seed-mlp/infer HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
)
_REFUSED = [
    ("space in a field name", _HEAD + b"Bad Header: 1\r\n\r\n", ["token", "'Bad Header: 1'"]),
    ("space before the colon", _HEAD + b"Content-Length : 0\r\n\r\n", ["followed at once"]),
    ("a line without a colon", _HEAD + b"NoColon\r\n\r\n", ["colon", "'NoColon'"]),
    ("NUL in a value", _HEAD + b"X: a\x00b\r\n\r\n", ["control characters", "'X: a\\x00b'"]),
    ("a folded field", _HEAD + b"X: a\r\n  b\r\n\r\n", ["one line", "obs-fold"]),
    ("bare LF line ends", b"GET /v2/health/ready HTTP/1.1\nHost: a\n\n", ["with CRLF"]),
    ("two Content-Lengths", _HEAD + b"Content-Length: 1\r\nContent-Length: 1\r\n\r\n", ["send one"]),
    ("a signed Content-Length", _HEAD + b"Content-Length: +1\r\n\r\n", ["decimal digits"]),
    ("a Content-Length past 64 bits", _HEAD + b"Content-Length: " + b"9" * 30 + b"\r\n\r\n",
     ["--max-body-bytes"]),
    ("chunked then identity", _HEAD + b"Transfer-Encoding: chunked, identity\r\n\r\n",
     ["chunked last"]),
    ("a chunk size that is not hex", _CHUNKED + b"zz\r\n", ["SIZE-IN-HEX"]),
    ("a lower-case version", b"GET / http/1.1\r\nHost: a\r\n\r\n", ["'METHOD /path HTTP/1.1'"]),
    ("a raw byte in the target", b"GET /v2/\xff HTTP/1.1\r\nHost: a\r\n\r\n", ["percent-encoded"]),
    ("TLS on the HTTP port", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", ["http://", "not TLS"]),
]  # fmt: skip


@pytest.mark.parametrize(("what", "payload", "words"), _REFUSED, ids=[r[0] for r in _REFUSED])
def test_a_request_the_parser_refuses_is_told_the_fix(
    hostile_server: ServerThread, what: str, payload: bytes, words: list[str]
) -> None:
    """Each was answered 400 with the parser's words alone ("malformed HTTP request: Invalid
    header token"), which name neither the line at fault nor what to send instead. The
    parser's words stay, followed by the rule the request broke and, for a header field, the
    line that broke it."""
    status, body = answer_of(hostile_server.port, payload)
    assert status == 400
    message = orjson.loads(body)["error"]
    assert message.startswith("malformed HTTP request: "), message
    for word in words:
        assert word in message, (what, message)


def test_still_serving_after_all_of_the_above(hostile_server: ServerThread) -> None:
    assert answer_of(hostile_server.port, raw_request(_GOOD))[0] == 200
