"""benchmarks/serve_profile.py's options: ``--quick`` times fewer runs per stage."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.scripts import benchmark_fixture

bench = benchmark_fixture("serve_profile")


def test_quick_times_fewer_runs_per_stage(bench: ModuleType) -> None:
    assert bench.parse_args([]).repeat == bench.REPEAT
    assert bench.parse_args(["--quick"]).repeat == bench.QUICK_REPEAT < bench.REPEAT
    assert bench.parse_args(["--quick", "--repeat", "50"]).repeat == 50


def test_a_repeat_below_one_is_a_usage_error(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--repeat", "0"])
    assert exc.value.code == 2
    assert "--repeat 0" in capsys.readouterr().err
