"""Warnings a plan gives before anything is loaded: the placements that go wrong.

Each check returns :class:`PlanWarning` items with a stable code:

- ``tied-split``: a tied group's modules on different devices (each holds a copy; they untie);
- ``return-trip``: data crosses back to a device it left during the forward;
- ``io-same-device``: with several devices, one holds both the inputs and the outputs;
- ``leaf-too-big``: units larger than the memory their device has for weights (one warning
  for all, naming the largest);
- ``cpu-spill``: units left on the host because the devices are full;
- ``over-max-memory``: a device's weights and buffers past the ``--max-memory`` given for it;
- ``balance-fallback``: ``--balance compute`` found no cut within ``max_memory``, and placed
  by memory instead (the cut least past it);
- ``does-not-fit``: a device over its capacity at a requested batch size;
- ``stray-tensor``: tensors the model keeps outside its parameters and buffers, which
  ``module.to()`` leaves behind (given by :func:`torchplace.plan` itself).
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
        out += _io_same_device(placement, flow)
        out += _spilled(placement, units)
        out += _fallback(placement)
    out += _too_big(units, placement, budgets)
    for dev, budget in budgets.items():
        out += _over_budget(dev, budget, batches)
    return out


def _io_same_device(placement: Placement, flow: Flow) -> list[PlanWarning]:
    used = [d for d in placement.used() if d != HOST]
    entry = next(iter(flow.inputs), None)
    if len(used) < 2 or entry is None or entry not in flow.output_devices:
        return []
    message = (
        f"{entry} holds both the inputs and the outputs while the forward runs over "
        f"{', '.join(used)}: it carries both at its peak; end the last stage elsewhere"
    )
    return [PlanWarning("io-same-device", message)]


def _spilled(placement: Placement, units: Units) -> list[PlanWarning]:
    spilled = [label(u) for u, d in placement.assign.items() if d == HOST]
    if not spilled:
        return []
    if placement.strategy == "map":  # the user's map put them there, not a full device
        return [PlanWarning("cpu-spill", _mapped_to_host(placement, spilled))]
    message = (
        f"{len(spilled)} unit(s) left on the host ({_first(spilled)}): every forward copies "
        "their weights in; add devices or lower the batch"
    )
    idle = [d for d in placement.devices if d != HOST and d not in placement.used()]
    if idle:  # more devices do not help: a unit does not fit in one
        sizes = {u.path: u.weight_bytes for u in units.units}
        largest = max(
            (u for u, d in placement.assign.items() if d == HOST), key=lambda u: sizes.get(u, 0)
        )
        message = (
            f"{len(spilled)} unit(s) left on the host ({_first(spilled)}) while "
            f"{', '.join(idle)} hold(s) none: a unit does not fit whole in a device's "
            f"max_memory (the largest left, {label(largest)}, holds "
            f"{human(sizes.get(largest, 0))}; the first device keeps room for the largest "
            "unit, as accelerate does); raise --max-memory rather than add devices"
        )
    if len(spilled) == len(placement.assign):
        message = (
            f"every unit is left on the host ({_first(spilled)}): no device's max_memory has "
            "room for the first unit with the units tied to it (on the first device, beside "
            "room kept for the largest unit); add devices with more memory, raise "
            "--max-memory or lower --reserve"
        )
    return [PlanWarning("cpu-spill", message)]


def _mapped_to_host(placement: Placement, spilled: list[str]) -> str:
    devices = [d for d in placement.devices if d != HOST]
    where = f"map them to the plan's devices ({', '.join(devices)}, or 0 to {len(devices) - 1})"
    if len(spilled) == len(placement.assign):
        return (
            f"the map puts every unit on the host ({_first(spilled)}): no device holds any of "
            f"the model; {where}"
        )
    return (
        f"the map puts {len(spilled)} unit(s) on the host ({_first(spilled)}): every forward "
        f"copies their weights in; {where} to keep them there"
    )


def _fallback(placement: Placement) -> list[PlanWarning]:
    if not placement.fallback:
        return []
    asked = placement.strategy.removeprefix("pipeline-")
    message = (
        f"no cut balanced by {asked} keeps every device within its max_memory; placed by "
        f"{placement.fallback} instead, the cut least past it: raise --max-memory or add "
        "devices to balance by compute"
    )
    return [PlanWarning("balance-fallback", message)]


def _over_budget(dev: str, budget: DeviceBudget, batches: Sequence[int]) -> list[PlanWarning]:
    out = []
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
                f"{dev} is over its {human(budget.capacity)} at batch "
                f"{', '.join(map(str, over[:6]))}{' ...' if len(over) > 6 else ''} "
                f"(largest that fits: {budget.largest_batch()})",
            )
        )
    return out


def _too_big(
    units: Units, placement: Placement, budgets: Mapping[str, DeviceBudget]
) -> list[PlanWarning]:
    """One ``leaf-too-big`` warning for every unit bigger than its device's memory after the
    reserves: how many, the largest, and the first few."""
    big: list[tuple[str, int, str, int]] = []  # unit, weight bytes, device, room there
    for unit in units.units:
        dev = placement.device_of(unit.path) if placement.replicas == 1 else placement.devices[0]
        budget = budgets.get(dev)
        if budget is None:
            continue
        room = budget.capacity - budget.reserves.fixed()
        if unit.weight_bytes > room:
            big.append((label(unit.path), unit.weight_bytes, dev, room))
    if not big:
        return []
    name, nbytes, dev, room = max(big, key=lambda b: b[1])
    others = [b[0] for b in big if b[0] != name]
    tail = (
        f", and {len(others)} more unit(s) are bigger than their device ({_first(others)}); "
        "they cannot be placed whole"
        if others
        else "; it cannot be placed whole"
    )
    message = (
        f"unit {name} holds {human(nbytes)} of weights, more than {dev} has ({human(room)} "
        f"after reserves){tail}: add devices with more memory or lower the dtype"
    )
    return [PlanWarning("leaf-too-big", message)]


def _first(names: Sequence[str], shown: int = 4) -> str:
    """The first ``shown`` names, and ``...`` where there are more."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


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
