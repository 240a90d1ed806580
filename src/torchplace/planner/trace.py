"""One forward on ``meta``, recorded: every allocation, who made it, who read it, and FLOPs.

:func:`trace_forward` runs the model once per batch size on ``meta`` tensors (no memory, no
kernels) under a :class:`~torch.utils._python_dispatch.TorchDispatchMode` that sees every aten
operator. For each new storage it records the bytes, the *unit* (the placeable module, see
:mod:`torchplace.planner.units`) running at the time, and the operator index at which the last
tensor holding it died; each read of a recorded storage is kept with its reader (a read of a
unit's parameter or buffer by another unit, or by the model's own code, as a read of that
weight); FLOPs come from :data:`torch.utils.flop_counter.flop_registry`, the table behind
``FlopCounterMode``. Operators whose ``meta`` kernels make other tensors than the real ones run
as :mod:`torchplace.planner.fused` has them. Every placement is then evaluated on this record
without running the model again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchplace.errors import ConfigError, PlacementError
from torchplace.planner.fused import (
    autocast_on_meta,
    causal_masks_unknown,
    fast_paths,
    replacement,
)
from torchplace.planner.strict import refuse_mixed_dtypes
from torchplace.planner.values import Values, constants, fails_with_data, give, value_of

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "GLUE",
    "INPUT",
    "RETURNED",
    "Alloc",
    "Hooks",
    "Trace",
    "UnitCall",
    "UntraceableModel",
    "called_modules",
    "decomposable",
    "decomposed",
    "label",
    "python_decomposed",
    "returned",
    "trace_forward",
]

#: Operators run outside every unit (the model's own forward between its units). Not a module
#: path: the root module's path is ``""``, a unit when the model is placed whole.
GLUE = "(model code)"
INPUT = "<input>"  # owner of the model's inputs
RETURNED = "(returned)"  # the reader of the model's outputs (its caller), in ``Trace.seen``
_MADE = "_torchplace_made"  # on a tensor that is a part of a storage: (operator, maker)
_COPY = "_torchplace_copy"  # on a tensor of a copy dispatch hooks handed a unit: its _Copy
_ALIASES = "_torchplace_aliases"  # on a recorded tensor: the _Alias groups it belongs to


class UntraceableModel(PlacementError, ConfigError):
    """The forward cannot run on ``meta`` with the declared inputs: a PlacementError, and a
    usage error for the command line (exit 2), since the fix is the model's or its inputs'."""


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
    weight: bool = False  # a unit's parameter or buffer, read by another unit (not an activation)
    # a part of the storage of Alloc ``view_of`` as a unit, the model's code or the caller took
    # it (a chunk, a token, an expanded tensor): no memory of its own, but a copy of it is
    # its own bytes (numel x element size, what ``Tensor.to`` copies); ``start`` is when the
    # unit (or GLUE) ``maker`` made it, a view of a copy where that code's device had one
    view_of: int | None = None
    maker: str = ""


@dataclass
class UnitCall:
    """One call of a unit: when it ran and the recorded tensors among its arguments."""

    unit: str
    start: int
    end: int
    args: list[int] = field(default_factory=list)  # Alloc indices
    # through the unit's forward; else found by the weights its operators read (a module the
    # model's code reads the weights of without calling it, a TorchScript or graph module)
    forward: bool = False
    # of its arguments, those it returned as it was handed them (nn.Dropout, nn.Identity)
    returned: list[int] = field(default_factory=list)
    # dispatch hooks' copies: position in ``args`` -> the operator at which the copy handed
    # there died (the tensor handed, what the unit returned of it, the views taken of that),
    # which may be long before its original (T5's ``dropout(inputs_embeds)``, its copy
    # replaced by the first block's output while ``inputs_embeds`` lives on)
    handed: dict[int, int] = field(default_factory=dict)
    # no hooks (a stage runner's trace): of the arguments it returned as it came, each as an
    # alias of its own (what a runner's unit returns is the copy it was handed, not the
    # caller's tensor), the operator at which the last tensor of the argument's storage that
    # is neither that alias nor made of it died: where the original lives on a device the
    # unit is not on, it dies there (``h = self.dropout(h)``), or lives on where the code
    # keeps it (T5's ``inputs_embeds``)
    outlived: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Hooks:
    """A placement dispatched by hooks (accelerate's), for its trace: each unit's device
    (``entry`` where ``assign`` has none) and ``entry``, where the caller puts the inputs."""

    assign: tuple[tuple[str, str], ...]
    entry: str

    @functools.cached_property
    def _devices(self) -> dict[str, str]:
        return dict(self.assign)

    def device(self, unit: str) -> str:
        return self._devices.get(unit, self.entry)


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
    # (operator index, reader, Alloc index) -> the shape the reader received the tensor in,
    # where it is not the one its storage was made in (a Linear's 2-D matmul output, viewed
    # back to 3-D); a call's arguments are read at its start, the outputs at ``ops``
    seen: dict[tuple[int, str, int], tuple[int, ...]] = field(default_factory=dict)
    # positions in ``outputs`` of those inside a structure dispatch hooks return as it is
    # (a plain dataclass: accelerate's ``send_to_device`` moves tensors, tuples, lists, dicts)
    unmoved: frozenset[int] = frozenset()
    # no hooks: positions in ``outputs`` of a storage a unit returned as it came, each with
    # the unit whose copy it is, under a stage runner, or None for the original (T5Gemma's
    # norm output returned beside what the dropout elsewhere returned of it)
    aliased: dict[int, str | None] = field(default_factory=dict)

    def received(self, op: int, reader: str, index: int) -> tuple[int, ...]:
        """The shape in which ``reader`` received Alloc ``index`` at operator ``op``."""
        return self.seen.get((op, reader, index), self.allocs[index].shape)

    def peak(self) -> int:
        """Activation peak on one device: most bytes alive at once, inputs excluded."""
        spans = (a for a in self.allocs if a.owner != INPUT and not a.weight and a.view_of is None)
        return _sweep((a.start, a.end, a.nbytes) for a in spans)


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


def returned(value: Any, moved: bool = True) -> Iterator[tuple[torch.Tensor, bool]]:
    """A model's output tensors, as :func:`_tensors` finds them, each with whether dispatch
    hooks send it back to the inputs' device: not inside a plain dataclass, which accelerate's
    ``send_to_device`` returns as it is."""
    import torch

    if isinstance(value, torch.Tensor):
        yield value, moved
    elif isinstance(value, tuple | list):
        for item in value:
            yield from returned(item, moved)
    elif isinstance(value, dict):
        for item in value.values():
            yield from returned(item, moved)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in dataclasses.fields(value):
            yield from returned(getattr(value, item.name), False)


def _key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


class _Copy:
    """A copy dispatch hooks hand a unit (on ``meta``, a view of the original's storage): on a
    real device a storage of its own, alive while a tensor of it is, the one handed or what
    was taken of it (returned as it came, viewed), whatever the original does."""

    def __init__(self, rec: _Recorder, call: UnitCall, position: int) -> None:
        self.rec, self.call, self.position, self.refs = rec, call, position, 0

    def join(self, t: torch.Tensor) -> None:
        setattr(t, _COPY, self)
        self.refs += 1
        weakref.finalize(t, self._release)

    def _release(self) -> None:
        self.refs -= 1
        if self.refs == 0:
            self.call.handed[self.position] = self.rec.op


class _Alias:
    """What a unit returned of an argument as it came, under a stage runner the unit's own
    copy of it: the tensors of that copy (the alias the caller gets, the views taken of it,
    aliases made of it in turn) among those of the argument's storage, so that the original's
    own end is known (:attr:`UnitCall.outlived`)."""

    def __init__(self, rec: _Recorder, call: UnitCall, index: int) -> None:
        self.rec, self.call, self.index, self.members = rec, call, index, 0

    def join(self, t: torch.Tensor) -> None:
        cell: _Cell = getattr(t, _ALIASES)
        if self not in cell.groups:
            cell.groups.append(self)
            self.members += cell.holds


@dataclass
class _Cell:
    """A recorded tensor's :class:`_Alias` groups, and how often it was held (an in-place
    operator returns its operand, held again): each hold a member of each group."""

    groups: list[_Alias] = field(default_factory=list)
    holds: int = 0


class _Recorder:
    """The bookkeeping behind the dispatch mode (kept apart so it is plain, typed Python)."""

    def __init__(self, external: dict[int, str], shared: set[int]) -> None:
        from torch.utils.flop_counter import flop_registry

        self.registry = flop_registry
        self.external = external  # parameter/buffer storage -> its unit: never allocations
        self.shared = shared  # storages of tied weights: each holder has its own copy
        self.weights: dict[int, int] = {}  # storage key -> Alloc index of a weight read elsewhere
        self.op = 0
        self.stack: list[str] = []
        self.allocs: list[Alloc] = []
        self.live: dict[int, int] = {}  # storage key -> Alloc index
        self.refs: dict[int, int] = {}  # storage key -> live tensors holding it
        self.calls: list[UnitCall] = []
        self.returned_by: dict[int, str] = {}  # Alloc -> the last unit to return it as it came
        self.reads: list[tuple[int, str, int]] = []
        self.flops: dict[str, int] = {}
        self.parts: dict[tuple[Any, ...], int] = {}  # a live part of a storage -> its Alloc
        self.part_refs: dict[tuple[Any, ...], int] = {}
        self.seen: dict[tuple[int, str, int], tuple[int, ...]] = {}  # as in Trace.seen
        self.hooks: Hooks | None = None  # a placement dispatched by hooks: calls as they run
        self.copies: list[_Copy] = []  # the copies those hooks handed the units
        self.aliases: dict[int, list[_Alias]] = {}  # storage key -> its _Alias groups
        self.values = Values()  # of the tensors made from the inputs alone
        self.failed: tuple[BaseException, str] | None = None  # an operator meta cannot run
        # ... which fails on the CPU too: the forward's shapes (None: too large to re-run)
        self.shapes_fault: bool | None = False
        self.host_read = False  # ... a copy to the CPU, for values meta does not have

    def saw(self, op: int, reader: str, t: torch.Tensor, index: int) -> None:
        """``reader`` received ``t``, of Alloc ``index``, at operator ``op``: keep its shape
        where it is not the one the storage was made in."""
        shape = tuple(t.shape)
        if shape != self.allocs[index].shape:
            self.seen.setdefault((op, reader, index), shape)

    def _by_weights(self, tensors: list[torch.Tensor]) -> str:
        """Outside every unit's forward, an operator on one unit's weights belongs to it: a
        graph module (``torch.export``) or functional code reads weights without calling the
        module. Consecutive such operators make one call of that unit."""
        owners = {self.external[k] for k in map(_key, tensors) if self.external.get(k)}
        if len(owners) != 1:
            return GLUE
        (unit,) = owners
        call, fresh = self._call_of(unit)
        for t in tensors:
            index = self.part(t, self.lookup(t))
            if index is not None and (
                fresh or (self.allocs[index].owner != unit and index not in call.args)
            ):
                call.args.append(index)
                self.saw(call.start, unit, t, index)
        return unit

    def _call_of(self, unit: str) -> tuple[UnitCall, bool]:
        """The call of ``unit`` the operator ``self.op`` belongs to, and whether it is new:
        the last call, where it is ``unit``'s and ran the operator before or runs this one (a
        fused kernel's parts, recorded after the kernel's own operands), else a new one."""
        last = self.calls[-1] if self.calls else None
        if last is not None and last.unit == unit and last.end >= self.op - 1:
            last.end = self.op
            return last, False
        call = UnitCall(unit, self.op, self.op)
        self.calls.append(call)
        return call, True

    @property
    def unit(self) -> str:
        return self.stack[-1] if self.stack else GLUE

    def hold(self, t: torch.Tensor, owner: str, name: str = "") -> int | None:
        key = _key(t)
        if key in self.external:
            return None
        if key not in self.live:
            self.values.fresh(key)
            nbytes = t.untyped_storage().nbytes()
            index = len(self.allocs)
            self.allocs.append(
                Alloc(index, nbytes, owner, self.op, -1, tuple(t.shape), _dtype(t), name)
            )
            self.live[key] = index
        elif owner == GLUE or t.numel() * t.element_size() != self.allocs[self.live[key]].nbytes:
            # a part of a storage, or a view the model's own code took (of a copy where it
            # runs, as ``edges.t()`` of an input copied there): when and where made
            setattr(t, _MADE, (self.op, owner))
        self.refs[key] = self.refs.get(key, 0) + 1
        cell: _Cell | None = getattr(t, _ALIASES, None)
        if cell is None:
            cell = _Cell()
            setattr(t, _ALIASES, cell)
        cell.holds += 1
        for alias in cell.groups:
            alias.members += 1
        weakref.finalize(t, self._release, key, cell)
        return self.live[key]

    def _release(self, key: int, cell: _Cell) -> None:
        self.refs[key] -= 1
        cell.holds -= 1
        for alias in cell.groups:
            alias.members -= 1
        for alias in self.aliases.get(key, ()):
            if alias.members == self.refs[key]:  # none of the storage's tensors but its own
                alias.call.outlived.setdefault(alias.index, self.op)
        if self.refs[key] == 0:
            del self.refs[key]
            self.aliases.pop(key, None)
            self.allocs[self.live.pop(key)].end = self.op

    def alias(self, call: UnitCall, out: Any, given: list[torch.Tensor]) -> Any:
        """``out``, what the unit of ``call`` returned, with each argument it returned as it
        came (``given``: those it was handed) an alias of its own, and each tensor of such an
        argument's storage it returned joined to it (see :class:`_Alias`)."""
        import torch
        from torch.utils._python_dispatch import _disable_current_modes
        from torch.utils._pytree import tree_map

        handed = {id(t) for t in given}
        groups: dict[int, _Alias] = {}
        swapped: list[torch.Tensor] = []

        def swap(v: Any) -> Any:
            if not isinstance(v, torch.Tensor) or not hasattr(v, _ALIASES):
                return v
            index = self.lookup(v)
            if index is None or index not in call.returned:
                return v
            if index not in groups:
                groups[index] = _Alias(self, call, index)
                self.aliases.setdefault(_key(v), []).append(groups[index])
            if id(v) in handed:
                with _disable_current_modes():
                    alias = v.view(v.shape)
                give(alias, value_of(v))
                self.hold(alias, self.allocs[index].owner)
                if hasattr(v, _MADE):  # a view its code took: made when and where ``v`` was
                    setattr(alias, _MADE, getattr(v, _MADE))
                elif hasattr(alias, _MADE):
                    delattr(alias, _MADE)
                for group in getattr(v, _ALIASES).groups:  # a copy of a copy: the first's too
                    group.join(alias)
                swapped.append(alias)
                v = alias
            groups[index].join(v)
            return v

        aliased = tree_map(swap, out)
        return aliased if swapped else out  # no container rebuilt where nothing is swapped

    def handed(self, unit: str, args: Any, kwargs: Any) -> tuple[Any, Any]:
        """``unit``'s arguments as dispatch hooks hand them over: each tensor from another
        device a tensor of its own (``send_to_device`` calls ``Tensor.to`` per argument), so
        one tensor given twice arrives as two (``attn(h, h, h)``: ``nn.MultiheadAttention``
        then leaves its self-attention fast path, which checks ``query is key``)."""
        import torch
        from torch.utils._python_dispatch import _disable_current_modes
        from torch.utils._pytree import tree_map

        hooks = self.hooks
        if hooks is None:
            return args, kwargs
        dst = hooks.device(unit)

        def swap(v: Any) -> Any:
            index = self.lookup(v) if isinstance(v, torch.Tensor) else None
            if index is None or self._hooked_home(index, dst) == dst:
                return v
            with _disable_current_modes():
                alias = v.view(v.shape)  # the same storage: the copy is crossings' to count
            give(alias, value_of(v))
            self.hold(alias, self.allocs[index].owner)
            if hasattr(v, _MADE):  # a part of a storage: made when and where ``v`` was
                setattr(alias, _MADE, getattr(v, _MADE))
            elif hasattr(alias, _MADE):  # the tensor itself, not a view its code took
                delattr(alias, _MADE)
            return alias

        handed: tuple[Any, Any] = tree_map(swap, (args, kwargs))
        return handed

    def _hooked_home(self, index: int, calling: str) -> str:
        """Where Alloc ``index`` lives under the hooks' placement (as :func:`flow` has it):
        an input where the caller put it, an activation on its unit's device, the model's own
        code's where the last unit ran (or the one being called, before any); what a unit
        returned as it was handed it (a dropout, an ``nn.Identity``), that unit's copy, on its
        device."""
        hooks = self.hooks
        assert hooks is not None
        if index in self.returned_by:
            return hooks.device(self.returned_by[index])
        alloc = self.allocs[index]
        if alloc.owner == INPUT:
            return hooks.entry
        if alloc.owner != GLUE:
            return hooks.device(alloc.owner)
        before = [c.unit for c in self.calls if c.start <= alloc.start]
        return hooks.device(before[-1]) if before else calling

    def lookup(self, t: torch.Tensor) -> int | None:
        return self.live.get(_key(t))

    def part(self, t: torch.Tensor, index: int | None) -> int | None:
        """The Alloc a copy of ``t`` costs, where ``index`` is its storage's: that one when
        ``t`` is the whole storage (every view of it then shares one copy), else an Alloc of
        its own for the part ``t`` is, alive while a tensor of that geometry is."""
        if index is None:
            return index
        nbytes = t.numel() * t.element_size()
        viewed = getattr(t, _MADE, (0, ""))[1] == GLUE  # by the model's own code
        if nbytes == self.allocs[index].nbytes and not viewed:
            return index
        key = (_key(t), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key not in self.parts:
            base = self.allocs[index]
            made, maker = getattr(t, _MADE, (self.op, self.unit))
            self.parts[key] = len(self.allocs)
            self.allocs.append(
                Alloc(
                    len(self.allocs), nbytes, base.owner, made, -1, tuple(t.shape),
                    _dtype(t), base.name, view_of=index, maker=maker,
                )
            )  # fmt: skip
        self.part_refs[key] = self.part_refs.get(key, 0) + 1
        weakref.finalize(t, self._unpart, key)
        return self.parts[key]

    def _unpart(self, key: tuple[Any, ...]) -> None:
        self.part_refs[key] -= 1
        if self.part_refs[key] == 0:
            del self.part_refs[key]
            self.allocs[self.parts.pop(key)].end = self.op

    def operand(self, t: torch.Tensor, reader: str) -> int | None:
        """The Alloc index of ``t`` as ``reader`` reads it: an activation, or another unit's
        parameter or buffer (a weight the reader's device needs a copy of); None for the
        reader's own weights, the root's and tied ones."""
        index = self.lookup(t)
        if index is not None:
            return index
        key = _key(t)
        owner = self.external.get(key)
        if not owner or owner == reader or key in self.shared:
            return None
        if key not in self.weights:
            self.weights[key] = len(self.allocs)
            size = t.untyped_storage().nbytes()
            self.allocs.append(
                Alloc(len(self.allocs), size, owner, 0, -1, tuple(t.shape), _dtype(t), "", True)
            )
        return self.weights[key]

    def read(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """Record the reads of an operator's operands; the unit it runs for."""
        unit = self.unit
        tensors = list(_tensors((args, kwargs)))
        if unit == GLUE:
            unit = self._by_weights(tensors)
        for t in tensors:
            index = self.operand(t, unit)
            if unit == GLUE or (index is not None and self.allocs[index].weight):
                # the model's own code: what it reads is copied as it reads it; a unit reading
                # a part of another unit's weight reads the copy it was handed, not the weight
                index = self.part(t, index)
                if index is not None:
                    self.saw(self.op, unit, t, index)
            if index is not None:
                self.reads.append((self.op, unit, index))
        return unit

    def count(self, flops: int) -> None:
        """FLOPs of an operator run as its real kernel (:mod:`torchplace.planner.fused`)."""
        self.flops[self.unit] = self.flops.get(self.unit, 0) + flops

    def blame(
        self, exc: BaseException, func: Any, args: Any, kwargs: dict[str, Any], unit: str
    ) -> None:
        """Name ``func`` in ``unit`` as the operator the forward failed in, unless an operator
        it is made of failed first (the same exception, raised through it)."""
        if self.failed is None or self.failed[0] is not exc:
            self.failed = (exc, f"aten.{func._overloadpacket.__name__} in {label(unit)}")
            self.shapes_fault = fails_with_data(func, args, kwargs)
            self.host_read = _to_cpu(func, kwargs)

    @contextlib.contextmanager
    def blamed(self, func: Any, args: Any, kwargs: dict[str, Any], unit: str) -> Iterator[None]:
        """:meth:`blame` ``func`` for what its stand-in or decomposition raises: a reference
        implementation checks shapes in Python, below no operator the recorder sees (grouped
        key/value heads given to ``scaled_dot_product_attention`` without ``enable_gqa``)."""
        try:
            yield
        except Exception as exc:
            self.blame(exc, func, args, kwargs, unit)
            raise

    def dispatch(self, mode: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        packet = func._overloadpacket
        impl = replacement(func)
        if impl is not None:  # meta would take another path than the CPU and CUDA kernels
            mark, op = len(self.reads), self.op
            unit = self.read(args, kwargs)  # its operands, where the real kernel reads them
            with mode, self.blamed(func, args, kwargs, unit):
                result = impl(self.count, *args, **kwargs)
            if result is not NotImplemented:
                # a stand-in that runs no operator (a check answered without reading values) is
                # one still: its reads are its own, not the next operator's (another unit's)
                self.op += self.op == op
                return result
            del self.reads[mark:]  # the real kernel takes meta's path: recorded below
        if decomposable(func):
            # A composite operator (linear, matmul, ...): record the operators it is made of,
            # as FlopCounterMode does, so that FLOPs and hidden copies are seen.
            with mode, self.blamed(func, args, kwargs, self.unit):
                result = decomposed(func, args, kwargs)
            if result is not NotImplemented:
                return result
        unit = self.read(args, kwargs)
        try:
            refuse_mixed_dtypes(func, args, kwargs)  # meta's kernel takes them
            out = func(*args, **kwargs)
        except Exception as exc:
            # meta cannot run it (it reads values: .item(), nonzero): from the operands'
            # values, where they are made from the inputs alone
            out = self.values.instead(func, args, kwargs)
            if out is NotImplemented:
                self.blame(exc, func, args, kwargs, unit)
                raise
        else:
            self.values.follow(func, args, kwargs, out)
        if self.copies:
            _viewed(args, kwargs, out)
        if packet in self.registry:
            count = int(self.registry[packet](*args, **kwargs, out_val=out))
            self.flops[unit] = self.flops.get(unit, 0) + count
        for t in _tensors(out):
            self.hold(t, unit)
        if self.aliases:
            _joined(args, kwargs, out)
        self.op += 1
        return out


def _viewed(args: Any, kwargs: Any, out: Any) -> None:
    """What an operator returns on the storage of a hooks' copy among its operands (a view,
    or the operand itself from an in-place operator) keeps that copy alive."""
    copies = {_key(t): getattr(t, _COPY) for t in _tensors((args, kwargs)) if hasattr(t, _COPY)}
    if not copies:
        return
    for t in _tensors(out):
        copy = copies.get(_key(t))
        if copy is not None and getattr(t, _COPY, None) is not copy:
            copy.join(t)


def _joined(args: Any, kwargs: Any, out: Any) -> None:
    """What an operator returns on the storage of an operand that is a unit's alias (a view
    of it, or the operand itself from an in-place operator) is of that alias too."""
    groups: dict[int, list[_Alias]] = {}
    for t in _tensors((args, kwargs)):
        cell = getattr(t, _ALIASES, None)
        if cell is not None and cell.groups:
            groups.setdefault(_key(t), []).extend(cell.groups)
    if not groups:
        return
    for t in _tensors(out):
        if hasattr(t, _ALIASES):
            for group in groups.get(_key(t), ()):
                group.join(t)


_ADVICE = {
    Exception: "check the declared inputs (--input) match what the forward expects; integer "
    "and boolean inputs are traced with values drawn from [0, 2), as --verify runs them, so a "
    "forward that needs particular values (LLaVA's image tokens among its ids) needs a factory "
    "whose module sets them before calling the model",
    TypeError: "the planner passes the declared tensors alone, in order (by name where the "
    "forward takes them by keyword only, or has a parameter of that name in another place); "
    "check the declared inputs (--input), and give a "
    "non-tensor argument (an int or bool flag) a default in forward, or wrap the model in a "
    "module whose forward passes it",
}


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def trace_forward(
    module: nn.Module,
    inputs: Sequence[torch.Tensor],
    units: Sequence[str],
    *,
    batch: int,
    seq: int | None,
    names: Sequence[str] = (),
    hooks: Hooks | None = None,
    values: Sequence[torch.Tensor | None] = (),
) -> Trace:
    """Run ``module(*inputs)`` once under the recorder (an input its forward takes by keyword
    only passed by its name in ``names``); ``units`` are module paths. PyTorch's
    fast paths are taken as on a real device; where one cannot run on ``meta`` (a padding mask
    turns ``nn.TransformerEncoder``'s into nested tensors, made from the mask's values), the
    general path is traced instead: an upper bound. With ``hooks``, each unit is handed its
    arguments as those hooks hand them (:meth:`_Recorder.handed`). ``values``: the inputs'
    values (None for one without), for the code that reads them (:mod:`~.values`)."""
    for t, value in zip(inputs, values, strict=False):
        give(t, value)
    call = (inputs, names)
    try:
        return _traced(module, call, units, (batch, seq), fast=True, hooks=hooks)
    except UntraceableModel:
        return _traced(module, call, units, (batch, seq), fast=False, hooks=hooks)


def _recorder(module: nn.Module, units: Sequence[str]) -> _Recorder:
    """A recorder that knows every unit's parameters and buffers (and which are tied)."""
    from torchplace.planner.units import unit_tensors

    external = {_key(t): "" for t in (*module.parameters(), *module.buffers())}
    holders: dict[int, int] = {}  # storage -> how many units hold it (tied: more than one)
    for path in units:
        params, buffers = unit_tensors(module, path)
        keys = {_key(t) for t in (*params.values(), *buffers.values())}
        external.update(dict.fromkeys(keys, path))
        holders.update({k: holders.get(k, 0) + 1 for k in keys})
    return _Recorder(external, {k for k, n in holders.items() if n > 1})


def _traced(
    module: nn.Module,
    call: tuple[Sequence[torch.Tensor], Sequence[str]],
    units: Sequence[str],
    size: tuple[int, int | None],
    *,
    fast: bool,
    hooks: Hooks | None = None,
) -> Trace:
    import torch

    from torchplace.planner.inputs import call_arguments

    inputs, declared = call
    args, kwargs = call_arguments(module, inputs, declared)

    rec = _recorder(module, units)
    rec.hooks = hooks
    undo = [_wrap(sub, path, rec) for path in units for sub in called_modules(module, path)]
    names = [f"input_{i}" if len(inputs) > 1 else "input" for i in range(len(inputs))]
    held = [rec.hold(t, INPUT, name) for t, name in zip(inputs, names, strict=True)]
    paths = fast_paths() if fast else contextlib.nullcontext()
    try:
        with (
            torch.inference_mode(),
            paths,
            causal_masks_unknown(),
            autocast_on_meta(),
            constants(),
            _state_kept(module),
            _mode(rec),
        ):
            out = module(*args, **kwargs)
    except Exception as exc:  # the model's own forward failed: say so in one line
        failed = rec.failed
        where = failed[1] if failed and failed[0] is exc else ""
        host = bool(where) and rec.host_read
        raise _untraceable(exc, where, shapes=bool(where) and rec.shapes_fault, host=host) from exc
    finally:
        for restore in undo:
            restore()
    return _finished(rec, out, held, size)


@contextlib.contextmanager
def _state_kept(module: nn.Module) -> Iterator[None]:
    """The tensors a forward keeps in plain attributes between calls (a streaming model's
    ``self.hidden``, a rotary cache) set back to what they were before it: each batch size is
    traced from the state the factory built, as its first call runs, not from the previous
    trace's (a hidden state of another batch size: "Expected hidden size (1, 2, 16)"). A dict
    or list the forward fills in place (LeViT's ``attention_bias_cache``, keyed by device) is
    emptied back too: the next trace would find its tensors made already, on ``meta``, and
    count none of them, where the run makes them."""
    before = [(m, dict(m.__dict__)) for m in module.modules()]
    contents = [
        (value, _contents(value))
        for _, state in before
        for name, value in state.items()
        if isinstance(value, dict | list) and name not in _module_slots()
    ]
    try:
        yield
    finally:
        for owner, state in before:
            for name, value in list(owner.__dict__.items()):
                if value is state.get(name, _MISSING) or next(_tensors(value), None) is None:
                    continue
                if name in state:
                    owner.__dict__[name] = state[name]
                else:
                    del owner.__dict__[name]
        for container, kept in contents:
            held = next(_tensors((container, kept)), None) is not None
            if held and _ids(_contents(container)) != _ids(kept):
                if isinstance(container, dict):
                    container.clear()
                    container.update(kept)
                else:
                    container[:] = [v for _, v in kept]


def _contents(container: dict[Any, Any] | list[Any]) -> list[tuple[Any, Any]]:
    """A container's items, each as (its key or position, the item)."""
    return list(container.items() if isinstance(container, dict) else enumerate(container))


def _ids(items: list[tuple[Any, Any]]) -> list[tuple[int, int]]:
    """Items by identity (a tensor's ``==`` compares values)."""
    return [(id(k), id(v)) for k, v in items]


@functools.cache
def _module_slots() -> frozenset[str]:
    """The attributes every ``nn.Module`` has (its parameters, buffers, submodules, hooks):
    PyTorch's to keep, not a forward's cache."""
    from torch import nn

    return frozenset(nn.Module().__dict__)


_MISSING = object()


def _untraceable(
    exc: Exception, where: str = "", *, shapes: bool | None = False, host: bool = False
) -> UntraceableModel:
    """What a forward that failed on ``meta`` did wrong, and its fix, in one line; ``where``:
    the operator meta could not run and the unit running it; ``shapes``: it fails with data
    too (the forward's shapes are wrong, not its values missing), None where its operands were
    too large to re-run with data; ``host``: that operator copies to the CPU a tensor whose
    values are not known."""
    text = str(exc).rstrip(".!")
    if shapes is None:  # not re-run: a meta kernel that wants values says so ("meta tensors")
        named = any(s in text.lower() for s in _WANTS_VALUES) or any(
            s in text
            for s in (*_MOVED, *_ELSEWHERE)  # a move or a device: said below
        )
        shapes = not named and isinstance(exc, RuntimeError)
        if shapes:
            return UntraceableModel(
                f"cannot trace the model on 'meta': {where}: {text}; the operator refuses the "
                "shapes the forward gave it (its check names no value that 'meta' lacks; its "
                "operands are too large to re-run with data), so the forward does not take the "
                f"declared inputs: {_ADVICE[Exception]}"
            )
    if host:  # named: the unit, and a copy to the host (its values read, or a move)
        return UntraceableModel(
            f"cannot trace the model on 'meta': {where}: {text}. The forward copies to the "
            "host a tensor computed from the weights or float inputs, whose values a trace "
            "without data does not have: to read them (.tolist(), .numpy(), "
            "pack_padded_sequence's lengths, a mixture-of-experts router's token counts that "
            "size what each expert runs), which cannot be planned this way: values are known "
            "only for tensors made from the integer and boolean inputs alone or from Python "
            "data (torch.tensor(..., device=x.device)), so plan the padded batch, or pass the "
            "values as Python numbers; or, where the forward moves a tensor to a device itself "
            "(.cpu()), leave the moves to the caller"
        )
    if shapes:
        return UntraceableModel(
            f"cannot trace the model on 'meta': {where}: {text}; the operator "
            "fails on these shapes with data too, so the forward does not take the declared "
            f"inputs: {_ADVICE[Exception]}"
        )
    if any(s in text for s in _MOVED):
        return UntraceableModel(
            f"cannot trace the model on 'meta': {text}. The forward moves a tensor to a device "
            "itself (.cpu(), .cuda(), .to('cuda:0')), which the planner, placing the model and "
            "tracing it on 'meta', cannot follow: leave the moves to the caller, or move to "
            "where the model's weights are (x.to(self.weight.device)); a tensor moved to the "
            "CPU for its values (.tolist(), .numpy(), pack_padded_sequence's lengths) has them "
            "only where it is made from the integer and boolean inputs alone or from Python "
            "data (torch.tensor(..., device=x.device)), not from the weights or float inputs: "
            "otherwise plan the padded batch, or pass the values as Python numbers"
        )
    if any(s in text for s in _ELSEWHERE):
        return UntraceableModel(
            f"cannot trace the model on 'meta': {text}. A tensor the forward makes without "
            "device= (torch.arange(n), torch.zeros(...)), or keeps in a plain attribute rather "
            "than a buffer, is on the CPU beside the model's tensors: make it on the inputs' "
            "device (device=x.device), as a GPU needs too"
        )
    if isinstance(exc, RuntimeError | NotImplementedError):
        if where:  # torch's advice for meta kernels (a torch.fx setting) is not the user's
            text = f"{where}: {text.split('. ')[0].rstrip('.')}"
        return UntraceableModel(
            f"cannot trace the model on 'meta': {text}. The planner runs the forward without "
            "data; a model whose control flow reads tensor values cannot be planned this way "
            "(values are known for tensors made from the integer and boolean inputs alone, "
            "not from the weights or float inputs)"
        )
    return UntraceableModel(
        f"cannot trace the model on 'meta': its forward raised {type(exc).__name__}: {text}; "
        f"{_ADVICE.get(type(exc), _ADVICE[Exception])}"
    )


def _to_cpu(func: Any, kwargs: dict[str, Any]) -> bool:
    """Whether ``func`` copies its operand to the CPU (``.tolist()``, ``.cpu()``)."""
    import torch

    device = kwargs.get("device")
    return (
        func._overloadpacket.__name__ == "_to_copy"
        and device is not None
        and torch.device(device).type == "cpu"
    )


#: what torch says when a forward moves a tensor off ``meta`` itself (to a GPU: on a CPU build,
#: on a CUDA build without a driver, with a driver but no GPU), or meets one elsewhere
_MOVED = (
    "Cannot copy out of meta tensor",
    "not compiled with CUDA",
    "Found no NVIDIA driver",
    "No CUDA GPUs",
)
_ELSEWHERE = ("expected device meta", "same device", "found at least two devices")
#: what a ``meta`` kernel says when it needs values it does not have (``.item()``, ``nonzero``,
#: an operator without a meta kernel), in lower case
_WANTS_VALUES = ("meta", "data-dependent", "data-independent", "data dependent", "no data")


def _mode(rec: _Recorder) -> Any:
    """A dispatch mode that hands every operator to ``rec``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            return rec.dispatch(self, func, args, kwargs or {})

    return Mode()  # type: ignore[no-untyped-call]


def _finished(
    rec: _Recorder, out: Any, held: list[int | None], size: tuple[int, int | None]
) -> Trace:
    """The record as a Trace: the outputs (as returned) and the inputs alive to the end."""
    outputs: list[int] = []
    unmoved: set[int] = set()
    aliased: dict[int, str | None] = {}
    for t, moved in returned(out):
        index = rec.part(t, rec.lookup(t))
        if index is not None:
            rec.saw(rec.op, RETURNED, t, index)  # as returned, not as first allocated
            if not moved:
                unmoved.add(len(outputs))
            if rec.lookup(t) in rec.returned_by and rec.hooks is None:
                groups = getattr(t, _ALIASES, _Cell()).groups
                aliased[len(outputs)] = groups[-1].call.unit if groups else None
            outputs.append(index)
    for index in (*outputs, *(i for i in held if i is not None)):
        rec.allocs[index].end = rec.op  # alive when the forward returns
    for copy in rec.copies:  # a hooks' copy alive when the forward returns: the caller's
        copy.call.handed.setdefault(copy.position, rec.op)
    del out
    for alloc in rec.allocs:
        if alloc.end < 0:  # still held by something the forward kept (a cache, a closure)
            alloc.end = rec.op
    batch, seq = size
    return Trace(
        batch, seq, rec.op, rec.allocs, rec.calls, rec.reads, rec.flops, outputs, rec.seen,
        frozenset(unmoved), aliased,
    )  # fmt: skip


def called_modules(model: nn.Module, path: str) -> list[nn.Module]:
    """The modules whose forward a unit's calls go through: the unit's module; for a container
    without a forward of its own (an ``nn.ModuleList`` that accelerate's map names whole, as
    ``vision_model.layers`` when both layers are on one device), the modules in it, each call
    of one a call of the unit (accelerate hooks each of them), nested containers opened too.
    None for a tensor unit (called when its tensor is read) or a TorchScript module (its calls
    are found by the weights its operators read)."""
    import torch

    from torchplace.planner.units import is_tensor_unit, submodule

    if is_tensor_unit(model, path):
        return []
    sub = submodule(model, path)
    return [] if isinstance(sub, torch.jit.ScriptModule) else _with_forward(sub)


def _with_forward(module: nn.Module) -> list[nn.Module]:
    from torch import nn

    if type(module).forward is not nn.Module.forward:
        return [module]
    return [m for child in module.children() for m in _with_forward(child)]


def _wrap(sub: nn.Module, path: str, rec: _Recorder) -> Callable[[], None]:
    """Record each call of ``sub`` by wrapping its forward, as accelerate's hooks do: a forward
    hook would turn off PyTorch's fast paths (``nn.TransformerEncoderLayer``'s), which a placed
    model takes. Returns what undoes it."""
    forward, own = sub.forward, sub.__dict__.get("forward")

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        call = UnitCall(path, rec.op, -1, forward=True)
        args, kwargs = _called(rec, call, args, kwargs)
        rec.calls.append(call)
        rec.stack.append(path)
        try:
            out = forward(*args, **kwargs)
        finally:
            rec.stack.pop()
            # a call that runs no operator (nn.Dropout in inference) still takes a step: the
            # copy it was handed is made before what its caller then lets go is freed
            rec.op += rec.op == call.start
            call.end = rec.op - 1
        for t in _tensors(out):  # an argument returned as it came (nn.Dropout in inference)
            index = rec.part(t, rec.lookup(t))
            if index is not None and index in call.args:
                call.returned.append(index)
                rec.returned_by[index] = call.unit
        if rec.hooks is None and call.returned:  # a stage runner's unit returns its copy
            out = rec.alias(call, out, list(_tensors((args, kwargs))))
        return out

    sub.forward = wrapped

    def restore() -> None:
        if own is None:
            del sub.forward
        else:
            sub.forward = own

    return restore


def _called(
    rec: _Recorder, call: UnitCall, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Record the arguments of ``call`` (as a dispatch hook hands them): the arguments the
    unit runs with. It holds no tensor beyond them for the call: one in a list the unit
    empties as it runs (Wan's VAE, each convolution's cached frames replaced in the list it
    is handed) dies when the unit lets it go, as in a run."""
    path = call.unit
    given = list(_tensors((args, kwargs)))
    args, kwargs = rec.handed(path, args, kwargs)
    for t, before in zip(_tensors((args, kwargs)), given, strict=True):
        index = rec.part(t, rec.operand(t, path))
        if index is not None:
            if t is not before:  # a hooks' copy: alive as long as a tensor of it is
                rec.copies.append(_Copy(rec, call, len(call.args)))
                rec.copies[-1].join(t)
            call.args.append(index)
            rec.saw(call.start, path, t, index)
    return args, kwargs


@functools.cache
def decomposable(func: Any) -> bool:
    """Whether ``func`` is run as the operators it is made of: a composite operator (linear,
    matmul, ...) that FLOP counting does not count whole, as ``FlopCounterMode`` does, so that
    FLOPs and hidden copies are seen."""
    import torch
    from torch.utils.flop_counter import flop_registry

    if func._overloadpacket in flop_registry:
        return False
    return bool(
        torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
    )


#: Recurrent layers, run as PyTorch's Python decomposition: it projects the whole input first,
#: as the CPU's kernels (oneDNN's or not) and cuDNN do; the C++ composite kernel, on ``meta``,
#: projects one step at a time.
_PYTHON_DECOMPOSED = frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu"})


def python_decomposed(func: Any) -> bool:
    """Whether :func:`decomposed` runs ``func`` as its Python decomposition (not as eager
    runs it on a real device)."""
    return func._overloadpacket.__name__ in _PYTHON_DECOMPOSED


def decomposed(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A composite operator run as its C++ composite kernel, as eager runs it: a Python
    decomposition registered for tracing may differ (``dropout`` in inference clones its input
    there; the C++ kernel returns the input itself). Recurrent layers excepted."""
    import torch

    if python_decomposed(func):
        return func.decompose(*args, **kwargs)
    return func._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
