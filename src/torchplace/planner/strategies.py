"""Where each unit goes: replicate, pipeline (by memory, by compute, or filled in order),
accelerate's own map, or an explicit map file.

A :class:`Placement` maps unit paths to device names. ``replicate`` keeps a full copy per
device (what ``torchplace serve --devices`` does). ``pipeline`` cuts the units, in run order,
into contiguous stages: ``memory`` and ``compute`` balance weights or FLOPs against each
device's share (``compute`` among the cuts that keep each device within its ``max_memory``);
``fill`` fills the devices in order up to ``max_memory``, keeping room for the
largest unit on the first device and tied units together, as accelerate does. ``accelerate``
asks ``infer_auto_device_map`` itself and dispatches the way its hooks do.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchplace.errors import ConfigError
from torchplace.planner.units import Units, accelerate, is_tensor_unit, submodule

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "STRATEGIES",
    "Placement",
    "accelerate_placement",
    "fill",
    "map_placement",
    "pipeline",
    "read_map_file",
    "registration_order",
    "replicate",
]

STRATEGIES = ("auto", "replicate", "pipeline", "accelerate", "map")
HOST = "cpu"


@dataclass(frozen=True)
class Placement:
    """Unit path -> device; ``replicas`` > 1 means a full copy on each of ``devices``."""

    strategy: str
    devices: tuple[str, ...]
    assign: dict[str, str] = field(default_factory=dict)
    replicas: int = 1
    hooks: bool = False  # accelerate's dispatch: every call re-copies its arguments
    device_map: dict[str, Any] | None = None  # the map as accelerate spells it, when it made one
    # the balance placed by where no cut of the one asked for keeps within ``max_memory``
    # (``compute``: the cut by ``memory``, the least past it)
    fallback: str = ""

    def device_of(self, unit: str) -> str:
        return self.assign.get(unit, self.devices[0])

    @property
    def entry(self) -> str:
        """Where the caller's inputs go and the hooks send the outputs back, for a placement
        dispatched by hooks: accelerate's main device, the first device of its map that is not
        the host (the host itself when the map places everything there)."""
        return next((d for d in self.assign.values() if d != HOST), HOST)

    @property
    def replica(self) -> str | None:
        """The device of the one replica a replicated placement runs (None: not replicated)."""
        return self.devices[0] if self.replicas > 1 else None

    def used(self) -> list[str]:
        """Devices that hold something, in order (a spill to the host comes last)."""
        if self.replicas > 1:
            return list(self.devices)
        seen = dict.fromkeys(self.assign.values())
        return [d for d in self.devices if d in seen] + ([HOST] if HOST in seen else [])


def replicate(units: Units, devices: Sequence[str]) -> Placement:
    first = {path: devices[0] for path in units.paths}  # replica 0; each device has the same
    return Placement("replicate", tuple(devices), first, replicas=len(devices))


def pipeline(
    units: Units,
    devices: Sequence[str],
    costs: Sequence[float],
    shares: Sequence[float],
    *,
    by: str,
    limits: Sequence[int] | None = None,
) -> Placement | None:
    """Contiguous stages minimising the largest ``cost / share`` (dynamic programming); with
    ``limits``, among the cuts whose stages hold no more weights and buffers than their
    device's limit (None when no cut does)."""
    k, n = len(costs), len(devices)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    held = _Held(units) if limits is not None else None
    inf = float("inf")
    # best[d][i]: the smallest worst stage using devices[:d] for units[:i]
    best = [[inf] * (k + 1) for _ in range(n + 1)]
    cut = [[0] * (k + 1) for _ in range(n + 1)]
    best[0][0] = 0.0
    for d in range(1, n + 1):
        share = max(shares[d - 1], 1e-12)
        for i in range(k + 1):
            first = 0 if held is None or limits is None else held.first(i, limits[d - 1])
            best[d][i], cut[d][i] = _best_cut(best[d - 1], prefix, i, share, first)
    if best[n][k] == inf:
        return None
    assign: dict[str, str] = {}
    i = k
    for d in range(n, 0, -1):
        j = cut[d][i]
        for unit in units.units[j:i]:
            assign[unit.path] = devices[d - 1]
        i = j
    return Placement(f"pipeline-{by}", tuple(devices), assign)


