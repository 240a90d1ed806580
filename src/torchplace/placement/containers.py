"""How the placement functions walk nested values: which values are leaves, which are containers,
and how a path into a container is written (``batch["x"]``, ``pair[1]``, ``state.field``); plus
the small text helpers their messages share (dtype names, shapes, aligned tables).
"""

from __future__ import annotations

import dataclasses
import json

import torch

__all__ = [
    "ATOMS",
    "dtype_name",
    "is_dataclass_instance",
    "is_namedtuple",
    "key_path",
    "namedtuple_fields",
    "shape_of",
    "text_table",
]

#: Leaves that never hold a tensor.
ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None))


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``."""
    return str(dtype).removeprefix("torch.")


def shape_of(t: torch.Tensor) -> tuple[int, ...]:
    """The shape as a tuple of ints."""
    return tuple(int(s) for s in t.shape)


def key_path(key: object) -> str:
    """The path step into a mapping: ``["x"]`` for a str key, ``[3]`` otherwise."""
    return f"[{json.dumps(key)}]" if isinstance(key, str) else f"[{key!r}]"


def is_namedtuple(obj: object) -> bool:
    """A ``typing.NamedTuple`` or ``collections.namedtuple`` instance."""
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def namedtuple_fields(obj: object) -> tuple[str, ...]:
    """A namedtuple's field names, in order."""
    return tuple(getattr(type(obj), "_fields", ()))


def is_dataclass_instance(obj: object) -> bool:
    """A dataclass instance (not the class itself)."""
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


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
