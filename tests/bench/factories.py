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


class _DictInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.linear(batch["x"])


def dict_input() -> nn.Module:
    return _DictInput()


def embedding() -> nn.Module:
    return nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(24, 2))


#: a module object, not a function that builds one
INSTANCE = nn.Linear(6, 2)


class _Opaque:
    """A result that holds no tensor (its values as Python numbers): nothing for D2H to copy."""

    def __init__(self, logits: torch.Tensor) -> None:
        self._logits = logits.tolist()


class _ReturnsOpaque(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> _Opaque:
        return _Opaque(self.linear(x))


def returns_opaque() -> nn.Module:
    return _ReturnsOpaque()


class _RecordsMode(nn.Module):
    """Records ``self.training`` at each call; dropout and batch norm change in train mode."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 2)
        self.dropout = nn.Dropout(0.5)
        self.modes: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.modes.append(self.training)
        return self.dropout(self.linear(x))


def in_train_mode() -> nn.Module:
    return _RecordsMode().train()