def _best_cut(
    before: Sequence[float], prefix: Sequence[float], i: int, share: float, first: int = 0
) -> tuple[float, int]:
    """The last cut ``first <= j <= i`` minimising ``max(before[j], (prefix[i] - prefix[j]) /
    share)``: on a tie the devices before take the units, so work starts on the first device
    and a later one is used only when the worst stage gets better for it. ``first``: the
    earliest cut whose last stage fits its device (a later one holds less).

    ``before`` (the best worst stage of the first ``j`` units on the devices before, infinite
    where they do not fit there) never falls as ``j`` grows, and the last stage's cost never
    rises: the minimum is where they cross, found by bisection (O(log i), not O(i): a
    1,000-layer model plans in a moment)."""

    def last(j: int) -> float:
        return (prefix[i] - prefix[j]) / share

    lo, hi = first, i  # the first j where before[j] >= last(j) (i at the latest: last(i) == 0)
    while lo < hi:
        mid = (lo + hi) // 2
        if before[mid] >= last(mid):
            hi = mid
        else:
            lo = mid + 1
    value = min(before[lo], max(before[lo - 1], last(lo - 1)) if lo > first else math.inf)
    if before[lo] > value + 1e-12:  # the minimum is left of the crossing, at lo - 1 alone
        return value, lo - 1
    # right of the crossing the worst stage is ``before``, which never falls: the last j
    # within 1e-12 of the minimum is found by bisection too
    at, end = lo, i
    while at < end:
        mid = (at + end + 1) // 2
        if before[mid] <= value + 1e-12:
            at = mid
        else:
            end = mid - 1
    return max(before[at], last(at)), at


class _Held:
    """The weights and buffers a stage of consecutive units holds, as the budget counts them
    (:func:`~torchplace.planner.budget.device_weights`): a tied weight, or a buffer several
    units share, once per stage."""

    def __init__(self, units: Units) -> None:
        canonical = {name: group[0] for group in (*units.tied, *units.shared) for name in group}
        self.prefix = [0]
        where: dict[str, list[int]] = {}
        size: dict[str, int] = {}
        for position, unit in enumerate(units.units):
            own = {canonical.get(n, n): b for n, b in (*unit.params.items(), *unit.buffers.items())}
            self.prefix.append(self.prefix[-1] + sum(own.values()))
            for name, nbytes in own.items():
                where.setdefault(name, []).append(position)
                size[name] = nbytes
        # a tensor several units hold: counted once per stage, not once per unit
        self.repeated = [(at, size[name]) for name, at in where.items() if len(at) > 1]

    def __call__(self, j: int, i: int) -> int:
        """Bytes held by ``units[j:i]`` together."""
        total = self.prefix[i] - self.prefix[j]
        for at, nbytes in self.repeated:
            total -= nbytes * max(0, bisect.bisect_left(at, i) - bisect.bisect_left(at, j) - 1)
        return total

    def first(self, i: int, limit: int) -> int:
        """The earliest ``j`` with ``units[j:i]`` within ``limit`` (fewer units hold less)."""
        lo, hi = 0, i
        while lo < hi:
            mid = (lo + hi) // 2
            if self(mid, i) <= limit:
                hi = mid
            else:
                lo = mid + 1
        return lo


