"""Models the Ray tests import in their replicas (``tests.serve.ray_models:...``)."""

from __future__ import annotations

import torch
from torch import nn

from torchplace.models import TensorSpec, build_model

#: a first input value that makes :func:`faulty_seed_mlp` raise a device error
POISON = 666.0


class _Faulty(nn.Module):
    torchplace_inputs = (TensorSpec("input", "FP32", (-1, 8)),)
    torchplace_outputs = (TensorSpec("output", "FP32", (-1, 2)),)

    def __init__(self) -> None:
        super().__init__()
        self.inner = build_model("seed-mlp")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a data-dependent branch is fine here: the test wants the host sync to see the value
        if bool((x[:, 0] == POISON).any()):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        out: torch.Tensor = self.inner(x)
        return out


def faulty_seed_mlp() -> nn.Module:
    """seed-mlp (same weights), except that a row starting with POISON raises a CUDA error."""
    return _Faulty().eval()
