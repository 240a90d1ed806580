"""How the placement functions walk nested values: which values are leaves, which are containers,
and how a path into a container is written (``batch["x"]``, ``pair[1]``, ``state.field``); plus
the small text helpers their messages share (dtype names, shapes, aligned tables).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import sys
from collections import UserList, deque
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from types import MemberDescriptorType

import torch
from torch.nn.parameter import is_lazy

from torchplace.errors import ConfigError

__all__ = [
    "ATOMS",
    "SEQUENCES",
    "children",
    "dataclass_items",
    "dtype_name",
    "is_dataclass_instance",
    "is_namedtuple",
    "is_one_shot",
    "is_view",
    "key_path",
    "namedtuple_fields",
    "nesting_error",
    "object_tensors",
    "one_shot_error",
    "opaque_error",
    "partial_items",
    "path_to",
    "shape_of",
    "shape_text",
    "text_table",
]

#: Leaves that never hold a tensor.
ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None))
#: Containers walked item by item (besides mappings, namedtuples and dataclasses).
SEQUENCES = (list, tuple, deque, set, frozenset)


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``."""
    return str(dtype).removeprefix("torch.")


def shape_of(t: torch.Tensor) -> tuple[int, ...]:
    """The shape as a tuple of ints; a nested tensor's ragged dimensions, which have no one
    size, are ``-1``."""
    if not t.is_nested:
        return tuple(int(s) for s in t.shape)
    return tuple(_size_or_ragged(t, d) for d in range(t.dim()))


def _size_or_ragged(t: torch.Tensor, dim: int) -> int:
    try:
        return int(t.size(dim))
    except (RuntimeError, AttributeError):  # strided: "irregular"; jagged: a symbolic size
        return -1


def shape_text(t: torch.Tensor) -> str:
    """The shape for a message: ``(2, 3)``, or ``uninitialized`` for the parameter or buffer of a
    lazy module (``nn.LazyLinear``, ...) that has no shape before its first forward."""
    return "uninitialized" if is_lazy(t) else str(shape_of(t))


def key_path(key: object) -> str:
    """The path step into a mapping: ``["x"]`` for a str key, ``[3]`` otherwise; a tensor key
    (an optimizer's ``state`` is keyed by its parameters) is ``[<Parameter (3, 4)>]``, not its
    values, and any other key's repr is cut to one short line."""
    if isinstance(key, str):
        return f"[{json.dumps(key)}]"
    if isinstance(key, torch.Tensor):
        return f"[<{type(key).__name__} {shape_text(key)}>]"
    text = " ".join(repr(key).split())
    return f"[{text if len(text) <= 60 else text[:57] + '...'}]"


def is_namedtuple(obj: object) -> bool:
    """A ``typing.NamedTuple`` or ``collections.namedtuple`` instance."""
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def namedtuple_fields(obj: object) -> tuple[str, ...]:
    """A namedtuple's field names, in order."""
    return tuple(getattr(type(obj), "_fields", ()))


def is_dataclass_instance(obj: object) -> bool:
    """A dataclass or attrs instance (not the class itself)."""
    if isinstance(obj, type):
        return False
    return dataclasses.is_dataclass(obj) or hasattr(type(obj), "__attrs_attrs__")


def _field_names(obj: object) -> list[str]:
    """The field names of a dataclass or an attrs class (``__attrs_attrs__``), in order."""
    if dataclasses.is_dataclass(obj):
        return [f.name for f in dataclasses.fields(obj)]
    names = (getattr(a, "name", None) for a in getattr(type(obj), "__attrs_attrs__", ()))
    return [n for n in names if isinstance(n, str)]


def dataclass_items(obj: object) -> list[tuple[str, object]]:
    """A dataclass or attrs instance's (field name, value) pairs, then its instance attributes
    that are no field (``self.mask = ...`` in ``__post_init__``): a walk that left those out
    would pass their tensors by. A field that was never set (an ``init=False`` field without a
    default, not assigned in ``__post_init__``) is left out."""
    names = _field_names(obj)
    out = []
    for name in names:
        try:
            out.append((name, getattr(obj, name)))
        except AttributeError:
            continue
    fields = set(names)
    out += [(k, v) for k, v in _attributes(obj).items() if k not in fields]
    return out


