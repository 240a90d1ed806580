"""One forward of a planned placement, for real: where each tensor lives, the copies a runner
makes, and what they cost.

The plan's devices are *logical*; each maps onto a *real* device (``cpu`` on a CPU-only
machine, ``cuda:N`` on a GPU one, several logical devices possibly on one real device). A
dispatch mode tags every tensor with the logical device it was made on and keeps each logical
device's live bytes (a tensor-allocation tracker); wrappers around the units' forward copy each
argument that lives on another logical device, as a stage runner would, and count the copy at
that stage boundary; the model's own code between units runs where the last unit ran, its
operands from other logical devices copied there (once each), as the plan has it, and so is a
unit's weight read on another logical device than its unit's (by a unit or that code). A copy
between two real devices is ``Tensor.to`` (what ``torchplace.guard`` sees); between two
logical devices on one real device it is a clone, so memory is spent as the plan has it. A
tensor the model's own code made on another real device than its logical
one (``torch.arange(n, device=ids.device)`` while ``ids`` is still on the host) is moved too:
a real transfer, counted by the guard but not at a stage boundary.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from torchplace.planner.fused import as_planned, opaque
from torchplace.planner.inputs import call_arguments
from torchplace.planner.strategies import HOST
from torchplace.planner.trace import (
    GLUE,
    _key,
    _tensors,
    decomposable,
    decomposed,
    label,
    python_decomposed,
    returned,
)
from torchplace.planner.units import submodule, tensor_slot, unit_tensors
from torchplace.planner.values import _written

if TYPE_CHECKING:
    import torch
    from torch import nn

    from torchplace.planner.api import Plan

__all__ = ["Run", "place_weights"]


class _Runtime:
    """Where each tensor lives (logical device), and each logical device's live bytes."""

    def __init__(self, external: set[int]) -> None:
        self.external = external
        self.where: dict[int, str] = {}  # storage key -> logical device
        self.refs: dict[int, int] = {}
        # storage key -> the logical device whose live bytes it was added to, and how many
        # (an input's copy is re-tagged with its device after it is held, and counted nowhere)
        self.counted: dict[int, tuple[str, int]] = {}
        self.live: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        # storage keys of the model's inputs and their copies, while they live: a storage
        # made later at a freed one's address is not an input
        self.inputs: set[int] = set()
        self.current = HOST
        self.on_free: Callable[[int], None] = lambda key: None  # a storage's last tensor died

    def hold(self, t: torch.Tensor, device: str) -> None:
        key = _key(t)
        if key in self.external:
            return
        if key not in self.where:
            self.where[key] = device
            if device != HOST:
                self.counted[key] = (device, t.untyped_storage().nbytes())
                self.live[device] = self.live.get(device, 0) + self.counted[key][1]
                self.peak[device] = max(self.peak.get(device, 0), self.live[device])
        self.refs[key] = self.refs.get(key, 0) + 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        self.refs[key] -= 1
        if self.refs[key]:
            return
        del self.refs[key]
        del self.where[key]
        self.inputs.discard(key)
        if key in self.counted:
            device, nbytes = self.counted.pop(key)
            self.live[device] -= nbytes
        self.on_free(key)

    def device_of(self, t: torch.Tensor) -> str:
        return self.where.get(_key(t), self.current)


def place_weights(p: Plan, model: nn.Module, real: dict[str, torch.device]) -> None:
    """Each unit's weights on the real device of its logical one (one replica's, replicated);
    weights outside every unit go with the first unit."""
    only = p.placement.replica
    paths = p.units.paths
    first = only or (p.placement.device_of(paths[0]) if paths else p.placement.devices[0])
    model.to(real[first])
    for path in paths:
        _move_unit(model, path, real[only or p.placement.device_of(path)])


def _move_unit(model: nn.Module, path: str, device: torch.device) -> None:
    """A module unit with ``.to``; a tensor unit (a parameter or buffer) in place."""
    slot = tensor_slot(model, path)
    if slot is None:
        submodule(model, path).to(device)
        return
    parent, leaf = slot
    tensor = parent._parameters.get(leaf)
    if tensor is None:
        parent._buffers[leaf] = parent._buffers[leaf].to(device)  # type: ignore[union-attr]
    else:
        tensor.data = tensor.data.to(device)


