"""Module audit: :func:`audit_module` groups a module's parameters and buffers (and the packed
weights of quantized modules) by device and dtype and finds the *stray* tensors that
``module.to()`` will not move (plain tensor attributes, tensors inside plain lists, tuples, dicts
and sets, modules kept in plain containers), each named by its path. The result, a
:class:`ModuleAudit`, renders as a table, rich or JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

from torchplace.bench.units import format_bytes
from torchplace.errors import ConfigError, PlacementError
from torchplace.placement.canonical import DeviceLike, canonical_device
from torchplace.placement.containers import (
    ATOMS,
    children,
    dtype_name,
    object_tensors,
    shape_of,
    text_table,
)
from torchplace.placement.packed import holds_packed, unpacked

__all__ = ["ModuleAudit", "TensorGroup", "TensorKind", "TensorRecord", "audit_module"]

TensorKind = Literal["parameter", "buffer", "stray", "packed"]


@dataclass(frozen=True)
class TensorRecord:
    """One tensor of a module audit: where it is, what it is, and how it was found.

    ``kind`` is ``parameter`` or ``buffer`` for registered tensors, ``stray`` for one that
    ``module.to()`` does not move, and ``packed`` for a weight or bias that a quantized module
    (``torch.ao.nn.quantized``, ``.dynamic``: what ``quantize_dynamic`` puts in place of
    ``nn.Linear``, ``nn.LSTM``, ...) keeps in its packed params, outside ``parameters()`` and
    ``buffers()``; those are CPU-only in PyTorch, and ``module.to()`` leaves them on the cpu.
    """

    name: str
    kind: TensorKind
    shape: tuple[int, ...] | None  # None: a lazy module's parameter or buffer, not shaped yet;
    # a nested tensor's ragged dimensions are -1
    dtype: torch.dtype
    device: torch.device
    nbytes: int

    @classmethod
    def of(cls, name: str, kind: TensorKind, t: torch.Tensor) -> TensorRecord:
        if is_lazy(t):
            return cls(name, kind, None, t.dtype, t.device, 0)
        return cls(name, kind, shape_of(t), t.dtype, t.device, t.numel() * t.element_size())

    @property
    def shape_text(self) -> str:
        """``(2, 3)``, or ``uninitialized`` for a lazy module's parameter or buffer."""
        return "uninitialized" if self.shape is None else str(self.shape)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "shape": None if self.shape is None else list(self.shape),
            "dtype": dtype_name(self.dtype),
            "device": str(self.device),
            "bytes": self.nbytes,
        }


