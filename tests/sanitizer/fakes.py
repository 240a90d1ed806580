"""A stand-in accelerator for CPU-only CI: the ``meta`` device, with host read-back faked.

``meta`` tensors have shapes, dtypes and a device that is not the CPU, so copies to and from
them are real cross-device copies as far as torch's dispatcher (and the guard) can tell. What
``meta`` cannot do is hand data back: ``.cpu()``, ``.item()``, ``nonzero`` raise. ``MetaReadback``
is a dispatch mode pushed *below* the guard that answers exactly those reads with zeros (an
all-false mask for boolean indexing), so programs written for an accelerator run to the end.
The guard sees every op before this mode does, and its code is unchanged; only the data a
real device would have returned is made up.

``meta`` has no device indices, so two accelerators cannot be told apart with it:
``DeviceClaim`` is a data-less tensor that only claims a device (``cuda:1`` on a machine
without CUDA); every op on it returns its first tensor argument unchanged. The guard's dispatch
layer runs before the subclass, so it sees the ops, devices and sizes as it would on hardware.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: the stand-in for an accelerator in these tests
META = torch.device("meta")

__all__ = ["DeviceClaim", "MetaReadback", "line_of"]

aten = torch.ops.aten


def _on_meta(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "meta"


class MetaReadback(TorchDispatchMode):
    """Zero-filled host read-back of meta tensors (see the module docstring)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        src = args[0] if args else None
        if func is aten._to_copy.default and _on_meta(src):
            device = torch.device(kwargs.get("device") or src.device)
            if device.type != "meta":
                return torch.zeros(src.shape, dtype=kwargs.get("dtype") or src.dtype, device=device)
        if func is aten.copy_.default and _on_meta(args[1]) and not _on_meta(src):
            return src.zero_()
        if func is aten._local_scalar_dense.default and _on_meta(src):
            return False if src.dtype == torch.bool else 0 if not src.is_floating_point() else 0.0
        if func is aten.nonzero.default and _on_meta(src):
            return torch.empty((0, src.dim()), dtype=torch.long, device="meta")
        if func is aten.index.Tensor and _on_meta(src):
            indices = args[1]
            if any(
                isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                for i in indices
            ):
                mask = next(i for i in indices if isinstance(i, torch.Tensor))
                return torch.empty((0, *src.shape[mask.dim() :]), dtype=src.dtype, device="meta")
        if func is aten.equal.default and _on_meta(src):
            return True
        if func is aten.masked_select.default and _on_meta(src):
            return torch.empty((0,), dtype=src.dtype, device="meta")
        return func(*args, **kwargs)


class DeviceClaim(torch.Tensor):
    """A data-less float32 tensor that claims ``device`` (see the module docstring)."""

    @staticmethod
    def __new__(cls, shape: tuple[int, ...], device: str) -> DeviceClaim:
        out: DeviceClaim = torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=torch.float32, device=torch.device(device)
        )
        return out

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        return next(a for a in args if isinstance(a, torch.Tensor))


def line_of(path: str, marker: str) -> int:
    """The 1-based number of the one line of ``path`` that ends with ``# marker``."""
    with open(path, encoding="utf-8") as handle:
        found = [i for i, text in enumerate(handle, 1) if text.rstrip().endswith(f"# {marker}")]
    assert len(found) == 1, f"marker {marker!r} found {len(found)} times in {path}"
    return found[0]


def site_rows(report: Any, path: str) -> list[tuple[str, int, int, int]]:
    """``(kind, line, count, bytes)`` for each (line, kind) of ``path`` in ``report``, sorted."""
    return sorted(
        (row.kind, row.site.lineno, row.count, row.nbytes)
        for row in report.by_site()
        if row.site.filename == path
    )


def attempt(call: Callable[[], object]) -> None:
    """Run ``call``; torch may refuse a mixed-device op after the guard recorded it."""
    with contextlib.suppress(RuntimeError):
        call()