class Run:
    """One forward of ``p``'s placement on ``real`` devices (logical device -> real one)."""

    def __init__(self, p: Plan, model: nn.Module, real: dict[str, torch.device]) -> None:
        self.p, self.model, self.real, self.batch = p, model, real, p.batches[0]
        self.placement = p.placement
        self.only = self.placement.replica
        self.rt = _Runtime({_key(t) for t in (*model.parameters(), *model.buffers())})
        self.measured: dict[tuple[str, str, str], list[int]] = {}
        self.copies: dict[tuple[tuple[Any, ...], str], torch.Tensor] = {}
        self.kept: dict[int, list[tuple[Any, ...]]] = {}  # storage -> the copies kept of it
        self.rt.on_free = self._forget
        held = [
            (_key(t), path)
            for path in p.units.paths
            for group in unit_tensors(model, path)
            for t in group.values()
        ]
        self.owners = dict(held)
        counts: dict[int, int] = {}
        for key, _ in dict.fromkeys(held):
            counts[key] = counts.get(key, 0) + 1
        self.shared = {k for k, n in counts.items() if n > 1}  # tied: each holder has its own
        self.active: list[str] = []  # units whose forward is running (their args moved)
        self.tracked = all(d.type == "cpu" for d in real.values())  # memory by the tracker

    def device_of(self, unit: str) -> str:
        return self.only or self.placement.device_of(unit)

    def dispatch(self, mode: Any, func: Any, args: Any, kwargs: Any) -> Any:
        """The dispatch mode's work: run an operator, tag what it makes with the device. As
        the plan has them: a composite operator runs as the operators it is made of, and, on
        the CPU (the tracker), a fused one whose temporaries no operator shows as its parts
        (:func:`torchplace.planner.fused.opaque`)."""
        kwargs = kwargs or {}
        parts = opaque(func) if self.tracked else None
        # a real device measures its own kernels: a recurrent layer runs whole there
        whole = not self.tracked and python_decomposed(func)
        if parts is None and decomposable(func) and not whole:  # its parts gather their operands
            with mode, _as_traced(func):
                result = decomposed(func, args, kwargs)
            if result is not NotImplemented:
                return result
        given = _written(func, args, kwargs)
        args, kwargs = self.by_weights(func, args, kwargs)
        self.rewritten(given, _written(func, args, kwargs))
        if parts is not None:
            with mode:
                return parts(lambda _flops: None, *args, **kwargs)
        out = func(*args, **kwargs)
        if self.tracked:  # the tracker counts what the planned (CUDA) kernel makes
            out = as_planned(func, args, kwargs, out)
        for t in _tensors(out):
            self.rt.hold(t, self.rt.current)
        return out

    def rewritten(self, given: list[torch.Tensor], written: list[torch.Tensor]) -> None:
        """An operator writing in place into the copy of a tensor from another device (the
        model's code's ``x += shortcut`` where the shortcut's unit ran): the tensor's values
        are now the copy's, where it lives, as the plan has them; later reads copy from there."""
        for t, copy in zip(given, written, strict=True):
            if _key(copy) != _key(t) and _key(t) in self.rt.where and _key(t) not in self.owners:
                self.rt.where[_key(t)] = self.rt.device_of(copy)

    def by_weights(self, func: Any, args: Any, kwargs: Any) -> tuple[Any, Any]:
        """Outside every unit's forward, an operator on one unit's weights runs on its device
        (a graph module reads weights without calling the module), as the plan has it; any
        other operator there (the model's own code) runs where the last unit ran, its
        arguments from other devices copied there, as the plan has it. A view of another
        unit's weight (``enc.weight.t()`` in a decoder) is taken on the weight itself: the view
        costs nothing, and the operator that reads it copies it (a view of a copy, an inference
        tensor, cannot stand for a view of the weight, which autograd tracks)."""
        if self.active:
            return (args, kwargs) if getattr(func, "is_view", False) else self.foreign(args, kwargs)
        found = {self.owners[k] for k in map(_key, _tensors((args, kwargs))) if k in self.owners}
        if len(found) == 1:
            (unit,) = found
            self.rt.current = self.device_of(unit)
            return self.gathered(args, kwargs, unit)
        return self.gathered(args, kwargs, GLUE)

    def foreign(self, args: Any, kwargs: Any) -> tuple[Any, Any]:
        """Inside a unit's forward: another unit's weights, where that unit is on another
        device, copied to this one (once), as the plan has it."""
        import torch
        from torch.utils._pytree import tree_map

        reader = self.active[-1]
        if reader == "(copy)":
            return args, kwargs
        dst = self.device_of(reader)

        def swap(v: Any) -> Any:
            if isinstance(v, torch.Tensor) and self.owners.get(_key(v), reader) != reader:
                return self.moved(v, dst, reader, once=True)
            return v

        swapped: tuple[Any, Any] = tree_map(swap, (args, kwargs))
        return swapped

    def home(self, t: torch.Tensor) -> str:
        """The logical device ``t`` lives on: its unit's, for a (not tied) weight."""
        owner = self.owners.get(_key(t))
        if owner is None or _key(t) in self.shared:
            return self.rt.device_of(t)
        return self.device_of(owner)

    def gathered(self, args: Any, kwargs: Any, consumer: str) -> tuple[Any, Any]:
        """The operator's tensors (not the model's weights) on the current logical device."""
        import torch
        from torch.utils._pytree import tree_map

        dst = self.rt.current

        def swap(v: Any) -> Any:
            if not isinstance(v, torch.Tensor):
                return v
            if _key(v) in self.owners:  # a unit's weight: copied where it is not on dst
                return self.moved(v, dst, consumer, once=True)
            return v if _key(v) in self.rt.external else self.moved(v, dst, consumer)

        swapped: tuple[Any, Any] = tree_map(swap, (args, kwargs))
        return swapped

    def moved(
        self, t: torch.Tensor, dst: str, consumer: str, *, once: bool = False
    ) -> torch.Tensor:
        """``t`` on logical device ``dst`` for ``consumer``: a copy where it lives elsewhere,
        counted on its edge when it crosses between logical devices."""
        rt = self.rt
        src, there = self.home(t), self.real[dst]
        crossing = src != dst
        if not crossing and t.device == there:
            return t
        part = _part(t)
        cached = self.copies.get((part, dst))
        # dispatch hooks copy a module's arguments on every call and keep none: the copy dies
        # with the call (or with what the module keeps of it); the model's own code's copies,
        # and a stage runner's, are kept while the original lives and serve every later read
        hooked = crossing and self.placement.hooks and consumer != GLUE and not once
        if cached is not None and not hooked:  # a part's copy is that part, dense
            return cached if len(part) > 1 else _as(cached, t, rt)
        # a model input, and every copy of one, is an input where it lands, not an activation
        # (as the plan counts it), whichever device it comes from; what a unit placed on the
        # host made (accelerate's spill) is an activation like any other
        is_input = _key(t) in rt.inputs
        before, rt.current = rt.current, (HOST if is_input else dst)
        # the copy a real runner makes: to another real device, or beside it on the same one
        # (its own operator is the runner's, not the model's code: nothing to gather for it)
        self.active.append("(copy)")
        try:
            copy = t.to(there) if t.device != there else t.clone()
        finally:
            self.active.pop()
        if _key(copy) not in rt.where:  # made inside the dispatch mode, which does not see it
            rt.hold(copy, rt.current)
        rt.current = before
        if is_input:
            rt.where[_key(copy)] = dst
            rt.inputs.add(_key(copy))
        if not hooked:  # a runner keeps the copy while the original lives, and no longer
            self.keep((part, dst), copy, t)
        if crossing:
            entry = self.measured.setdefault((src, dst, label(consumer)), [0, 0])
            entry[0] += t.numel() * t.element_size()
            entry[1] += 1
        return copy

    def keep(self, where: tuple[Any, ...], copy: torch.Tensor, t: torch.Tensor) -> None:
        """Keep ``copy`` of ``t`` as long as the storage of ``t`` lives (not the tensor ``t``:
        a view taken for one operator, as an exported graph takes them, dies at once)."""
        self.copies[where] = copy
        key = _key(t)
        if key in self.rt.refs:
            self.kept.setdefault(key, []).append(where)
        else:  # a weight, alive all along, or a tensor the runtime does not follow
            weakref.finalize(t, self.copies.pop, where, None)

    def _forget(self, key: int) -> None:
        for where in self.kept.pop(key, ()):
            self.copies.pop(where, None)

    def wrap(self, path: str, sub: nn.Module) -> Callable[[], None]:
        """Unit ``path``'s forward (``sub``'s: the unit's module, or one in a container unit),
        its arguments first copied to its device (a wrapper, as accelerate's hooks are, so
        PyTorch's fast paths stay on); returns what undoes it."""
        import torch

        forward, own = sub.forward, sub.__dict__.get("forward")

        def swap(v: Any) -> Any:
            return self.moved(v, self.device_of(path), path) if isinstance(v, torch.Tensor) else v

        @functools.wraps(forward)  # its signature too: the model's own is read to call it
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.rt.current = self.device_of(path)
            self.active.append(path)
            try:
                # the tensors inside a tuple, list or dict argument too (Llama's layers take
                # rotary (cos, sin) as one), as the plan reads them and accelerate's hooks
                # (send_to_device) copy them
                moved = [_kept(swap, a) for a in args]
                return forward(*moved, **{k: _kept(swap, v) for k, v in kwargs.items()})
            finally:
                self.active.pop()
                if self.active and self.active[-1] != "(copy)":
                    # a unit called inside another's forward (a module both a unit and a
                    # part of another, as CoaT's shared ``cpe``): the caller's code runs on
                    self.rt.current = self.device_of(self.active[-1])

        sub.forward = wrapped
        return lambda: _restore(sub, own)

    def run(self) -> None:
        """The forward, every unit's forward wrapped and the dispatch mode around it."""
        import torch

        from torchplace.planner.trace import called_modules

        p, model = self.p, self.model
        undo = [
            self.wrap(path, sub) for path in p.units.paths for sub in called_modules(model, path)
        ]
        with torch.inference_mode():  # like every tensor of the run: a view of one is made
            # on its copy (by the mode), which autograd's view tracking refuses across the two
            inputs = p.model.example(self.batch, p.seq, "cpu")
        for t in inputs:
            self.rt.hold(t, HOST)
            self.rt.inputs.add(_key(t))
        # the model's own code before its first unit runs where that unit runs, as in the plan
        calls = p.traces[self.batch].calls
        self.rt.current = self.device_of(min(calls, key=lambda c: c.start).unit if calls else "")
        hooked = self.placement.hooks and self.only is None
        try:
            with torch.inference_mode(), _mode(self):
                if hooked:  # accelerate's way: the caller moves the inputs to its main device
                    inputs = [self.moved(t, self.placement.entry, "(model call)") for t in inputs]
                args, kwargs = call_arguments(model, inputs, [s.name for s in p.model.inputs])
                out = model(*args, **kwargs)
                sent = []  # what the top hook sends back: the caller holds all of it at once
                for t, back in returned(out):
                    if hooked and back:  # the top hook sends the output to the inputs' device
                        t = self.moved(t, self.placement.entry, "(model return)")
                        sent.append(t)
                    self.moved(t, HOST, "(host)")
                del sent
        finally:
            for restore in undo:
                restore()


