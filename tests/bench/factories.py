"""Model factories loaded by ``torchplace bench model --model tests.bench.factories:NAME``."""

from __future__ import annotations

import torch
from torch import nn


def tiny() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 3), nn.ReLU())


def not_a_module() -> str:
    return "nope"


NOT_CALLABLE = 3


def raises() -> nn.Module:
    raise RuntimeError("factory boom")


def needs_args(width: int) -> nn.Module:
    return nn.Linear(width, 2)


def loud() -> nn.Module:
    print("hello from the factory")
    return nn.Sequential(nn.Linear(6, 3), nn.ReLU())


class _BadForward(nn.Module):
    def forward(self, x: object) -> object:
        raise ValueError("forward boom")


def bad_forward() -> nn.Module:
    return _BadForward()


class _TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * mask


def two_inputs() -> nn.Module:
    return _TwoInputs()
