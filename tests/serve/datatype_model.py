"""A model with one input and one output per datatype torchplace serves (for the gRPC tests).

Each output is its input with the columns rotated (``roll``: defined for every dtype, and it
shows that rows and columns come back in place). Only the inputs are declared: the outputs are
inferred from the loader's dry run (names from the returned dict).
"""

from __future__ import annotations

import torch
from torch import nn

from torchplace.models import TensorSpec
from torchplace.serve.config import DATATYPES

#: every servable datatype, in a fixed order
ALL = tuple(sorted(DATATYPES))
WIDTH = 3


class Roll(nn.Module):
    """``{"out_" + dt: in_dt.roll(1, -1)}`` for every datatype."""

    def forward(self, *tensors: torch.Tensor) -> dict[str, torch.Tensor]:
        return {f"out_{dt}": t.roll(1, -1) for dt, t in zip(ALL, tensors, strict=True)}


def build() -> nn.Module:
    model = Roll()
    model.torchplace_inputs = tuple(  # type: ignore[assignment]
        TensorSpec(f"in_{dt}", dt, (-1, WIDTH)) for dt in ALL
    )
    return model
