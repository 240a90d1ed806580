"""Measurement: the statistics of the warm times, frozen, serialised and printed."""

from __future__ import annotations

import dataclasses
import statistics

import numpy as np
import pytest

from torchplace.bench.timer import Measurement, measure
from torchplace.errors import ConfigError

from .fake_clock import FakeClock, scripted


@pytest.mark.parametrize(
    "warm",
    [
        [9, 1, 8, 2, 7, 3, 6, 4, 5],
        [0.5, 0.5, 0.5, 0.5],
        [1, 1, 1, 100, 1, 2, 3],
        [42.0],
    ],
)
def test_statistics_match_numpy_on_known_sequences(warm: list[float]) -> None:
    clock = FakeClock()
    warm_s = [w * 1e-3 for w in warm]
    fn, _ = scripted(clock, [0.5, *warm_s])
    m = measure(fn, device="cpu", warmup=0, repeats=len(warm), clock=clock, spread_warning=None)
    assert m.count == len(warm)
    assert m.times_s == pytest.approx(warm_s)
    assert m.median_s == pytest.approx(float(np.median(warm_s)))
    q1, q3 = np.percentile(warm_s, [25, 75])
    assert m.q1_s == pytest.approx(q1)
    assert m.q3_s == pytest.approx(q3)
    assert m.iqr_s == pytest.approx(q3 - q1)
    assert m.min_s == pytest.approx(min(warm_s))
    assert m.max_s == pytest.approx(max(warm_s))
    assert m.mean_s == pytest.approx(statistics.fmean(warm_s))
    assert m.spread == pytest.approx((q3 - q1) / np.median(warm_s))


def test_measurement_is_frozen_and_serialises() -> None:
    m = Measurement(
        label="x",
        device="cpu",
        clock="cpu perf_counter",
        times_s=(0.001, 0.003, 0.002),
        cold_s=0.01,
        cold_wall_s=0.01,
        wall_per_call_s=0.002,
        warmup=1,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.label = "y"  # type: ignore[misc]
    d = m.to_dict()
    assert d["median_s"] == pytest.approx(0.002)
    assert d["count"] == 3
    assert "times_s" not in d
    assert m.to_dict(include_times=True)["times_s"] == [0.001, 0.003, 0.002]
    text = str(m)
    for word in ("median 2 ms", "IQR", "min 1 ms", "max 3 ms", "n=3", "cold first call 10 ms"):
        assert word in text


def test_measurement_needs_times() -> None:
    with pytest.raises(ConfigError, match="at least one"):
        Measurement("x", "cpu", "c", (), 0.0, 0.0, 0.0, 0)
