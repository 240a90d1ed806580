"""Load tools and HTTP clients people point at servers, against a real `torchplace serve`.

Tools: ApacheBench (``ab``, HTTP/1.0 with ``Connection: Keep-Alive``, ``-k``, ``-p``/``-T``,
``-i``), ``siege`` (POST bodies, both connection modes, delays past ``--keepalive-timeout``),
``h2load`` (``--h1`` with 16 requests pipelined per connection; HTTP/2 prior knowledge), ``hey``
(``-m POST -D``), ``wget --post-file``, ``locust`` 2.x with ``FastHttpUser`` (geventhttpclient's
strict parser) and ``HttpUser``, ``httpx`` with ``http2=True`` (and ``http1=False``), ``urllib3``
2.x with ``Retry(status_forcelist=[503])``, ``pycurl`` with ``CURLOPT_TCP_KEEPALIVE``, HTTPie,
curl's ``--http2`` (``Upgrade: h2c``) and ``--http2-prior-knowledge``, Node.js 20's
``http.Agent``.

Tried and found to behave as designed (not repeated here): every tool above reports no error
for answers the server got right (2xx, and the 404 and 413 asked for: ``ab`` and ``hey`` with a
body over ``--max-body-bytes`` get 413 each, no reset); 200-at-a-time ``ab -k`` and ``-c 100``
without keep-alive; h2load's 16 pipelined requests per connection; gzip answers to the tools that
ask for them (``hey``, ``siege``, locust); an absolute request target, ``Accept: */*``,
``Accept-Charset``, ``OPTIONS *``; ``Upgrade: h2c`` is ignored and answered over HTTP/1.1 (with a
body, and with ``Expect: 100-continue``); HTTP/2 prior knowledge (curl, h2load, httpx with
``http1=False``) is answered at once with an HTTP/1.1 400 and closed, which gRPC clients pointed
at this port report as "Trying to connect an http1.x server" (an HTTP/2 GOAWAY with
``HTTP_1_1_REQUIRED`` was tried instead: curl then says only "Error in the HTTP2 framing layer"
and gRPC retries until its deadline); urllib3 honours ``Retry-After: 1`` on 503 (a POST only
when ``allowed_methods`` allows it, urllib3's own rule); an idle connection closed by
``--keepalive-timeout`` is reconnected by pycurl and urllib3 without an error, and siege (which
closes after each request by default) in ``connection = keep-alive`` mode counts a request sent
on it failed, whether or not the answers gave the hint: its own limit (docs/serve.md). ``ab``
counts answers whose length differs from the first as failed: under concurrent load a row's
floats can differ in their last bits with the batch it was computed in (docs/serve.md,
Batching), so ``ab`` needs ``-l`` there.

What is pinned here:

- an answer that keeps the connection at the client's asking says how long an idle one is kept
  (``Keep-Alive: timeout=N``, the whole seconds of ``--keepalive-timeout``): it said only
  ``Connection: keep-alive``, so a client that reads the hint (Node.js's agent) kept reusing a
  socket up to the moment the server closed it, racing the close;
- each tool's own request bytes, as captured from it, answered in full on a connection kept
  open or closed as the request asked.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchplace.serve.http import HttpServer, Response
from torchplace.serve.running import ServerThread

from .conftest import test_config

KEEPALIVE_S = 2.5
HINT = b"keep-alive: timeout=2\r\n"
INFER = b"/v2/models/seed-mlp/infer"
BODY = b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,8],"data":[1,2,3,4,5,6,7,8]}]}\n'


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    thread = ServerThread(test_config(device="cpu", keepalive_timeout_s=KEEPALIVE_S)).start(120)
    try:
        yield thread
    finally:
        thread.stop()


def _read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """One answer's head (lower-cased) and body, read by its Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer's head: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    head = head.lower()
    length = int(head.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed {length - len(body)} bytes short of the body"
        body += chunk
    assert len(body) == length, "more bytes than the answer's Content-Length"
    return head, body


def _closed(sock: socket.socket) -> bool:
    """The server closed the connection (nothing more to read within a second)."""
    sock.settimeout(1.0)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


def test_ab_keep_alive_over_http_1_0_is_told_how_long_the_connection_is_kept(
    server: ServerThread,
) -> None:
    """``ab -k -p body.json -T application/json``'s request, byte for byte (HTTP/1.0, its
    ``Content-length`` spelling): answered on one connection, each answer saying it is kept and
    for how long, as Apache's own answers to ``ab`` do."""
    host = b"127.0.0.1:%d" % server.port
    request = (
        b"POST %s HTTP/1.0\r\nConnection: Keep-Alive\r\nContent-length: %d\r\n"
        b"Content-type: application/json\r\nHost: %s\r\nUser-Agent: ApacheBench/2.3\r\n"
        b"Accept: */*\r\n\r\n%s" % (INFER, len(BODY), host, BODY)
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        for _ in range(3):
            sock.sendall(request)
            head, body = _read_answer(sock)
            assert head.startswith(b"http/1.1 200 ok\r\n"), head
            assert b"\r\nconnection: keep-alive\r\n" in head + b"\r\n"
            assert HINT in head + b"\r\n"
            assert json.loads(body)["outputs"][0]["shape"] == [1, 2]
        assert not _closed(sock)


#: each tool's request as it sent it (captured on a listening socket), the body ``BODY``, and
#: whether it asks to keep the connection with ``Connection: keep-alive``
_CAPTURED = {
    "hey": (
        b"POST {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: hey/0.0.1\r\nContent-Length: {n}\r\n"
        b"Content-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n",
        False,
    ),
    "siege": (
        b"POST {path} HTTP/1.1\r\nHost: {host}\r\nAccept: */*\r\nAccept-Encoding: gzip, deflate\r\n"
        b"User-Agent: Mozilla/5.0 (pc-x86_64-linux-gnu) Siege/4.0.7\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: {n}\r\n\r\n",
        False,
    ),
    "wget": (
        b"POST {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: Wget/1.21.3\r\nAccept: */*\r\n"
        b"Accept-Encoding: identity\r\nConnection: Keep-Alive\r\nContent-Type: application/json\r\n"
        b"Content-Length: {n}\r\n\r\n",
        True,
    ),
    "h2load --h1": (
        b"POST {path} HTTP/1.1\r\nHost: {host}\r\nuser-agent: h2load nghttp2/1.52.0\r\n"
        b"content-type: application/json\r\nContent-Length: {n}\r\n\r\n",
        False,
    ),
    "locust FastHttpUser": (
        b"POST {path} HTTP/1.1\r\nUser-Agent: python/gevent-http-client-2.6.1\r\n"
        b"Content-Type: application/json\r\nAccept-Encoding: gzip, deflate, br\r\nHost: {host}\r\n"
        b"Content-Length: {n}\r\n\r\n",
        False,
    ),
    "urllib3, Keep-Alive: timeout=5, max=100": (
        b"POST {path} HTTP/1.1\r\nHost: {host}\r\nAccept-Encoding: identity\r\n"
        b"Content-Length: {n}\r\nUser-Agent: python-urllib3/2.8.0\r\n"
        b"Content-Type: application/json\r\nConnection: Keep-Alive\r\n"
        b"Keep-Alive: timeout=5, max=100\r\n\r\n",
        True,
    ),
    "node http.Agent": (
        b"POST {path} HTTP/1.1\r\nContent-Type: application/json\r\nHost: {host}\r\n"
        b"Connection: keep-alive\r\nContent-Length: {n}\r\n\r\n",
        True,
    ),
}


@pytest.mark.parametrize("tool", sorted(_CAPTURED))
def test_each_tools_request_is_answered_and_the_connection_kept_as_it_asks(
    server: ServerThread, tool: str
) -> None:
    """Twice on one connection unless the tool asks to close (siege by default): each answer
    whole by its Content-Length; the keep-alive hint only where ``Connection: keep-alive`` was
    asked for (an HTTP/1.1 answer kept by default carries no extra field)."""
    template, asks = _CAPTURED[tool]
    head_bytes = (
        template.replace(b"{path}", INFER)
        .replace(b"{host}", b"127.0.0.1:%d" % server.port)
        .replace(b"{n}", b"%d" % len(BODY))
    )
    closes = b"Connection: close" in head_bytes
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        for _ in range(1 if closes else 2):
            sock.sendall(head_bytes + BODY)
            head, body = _read_answer(sock)
            assert head.startswith(b"http/1.1 200 ok\r\n"), head
            assert (HINT in head + b"\r\n") is asks, head
            assert (b"\r\nconnection: close" in head) is closes, head
            if b"\r\ncontent-encoding: gzip" in head:  # asked for by hey, siege and locust
                body = gzip.decompress(body)
            assert json.loads(body)["model_name"] == "seed-mlp"
        assert _closed(sock) is closes


@pytest.mark.parametrize(("seconds", "said"), [(0.5, 0), (2.5, 2), (60.0, 60), (1e12, 2**31 - 1)])
def test_the_hint_is_the_keepalive_timeout_rounded_down(seconds: float, said: int) -> None:
    """Never more time than the client has (the server closes an idle connection within a
    second after ``--keepalive-timeout``); set again, said again."""

    async def main() -> None:
        server = HttpServer(
            lambda request: Response(200), max_body_bytes=1024, request_timeout_s=5.0
        )
        assert b"timeout=60\r\n" in server.keep_alive_header
        server.keepalive_timeout_s = seconds
        await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: keep-alive\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            writer.close()
        finally:
            await server.close()
        assert b"\r\nconnection: keep-alive\r\nkeep-alive: timeout=%d\r\n" % said in head

    asyncio.run(main())


_NODE_AGENT = """
const http = require('http');
const agent = new http.Agent({ keepAlive: true, maxSockets: 1, timeout: 60000 });
const get = () => new Promise((resolve, reject) => {
  const req = http.get({ host: '127.0.0.1', port: +process.argv[2], path: '/v2/health/ready',
                         agent }, (res) => {
    res.resume();
    res.on('end', () => resolve({ status: res.statusCode, reused: req.reusedSocket }));
  });
  req.on('error', reject);
});
(async () => {
  const first = await get();
  await new Promise((r) => setTimeout(r, 1500));
  const second = await get();
  agent.destroy();
  console.log(JSON.stringify([first, second]));
})();
"""


def test_node_agent_drops_an_idle_socket_before_the_server_closes_it(
    server: ServerThread, tmp_path: Path
) -> None:
    """Node.js's ``http.Agent`` (keep-alive, with a ``timeout``, as its global agent has) takes
    the hint: told ``timeout=2``, it drops the idle socket after one second and connects afresh
    for the next request, rather than reusing one the server closes at 2.5 to 3.5 s (without
    the hint it reused it, racing that close)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node (Node.js) is not installed; the raw-byte tests above cover the server")
    script = tmp_path / "agent.js"
    script.write_text(_NODE_AGENT)
    out = subprocess.run(
        [node, str(script), str(server.port)], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    first, second = json.loads(out.stdout)
    assert first["status"] == second["status"] == 200
    assert second["reused"] is False


def test_ab_reports_no_failed_request_with_keep_alive(server: ServerThread, tmp_path: Path) -> None:
    """``ab -k -l`` (``-l``: answers of a batched model may differ in length, docs/serve.md)
    POSTing inferences: every request kept alive, none failed, none non-2xx."""
    ab = shutil.which("ab")
    if ab is None:
        pytest.skip("ab (apache2-utils) is not installed; the raw-byte test above sends its bytes")
    body = tmp_path / "body.json"
    body.write_bytes(BODY)
    url = f"http://127.0.0.1:{server.port}{INFER.decode()}"
    args = [ab, "-k", "-l", "-n", "200", "-c", "4", "-p", str(body), "-T", "application/json"]
    out = subprocess.run([*args, url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Complete requests:      200" in out.stdout
    assert "Failed requests:        0" in out.stdout
    assert "Keep-Alive requests:    200" in out.stdout
    assert "Non-2xx" not in out.stdout
