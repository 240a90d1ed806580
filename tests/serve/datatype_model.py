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


#: the datatypes the Open Inference Protocol itself names: BF16 is Triton's addition, which
#: MLServer's and KServe's clients have no type for
OIP = tuple(dt for dt in ALL if dt != "BF16")


class Roll(nn.Module):
    """``{"out_" + dt: in_dt.roll(1, -1)}`` for every datatype of ``datatypes``."""

    def __init__(self, datatypes: tuple[str, ...] = ALL) -> None:
        super().__init__()
        self.datatypes = datatypes

    def forward(self, *tensors: torch.Tensor) -> dict[str, torch.Tensor]:
        pairs = zip(self.datatypes, tensors, strict=True)
        return {f"out_{dt}": t.roll(1, -1) for dt, t in pairs}


def build(datatypes: tuple[str, ...] = ALL) -> nn.Module:
    model = Roll(datatypes)
    model.torchplace_inputs = tuple(  # type: ignore[assignment]
        TensorSpec(f"in_{dt}", dt, (-1, WIDTH)) for dt in datatypes
    )
    return model


def build_oip() -> nn.Module:
    """The model over :data:`OIP`'s datatypes only (for the clients of MLServer and KServe)."""
    return build(OIP)


#: the datatypes with a typed field of the gRPC ``InferTensorContents`` (FP16 has none: it
#: travels as raw bytes, which a client that sends only typed contents cannot send)
TYPED = tuple(dt for dt in OIP if dt != "FP16")


def build_typed() -> nn.Module:
    """The model over :data:`TYPED`'s datatypes only."""
    return build(TYPED)
