"""Time a callable honestly on a device: :class:`Timer`, :func:`measure` and :class:`Measurement`.

CUDA work is asynchronous: a CPU clock around a kernel launch measures the launch, not the work.
So on a CUDA device every call is bracketed by its own pair of CUDA events, recorded back to back
on the current stream, and the events are read only after one synchronisation at the end of the
block; the block is also timed with a wall clock between two synchronisations, which gives the
synchronised wall time per call (launch and host overhead included). On the CPU every call is
timed with :func:`time.perf_counter_ns`, a monotonic clock. Devices that cannot be timed
honestly (``meta``, which runs nothing; an accelerator without timing events) raise
:class:`~torchplace.errors.TimingError`.

The first call pays for allocation, context creation, kernel selection or compilation, so it is
timed and reported apart (``cold``); then come ``warmup`` untimed calls, then the timed ones.
Several input sets can be rotated so that caches do not flatter the result. A large spread
(interquartile range over median) emits a :class:`TimingWarning`.

Example::

    >>> import torch
    >>> from torchplace import measure
    >>> x = torch.randn(256, 256)
    >>> m = measure(lambda: x @ x, device="cpu", repeats=20)
    >>> m.count
    20
"""

from __future__ import annotations

import math
import numbers
import time
import warnings
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator, Sequence
from typing import TYPE_CHECKING, Any

from torchplace.bench.clocks import Clock, ClockBackend, backend_for
from torchplace.bench.measurement import Measurement
from torchplace.bench.units import format_duration
from torchplace.errors import ConfigError, TimingError

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_MIN_TIME",
    "MAX_CALLS",
    "SPREAD_WARNING",
    "Measurement",
    "Timer",
    "TimingWarning",
    "measure",
]

DEFAULT_MIN_TIME = 0.2
"""Seconds of timed calls when neither ``repeats`` nor ``min_time`` is given."""

MAX_CALLS = 1_000_000
"""The most calls ``warmup``, ``repeats`` and ``max_repeats`` take: far more than any honest
measurement needs, while far larger counts only exhaust memory (every timed call keeps its time,
and on CUDA its pair of events) or run for hours."""

SPREAD_WARNING = 0.10
"""Default threshold of interquartile range over median above which a warning is emitted."""


class TimingWarning(RuntimeWarning):
    """A measurement that was made but should not be trusted as it is (large spread, ...)."""


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value > MAX_CALLS:
        raise ConfigError(
            f"{name}={value!r} is more than the {MAX_CALLS:,} calls allowed; give a smaller "
            "count, or time a bigger workload per call"
        )
    return value


def _argument_sets(inputs: Sequence[Any] | None) -> list[tuple[Any, ...]]:
    if inputs is None:
        return [()]
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence) or not inputs:
        raise ConfigError(
            f"inputs must be a non-empty sequence of argument sets, got {inputs!r}; pass "
            "inputs=[(a0, b0), (a1, b1)] (a tuple is spread as positional arguments, any other "
            "item is passed as the single argument)"
        )
    return [item if isinstance(item, tuple) else (item,) for item in inputs]


def _check_clock(clock: object) -> None:
    """Refuse a clock that is not callable or does not read integer nanoseconds: a seconds clock
    (``time.perf_counter``) would make every time a billion times too small, silently."""
    if not callable(clock):
        raise ConfigError(f"clock must be a callable returning nanoseconds, got {clock!r}")
    reading = clock()
    if isinstance(reading, bool) or not isinstance(reading, numbers.Integral):
        name = getattr(clock, "__qualname__", None) or repr(clock)
        raise ConfigError(
            f"clock must return integer nanoseconds, as time.perf_counter_ns does; {name} "
            f"returned {reading!r:.40} ({type(reading).__name__}). Fix: pass "
            "time.perf_counter_ns, not time.perf_counter (which counts seconds), or leave "
            "clock at its default"
        )


def _refuse_lazy_result(fn: object, result: object) -> None:
    """A generator or coroutine returned by ``fn`` has not run its body: timing ``fn`` would
    time only the object's creation, a number that looks real and measures nothing."""
    if not isinstance(result, (Generator, Coroutine, AsyncGenerator)):
        return
    if isinstance(result, (Generator, Coroutine)):
        result.close()  # no "coroutine was never awaited" warning on top of this error
    kind = type(result).__name__
    name = getattr(fn, "__qualname__", None) or repr(fn)
    fix = (
        "time lambda: asyncio.run(fn()) (or await it in your own loop)"
        if isinstance(result, Coroutine)
        else "time lambda: list(fn()) (or a loop that consumes it)"
    )
    raise ConfigError(
        f"{name} returned a {kind}, whose body has not run yet: timing the call would time "
        f"only the {kind}'s creation. Fix: {fix}"
    )


