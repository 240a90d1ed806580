"""Statistics: :class:`PrefetchStats` says where the time went (waiting for the source, for the
copy, or in the consumer) and names the bottleneck; :class:`StatsAccumulator` collects the host
times and the device events of the copies and the consumer's stream as a pass runs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from torchplace.prefetch.streams import Event

__all__ = ["Bottleneck", "PrefetchStats", "StatsAccumulator"]

Bottleneck = Literal["source", "copy", "consumer", "none"]


@dataclass(frozen=True)
class PrefetchStats:
    """Where the time went, cumulated over every pass since construction or :meth:`reset`.

    ``source_s``: host time waiting for the source to produce batches (CPU-bound work).
    ``copy_s``: host time spent staging and issuing copies (including blocking fallbacks and
    waits for a staging buffer); ``copy_device_s``: device time of the copies, from events
    (None without streams). ``consumer_s``: host time between handing out a batch and being asked
    for the next one; asynchronous device work shows up there only where the consumer waits for
    it (``.item()``, ``.cpu()``, a full allocator). ``consumer_device_s``: time the consumer's
    stream spent on the batches, from events recorded on it at each hand-out (after its wait for
    the copy) and at the next request, so the device work of a consumer that never waits for it
    is seen too (None without streams).
    """

    mode: Literal["streams", "pass-through"]
    device: str
    batches: int
    source_s: float
    copy_s: float
    copy_device_s: float | None
    consumer_s: float
    consumer_device_s: float | None
    staged_batches: int
    already_pinned: int
    fallback_copies: int
    pool_cap_bytes: int
    pool_bytes: int
    pool_peak_bytes: int
    pool_allocations: int
    pool_reuses: int

    @property
    def bottleneck(self) -> Bottleneck:
        """The stage that took the most time: ``source``, ``copy`` or ``consumer``.

        A stage with a device time counts the larger of its host and device times.
        """
        if self.batches == 0:
            return "none"
        stages: dict[Bottleneck, float] = {
            "source": self.source_s,
            "copy": max(self.copy_s, self.copy_device_s or 0.0),
            "consumer": max(self.consumer_s, self.consumer_device_s or 0.0),
        }
        return max(stages, key=lambda k: stages[k])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"bottleneck": self.bottleneck}

    def __str__(self) -> str:
        def dev(s: float | None) -> str:
            return "" if s is None else f" (device {s * 1e3:.1f} ms)"

        return (
            f"{self.batches} batches to {self.device} ({self.mode}): "
            f"source {self.source_s * 1e3:.1f} ms, "
            f"copy {self.copy_s * 1e3:.1f} ms{dev(self.copy_device_s)}, "
            f"consumer {self.consumer_s * 1e3:.1f} ms{dev(self.consumer_device_s)}; "
            f"bottleneck: {self.bottleneck}"
        )


@dataclass(slots=True)
class StatsAccumulator:
    """The running sums behind :class:`PrefetchStats`, and the device events not yet timed."""

    batches: int = 0
    source_s: float = 0.0
    copy_s: float = 0.0
    copy_device_s: float = 0.0
    consumer_s: float = 0.0
    consumer_device_s: float = 0.0
    staged_batches: int = 0
    already_pinned: int = 0
    fallback_copies: int = 0
    pending: deque[tuple[Event, Event]] = field(default_factory=deque)  # copies
    consumed: deque[tuple[Event, Event]] = field(default_factory=deque)  # consumer's stream

    def reset(self) -> None:
        fresh = StatsAccumulator()
        for f in fields(self):
            setattr(self, f.name, getattr(fresh, f.name))

    def settle(self, wait: bool) -> None:
        """Add the device time of finished copies and consumer spans (waiting, when ``wait``)."""
        self.copy_device_s += _drain(self.pending, wait)
        self.consumer_device_s += _drain(self.consumed, wait)


def _drain(spans: deque[tuple[Event, Event]], wait: bool) -> float:
    """Seconds between the event pairs that have completed, oldest first; removes them.

    ``elapsed_time`` is only valid once both events have completed: the end event is waited
    for (``wait``) or queried, and the start event, recorded before it on the same stream, has
    completed by then.
    """
    total = 0.0
    while spans:
        start, end = spans[0]
        if wait:
            end.synchronize()
        elif not end.query():
            break
        spans.popleft()
        total += start.elapsed_time(end) / 1e3  # milliseconds
    return total
