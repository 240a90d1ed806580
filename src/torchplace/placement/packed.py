"""Quantized modules' packed weights: the modules that keep them (``torch.ao.nn.quantized``,
``.dynamic``: what ``quantize_dynamic`` puts in place of ``nn.Linear``, ``nn.LSTM``,
``nn.Embedding``, ...) and
their weights and biases read back, outside ``parameters()`` and ``buffers()``.

The quantized engines (fbgemm, x86, qnnpack, onednn) are CPU-only, so packed weights live on the
cpu and ``module.to()`` leaves them there: :data:`PACKED_DEVICE`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["PACKED_DEVICE", "holds_packed", "stored_dtype", "unpacked"]

PACKED_DEVICE = torch.device("cpu")


#: the methods a quantized module reads its packed weights back with: ``_weight_bias`` (linear,
#: convolution, recurrent layers), ``_weight`` (an embedding's ``EmbeddingPackedParams``)
_UNPACKERS = ("_weight_bias", "_weight")


def _unpacker(module: nn.Module) -> Callable[[], object] | None:
    """The method ``module`` reads its packed weights back with, if it has one."""
    for name in _UNPACKERS:
        method = getattr(module, name, None)
        if callable(method):
            return method  # type: ignore[no-any-return]
    return None


def holds_packed(sub: nn.Module) -> bool:
    """A quantized module that unpacks its own weights (a dynamic ``Linear`` or a quantized
    ``Embedding`` does not: its child ``LinearPackedParams`` or ``EmbeddingPackedParams`` holds
    them, and is the one that counts). Cheap: no weight is read."""
    if not type(sub).__module__.startswith("torch.ao.nn.") or _unpacker(sub) is None:
        return False
    return all(_unpacker(child) is None for child in sub.children())


def stored_dtype(sub: nn.Module) -> torch.dtype | None:
    """The dtype ``sub`` packs its weights in (``qint8``, ``float16``), None if it does not say."""
    stored = getattr(sub, "dtype", None) or getattr(sub, "weight_dtype", None)
    return stored if isinstance(stored, torch.dtype) else None


def unpacked(sub: nn.Module) -> list[tuple[str, torch.Tensor, torch.dtype]]:
    """``sub``'s packed weights and biases as (name, unpacked copy, dtype as stored); a tensor it
    also keeps as a plain attribute (a quantized cell's bias) is left out. An fp16-packed weight
    unpacks to float32 but is stored in float16, the dtype given."""
    half = stored_dtype(sub) == torch.float16
    out = []
    for name, t in _weight_bias(sub):
        widened = half and t.dtype == torch.float32 and name.startswith("weight")
        out.append((name, t, torch.float16 if widened else t.dtype))
    return out


def _weight_bias(sub: nn.Module) -> list[tuple[str, torch.Tensor]]:
    unpack = _unpacker(sub)
    if unpack is None:
        return []
    try:
        got = unpack()
    except (RuntimeError, TypeError, AttributeError, NotImplementedError):
        return []  # a quantized engine or torch version that cannot unpack them here
    if isinstance(got, torch.Tensor):
        got = (got,)
    if isinstance(got, tuple):  # (weight, bias), or (weight, bias, block sizes) when sparse
        named = list(zip(("weight", "bias"), got, strict=False))
    elif isinstance(got, dict):  # rnns and cells: {"weight": {name: t}, "bias": {name: t}}
        named = [item for part in got.values() if isinstance(part, dict) for item in part.items()]
    else:
        return []
    own = vars(sub)
    return [
        (name, t)
        for name, t in named
        if isinstance(t, torch.Tensor) and not isinstance(own.get(name), torch.Tensor)
    ]
