"""Each device's work per forward: FLOPs, a roofline time, and a naive pipeline's idle share.

FLOPs are ``torch.utils.flop_counter``'s, per unit, from the trace. The roofline time of a
device is ``max(FLOPs / rate, bytes / bandwidth)`` with the bytes its weights plus twice the
activations it makes (written once, read once). A naive pipeline runs one batch through the
stages in turn, so while one device computes the others wait: a device's idle share is one
minus its time over the whole forward (stages plus copies at link speed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchplace.planner.crossings import Crossing
from torchplace.planner.hardware import DeviceSpec
from torchplace.planner.strategies import HOST, Placement
from torchplace.planner.trace import GLUE, INPUT, Trace

__all__ = ["DeviceWork", "copy_seconds", "device_work"]


@dataclass(frozen=True)
class DeviceWork:
    device: str
    flops: int
    bytes_moved: int
    seconds: float
    idle_share: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "flops": self.flops,
            "bytes_moved": self.bytes_moved,
            "roofline_s": self.seconds,
            "idle_share": self.idle_share,
        }


def copy_seconds(crossing: Crossing, specs: Mapping[str, DeviceSpec]) -> float:
    """Time of one crossing's copies at the link's bandwidth (0 for a same-memory copy)."""
    ends = [specs[d] for d in (crossing.src, crossing.dst) if d in specs]
    if not ends:
        return 0.0
    host = HOST in (crossing.src, crossing.dst)
    gbps = min((s.host_link if host else s.link).gbps for s in ends)
    return crossing.total / (gbps * 1e9) if gbps > 0 else 0.0


def device_work(
    trace: Trace,
    placement: Placement,
    specs: Mapping[str, DeviceSpec],
    weights: Mapping[str, int],
    crossings: Sequence[Crossing],
) -> list[DeviceWork]:
    """FLOPs, roofline seconds and idle share of each device used."""
    flops: dict[str, int] = {}
    made: dict[str, int] = {}
    used = placement.used()
    first = used[0] if used else placement.devices[0]
    for unit, count in trace.flops.items():
        dev = first if unit == GLUE or placement.replicas > 1 else placement.device_of(unit)
        flops[dev] = flops.get(dev, 0) + count
    for alloc in trace.allocs:
        if alloc.owner in (INPUT, GLUE) or alloc.weight or alloc.view_of is not None:
            continue  # a weight is in ``weights``; a part of a storage was counted with it
        dev = first if placement.replicas > 1 else placement.device_of(alloc.owner)
        made[dev] = made.get(dev, 0) + alloc.nbytes
    seconds: dict[str, float] = {}
    moved: dict[str, int] = {}
    for dev in used:
        spec = specs.get(dev)
        moved[dev] = weights.get(dev, 0) + 2 * made.get(first if placement.replicas > 1 else dev, 0)
        work = flops.get(first if placement.replicas > 1 else dev, 0)
        if spec is None or spec.tflops <= 0:
            seconds[dev] = 0.0
            continue
        seconds[dev] = max(work / (spec.tflops * 1e12), moved[dev] / (spec.mem_gbps * 1e9))
    if placement.replicas > 1:  # every replica runs its own batch: nobody waits
        return [DeviceWork(d, flops.get(first, 0), moved[d], seconds[d], 0.0) for d in used]
    whole = sum(seconds.values()) + sum(copy_seconds(c, specs) for c in crossings)
    return [
        DeviceWork(
            d,
            flops.get(d, 0),
            moved[d],
            seconds[d],
            (1.0 - seconds[d] / whole) if whole > 0 else 0.0,
        )
        for d in used
    ]
