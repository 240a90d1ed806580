"""A nanosecond clock that moves only when told, and functions that take scripted times on it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


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
