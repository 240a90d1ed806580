"""benchmarks/serve_overload.py without a server: ``--quick``'s settings and how its targets
are judged from given phases (no timing is measured here)."""

from __future__ import annotations

from collections import Counter
from types import ModuleType

import pytest

from tests.scripts import benchmark_fixture

bench = benchmark_fixture("serve_overload")


def _phase(bench: ModuleType, name: str, p99_ms: float, **statuses: int) -> object:
    phase = bench.Phase(name, seconds=1.0, statuses=Counter(statuses))
    phase.latencies = [p99_ms / 1e3] * 10
    return phase


def test_quick_runs_short_phases(bench: ModuleType) -> None:
    assert bench.parse_args([]).seconds == bench.SECONDS
    assert bench.parse_args(["--quick"]).seconds == bench.QUICK_SECONDS < bench.SECONDS
    assert bench.parse_args(["--quick", "--seconds", "5"]).seconds == 5


@pytest.mark.parametrize(("quick", "status"), [(False, 1), (True, 0)])
def test_quick_prints_the_latency_target_as_information(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], quick: bool, status: int
) -> None:
    half = _phase(bench, "half load", 10.0, **{"200": 10})
    double = _phase(bench, "2x load", 50.0, **{"200": 10, "503": 10})  # p99 5x: a miss
    assert bench.report(*bench.overload_checks(half, double, quick)) == status
    out = capsys.readouterr().out
    assert "PASS at 2x only 200 and 503" in out
    assert "PASS at 2x the excess is refused" in out
    verdict = "INFO" if quick else "FAIL"
    assert f"{verdict} accepted p99 at 2x" in out
    assert ("too short to judge latency" in out) is quick


def test_quick_still_fails_a_wrong_status(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    half = _phase(bench, "half load", 10.0, **{"200": 10})
    double = _phase(bench, "2x load", 10.0, **{"200": 10, "503": 5, "500": 1})
    assert bench.report(*bench.overload_checks(half, double, quick=True)) == 1
    assert "FAIL at 2x only 200 and 503" in capsys.readouterr().out
