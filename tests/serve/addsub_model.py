"""Triton's ``simple`` model: two INT32 inputs of 16 columns, their sum and their difference.

The model Triton's shared-memory examples and tests use (``INPUT0``, ``INPUT1`` ->
``OUTPUT0`` = sum, ``OUTPUT1`` = difference), so that their client code runs unchanged.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from torchplace.models import TensorSpec

WIDTH = 16


class AddSub(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"OUTPUT0": a + b, "OUTPUT1": a - b}


class SlowAddSub(AddSub):
    """AddSub that takes a second over inputs that are not all zeros (the start-up dry runs
    send zeros), for tests of what happens while a request is in flight."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
        if bool(a.any()):
            time.sleep(1.0)
        return super().forward(a, b)


def build_slow() -> nn.Module:
    model = SlowAddSub()
    model.torchplace_inputs = build().torchplace_inputs  # type: ignore[assignment]
    return model


def build() -> nn.Module:
    model = AddSub()
    model.torchplace_inputs = (  # type: ignore[assignment]
        TensorSpec("INPUT0", "INT32", (-1, WIDTH)),
        TensorSpec("INPUT1", "INT32", (-1, WIDTH)),
    )
    return model
