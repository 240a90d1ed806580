"""The clock backends: devices that cannot be timed honestly are refused; one event pair per
call on an accelerator, read after one synchronisation, with the timer's device current."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from torchplace.bench import clocks
from torchplace.bench.timer import Timer, measure
from torchplace.errors import DeviceError, TimingError

from .fake_clock import FakeClock, scripted


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
    with pytest.raises(DeviceError, match="cuda:0"):  # resolve_device's, with the fix (bench.md)
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
