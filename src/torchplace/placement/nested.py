"""Nested moves: :func:`move` returns a new structure with every tensor on the device, using
``non_blocking`` only where it is safe; :func:`map_tensors` is the walk underneath (also used by
:class:`~torchplace.prefetch.DevicePrefetcher`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch import nn

from torchplace.errors import ConfigError
from torchplace.placement.canonical import DeviceLike
from torchplace.placement.containers import (
    ATOMS,
    dtype_name,
    is_dataclass_instance,
    is_namedtuple,
    shape_of,
)

__all__ = ["map_tensors", "move", "tensor_mover"]

_log = logging.getLogger("torchplace.placement")

T = TypeVar("T")


def map_tensors(
    obj: T,
    fn: Callable[[torch.Tensor], torch.Tensor],
    *,
    copy: bool = True,
    objects: Callable[[Any], Any] | None = None,
) -> T:
    """Apply ``fn`` to every tensor inside ``obj`` and return the rebuilt structure.

    Walks dicts (and other mappings), lists, tuples, namedtuples, sets and dataclasses (frozen
    ones too, rebuilt without calling ``__init__``). A tensor that appears twice is mapped once,
    so aliasing survives. Other leaves, and ``nn.Module`` instances, come back as they are.
    With ``copy=False`` a container whose contents did not change is returned itself. With
    ``objects``, any other object that has its own ``to`` method is replaced by
    ``objects(obj)`` instead of being walked.
    """
    return _Mapper(fn, copy, objects).map(obj)  # type: ignore[no-any-return]


class _Mapper:
    __slots__ = ("_copy", "_fn", "_memo", "_to")

    def __init__(
        self,
        fn: Callable[[torch.Tensor], torch.Tensor],
        copy: bool,
        to: Callable[[Any], Any] | None = None,
    ) -> None:
        self._fn = fn
        self._copy = copy
        self._memo: dict[int, torch.Tensor] = {}
        self._to = to

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        key = id(t)
        out = self._memo.get(key)
        if out is None:
            out = self._memo[key] = self._fn(t)
        return out

    def map(self, obj: Any) -> Any:
        cls = type(obj)
        if cls is torch.Tensor:
            return self.tensor(obj)
        if cls is dict:
            new = {k: self.map(v) for k, v in obj.items()}
            return new if self._copy or _changed(obj.values(), new.values()) else obj
        if cls is list:
            items = [self.map(v) for v in obj]
            return items if self._copy or _changed(obj, items) else obj
        if cls is tuple:
            items = [self.map(v) for v in obj]
            return tuple(items) if self._copy or _changed(obj, items) else obj
        if obj is None or cls in ATOMS:
            return obj
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if isinstance(obj, nn.Module):
            return obj  # Module.to() moves in place; that is never done behind the caller's back
        if self._to is not None:
            to = getattr(obj, "to", None)
            if callable(to):
                return self._to(obj)
        if isinstance(obj, Mapping):
            return self._mapping(obj)
        if is_namedtuple(obj):
            items = [self.map(v) for v in obj]
            return cls(*items) if self._copy or _changed(obj, items) else obj
        if isinstance(obj, (list, tuple, set, frozenset)):
            items = [self.map(v) for v in obj]
            if not self._copy and not _changed(obj, items):
                return obj
            try:
                return cls(items)
            except TypeError:
                return items if isinstance(obj, list) else tuple(items)
        if is_dataclass_instance(obj):
            return self._dataclass(obj)
        return obj

    def _mapping(self, obj: Mapping[Any, Any]) -> Any:
        new = {k: self.map(v) for k, v in obj.items()}
        if not self._copy and not _changed(obj.values(), new.values()):
            return obj
        if isinstance(obj, dict):
            out = copy.copy(obj)  # keeps the subclass and its extras (defaultdict factory, ...)
            out.update(new)
            return out
        try:
            return type(obj)(new)  # type: ignore[call-arg]
        except TypeError:
            return new

    def _dataclass(self, obj: Any) -> Any:
        fields = dataclasses.fields(obj)
        old = [getattr(obj, f.name) for f in fields]
        new = [self.map(v) for v in old]
        if not self._copy and not _changed(old, new):
            return obj
        out = copy.copy(obj)  # no __init__/__post_init__ re-run; frozen classes too
        for f, v in zip(fields, new, strict=True):
            object.__setattr__(out, f.name, v)
        return out


def _changed(old: Any, new: Any) -> bool:
    return any(a is not b for a, b in zip(old, new, strict=True))


def _needs_copy(t: torch.Tensor, device: torch.device) -> bool:
    d = t.device
    return d.type != device.type or (device.index is not None and d.index != device.index)


def _non_blocking_ok(t: torch.Tensor, device: torch.device) -> bool:
    """Whether a non_blocking copy of ``t`` to ``device`` is safe; logs (DEBUG) when it is not."""
    if not _needs_copy(t, device) or device.type == "meta" or t.device.type == "meta":
        return False  # no copy, or no data: nothing to overlap
    if t.device.type == "cpu":
        if t.is_pinned():
            return True
        _log.debug(
            "move: blocking copy of a %s %s tensor to %s: the host source is not pinned, and a "
            "non_blocking copy from pageable memory synchronizes anyway (pin it, or use "
            "DevicePrefetcher)",
            dtype_name(t.dtype),
            shape_of(t),
            device,
        )
        return False
    if device.type == "cpu":
        _log.debug(
            "move: blocking copy of a %s %s tensor from %s to the host: a non_blocking "
            "device-to-host copy can be read before it finishes",
            dtype_name(t.dtype),
            shape_of(t),
            t.device,
        )
        return False
    return True  # device to device: ordered on the current stream


def move(
    obj: T,
    device: DeviceLike,
    *,
    non_blocking: bool = False,
    dtype: torch.dtype | None = None,
) -> T:
    """Return ``obj`` with every tensor inside it on ``device`` (and ``dtype``), as a new structure.

    - Walks dicts (and other mappings), lists, tuples, namedtuples, sets and dataclasses (frozen
      ones too; rebuilt without re-running ``__init__``). Containers are always new; a tensor
      already on ``device`` with the right dtype is reused, not copied. A tensor that appears
      twice is moved once, so aliasing survives.
    - Objects with their own ``to`` method (``PackedSequence``, ``BatchEncoding``, ``TensorDict``,
      ...) are moved with ``obj.to(device)``; ``dtype`` and ``non_blocking`` are not passed on,
      as their meaning there is unknown.
    - ``nn.Module`` instances are returned untouched: ``Module.to()`` moves in place, which
      ``move`` never does behind the caller's back. Call ``module.to(device)`` yourself.
    - ``non_blocking=True`` is honoured only where it is safe: a pinned host tensor going to an
      accelerator, or a device-to-device copy. A pageable host source, or a copy to the host,
      is done blocking instead, with a DEBUG log line saying so.
    - ``dtype`` converts floating-point tensors only; integer and bool tensors (labels, masks,
      indices) keep their dtype.
    - Other leaves (numbers, strings, None, ...) are returned as they are.
    """
    try:
        target = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(
            f"move: device {device!r} is not a torch device; pass a torch.device or a spec such "
            "as 'cpu', 'cuda:0' or 'meta' (torchplace.resolve_device('auto') picks one)"
        ) from None
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise ConfigError(
            f"move(dtype={dtype!r}) must be a torch.dtype such as torch.float16, not "
            f"{type(dtype).__name__}"
        )
    if dtype is not None and not dtype.is_floating_point:
        raise ConfigError(
            f"move(dtype={dtype}) must be a floating-point dtype (it converts floating tensors "
            "only); convert integer tensors yourself"
        )
    fn = tensor_mover(target, non_blocking, dtype)
    if type(obj) is torch.Tensor:
        return fn(obj)  # type: ignore[return-value, arg-type]
    return _Mapper(fn, True, lambda o: o.to(target)).map(obj)  # type: ignore[no-any-return]


def tensor_mover(
    device: torch.device, non_blocking: bool, dtype: torch.dtype | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The per-tensor move of :func:`move` (arguments already validated)."""

    def fn(t: torch.Tensor) -> torch.Tensor:
        nb = non_blocking and _non_blocking_ok(t, device)
        if dtype is not None and t.is_floating_point():
            return t.to(device, dtype, non_blocking=nb)
        return t.to(device, non_blocking=nb)

    return fn
