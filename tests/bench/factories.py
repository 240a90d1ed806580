"""Model factories loaded by ``torchplace bench model --model tests.bench.factories:NAME``."""

from __future__ import annotations

from torch import nn


def tiny() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 3), nn.ReLU())


def not_a_module() -> str:
    return "nope"


NOT_CALLABLE = 3
