"""Nested moves: :func:`move` returns a new structure with every tensor on the device, using
``non_blocking`` only where it is safe; :func:`map_tensors` is the walk underneath (also used by
:class:`~torchplace.prefetch.DevicePrefetcher`).
"""

from __future__ import annotations

import copy
import functools
import logging
from collections import UserDict, UserList, deque
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
    children,
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

__all__ = ["map_tensors", "move", "move_object", "no_data_error", "tensor_mover"]

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
    except _Refused as refused:
        path = path_to(obj, refused.obj, "value")
        raise refused.error(where, refused.obj, path) from refused.cause


#: Makes the error for a value the walk refused, from (the function's name, the value, its path).
_ErrorFor = Callable[[str, Any, str], TorchplaceError]


class _Refused(Exception):
    """Raised inside the walk at a value it cannot map (a generator, a plain object holding
    tensors, a mapping that cannot be rebuilt, an object whose ``to`` failed): the walk does
    not track paths, which would cost every leaf, so :func:`_walk` finds the value's path once
    it is known to be needed and raises ``error(where, obj, path)``, chained to ``cause``."""

    def __init__(self, obj: object, error: _ErrorFor, cause: BaseException | None = None) -> None:
        super().__init__()
        self.obj = obj
        self.error = error
        self.cause = cause


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
            raise _Refused(obj, one_shot_error)
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
            raise _Refused(obj, opaque_error)
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
        if isinstance(obj, UserDict):  # a dict kept in .data, as a UserList keeps a list
            # its copy keeps the subclass and its attributes; its __init__ is not re-run, as it
            # may take other arguments first (Features(split, **items))
            twin = copy.copy(obj)
            twin.data = new
            return twin
        rebuilt = _rebuilt_mapping(type(obj), new)
        if rebuilt is not None:
            return rebuilt
        if not _changed(obj.values(), new.values()):
            return obj
        raise _Refused(obj, _unrebuildable_error)

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


def _rebuilt_mapping(cls: Any, items: dict[Any, Any]) -> Any:
    """``cls(items)`` when that gives back a mapping of exactly ``items`` (the same keys, each
    to the very value given), else None: a constructor that takes other arguments first may
    take the items for one of them and come back empty, which would lose them silently."""
    try:
        out = cls(items)
    except TypeError:  # its constructor takes other arguments than its items
        return None
    if len(out) != len(items) or any(k not in out or out[k] is not v for k, v in items.items()):
        return None
    return out


def _unrebuildable_error(where: str, obj: Any, path: str) -> ConfigError:
    kind = type(obj).__name__
    return ConfigError(
        f"{where}: cannot rebuild a {kind} (a mapping that is not a dict) at {path} with its "
        f"tensors mapped: {kind}(items) does not give back a {kind} of those items (its "
        "constructor takes other arguments), so it was refused rather than passed back "
        "without them or turned into a plain dict. Fix: give it a to(device) method that "
        f"returns it moved, let {kind}(items) build it from its items alone, or pass a dict "
        "(dict(mapping))"
    )


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
      ...) are moved with ``obj.to(device)``, called on a shallow copy of ``obj`` (a ``to``
      that moves in place and returns ``self`` would change the input); ``dtype`` and
      ``non_blocking`` are not passed on, as their meaning there is unknown. A ``to`` that
      returns None, or fails (one that is no device move), raises
      :class:`~torchplace.errors.ConfigError` naming the object's path (``PlacementError`` when
      it holds meta tensors); torch's own ``RuntimeError`` (out of memory) is raised as it is.
      A mapping that is not a dict is rebuilt as ``type(m)(items)`` (a ``UserDict`` as a copy
      holding them), and refused with ``ConfigError`` when that does not give back exactly
      those items. Any other plain object keeping tensors as attributes
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
        mapper = _Mapper(fn, True, functools.partial(move_object, device=target))
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


