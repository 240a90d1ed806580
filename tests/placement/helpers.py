"""Shared by the placement tests: devices, a small model, and the rows a mismatch table marks."""

from __future__ import annotations

import warnings

import torch
from torch import nn

META = torch.device("meta")


CPU = torch.device("cpu")


def model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def marked(message: str) -> list[str]:
    """Names on the rows marked as odd ones out."""
    return [line.split()[1] for line in message.splitlines() if line.startswith(">> ")]


def quantized(module: nn.Module, dtype: torch.dtype, kinds: set[type[nn.Module]]) -> nn.Module:
    """``module`` with its ``kinds`` of layers replaced by ``quantize_dynamic``'s packed ones."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated, still used
        out: nn.Module = torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
            module, kinds, dtype=dtype
        )
    return out
