"""The load side of benchmarks/serve_vs_peers.py that runs without wrk: its Python client, and
how it tells which peers can run, against a real server on a loopback port."""

from __future__ import annotations

import socket
from types import ModuleType

import numpy as np
import pytest

from tests.scripts import benchmark_fixture

from .conftest import StartServer, seed_body

bench = benchmark_fixture("serve_vs_peers")


def _body() -> bytes:
    return seed_body(np.full((1, 8), 0.5, np.float32))


def test_the_python_client_keeps_connections_busy_and_counts_every_answer(
    bench: ModuleType, start_server: StartServer
) -> None:
    running = start_server()
    url = f"{running.url}/v2/models/seed-mlp/infer"
    answered, errors, elapsed, latencies = bench.client_worker(url, _body(), 0.3, 3)
    assert answered > 3
    assert errors == 0
    assert len(latencies) == answered
    assert elapsed >= 0.3
    assert running.engine.calls == answered  # every request reached the engine once


def test_non_2xx_answers_are_errors(bench: ModuleType, start_server: StartServer) -> None:
    running = start_server()
    url = f"{running.url}/v2/models/unknown/infer"
    answered, errors, _, _ = bench.client_worker(url, _body(), 0.2, 2)
    assert answered > 0
    assert errors == answered


def test_a_refused_connection_is_an_error_not_a_crash(bench: ModuleType) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        url = f"http://127.0.0.1:{port}/v2/models/seed-mlp/infer"
        answered, errors, _, _ = bench.client_worker(url, _body(), 0.1, 2)
    assert answered == 0
    assert errors == 2


def test_python_load_reports_what_wrk_reports(bench: ModuleType, start_server: StartServer) -> None:
    running = start_server()
    load = bench.PythonLoad(_body(), connections=4, processes=1)
    try:
        result = load(f"{running.url}/v2/models/seed-mlp/infer", 0.3)
    finally:
        load.close()
    assert set(result) == {"rps", "requests", "p50", "p99", "errors"}
    assert result["requests"] > 0
    assert result["rps"] > 0
    assert result["errors"] == 0
    assert 0 < result["p50"] <= result["p99"]


def test_peers_whose_packages_are_missing_are_named(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(bench.PEER_MODULES, "Demo", ("json", "torchplace_no_such_module"))
    assert bench.missing_modules("Demo") == ["torchplace_no_such_module"]
