"""Where tensors, modules and batches live: same-device checks, module audits, nested moves.

- :func:`check_same_device` takes named tensors, modules and nested containers and returns their
  one common device, or raises :class:`~torchplace.errors.MixedDeviceError` with a table that
  marks the odd ones out.
- :func:`audit_module` groups a module's parameters and buffers by device and dtype and finds the
  *stray* tensors that ``module.to()`` will not move (plain tensor attributes, tensors inside
  plain lists, tuples, dicts and sets, modules kept in plain containers), each named by its path.
- :func:`move` returns a new structure with every tensor on the device, using ``non_blocking``
  only where it is safe.

Nothing here touches a device at import time.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
from torch import nn

from torchplace.bench.units import format_bytes
from torchplace.errors import ConfigError, MixedDeviceError, PlacementError

__all__ = [
    "ModuleAudit",
    "TensorGroup",
    "TensorRecord",
    "audit_module",
    "canonical_device",
    "check_same_device",
    "map_tensors",
    "move",
]

_log = logging.getLogger(__name__)

T = TypeVar("T")
DeviceLike = torch.device | str
_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None))
_MAJORITY_ROWS = 8  # rows of the majority device shown in a mismatch table


# --------------------------------------------------------------------------------------------
# Devices and small helpers
# --------------------------------------------------------------------------------------------


def canonical_device(device: DeviceLike) -> torch.device:
    """A device in the form tensors report: ``cpu`` without index, accelerators with one.

    ``"cuda"`` becomes the current ``cuda:N``, so two specs name the same device exactly when
    their canonical forms are equal.
    """
    d = device if isinstance(device, torch.device) else torch.device(device)
    if d.type in ("cpu", "meta"):
        return torch.device(d.type)
    given: int | None = d.index  # typed int in torch's stubs, but None for "cuda"
    if given is None:
        backend = getattr(torch, d.type, None)
        index = 0
        try:
            if backend is not None and backend.is_available():
                index = int(backend.current_device())
        except (AttributeError, RuntimeError):
            index = 0
        return torch.device(d.type, index)
    return d


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


def _key(key: object) -> str:
    return f"[{json.dumps(key)}]" if isinstance(key, str) else f"[{key!r}]"


def _is_namedtuple(obj: object) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def _fields(obj: object) -> tuple[str, ...]:
    return tuple(getattr(type(obj), "_fields", ()))


def _is_dataclass_instance(obj: object) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def _table(headers: list[str], rows: list[list[str]], marks: list[bool] | None = None) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lead = "   " if marks is not None else ""

    def line(cells: list[str], prefix: str) -> str:
        return (prefix + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))).rstrip()

    out = [line(headers, lead), line(["-" * w for w in widths], lead)]
    for i, row in enumerate(rows):
        prefix = "" if marks is None else (">> " if marks[i] else "   ")
        out.append(line(row, prefix))
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# check_same_device
# --------------------------------------------------------------------------------------------


def _named_tensors(obj: object, path: str, seen: set[int]) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        if id(obj) not in seen:  # a tensor found twice is listed once, at its first path
            seen.add(id(obj))
            yield path, obj
        return
    if isinstance(obj, _ATOMS):
        return
    if id(obj) in seen:
        return
    if isinstance(obj, nn.Module):
        seen.add(id(obj))
        for name, t in (*obj.named_parameters(), *obj.named_buffers()):
            yield from _named_tensors(t, f"{path}.{name}", seen)
        return
    if isinstance(obj, Mapping):
        seen.add(id(obj))
        for k, v in obj.items():
            yield from _named_tensors(v, path + _key(k), seen)
    elif _is_namedtuple(obj):
        seen.add(id(obj))
        for field, v in zip(_fields(obj), obj, strict=True):  # type: ignore[call-overload]
            yield from _named_tensors(v, f"{path}.{field}", seen)
    elif isinstance(obj, (list, tuple)):
        seen.add(id(obj))
        for i, v in enumerate(obj):
            yield from _named_tensors(v, f"{path}[{i}]", seen)
    elif isinstance(obj, (set, frozenset)):
        seen.add(id(obj))
        for i, v in enumerate(obj):
            yield from _named_tensors(v, f"{path}{{{i}}}", seen)
    elif _is_dataclass_instance(obj):
        seen.add(id(obj))
        for f in dataclasses.fields(obj):  # type: ignore[arg-type]
            yield from _named_tensors(getattr(obj, f.name), f"{path}.{f.name}", seen)


def check_same_device(*, expected: DeviceLike | None = None, **named: object) -> torch.device:
    """Return the one device every given tensor lives on, or raise with a table of who is where.

    Each keyword names a value: a tensor, an ``nn.Module`` (its parameters and buffers), or a
    nested dict/list/tuple/set/namedtuple/dataclass of those; ``None`` and other leaves are
    ignored. Rows are named by path, e.g. ``batch["x"]``, ``pair[1]`` or ``model.0.weight``.

    With ``expected`` (keyword-only, so no value may be called ``expected``), every tensor must
    be on that device (``"cuda"`` means the current ``cuda:N``).

    Raises :class:`~torchplace.errors.MixedDeviceError` when the tensors disagree (or are not on
    ``expected``); rows of the minority device(s) are marked ``>>``. Raises
    :class:`~torchplace.errors.ConfigError` when no tensor was given and there is no
    ``expected`` device to return.
    """
    want = canonical_device(expected) if expected is not None else None
    seen: set[int] = set()
    found: list[tuple[str, torch.Tensor]] = []
    for name, value in named.items():
        found.extend(_named_tensors(value, name, seen))
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
        rows.append([name, str(_shape(t)), _dtype_name(t.dtype), str(t.device)])
        marks.append(is_odd)
    table = _table(["name", "shape", "dtype", "device"], rows, marks)
    more = "".join(f"\n   ... and {n} more on {d}" for d, n in hidden.items())
    fix = (
        f"'>>' marks the odd ones out. Fix: move them to {target} where they are created "
        f"(tensor.to({str(target)!r}), module.to(...), or torchplace.move(batch, {str(target)!r}))."
    )
    return f"{head}\n{table}{more}\n{fix}"


# --------------------------------------------------------------------------------------------
# audit_module
# --------------------------------------------------------------------------------------------

TensorKind = Literal["parameter", "buffer", "stray"]


@dataclass(frozen=True)
class TensorRecord:
    """One tensor of a module audit: where it is, what it is, and how it was found."""

    name: str
    kind: TensorKind
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    nbytes: int

    @classmethod
    def of(cls, name: str, kind: TensorKind, t: torch.Tensor) -> TensorRecord:
        return cls(name, kind, _shape(t), t.dtype, t.device, t.numel() * t.element_size())

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "shape": list(self.shape),
            "dtype": _dtype_name(self.dtype),
            "device": str(self.device),
            "bytes": self.nbytes,
        }


@dataclass(frozen=True)
class TensorGroup:
    """Parameters and buffers that share one (device, dtype)."""

    device: torch.device
    dtype: torch.dtype
    parameters: int
    buffers: int
    numel: int
    nbytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": str(self.device),
            "dtype": _dtype_name(self.dtype),
            "parameters": self.parameters,
            "buffers": self.buffers,
            "numel": self.numel,
            "bytes": self.nbytes,
        }


@dataclass(frozen=True)
class ModuleAudit:
    """Where a module's tensors live, and which ones ``module.to()`` would leave behind.

    ``tensors`` holds the registered parameters and buffers, ``strays`` the tensors that
    ``module.to()`` does not move. Render with ``str()`` (a table), rich (``__rich__``) or
    :meth:`to_json`; :meth:`assert_on` raises when anything is off a device.
    """

    module: str
    tensors: tuple[TensorRecord, ...]
    strays: tuple[TensorRecord, ...]

    @property
    def groups(self) -> tuple[TensorGroup, ...]:
        """Parameters and buffers grouped by (device, dtype), in order of first appearance."""
        acc: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for r in self.tensors:
            g = acc.setdefault((r.device, r.dtype), [0, 0, 0, 0])
            g[0 if r.kind == "parameter" else 1] += 1
            g[2] += _numel(r.shape)
            g[3] += r.nbytes
        return tuple(TensorGroup(d, dt, *v) for (d, dt), v in acc.items())

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """Every device a parameter, buffer or stray lives on, in order of first appearance."""
        return tuple(dict.fromkeys(r.device for r in (*self.tensors, *self.strays)))

    @property
    def nbytes(self) -> int:
        """Bytes held by parameters and buffers."""
        return sum(r.nbytes for r in self.tensors)

    def off(self, device: DeviceLike) -> list[TensorRecord]:
        """Every parameter, buffer and stray that is not on ``device``."""
        want = canonical_device(device)
        return [r for r in (*self.tensors, *self.strays) if canonical_device(r.device) != want]

    def assert_on(self, device: DeviceLike) -> None:
        """Raise :class:`~torchplace.errors.PlacementError` listing everything not on ``device``.

        Parameters, buffers and strays are all checked; ``cuda`` and ``cuda:0`` compare equal
        when device 0 is the current one.
        """
        want = canonical_device(device)
        bad = self.off(want)
        if not bad:
            return
        rows = [[r.name, r.kind, str(r.shape), _dtype_name(r.dtype), str(r.device)] for r in bad]
        n_strays = sum(r.kind == "stray" for r in bad)
        head = f"{self.module}: {len(bad)} tensor(s) not on {want}"
        if n_strays:
            head += f", {n_strays} of them stray (module.to() does not move them)"
        msg = head + ".\n" + _table(["name", "kind", "shape", "dtype", "device"], rows)
        fix = []
        if n_strays < len(bad):
            fix.append(f"call module.to({str(want)!r}) for parameters and buffers")
        if n_strays:
            fix.append(
                "register stray tensors with register_buffer() (or use nn.ParameterList/"
                "nn.ModuleList/nn.ModuleDict instead of plain containers) so module.to() "
                "moves them"
            )
        raise PlacementError(msg + "\nFix: " + "; ".join(fix) + ".")

    def to_dict(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "bytes": self.nbytes,
            "devices": [str(d) for d in self.devices],
            "groups": [g.to_dict() for g in self.groups],
            "tensors": [r.to_dict() for r in self.tensors],
            "strays": [r.to_dict() for r in self.strays],
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def __str__(self) -> str:
        out = [
            f"{self.module}: {len(self.tensors)} parameters and buffers, "
            f"{format_bytes(self.nbytes)}",
            _table(list(_GROUP_COLUMNS), [_group_cells(g) for g in self.groups]),
        ]
        if self.strays:
            out.append(f"{len(self.strays)} stray tensor(s) that module.to() will not move:")
            out.append(_table(list(_STRAY_COLUMNS), [_stray_cells(r) for r in self.strays]))
        else:
            out.append("no stray tensors")
        return "\n".join(out)

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        groups = Table(title=f"{self.module}: parameters and buffers")
        for col in _GROUP_COLUMNS:
            groups.add_column(col, justify="right" if col not in ("device", "dtype") else "left")
        for g in self.groups:
            groups.add_row(*_group_cells(g))
        if not self.strays:
            return groups
        strays = Table(title="stray tensors (module.to() will not move these)")
        for col in _STRAY_COLUMNS:
            strays.add_column(col)
        for r in self.strays:
            strays.add_row(*_stray_cells(r))
        return Group(groups, strays)


_GROUP_COLUMNS = ("device", "dtype", "params", "buffers", "numel", "bytes")
_STRAY_COLUMNS = ("name", "shape", "dtype", "device")


def _group_cells(g: TensorGroup) -> list[str]:
    return [
        str(g.device),
        _dtype_name(g.dtype),
        str(g.parameters),
        str(g.buffers),
        str(g.numel),
        format_bytes(g.nbytes),
    ]


def _stray_cells(r: TensorRecord) -> list[str]:
    return [r.name, str(r.shape), _dtype_name(r.dtype), str(r.device)]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


_MODULE_INTERNALS = frozenset({"_parameters", "_buffers", "_modules"})
_MAX_DEPTH = 64


def audit_module(module: nn.Module) -> ModuleAudit:
    """Group ``module``'s parameters and buffers by device and dtype, and find stray tensors.

    A stray is a tensor that ``module.to(device)`` leaves where it is: a tensor attribute that is
    not a registered parameter or buffer, a tensor inside a plain list/tuple/dict/set/dataclass
    (at any depth), or a parameter or buffer of a module kept in a plain container instead of an
    ``nn.ModuleList``/``nn.ModuleDict``. Every submodule is searched; each stray is named by its
    attribute path, e.g. ``encoder.layers.1.cache[0]``. A registered parameter that is also
    referenced from a plain container is not a stray: between cpu and cuda ``to()`` moves
    parameters in place, so the reference follows (a later audit reports it if it did not).
    """
    if not isinstance(module, nn.Module):
        raise ConfigError(
            f"audit_module expects an nn.Module, got {type(module).__name__}; "
            "for tensors and batches use check_same_device"
        )
    tensors = [TensorRecord.of(n, "parameter", p) for n, p in module.named_parameters()]
    tensors += [TensorRecord.of(n, "buffer", b) for n, b in module.named_buffers()]
    param_ids = {id(p) for p in module.parameters()}
    module_ids = {id(m) for m in module.modules()}
    strays: list[TensorRecord] = []
    seen: set[int] = set()

    def walk(value: object, path: str, depth: int) -> None:
        if isinstance(value, torch.Tensor):
            if id(value) not in param_ids and id(value) not in seen:
                seen.add(id(value))
                strays.append(TensorRecord.of(path, "stray", value))
            return
        if isinstance(value, _ATOMS) or depth > _MAX_DEPTH or id(value) in seen:
            return
        if isinstance(value, nn.Module):
            if id(value) in module_ids:
                return  # registered somewhere in the tree: to() moves it
            seen.add(id(value))
            for name, p in value.named_parameters():
                walk(p, f"{path}.{name}", depth + 1)
            for name, b in value.named_buffers():
                walk(b, f"{path}.{name}", depth + 1)
            return
        if isinstance(value, Mapping):
            seen.add(id(value))
            for k, v in value.items():
                walk(v, path + _key(k), depth + 1)
        elif _is_namedtuple(value):
            seen.add(id(value))
            for field, v in zip(_fields(value), value, strict=True):  # type: ignore[call-overload]
                walk(v, f"{path}.{field}", depth + 1)
        elif isinstance(value, (list, tuple)):
            seen.add(id(value))
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]", depth + 1)
        elif isinstance(value, (set, frozenset)):
            seen.add(id(value))
            for i, v in enumerate(value):
                walk(v, f"{path}{{{i}}}", depth + 1)
        elif _is_dataclass_instance(value):
            seen.add(id(value))
            for f in dataclasses.fields(value):  # type: ignore[arg-type]
                walk(getattr(value, f.name, None), f"{path}.{f.name}", depth + 1)

    for prefix, sub in module.named_modules():
        for attr, value in vars(sub).items():
            if attr in _MODULE_INTERNALS:
                continue
            walk(value, f"{prefix}.{attr}" if prefix else attr, 0)
    return ModuleAudit(type(module).__name__, tuple(tensors), tuple(strays))


# --------------------------------------------------------------------------------------------
# move
# --------------------------------------------------------------------------------------------


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
        if obj is None or cls in _ATOMS:
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
        if _is_namedtuple(obj):
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
        if _is_dataclass_instance(obj):
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
            _dtype_name(t.dtype),
            _shape(t),
            device,
        )
        return False
    if device.type == "cpu":
        _log.debug(
            "move: blocking copy of a %s %s tensor from %s to the host: a non_blocking "
            "device-to-host copy can be read before it finishes",
            _dtype_name(t.dtype),
            _shape(t),
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
    fn = _tensor_mover(target, non_blocking, dtype)
    if type(obj) is torch.Tensor:
        return fn(obj)  # type: ignore[return-value, arg-type]
    return _Mapper(fn, True, lambda o: o.to(target)).map(obj)  # type: ignore[no-any-return]


def _tensor_mover(
    device: torch.device, non_blocking: bool, dtype: torch.dtype | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(t: torch.Tensor) -> torch.Tensor:
        nb = non_blocking and _non_blocking_ok(t, device)
        if dtype is not None and t.is_floating_point():
            return t.to(device, dtype, non_blocking=nb)
        return t.to(device, non_blocking=nb)

    return fn
