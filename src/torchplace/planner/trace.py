"""One forward on ``meta``, recorded: every allocation, who made it, who read it, and FLOPs.

:func:`trace_forward` runs the model once per batch size on ``meta`` tensors (no memory, no
kernels) under a :class:`~torch.utils._python_dispatch.TorchDispatchMode` that sees every aten
operator. For each new storage it records the bytes, the *unit* (the placeable module, see
:mod:`torchplace.planner.units`) running at the time, and the operator index at which the last
tensor holding it died; each read of a recorded storage is kept with its reader; FLOPs come
from :data:`torch.utils.flop_counter.flop_registry`, the table behind ``FlopCounterMode``.
Every placement is then evaluated on this record without running the model again.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchplace.errors import PlacementError

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["GLUE", "INPUT", "Alloc", "Trace", "UnitCall", "label", "trace_forward"]

#: Operators run outside every unit (the model's own forward between its units). Not a module
#: path: the root module's path is ``""``, a unit when the model is placed whole.
GLUE = "(model code)"
INPUT = "<input>"  # owner of the model's inputs


def label(unit: str) -> str:
    """How reports name a unit, the model's own code (GLUE) or its inputs."""
    return "(model)" if unit == "" else "input" if unit == INPUT else unit


@dataclass
class Alloc:
    """One storage made during the forward (or a model input)."""

    index: int
    nbytes: int
    owner: str  # unit that made it, GLUE, or INPUT
    start: int  # operator index at which it was made
    end: int  # operator index after which it died; ``Trace.ops`` when alive at the end
    shape: tuple[int, ...]
    dtype: str
    name: str = ""


@dataclass
class UnitCall:
    """One call of a unit: when it ran and the recorded tensors among its arguments."""

    unit: str
    start: int
    end: int
    args: list[int] = field(default_factory=list)  # Alloc indices


@dataclass
class Trace:
    """What one forward did, at one batch size and sequence length."""

    batch: int
    seq: int | None
    ops: int
    allocs: list[Alloc]
    calls: list[UnitCall]
    reads: list[tuple[int, str, int]]  # (operator index, reader unit or GLUE, Alloc index)
    flops: dict[str, int]  # unit (or GLUE) -> FLOPs
    outputs: list[int]  # Alloc indices of the model's outputs

    def peak(self) -> int:
        """Activation peak on one device: most bytes alive at once, inputs excluded."""
        return _sweep((a.start, a.end, a.nbytes) for a in self.allocs if a.owner != INPUT)


def _sweep(spans: Iterator[tuple[int, int, int]] | Sequence[tuple[int, int, int]]) -> int:
    events: list[tuple[int, int]] = []
    for start, end, nbytes in spans:
        events.append((start, nbytes))
        events.append((end, -nbytes))  # alive over [start, end): freed before `end` allocates
    live = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        live += delta
        peak = max(peak, live)
    return peak


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in an operator's arguments or results, or a model's output (tuples, lists,
    dicts, dataclasses, nested)."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):  # a model's output
        for item in dataclasses.fields(value):
            yield from _tensors(getattr(value, item.name))


def _key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


