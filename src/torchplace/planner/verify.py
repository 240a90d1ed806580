"""``--verify``: run the planned placement for real and compare with the plan.

The model is built on the CPU with real weights and run once at the smallest planned batch.
Each of the plan's devices is a *logical* device on the CPU: a dispatch mode tags every tensor
with the logical device it was made on and keeps each device's live bytes (a tensor-allocation
tracker, the CPU's stand-in for ``max_memory_allocated``); forward pre-hooks on the units copy
each argument that lives on another logical device, as a stage runner would, and count the copy
at that stage boundary. The measured crossings (per edge: bytes and count) and activation peaks
(per device) are compared with the plan; past ``tolerance`` the verdict fails.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchplace.errors import ConfigError
from torchplace.planner.crossings import flow
from torchplace.planner.hardware import GiB, MiB
from torchplace.planner.strategies import HOST
from torchplace.planner.trace import _key, _tensors

if TYPE_CHECKING:
    import torch
    from torch import nn

    from torchplace.planner.api import Plan

__all__ = ["Verdict", "verify"]

#: The largest model --verify builds in host memory.
MAX_VERIFY_BYTES = 4 * GiB


@dataclass
class Verdict:
    batch: int
    tolerance: float
    memory: list[dict[str, Any]] = field(default_factory=list)
    edges: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(m["ok"] for m in self.memory) and all(e["ok"] for e in self.edges)

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "tolerance": self.tolerance,
            "ok": self.ok,
            "memory": self.memory,
            "edges": self.edges,
        }

    def render(self) -> str:
        lines = [
            f"verify (batch {self.batch}, logical devices on the CPU, tolerance "
            f"{self.tolerance:.0%}): {'PASS' if self.ok else 'FAIL'}"
        ]
        for m in self.memory:
            lines.append(
                f"  {m['device']}: activation peak planned {m['planned'] / MiB:,.3f} MiB, "
                f"measured {m['measured'] / MiB:,.3f} MiB ({m['error']:+.1%}) "
                f"{'ok' if m['ok'] else 'PAST TOLERANCE'}"
            )
        for e in self.edges:
            lines.append(
                f"  {e['src']} -> {e['dst']} at {e['consumer']}: planned {e['planned_bytes']:,} B "
                f"x{e['planned_count']}, measured {e['measured_bytes']:,} B x{e['measured_count']} "
                f"{'ok' if e['ok'] else 'DIFFERS'}"
            )
        return "\n".join(lines) + "\n"


class _Runtime:
    """Logical devices on the CPU: where each tensor lives, and each device's live bytes."""

    def __init__(self, external: set[int]) -> None:
        self.external = external
        self.where: dict[int, str] = {}  # storage key -> logical device
        self.refs: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.live: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.current = HOST

    def hold(self, t: torch.Tensor, device: str) -> None:
        key = _key(t)
        if key in self.external:
            return
        if key not in self.where:
            self.where[key] = device
            self.sizes[key] = t.untyped_storage().nbytes()
            if device != HOST:
                self.live[device] = self.live.get(device, 0) + self.sizes[key]
                self.peak[device] = max(self.peak.get(device, 0), self.live[device])
        self.refs[key] = self.refs.get(key, 0) + 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        self.refs[key] -= 1
        if self.refs[key]:
            return
        del self.refs[key]
        device = self.where.pop(key)
        if device != HOST:
            self.live[device] -= self.sizes.pop(key)

    def device_of(self, t: torch.Tensor) -> str:
        return self.where.get(_key(t), self.current)


def _real_model(p: Plan) -> nn.Module:
    from torchplace.planner.inputs import load_plan_model

    total = sum(u.weight_bytes for u in p.units.units)
    if total > MAX_VERIFY_BYTES:
        raise ConfigError(
            f"--verify builds {p.model.name!r} with real weights on the host ({total / GiB:.1f} "
            f"GiB), more than the {MAX_VERIFY_BYTES / GiB:.0f} GiB it allows; verify a smaller "
            "model, or fewer layers of the same shape"
        )
    kind, _, spec = p.model.source.partition(":")  # as load_plan_model named it
    if kind == "exported":
        return load_plan_model("seed-mlp", exported=spec, device="cpu").module
    return load_plan_model(spec, device="cpu").module


