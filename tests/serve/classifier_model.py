"""A classifier whose scores are its input (four classes, labelled): its top classes are the
input's largest columns, so a test knows the answer."""

from __future__ import annotations

import torch
from torch import nn

from torchplace.models import TensorSpec

LABELS = ("cat", "dog", "bird", "fish")


class Scores(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0


def build() -> nn.Module:
    model = Scores()
    model.torchplace_inputs = (TensorSpec("input", "FP32", (-1, len(LABELS))),)  # type: ignore[assignment]
    model.torchplace_labels = LABELS  # type: ignore[assignment]
    return model