def fill(units: Units, devices: Sequence[str], max_memory: Sequence[int]) -> Placement:
    """Greedy in registration order, as ``infer_auto_device_map`` fills: room for the largest unit is kept
    on the first device, tied units go with the first of their group, leftovers go to the host."""
    sizes = {u.path: units.sizes.get(u.path, 0) for u in units.units}
    partner: dict[str, list[str]] = {}
    for group in units.tied:
        owners = list(dict.fromkeys(units.unit_of(name) for name in group))
        for owner in owners:
            partner[owner] = [o for o in owners if o != owner]
    assign: dict[str, str] = {}
    used = [0] * len(devices)
    current = 0
    for position, unit in enumerate(units.units):
        if unit.path in assign:
            continue
        together = [unit.path] + [p for p in partner.get(unit.path, []) if p not in assign]
        need = sum(sizes[p] for p in together)
        rest = [sizes[u.path] for u in units.units[position + 1 :] if u.path not in assign]
        largest = max(rest, default=0)  # room kept for the largest unit still to place
        while current < len(devices):
            cap = max_memory[current] - (largest if current == 0 else 0)
            if used[current] + need <= cap:
                break
            current += 1
        target = devices[current] if current < len(devices) else HOST
        for path in together:
            assign[path] = target
        if current < len(devices):
            used[current] += need
    return Placement("pipeline-fill", tuple(devices), assign)


def registration_order(model: nn.Module, units: Units) -> Units:
    """The units in the order ``infer_auto_device_map`` walks the model, which is the order
    ``compute_module_sizes`` lists them in; a unit without weights (an activation, a dropout),
    which that list lacks, right after the unit registered before it, as accelerate puts it on
    the device it is filling (first of all, it sent a ReLU between two stages back to cuda:0)."""
    rank = {path: i for i, path in enumerate(units.sizes)}
    position = {name: i for i, (name, _) in enumerate(model.named_modules())}
    sized = [(position[p], rank[p]) for p in units.paths if p in position and p in rank]

    def key(path: str) -> tuple[int, int, int]:
        if path in rank:
            return (rank[path], 0, 0)
        at = position.get(path, len(position))
        before = [r for p, r in sized if p < at]
        return (max(before, default=-1), 1, at)

    ordered = sorted(units.units, key=lambda u: key(u.path))
    return Units(tuple(ordered), units.tied, units.sizes, units.shared)


def accelerate_placement(
    model: nn.Module, units: Units, devices: Sequence[str], max_memory: Sequence[int]
) -> tuple[Placement, list[str]]:
    """accelerate's ``infer_auto_device_map`` with the same budget; also the map's keys."""
    helpers = accelerate()
    no_split = _no_split(model, units)
    budget: dict[int | str, int] = dict(enumerate(max_memory))
    budget[HOST] = 1 << 50
    try:
        raw = helpers.infer_auto_device_map(
            model, max_memory=budget, no_split_module_classes=no_split
        )
    except (IndexError, KeyError, ValueError, AttributeError) as exc:
        raise ConfigError(
            f"accelerate's infer_auto_device_map failed on {type(model).__name__} "
            f"({type(exc).__name__}: {exc}); plan it with --strategy pipeline --balance fill, "
            "which places the same way"
        ) from exc
    device_map = {name: (dev if isinstance(dev, str) else int(dev)) for name, dev in raw.items()}
    if not device_map:  # no parameter or buffer to place: it runs where its inputs go
        device_map = {"": 0}
    device_map.update(dict.fromkeys(_left_out(model, device_map), HOST))
    names = {i: d for i, d in enumerate(devices)}
    assign = {
        name: names[dev] if isinstance(dev, int) else HOST for name, dev in device_map.items()
    }
    return Placement("accelerate", tuple(devices), assign, hooks=True, device_map=device_map), list(
        device_map
    )


def _left_out(model: nn.Module, device_map: Mapping[str, Any]) -> list[str]:
    """The buffers ``infer_auto_device_map`` leaves out of its map: a module it splits gives
    its pieces and its own parameters, not its own buffers (BERT's embeddings'
    ``position_ids``). ``dispatch_model`` leaves a non-persistent one where the model holds
    it, on the host, and its code reads it there; a persistent one it refuses (``The
    device_map provided does not give any device``), and so does the plan."""
    left = [
        name
        for name, _ in model.named_buffers()
        if not any(p == "" or name == p or name.startswith(p + ".") for p in device_map)
    ]
    persistent = [n for n in left if not _non_persistent(model, n)]
    if persistent:
        raise ConfigError(
            f"accelerate's infer_auto_device_map leaves out {', '.join(persistent[:4])}"
            f"{', ...' if len(persistent) > 4 else ''} (a persistent buffer of a module it "
            "split), and its dispatch_model refuses such a map; plan it with --strategy "
            "pipeline --balance fill, which places the same way and keeps the buffer with its "
            "module's pieces"
        )
    return left


