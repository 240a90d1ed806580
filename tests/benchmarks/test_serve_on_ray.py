"""benchmarks/serve_on_ray.py without Ray: ``--quick``'s settings and how its targets and
checks are judged from given results (no timing is measured here)."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.scripts import benchmark_fixture

bench = benchmark_fixture("serve_on_ray")


def _results(bench: ModuleType, *, failed: int = 0) -> dict[str, dict[str, object]]:
    """seed-mlp where torchplace on Ray misses every speed target (1x idiomatic)."""
    rates = {"tp_proxy": 100, "tp_direct": 100, "idiomatic": 100, "noop": 1000, "standalone": 300}
    results = {}
    for key, rate in rates.items():
        result = bench.Result(key, seconds=1.0, ok=rate, latencies=[0.01] * rate)
        result.failed = failed if key == "tp_direct" else 0
        results[key] = result
    return {"seed-mlp": results}


def test_quick_runs_seed_mlp_for_a_second_per_line(bench: ModuleType) -> None:
    full, quick = bench.parse_args([]), bench.parse_args(["--quick"])
    assert (full.seconds, full.models) == (5.0, "seed-mlp,wide-mlp")
    assert (quick.seconds, quick.models) == (bench.QUICK_SECONDS, "seed-mlp")
    assert quick.seconds < full.seconds
    assert bench.parse_args(["--quick", "--models", "wide-mlp"]).models == "wide-mlp"


def test_a_full_run_fails_the_missed_targets(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.report(_results(bench)) == 1
    out = capsys.readouterr().out
    assert "FAIL seed-mlp: torchplace on Ray (direct) >= 3x idiomatic" in out
    assert "answered every request" not in out


def test_quick_prints_the_speed_targets_as_information(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.report(_results(bench), quick=True) == 0
    out = capsys.readouterr().out
    assert "INFO seed-mlp: torchplace on Ray (direct) >= 3x idiomatic" in out
    assert "FAIL" not in out
    assert "--quick runs are too short to judge speed" in out
    assert "PASS seed-mlp: torchplace on Ray (direct) answered every request" in out


def test_quick_still_fails_a_failed_request(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.report(_results(bench, failed=2), quick=True) == 1
    out = capsys.readouterr().out
    assert "FAIL seed-mlp: torchplace on Ray (direct) answered every request" in out
    assert "failed 2" in out