@dataclass(frozen=True)
class TensorGroup:
    """Parameters and buffers that share one (device, dtype); ``parameters`` counts the packed
    weights and biases of quantized modules too."""

    device: torch.device
    dtype: torch.dtype
    parameters: int
    buffers: int
    numel: int
    nbytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": str(self.device),
            "dtype": dtype_name(self.dtype),
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
            g[0 if r.kind in ("parameter", "packed") else 1] += 1
            g[2] += r.nbytes // r.dtype.itemsize  # not from the shape: a nested one has -1s
            g[3] += r.nbytes
        return tuple(TensorGroup(d, dt, *v) for (d, dt), v in acc.items())

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """Every device a parameter, buffer or stray lives on, in order of first appearance."""
        return tuple(dict.fromkeys(r.device for r in (*self.tensors, *self.strays)))

    @property
    def nbytes(self) -> int:
        """Bytes held by parameters, buffers and packed weights."""
        return sum(r.nbytes for r in self.tensors)

    def off(self, device: DeviceLike) -> list[TensorRecord]:
        """Every parameter, buffer and stray that is not on ``device``."""
        want = canonical_device(device)
        return [r for r in (*self.tensors, *self.strays) if canonical_device(r.device) != want]

    def assert_on(self, device: DeviceLike) -> None:
        """Raise :class:`~torchplace.errors.PlacementError` listing everything not on ``device``.

        Parameters, buffers, packed weights and strays are all checked; ``cuda`` and ``cuda:0``
        compare equal when device 0 is the current one.
        """
        want = canonical_device(device)
        bad = self.off(want)
        if not bad:
            return
        shown = bad[:_MAX_ROWS]  # a model of thousands of layers: the first ones, and a count
        rows = [[r.name, r.kind, r.shape_text, dtype_name(r.dtype), str(r.device)] for r in shown]
        n_strays = sum(r.kind == "stray" for r in bad)
        n_packed = sum(r.kind == "packed" for r in bad)
        head = f"{self.module}: {len(bad)} tensor(s) not on {want}"
        if n_strays:
            head += f", {n_strays} of them stray (module.to() does not move them)"
        if n_packed:
            head += f", {n_packed} of them packed in quantized modules (CPU-only in PyTorch)"
        msg = head + ".\n" + text_table(["name", "kind", "shape", "dtype", "device"], rows)
        if len(bad) > len(shown):
            msg += f"\n... and {len(bad) - len(shown)} more (audit.off(device) lists them all)"
        fix = []
        if n_strays + n_packed < len(bad):
            fix.append(f"call module.to({str(want)!r}) for parameters and buffers")
        if n_packed:
            fix.append(
                "quantized modules (torch.ao.nn.quantized, what quantize_dynamic puts in) keep "
                "their weights packed, CPU-only, and module.to() leaves them on the cpu: run "
                f"the quantized model on the cpu, or the float model on {want}"
            )
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
            text_table(list(_GROUP_COLUMNS), [_group_cells(g) for g in self.groups]),
        ]
        if self.strays:
            out.append(f"{len(self.strays)} stray tensor(s) that module.to() will not move:")
            out.append(text_table(list(_STRAY_COLUMNS), [_stray_cells(r) for r in self.strays]))
        else:
            out.append("no stray tensors")
        return "\n".join(out)

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        # names are data, not markup: a dict key such as "[/INST]" is shown as it is
        groups = Table(title=Text(f"{self.module}: parameters and buffers"))
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
            strays.add_row(*(Text(cell) for cell in _stray_cells(r)))
        return Group(groups, strays)


#: the most rows an assert_on error lists
_MAX_ROWS = 50
_GROUP_COLUMNS = ("device", "dtype", "params", "buffers", "numel", "bytes")
_STRAY_COLUMNS = ("name", "shape", "dtype", "device")


def _group_cells(g: TensorGroup) -> list[str]:
    return [
        str(g.device),
        dtype_name(g.dtype),
        str(g.parameters),
        str(g.buffers),
        str(g.numel),
        format_bytes(g.nbytes),
    ]


def _stray_cells(r: TensorRecord) -> list[str]:
    return [r.name, r.shape_text, dtype_name(r.dtype), str(r.device)]


_MODULE_INTERNALS = frozenset({"_parameters", "_buffers", "_modules"})
# Forward pre-hooks that rebuild a plain tensor attribute from registered parameters on every
# forward (torch.nn.utils.weight_norm / spectral_norm): that attribute follows module.to().
_REBUILDING_HOOKS = (WeightNorm, SpectralNorm)


def _rebuilt_by_hooks(module: nn.Module) -> set[str]:
    """Attributes of ``module`` that a weight_norm/spectral_norm hook recomputes each forward."""
    hooks = module._forward_pre_hooks.values()
    return {h.name for h in hooks if isinstance(h, _REBUILDING_HOOKS)}


