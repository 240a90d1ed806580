"""What per-call times are measured with, one backend per kind of device.

On the CPU every call is timed with a monotonic host clock (:class:`CpuBackend`). On an
accelerator every call is bracketed by its own pair of timing events, recorded back to back on
the current stream, and the events are read only after one synchronisation at the end of the
block (:class:`EventBackend`). :func:`backend_for` picks one, or raises
:class:`~torchplace.errors.TimingError` for a device that cannot be timed honestly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from torchplace.errors import TimingError

if TYPE_CHECKING:
    import torch

__all__ = ["Clock", "ClockBackend", "CpuBackend", "EventBackend", "backend_for"]

Clock = Callable[[], int]
"""A monotonic clock in integer nanoseconds, such as :func:`time.perf_counter_ns`."""


class ClockBackend(Protocol):
    """Times calls on one device: the primary clock and a synchronised wall clock."""

    clock_name: str

    def time_one(self, call: Callable[[], object]) -> tuple[float, float]:
        """(primary seconds, synchronised wall seconds) of one call."""

    def time_block(self, calls: Callable[[int], object], n: int) -> tuple[list[float], float]:
        """Per-call primary seconds of ``n`` calls and the synchronised wall seconds per call."""

    def synchronize(self) -> None: ...


class CpuBackend:
    """The monotonic host clock: CPU work is done when the call returns."""

    clock_name = "cpu perf_counter"

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def synchronize(self) -> None:
        """Nothing to wait for: CPU work is done when the call returns."""

    def time_one(self, call: Callable[[], object]) -> tuple[float, float]:
        clock = self._clock
        start = clock()
        call()
        elapsed = (clock() - start) * 1e-9
        return elapsed, elapsed

    def time_block(self, calls: Callable[[int], object], n: int) -> tuple[list[float], float]:
        clock = self._clock
        times = [0.0] * n
        block_start = clock()
        for k in range(n):
            start = clock()
            calls(k)
            times[k] = (clock() - start) * 1e-9
        wall = (clock() - block_start) * 1e-9
        return times, wall / n


class EventBackend:
    """Timing events of an accelerator module (``torch.cuda`` and friends)."""

    def __init__(self, device: torch.device, module: Any, clock: Clock) -> None:
        self._device = device
        self._module = module
        self._clock = clock
        self.clock_name = f"{device.type} events"

    def synchronize(self) -> None:
        if self._device.type == "cuda":
            self._module.synchronize(self._device)
        else:
            self._module.synchronize()

    def _event(self) -> Any:
        return self._module.Event(enable_timing=True)

    def _on_device(self) -> contextlib.AbstractContextManager[object]:
        # Events record on the current stream of the current device: make ours current.
        if self._device.type == "cuda":
            return cast(
                "contextlib.AbstractContextManager[object]", self._module.device(self._device)
            )
        return contextlib.nullcontext()

    def time_one(self, call: Callable[[], object]) -> tuple[float, float]:
        with self._on_device():
            start, end = self._event(), self._event()
            self.synchronize()
            wall_start = self._clock()
            start.record()
            call()
            end.record()
            self.synchronize()
            wall = (self._clock() - wall_start) * 1e-9
        return float(start.elapsed_time(end)) * 1e-3, wall

    def time_block(self, calls: Callable[[int], object], n: int) -> tuple[list[float], float]:
        with self._on_device():
            starts = [self._event() for _ in range(n)]
            ends = [self._event() for _ in range(n)]
            self.synchronize()
            wall_start = self._clock()
            # No synchronisation inside the loop: the events are read after the block, so the
            # host keeps the device queue fed and per-call times are device times, not launch
            # latency.
            for k in range(n):
                starts[k].record()
                calls(k)
                ends[k].record()
            self.synchronize()
            wall = (self._clock() - wall_start) * 1e-9
        times = [float(s.elapsed_time(e)) * 1e-3 for s, e in zip(starts, ends, strict=True)]
        return times, wall / n


def backend_for(device: torch.device, clock: Clock) -> ClockBackend:
    """The backend that times ``device`` honestly, or :class:`~torchplace.errors.TimingError`."""
    import torch

    if device.type == "cpu":
        return CpuBackend(clock)
    if device.type == "meta":
        raise TimingError(
            "cannot time on the 'meta' device: it records shapes but runs no kernels, so any "
            "time would be the Python overhead alone; time on 'cpu' or an accelerator instead"
        )
    module = getattr(torch, device.type, None)
    if module is None or not hasattr(module, "Event") or not hasattr(module, "synchronize"):
        raise TimingError(
            f"cannot time {device} honestly: torch.{device.type} offers no timing events and "
            "synchronisation, and a host clock around asynchronous work measures only the launch"
        )
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise TimingError(f"cannot time on {device}: CUDA is not available in this process")
    else:
        current = getattr(module, "current_device", None)
        if device.index is not None and current is not None and int(current()) != device.index:
            raise TimingError(
                f"cannot time on {device}: torch.{device.type} events time the current device "
                f"({device.type}:{current()}); make {device} current first"
            )
    return EventBackend(device, module, clock)