class Timer:
    """How to time: the device, the warm-up, and how many calls (a count or a time budget).

    Arguments are keyword-only and checked here, so a bad one fails before any work is done.

    - ``device``: any spec :func:`torchplace.resolve_device` accepts (default ``"auto"``).
    - ``warmup``: untimed calls after the cold first call (default 3).
    - ``repeats``: timed calls; or ``min_time``: seconds of timed calls (between ``min_repeats``
      and ``max_repeats`` calls). The count is first estimated from the warm-up, then more calls
      are timed until their measured wall time reaches ``min_time``. Give one of them; with
      neither, ``min_time=0.2``. ``warmup``, ``repeats`` and ``max_repeats`` go up to
      :data:`MAX_CALLS`.
    - ``spread_warning``: warn (:class:`TimingWarning`) when IQR / median exceeds it; None
      never warns.
    - ``clock``: the monotonic nanosecond clock for host times (for tests); one that does not
      read integer nanoseconds (``time.perf_counter``: float seconds) raises
      :class:`~torchplace.errors.ConfigError`, and one that goes backwards while timing
      :class:`~torchplace.errors.TimingError`.
    """

    def __init__(
        self,
        *,
        device: str | torch.device | None = "auto",
        warmup: int = 3,
        repeats: int | None = None,
        min_time: float | None = None,
        min_repeats: int = 1,
        max_repeats: int = 10_000,
        spread_warning: float | None = SPREAD_WARNING,
        clock: Clock = time.perf_counter_ns,
    ) -> None:
        from torchplace.devices import resolve_device

        self.warmup = _check_int("warmup", warmup, 0)
        self.min_repeats = _check_int("min_repeats", min_repeats, 1)
        self.max_repeats = _check_int("max_repeats", max_repeats, self.min_repeats)
        if repeats is not None and min_time is not None:
            raise ConfigError(
                f"give repeats ({repeats!r}) or min_time ({min_time!r}), not both: one fixes "
                "the number of timed calls, the other a time budget"
            )
        self.repeats = None if repeats is None else _check_int("repeats", repeats, 1)
        if min_time is None and repeats is None:
            min_time = DEFAULT_MIN_TIME
        if min_time is not None and (
            isinstance(min_time, bool)
            or not isinstance(min_time, (int, float))
            or not math.isfinite(min_time)
            or min_time <= 0
        ):
            raise ConfigError(f"min_time must be a positive number of seconds, got {min_time!r}")
        self.min_time = None if min_time is None else float(min_time)
        if spread_warning is not None and (
            isinstance(spread_warning, bool)
            or not isinstance(spread_warning, (int, float))
            or not spread_warning > 0
        ):
            raise ConfigError(
                f"spread_warning must be a positive ratio (such as 0.1) or None, "
                f"got {spread_warning!r}"
            )
        self.spread_warning = None if spread_warning is None else float(spread_warning)
        _check_clock(clock)
        self.clock = clock
        self.device = resolve_device(device)
        self._backend: ClockBackend = backend_for(self.device, clock)

    def __repr__(self) -> str:
        budget = f"repeats={self.repeats}" if self.repeats else f"min_time={self.min_time}"
        return f"Timer(device={str(self.device)!r}, warmup={self.warmup}, {budget})"

    @property
    def clock_name(self) -> str:
        """What the per-call times are measured with, such as ``"cuda events"``."""
        return self._backend.clock_name

    def synchronize(self) -> None:
        """Wait until the device has finished the work queued so far (no-op on the CPU)."""
        self._backend.synchronize()

    def measure(
        self,
        fn: Callable[..., object],
        *,
        inputs: Sequence[Any] | None = None,
        label: str | None = None,
    ) -> Measurement:
        """Time ``fn``: one cold call, the warm-up, then the timed calls.

        ``inputs`` rotates argument sets: call ``k`` gets ``inputs[k % len(inputs)]`` (a tuple is
        spread as positional arguments, anything else passed as the one argument); without it
        ``fn`` is called with no arguments. What ``fn`` returns is ignored, except a generator
        or a coroutine, whose body has not run: that is a
        :class:`~torchplace.errors.ConfigError` after the first call. An exception raised by
        ``fn`` reaches the caller unchanged.
        """
        return self._measure(fn, inputs=inputs, label=label, stacklevel=3)

    def _measure(
        self,
        fn: Callable[..., object],
        *,
        inputs: Sequence[Any] | None,
        label: str | None,
        stacklevel: int,
    ) -> Measurement:
        if not callable(fn):
            raise ConfigError(f"fn must be callable, got {fn!r}")
        arg_sets = _argument_sets(inputs)
        count = len(arg_sets)
        offset = 0

        def call(k: int) -> object:
            return fn(*arg_sets[(offset + k) % count])

        backend = self._backend
        first: list[object] = []
        cold_s, cold_wall_s = backend.time_one(lambda: first.append(call(0)))
        _refuse_lazy_result(fn, first.pop())
        offset = 1
        if self.repeats is not None:
            n = self.repeats
            for k in range(self.warmup):
                call(k)
        else:
            estimate = cold_wall_s
            if self.warmup:
                _, estimate = backend.time_block(call, self.warmup)
            n = self._count_for(estimate)
        offset = 1 + self.warmup
        times, wall_s = [], 0.0
        while n:
            block, wall_per_call = backend.time_block(call, n)
            times += block
            wall_s += wall_per_call * n
            offset += n
            n = self._more_calls(len(times), wall_s)
        if min(times) < 0 or cold_s < 0:
            raise TimingError(
                f"the clock went backwards while timing {getattr(fn, '__qualname__', fn)!r}: a "
                f"call took {min([*times, cold_s]):.3g} s. Fix: time with a monotonic clock "
                "(time.perf_counter_ns, the default), not wall time that can be set back"
            )
        result = Measurement(
            label=label or getattr(fn, "__qualname__", None) or repr(fn),
            device=str(self.device),
            clock=backend.clock_name,
            times_s=tuple(times),
            cold_s=cold_s,
            cold_wall_s=cold_wall_s,
            wall_per_call_s=wall_s / len(times),
            warmup=self.warmup,
            input_sets=count,
        )
        self._warn_if_spread(result, stacklevel + 1)
        return result

    def _warn_if_spread(self, result: Measurement, stacklevel: int) -> None:
        """A :class:`TimingWarning` when IQR / median passes ``spread_warning``."""
        if self.spread_warning is None or result.count < 4 or result.spread <= self.spread_warning:
            return
        warnings.warn(
            TimingWarning(
                f"{result.label} on {result.device}: the spread is large (IQR "
                f"{format_duration(result.iqr_s)} is {result.spread:.0%} of the median "
                f"{format_duration(result.median_s)}); other work is competing for the "
                "device or the call is too short: run on a quieter machine, time more calls "
                "or a bigger workload"
            ),
            stacklevel=stacklevel,
        )

    def _more_calls(self, done: int, wall_s: float) -> int:
        """How many more calls a ``min_time`` budget needs after ``done`` calls took ``wall_s``.

        The count from the warm-up is only an estimate: on a busy machine a slow warm-up would
        leave the budget far from spent, so the measured wall time decides (0: enough).
        """
        if self.min_time is None or wall_s >= self.min_time or done >= self.max_repeats:
            return 0
        return max(1, self._count_for(wall_s / done) - done)

    def _count_for(self, per_call_s: float) -> int:
        assert self.min_time is not None
        wanted = self.min_time / per_call_s if per_call_s > 0 else math.inf
        if wanted >= self.max_repeats:  # also when the ratio overflows to inf
            return self.max_repeats
        wanted = math.ceil(wanted)
        return max(self.min_repeats, min(self.max_repeats, wanted))


def measure(
    fn: Callable[..., object],
    *,
    device: str | torch.device | None = "auto",
    warmup: int = 3,
    repeats: int | None = None,
    min_time: float | None = None,
    inputs: Sequence[Any] | None = None,
    label: str | None = None,
    min_repeats: int = 1,
    max_repeats: int = 10_000,
    spread_warning: float | None = SPREAD_WARNING,
    clock: Clock = time.perf_counter_ns,
) -> Measurement:
    """Time ``fn`` on ``device``: shorthand for ``Timer(...).measure(fn, inputs=..., label=...)``.

    See :class:`Timer` for the arguments and :class:`Measurement` for the result.
    """
    timer = Timer(
        device=device,
        warmup=warmup,
        repeats=repeats,
        min_time=min_time,
        min_repeats=min_repeats,
        max_repeats=max_repeats,
        spread_warning=spread_warning,
        clock=clock,
    )
    return timer._measure(fn, inputs=inputs, label=label, stacklevel=3)