def move_object(obj: Any, device: torch.device) -> Any:
    """``obj`` moved by its own ``to(device)`` (``BatchEncoding``, ``PackedSequence``, ...), as
    :func:`move` and :class:`~torchplace.prefetch.DevicePrefetcher` move such objects.

    ``to`` is called on a shallow copy: many such methods move in place and return the object
    itself (transformers' ``BatchEncoding`` and ``BatchFeature`` replace their ``data``), which
    would change the caller's batch; an object that cannot be copied is moved itself. A ``to``
    that returns None (it worked in place only) raises :class:`~torchplace.errors.ConfigError`,
    as does one that fails (a ``to`` that is no device move: a pint quantity's, an arrow
    date's), naming the object's path; one holding meta tensors that fails going to a real
    device raises :class:`~torchplace.errors.PlacementError`. A ``RuntimeError`` (torch's own
    failure of the copy: out of memory, a device error) is raised as it is, as for a tensor.
    It is the ``objects`` of a walk (:func:`map_tensors`), which names the path in those errors.
    """
    try:
        twin = copy.copy(obj)
    except Exception:  # no copy to be had: moved as it is, by its own contract
        twin = obj
    try:
        out = twin.to(device)
    except TorchplaceError:
        raise
    except Exception as exc:
        meta = device.type != "meta" and _holds_meta(obj)
        if isinstance(exc, RuntimeError) and not meta:
            raise  # torch's own failure of the copy (out of memory, ...), as for a tensor
        if not meta:
            _raise_if_unusable(device, exc)  # no such device here: its DeviceError says why
        error = _meta_object_error if meta else _to_failed_error
        raise _Refused(obj, functools.partial(error, device=device, exc=exc), exc) from None
    if out is None:
        raise _Refused(obj, functools.partial(_to_returned_none_error, device=device))
    return out


def _holds_meta(obj: object) -> bool:
    """Whether a meta tensor is anywhere inside ``obj`` (its items, its attributes)."""
    seen: set[int] = set()
    stack: list[object] = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            if value.is_meta:
                return True
        elif id(value) not in seen:
            seen.add(id(value))
            stack += [v for _, v in children(value, "") or object_tensors(value, "")]
    return False


def _cause(exc: BaseException) -> str:
    """The first line of ``exc``, short, for a message that names what its own ``to`` raised."""
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0][:120] if lines else ''}"


def _to_failed_error(
    where: str, obj: Any, path: str, *, device: torch.device, exc: BaseException
) -> ConfigError:
    kind = type(obj).__name__
    return ConfigError(
        f"{where}: the {kind} at {path} cannot be moved to {device}: an object with a to "
        f"method is moved by calling it with the device, and its to({str(device)!r}) raised "
        f"{_cause(exc)}, so {kind}.to takes something else (a unit, a time zone, ...) or cannot "
        "move it. Fix: leave it out of the batch, or give it a to that takes a device and "
        "returns it moved"
    )


def _to_returned_none_error(
    where: str, obj: Any, path: str, *, device: torch.device
) -> ConfigError:
    kind = type(obj).__name__
    return ConfigError(
        f"{where}: the {kind} at {path} cannot be moved to {device}: its own "
        f"to({str(device)!r}) returned None (it moves in place only), so the moved structure "
        "would hold None in its place. Fix: make its to return the moved object (return self "
        "at its end), or leave it out of the batch and move it yourself"
    )


def _meta_object_error(
    where: str, obj: Any, path: str, *, device: torch.device, exc: BaseException
) -> PlacementError:
    kind = type(obj).__name__
    return PlacementError(
        f"{where}: the {kind} at {path} holds meta tensors, and its own to({str(device)!r}) "
        f"raised {_cause(exc)}: a meta tensor has a shape and dtype but no data to copy. Fix: "
        "create its tensors on the device they are used on, or load real values into them, "
        "before moving it"
    )


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
