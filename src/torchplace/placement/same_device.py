"""Same-device checks: :func:`check_same_device` takes named tensors, modules and nested
containers and returns their one common device, or raises
:class:`~torchplace.errors.MixedDeviceError` with a table that marks the odd ones out.
"""

from __future__ import annotations

from collections.abc import Iterator

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
    one_shot_error,
    shape_text,
    text_table,
)

__all__ = ["check_same_device"]

_MAJORITY_ROWS = 8  # rows of the majority device shown in a mismatch table


def _named_tensors(obj: object, path: str, seen: set[int]) -> Iterator[tuple[str, torch.Tensor]]:
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
        return
    if is_one_shot(obj):
        raise one_shot_error("check_same_device", obj, path)
    kids = children(obj, path)
    if kids:
        seen.add(id(obj))
    for child_path, child in kids:
        yield from _named_tensors(child, child_path, seen)


def check_same_device(
    *values: object, expected: DeviceLike | None = None, **named: object
) -> torch.device:
    """Return the one device every given tensor lives on, or raise with a table of who is where.

    Each keyword names a value, and positional values are named ``args[0]``, ``args[1]``, ...:
    a tensor, an ``nn.Module`` (its parameters and buffers), or a nested
    dict/list/tuple/deque/set/namedtuple/dataclass of those; ``None`` and other leaves are
    ignored. Rows are named by path, e.g. ``batch["x"]``, ``pair[1]`` or ``model.0.weight``.

    With ``expected`` (keyword-only, so no value may be called ``expected``), every tensor must
    be on that device (``"cuda"`` means the current ``cuda:N``).

    Raises :class:`~torchplace.errors.MixedDeviceError` when the tensors disagree (or are not on
    ``expected``); rows of the minority device(s) are marked ``>>``. Raises
    :class:`~torchplace.errors.ConfigError` when no tensor was given and there is no
    ``expected`` device to return, or for a generator or other iterator (left unconsumed):
    its tensors cannot be checked without using it up.
    """
    want = canonical_device(expected) if expected is not None else None
    seen: set[int] = set()
    found: list[tuple[str, torch.Tensor]] = []
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
    counts: dict[torch.device, int] = {}
    for _, t in found:
        counts[t.device] = counts.get(t.device, 0) + 1
    if want is None:
        if len(counts) == 1:
            return next(iter(counts))
        # the majority device is "right"; ties go to the first device seen
        majority = max(counts, key=lambda d: counts[d])
        odd = {d for d in counts if d != majority}
        summary = ", ".join(f"{d} ({n} tensor{'s' * (n != 1)})" for d, n in counts.items())
        head = f"tensors that must share one device live on {len(counts)}: {summary}."
        target = majority
    else:
        odd = {d for d in counts if d != want}
        if not odd:
            return want
        n_odd = sum(counts[d] for d in odd)
        head = (
            f"{n_odd} of {len(found)} tensor{'s' * (len(found) != 1)} not on the expected "
            f"device {want}."
        )
        target = want
    raise MixedDeviceError(_mismatch_message(head, found, odd, target))


def _mismatch_message(
    head: str, found: list[tuple[str, torch.Tensor]], odd: set[torch.device], target: torch.device
) -> str:
    rows: list[list[str]] = []
    marks: list[bool] = []
    hidden: dict[torch.device, int] = {}
    shown_ok = 0
    for name, t in found:
        is_odd = t.device in odd
        if not is_odd:
            if shown_ok >= _MAJORITY_ROWS:
                hidden[t.device] = hidden.get(t.device, 0) + 1
                continue
            shown_ok += 1
        rows.append([name, shape_text(t), dtype_name(t.dtype), str(t.device)])
        marks.append(is_odd)
    table = text_table(["name", "shape", "dtype", "device"], rows, marks)
    more = "".join(f"\n   ... and {n} more on {d}" for d, n in hidden.items())
    fix = (
        f"'>>' marks the odd ones out. Fix: move them to {target} where they are created "
        f"(tensor.to({str(target)!r}), module.to(...), or torchplace.move(batch, {str(target)!r}))."
    )
    return f"{head}\n{table}{more}\n{fix}"
