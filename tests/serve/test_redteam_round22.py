"""A twenty-second red-team pass, from outside: raw sockets, http.client and grpcio against
running servers.

Tried this round and found to behave as designed (not repeated here): 200 requests pipelined in
one packet with every third one malformed (201 answers, in order, the connection kept); a body
framed by both Content-Length and Transfer-Encoding, ``Transfer-Encoding: chunked, chunked``,
``gzip, chunked`` and ``identity`` (400 or 501, closed); chunk extensions (quoted strings too)
and trailers; ``Expect: 100-continue`` answered at once on a good request, refused with 413
before the body past ``--max-body-bytes``, and an early 404/405 whose body then arrives (read
as the body, not as the next request); HEAD, OPTIONS, PUT, DELETE, PATCH and TRACE on every
route (405 with ``Allow``); percent-encoded, Unicode, NUL, CR LF, ``.``, ``..`` and 10,000-byte
model names and versions; duplicate JSON keys (the last wins, as in RapidJSON); ``parameters``
nested 5,000 deep; a 100,000-character ``id``; ``1e400``, ``-0``, ``NaN``; INT64, UINT64, INT8
to UINT32 values at and one past their ranges over REST and gRPC typed contents; BOOL bytes
other than 0 and 1 over binary REST and gRPC raw contents; NaN and Inf in binary FP16, BF16,
FP32 and FP64; requested outputs repeated, unknown, unnamed; ``classification`` 0, negative,
a float, a string, ``true``, past the class count, with ``binary_data`` and with shared memory;
shared-memory offsets and sizes at, one past and far past a region's end, a region truncated
under the server, output and input in one region; 120 loads and unloads of one model from
three threads while three others infer on it (every answer 200 or 404, no descriptor or thread
left behind); ``grpc-timeout`` of ``1n``, ``99999999H``, nine digits, signs, spaces, a decimal
point and full-width digits; gzip, deflate, two gzip members, garbage, unknown and upper-case
encodings; ``ModelStreamInfer`` with bad, unknown-model and empty requests and an unparsable
message between good ones (each answered with its error, the stream goes on); KServe V1
``:predict`` with empty, null, scalar, ragged, object, base64 and columnar instances.

What is pinned here:

- a gRPC message whose first byte (its compressed flag) is neither 0 nor 1 was read as
  compressed: with ``grpc-encoding: gzip`` the client was told "the compressed message does not
  inflate (incorrect header check)", without one "Compression bit set but no encoding
  configured", neither naming the byte. gRPC core refuses it as "Bad GRPC frame type 0x02"; so
  does the server now, with the fix;
- a JSON integer past 64 bits (which the parser reads as a float) in a shared-memory offset or
  size, a ``classification`` count or a ``shape`` was named as the float
  (``got 1.8446744073709552e+19``) under "must be a non-negative integer": the client that sent
  an integer was told it had not. The message now says the number is past 64 bits, where a
  JSON integer is read as a float;
- a gRPC request whose header field value held NUL, CR or LF (``x-trace: a\r\nx-admin: 1``)
  was served, the value handed to the handlers as metadata: RFC 9113 (8.2.1) makes it
  malformed, and it is now reset (``RST_STREAM`` ``PROTOCOL_ERROR``) as the other malformed
  requests are;
- a ``NaN`` or ``Infinity`` token in a JSON body (what Python's ``json.dumps``, and so
  tritonclient.http's JSON tensors, write for non-finite floats) was told "unexpected character,
  expected a JSON value" at a column, ``1e400`` "number is infinity when parsed as double", and
  in a binary request's JSON header either was put down to a wrong
  Inference-Header-Content-Length; each now says what to send instead, over v2 and V1;
- the reflection service's ``error_message`` quoted a requested name whole (a 1 MB symbol
  answered with 1 MB of message beside the echoed request): it is quoted cut, as elsewhere;
- a model whose name holds a colon (``team:seed``, which the repository loads and v2 and gRPC
  serve) could not be reached over KServe V1: the path was split at its first colon, so
  ``/v1/models/team:seed:predict`` (percent-encoded or not) was a 404 "no route". The verb is
  now what follows the last colon, and ``GET /v1/models/team:seed`` is the model's status.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import orjson
import pytest

from torchplace.errors import SharedMemoryError
from torchplace.serve.grpc_reflection import answer
from torchplace.serve.proto import reflection_pb2 as reflection
from torchplace.serve.running import ServerThread
from torchplace.serve.shm import SharedMemoryRegions

from .conftest import FakeEngine, StartServer, answer_of, raw_request, seed_input
from .raw_http2 import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PROTOCOL_ERROR,
    RST_STREAM,
    Connection,
    frame,
    grpc_headers,
    grpc_message,
    literal,
)

grpc = pytest.importorskip("grpc")

from .test_grpc_transport import _infer_request as _request  # noqa: E402
from .test_grpc_transport import _still_serves  # noqa: E402

INFER = "/inference.GRPCInferenceService/ModelInfer"


def _grpc_port(server: ServerThread) -> int:
    port = server.grpc_port
    assert port is not None
    return port


@pytest.mark.parametrize("encoding", ["gzip", "identity"])
@pytest.mark.parametrize("flag", [2, 0x80, 0xFF])
def test_a_compressed_flag_other_than_0_or_1_is_a_bad_frame_type_named(
    start_server: StartServer, encoding: str, flag: int
) -> None:
    """The flag byte was taken as "compressed" whatever its value: a client whose framing is off
    by a byte was told its gzip does not inflate, or that it set the compression bit."""
    server = start_server()
    port = _grpc_port(server.thread)
    body = _request().SerializeToString()
    if encoding == "gzip":
        body = gzip.compress(body)
    message = bytes([flag]) + len(body).to_bytes(4, "big") + body
    connection = Connection(port)
    try:
        extra = (("grpc-encoding", encoding),) if encoding != "identity" else ()
        connection.send(frame(HEADERS, END_HEADERS, 1, grpc_headers(INFER, extra)))
        connection.send(frame(DATA, END_STREAM, 1, message))
        frames = connection.read(
            lambda f: f.stream == 1 and f.kind == HEADERS and bool(f.flags & END_STREAM)
        )
    finally:
        connection.close()
    trailers = [f.payload for f in frames if f.kind == HEADERS and f.stream == 1][-1]
    assert b"grpc-status\x0213" in trailers, trailers  # INTERNAL, as gRPC core
    assert b"Bad GRPC frame type 0x%02x" % flag in trailers, trailers
    assert b"0 or 1" in trailers, trailers
    _still_serves(port)


def test_flags_0_and_1_are_still_read(start_server: StartServer) -> None:
    server = start_server()
    port = _grpc_port(server.thread)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.enable_retries", 0)])
    try:
        infer = channel.unary_unary(INFER)
        plain = _request().SerializeToString()
        assert infer(plain, timeout=10)
        squeezed = channel.unary_unary(INFER)
        assert squeezed(plain, timeout=10, compression=grpc.Compression.Gzip)
    finally:
        channel.close()


def _object(tmp_path: Path, size: int) -> Path:
    path = tmp_path / "obj"
    path.write_bytes(bytes(size))
    return path


@pytest.mark.parametrize("what", ["offset", "byte_size"])
def test_a_shared_memory_range_past_64_bits_is_said_to_be_an_integer_past_64_bits(
    tmp_path: Path, what: str
) -> None:
    """``18446744073709551616`` in JSON reaches the server as a float: it was refused as
    "must be a non-negative integer, got 1.8446744073709552e+19"."""
    _object(tmp_path, 64)
    regions = SharedMemoryRegions(allowed=True, root=tmp_path)
    regions.register("r", "/obj", 0, 64)
    huge = float(2**64)
    offset, size = (huge, 32) if what == "offset" else (0, huge)
    with pytest.raises(SharedMemoryError) as err:
        regions.target("r", offset, size, "input 'input'")
    said = str(err.value)
    assert "past 64 bits: a JSON integer this large is read as a float" in said, said
    assert "18446744073709551615" in said, said  # the bound a client can send
    # a float sent as a float is not told it is an integer
    with pytest.raises(SharedMemoryError) as err:
        regions.target("r", 1.5, 32, "input 'input'")
    assert "past 64 bits" not in str(err.value)
    regions.unregister()


def _refusal(port: int, body: dict[str, object]) -> str:
    # the standard library writes integers past 64 bits, as a client in any language may
    status, answer = answer_of(port, raw_request(json.dumps(body).encode()))
    assert status == 400, answer
    return str(orjson.loads(answer)["error"])


def test_a_classification_or_shape_past_64_bits_is_said_to_be_an_integer_past_64_bits(
    start_server: StartServer,
) -> None:
    server = start_server()
    said = _refusal(
        server.port,
        {"inputs": [seed_input()],
         "outputs": [{"name": "output", "parameters": {"classification": 2**70}}]},
    )  # fmt: skip
    assert "'classification' must be a positive integer" in said, said
    assert "past 64 bits: a JSON integer this large is read as a float" in said, said
    said = _refusal(server.port, {"inputs": [seed_input(shape=[2**64, 8])]})
    assert "'shape' must be an array of non-negative integers" in said, said
    assert "past 64 bits: a JSON integer this large is read as a float" in said, said
    # a value that is a float as sent is named as it was
    said = _refusal(server.port, {"inputs": [seed_input(shape=[1.5, 8])]})
    assert "past 64 bits" not in said, said
    assert "1.5" in said, said


def test_a_region_past_64_bits_over_rest_names_the_integer(start_server: StartServer) -> None:
    """End to end: a real region, an input whose offset is 2**64 in the JSON."""
    key = f"torchplace-rt22-{os.getpid()}"
    fd = os.open(f"/dev/shm/{key}", os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 64)
        server = start_server(allow_client_shm=True)
        status, _, answer = server.client.post(
            "/v2/systemsharedmemory/region/in/register",
            orjson.dumps({"key": f"/{key}", "offset": 0, "byte_size": 64}),
        )
        assert status == 200, answer
        params = {"shared_memory_region": "in", "shared_memory_byte_size": 32,
                  "shared_memory_offset": 2**64}  # fmt: skip
        entry = seed_input(parameters=params)
        del entry["data"]
        said = _refusal(server.port, {"inputs": [entry]})
        assert "shared_memory_offset" in said, said
        assert "past 64 bits: a JSON integer this large is read as a float" in said, said
        server.client.post("/v2/systemsharedmemory/unregister", b"")
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm/{key}")


@pytest.mark.parametrize(
    "field", ["file_by_filename", "file_containing_symbol", "all_extension_numbers_of_type"]
)
def test_a_reflection_request_for_a_huge_name_is_quoted_cut(field: str) -> None:
    """A 1 MB symbol name came back whole in the error message, beside the whole request that
    ``original_request`` echoes: each request of the stream answered twice its size."""
    request = reflection.ServerReflectionRequest(**{field: "x" * 1_000_000})
    said = answer(request, ["inference.GRPCInferenceService"]).error_response.error_message
    assert said.startswith("no "), said[:300]
    assert len(said) < 500, len(said)


_ROW = "[0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, %s]"


@pytest.mark.parametrize(
    ("value", "says"),
    [("NaN", "JSON has no NaN or Infinity"), ("Infinity", "JSON has no NaN or Infinity"),
     ("-Infinity", "JSON has no NaN or Infinity"), ("1e400", "past float64's range"),
     ("-1e400", "past float64's range")],
)  # fmt: skip
def test_a_number_json_cannot_carry_is_told_what_to_send_instead(
    start_server: StartServer, value: str, says: str
) -> None:
    """Python's json.dumps (and so tritonclient.http's JSON tensors) writes ``NaN`` and
    ``Infinity``: the client was told "unexpected character, expected a JSON value" at a
    column, and ``1e400`` "number is infinity when parsed as double", neither saying what to
    send."""
    server = start_server()
    row = _ROW % value
    v2 = f'{{"inputs": [{{"name": "input", "datatype": "FP32", "shape": [1, 8], "data": {row}}}]}}'
    status, answer = answer_of(server.port, raw_request(v2.encode()))
    assert status == 400, answer
    said = str(orjson.loads(answer)["error"])
    assert said.startswith("request body is not valid JSON: "), said
    assert says in said, said
    status, answer = answer_of(
        server.port,
        raw_request(b'{"instances": [%s]}' % row.encode(), path=b"/v1/models/seed-mlp:predict"),
    )
    assert status == 400, answer
    said = str(orjson.loads(answer)["error"])
    assert says in said, said


def test_a_non_finite_number_in_a_binary_request_s_json_is_not_blamed_on_its_length(
    start_server: StartServer,
) -> None:
    """With binary data after the JSON, the parse error was put down to a wrong
    Inference-Header-Content-Length, which was right."""
    server = start_server()
    header = (
        b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8], '
        b'"parameters": {"binary_data_size": 32, "scale": NaN}}]}'
    )
    headers = {
        b"Inference-Header-Content-Length": str(len(header)).encode(),
        b"Content-Type": b"application/octet-stream",
    }
    status, answer = answer_of(server.port, raw_request(header + bytes(32), headers=headers))
    assert status == 400, answer
    said = str(orjson.loads(answer)["error"])
    assert "JSON has no NaN or Infinity" in said, said
    assert "Inference-Header-Content-Length" not in said, said


@pytest.mark.parametrize(
    ("name", "value"),
    [("x-trace", "a\x00b"), ("x-trace", "a\r\nx-admin: 1"), ("x-trace", "a\nb"),
     ("authorization", "Bearer t\r\n"), (":authority", "h\x00st")],
    ids=["nul", "crlf", "lf", "authorization-crlf", "authority-nul"],
)  # fmt: skip
def test_a_field_value_with_nul_cr_or_lf_is_a_malformed_request_reset(
    start_server: StartServer, name: str, value: str
) -> None:
    """RFC 9113 section 8.2.1: such a request MUST be treated as malformed. It was served,
    the value (CR LF and all) handed to the handlers as the call's metadata."""
    server = start_server()
    port = _grpc_port(server.thread)
    if name.startswith(":"):
        fields = [(":method", "POST"), (":scheme", "http"), (":path", INFER), (name, value),
                  ("content-type", "application/grpc")]  # fmt: skip
        block = b"".join(literal(k, v) for k, v in fields)
    else:
        block = grpc_headers(INFER, ((name, value),))
    connection = Connection(port)
    try:
        connection.send(frame(HEADERS, END_HEADERS, 1, block))
        connection.send(frame(DATA, END_STREAM, 1, grpc_message(_request().SerializeToString())))
        frames = connection.read(
            lambda f: (
                f.stream == 1
                and (f.kind == RST_STREAM or (f.kind == HEADERS and bool(f.flags & END_STREAM)))
            )
        )
    finally:
        connection.close()
    last = frames[-1]
    assert (last.kind, last.error_code()) == (RST_STREAM, PROTOCOL_ERROR), frames
    _still_serves(port)


