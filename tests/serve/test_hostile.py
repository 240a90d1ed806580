"""A corpus of malformed and hostile requests against a real server (real engine).

Each one must get a 4xx with a clear ``{"error": ...}`` message, and afterwards the server must
still be ready and still answer correctly.
"""

from __future__ import annotations

import gzip

import numpy as np
import orjson
import pytest
import torch

from torchplace.models import build_model
from torchplace.serve.running import ServerThread

from .conftest import INFER, LIMIT, Client, StartServer, exchange, raw_request, seed_input


def _doc(inputs: object = None, **extra: object) -> bytes:
    return orjson.dumps({"inputs": [seed_input()] if inputs is None else inputs, **extra})


def _binary(entry: dict[str, object], raw: bytes, header_length: int | None = None) -> bytes:
    header = orjson.dumps({"inputs": [entry]})
    length = len(header) if header_length is None else header_length
    return raw_request(
        header + raw,
        headers={
            b"Content-Type": b"application/octet-stream",
            b"Inference-Header-Content-Length": str(length).encode(),
        },
    )


_F32 = np.zeros(8, "<f4").tobytes()
_NAN = np.array([np.nan] + [0.0] * 7, "<f4").tobytes()

CORPUS: list[tuple[str, bytes, int]] = [
    # -- JSON that is not an inference request
    ("empty body", raw_request(b""), 400),
    ("truncated json", raw_request(b'{"inputs": ['), 400),
    ("json null", raw_request(b"null"), 400),
    ("json array", raw_request(b"[]"), 400),
    ("json string", raw_request(b'"infer please"'), 400),
    ("non-utf8 bytes", raw_request(b"\xff\xfe\xfd{}"), 400),
    (
        "NaN literal",
        raw_request(b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,1],"data":[NaN]}]}'),
        400,
    ),
    ("Infinity literal", raw_request(b'{"inputs":[{"data":[Infinity]}]}'), 400),
    ("deep nesting", raw_request(b'{"inputs":' + b"[" * 5000 + b"]" * 5000 + b"}"), 400),
    ("inputs null", raw_request(b'{"inputs": null}'), 400),
    ("inputs object", raw_request(b'{"inputs": {}}'), 400),
    ("inputs empty", raw_request(_doc([])), 400),
    ("input null", raw_request(_doc([None])), 400),
    ("input name number", raw_request(_doc([seed_input(name=5)])), 400),
    ("unknown input", raw_request(_doc([seed_input(name="image")])), 400),
    ("duplicate input", raw_request(_doc([seed_input(), seed_input()])), 400),
    # -- datatypes
    ("datatype missing", raw_request(_doc([seed_input(datatype=None)])), 400),
    ("datatype BYTES", raw_request(_doc([seed_input(datatype="BYTES")])), 400),
    ("datatype FP64", raw_request(_doc([seed_input(datatype="FP64")])), 400),
    ("datatype lower case", raw_request(_doc([seed_input(datatype="fp32")])), 400),
    ("datatype made up", raw_request(_doc([seed_input(datatype="FP8E4")])), 400),
    # -- shapes
    ("shape missing", raw_request(_doc([seed_input(shape=None)])), 400),
    ("shape string", raw_request(_doc([seed_input(shape="1,8")])), 400),
    ("shape rank 1", raw_request(_doc([seed_input(shape=[8])])), 400),
    ("shape rank 3", raw_request(_doc([seed_input(shape=[1, 8, 1])])), 400),
    ("shape wrong width", raw_request(_doc([seed_input(shape=[1, 9])])), 400),
    ("shape negative", raw_request(_doc([seed_input(shape=[-1, 8])])), 400),
    ("shape float", raw_request(_doc([seed_input(shape=[1.0, 8])])), 400),
    ("zero rows", raw_request(_doc([seed_input(shape=[0, 8], data=[])])), 400),
    (
        "over max request rows",
        raw_request(_doc([seed_input(shape=[4097, 8], data=[0.5] * 32776)])),
        413,
    ),
    ("huge shape", raw_request(_doc([seed_input(shape=[2**62, 8])])), 413),
    ("huge shape float", raw_request(_doc([seed_input(shape=[1e300, 8])])), 400),
    # -- element counts and values
    ("count lies short", raw_request(_doc([seed_input(data=[0.5] * 7)])), 400),
    ("count lies long", raw_request(_doc([seed_input(data=[0.5] * 9)])), 400),
    ("count lies rows", raw_request(_doc([seed_input(shape=[2, 8])])), 400),
    ("data missing", raw_request(_doc([seed_input(data=None)])), 400),
    ("data string", raw_request(_doc([seed_input(data="0.5")])), 400),
    ("data strings", raw_request(_doc([seed_input(data=["0.5"] * 8)])), 400),
    ("data objects", raw_request(_doc([seed_input(data=[{}] * 8)])), 400),
    ("data nulls", raw_request(_doc([seed_input(data=[None] * 8)])), 400),
    ("data booleans", raw_request(_doc([seed_input(data=[True] * 8)])), 400),
    (
        "data ragged",
        raw_request(_doc([seed_input(shape=[2, 8], data=[[0.5] * 8, [0.5] * 7])])),
        400,
    ),
    (
        "data huge number",
        raw_request(
            b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,8],"data":[1e400,0,0,0,0,0,0,0]}]}'
        ),
        400,
    ),
    ("data overflow fp32", raw_request(_doc([seed_input(data=[1e39] + [0.5] * 7)])), 400),
    (
        "data mixed types",
        raw_request(_doc([seed_input(data=[0.5, "a", 0.5, 0.5, 0.5, 0.5, 0.5, 0.5])])),
        400,
    ),
    # -- request fields
    ("id number", raw_request(_doc(id=42)), 400),
    ("parameters list", raw_request(_doc(parameters=[1])), 400),
    ("binary output not bool", raw_request(_doc(parameters={"binary_data_output": "yes"})), 400),
    ("outputs object", raw_request(_doc(outputs={"name": "output"})), 400),
    ("unknown output", raw_request(_doc(outputs=[{"name": "logits"}])), 400),
    (
        "classification",
        raw_request(_doc(outputs=[{"name": "output", "parameters": {"classification": -2}}])),
        400,
    ),
    (
        "shared memory",
        raw_request(_doc([seed_input(parameters={"shared_memory_region": "r0"})])),
        400,
    ),
    # -- binary extension
    (
        "binary without header",
        raw_request(_doc([seed_input(data=None, parameters={"binary_data_size": 32})])),
        400,
    ),
    (
        "header length text",
        raw_request(_doc(), headers={b"Inference-Header-Content-Length": b"abc"}),
        400,
    ),
    (
        "header length past body",
        _binary(seed_input(data=None, parameters={"binary_data_size": 32}), _F32, 10**6),
        400,
    ),
    (
        "binary size wrong",
        _binary(seed_input(data=None, parameters={"binary_data_size": 31}), _F32),
        400,
    ),
    (
        "binary size negative",
        _binary(seed_input(data=None, parameters={"binary_data_size": -32}), _F32),
        400,
    ),
    (
        "binary short",
        _binary(seed_input(data=None, parameters={"binary_data_size": 32}), _F32[:16]),
        400,
    ),
    (
        "binary trailing bytes",
        _binary(seed_input(data=None, parameters={"binary_data_size": 32}), _F32 + b"xx"),
        400,
    ),
    ("binary NaN", _binary(seed_input(data=None, parameters={"binary_data_size": 32}), _NAN), 400),
    ("binary and data", _binary(seed_input(parameters={"binary_data_size": 32}), _F32), 400),
    # -- media types and sizes
    ("content type html", raw_request(_doc(), headers={b"Content-Type": b"text/html"}), 415),
    (
        "content type multipart",
        raw_request(_doc(), headers={b"Content-Type": b"multipart/form-data; boundary=x"}),
        415,
    ),
    ("content type xml", raw_request(_doc(), headers={b"Content-Type": b"application/xml"}), 415),
    ("content encoding br", raw_request(_doc(), headers={b"Content-Encoding": b"br"}), 415),
    ("gzip garbage", raw_request(b"not gzip at all", headers={b"Content-Encoding": b"gzip"}), 400),
    (
        "gzip bomb",
        raw_request(gzip.compress(b"[" * (LIMIT * 4)), headers={b"Content-Encoding": b"gzip"}),
        413,
    ),
    (
        "content length over limit",
        raw_request(b"{}", headers={b"Content-Length": str(LIMIT * 100).encode()}),
        413,
    ),
    ("body over limit", raw_request(b"[" * (LIMIT + 10)), 413),
    (
        "chunked over limit",
        raw_request(
            b"%x\r\n%s\r\n0\r\n\r\n" % (LIMIT + 10, b"x" * (LIMIT + 10)),
            headers={b"Transfer-Encoding": b"chunked"},
        ),
        413,
    ),
    # -- routes and methods
    ("unknown model", raw_request(_doc(), path=b"/v2/models/resnet50/infer"), 404),
    ("unknown version", raw_request(_doc(), path=b"/v2/models/seed-mlp/versions/2/infer"), 404),
    ("path traversal", raw_request(b"", method=b"GET", path=b"/v2/models/../../etc/passwd"), 404),
    (
        "encoded traversal",
        raw_request(b"", method=b"GET", path=b"/v2/models/%2e%2e%2fetc/ready"),
        404,
    ),
    ("unknown route", raw_request(b"", method=b"GET", path=b"/admin"), 404),
    ("very long path", raw_request(b"", method=b"GET", path=b"/v2/" + b"a" * 60_000), 404),
    ("GET infer", raw_request(b"", method=b"GET"), 405),
    ("DELETE model", raw_request(b"", method=b"DELETE", path=b"/v2/models/seed-mlp"), 405),
    # -- broken HTTP
    (
        "huge headers",
        raw_request(b"{}", headers={b"X-Pad-%d" % i: b"x" * 1000 for i in range(80)}),
        431,
    ),
    ("huge url", raw_request(b"", method=b"GET", path=b"/v2/" + b"a" * 70_000), 414),
    ("not http", b"HELLO THERE\r\n\r\n", 400),
    ("bad header line", b"GET /v2 HTTP/1.1\r\nHost localhost\r\n\r\n", 400),
    (
        "bad chunk size",
        raw_request(b"zz\r\nabc\r\n0\r\n\r\n", headers={b"Transfer-Encoding": b"chunked"}),
        400,
    ),
    (
        "content length and chunked",
        raw_request(
            b"0\r\n\r\n", headers={b"Transfer-Encoding": b"chunked", b"Content-Length": b"5"}
        ),
        400,
    ),
    ("no host", b"GET /v2/health/ready HTTP/1.1\r\nConnection: close\r\n\r\n", 400),
    ("two hosts", b"GET /v2/health/ready HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    (
        "chunked in HTTP/1.0",
        raw_request(b"2\r\n{}\r\n0\r\n\r\n", headers={b"Transfer-Encoding": b"chunked"}).replace(
            b"HTTP/1.1", b"HTTP/1.0", 1
        ),
        400,
    ),
    (
        "transfer coding gzip",
        raw_request(b"2\r\n{}\r\n0\r\n\r\n", headers={b"Transfer-Encoding": b"gzip, chunked"}),
        501,
    ),
]


