"""Each device's memory: weights, buffers, activation peak, KV cache, inputs, reserves.

Weights count each parameter once per device (a tied weight whose group is split across
devices is counted on each). The activation peak is the most bytes alive at once on that
device during one forward, copies it receives included (see :mod:`torchplace.planner.crossings`).
The KV cache is analytic, per layer held. Reserves are named and overridable: the CUDA context,
the cuBLAS workspace and an allocator margin (a fraction of the rest). Headroom is what is
left; the largest batch that fits extends the traced batch sizes linearly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchplace.errors import ConfigError
from torchplace.planner.hardware import MiB, parse_size
from torchplace.planner.trace import _sweep
from torchplace.planner.units import Units

__all__ = [
    "DEFAULT_RESERVES",
    "DeviceBudget",
    "Reserves",
    "activation_peak",
    "device_weights",
    "parse_reserves",
]

#: CUDA context of a torch process (measured around 500 MiB on recent drivers), the cuBLAS
#: workspace, and the allocator's fragmentation margin as a fraction of everything else.
DEFAULT_RESERVES: dict[str, float] = {
    "cuda_context": 500 * MiB,
    "workspace": 32 * MiB,
    "margin": 0.05,
}


@dataclass(frozen=True)
class Reserves:
    cuda_context: int
    workspace: int
    margin: float

    def fixed(self) -> int:
        return self.cuda_context + self.workspace


def parse_reserves(items: Sequence[str], *, accelerator: bool = True) -> Reserves:
    """``["cuda_context=1GiB", "margin=0.1"]`` over the defaults (all zero for a CPU plan)."""
    values = dict(DEFAULT_RESERVES) if accelerator else dict.fromkeys(DEFAULT_RESERVES, 0.0)
    for item in items:
        name, _, text = item.partition("=")
        if name not in values or not text:
            raise ConfigError(
                f"cannot read --reserve {item!r}; write NAME=VALUE with NAME one of "
                f"{', '.join(values)}, e.g. cuda_context=1GiB or margin=0.1"
            )
        if name == "margin":
            try:
                values[name] = float(text)
            except ValueError:
                values[name] = math.nan
            if not 0 <= values[name] < 1:  # also refuses nan and inf
                raise ConfigError(
                    f"--reserve {item!r}: margin is a fraction from 0 up to (not including) 1, "
                    "such as 0.05"
                )
            continue
        try:
            values[name] = parse_size(text)
        except ConfigError:
            raise ConfigError(
                f"--reserve {item!r}: {name} is a size of 0 or more, such as 512MiB or 1GiB"
            ) from None
    return Reserves(int(values["cuda_context"]), int(values["workspace"]), values["margin"])


def device_weights(units: Units, assign: Mapping[str, str], device: str) -> tuple[int, int]:
    """Parameter and buffer bytes on ``device``; a tied weight, or a buffer several units
    share, once per device holding it."""
    canonical = {name: group[0] for group in (*units.tied, *units.shared) for name in group}
    params: dict[str, int] = {}
    buffers: dict[str, int] = {}
    for unit in units.units:
        if assign.get(unit.path) != device:
            continue
        for name, nbytes in unit.params.items():
            params[canonical.get(name, name)] = nbytes
        for name, nbytes in unit.buffers.items():
            buffers[canonical.get(name, name)] = nbytes
    return sum(params.values()), sum(buffers.values())


@dataclass
class DeviceBudget:
    """One device's memory at each traced batch size."""

    device: str
    capacity: int
    weights: int
    buffers: int
    activation: dict[int, int]  # batch -> activation peak
    inputs: dict[int, int]  # batch -> input bytes
    kv_cache: dict[int, int]  # batch -> KV cache bytes
    reserves: Reserves
    limit: int | None = None  # weights budget given with --max-memory, a hard one

    @property
    def over_limit(self) -> bool:
        """Weights and buffers past the ``--max-memory`` the caller gave for this device."""
        return self.limit is not None and self.weights + self.buffers > self.limit

    def total(self, batch: int) -> int:
        variable = (
            self.weights
            + self.buffers
            + self.activation[batch]
            + self.inputs[batch]
            + self.kv_cache[batch]
        )
        return self.reserves.fixed() + int(variable * (1 + self.reserves.margin))

    def headroom(self, batch: int) -> int:
        return self.capacity - self.total(batch)

    def fits(self, batch: int) -> bool:
        return self.headroom(batch) >= 0 and not self.over_limit

    def largest_batch(self) -> int:
        """The largest batch that fits, extending the traced sizes linearly (0: none fits)."""
        if self.over_limit:
            return 0
        sizes = sorted(self.activation)
        top = sizes[-1]
        low = sizes[-2] if len(sizes) > 1 else 0
        per = self._variable(top) - self._variable(low) if low else self._variable(top)
        step = (per / (top - low)) if low else per / top
        fixed = self.weights + self.buffers
        room = (self.capacity - self.reserves.fixed()) / (1 + self.reserves.margin) - fixed
        base = self._variable(top) - step * top
        if step <= 0:
            return top if room >= base else 0
        return max(0, int((room - base) // step))

    def _variable(self, batch: int) -> int:
        return self.activation[batch] + self.inputs[batch] + self.kv_cache[batch]

    def to_dict(self, batches: Sequence[int]) -> dict[str, Any]:
        return {
            "device": self.device,
            "capacity": self.capacity,
            "weights": self.weights,
            "buffers": self.buffers,
            "reserves": {
                "cuda_context": self.reserves.cuda_context,
                "workspace": self.reserves.workspace,
                "margin": self.reserves.margin,
            },
            "per_batch": [
                {
                    "batch": b,
                    "activation_peak": self.activation[b],
                    "inputs": self.inputs[b],
                    "kv_cache": self.kv_cache[b],
                    "total": self.total(b),
                    "headroom": self.headroom(b),
                    "fits": self.fits(b),
                }
                for b in batches
            ],
            "largest_batch": self.largest_batch(),
        }


def activation_peak(spans: Sequence[tuple[int, int, int]]) -> int:
    """Most bytes alive at once among ``(made, freed, bytes)`` spans."""
    return _sweep(spans)
