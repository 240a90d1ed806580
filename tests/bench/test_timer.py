"""Timer and measure: the cold call apart, warm-up, counts from a time budget, rotating inputs,
the spread warning, and argument checks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torchplace
from torchplace.bench import timer as timer_module
from torchplace.bench.timer import Measurement, Timer, TimingWarning, measure
from torchplace.errors import ConfigError

from .fake_clock import FakeClock, scripted


def test_facade_exports_the_timer() -> None:
    assert torchplace.Timer is Timer
    assert torchplace.measure is measure
    assert torchplace.Measurement is Measurement


def test_cold_call_and_warmup_are_kept_out_of_the_warm_times() -> None:
    clock = FakeClock()
    fn, calls = scripted(clock, [0.250] + [0.050] * 4 + [0.002] * 6)
    m = measure(fn, device="cpu", warmup=4, repeats=6, clock=clock)
    assert len(calls) == 11
    assert m.cold_s == pytest.approx(0.250)
    assert m.cold_wall_s == pytest.approx(0.250)
    assert m.warmup == 4
    assert m.times_s == pytest.approx([0.002] * 6)
    assert m.cold_overhead_s == pytest.approx(0.248)
    assert m.wall_per_call_s == pytest.approx(0.002)


def test_min_time_estimates_the_count_from_the_warmup() -> None:
    clock = FakeClock()
    fn, calls = scripted(clock, [0.1] + [0.004] * 200)
    m = measure(fn, device="cpu", warmup=2, min_time=0.02, clock=clock)
    assert m.count == 5  # 0.02 s / 0.004 s per call
    assert len(calls) == 1 + 2 + 5


def test_min_time_count_is_bounded() -> None:
    clock = FakeClock()
    fn, _ = scripted(clock, [0.001] * 100)
    assert measure(fn, device="cpu", warmup=1, min_time=10.0, max_repeats=7, clock=clock).count == 7
    fn, _ = scripted(clock, [1.0] * 100)
    m = measure(fn, device="cpu", warmup=1, min_time=0.01, min_repeats=4, clock=clock)
    assert m.count == 4


def test_min_time_without_warmup_uses_the_cold_call() -> None:
    clock = FakeClock()
    fn, _ = scripted(clock, [0.01] * 100)
    assert measure(fn, device="cpu", warmup=0, min_time=0.05, clock=clock).count == 5


def test_inputs_rotate_across_every_call() -> None:
    seen: list[int] = []
    sets = [(0, "a"), (1, "b"), (2, "c")]

    def fn(i: int, tag: str) -> None:
        assert sets[i][1] == tag
        seen.append(i)

    m = measure(fn, device="cpu", warmup=2, repeats=7, inputs=sets, spread_warning=None)
    assert m.input_sets == 3
    assert seen == [k % 3 for k in range(1 + 2 + 7)]


def test_non_tuple_inputs_are_passed_as_one_argument() -> None:
    tensors = [torch.ones(2), torch.zeros(3)]
    seen: list[int] = []
    measure(
        lambda t: seen.append(t.numel()),
        device="cpu",
        warmup=0,
        repeats=3,
        inputs=tensors,
        spread_warning=None,
    )
    assert seen == [2, 3, 2, 3]


def test_large_spread_warns() -> None:
    clock = FakeClock()
    fn, _ = scripted(clock, [0.001, 0.001, 0.001, 0.005, 0.009, 0.001])
    with pytest.warns(TimingWarning, match="spread is large"):
        measure(fn, device="cpu", warmup=0, repeats=5, clock=clock, label="noisy")


def test_small_spread_or_disabled_check_does_not_warn() -> None:
    clock = FakeClock()
    fn, _ = scripted(clock, [0.001] * 6)
    measure(fn, device="cpu", warmup=0, repeats=5, clock=clock)  # warnings are errors here
    fn, _ = scripted(clock, [0.001, 0.001, 0.001, 0.005, 0.009, 0.001])
    measure(fn, device="cpu", warmup=0, repeats=5, clock=clock, spread_warning=None)


def test_timing_warning_is_a_runtime_warning() -> None:
    assert issubclass(TimingWarning, RuntimeWarning)


def test_real_cpu_measurement() -> None:
    x = torch.randn(64, 64)
    m = measure(lambda: x @ x, device="cpu", repeats=5, spread_warning=None, label="mm")
    assert m.count == 5
    assert m.device == "cpu"
    assert m.clock == "cpu perf_counter"
    assert 0 < m.min_s <= m.median_s <= m.max_s
    assert m.cold_s > 0
    assert "mm on cpu" in str(m)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"warmup": -1}, "warmup"),
        ({"warmup": 1.5}, "warmup"),
        ({"repeats": 0}, "repeats"),
        ({"repeats": True}, "repeats"),
        ({"repeats": 3, "min_time": 0.1}, "not both"),
        ({"min_time": 0}, "min_time"),
        ({"min_time": float("nan")}, "min_time"),
        ({"spread_warning": 0}, "spread_warning"),
        ({"min_repeats": 5, "max_repeats": 2}, "max_repeats"),
        ({"clock": 3}, "clock"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Timer(device="cpu", **kwargs)


def test_bad_call_arguments() -> None:
    timer = Timer(device="cpu", repeats=1)
    with pytest.raises(ConfigError, match="callable"):
        timer.measure(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="non-empty"):
        timer.measure(lambda: None, inputs=[])


def test_timer_defaults_and_repr() -> None:
    timer = Timer(device="cpu")
    assert timer.min_time == timer_module.DEFAULT_MIN_TIME
    assert timer.repeats is None
    assert timer.device == torch.device("cpu")
    assert "min_time=0.2" in repr(timer)
    assert timer.clock_name == "cpu perf_counter"


@pytest.mark.cuda
def test_cuda_events_time_the_device_work() -> None:
    a = torch.randn(2048, 2048, device="cuda")
    m = measure(lambda: a @ a, device="cuda", warmup=2, repeats=10, spread_warning=None)
    assert m.clock == "cuda events"
    assert m.count == 10
    assert 0 < m.min_s <= m.median_s <= m.max_s
    assert m.wall_per_call_s > 0
    assert m.device.startswith("cuda:")


@pytest.mark.cuda
def test_cuda_events_follow_the_timers_device() -> None:
    index = torch.cuda.device_count() - 1
    a = torch.randn(512, 512, device=f"cuda:{index}")
    m = measure(lambda: a @ a, device=f"cuda:{index}", repeats=3, spread_warning=None)
    assert m.device == f"cuda:{index}"


def test_a_clock_that_does_not_move_gives_the_largest_count() -> None:
    clock = FakeClock()
    m = measure(
        lambda: None,
        device="cpu",
        warmup=0,
        min_time=1.0,
        max_repeats=9,
        clock=clock,
        spread_warning=None,
    )
    assert m.count == 9
    assert m.spread == 0.0
