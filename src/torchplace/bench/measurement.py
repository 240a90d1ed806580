"""What one timing gives: :class:`Measurement`, warm per-call times plus the cold first call, with
their statistics (median, quartiles, IQR, min, max, mean) computed at construction.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torchplace.bench.units import format_duration
from torchplace.errors import ConfigError

__all__ = ["Measurement"]


def _quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


@dataclass(frozen=True)
class Measurement:
    """The result of timing one callable: warm per-call times plus the cold first call.

    ``times_s`` are the warm calls in seconds, on the primary clock (``clock``: CUDA events on a
    CUDA device, the monotonic CPU clock on the CPU). ``cold_s`` is the first call on the same
    clock and ``cold_wall_s`` its synchronised wall time. ``wall_per_call_s`` is the synchronised
    wall time of the whole warm block divided by the number of calls. Statistics (median,
    quartiles, IQR, min, max, mean) are computed from ``times_s`` at construction.
    """

    label: str
    device: str
    clock: str
    times_s: tuple[float, ...]
    cold_s: float
    cold_wall_s: float
    wall_per_call_s: float
    warmup: int
    input_sets: int = 1
    count: int = field(init=False)
    median_s: float = field(init=False)
    q1_s: float = field(init=False)
    q3_s: float = field(init=False)
    iqr_s: float = field(init=False)
    min_s: float = field(init=False)
    max_s: float = field(init=False)
    mean_s: float = field(init=False)

    def __post_init__(self) -> None:
        if not self.times_s:
            raise ConfigError("a Measurement needs at least one warm time; got an empty times_s")
        q1, median, q3 = _quartiles(self.times_s)
        derived = {
            "count": len(self.times_s),
            "median_s": median,
            "q1_s": q1,
            "q3_s": q3,
            "iqr_s": q3 - q1,
            "min_s": min(self.times_s),
            "max_s": max(self.times_s),
            "mean_s": statistics.fmean(self.times_s),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    @property
    def spread(self) -> float:
        """Interquartile range over median (0 when the median is 0)."""
        return self.iqr_s / self.median_s if self.median_s > 0 else 0.0

    @property
    def cold_overhead_s(self) -> float:
        """How much longer the first call took than a typical warm one."""
        return self.cold_s - self.median_s

    def to_dict(self, *, include_times: bool = False) -> dict[str, Any]:
        """A JSON-ready dict in base units (seconds); per-call times only when asked."""
        out: dict[str, Any] = {
            "label": self.label,
            "device": self.device,
            "clock": self.clock,
            "count": self.count,
            "warmup": self.warmup,
            "input_sets": self.input_sets,
            "median_s": self.median_s,
            "q1_s": self.q1_s,
            "q3_s": self.q3_s,
            "iqr_s": self.iqr_s,
            "spread": self.spread,
            "min_s": self.min_s,
            "max_s": self.max_s,
            "mean_s": self.mean_s,
            "cold_s": self.cold_s,
            "cold_wall_s": self.cold_wall_s,
            "wall_per_call_s": self.wall_per_call_s,
        }
        if include_times:
            out["times_s"] = list(self.times_s)
        return out

    def __str__(self) -> str:
        return (
            f"{self.label} on {self.device} ({self.clock}): "
            f"median {format_duration(self.median_s)}, "
            f"IQR {format_duration(self.iqr_s)} ({self.spread:.1%}), "
            f"min {format_duration(self.min_s)}, max {format_duration(self.max_s)}, "
            f"mean {format_duration(self.mean_s)}, n={self.count}; "
            f"cold first call {format_duration(self.cold_s)}; "
            f"synchronised wall {format_duration(self.wall_per_call_s)}/call"
        )
