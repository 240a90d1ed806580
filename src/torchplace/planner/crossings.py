"""Every copy between devices a placement causes, in run order, and where each tensor lives.

:func:`flow` walks a :class:`~torchplace.planner.trace.Trace` under a
:class:`~torchplace.planner.strategies.Placement`. A unit's arguments that live elsewhere are
copied to its device: once per tensor and device when the runner keeps the copy (torchplace's
stages), or on *every* call when dispatch hooks copy the arguments of each module anew
(accelerate's ``AlignDevicesHook``, which also sends the output back to the input's device).
Operators outside every unit run where the last unit ran. The result also holds each device's
lifetimes (made, freed, bytes), copies included, for the memory budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchplace.planner.strategies import HOST, Placement
from torchplace.planner.trace import GLUE, INPUT, RETURNED, Trace, label

__all__ = ["Crossing", "Flow", "flow"]


@dataclass
class Crossing:
    """Copies of one tensor between two devices, per forward."""

    src: str
    dst: str
    producer: str
    consumer: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    count: int
    kind: str  # h2d, d2d, d2h, recopy (a hook copying again), return (output sent back)
    first_op: int

    @property
    def total(self) -> int:
        return self.nbytes * self.count

    def to_dict(self) -> dict[str, Any]:
        return {
            "src": self.src,
            "dst": self.dst,
            "producer": label(self.producer),
            "consumer": label(self.consumer),
            "shape": list(self.shape),
            "dtype": self.dtype,
            "bytes": self.nbytes,
            "count": self.count,
            "total_bytes": self.total,
            "kind": self.kind,
        }


@dataclass
class Flow:
    """Where everything lives under one placement, and what crosses."""

    crossings: list[Crossing]
    spans: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)  # device -> spans
    output_devices: list[str] = field(default_factory=list)
    inputs: dict[str, int] = field(default_factory=dict)  # device -> input bytes copied there

    def bytes_between_devices(self) -> int:
        """Bytes copied device to device per forward (host transfers excluded)."""
        return sum(c.total for c in self.crossings if HOST not in (c.src, c.dst))

    def total_bytes(self) -> int:
        return sum(c.total for c in self.crossings)


class _Walker:
    def __init__(self, trace: Trace, placement: Placement, device: str | None) -> None:
        self.trace, self.placement = trace, placement
        self.only = device  # replicate: one replica's device
        self.home: dict[int, str] = {}
        self.copies: set[tuple[int, str]] = set()  # (Alloc, device): copied there before
        self.kept: set[tuple[int, str]] = set()  # and a copy kept there (not a hook's)
        self.during: dict[tuple[int, str], int] = {}  # a hook's copy there: alive until then
        self.found: dict[tuple[Any, ...], Crossing] = {}
        self.spans: dict[str, list[tuple[int, int, int]]] = {}
        self.inputs: dict[str, int] = {}  # device -> input bytes copied there
        self.first: dict[tuple[int, str], int] = {}  # (Alloc, device) -> when first copied
        self.copied: dict[tuple[int, str], int] = {}  # (storage's Alloc, device): a part too
        self.settled: set[int] = set()  # parts of storages whose home is decided
        self.glue_device: Any = None  # op -> where the model's own code runs then
        self.span_of: dict[tuple[int, str], int] = {}  # a kept copy's span in spans[device]
        self.own_span: dict[int, int] = {}  # an activation's span where it is made

    def device(self, unit: str) -> str:
        return self.only or self.placement.device_of(unit)

    def copy(
        self,
        index: int,
        dst: str,
        consumer: str,
        op: int,
        until: int,
        kind: str | None = None,
        once: bool = False,
        reader: str | None = None,
    ) -> None:
        """``index`` copied to ``dst`` for ``consumer`` (once per device for a stage runner,
        or where ``once``; on every call for dispatch hooks), in the shape the trace saw
        ``reader`` (the consumer unless given) receive it in at ``op``."""
        self.settle(index, op)
        src = self.home[index]
        if src == dst:
            return
        shape = self.trace.received(op, consumer if reader is None else reader, index)
        index = self._whole(index)
        alloc = self.trace.allocs[index]
        # dispatch hooks copy a module's arguments on every call and keep none (the copy dies
        # with the call): a later read makes a copy again; a stage runner's copy, and one the
        # model's own code reads, is kept and serves every later read on that device
        # (a read inside the call itself reads the call's copy)
        hooked = self.placement.hooks and consumer != GLUE and not once
        again = (index, dst) in self.copies
        if not hooked and ((index, dst) in self.kept or self.during.get((index, dst), -1) > op):
            return
        self.copies.add((index, dst))
        if hooked:
            self.during[(index, dst)] = until
        else:
            self.kept.add((index, dst))
        self.first.setdefault((index, dst), op)
        # a copy of the storage, or of a part of it (``edges.t()``, from which ``[0]`` is cut)
        self.copied.setdefault((index if alloc.view_of is None else alloc.view_of, dst), op)
        if kind is None:
            kind = "h2d" if src == HOST else "d2h" if dst == HOST else "recopy" if again else "d2d"
        self.add(src, dst, alloc.owner, consumer, alloc, shape, kind, op)
        if alloc.owner == INPUT:
            self.inputs[dst] = self.inputs.get(dst, 0) + alloc.nbytes
        elif dst != HOST:
            self.spans.setdefault(dst, []).append((op, until, alloc.nbytes))
            if not hooked:
                self.span_of[(index, dst)] = len(self.spans[dst]) - 1

    def settle(self, index: int, op: int) -> None:
        """Where a part of a storage (a view the model's code took) lives, once known at
        ``op``: on its maker's device where that one had a copy of the storage by then."""
        alloc = self.trace.allocs[index]
        if alloc.view_of is not None and index not in self.settled:
            self.settled.add(index)
            made = (
                self.glue_device(alloc.start) if alloc.maker == GLUE else self.device(alloc.maker)
            )
            if self.copied.get((alloc.view_of, made), op + 1) <= alloc.start:
                self.home[index] = made  # made from the copy its maker's device had

    def replaced(self, index: int, dev: str, end: int) -> None:
        """A unit on ``dev`` returned its copy of ``index`` as it came (a dropout, an
        ``nn.Identity``): that copy is the tensor now. The copies kept of it elsewhere serve no
        later read (a runner copies what the unit returned anew) and die with the call, as the
        tensor they were made for does where the code rebinds it (``x = self.norm_pre(x)``)."""
        index = self._whole(index)
        for d in [d for i, d in self.kept if i == index and d != dev]:
            self.kept.discard((index, d))
            at = self.span_of.pop((index, d), None)
            if at is not None:
                start, until, nbytes = self.spans[d][at]
                self.spans[d][at] = (start, min(until, end), nbytes)

    def outlived(self, index: int, end: int) -> None:
        """Under a stage runner, a unit elsewhere returned ``index`` as it came, its own copy:
        the original, where it was made, lives only as long as the code keeps it, until
        ``end`` (``h = self.dropout(self.norm(h))`` lets it go at once)."""
        at = self.own_span.get(index)
        if at is not None and self.home[index] == self.made_on(index):
            start, until, nbytes = self.spans[self.home[index]][at]
            self.spans[self.home[index]][at] = (start, min(until, end), nbytes)

    def made_on(self, index: int) -> str:
        """The device ``index`` is made on: its unit's, or where the model's code then runs."""
        alloc = self.trace.allocs[index]
        return self.glue_device(alloc.start) if alloc.owner == GLUE else self.device(alloc.owner)

    def lives(self, index: int) -> int:
        """Until when a kept copy of ``index`` lives: as long as its storage (a runner keeps
        the copy of a part, the first token handed to a pooler, while the tensor it was cut
        from lives, not only the part)."""
        alloc = self.trace.allocs[index]
        if alloc.view_of is None:
            return alloc.end
        return max(alloc.end, self.trace.allocs[alloc.view_of].end)

    def storage(self, index: int) -> int:
        """The Alloc whose bytes ``index`` keeps alive where it lives: its storage's, for a part
        of a storage that lives there too; else its own (a part copied elsewhere)."""
        base = self.trace.allocs[index].view_of
        return index if base is None or self.home[base] != self.home[index] else base

    def _whole(self, index: int) -> int:
        """The storage's Alloc for a view of all of it that lives where the storage does
        (``logits.t()`` beside ``logits``: one copy serves both); else ``index``, a part, or a
        view taken of a copy elsewhere (``edges.t()`` on the device its code ran on)."""
        base = self.trace.allocs[index].view_of
        if base is None or self.trace.allocs[index].nbytes != self.trace.allocs[base].nbytes:
            return index
        return base if self.home[index] == self.home[base] else index

    def add(
        self,
        src: str,
        dst: str,
        producer: str,
        consumer: str,
        alloc: Any,
        shape: tuple[int, ...],
        kind: str,
        op: int,
    ) -> None:
        """One copy of ``alloc``, in ``shape`` (as the consumer received it)."""
        producer = "input" if producer == INPUT else producer
        key = (src, dst, producer, consumer, shape, alloc.dtype, kind)
        if key in self.found:
            self.found[key].count += 1
        else:
            self.found[key] = Crossing(
                src, dst, producer, consumer, shape, alloc.dtype, alloc.nbytes, 1, kind, op
            )


def _events(trace: Trace, calls: list[Any]) -> list[tuple[int, int, Any]]:
    """In run order: unit calls (tag 0), then the reads that copy outside a call's arguments
    (tag 1): the model's own code reading a tensor, a unit reading another unit's weight."""
    events: list[tuple[int, int, Any]] = [(c.start, 0, c) for c in calls]
    events += [
        (op, 1, (unit, index))
        for op, unit, index in trace.reads
        if unit == GLUE or trace.allocs[index].weight
    ]
    return sorted(events, key=lambda e: (e[0], e[1]))


def _outermost(calls: list[Any]) -> list[Any]:
    """Of ``calls`` (in run order), those not made inside another's forward."""
    out: list[Any] = []
    for call in calls:
        if not any(c.forward and c.start <= call.start <= c.end for c in out[-1:]):
            out.append(call)
    return out


def flow(trace: Trace, placement: Placement, *, replica: str | None = None) -> Flow:
    """Crossings and per-device lifetimes of one forward (of one replica, for ``replicate``)."""
    w = _Walker(trace, placement, replica)
    calls = sorted(trace.calls, key=lambda c: c.start)
    first = w.device(calls[0].unit) if calls else (replica or placement.devices[0])
    entry = placement.entry if placement.hooks and not replica else first
    # the model's own code runs where the last unit it called ran: not one called inside
    # that unit's forward (CoaT's shared ``cpe``, a unit of its own), whose caller goes on
    starts = [(c.start, w.device(c.unit)) for c in _outermost(calls)]

    def flow_device(op: int) -> str:
        where = first
        for start, dev in starts:
            if start > op:
                break
            where = dev
        return where

    w.glue_device = flow_device
    for alloc in trace.allocs:
        if alloc.view_of is not None:  # a part of an earlier storage: where that one is
            w.home[alloc.index] = w.home[alloc.view_of]
        elif alloc.owner == INPUT:
            w.home[alloc.index] = HOST
        elif alloc.weight:  # in the weights already; a copy elsewhere is an activation there
            w.home[alloc.index] = w.device(alloc.owner)
        else:
            dev = w.made_on(alloc.index)
            w.home[alloc.index] = dev
            w.own_span[alloc.index] = len(w.spans.setdefault(dev, []))
            w.spans[dev].append((alloc.start, alloc.end, alloc.nbytes))
    inputs = [a for a in trace.allocs if a.owner == INPUT]
    if placement.hooks and not replica:  # the user moves the inputs to the first device
        for alloc in inputs:
            if alloc.view_of is None:
                w.copy(alloc.index, entry, "(model call)", 0, alloc.end)
            w.home[alloc.index] = entry  # and a part of one is a part of the moved one
    running: list[Any] = []  # the unit calls whose forward is running, outermost first
    for op, tag, item in _events(trace, calls):
        if tag == 0:
            dev = w.device(item.unit)
            # hooks copy each argument as given (one tensor given twice, twice); a stage
            # runner each tensor once
            hooked = placement.hooks and not replica and item.forward
            while running and running[-1].end < item.start:
                running.pop()
            # a unit called inside another's forward (a module both a unit and a part of
            # another: CoaT's shared ``cpe``) is handed what that one was handed as its copy,
            # on its device: a stage runner copies it from there
            outer = running[-1] if running and item.forward and not placement.hooks else None
            # (a stage runner's positions go unread: its copy is kept while the original lives)
            for position, index in enumerate(item.args if hooked else dict.fromkeys(item.args)):
                kept = not placement.hooks or index in item.returned
                alive = w.lives(index) if kept else item.end + 1
                if hooked:  # the hooks' copy dies with the last tensor of it, as traced
                    alive = item.handed.get(position, alive)
                settled = trace.allocs[index].view_of is None or index in w.settled
                if outer is not None and index in outer.args and settled:
                    home, w.home[index] = w.home[index], w.device(outer.unit)
                    w.copy(index, dev, item.unit, op, alive)
                    w.home[index] = home
                else:
                    w.copy(index, dev, item.unit, op, alive)
            if item.forward:
                running.append(item)
            for index in dict.fromkeys(item.returned):
                # what it returns is the copy it was handed, on its device: read from there,
                # and copied anew elsewhere (a runner knows no copy made of it before)
                if not hooked and w.home[index] != dev and index in item.outlived:
                    w.outlived(index, item.outlived[index])
                w.home[index] = dev
                w.replaced(index, dev, item.end)
        else:  # the model's own code reads a tensor, or a unit another unit's weight
            unit, index = item
            dst = flow_device(op) if unit == GLUE else w.device(unit)
            w.copy(index, dst, unit, op, w.lives(index), once=True)
    if any(c.unit == "" for c in calls) and not (placement.hooks and not replica):
        # the model placed whole: its forward returns what it made, or the copies it was
        # given (an input returned as it is), on its device
        for index in trace.outputs:
            w.home[index] = w.device("")
    outs = []
    for index in trace.outputs:  # a view the code took of a copy (XLNet's mems, detached
        w.settle(index, trace.ops)  # from what a spilled dropout returned): where it was made
    made = {index: w.home[index] for index in trace.outputs}
    held: dict[int, str] = {}  # outputs not sent back: the caller holds them beside the rest
    for position, index in enumerate(trace.outputs):
        back = placement.hooks and not replica and position not in trace.unmoved
        w.home[index] = made[index]  # hooks copy each place it is returned in (x, x): twice
        if position in trace.aliased and not (placement.hooks and not replica):
            # the original, or the copy of a unit that returned it as it came, where it is
            unit = trace.aliased[position]
            original = HOST if trace.allocs[index].owner == INPUT else w.made_on(index)
            w.home[index] = original if unit is None else w.device(unit)
        if back and w.home[index] != entry:
            # the copy sent back outlives the forward: the caller holds it
            w.copy(
                index, entry, "(model return)", trace.ops, trace.ops + 1, "return", reader=RETURNED
            )
            w.home[index] = entry
        elif placement.hooks and not replica:
            held[w.storage(index)] = made[index]
        outs.append(w.home[index])
        w.copy(index, HOST, "(host)", trace.ops, trace.ops, reader=RETURNED)
    for index, dev in held.items():
        alloc = trace.allocs[index]
        if dev != HOST and alloc.owner != INPUT and not alloc.weight:
            w.spans.setdefault(dev, []).append((trace.ops, trace.ops + 1, alloc.nbytes))
    return Flow(sorted(w.found.values(), key=lambda c: c.first_op), w.spans, outs, w.inputs)