def children(value: object, path: str) -> list[tuple[str, object]]:
    """The values inside a container, each with its path; [] for anything else."""
    if isinstance(value, (torch.Tensor, *ATOMS)):
        return []
    if isinstance(value, Mapping):
        return [(path + key_path(k), v) for k, v in value.items()]
    if is_namedtuple(value):
        fields = namedtuple_fields(value)
        return [(f"{path}.{f}", v) for f, v in zip(fields, value, strict=True)]  # type: ignore[call-overload]
    if isinstance(value, (list, tuple, deque, UserList, *_VIEWS)):
        return [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return [(f"{path}{{{i}}}", v) for i, v in enumerate(value)]
    if is_dataclass_instance(value):
        return [(f"{path}.{name}", v) for name, v in dataclass_items(value)]
    if isinstance(value, functools.partial):
        return partial_items(value, path)
    return []


def partial_items(value: functools.partial[object], path: str) -> list[tuple[str, object]]:
    """A ``functools.partial``'s function, arguments and keywords, each with its path
    (``fn.func``, ``fn.args[0]``, ``fn.keywords["scale"]``): a partial is a container of the
    arguments it binds, and a walk that passed them by would leave their tensors behind."""
    return [
        (f"{path}.func", value.func),
        *((f"{path}.args[{i}]", v) for i, v in enumerate(value.args)),
        *((f"{path}.keywords{key_path(k)}", v) for k, v in value.keywords.items()),
    ]


def object_tensors(
    value: object, path: str, *, deep: bool = True
) -> list[tuple[str, torch.Tensor]]:
    """The tensors a plain object keeps in its instance attributes (``rope.cos``), each with
    its path, at any depth: through the containers and other plain objects it holds
    (``cache.layers[0].keys``, as transformers' ``DynamicCache`` keeps them); [] for tensors,
    atoms, classes, modules, containers and anything without a ``__dict__``. Walked without
    recursion, each object once, so a back reference ends; modules it holds are not searched
    (``module.to()`` is theirs). ``deep=False``: its own tensor attributes only, for an object
    a module holds, which may be a collaborator (a Lightning module's trainer, and through it
    the optimizer's state and the data) rather than the module's state."""
    if children(value, path) or not _attributes(value):
        return []
    if not deep:
        items = _attributes(value).items()
        return [(f"{path}.{k}", v) for k, v in items if isinstance(v, torch.Tensor)]
    found: list[tuple[str, torch.Tensor]] = []
    seen: set[int] = {id(value)}
    stack = [(f"{path}.{k}", v) for k, v in reversed(_attributes(value).items())]
    while stack:
        where, item = stack.pop()
        if isinstance(item, torch.Tensor):
            if id(item) not in seen:
                seen.add(id(item))
                found.append((where, item))
            continue
        if isinstance(item, (type, torch.nn.Module, *ATOMS)) or id(item) in seen:
            continue
        seen.add(id(item))
        kids = children(item, where) or [(f"{where}.{k}", v) for k, v in _attributes(item).items()]
        stack.extend(reversed(kids))
    return found


def _attributes(value: object) -> dict[str, object]:
    """A plain object's instance attributes: those in its ``__dict__`` and those a Python
    class keeps in ``__slots__`` (set ones only); {} for tensors, atoms, classes, modules,
    one-shot iterators and C objects."""
    if isinstance(value, (torch.Tensor, type, torch.nn.Module, *ATOMS)) or is_one_shot(value):
        return {}
    out = _slot_values(value)
    try:
        attributes: object = vars(value)
    except TypeError:  # no __dict__ (slots only, C objects)
        return out
    if not isinstance(attributes, dict):  # a __dict__ property of its own
        return out
    out.update((k, v) for k, v in attributes.items() if isinstance(k, str))
    return out


def _slot_values(value: object) -> dict[str, object]:
    """The attributes ``value`` keeps in the ``__slots__`` of its Python classes, by the name
    they are stored under (``_Cls__x`` for a private ``__x``); unset slots are left out."""
    out: dict[str, object] = {}
    for cls in type(value).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        names = (slots,) if isinstance(slots, str) else slots
        if not isinstance(names, (tuple, list, dict, set, frozenset)):
            continue  # an iterator would be used up; Python reads it once, at class creation
        for name in names:
            if not isinstance(name, str) or name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{cls.__name__.lstrip('_')}{name}"
            slot = cls.__dict__.get(name)
            if not isinstance(slot, MemberDescriptorType):
                continue
            try:
                out.setdefault(name, slot.__get__(value, type(value)))
            except AttributeError:  # declared, never set
                continue
    return out


#: a mapping's ``keys()``, ``values()`` and ``items()``: read like sequences, never rebuilt
_VIEWS = (KeysView, ValuesView, ItemsView)


def is_one_shot(obj: object) -> bool:
    """A generator or other iterator (not a file): walking it would use it up."""
    return isinstance(obj, Iterator) and not isinstance(obj, io.IOBase)


def is_view(obj: object) -> bool:
    """A mapping's ``keys()``, ``values()`` or ``items()``: read as a sequence, but a walk that
    rebuilds what it maps cannot put tensors back into it (see :func:`one_shot_error`)."""
    return isinstance(obj, _VIEWS)


def one_shot_error(where: str, obj: object, path: str) -> ConfigError:
    """The error for a generator or iterator found at ``path``: its tensors cannot be reached
    without consuming it, and skipping them would pass them by silently; or for a dict's view,
    which cannot be rebuilt with the mapped tensors in it."""
    kind = type(obj).__name__
    if isinstance(obj, _VIEWS):
        return ConfigError(
            f"{where}: {path} is a {kind} (a view of a mapping): a view cannot hold the mapped "
            "tensors, so it was refused rather than passed back with its tensors unmapped. "
            "Fix: pass the mapping itself, or list(...) of the view"
        )
    return ConfigError(
        f"{where}: {path} is a {kind} (a one-shot iterator): its tensors cannot be reached "
        "without consuming it, so it was left unconsumed and refused rather than skipped. "
        "Fix: pass a list instead (list(...) where the batch is built)"
    )


def opaque_error(where: str, obj: object, path: str) -> ConfigError:
    """The error for a plain object at ``path`` that keeps tensors as attributes: a walk that
    rebuilds what it maps cannot rebuild it, and passing it back would leave them unmapped."""
    names = ", ".join(p.removeprefix(f"{path}.") for p, _ in object_tensors(obj, path)[:5])
    kind = type(obj).__name__
    return ConfigError(
        f"{where}: {path} is a {kind} that keeps tensors as attributes ({names}), and a plain "
        "object cannot be rebuilt with them moved, so it was refused rather than passed back "
        f"with its tensors where they were. Fix: make {kind} a dataclass, give it a "
        "to(device) method that returns it moved, or pass its tensors in a dict (or leave it "
        "out of what is moved)"
    )


def path_to(obj: object, target: object, root: str) -> str:
    """The path of ``target`` inside ``obj`` (``root`` when it is ``obj`` itself or is not
    found); walked without recursion, each container once."""
    seen: set[int] = set()
    stack: list[tuple[str, object]] = [(root, obj)]
    while stack:
        path, value = stack.pop()
        if value is target:
            return path
        if id(value) in seen:
            continue
        seen.add(id(value))
        stack.extend(reversed(children(value, path)))
    return root


def _cycle_or_depth(obj: object, root: str) -> tuple[str | None, int]:
    """Where ``obj`` first contains itself (the path of the repeated container), and how deep
    its containers nest; walked without recursion, so any depth and any cycle is fine."""
    on_path: set[int] = set()
    done: set[int] = set()
    deepest = 0
    stack: list[tuple[object, str, int, bool]] = [(obj, root, 0, False)]
    while stack:
        value, path, depth, leaving = stack.pop()
        if leaving:
            on_path.discard(id(value))
            done.add(id(value))
            continue
        if id(value) in on_path:
            return path, deepest
        kids = children(value, path)
        if not kids or id(value) in done:
            continue
        deepest = max(deepest, depth + 1)
        on_path.add(id(value))
        stack.append((value, path, depth, True))
        stack.extend((v, p, depth + 1, False) for p, v in reversed(kids))
    return None, deepest


def nesting_error(where: str, obj: object, root: str, exc: RecursionError) -> BaseException:
    """The error to raise when walking ``obj`` ran out of stack: a :class:`ConfigError` that
    names the cycle or the depth, or ``exc`` itself when neither explains it."""
    cycle, depth = _cycle_or_depth(obj, root)
    if cycle is not None:
        return ConfigError(
            f"{where}: {root} contains itself: {cycle} is one of its own enclosing containers "
            "(a cyclic reference), and a structure that contains itself cannot be walked to "
            "its tensors. Fix: break the cycle (keep the back reference outside the batch), "
            "or pass the tensors in a structure without one"
        )
    limit = sys.getrecursionlimit()
    if depth * 4 < limit:
        return exc  # not the nesting: the recursion is somewhere else
    return ConfigError(
        f"{where}: {root} nests containers {depth} levels deep, more than Python's recursion "
        f"limit ({limit}) lets it walk. Fix: flatten it (e.g. one list or dict of tensors), or "
        "raise the limit with sys.setrecursionlimit() if the nesting is intended"
    )


def text_table(headers: list[str], rows: list[list[str]], marks: list[bool] | None = None) -> str:
    """Aligned columns; with ``marks``, marked rows start with ``>>``."""
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
