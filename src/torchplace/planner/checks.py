"""Warnings a plan gives before anything is loaded: the placements that go wrong.

Each check returns :class:`PlanWarning` items with a stable code:

- ``tied-split``: a tied group's modules on different devices (each holds a copy; they untie);
- ``return-trip``: data crosses back to a device it left during the forward;
- ``io-same-device``: with several devices, one holds both the inputs and the outputs;
- ``leaf-too-big``: a unit larger than the memory its device has for weights;
- ``cpu-spill``: units left on the host because the devices are full;
- ``over-max-memory``: a device's weights and buffers past the ``--max-memory`` given for it;
- ``does-not-fit``: a device over its capacity at a requested batch size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torchplace.planner.budget import DeviceBudget
from torchplace.planner.crossings import Flow
from torchplace.planner.hardware import human
from torchplace.planner.strategies import HOST, Placement
from torchplace.planner.trace import label
from torchplace.planner.units import Units

__all__ = ["PlanWarning", "check_plan"]


@dataclass(frozen=True)
class PlanWarning:
    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def check_plan(
    units: Units,
    placement: Placement,
    flow: Flow,
    budgets: Mapping[str, DeviceBudget],
    batches: Sequence[int],
) -> list[PlanWarning]:
    out: list[PlanWarning] = []
    if placement.replicas == 1:
        out += _tied(units, placement)
        out += _return_trip(flow)
        used = [d for d in placement.used() if d != HOST]
        entry = next(iter(flow.inputs), None)
        if len(used) > 1 and entry is not None and entry in flow.output_devices:
            out.append(
                PlanWarning(
                    "io-same-device",
                    f"{entry} holds both the inputs and the outputs while the forward runs over "
                    f"{', '.join(used)}: it carries both at its peak; end the last stage elsewhere",
                )
            )
        spilled = [u for u, d in placement.assign.items() if d == HOST]
        if spilled:
            out.append(
                PlanWarning(
                    "cpu-spill",
                    f"{len(spilled)} unit(s) left on the host ({', '.join(spilled[:4])}"
                    f"{', ...' if len(spilled) > 4 else ''}): every forward copies their weights "
                    "in; add devices or lower the batch",
                )
            )
    for unit in units.units:
        dev = placement.device_of(unit.path) if placement.replicas == 1 else placement.devices[0]
        budget = budgets.get(dev)
        if budget is None:
            continue
        room = budget.capacity - budget.reserves.fixed()
        if unit.weight_bytes > room:
            out.append(
                PlanWarning(
                    "leaf-too-big",
                    f"unit {label(unit.path)} holds {human(unit.weight_bytes)} of weights, "
                    f"more than {dev} has ({human(room)} after reserves); it cannot be placed whole",
                )
            )
    for dev, budget in budgets.items():
        if budget.over_limit and budget.limit is not None:
            out.append(
                PlanWarning(
                    "over-max-memory",
                    f"{dev} holds {human(budget.weights + budget.buffers)} of weights and "
                    f"buffers, over the {human(budget.limit)} --max-memory gives it; raise "
                    "--max-memory, add devices, or use --strategy accelerate (it spills the "
                    "rest to the host)",
                )
            )
        over = [b for b in batches if budget.headroom(b) < 0]
        if over:
            out.append(
                PlanWarning(
                    "does-not-fit",
                    f"{dev} is over its {human(budget.capacity)} at batch {', '.join(map(str, over[:6]))}"
                    f"{' ...' if len(over) > 6 else ''} (largest that fits: {budget.largest_batch()})",
                )
            )
    return out


def _tied(units: Units, placement: Placement) -> list[PlanWarning]:
    out = []
    for group in units.tied:
        where = {name: placement.device_of(units.unit_of(name)) for name in group}
        if len(set(where.values())) > 1:
            spread = ", ".join(f"{name} on {dev}" for name, dev in where.items())
            out.append(
                PlanWarning(
                    "tied-split",
                    f"tied weights split across devices ({spread}): each device holds a copy (fine "
                    "for inference; in training an update to one no longer reaches the other)",
                )
            )
    return out


def _return_trip(flow: Flow) -> list[PlanWarning]:
    seen: set[tuple[str, str]] = set()
    for c in flow.crossings:
        if HOST in (c.src, c.dst):
            continue
        if (c.dst, c.src) in seen:
            return [
                PlanWarning(
                    "return-trip",
                    f"data goes back from {c.src} to {c.dst} ({label(c.producer)} -> "
                    f"{label(c.consumer)}, {human(c.total)}) after going the other way",
                )
            ]
        seen.add((c.src, c.dst))
    return []