def test_corpus_is_big_enough() -> None:
    assert len(CORPUS) >= 50
    assert len({name for name, _, _ in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize(("name", "payload", "status"), CORPUS, ids=[c[0] for c in CORPUS])
def test_hostile_request_gets_a_clear_4xx(
    hostile_server: ServerThread, name: str, payload: bytes, status: int
) -> None:
    reply = exchange(hostile_server.port, payload)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), (name, reply[:300])
    message = orjson.loads(body)["error"]
    assert isinstance(message, str)
    assert len(message) > 10, message


def test_still_ready_and_correct_after_the_corpus(hostile_server: ServerThread) -> None:
    for _, payload, _ in CORPUS:  # the whole corpus again, back to back
        exchange(hostile_server.port, payload)
    client = Client("127.0.0.1", hostile_server.port)
    assert client.get("/v2/health/ready")[0] == 200
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    status, _, body = client.post(
        INFER.decode(),
        orjson.dumps(
            {
                "inputs": [
                    {
                        "name": "input",
                        "datatype": "FP32",
                        "shape": [2, 8],
                        "data": x.ravel().tolist(),
                    }
                ]
            }
        ),
    )
    assert status == 200
    got = np.array(orjson.loads(body)["outputs"][0]["data"], np.float32).reshape(2, 2)
    with torch.inference_mode():
        want = build_model("seed-mlp")(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "body",
    [
        _doc(parameters={f"k{i}": 0 for i in range(300_000)}),
        _doc([seed_input(shape=[300_000, 1], data=[[0.0]] * 300_000)]),
    ],
    ids=["300k keys", "300k one-value arrays"],
)
def test_a_body_dear_to_parse_is_refused_and_the_server_serves_on(
    start_server: StartServer, body: bytes
) -> None:
    # within the default body limit: seconds of the event loop, were it parsed
    running = start_server()
    status, _, answer = running.client.post(INFER.decode(), body)
    assert status == 400, answer[:300]
    assert "one body may hold" in orjson.loads(answer)["error"]
    assert running.client.get("/v2/health/ready")[0] == 200
    assert running.client.post(INFER.decode(), _doc())[0] == 200