def audit_module(module: nn.Module) -> ModuleAudit:
    """Group ``module``'s parameters and buffers by device and dtype, and find stray tensors.

    A stray is a tensor that ``module.to(device)`` leaves where it is: a tensor attribute that is
    not a registered parameter or buffer, a tensor inside a plain list/tuple/dict/set/dataclass
    (at any depth), or a parameter or buffer of a module kept in a plain container instead of an
    ``nn.ModuleList``/``nn.ModuleDict``. Every submodule is searched; each stray is named by its
    attribute path, e.g. ``encoder.layers.1.cache[0]``. A registered parameter that is also
    referenced from a plain container is not a stray: between cpu and cuda ``to()`` moves
    parameters in place, so the reference follows (a later audit reports it if it did not).
    A lazy module's parameter that has no shape yet has ``shape`` None (shown ``uninitialized``).
    The weights and biases that quantized modules keep in packed params (``quantize_dynamic``'s
    ``Linear``/``LSTM``/``GRU``/cells, static quantized ``Linear``/``Conv``) are recorded with
    kind ``packed``, read back one module at a time, at the dtype they are stored in (``qint8``,
    ``float16``); a bias a quantized cell also keeps as a plain attribute is a stray instead.
    The ``weight`` that ``torch.nn.utils.weight_norm``/``spectral_norm`` recompute from their
    registered parameters on every forward is not a stray: it follows them.
    """
    if not isinstance(module, nn.Module):
        raise ConfigError(
            f"audit_module expects an nn.Module, got {type(module).__name__}; "
            "for tensors and batches use check_same_device"
        )
    tensors = [TensorRecord.of(n, "parameter", p) for n, p in module.named_parameters()]
    tensors += [TensorRecord.of(n, "buffer", b) for n, b in module.named_buffers()]
    tensors += _packed_records(module)
    finder = _StrayFinder(module)
    for prefix, sub in module.named_modules():
        rebuilt = _rebuilt_by_hooks(sub)
        for attr, value in vars(sub).items():
            if attr in _MODULE_INTERNALS or attr in rebuilt:
                continue
            finder.walk(value, f"{prefix}.{attr}" if prefix else attr)
    return ModuleAudit(type(module).__name__, tuple(tensors), tuple(finder.strays))


def _packed_records(module: nn.Module) -> list[TensorRecord]:
    """The weights and biases that quantized modules inside ``module`` keep in packed params."""
    out: list[TensorRecord] = []
    for prefix, sub in module.named_modules():
        if not holds_packed(sub):
            continue
        for name, t, dtype in unpacked(sub):
            path = f"{prefix}.{name}" if prefix else name
            nbytes = t.numel() * dtype.itemsize
            out.append(TensorRecord(path, "packed", shape_of(t), dtype, t.device, nbytes))
    return out


class _StrayFinder:
    """Walks a module's plain attributes for tensors that ``module.to()`` would not move."""

    def __init__(self, module: nn.Module) -> None:
        self.param_ids = {id(p) for p in module.parameters()}
        self.module_ids = {id(m) for m in module.modules()}
        self.strays: list[TensorRecord] = []
        self.seen: set[int] = set()

    def walk(self, value: object, path: str) -> None:
        """Record the strays inside ``value`` in attribute order, at any depth: walked without
        recursion, and each container visited once, so a cycle ends."""
        seen = self.seen
        stack: list[tuple[str, object]] = [(path, value)]
        while stack:
            path, value = stack.pop()
            if isinstance(value, torch.Tensor):
                if id(value) not in self.param_ids and id(value) not in seen:
                    seen.add(id(value))
                    self.strays.append(TensorRecord.of(path, "stray", value))
                continue
            if isinstance(value, ATOMS) or id(value) in seen:
                continue
            if isinstance(value, nn.Module):
                if id(value) in self.module_ids:
                    continue  # registered somewhere in the tree: to() moves it
                named = (*value.named_parameters(), *value.named_buffers())
                kids: list[tuple[str, object]] = [(f"{path}.{n}", t) for n, t in named]
                seen.add(id(value))
            else:  # a container's items, or the tensors a plain object keeps (rope.cos)
                kids = [*(children(value, path) or object_tensors(value, path, deep=False))]
                if kids:
                    seen.add(id(value))
            stack.extend(reversed(kids))
