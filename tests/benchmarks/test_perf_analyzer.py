"""benchmarks/perf_analyzer.py without a server: ``--quick``'s settings, that it installs
nothing, and how the gRPC-against-REST target is printed (no timing is measured here)."""

from __future__ import annotations

from types import ModuleType

import pytest

from peers import perf_client
from tests.scripts import benchmark_fixture

bench = benchmark_fixture("perf_analyzer")


def test_quick_keeps_every_sweep_short(bench: ModuleType) -> None:
    full, quick = bench.parse_args([]), bench.parse_args(["--quick"])
    assert (full.concurrency_range, full.interval_ms, full.max_trials) == ("1:33:8", 2000, 8)
    assert (full.stability, full.rounds, full.timeout) == (100, 5, 300)
    assert quick.interval_ms < full.interval_ms
    assert quick.max_trials < full.max_trials
    assert quick.rounds == 1
    assert quick.stability == perf_client.STABILITY_OFF  # a fixed number of windows
    assert quick.timeout < full.timeout
    assert bench.parse_args(["--quick", "--rounds", "3"]).rounds == 3


def test_quick_installs_nothing_a_missing_tool_is_a_skip_line(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    asked: list[bool] = []

    def ensure(install: bool = True) -> str:
        asked.append(install)
        return "not installed in /nowhere"

    monkeypatch.setattr(bench.perf_client, "ensure", ensure)
    assert bench.main(["--quick"]) == 0
    assert asked == [False]
    assert "SKIP perf_analyzer: not installed in /nowhere" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("rest", "grpc", "quick", "line", "status"),
    [
        (600.0, 650.0, False, "PASS gRPC req/s >= REST req/s", 0),
        (650.0, 600.0, False, "FAIL gRPC req/s >= REST req/s", 1),
        (650.0, 600.0, True, "INFO gRPC req/s >= REST req/s", 0),
    ],
)
def test_quick_prints_the_speed_target_as_information(
    bench: ModuleType,
    capsys: pytest.CaptureFixture[str],
    rest: float,
    grpc: float,
    quick: bool,
    line: str,
    status: int,
) -> None:
    assert bench.judge(rest, grpc, "wide-mlp", quick) == status
    out = capsys.readouterr().out
    assert line in out
    assert ("too short to judge speed" in out) is quick
