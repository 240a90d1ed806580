"""``torchplace.plan(...)``: trace once per batch size, place, and account for it all.

:func:`plan` builds the model on ``meta``, cuts it into units, traces the forward, evaluates
the strategy (``auto`` tries ``replicate`` and ``pipeline`` by memory, by compute and filled in
order, and keeps the best that fits), and returns a :class:`Plan` with the placement table, per-device budgets,
crossings, compute, warnings and the exercise-8 table. Nothing is allocated on any device.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import numbers
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchplace.errors import ConfigError
from torchplace.planner.budget import (
    DeviceBudget,
    Reserves,
    activation_peak,
    device_weights,
    parse_reserves,
)
from torchplace.planner.checks import PlanWarning, check_plan
from torchplace.planner.compute import DeviceWork, copy_seconds, device_work
from torchplace.planner.crossings import Flow, flow
from torchplace.planner.hardware import DeviceSpec, assume_devices, inventory_devices
from torchplace.planner.inputs import PlanModel, load_plan_model
from torchplace.planner.scaling import traces_for
from torchplace.planner.strategies import (
    HOST,
    STRATEGIES,
    Placement,
    accelerate_placement,
    fill,
    map_placement,
    pipeline,
    read_map_file,
    registration_order,
    replicate,
)
from torchplace.planner.trace import Hooks, Trace, trace_forward
from torchplace.planner.units import Units, select_units

if TYPE_CHECKING:
    from torch import nn

    from torchplace.models import TensorSpec

__all__ = ["BALANCES", "Plan", "plan"]

BALANCES = ("memory", "compute", "fill")


@dataclass
class Plan:
    """A placement and everything it implies; ``to_dict()`` is the JSON ``result``."""

    model: PlanModel
    devices: list[DeviceSpec]
    units: Units
    placement: Placement
    batches: list[int]
    seq: int | None
    traces: dict[int, Trace]
    flow: Flow
    budgets: dict[str, DeviceBudget]
    work: list[DeviceWork]
    warnings: list[PlanWarning]
    max_memory: dict[str, int]
    considered: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def reference_batch(self) -> int:
        """The batch the crossings and compute are shown for: the largest requested."""
        return self.batches[-1]

    @property
    def specs(self) -> dict[str, DeviceSpec]:
        return {d.device: d for d in self.devices}

    def fits(self) -> bool:
        """Every device used fits at every batch size; a plan that leaves every unit on the
        host (accelerate's, with no room on any device) places nothing, and does not fit."""
        if not self.budgets:
            return False
        return all(b.fits(n) for b in self.budgets.values() for n in self.batches)

    def largest_batch(self) -> int:
        """The largest batch every device used fits (0 where none is used)."""
        return min((b.largest_batch() for b in self.budgets.values()), default=0)

    def device_map(self) -> dict[str, int | str]:
        """The placement as accelerate and transformers spell a ``device_map``."""
        index = {d.device: i for i, d in enumerate(self.devices)}
        if self.placement.replicas > 1:
            return {"": 0}
        return {
            unit.path: index.get(self.placement.device_of(unit.path), HOST)
            for unit in self.units.units
        }

    def to_dict(self) -> dict[str, Any]:
        from torchplace.planner.render import plan_result

        return plan_result(self)


def _devices(
    assume: str | None, devices: str | None, link: str | None, probe: Any
) -> list[DeviceSpec]:
    for name, value in (("assume", assume), ("devices", devices), ("link", link)):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{name}={value!r} must be a string, e.g. {_EXAMPLES[name]!r}")
    if assume is not None and not assume.strip():
        raise ConfigError("--assume '' names no device; give COUNTxMODEL, e.g. 2xH200 or 2x80GiB")
    if devices is not None and not devices.strip():
        raise ConfigError("--devices '' names no device; give 'all' or a list like cuda:0,cuda:1")
    if assume and devices:
        raise ConfigError("give either --assume (planned hardware) or --devices (this machine's)")
    if probe is not None:  # checked even where --assume leaves it unused: a typo is not ignored
        from torchplace.devices.probe import checked_probe

        checked_probe(probe)
    if devices:
        return inventory_devices(devices, link=link, probe=probe)
    return assume_devices(assume or "2xH200", link=link)


_EXAMPLES = {"assume": "2xH200", "devices": "cuda:0,cuda:1", "link": "nvlink"}


def plan(
    model: str = "seed-mlp",
    *,
    batch_sizes: Sequence[int] = (1,),
    seq: int | None = None,
    assume: str | None = None,
    devices: str | None = None,
    link: str | None = None,
    strategy: str = "auto",
    balance: str = "memory",
    map_file: str | Path | None = None,
    reserves: Sequence[str] = (),
    max_memory: Sequence[int] | None = None,
    exported: str | Path | None = None,
    inputs: Sequence[TensorSpec] | None = None,
    probe: Any = None,
) -> Plan:
    """Plan ``model`` over a device set; see :mod:`torchplace.planner`."""
    if not isinstance(model, str):
        raise ConfigError(
            f"model={model!r} must be a string: an embedded name, a shape or 'module:callable'"
        )
    if map_file is not None and strategy == "auto":
        strategy = "map"  # a map given alone is the placement asked for
    batches = _checked(strategy, balance, batch_sizes, map_file)
    if seq is not None and (not _is_int(seq) or not 1 <= seq <= _MOST_BATCH):
        raise ConfigError(
            f"--seq {seq!r}: a sequence length is 1 or more (an integer), at most {_MOST_BATCH:,}"
        )
    if max_memory is not None:
        _check_max_memory(max_memory)
    _check_lists(reserves, inputs)
    # plain ints from here (numpy's would reach the JSON report and the exported map)
    seq = None if seq is None else int(seq)
    max_memory = None if max_memory is None else [int(m) for m in max_memory]
    specs = _devices(assume, devices, link, probe)
    res = parse_reserves(reserves, accelerator=True)
    pm = load_plan_model(model, exported=exported, inputs=inputs)
    strays = _stray_warning(pm.module) if exported is None else None
    if seq is not None and not pm.has_seq:
        raise ConfigError(f"--seq {seq} given, but the inputs of {pm.name!r} have no sequence dim")
    length = seq if pm.has_seq and seq is not None else pm.default_seq
    ctx = _Context(pm, specs, res, batches, length)
    base = ctx.base_units(max_memory)
    ctx.max_memory = ctx.weights_budget(base, max_memory)
    candidates = ctx.candidates(strategy, balance, map_file, base)
    plans = [ctx.build(p, u, ctx.traced(u, _hooks(p))) for p, u in candidates]
    chosen = _best(plans) if strategy == "auto" else plans[0]
    chosen.considered = {
        p.placement.strategy: {
            "fits": p.fits(),
            "largest_batch": p.largest_batch(),
            "device_bytes_per_forward": p.flow.bytes_between_devices(),
            "forward_s": _forward_seconds(p),
        }
        for p in plans
    }
    if strays is not None:
        chosen.warnings.append(strays)
    return chosen


def _stray_warning(module: nn.Module) -> PlanWarning | None:
    """A warning for the tensors the model keeps outside its parameters and buffers (a plain
    attribute, a plain list or dict, a helper object's): built here on ``meta`` like the rest,
    they are planned as if they moved with the weights, but ``module.to()`` and accelerate's
    dispatch leave them where the factory made them, so on a GPU the forward either fails
    with a mixed-device error or copies them on every call, neither of which is planned.
    0-dim tensors are left out: torch takes a CPU scalar beside device tensors."""
    from torchplace.placement.audit import audit_module

    found = [s.name for s in audit_module(module).strays if s.shape is None or len(s.shape) > 0]
    if not found:
        return None
    shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    return PlanWarning(
        "stray-tensor",
        f"{shown} {'is' if len(found) == 1 else 'are'} kept outside the parameters and buffers, "
        "so module.to() and dispatch leave them on the device they were made on: on a GPU the "
        "forward then fails with a mixed-device error or copies them on every call, which this "
        "plan does not count. Fix: register them with register_buffer() (nn.ParameterList, "
        "nn.ModuleList for lists); torchplace.audit_module(model) lists them",
    )


def _check_max_memory(max_memory: object) -> None:
    """Refuse a ``max_memory`` that is no list of byte counts, or gives a device no bytes."""
    if (
        isinstance(max_memory, (str, bytes)) or not isinstance(max_memory, Sequence)
        or not max_memory or not all(_is_int(m) for m in max_memory)
    ):  # fmt: skip
        raise ConfigError(
            f"max_memory={max_memory!r} must be a list of byte counts, one per device "
            "(--max-memory takes sizes such as 30GiB,40GiB)"
        )
    empty = next((i for i, m in enumerate(max_memory) if m < 1), None)
    if empty is not None:
        raise ConfigError(
            f"max_memory={list(max_memory)!r}: device {empty} is given {max_memory[empty]} "
            "bytes, which hold no weights; give each device one byte or more, e.g. "
            "--max-memory 30GiB,40GiB (a size under one byte, such as 0.5B, reads as 0)"
        )


def _checked(
    strategy: str, balance: str, batch_sizes: Sequence[int], map_file: str | Path | None
) -> list[int]:
    if strategy not in STRATEGIES:
        raise ConfigError(f"unknown strategy {strategy!r}; choose one of: {', '.join(STRATEGIES)}")
    if balance not in BALANCES:
        raise ConfigError(f"unknown balance {balance!r}; choose one of: {', '.join(BALANCES)}")
    if isinstance(batch_sizes, (str, bytes)) or not isinstance(batch_sizes, Iterable):
        raise ConfigError(f"batch sizes must be a list of integers, got {batch_sizes!r}")
    given = list(batch_sizes)
    if not given or not all(_is_int(b) and 1 <= b <= _MOST_BATCH for b in given):
        raise ConfigError(f"batch sizes must be integers from 1 to {_MOST_BATCH:,}, got {given}")
    batches = sorted({int(b) for b in given})
    if map_file is not None and not isinstance(map_file, str | os.PathLike):
        raise ConfigError(f"map_file={map_file!r} must be the path of a JSON device map")
    if strategy == "map" and map_file is None:
        raise ConfigError("strategy 'map' needs a map file: --map FILE.json")
    if strategy != "map" and map_file is not None:
        raise ConfigError(
            f"--map {str(map_file)!r} is read by strategy 'map' only, not {strategy!r}; "
            "drop --strategy (or give --strategy map) to plan that map"
        )
    return batches


#: the largest batch planned: far past any real one, far below where torch's sizes overflow
_MOST_BATCH = 2**31


def _check_lists(reserves: object, inputs: object) -> None:
    """``reserves`` a list of NAME=VALUE strings, ``inputs`` (where given) of TensorSpecs."""
    from torchplace.models import TensorSpec

    if not _is_list_of(reserves, str):
        raise ConfigError(
            f"reserves={reserves!r} must be a list of NAME=VALUE strings, e.g. "
            "['cuda_context=1GiB', 'margin=0.1'] (one --reserve each)"
        )
    if inputs is not None and not _is_list_of(inputs, TensorSpec):
        raise ConfigError(
            f"inputs={inputs!r} must be a list of torchplace.models.TensorSpec, e.g. "
            "[TensorSpec('x', 'FP32', (-1, 8))] (--input x:FP32:-1,8 on the command line)"
        )


def _is_list_of(value: object, kind: type) -> bool:
    """A collection (not a str or bytes, which iterate as characters) of ``kind`` only."""
    return (
        not isinstance(value, (str, bytes))
        and isinstance(value, Iterable)
        and all(isinstance(item, kind) for item in value)
    )


def _is_int(value: object) -> bool:
    """An integer (numpy's too), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _within(name: str, unit: str) -> bool:
    return unit == "" or name == unit or name.startswith(unit + ".")


def _hooks(placement: Placement) -> Hooks | None:
    """A placement dispatched by hooks, as its trace takes it (None: a stage runner's)."""
    if not placement.hooks or placement.replicas > 1:
        return None
    return Hooks(tuple(placement.assign.items()), placement.entry)


def _read_together(trace: Trace) -> set[str]:
    """The modules split into units that cannot run apart: one operator of the module's own
    code reads the weights of two of its units (``nn.MultiheadAttention`` hands its
    ``in_proj_weight``, ``in_proj_bias`` and ``out_proj``'s weight to one fused kernel; split,
    they went to three devices, and a runner found no device to run it on). The model itself
    is always split."""
    owners: dict[int, set[str]] = {}
    for op, _, index in trace.reads:
        alloc = trace.allocs[index]
        if alloc.weight:
            owners.setdefault(op, set()).add(alloc.owner)
    out = set()
    for units in (u for u in owners.values() if len(u) > 1):
        parts = [u.split(".") for u in units]
        shared = itertools.takewhile(lambda p: len(set(p)) == 1, zip(*parts, strict=False))
        common = [p[0] for p in shared]
        if common:
            out.add(".".join(common))
    return out


def _run_order(trace: Trace) -> list[str]:
    return list(dict.fromkeys(c.unit for c in sorted(trace.calls, key=lambda c: c.start)))


def _pipeline(
    model: nn.Module,
    units: Units,
    names: list[str],
    trace: Trace,
    specs: list[DeviceSpec],
    mem: list[int],
    by: str,
) -> Placement:
    if by == "fill":
        return fill(registration_order(model, units), names, mem)
    if by == "compute":  # among the cuts within max_memory
        flops = [float(trace.flops.get(u.path, 0)) for u in units.units]
        placed = pipeline(units, names, flops, [d.tflops for d in specs], by=by, limits=mem)
        if placed is not None:
            return placed
    # what --max-memory bounds: weights and buffers (an fp8 or int8 weight is a buffer)
    weights = [float(u.weight_bytes + u.buffer_bytes) for u in units.units]
    placed = pipeline(units, names, weights, [float(m) for m in mem], by="memory")
    assert placed is not None  # without limits every cut is one
    if by == "compute":  # none within it: as memory balancing places then, least past it
        return dataclasses.replace(placed, strategy="pipeline-compute", fallback="memory")
    return placed


def _past_budget(p: Plan) -> float:
    """How far the fullest device's weights and buffers go past its ``max_memory`` (a ratio;
    replicating a model that no device holds goes furthest)."""
    return max(
        ((b.weights + b.buffers) / max(1, p.max_memory.get(d, 0)) for d, b in p.budgets.items()),
        default=math.inf,
    )


def _forward_seconds(p: Plan) -> float:
    stages = (
        sum(w.seconds for w in p.work)
        if p.placement.replicas == 1
        else max((w.seconds for w in p.work), default=0.0)
    )
    return (
        stages
        + sum(copy_seconds(c, p.specs) for c in p.flow.crossings if HOST not in (c.src, c.dst))
        + _spill_seconds(p)
    )


def _spill_seconds(p: Plan) -> float:
    """What units left on the host (``fill``'s spill) cost a forward that a stage on a device
    does not: their weights and buffers copied in over the host link, as accelerate's offload
    does every forward, and the activations they take and give crossing it."""
    spilled = {path for path, dev in p.placement.assign.items() if dev == HOST}
    if p.placement.replicas > 1 or not spilled:
        return 0.0
    gbps = min((d.host_link.gbps for d in p.devices), default=0.0)
    held = sum(device_weights(p.units, p.placement.assign, HOST))
    crossing = sum(
        c.total
        for c in p.flow.crossings
        if HOST in (c.src, c.dst) and {c.producer, c.consumer} & spilled
    )
    return (held + crossing) / (gbps * 1e9) if gbps > 0 else math.inf


def _best(plans: list[Plan]) -> Plan:
    fitting = [p for p in plans if p.fits()]
    if not fitting:  # the largest batch; on a tie, the weights least past their budget
        return max(plans, key=lambda p: (p.largest_batch(), -_past_budget(p)))
    replicas = [p for p in fitting if p.placement.replicas > 1]
    if replicas:
        return replicas[0]
    return min(fitting, key=_forward_seconds)


class _quiet_accelerate:
    """accelerate logs 'Device N is not available' for planned devices; those are expected."""

    def __enter__(self) -> None:
        self.logger = logging.getLogger("accelerate")
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)

    def __exit__(self, *exc: object) -> None:
        self.logger.setLevel(self.level)


@dataclass
class _Context:
    """One planning run: the model, devices and sizes, and the traces made so far."""

    model: PlanModel
    specs: list[DeviceSpec]
    reserves: Reserves
    batches: list[int]
    seq: int | None
    max_memory: list[int] = field(default_factory=list)
    explicit: bool = False  # max_memory given by the caller: a hard budget per device
    cache: dict[tuple[str | Hooks | None, ...], dict[int, Trace]] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [d.device for d in self.specs]

    def traced(self, units: Units, hooks: Hooks | None = None) -> dict[int, Trace]:
        """The traces for these units, at every batch size (made once per set of units, and
        per placement for one dispatched by hooks, which hand the units their arguments)."""
        key = (*units.paths, hooks)
        if key not in self.cache:

            def run(b: int) -> Trace:
                try:
                    inputs = self.model.example(b, self.seq, "meta")
                except (RuntimeError, TypeError, ValueError, OverflowError) as exc:
                    seq = f", seq {self.seq:,}" if self.seq is not None else ""
                    raise ConfigError(
                        f"cannot make the inputs of {self.model.name!r} at batch {b:,}{seq}: "
                        f"{exc}; plan a smaller batch or sequence"
                    ) from None
                names = [spec.name for spec in self.model.inputs]
                module, paths = self.model.module, units.paths
                values = self.model.values(b, self.seq)
                return trace_forward(
                    module, inputs, paths, batch=b, seq=self.seq, names=names, hooks=hooks,
                    values=values,
                )  # fmt: skip

            self.cache[key] = traces_for(self.batches, run)
        return self.cache[key]

    def base_units(self, given: Sequence[int] | None = None) -> Units:
        """The default units, in run order; a unit is split when some device could not hold
        it: past the smallest capacity less the reserves, or the smallest ``max_memory`` given
        (a hard budget: a module past it is placed as its children, as accelerate splits it)."""
        usable = min(d.memory for d in self.specs) - self.reserves.fixed()
        if given:
            usable = min(usable, *given)
        module = self.model.module
        base = select_units(module, limit=usable)
        trace = self.traced(base)[self.batches[-1]]
        whole = _read_together(trace)
        if whole:  # a module whose code hands two of its pieces' weights to one operator
            base = select_units(module, limit=usable, whole=whole)
            trace = self.traced(base)[self.batches[-1]]
        order = _run_order(trace)
        return base.ordered(order) if order else base

    def weights_budget(self, base: Units, given: Sequence[int] | None) -> list[int]:
        """``max_memory``: given, or capacity less reserves, one-device activations and KV."""
        if given:
            if len(given) != len(self.specs):
                raise ConfigError(
                    f"--max-memory has {len(given)} values for {len(self.specs)} devices; give "
                    "one size per device, in --devices order (e.g. 30GiB,40GiB)"
                )
            self.explicit = True
            return list(given)
        top = self.batches[-1]
        peak = self.traced(base)[top].peak()
        kv = self.model.kv_cache.bytes(top, self.seq or 1) if self.model.kv_cache else 0
        room = [
            int((d.memory - self.reserves.fixed()) / (1 + self.reserves.margin)) for d in self.specs
        ]
        return [max(0, r - peak - kv) for r in room]

    def candidates(
        self, strategy: str, balance: str, map_file: str | Path | None, base: Units
    ) -> list[tuple[Placement, Units]]:
        top, names, module = self.batches[-1], self.names, self.model.module
        out: list[tuple[Placement, Units]] = []
        if strategy in ("auto", "replicate"):
            out.append((replicate(base, names), base))
        if strategy in ("auto", "pipeline"):
            trace = self.traced(base)[top]
            for by in BALANCES if strategy == "auto" else (balance,):
                placed = _pipeline(module, base, names, trace, self.specs, self.max_memory, by)
                out.append((placed, base))
        if strategy == "accelerate":
            with _quiet_accelerate():
                placed, keys = accelerate_placement(module, base, names, self.max_memory)
            units = select_units(module, paths=keys)
            trace = self.traced(units, _hooks(placed))[top]
            out.append((placed, units.ordered(_run_order(trace))))
        if strategy == "map" and map_file is not None:
            mapping = read_map_file(map_file)
            placed = map_placement(mapping, names)  # its devices checked before its paths
            out.append((placed, select_units(module, paths=list(mapping))))
        return out

    def build(self, placement: Placement, units: Units, traces: dict[int, Trace]) -> Plan:
        top = self.batches[-1]
        flows = {b: self._flows(placement, traces[b]) for b in self.batches}
        budgets = {}
        # the shapes' layers (``h.N``) hold the KV cache, in proportion to how many a device has
        layers = self.model.kv_cache.layers if self.model.kv_cache else 0
        held = {
            u.path: sum(1 for i in range(layers) if _within(f"h.{i}", u.path)) for u in units.units
        }
        for spec in self.specs:
            dev = spec.device
            if placement.replicas > 1:
                assign = {u.path: dev for u in units.units}
            else:
                assign = {u.path: placement.device_of(u.path) for u in units.units}
            if dev not in placement.used():
                continue
            weights, buffers = device_weights(units, assign, dev)
            share = sum(n for u, n in held.items() if assign.get(u) == dev) / max(1, layers)
            budgets[dev] = DeviceBudget(
                dev,
                spec.memory,
                weights,
                buffers,
                {b: activation_peak(flows[b][dev].spans.get(dev, [])) for b in self.batches},
                {b: flows[b][dev].inputs.get(dev, 0) for b in self.batches},
                {
                    b: int(self.model.kv_cache.bytes(b, self.seq or 1) * share)
                    if self.model.kv_cache
                    else 0
                    for b in self.batches
                },
                self.reserves,
                self.max_memory[self.names.index(dev)] if self.explicit else None,
            )
        ref = flows[top][self.specs[0].device]
        if placement.replicas > 1:  # every replica's own transfers
            ref = Flow(
                [c for f in flows[top].values() for c in f.crossings],
                {},
                [d for f in flows[top].values() for d in f.output_devices],
                {d: n for f in flows[top].values() for d, n in f.inputs.items()},
            )
        weights_by_dev = {d: b.weights for d, b in budgets.items()}
        work = device_work(
            traces[top], placement, self.specs_by_name, weights_by_dev, ref.crossings
        )
        chosen = Plan(
            self.model,
            self.specs,
            units,
            placement,
            self.batches,
            self.seq,
            traces,
            ref,
            budgets,
            work,
            [],
            {d.device: m for d, m in zip(self.specs, self.max_memory, strict=True)},
        )
        chosen.warnings = check_plan(units, placement, ref, budgets, self.batches)
        return chosen

    @property
    def specs_by_name(self) -> dict[str, DeviceSpec]:
        return {d.device: d for d in self.specs}

    def _flows(self, placement: Placement, trace: Trace) -> dict[str, Flow]:
        """Per device: the flow that device sees (one replica's, or the shared pipeline's)."""
        if placement.replicas > 1:
            return {d.device: flow(trace, placement, replica=d.device) for d in self.specs}
        shared = flow(trace, placement)
        return {d.device: shared for d in self.specs}
