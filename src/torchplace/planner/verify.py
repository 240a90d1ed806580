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
    if not 0 < tolerance < 1:
        raise ConfigError(f"--tolerance {tolerance} must be a fraction between 0 and 1")
    model = module if module is not None else _real_model(p)
    run = _Run(p, model)
    run.run()
    return _compare(p, run.batch, tolerance, run.rt.peak, run.measured, run.only)


class _Run:
    """One forward of the placement: where it runs, the copies a runner makes, what they cost."""

    def __init__(self, p: Plan, model: nn.Module) -> None:
        self.p, self.model, self.batch = p, model, p.batches[0]
        self.placement = p.placement
        self.only = self.placement.devices[0] if self.placement.replicas > 1 else None
        self.rt = _Runtime({_key(t) for t in (*model.parameters(), *model.buffers())})
        self.measured: dict[tuple[str, str, str], list[int]] = {}
        self.copies: dict[tuple[int, str], torch.Tensor] = {}
        self.owners = {
            _key(t): path
            for path in p.units.paths
            for t in (*model.get_submodule(path).parameters(), *model.get_submodule(path).buffers())
        }
        self.active: list[str] = []  # units whose forward is running (their hooks moved the args)

    def device_of(self, unit: str) -> str:
        return self.only or self.placement.device_of(unit)

    def dispatch(self, func: Any, args: Any, kwargs: Any) -> Any:
        """The dispatch mode's work: run an operator, tag what it makes with the device."""
        args, kwargs = self.by_weights(args, kwargs or {})
        out = func(*args, **kwargs)
        for t in _tensors(out):
            self.rt.hold(t, self.rt.current)
        return out

    def by_weights(self, args: Any, kwargs: Any) -> tuple[Any, Any]:
        """Outside every unit's forward, an operator on one unit's weights runs on its device
        (a graph module reads weights without calling the module), as the plan has it."""
        import torch
        from torch.utils._pytree import tree_map

        if self.active:
            return args, kwargs
        found = {self.owners[k] for k in map(_key, _tensors((args, kwargs))) if k in self.owners}
        if len(found) != 1:
            return args, kwargs
        (unit,) = found
        dst = self.device_of(unit)
        self.rt.current = dst

        def swap(v: Any) -> Any:
            if (
                isinstance(v, torch.Tensor)
                and _key(v) not in self.owners
                and _key(v) not in self.rt.external
            ):
                return self.moved(v, dst, unit)
            return v

        swapped: tuple[Any, Any] = tree_map(swap, (args, kwargs))
        return swapped

    def moved(self, t: torch.Tensor, dst: str, consumer: str) -> torch.Tensor:
        """``t`` on ``dst`` for ``consumer``: a copy, counted on its edge, where it lives elsewhere."""
        rt = self.rt
        src = rt.device_of(t)
        if src == dst:
            return t
        cached = self.copies.get((_key(t), dst))
        if cached is not None and not self.placement.hooks:
            return cached
        before, rt.current = rt.current, (HOST if src == HOST else dst)  # inputs: not activations
        copy = t.clone()  # the copy a real runner makes, here on the same memory
        if _key(copy) not in rt.where:  # made inside the dispatch mode, which does not see it
            rt.hold(copy, rt.current)
        rt.current = before
        if src == HOST:
            rt.where[_key(copy)] = dst
        # a runner keeps the copy while the original lives, and no longer
        self.copies[(_key(t), dst)] = copy
        weakref.finalize(t, self.copies.pop, (_key(t), dst), None)
        entry = self.measured.setdefault((src, dst, consumer), [0, 0])
        entry[0] += t.numel() * t.element_size()
        entry[1] += 1
        return copy

    def pre_hook(self, path: str) -> Any:
        """The forward pre-hook of unit ``path``: its arguments copied to its device."""
        import torch

        def hook(_m: nn.Module, args: Any, kwargs: Any) -> Any:
            dst = self.device_of(path)
            self.rt.current = dst
            self.active.append(path)

            def swap(v: Any) -> Any:
                return self.moved(v, dst, path) if isinstance(v, torch.Tensor) else v

            return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}

        return hook

    def post_hook(self, _m: nn.Module, _args: Any, _out: Any) -> None:
        self.active.pop()

    def run(self) -> None:
        """The forward, with the hooks on every unit and the dispatch mode around it."""
        import torch

        p, model = self.p, self.model
        handles = [
            model.get_submodule(path).register_forward_pre_hook(
                self.pre_hook(path), with_kwargs=True
            )
            for path in p.units.paths
        ] + [
            model.get_submodule(path).register_forward_hook(self.post_hook)
            for path in p.units.paths
        ]
        inputs = p.model.example(self.batch, p.seq, "cpu")
        for t in inputs:
            self.rt.hold(t, HOST)
        # the model's own code before its first unit runs where that unit runs, as in the plan
        calls = p.traces[self.batch].calls
        self.rt.current = self.device_of(min(calls, key=lambda c: c.start).unit if calls else "")
        hooked = self.placement.hooks and self.only is None
        try:
            with torch.inference_mode(), _mode(self):
                if hooked:  # accelerate's way: the caller moves the inputs to the first device
                    inputs = [
                        self.moved(t, self.placement.devices[0], "(model call)") for t in inputs
                    ]
                out = model(*inputs)
                for t in _tensors(out):
                    if hooked:  # and the top hook sends the output back to the inputs' device
                        t = self.moved(t, self.placement.devices[0], "(model return)")
                    self.moved(t, HOST, "(host)")
        finally:
            for handle in handles:
                handle.remove()


def _mode(run: _Run) -> Any:
    """A dispatch mode that hands every operator to ``run``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            return run.dispatch(func, args, kwargs)

    return Mode()  # type: ignore[no-untyped-call]


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
