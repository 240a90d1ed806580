"""What the guard records: one :class:`Event` per crossing, at a :class:`Site` in the user's code.

This module does not import torch, so reports can be built, read and rendered without it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "KINDS",
    "SYNC_KINDS",
    "TRANSFER_KINDS",
    "Event",
    "GuardWarning",
    "Operand",
    "Site",
]

#: Every kind of event, in the order reports list them.
KINDS: Final = ("h2d", "d2h", "d2d", "sync", "pageable_non_blocking", "mixed_device")
#: The kinds that move bytes between devices.
TRANSFER_KINDS: Final = frozenset({"h2d", "d2h", "d2d"})
#: The kinds that stall the host.
SYNC_KINDS: Final = frozenset({"sync"})


class GuardWarning(UserWarning):
    """Issued once per new (line, kind) by a guard in ``"warn"`` mode; a warnings filter that
    says ``"error"`` gets it shown instead of raised: the guard never stops the program it
    watches (``"raise"`` mode does that)."""


@dataclass(frozen=True, order=True)
class Site:
    """A line of the user's program: the first frame outside torch and torchplace."""

    filename: str
    lineno: int
    function: str

    @property
    def short(self) -> str:
        """``path:line`` with the path relative to the working directory when it lies inside."""
        path = self.filename
        try:
            rel = os.path.relpath(path)
        except ValueError:  # another drive on Windows
            rel = path
        if not rel.startswith(".."):
            path = rel
        return f"{path}:{self.lineno}"

    def __str__(self) -> str:
        return f"{self.short} in {self.function}"


@dataclass(frozen=True)
class Operand:
    """One tensor operand of a mixed-device op: where it sits and what it is."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    device: str

    def __str__(self) -> str:
        return f"{self.name}: shape={self.shape} dtype={self.dtype} device={self.device}"


@dataclass(frozen=True)
class Event:
    """One recorded crossing.

    ``kind`` is one of :data:`KINDS`; ``op`` names the call (``aten._to_copy``, ``Tensor.item``,
    ...); ``nbytes`` is the payload of a transfer (0 otherwise); ``src``/``dst`` are devices as
    strings for transfers; ``operands`` lists the tensors of a mixed-device op.
    """

    kind: str
    site: Site
    op: str
    nbytes: int = 0
    src: str | None = None
    dst: str | None = None
    detail: str = ""
    operands: tuple[Operand, ...] = field(default=())

    def describe(self) -> str:
        """One human sentence: what happened, where."""
        if self.kind in TRANSFER_KINDS:
            what = f"{self.kind.upper()} copy of {self.nbytes} bytes {self.src} -> {self.dst}"
        elif self.kind == "sync":
            what = "host synchronization"
        elif self.kind == "pageable_non_blocking":
            what = "non_blocking copy that cannot be asynchronous"
        else:
            what = "op with operands on different devices"
        text = f"{what} ({self.op}) at {self.site}"
        if self.detail:
            text += f": {self.detail}"
        if self.operands:
            text += "".join(f"\n    {operand}" for operand in self.operands)
        return text

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "op": self.op,
            "file": self.site.filename,
            "line": self.site.lineno,
            "function": self.site.function,
            "bytes": self.nbytes,
        }
        if self.src is not None:
            out["src"] = self.src
            out["dst"] = self.dst
        if self.detail:
            out["detail"] = self.detail
        if self.operands:
            out["operands"] = [
                {"name": o.name, "shape": list(o.shape), "dtype": o.dtype, "device": o.device}
                for o in self.operands
            ]
        return out
