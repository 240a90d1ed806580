"""benchmarks/peers: answers compared as numbers, request bodies, venv stamps, the loopback
check, stopping every process a server started (also those that left its session) and the
lean references answering the model's numbers."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from peers import procs, venvs
from peers.catalog import APPS, PEERS, request_body


def test_answers_are_read_from_oip_and_from_nested_lists() -> None:
    oip = {"outputs": [{"name": "output", "data": [1.5, -2.0]}]}
    assert procs.flat_floats(oip) == [1.5, -2.0]
    assert procs.flat_floats([[1, 2], [3, [4]]]) == [1.0, 2.0, 3.0, 4.0]


def test_request_bodies_carry_one_row_in_each_format() -> None:
    oip = json.loads(request_body("oip", [0.5, 1.0]))
    assert oip["id"]  # KServe answers a v2 request without an id with a 500
    assert oip["inputs"][0]["shape"] == [1, 2]
    assert oip["inputs"][0]["data"] == [0.5, 1.0]
    assert json.loads(request_body("bentoml", [0.5])) == {"x": [[0.5]]}
    with pytest.raises(ValueError, match="'xml'"):
        request_body("xml", [0.5])


def test_every_peer_has_its_script_and_its_own_venv() -> None:
    names = [p.venv.name for p in PEERS]
    assert len(set(names)) == len(names)
    for peer in PEERS:
        assert peer.script_path.is_file(), peer.script
        assert peer.batching
    assert (APPS / "const_reply.py").is_file()


def test_a_venv_counts_as_built_only_with_its_exact_requirements(tmp_path: Path) -> None:
    spec = venvs.VenvSpec("demo", ("pkg==1",), ("pkg",))
    python = venvs.python_of(tmp_path, spec)
    python.parent.mkdir(parents=True)
    python.touch()
    assert not venvs.is_built(tmp_path, spec)
    (tmp_path / "demo" / venvs.STAMP).write_text(spec.key())
    assert venvs.is_built(tmp_path, spec)
    changed = venvs.VenvSpec("demo", ("pkg==2",), ("pkg",))
    assert not venvs.is_built(tmp_path, changed)


def test_listening_sockets_are_found_with_their_address() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        found = procs.listening([os.getpid()])
    assert f"127.0.0.1:{port}" in found
    assert all(procs.is_loopback(a) for a in found if a.endswith(f":{port}"))
    assert not procs.is_loopback("0.0.0.0:80")
    assert not procs.is_loopback(":::80")
    assert procs.is_loopback("::1:80")


_FORKER = """
import os, subprocess, sys, time
# a child that leaves the session, as some servers' workers do
subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(60)"])
time.sleep(60)
"""


def test_stop_ends_the_session_and_the_children_that_left_it() -> None:
    answered: list[int] = []

    def ready() -> None:
        if not answered:
            answered.append(1)
            raise RuntimeError("not yet")  # the first probe fails, as a starting server's

    with procs.running([sys.executable, "-c", _FORKER], ready, timeout=30) as started:
        deadline = time.monotonic() + 20
        while len(procs.members(started.proc.pid, started.marker)) < 2:
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        pids = procs.members(started.proc.pid, started.marker)
    assert answered == [1]
    time.sleep(0.2)
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists() and _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_server_that_exits_is_reported_with_its_log() -> None:
    argv = [sys.executable, "-c", "print('cannot start: no such model'); raise SystemExit(3)"]

    def never() -> None:
        raise RuntimeError("not ready")

    with (
        pytest.raises(RuntimeError, match=r"exited with 3:(.|\n)*no such model"),
        procs.running(argv, never, timeout=30),
    ):
        pass


def test_the_constant_reply_server_answers_every_request(tmp_path: Path) -> None:
    pytest.importorskip("httptools")
    reply = tmp_path / "reply.json"
    reply.write_text('{"outputs":[{"data":[1.0,2.0]}]}')
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}/anything"
    body = b'{"inputs":[]}'
    argv = [sys.executable, str(APPS / "const_reply.py"), str(port), str(reply)]
    with procs.running(
        argv, lambda: procs.check_answer(url, body, [1.0, 2.0], timeout=5), timeout=60
    ) as up:
        procs.check_answer(url, body, [1.0, 2.0])
        assert up.listens == [f"127.0.0.1:{port}"]
        with pytest.raises(RuntimeError, match=r"expected \[9.0"):
            procs.check_answer(url, body, [9.0, 9.0])


def test_the_constant_grpc_server_answers_what_perf_analyzer_asks(tmp_path: Path) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc")
    reply = tmp_path / "reply.json"
    data = [0.5] * 512
    out = {"name": "output", "datatype": "FP32", "shape": [1, 512], "data": data}
    reply.write_text(json.dumps({"outputs": [out]}))
    grpc_port, http_port = procs.free_port(), procs.free_port()
    argv = [sys.executable, str(APPS / "const_grpc.py"), str(grpc_port), str(http_port)]
    argv += ["wide-mlp", str(reply)]
    url = f"http://127.0.0.1:{http_port}/v2/models/wide-mlp/infer"
    with procs.running(
        argv, lambda: procs.check_answer(url, b"{}", data, timeout=5), timeout=60
    ) as up:
        assert all(procs.is_loopback(address) for address in up.listens)
        assert {int(a.rsplit(":", 1)[1]) for a in up.listens} == {grpc_port, http_port}
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert client.is_server_ready()
        assert client.is_model_ready("wide-mlp")
        config = client.get_model_config("wide-mlp", as_json=True)["config"]
        assert config["max_batch_size"] == 32
        assert config["input"][0]["dims"] == ["512"]
        metadata = client.get_model_metadata("wide-mlp", as_json=True)
        assert metadata["inputs"][0]["shape"] == ["-1", "512"]
        row = grpcclient.InferInput("input", [1, 512], "FP32")
        row.set_data_from_numpy(np.zeros((1, 512), np.float32))
        result = client.infer("wide-mlp", [row])
        np.testing.assert_array_equal(result.as_numpy("output"), np.full((1, 512), 0.5))
        client.close()


def _model_rows(model: str, rows: np.ndarray) -> np.ndarray:
    import torch

    from torchplace.models import build_model

    with torch.inference_mode():
        return build_model(model)(torch.from_numpy(rows)).numpy()


def test_the_lean_server_batches_requests_and_answers_the_models_numbers(tmp_path: Path) -> None:
    pytest.importorskip("httptools")
    from concurrent.futures import ThreadPoolExecutor

    port = procs.free_port()
    url = f"http://127.0.0.1:{port}/v2/models/seed-mlp/infer"
    rows = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    want = _model_rows("seed-mlp", rows)
    argv = [sys.executable, str(APPS / "lean_batcher.py"), "seed-mlp", str(port), "cpu", "1"]
    argv.append(str(tmp_path))

    def body(part: np.ndarray) -> bytes:
        tensor = {"name": "input", "datatype": "FP32", "shape": list(part.shape)}
        return json.dumps(
            {"id": "7", "inputs": [{**tensor, "data": part.ravel().tolist()}]}
        ).encode()

    def ask(part: np.ndarray, expected: np.ndarray) -> None:
        procs.check_answer(url, body(part), expected.ravel().tolist(), timeout=5)

    with procs.running(argv, lambda: ask(rows[:1], want[:1]), timeout=60) as up:
        assert up.listens == [f"127.0.0.1:{port}"]
        with ThreadPoolExecutor(4) as pool:  # together: rows of several requests in one batch
            parts = [(rows[:1], want[:1]), (rows[1:3], want[1:3]), (rows[3:], want[3:])]
            for done in [pool.submit(ask, *part) for part in parts * 4]:
                done.result()


def test_the_lean_grpc_server_answers_the_models_numbers(tmp_path: Path) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc")
    reply = tmp_path / "reply.json"
    rows = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    want = _model_rows("seed-mlp", rows)
    out = {"name": "output", "datatype": "FP32", "shape": [1, 2], "data": want[0].tolist()}
    reply.write_text(json.dumps({"outputs": [out]}))
    grpc_port, http_port = procs.free_port(), procs.free_port()
    argv = [sys.executable, str(APPS / "const_grpc.py"), str(grpc_port), str(http_port)]
    argv += ["seed-mlp", str(reply), "lean", "cpu", "1"]
    url = f"http://127.0.0.1:{http_port}/v2/models/seed-mlp/infer"
    with procs.running(
        argv, lambda: procs.check_answer(url, b"{}", out["data"], timeout=5), timeout=60
    ):
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        tensor = grpcclient.InferInput("input", [3, 8], "FP32")
        tensor.set_data_from_numpy(rows)
        result = client.infer("seed-mlp", [tensor])
        np.testing.assert_allclose(result.as_numpy("output"), want, rtol=1e-5, atol=1e-6)
        client.close()


def test_cpu_seconds_counts_every_thread_of_the_processes_and_nothing_for_gone_ones() -> None:
    import subprocess

    burn = "import threading,time\ndef f():\n  t=time.thread_time()+0.3\n  while time.thread_time()<t: pass\n"
    burn += "ts=[threading.Thread(target=f) for _ in range(2)]\n[t.start() for t in ts]\n[t.join() for t in ts]"
    child = subprocess.Popen([sys.executable, "-c", burn + "\nimport time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while procs.cpu_seconds([child.pid]) < 0.5 and time.monotonic() < deadline:
            time.sleep(0.05)
        used = procs.cpu_seconds([child.pid])
        assert used >= 0.5  # two threads' 0.3 s each, and the interpreter's start
        assert procs.cpu_seconds([child.pid, child.pid]) == pytest.approx(2 * used, abs=0.05)
    finally:
        child.kill()
        child.wait()
    assert procs.cpu_seconds([child.pid]) == 0.0


def test_the_wrk_script_keeps_a_body_with_closing_brackets_whole() -> None:
    from peers.load import lua_script

    body = request_body("bentoml", [0.5])  # {"x":[[0.5]]}: "]]" ends a plain Lua long string
    script = lua_script(body)
    assert f"[=[{body.decode()}]=]" in script
    assert "[[" not in script.replace(body.decode(), "")
