"""Same-device checks: :func:`check_same_device` takes named tensors, modules and nested
containers and returns their one common device, or raises
:class:`~torchplace.errors.MixedDeviceError` with a table that marks the odd ones out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import nn

from torchplace.errors import ConfigError, MixedDeviceError
from torchplace.placement.canonical import DeviceLike, canonical_device
from torchplace.placement.containers import (
    ATOMS,
    children,
    dtype_name,
    is_one_shot,
    nesting_error,
    object_tensors,
    one_shot_error,
    shape_text,
    text_table,
)
from torchplace.placement.packed import PACKED_DEVICE, holds_packed, stored_dtype, unpacked

__all__ = ["check_same_device"]

_MAJORITY_ROWS = 8  # rows of the majority device shown in a mismatch table


class _Packed(NamedTuple):
    """A quantized module's packed weights, on the cpu (``tensor`` None: not unpacked), or one
    of them unpacked, with the dtype it is stored in."""

    module: nn.Module
    tensor: torch.Tensor | None = None
    dtype: torch.dtype | None = None

    @property
    def device(self) -> torch.device:
        return PACKED_DEVICE if self.tensor is None else self.tensor.device


_Found = tuple[str, "torch.Tensor | _Packed"]


def _named_tensors(obj: object, path: str, seen: set[object]) -> Iterator[_Found]:
    if isinstance(obj, torch.Tensor):
        if id(obj) not in seen:  # a tensor found twice is listed once, at its first path
            seen.add(id(obj))
            yield path, obj
        return
    if isinstance(obj, ATOMS):
        return
    if id(obj) in seen:
        return
    if isinstance(obj, nn.Module):
        seen.add(id(obj))
        for name, t in (*obj.named_parameters(), *obj.named_buffers()):
            yield from _named_tensors(t, f"{path}.{name}", seen)
        yield from _packed_modules(obj, path, seen)
        return
    if is_one_shot(obj):
        raise one_shot_error("check_same_device", obj, path)
    if isinstance(obj, torch.optim.Optimizer):
        seen.update(_host_steps(obj))
    kids = children(obj, path) or object_tensors(obj, path)  # a plain object's own tensors
    if kids:
        seen.add(id(obj))
    for child_path, child in kids:
        yield from _named_tensors(child, child_path, seen)


def _host_steps(optimizer: torch.optim.Optimizer) -> set[int]:
    """The ids of an optimizer's per-parameter ``step`` counters kept on the cpu as 0-dim
    tensors: torch keeps them there by design (Adam's, unless ``capturable`` or ``fused``) and
    reads them as scalars beside state on any device, so they are no odd ones out."""
    return {
        id(step)
        for state in optimizer.state.values()
        if isinstance(state, dict)
        and isinstance(step := state.get("step"), torch.Tensor)
        and step.dim() == 0
        and step.device.type == "cpu"
    }


def _packed_modules(module: nn.Module, path: str, seen: set[object]) -> Iterator[_Found]:
    """The quantized modules in ``module`` that keep weights packed, each once; found by type,
    so a model without any costs one pass over its modules, and none is unpacked here."""
    for prefix, sub in module.named_modules():
        if holds_packed(sub) and ("packed", id(sub)) not in seen:
            seen.add(("packed", id(sub)))
            yield (f"{path}.{prefix}" if prefix else path), _Packed(sub)


def _unpack(found: list[_Found]) -> list[_Found]:
    """``found`` with each quantized module's packed weights read back one by one (a module
    whose weights cannot be read back stays one row)."""
    out: list[_Found] = []
    for name, item in found:
        if isinstance(item, torch.Tensor) or item.tensor is not None:
            out.append((name, item))
            continue
        weights = unpacked(item.module)
        out += [(f"{name}.{n}", _Packed(item.module, t, dtype)) for n, t, dtype in weights]
        if not weights:
            out.append((name, item))
    return out


def check_same_device(
    *values: object, expected: DeviceLike | None = None, **named: object
) -> torch.device:
    """Return the one device every given tensor lives on, or raise with a table of who is where.

    Each keyword names a value, and positional values are named ``args[0]``, ``args[1]``, ...:
    a tensor, an ``nn.Module`` (its parameters and buffers, and the weights its quantized
    modules keep packed, which are on the cpu), an optimizer (its state; the 0-dim ``step``
    counters torch keeps on the cpu by design are left out), or a nested
    dict/list/tuple/deque/set/namedtuple/dataclass of those; ``None`` and other leaves are
    ignored. Rows are named by path, e.g. ``batch["x"]``, ``pair[1]`` or ``model.0.weight``.

    Quantized modules (``torch.ao.nn.quantized``, ``.dynamic``: what ``quantize_dynamic`` puts
    in place of ``nn.Linear``, ...) are found by type and count as the cpu without unpacking
    their weights; those are read back only to show them in the table of a mismatch
    (``model.0._packed_params.weight``).

    With ``expected`` (keyword-only, so no value may be called ``expected``), every tensor must
    be on that device (``"cuda"`` means the current ``cuda:N``).

    Raises :class:`~torchplace.errors.MixedDeviceError` when the tensors disagree (or are not on
    ``expected``); rows of the minority device(s) are marked ``>>``. Raises
    :class:`~torchplace.errors.ConfigError` when no tensor was given and there is no
    ``expected`` device to return, or for a generator or other iterator (left unconsumed):
    its tensors cannot be checked without using it up. A dict's ``keys()``, ``values()`` or
    ``items()`` view is read like a list.
    """
    want = canonical_device(expected) if expected is not None else None
    seen: set[object] = set()
    found: list[_Found] = []
    named = {**{f"args[{i}]": v for i, v in enumerate(values)}, **named}
    for name, value in named.items():
        try:
            found.extend(_named_tensors(value, name, seen))
        except RecursionError as exc:
            raise nesting_error("check_same_device", value, name, exc) from None
    if not found:
        if want is not None:
            return want
        names = ", ".join(named) or "(nothing)"
        raise ConfigError(
            f"check_same_device found no tensor in {names}; pass tensors, modules or containers "
            "of them, or give expected=DEVICE"
        )
    agreed = _agreed(found, want)
    if agreed is None:  # packed weights are read back only for the table, or if they settle it
        found = _unpack(found)
        agreed = _agreed(found, want)
    if agreed is not None:
        return agreed
    raise MixedDeviceError(_mismatch(found, want))


def _counts(found: list[_Found]) -> dict[torch.device, int]:
    counts: dict[torch.device, int] = {}
    for _, t in found:
        counts[t.device] = counts.get(t.device, 0) + 1
    return counts


def _agreed(found: list[_Found], want: torch.device | None) -> torch.device | None:
    """The one device of ``found`` (``want``, when given), or None when they disagree."""
    devices = set(_counts(found))
    if want is None:
        return next(iter(devices)) if len(devices) == 1 else None
    return want if devices <= {want} else None


def _mismatch(found: list[_Found], want: torch.device | None) -> str:
    counts = _counts(found)
    if want is None:
        # the majority device is "right"; ties go to the first device seen
        majority = max(counts, key=lambda d: counts[d])
        odd = {d for d in counts if d != majority}
        summary = ", ".join(f"{d} ({n} tensor{'s' * (n != 1)})" for d, n in counts.items())
        head = f"tensors that must share one device live on {len(counts)}: {summary}."
        return _mismatch_message(head, found, odd, majority)
    odd = {d for d in counts if d != want}
    n_odd = sum(counts[d] for d in odd)
    head = (
        f"{n_odd} of {len(found)} tensor{'s' * (len(found) != 1)} not on the expected "
        f"device {want}."
    )
    return _mismatch_message(head, found, odd, want)


def _cells(name: str, item: torch.Tensor | _Packed) -> list[str]:
    """A table row: name, shape, dtype, device (``packed`` for weights not read back)."""
    if isinstance(item, torch.Tensor):
        return [name, shape_text(item), dtype_name(item.dtype), str(item.device)]
    dtype = item.dtype or stored_dtype(item.module)
    shape = "packed" if item.tensor is None else shape_text(item.tensor)
    return [name, shape, "?" if dtype is None else dtype_name(dtype), str(item.device)]


def _mismatch_message(
    head: str, found: list[_Found], odd: set[torch.device], target: torch.device
) -> str:
    rows: list[list[str]] = []
    marks: list[bool] = []
    hidden: dict[torch.device, int] = {}
    shown_ok = 0
    n_packed = 0
    for name, t in found:
        is_odd = t.device in odd
        if not is_odd:
            if shown_ok >= _MAJORITY_ROWS:
                hidden[t.device] = hidden.get(t.device, 0) + 1
                continue
            shown_ok += 1
        n_packed += is_odd and isinstance(t, _Packed)
        rows.append(_cells(name, t))
        marks.append(is_odd)
    table = text_table(["name", "shape", "dtype", "device"], rows, marks)
    more = "".join(f"\n   ... and {n} more on {d}" for d, n in hidden.items())
    fix = (
        []
        if n_packed == sum(marks)
        else [
            f"move them to {target} where they are created "
            f"(tensor.to({str(target)!r}), module.to(...), or torchplace.move(batch, {str(target)!r}))"
        ]
    )
    if n_packed:
        fix.append(
            "quantized modules (torch.ao.nn.quantized, what quantize_dynamic puts in) keep their "
            "weights packed, CPU-only, and module.to() leaves them on the cpu: run the quantized "
            f"model on the cpu, or the float model on {target}"
        )
    return f"{head}\n{table}{more}\n'>>' marks the odd ones out. Fix: {'; '.join(fix)}."
