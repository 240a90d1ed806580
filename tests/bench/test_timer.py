from __future__ import annotations

import contextlib
import dataclasses
import statistics
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import torchplace
from torchplace.bench import clocks
from torchplace.bench import timer as timer_module
from torchplace.bench.timer import Measurement, Timer, TimingWarning, measure
from torchplace.errors import ConfigError, DeviceError, TimingError


class FakeClock:
    """A nanosecond clock that only moves when the timed function says so."""

    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += round(seconds * 1e9)


def scripted(clock: FakeClock, durations: list[float]) -> tuple[Any, list[float]]:
    """A function whose k-th call takes durations[k] seconds on ``clock``."""
    remaining: Iterator[float] = iter(durations)
    calls: list[float] = []

    def fn() -> None:
        d = next(remaining)
        calls.append(d)
        clock.advance(d)

    return fn, calls


def test_facade_exports_the_timer() -> None:
    assert torchplace.Timer is Timer
    assert torchplace.measure is measure
    assert torchplace.Measurement is Measurement


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


def test_meta_cannot_be_timed() -> None:
    with pytest.raises(TimingError, match="meta"):
        measure(lambda: None, device="meta", repeats=1)
    with pytest.raises(TimingError, match="meta"):
        Timer(device=torch.device("meta"))


def test_accelerator_without_events_cannot_be_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoEvents:
        def synchronize(self) -> None:
            pass

    monkeypatch.setattr(torch, "fpga", NoEvents(), raising=False)
    with pytest.raises(TimingError, match="no timing events"):
        clocks.backend_for(torch.device("fpga"), FakeClock())
    monkeypatch.delattr(torch, "fpga")
    with pytest.raises(TimingError, match="no timing events"):
        clocks.backend_for(torch.device("fpga"), FakeClock())


def test_unavailable_cuda_is_refused() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises((DeviceError, TimingError)):
        Timer(device="cuda:0")
    with pytest.raises(TimingError, match="CUDA is not available"):
        clocks.backend_for(torch.device("cuda", 0), FakeClock())


class FakeEvent:
    log: list[str]

    def __init__(self, clock: FakeClock, log: list[str], enable_timing: bool = False) -> None:
        assert enable_timing
        self.clock, self.log, self.at = clock, log, -1

    def record(self, stream: object = None) -> None:
        self.at = self.clock.now
        self.log.append("record")

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at >= 0, "read before record"
        assert end.at >= 0, "read before record"
        return (end.at - self.at) / 1e6  # milliseconds, like torch


class FakeAccelerator:
    """Stands in for torch.cuda: events read the fake clock; sync is logged."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.log: list[str] = []

    def Event(self, enable_timing: bool = False) -> FakeEvent:
        return FakeEvent(self.clock, self.log, enable_timing)

    def synchronize(self) -> None:
        self.log.append("sync")


def test_event_backend_uses_one_event_pair_per_call_and_syncs_at_block_edges() -> None:
    clock = FakeClock()
    accel = FakeAccelerator(clock)
    backend = clocks.EventBackend(torch.device("cpu"), accel, clock)
    fn, _ = scripted(clock, [0.003, 0.001, 0.002, 0.004])
    times, wall = backend.time_block(lambda k: fn(), 4)
    assert times == pytest.approx([0.003, 0.001, 0.002, 0.004])
    assert wall == pytest.approx(0.0025)
    assert accel.log == ["sync"] + ["record", "record"] * 4 + ["sync"]
    accel.log.clear()
    fn, _ = scripted(clock, [0.5])
    cold, cold_wall = backend.time_one(fn)
    assert (cold, cold_wall) == pytest.approx((0.5, 0.5))
    assert accel.log == ["sync", "record", "record", "sync"]


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


class FakeCuda(FakeAccelerator):
    """torch.cuda as the event backend sees it: a device context and per-device sync."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.current = 0

    @contextlib.contextmanager
    def device(self, device: torch.device) -> Iterator[None]:
        previous, self.current = self.current, device.index
        self.log.append(f"enter cuda:{device.index}")
        try:
            yield
        finally:
            self.current = previous
            self.log.append("exit")

    def synchronize(self, device: torch.device | None = None) -> None:  # type: ignore[override]
        assert device is not None, "synchronize() without a device waits for the wrong GPU"
        self.log.append(f"sync {device}")


def test_cuda_events_are_recorded_with_the_timers_device_current() -> None:
    # Events record on the current stream of the *current* device: a timer for cuda:1 must
    # make cuda:1 current around its events and wait for cuda:1, not the default device.
    clock = FakeClock()
    cuda = FakeCuda(clock)
    recorded_on: list[int] = []

    class Event(FakeEvent):
        def record(self, stream: object = None) -> None:
            recorded_on.append(cuda.current)
            super().record(stream)

    def make_event(enable_timing: bool = False) -> Event:
        return Event(clock, cuda.log, enable_timing)

    cuda.Event = make_event  # type: ignore[method-assign]
    backend = clocks.EventBackend(torch.device("cuda", 1), cuda, clock)
    fn, _ = scripted(clock, [0.002, 0.001, 0.003])
    times, _ = backend.time_block(lambda k: fn(), 3)
    assert times == pytest.approx([0.002, 0.001, 0.003])
    assert recorded_on == [1] * 6
    assert cuda.log[0] == "enter cuda:1"
    assert cuda.log[1] == "sync cuda:1"
    assert cuda.log[-2:] == ["sync cuda:1", "exit"]
    assert backend.clock_name == "cuda events"
