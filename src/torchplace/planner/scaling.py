"""Traces at many batch sizes from two: every size the structure allows, exactly.

When the forward runs the same operators at two batch sizes, each allocation's bytes and each
unit's FLOPs are affine in the batch size; the trace at any size between follows from the two.
:func:`traces_for` runs the model at the smallest, second smallest and largest requested sizes,
checks that the last two match operator for operator, and derives the sizes between; where they
do not match, or a derived size is not a whole number of bytes, it traces that size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from torchplace.planner.trace import Trace

__all__ = ["traces_for"]


def _same_structure(a: Trace, b: Trace) -> bool:
    if (a.ops, len(a.allocs), len(a.calls), a.outputs, a.seen.keys(), a.aliased) != (
        b.ops,
        len(b.allocs),
        len(b.calls),
        b.outputs,
        b.seen.keys(),
        b.aliased,
    ):
        return False
    if any(
        (x.owner, x.start, x.end) != (y.owner, y.start, y.end)
        for x, y in zip(a.allocs, b.allocs, strict=True)
    ):
        return False
    return all(
        (x.unit, x.start, x.args, x.handed, x.outlived)
        == (y.unit, y.start, y.args, y.handed, y.outlived)
        for x, y in zip(a.calls, b.calls, strict=True)
    )


def _between(lo: Trace, hi: Trace, batch: int) -> Trace | None:
    span = hi.batch - lo.batch

    def at(x: int, y: int) -> int | None:
        value, rest = divmod(x * span + (y - x) * (batch - lo.batch), span)
        return None if rest else value

    def shape(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(d if d == e else (at(d, e) or 0) for d, e in zip(x, y, strict=False))

    allocs = []
    for x, y in zip(lo.allocs, hi.allocs, strict=True):
        nbytes = at(x.nbytes, y.nbytes)
        if nbytes is None:
            return None
        allocs.append(dataclasses.replace(x, nbytes=nbytes, shape=shape(x.shape, y.shape)))
    seen = {key: shape(x, hi.seen[key]) for key, x in lo.seen.items()}
    flops = {}
    for unit in lo.flops.keys() | hi.flops.keys():
        value = at(lo.flops.get(unit, 0), hi.flops.get(unit, 0))
        if value is None:
            return None
        flops[unit] = value
    return dataclasses.replace(lo, batch=batch, allocs=allocs, flops=flops, seen=seen)


def traces_for(batches: Sequence[int], run: Callable[[int], Trace]) -> dict[int, Trace]:
    """A trace per batch size; ``run(b)`` traces one size.

    The smallest size is traced on its own (batch 1 often takes other paths: an ``expand``
    over one row is already contiguous); the second smallest and the largest bound the rest.
    """
    sizes = sorted(set(batches))
    if len(sizes) <= 3:
        return {b: run(b) for b in sizes}
    out = {sizes[0]: run(sizes[0]), sizes[1]: run(sizes[1]), sizes[-1]: run(sizes[-1])}
    lo, hi = out[sizes[1]], out[sizes[-1]]
    linear = _same_structure(lo, hi)
    for b in sizes[2:-1]:
        derived = _between(lo, hi, b) if linear else None
        out[b] = derived if derived is not None else run(b)
    return out
