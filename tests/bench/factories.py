"""Model factories loaded by ``torchplace bench model --model tests.bench.factories:NAME``."""

from __future__ import annotations

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