def _non_persistent(model: nn.Module, name: str) -> bool:
    owner, _, leaf = name.rpartition(".")
    return leaf in getattr(submodule(model, owner), "_non_persistent_buffers_set", ())


def _no_split(model: nn.Module, units: Units) -> list[str]:
    """The classes accelerate is told not to split: those the model declares, as transformers'
    ``from_pretrained(device_map=...)`` passes them (``_no_split_modules`` of the model and of
    the models inside it: BERT's embeddings and layers, Mamba's mixers); else the kinds the
    units keep whole, less those of a module split for being past the budget (the last, widest
    stage of a Swin, where the others are units): accelerate splits it too, as fill does."""
    declared: set[str] = set()
    for module in model.modules():
        names = getattr(module, "_no_split_modules", None) or ()
        declared.update(
            [names] if isinstance(names, str) else (n for n in names if isinstance(n, str))
        )
    if declared:
        return sorted(declared)
    opened = {
        type(submodule(model, path)).__name__
        for path in {u.path.rpartition(".")[0] for u in units.units}
        if path and not is_tensor_unit(model, path)
        for path in _ancestors(path)
    }
    return sorted({u.kind for u in units.units if u.path and _has_children(model, u.path)} - opened)


def _ancestors(path: str) -> list[str]:
    """``path`` and the modules above it, the model excepted: ``a.b.c`` -> a.b.c, a.b, a."""
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _has_children(model: nn.Module, path: str) -> bool:
    if is_tensor_unit(model, path):
        return False
    return any(True for _ in submodule(model, path).children())


def read_map_file(path: str | Path) -> dict[str, Any]:
    """A JSON map: ``{"device_map": {...}}`` (as ``--export device-map`` writes) or the map."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"), object_pairs_hook=_no_repeats)
    except OSError as exc:
        raise ConfigError(
            f"cannot read the map file {str(path)!r}: {exc.strerror or exc}; check the path"
        ) from None
    except _RepeatedKey as exc:
        raise ConfigError(f"map file {str(path)!r}: {exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read the map file {str(path)!r}: {exc}; it must be JSON"
        ) from None
    mapping = data.get("device_map", data) if isinstance(data, dict) else None
    if not isinstance(mapping, dict) or not mapping:
        raise ConfigError(
            f"map file {str(path)!r} holds no device map; write "
            '{"device_map": {"module.path": 0, ...}} or {"module.path": "cuda:1", ...}'
        )
    return mapping


class _RepeatedKey(ValueError):
    """A key given twice in one JSON object."""


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, refusing a key given twice: ``json`` keeps the last silently,
    so ``{"0": 0, "0": 1}`` would place the module on device 1 with nothing said."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(
                f"the key {key!r} is given twice ({out[key]!r}, then {value!r}), and JSON "
                "would keep the last without a word; give each module one device"
            )
        out[key] = value
    return out


def map_placement(mapping: Mapping[str, Any], devices: Sequence[str]) -> Placement:
    """An explicit map (keys: module paths; values: device index, ``cuda:N`` or ``cpu``)."""
    assign: dict[str, str] = {}
    for name, dev in mapping.items():
        if isinstance(dev, int) and not isinstance(dev, bool) and 0 <= dev < len(devices):
            assign[name] = devices[dev]
        elif isinstance(dev, str) and (dev in devices or dev == HOST):
            assign[name] = dev
        else:
            raise ConfigError(
                f"the map sends {name!r} to {dev!r}, which is not one of the plan's devices "
                f"({', '.join(devices)}) nor 'cpu'; use an index 0..{len(devices) - 1} or a name"
            )
    return Placement("map", tuple(devices), assign, device_map=dict(mapping))
