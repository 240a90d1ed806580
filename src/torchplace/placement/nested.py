"""Nested moves: :func:`move` returns a new structure with every tensor on the device, using
``non_blocking`` only where it is safe; :func:`map_tensors` is the walk underneath (also used by
:class:`~torchplace.prefetch.DevicePrefetcher`).
"""

from __future__ import annotations

import copy
import functools
import logging
from collections import UserList, deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from torch import nn

from torchplace.errors import (
    ConfigError,
    DeviceUnavailableError,
    PlacementError,
    TorchplaceError,
)
from torchplace.placement.canonical import DeviceLike
from torchplace.placement.containers import (
    ATOMS,
    SEQUENCES,
    dataclass_items,
    dtype_name,
    is_dataclass_instance,
    is_one_shot,
    is_view,
    nesting_error,
    object_tensors,
    one_shot_error,
    opaque_error,
    path_to,
    shape_of,
)

__all__ = ["map_tensors", "move", "no_data_error", "tensor_mover"]

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

    Walks dicts (and other mappings), lists (``UserList`` too), tuples, deques, namedtuples, sets, dataclasses and
    attrs classes (frozen ones too, rebuilt without calling ``__init__``), and
    ``functools.partial`` objects (function, arguments and keywords). A tensor that appears
    twice is mapped once, so aliasing survives. Other leaves, classes, and ``nn.Module``
    instances, come back as they are. With ``copy=False`` a container whose contents did not change is returned itself.
    With ``objects``, any other object that has its own ``to`` method is replaced by
    ``objects(obj)`` instead of being walked. A structure that contains itself, or nests deeper
    than Python's recursion limit allows, raises :class:`~torchplace.errors.ConfigError`; so
    does a generator or other iterator (``map``, ``zip``, ``iter(list)``, ...; a file is a
    leaf), naming its path and left unconsumed: its tensors cannot be reached without using it
    up, and passing it through would leave them unmapped; and so does a mapping's ``keys()``,
    ``values()`` or ``items()`` view, which cannot hold the mapped tensors, and a plain object
    (no ``to`` method, not a dataclass) that keeps tensors as attributes, which cannot be
    rebuilt with them mapped.
    """
    for name, given in (("fn", fn), ("objects", objects)):
        if given is not None and not callable(given):
            raise ConfigError(
                f"map_tensors: {name}={given!r:.80} must be callable (a function that takes "
                f"{'a tensor' if name == 'fn' else 'an object'} and returns what replaces it)"
            )
    return _walk("map_tensors", _Mapper(fn, copy, objects), obj)  # type: ignore[no-any-return]


def _walk(where: str, mapper: _Mapper, obj: Any) -> Any:
    try:
        return mapper.map(obj)
    except RecursionError as exc:
        raise nesting_error(where, obj, "value", exc) from None
    except _OneShotFound as found:
        path = path_to(obj, found.obj, "value")
        if is_one_shot(found.obj) or is_view(found.obj):
            raise one_shot_error(where, found.obj, path) from None
        raise opaque_error(where, found.obj, path) from None


class _OneShotFound(Exception):
    """Raised inside the walk at a generator or iterator, or a plain object holding tensors;
    :func:`_walk` names its path."""

    def __init__(self, obj: object) -> None:
        super().__init__()
        self.obj = obj


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
        if obj is None or cls in ATOMS or isinstance(obj, type):
            return obj  # a class is a leaf, though nn.Linear.to is a callable attribute of it
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if isinstance(obj, nn.Module):
            return obj  # Module.to() moves in place; that is never done behind the caller's back
        if self._to is not None and callable(_readable(obj, "to")):
            return self._to(obj)
        if isinstance(obj, Mapping):
            return self._mapping(obj)
        if is_one_shot(obj) or is_view(obj):
            raise _OneShotFound(obj)
        if isinstance(obj, SEQUENCES):  # namedtuples too, rebuilt without their own __new__
            items = [self.map(v) for v in obj]
            if not self._copy and not _changed(obj, items):
                return obj
            return _rebuild(obj, items)
        if isinstance(obj, UserList):  # a list kept in .data; its copy keeps the subclass
            items = [self.map(v) for v in obj]
            if not self._copy and not _changed(obj, items):
                return obj
            out = copy.copy(obj)
            out.data = items
            return out
        if is_dataclass_instance(obj):
            return self._dataclass(obj)
        if isinstance(obj, functools.partial):
            return self._partial(obj)
        if not callable(_readable(obj, "to")) and any(
            self.tensor(t) is not t for _, t in object_tensors(obj, "")
        ):  # a plain object whose tensors would change: it cannot be rebuilt, so refused
            raise _OneShotFound(obj)
        return obj

    def _mapping(self, obj: Mapping[Any, Any]) -> Any:
        new = {k: self.map(v) for k, v in obj.items()}
        if not self._copy and not _changed(obj.values(), new.values()):
            return obj
        if isinstance(obj, dict):
            out = copy.copy(obj)  # keeps the subclass and its extras (defaultdict factory, ...)
            dict.update(out, new)  # not the subclass's update: Counter.update adds counts
            self._set_fields(obj, out)  # a ModelOutput's fields are attributes too
            return out
        try:
            return type(obj)(new)  # type: ignore[call-arg]
        except TypeError as exc:  # its constructor takes other arguments than its items
            if not _changed(obj.values(), new.values()):
                return obj
            raise ConfigError(
                f"cannot rebuild a {type(obj).__name__} (a mapping that is not a dict) with its "
                f"tensors mapped: {type(obj).__name__}(items) raised {exc}, so it was refused "
                "rather than turned into a plain dict. Fix: give it a to(device) method, or "
                "pass a dict (dict(mapping))"
            ) from None

    def _dataclass(self, obj: Any) -> Any:
        items = dataclass_items(obj)  # an init=False field never set is left unset
        new = [self.map(v) for _, v in items]
        if not self._copy and not _changed([v for _, v in items], new):
            return obj
        out = copy.copy(obj)  # no __init__/__post_init__ re-run; frozen classes too
        for (name, _), v in zip(items, new, strict=True):
            object.__setattr__(out, name, v)
        return out

    def _partial(self, obj: functools.partial[Any]) -> Any:
        """A ``functools.partial`` with its function, arguments and keywords mapped: a new
        partial of the same class (its ``__dict__`` kept), as ``copy.copy`` makes one."""
        func = self.map(obj.func)
        args = [self.map(v) for v in obj.args]
        keywords = {k: self.map(v) for k, v in obj.keywords.items()}
        if not self._copy and not _changed(
            [obj.func, *obj.args, *obj.keywords.values()], [func, *args, *keywords.values()]
        ):
            return obj
        out: Any = copy.copy(obj)  # typeshed does not declare partial.__setstate__
        out.__setstate__((func, tuple(args), keywords, dict(vars(obj)) or None))
        return out

    def _set_fields(self, obj: Any, out: Any) -> None:
        """Map the dataclass fields of ``obj``, a mapping that is a dataclass too (transformers'
        ``ModelOutput``), into ``out``: its attributes, apart from its items, would keep the
        unmapped tensors. The memo maps a tensor held by both once."""
        if is_dataclass_instance(obj):
            for name, v in dataclass_items(obj):
                object.__setattr__(out, name, self.map(v))


def _readable(obj: object, name: str) -> Any:
    """``obj``'s attribute ``name``, or None when reading it raises: a ``__getattr__`` or a
    property that raises something other than ``AttributeError`` (a lazy proxy's
    ``RuntimeError``) makes the attribute unreadable, which is the same as not having it."""
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def _rebuild(obj: Any, items: list[Any]) -> Any:
    """A list, tuple, deque, set or frozenset (or a subclass) like ``obj``, holding ``items``.

    The subclass, its instance attributes and a deque's ``maxlen`` are kept. A subclass's own
    ``__new__``/``__init__`` is not re-run (it may take other arguments than the items, as a
    dataclass's ``__init__`` does); where that is impossible the plain base type comes back.
    """
    cls = type(obj)
    base: Any = next(b for b in SEQUENCES if isinstance(obj, b))
    if cls is base:
        return deque(items, obj.maxlen) if base is deque else base(items)
    try:
        if base is tuple or base is frozenset:
            out = base.__new__(cls, items)
        elif base is deque:
            out = deque.__new__(cls)
            deque.__init__(out, items, obj.maxlen)
        else:
            out = base.__new__(cls)
            base.__init__(out, items)
    except TypeError:  # a C subclass (torch.Size) refuses the base __new__; its own takes items
        try:
            out = cls(items)
        except TypeError:
            return deque(items, obj.maxlen) if base is deque else base(items)
        return out
    if hasattr(obj, "__dict__"):
        out.__dict__.update(vars(obj))
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

    - Walks dicts (and other mappings), lists (``UserList`` too), tuples, deques, namedtuples, sets, dataclasses
      and attrs classes (frozen ones too; rebuilt without re-running ``__init__``), and
      ``functools.partial`` objects (a new partial with its arguments moved); a dict that
      is a dataclass too (``ModelOutput``) gets the moved tensors in its attributes as well. Containers are always new; a
      tensor already on ``device`` with the right dtype is reused, not copied. A tensor that
      appears twice is moved once, so aliasing survives.
    - A tensor that requires grad (an ``nn.Parameter`` too) comes back as ``t.to(device)`` gives
      it: a plain tensor linked to the original by autograd. Move the module for parameters.
    - A meta tensor going to a real device raises :class:`~torchplace.errors.PlacementError` (it
      has no data); a device this machine lacks raises the
      :class:`~torchplace.errors.DeviceError` of :func:`torchplace.resolve_device` (a device
      type this torch build has no backend for, such as ``xla``, raises
      :class:`~torchplace.errors.DeviceUnavailableError`); a structure that contains itself or
      nests too deep raises :class:`~torchplace.errors.ConfigError`.
    - Objects with their own ``to`` method (``PackedSequence``, ``BatchEncoding``, ``TensorDict``,
      ...) are moved with ``obj.to(device)``; ``dtype`` and ``non_blocking`` are not passed on,
      as their meaning there is unknown. Any other plain object keeping tensors as attributes
      raises :class:`~torchplace.errors.ConfigError` naming its path: it cannot be rebuilt.
    - ``nn.Module`` instances are returned untouched: ``Module.to()`` moves in place, which
      ``move`` never does behind the caller's back. Call ``module.to(device)`` yourself.
    - ``non_blocking=True`` is honoured only where it is safe: a pinned host tensor going to an
      accelerator, or a device-to-device copy. A pageable host source, or a copy to the host,
      is done blocking instead, with a DEBUG log line saying so.
    - ``dtype`` converts floating-point tensors only; integer and bool tensors (labels, masks,
      indices) keep their dtype.
    - A generator or other iterator inside ``obj`` raises
      :class:`~torchplace.errors.ConfigError` naming its path, unconsumed: its tensors cannot be
      reached without using it up. Pass a list. So does a dict's ``keys()``, ``values()`` or
      ``items()`` view, which cannot hold the moved tensors: pass the dict.
    - Other leaves (numbers, strings, None, ...) are returned as they are.
    """
    try:
        target = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(
            f"move: device {device!r} is not a torch device; pass a torch.device or a spec such "
            "as 'cpu', 'cuda:0' or 'meta' (torchplace.resolve_device('auto') picks one)"
        ) from None
    if not isinstance(non_blocking, bool):
        raise ConfigError(
            f"move(non_blocking={non_blocking!r:.40}) must be True or False, not "
            f"{type(non_blocking).__name__} (a string such as 'False' would count as true)"
        )
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
    if target.type in ("cpu", "meta") and target.index is not None:
        target = torch.device(target.type)  # as tensors report it: "cpu:0" tensors are on "cpu"
    fn = tensor_mover(target, non_blocking, dtype)
    try:
        if type(obj) is torch.Tensor:
            return fn(obj)  # type: ignore[return-value, arg-type]
        mapper = _Mapper(fn, True, lambda o: o.to(target))
        return _walk("move", mapper, obj)  # type: ignore[no-any-return]
    except TorchplaceError:
        raise
    except Exception as exc:
        _raise_if_unusable(target, exc)
        raise


def _raise_if_unusable(device: torch.device, exc: Exception) -> None:
    """After a failed copy to ``device``: raise the DeviceError that says why it cannot be used
    here (no CUDA build, no such index, no backend for ``xla``/``hpu``, ...), if that is why;
    else return."""
    if device.type in ("cpu", "meta"):
        return
    if device.type in ("cuda", "mps", "xpu"):
        from torchplace.devices import resolve_device

        resolve_device(device)  # raises DeviceUnavailableError / DeviceIndexError with the fix
        return
    try:
        torch.empty(0, device=device)
    except Exception as probe_exc:  # any device type this torch build cannot allocate on
        raise DeviceUnavailableError(
            f"cannot use {str(device)!r}: torch {torch.__version__} cannot create tensors on "
            f"{device.type} devices here (no backend for them is loaded). Fix: install and "
            f"import the torch extension that provides {device.type!r} devices, or ask for "
            "'auto' or 'cpu'."
        ) from probe_exc


def no_data_error(t: torch.Tensor, device: torch.device) -> PlacementError:
    """The error for a copy of meta tensor ``t`` to a real device: there is no data to copy."""
    return PlacementError(
        f"cannot copy a meta tensor ({dtype_name(t.dtype)} {shape_of(t)}) to {device}: a meta "
        "tensor has a shape and dtype but no data. Fix: create it on the device it is used on, "
        "or materialise a meta model with module.to_empty(device=...) and then initialise it or "
        "load its weights (load_state_dict(..., assign=True))"
    )


def tensor_mover(
    device: torch.device, non_blocking: bool, dtype: torch.dtype | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The per-tensor move of :func:`move` (arguments already validated)."""

    def fn(t: torch.Tensor) -> torch.Tensor:
        if t.is_meta and device.type != "meta":
            raise no_data_error(t, device)
        nb = non_blocking and _non_blocking_ok(t, device)
        try:
            if dtype is not None and t.is_floating_point():
                return t.to(device, dtype, non_blocking=nb)
            return t.to(device, non_blocking=nb)
        except (RuntimeError, NotImplementedError) as exc:
            if t.is_nested and not t.is_quantized:
                _raise_if_unusable(device, exc)
                raise PlacementError(
                    f"cannot copy a nested {dtype_name(t.dtype)} tensor of {t.size(0)} "
                    f"components ({t.layout} layout) to {device}: torch has no kernels for it "
                    f"there ({str(exc).splitlines()[0][:120]}). Fix: build it with "
                    "layout=torch.jagged (torch.nested.nested_tensor(..., layout=torch.jagged)), "
                    "or pad it first (tensor.to_padded_tensor(0.0))"
                ) from exc
            if not t.is_quantized:
                raise
            _raise_if_unusable(device, exc)
            raise PlacementError(
                f"cannot copy a quantized {dtype_name(t.dtype)} {shape_of(t)} tensor to "
                f"{device}: torch has no quantized kernels for it there "
                f"({str(exc).splitlines()[0][:120]}). Fix: dequantize it first "
                "(tensor.dequantize()), or keep it on the cpu"
            ) from exc

    return fn
