"""Triton's ``simple`` model: two INT32 inputs of 16 columns, their sum and their difference.

The model Triton's shared-memory examples and tests use (``INPUT0``, ``INPUT1`` ->
``OUTPUT0`` = sum, ``OUTPUT1`` = difference), so that their client code runs unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from torchplace.models import TensorSpec

WIDTH = 16


class AddSub(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"OUTPUT0": a + b, "OUTPUT1": a - b}


def build() -> nn.Module:
    model = AddSub()
    model.torchplace_inputs = (  # type: ignore[assignment]
        TensorSpec("INPUT0", "INT32", (-1, WIDTH)),
        TensorSpec("INPUT1", "INT32", (-1, WIDTH)),
    )
    return model