def verify(p: Plan, *, tolerance: float = 0.10, module: nn.Module | None = None) -> Verdict:
    """Run ``p``'s placement at its smallest batch on logical CPU devices and compare."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    if not 0 < tolerance < 1:
        raise ConfigError(f"--tolerance {tolerance} must be a fraction between 0 and 1")
    model = module if module is not None else _real_model(p)
    batch = p.batches[0]
    placement = p.placement
    only = placement.devices[0] if placement.replicas > 1 else None
    rt = _Runtime({_key(t) for t in (*model.parameters(), *model.buffers())})
    measured: dict[tuple[str, str, str], list[int]] = {}
    copies: dict[tuple[int, str], torch.Tensor] = {}

    class Mode(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            args, kwargs = by_weights(args, kwargs or {})
            out = func(*args, **kwargs)
            for t in _tensors(out):
                rt.hold(t, rt.current)
            return out

    owners = {
        _key(t): path
        for path in p.units.paths
        for t in (*model.get_submodule(path).parameters(), *model.get_submodule(path).buffers())
    }
    active: list[str] = []  # units whose forward is running (their hooks moved the arguments)

    def by_weights(args: Any, kwargs: Any) -> tuple[Any, Any]:
        """Outside every unit's forward, an operator on one unit's weights runs on its device
        (a graph module reads weights without calling the module), as the plan has it."""
        if active:
            return args, kwargs
        found = {owners[k] for k in map(_key, _tensors((args, kwargs))) if k in owners}
        if len(found) != 1:
            return args, kwargs
        (unit,) = found
        dst = only or placement.device_of(unit)
        rt.current = dst

        def swap(v: Any) -> Any:
            if isinstance(v, torch.Tensor) and _key(v) not in owners and _key(v) not in rt.external:
                return moved(v, dst, unit)
            return v

        swapped: tuple[Any, Any] = tree_map(swap, (args, kwargs))
        return swapped

    def moved(t: torch.Tensor, dst: str, consumer: str) -> torch.Tensor:
        src = rt.device_of(t)
        if src == dst:
            return t
        cached = copies.get((_key(t), dst))
        if cached is not None and not placement.hooks:
            return cached
        before, rt.current = rt.current, (HOST if src == HOST else dst)  # inputs: not activations
        copy = t.clone()  # the copy a real runner makes, here on the same memory
        if _key(copy) not in rt.where:  # made inside the dispatch mode, which does not see it
            rt.hold(copy, rt.current)
        rt.current = before
        if src == HOST:
            rt.where[_key(copy)] = dst
        # a runner keeps the copy while the original lives, and no longer
        copies[(_key(t), dst)] = copy
        weakref.finalize(t, copies.pop, (_key(t), dst), None)
        entry = measured.setdefault((src, dst, consumer), [0, 0])
        entry[0] += t.numel() * t.element_size()
        entry[1] += 1
        return copy

    def pre(path: str) -> Any:
        def hook(_m: nn.Module, args: Any, kwargs: Any) -> Any:
            dst = only or placement.device_of(path)
            rt.current = dst
            active.append(path)

            def swap(v: Any) -> Any:
                return moved(v, dst, path) if isinstance(v, torch.Tensor) else v

            return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}

        return hook

    def post(_m: nn.Module, _args: Any, _out: Any) -> None:
        active.pop()

    handles = [
        model.get_submodule(path).register_forward_pre_hook(pre(path), with_kwargs=True)
        for path in p.units.paths
    ] + [model.get_submodule(path).register_forward_hook(post) for path in p.units.paths]
    inputs = p.model.example(batch, p.seq, "cpu")
    for t in inputs:
        rt.hold(t, HOST)
    # the model's own code before its first unit runs where that unit runs, as in the plan
    first = min(p.traces[batch].calls, key=lambda c: c.start).unit if p.traces[batch].calls else ""
    rt.current = only or placement.device_of(first)
    hooked = placement.hooks and only is None
    try:
        with torch.inference_mode(), Mode():  # type: ignore[no-untyped-call]
            if hooked:  # accelerate's way: the caller moves the inputs to the first device
                inputs = [moved(t, placement.devices[0], "(model call)") for t in inputs]
            out = model(*inputs)
            for t in _tensors(out):
                if hooked:  # and the top hook sends the output back to the inputs' device
                    t = moved(t, placement.devices[0], "(model return)")
                moved(t, HOST, "(host)")
    finally:
        for handle in handles:
            handle.remove()
    del out
    return _compare(p, batch, tolerance, rt.peak, measured, only)


def _compare(
    p: Plan,
    batch: int,
    tolerance: float,
    peaks: dict[str, int],
    measured: dict[tuple[str, str, str], list[int]],
    only: str | None,
) -> Verdict:
    verdict = Verdict(batch, tolerance)
    for dev, budget in p.budgets.items():
        if only is not None and dev != only:
            continue
        planned, got = budget.activation[batch], peaks.get(dev, 0)
        error = (planned - got) / got if got else (0.0 if planned == 0 else 1.0)
        verdict.memory.append(
            {
                "device": dev,
                "planned": planned,
                "measured": got,
                "error": error,
                "ok": abs(error) <= tolerance,
            }
        )
    planned_edges: dict[tuple[str, str, str], list[int]] = {}
    for c in flow(p.traces[batch], p.placement, replica=only).crossings:
        entry = planned_edges.setdefault((c.src, c.dst, c.consumer or "(model code)"), [0, 0])
        entry[0] += c.total
        entry[1] += c.count
    for key in dict.fromkeys([*planned_edges, *measured]):
        want, got_edge = planned_edges.get(key, [0, 0]), measured.get(key, [0, 0])
        verdict.edges.append(
            {
                "src": key[0],
                "dst": key[1],
                "consumer": key[2],
                "planned_bytes": want[0],
                "planned_count": want[1],
                "measured_bytes": got_edge[0],
                "measured_count": got_edge[1],
                "ok": want == got_edge,
            }
        )
    return verdict