@contextlib.contextmanager
def _as_traced(func: Any) -> Iterator[None]:
    """A recurrent layer's decomposition as the plan traced it: on the CPU it would take
    oneDNN's one operator per layer (for an LSTM without projections), whose steps the tracker
    cannot see; ``meta`` takes the steps. oneDNN is off for the call, and only that flag."""
    import torch

    if not python_decomposed(func):
        yield
        return
    enabled = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(enabled)


def _part(t: torch.Tensor) -> tuple[Any, ...]:
    """What a copy of ``t`` is kept under, as the plan counts copies: its storage, when ``t``
    is the whole of it (every view of the storage then reads the one copy), else the part of
    the storage ``t`` is (a chunk, a token, an expanded tensor: each a copy of its own)."""
    if t.numel() * t.element_size() == t.untyped_storage().nbytes():
        return (_key(t),)
    return (_key(t), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _as(copy: torch.Tensor, t: torch.Tensor, rt: _Runtime) -> torch.Tensor:
    """``copy``, a copy of the whole storage of ``t``, seen as ``t`` sees its own: a copy of a
    dense tensor keeps its layout, so the other views of that storage are views of the copy."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    if (copy.shape, copy.stride(), copy.storage_offset(), copy.dtype) == (
        t.shape, t.stride(), t.storage_offset(), t.dtype
    ):  # fmt: skip
        return copy
    with _disable_current_modes(), torch.inference_mode():
        view = copy.as_strided(t.shape, t.stride(), t.storage_offset())
    rt.hold(view, rt.where.get(_key(copy), HOST))
    return view


def _restore(sub: nn.Module, own: Any) -> None:
    """``sub``'s forward as it was before :meth:`Run.wrap`."""
    if own is None:
        del sub.forward
    else:
        sub.forward = own


def _mode(run: Run) -> Any:
    """A dispatch mode that hands every operator to ``run``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            return run.dispatch(self, func, args, kwargs)

    return Mode()  # type: ignore[no-untyped-call]


def _kept(swap: Callable[[Any], Any], value: Any) -> Any:
    """``value`` with ``swap`` applied to each tensor in it, itself where none changes: a
    list a unit fills in place (Wan's VAE, each convolution's cached frames replaced in the
    list it is handed) stays the model's own, as in a run without hooks."""
    from torch.utils._pytree import tree_leaves, tree_map

    swapped = tree_map(swap, value)
    same = all(a is b for a, b in zip(tree_leaves(value), tree_leaves(swapped), strict=True))
    return value if same else swapped
