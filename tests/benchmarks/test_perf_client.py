"""benchmarks/peers/perf_client.py without the binary: its command line, the figures read from
perf_analyzer's output, and a failed run as an error with the output's end."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from peers import perf_client

OUTPUT = """\
*** Measurement Settings ***
  Batch size: 1
Request concurrency: 32
  Client:
    Request count: 4835
    Throughput: 662.366 infer/sec
    Avg latency: 48197 usec (standard deviation 19160 usec)
    p50 latency: 43982 usec
    p90 latency: 69478 usec
    p95 latency: 82108 usec
    p99 latency: 109041 usec
Inferences/Second vs. Client Average Batch Latency
Concurrency: 32, throughput: 662.366 infer/sec, latency 48197 usec
"""


def test_the_command_sends_one_row_and_binary_tensors_over_http() -> None:
    args = perf_client.command(
        "wide-mlp", "127.0.0.1:8000", "http", "32:32:1", interval_ms=1000, max_trials=6,
        stability=100,
    )  # fmt: skip
    assert args[:8] == ["-m", "wide-mlp", "-u", "127.0.0.1:8000", "-i", "http", "-b", "1"]
    assert "--input-tensor-format" in args
    assert "--output-tensor-format" in args
    grpc = perf_client.command(
        "wide-mlp", "127.0.0.1:8001", "grpc", "32:32:1", interval_ms=1000, max_trials=6,
        stability=100,
    )  # fmt: skip
    assert "--input-tensor-format" not in grpc  # perf_analyzer refuses it over gRPC
    assert "--shared-memory" not in grpc
    shm = perf_client.command(
        "wide-mlp", "127.0.0.1:8001", "grpc", "32:32:1", interval_ms=1000, max_trials=6,
        stability=100, shared_memory="system",
    )  # fmt: skip
    assert shm[-2:] == ["--shared-memory", "system"]


def test_the_summary_reads_throughput_count_and_latencies_in_ms() -> None:
    assert perf_client.summary(OUTPUT) == {
        "rps": 662.366,
        "requests": 4835,
        "p50": 43.982,
        "p99": 109.041,
    }
    assert perf_client.rates(OUTPUT) == {32: 662.366}


def _tool(tmp_path: Path, stdout: str, returncode: int) -> perf_client.PerfAnalyzer:
    class Fake(perf_client.PerfAnalyzer):
        def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
            self.env["seen"] = " ".join(args)
            return subprocess.CompletedProcess(args, returncode, stdout, "")

    return Fake(tmp_path / "perf_analyzer", {})


def test_a_load_measures_three_windows_of_a_third_of_the_time(tmp_path: Path) -> None:
    tool = _tool(tmp_path, OUTPUT, 0)
    load = perf_client.PerfLoad(tool, "wide-mlp", "grpc", 32)
    result = load("127.0.0.1:8001", 6.0)
    assert result["rps"] == 662.366
    assert result["errors"] == 0
    assert "--concurrency-range 32:32:1 -p 2000" in tool.env["seen"]
    assert load.describe() == "perf_analyzer (gRPC, 32 concurrent requests)"


def test_a_failed_run_is_an_error_with_the_end_of_its_output(tmp_path: Path) -> None:
    tool = _tool(tmp_path, "error: failed to get model config: Not Found", 1)
    load = perf_client.PerfLoad(tool, "wide-mlp", "http", 32)
    with pytest.raises(RuntimeError, match="failed to get model config"):
        load("127.0.0.1:8000", 3.0)
    with pytest.raises(ValueError, match="'http' or 'grpc'"):
        perf_client.PerfLoad(tool, "wide-mlp", "tcp", 32)


def test_without_install_a_missing_binary_is_a_reason(tmp_path: Path) -> None:
    why = perf_client.ensure(install=False, venv=tmp_path / "absent")
    assert isinstance(why, str)
    assert "not installed" in why
