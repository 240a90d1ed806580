"""``torchplace serve --engine ray`` against a cluster made with ``ray start`` (head + two
workers on loopback, the same auth mode and token on every node), started once.

Every ``ray start`` runs with ``--block`` in its own process group, so the test stops exactly
the processes it started (never ``ray stop``, which stops every Ray on the machine).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

if importlib.util.find_spec("ray") is None:
    pytest.skip(
        "the Ray tests need Ray Serve: pip install torchplace[ray]", allow_module_level=True
    )
tritonhttp = pytest.importorskip("tritonclient.http")

from tests.serve.ray_cluster import LOOPBACK, free_port, ray_environment, wait_for  # noqa: E402
from torchplace.models import build_model  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BIN = Path(sys.executable).parent

#: ``ray start`` (Ray's own CLI entry point), keeping 127.0.0.1 as given. Ray 2.60's
#: ``ray start --address`` refuses to join with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, and with
#: it on, it replaces 127.0.0.1 in --address and --node-ip-address by the machine's network
#: address; this keeps the addresses it was given.
_LOOPBACK_RAY_START = """
import sys
import ray._private.services as services
services.resolve_ip_for_localhost = lambda host: host
from ray.scripts.scripts import main
sys.argv = ["ray", *sys.argv[1:]]
main()
"""


def _spawn(
    args: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )


def _stop(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _node_ports() -> list[str]:
    ports = {
        "--node-manager-port": free_port(),
        "--object-manager-port": free_port(),
        "--metrics-export-port": free_port(),
        "--dashboard-agent-listen-port": free_port(),
        "--dashboard-agent-grpc-port": free_port(),
        "--runtime-env-agent-port": free_port(),
    }
    return [f"{flag}={port}" for flag, port in ports.items()]


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, Path]]:
    """``ray start --head`` and ``ray start --address`` twice; yields the GCS address."""
    with tempfile.TemporaryDirectory(prefix="tpcli") as raw, ray_environment(Path(raw)) as env:
        tmp = Path(raw)
        assert env["RAY_AUTH_MODE"] == "token"  # the same mode and token file on every node
        gcs = f"{LOOPBACK}:{free_port()}"
        common = ["--node-ip-address", LOOPBACK, "--num-cpus", "1", "--block"]
        started: list[subprocess.Popen[bytes]] = []
        try:
            head = [str(BIN / "ray"), "start", "--head", "--port", gcs.split(":")[1]]
            head += ["--temp-dir", str(tmp / "ray"), "--include-dashboard", "false"]
            head += ["--num-gpus", "0", "--disable-usage-stats", *common, *_node_ports()]
            started.append(_spawn(head, tmp / "head.log"))
            wait_for("the head node", lambda: "Ray runtime started" in _log(tmp / "head.log"), 90)
            for i in range(2):
                started.append(_start_worker(gcs, common, tmp / f"worker{i}.log"))
            yield gcs, tmp
        finally:
            for proc in reversed(started):
                _stop(proc)


def _start_worker(gcs: str, common: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``ray start --address`` one node at a time; once more if it did not come up (Ray gives
    a node's raylet a fixed 30 s to register, which a loaded 2-core machine can miss)."""
    worker = [sys.executable, "-c", _LOOPBACK_RAY_START, "start", "--address", gcs]
    worker += ["--num-gpus", "1", *common]
    multi = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}
    for _attempt in range(2):
        proc = _spawn([*worker, *_node_ports()], log, multi)
        up = wait_for("a worker node", lambda p=proc: _state(p, log), 120)
        if up == "up":
            return proc
        _stop(proc)
    raise AssertionError(f"a worker node did not start twice: {_log(log)[-2000:]}")


def _state(proc: subprocess.Popen[bytes], log: Path) -> str | None:
    if "Ray runtime started" in _log(log):
        return "up"
    return "down" if proc.poll() is not None else None


def _log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_cli_deploys_on_a_ray_start_cluster(cluster: tuple[str, Path]) -> None:
    gcs, tmp = cluster
    port = free_port()
    serve = [str(BIN / "torchplace"), "serve", "--engine", "ray", "--address", gcs]
    serve += ["--replicas", "2", "--gpus-per-replica", "1", "--max-replicas-per-node", "1"]
    serve += ["--ray-device-override", "cpu", "--ray-proxy", "HeadOnly"]
    serve += ["--host", LOOPBACK, "--port", str(port), "--max-batch-size", "8"]
    proc = _spawn(serve, tmp / "serve.log")
    try:

        def records() -> list[dict[str, object]] | None:
            if proc.poll() is not None:
                raise AssertionError(f"torchplace serve exited: {_log(tmp / 'serve.log')[-3000:]}")
            found = [
                json.loads(line)
                for line in _log(tmp / "serve.log").splitlines()
                if line.startswith('{"') and "torchplace.serve.ray.replica" in line
            ]
            return found if len(found) == 2 else None

        try:
            found = wait_for("two replica records from the CLI", records, 90, every=1.0)
        except AssertionError as exc:
            logs = {p.name: _log(p)[-1500:] for p in sorted(tmp.glob("*.log"))}
            raise AssertionError(f"{exc}; logs: {logs}") from None
        assert len({r["node_id"] for r in found}) == 2
        assert all(r["node_ip"] == LOOPBACK and r["devices"] == ["cpu"] for r in found)
        client = tritonhttp.InferenceServerClient(f"{LOOPBACK}:{port}")
        wait_for("the proxy ready", client.is_server_ready, 60)
        rows = np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)
        tensor = tritonhttp.InferInput("input", [3, 8], "FP32")
        tensor.set_data_from_numpy(rows)
        answer = client.infer("seed-mlp", [tensor]).as_numpy("output")
        client.close()
        with torch.no_grad():
            expected = build_model("seed-mlp")(torch.from_numpy(rows)).numpy()
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-6)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        _stop(proc)