def test_a_model_whose_name_holds_a_colon_is_served_over_kserve_v1(
    start_server: StartServer,
) -> None:
    """A repository model may be named ``team:seed`` (it loads, and v2 and gRPC serve it), but
    V1 split its path at the first colon: ``/v1/models/team:seed:predict`` was a 404 "no route"
    (verb ``seed:predict``), percent-encoded too, and its status route the same."""
    engine = FakeEngine()
    engine.name = "team:seed"
    server = start_server(engine)
    row = orjson.dumps({"instances": [[0.5] * 8]})
    for path in ("/v1/models/team:seed:predict", "/v1/models/team%3Aseed:predict"):
        status, _, answer = server.client.post(path, row)
        assert status == 200, (path, answer)
        assert len(orjson.loads(answer)["predictions"]) == 1
    for path in ("/v1/models/team:seed", "/v1/models/team%3Aseed"):
        status, _, answer = server.client.get(path)
        assert status == 200, (path, answer)
    status, _, answer = server.client.post("/v1/models/team:seed:explain", row)
    assert status == 501, answer
    # an unknown verb is still told the routes; a name that is not served, the models
    status, _, answer = server.client.post("/v1/models/team:seed:bogus", row)
    assert status == 404, answer
    assert b"KServe V1 serves" in answer
    status, _, answer = server.client.get("/v1/models/team:nope")
    assert status == 404, answer
    assert b"team:seed" in answer