class _Recorder:
    """The bookkeeping behind the dispatch mode (kept apart so it is plain, typed Python)."""

    def __init__(self, external: dict[int, str]) -> None:
        from torch.utils.flop_counter import flop_registry

        self.registry = flop_registry
        self.external = external  # parameter/buffer storage -> its unit: never allocations
        self.op = 0
        self.stack: list[str] = []
        self.allocs: list[Alloc] = []
        self.live: dict[int, int] = {}  # storage key -> Alloc index
        self.refs: dict[int, int] = {}  # storage key -> live tensors holding it
        self.calls: list[UnitCall] = []
        self.reads: list[tuple[int, str, int]] = []
        self.flops: dict[str, int] = {}
        self.composite: dict[Any, bool] = {}  # operator -> has a composite decomposition

    def _composite(self, func: Any) -> bool:
        known = self.composite.get(func)
        if known is None:
            import torch

            known = torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), "CompositeImplicitAutograd"
            )
            self.composite[func] = known
        return known

    def _by_weights(self, tensors: list[torch.Tensor]) -> str:
        """Outside every unit's forward, an operator on one unit's weights belongs to it: a
        graph module (``torch.export``) or functional code reads weights without calling the
        module. Consecutive such operators make one call of that unit."""
        owners = {self.external[k] for k in map(_key, tensors) if self.external.get(k)}
        if len(owners) != 1:
            return GLUE
        (unit,) = owners
        args = [i for i in map(self.lookup, tensors) if i is not None]
        last = self.calls[-1] if self.calls else None
        if last is not None and last.unit == unit and last.end == self.op - 1:
            last.end = self.op
            last.args += [i for i in args if self.allocs[i].owner != unit and i not in last.args]
        else:
            self.calls.append(UnitCall(unit, self.op, self.op, args))
        return unit

    @property
    def unit(self) -> str:
        return self.stack[-1] if self.stack else GLUE

    def hold(self, t: torch.Tensor, owner: str, name: str = "") -> int | None:
        key = _key(t)
        if key in self.external:
            return None
        if key not in self.live:
            nbytes = t.untyped_storage().nbytes()
            index = len(self.allocs)
            self.allocs.append(
                Alloc(index, nbytes, owner, self.op, -1, tuple(t.shape), _dtype(t), name)
            )
            self.live[key] = index
        self.refs[key] = self.refs.get(key, 0) + 1
        weakref.finalize(t, self._release, key)
        return self.live[key]

    def _release(self, key: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            self.allocs[self.live.pop(key)].end = self.op

    def lookup(self, t: torch.Tensor) -> int | None:
        return self.live.get(_key(t))

    def dispatch(self, mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        packet = func._overloadpacket
        if packet not in self.registry and self._composite(func):
            # A composite operator (linear, matmul, ...): record the operators it is made of,
            # as FlopCounterMode does, so that FLOPs and hidden copies are seen.
            with mode:
                result = func.decompose(*args, **kwargs)
            if result is not NotImplemented:
                return result
        unit = self.unit
        tensors = list(_tensors((args, kwargs)))
        if unit == GLUE:
            unit = self._by_weights(tensors)
        for t in tensors:
            index = self.lookup(t)
            if index is not None:
                self.reads.append((self.op, unit, index))
        out = func(*args, **kwargs)
        if packet in self.registry:
            count = int(self.registry[packet](*args, **kwargs, out_val=out))
            self.flops[unit] = self.flops.get(unit, 0) + count
        for t in _tensors(out):
            self.hold(t, unit)
        self.op += 1
        return out


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def trace_forward(
    module: nn.Module,
    inputs: Sequence[torch.Tensor],
    units: Sequence[str],
    *,
    batch: int,
    seq: int | None,
) -> Trace:
    """Run ``module(*inputs)`` once under the recorder; ``units`` are module paths."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from torchplace.planner.units import is_tensor_unit, unit_tensors

    external = {_key(t): "" for t in (*module.parameters(), *module.buffers())}
    for path in units:
        params, buffers = unit_tensors(module, path)
        external.update({_key(t): path for t in (*params.values(), *buffers.values())})
    rec = _Recorder(external)

    class Mode(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            return rec.dispatch(self, func, args, kwargs or {})

    handles = []
    for path in units:
        if not is_tensor_unit(module, path):  # a tensor unit is called when its tensor is read
            handles.extend(_hooks(module.get_submodule(path), path, rec))
    names = [f"input_{i}" if len(inputs) > 1 else "input" for i in range(len(inputs))]
    held = [rec.hold(t, INPUT, name) for t, name in zip(inputs, names, strict=True)]
    try:
        with torch.inference_mode(), Mode():  # type: ignore[no-untyped-call]
            out = module(*inputs)
    except (RuntimeError, NotImplementedError) as exc:
        raise PlacementError(
            f"cannot trace the model on 'meta': {exc}. The planner runs the forward without "
            "data; a model whose control flow reads tensor values cannot be planned this way"
        ) from exc
    except Exception as exc:  # the model's own forward failed: say so in one line
        raise PlacementError(
            f"cannot trace the model on 'meta': its forward raised {type(exc).__name__}: {exc}; "
            "check the declared inputs (--input) match what the forward expects"
        ) from exc
    finally:
        for handle in handles:
            handle.remove()
    outputs = []
    for t in _tensors(out):
        index = rec.lookup(t)
        if index is not None:
            rec.allocs[index].shape = tuple(t.shape)  # as returned, not as first allocated
            outputs.append(index)
    for index in (*outputs, *(i for i in held if i is not None)):
        rec.allocs[index].end = rec.op  # alive when the forward returns
    del out
    for alloc in rec.allocs:
        if alloc.end < 0:  # still held by something the forward kept (a cache, a closure)
            alloc.end = rec.op
    return Trace(batch, seq, rec.op, rec.allocs, rec.calls, rec.reads, rec.flops, outputs)


def _hooks(sub: nn.Module, path: str, rec: _Recorder) -> list[Any]:
    def pre(_m: nn.Module, args: Any, kwargs: Any) -> None:
        call = UnitCall(path, rec.op, -1)
        call.args = [i for i in (rec.lookup(t) for t in _tensors((args, kwargs))) if i is not None]
        rec.calls.append(call)
        rec.stack.append(path)

    def post(_m: nn.Module, _args: Any, _kwargs: Any, _out: Any) -> None:
        rec.stack.pop()
        next(c for c in reversed(rec.calls) if c.unit == path and c.end < 0).end = rec.op - 1

    return [
        sub.register_forward_pre_hook(pre, with_kwargs=True),
        sub.register_forward_hook(post, with_kwargs=True),
    ]
