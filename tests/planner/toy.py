"""Small models whose activation peak, crossings and FLOPs are worked out by hand in the tests."""

from __future__ import annotations

import torch
from torch import nn

from torchplace.models import TensorSpec

WIDTH = 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * mask


class Toy(nn.Module):
    """x (B, 4) -> Linear(4, 8) -> three blocks, each given the same (B, 8) mask -> Linear(8, 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.out = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(x.shape[0], WIDTH, device=x.device)  # made once, handed to each block
        h = self.inp(x)
        for block in self.blocks:
            h = block(h, mask)
        return self.out(h)  # type: ignore[no-any-return]


class Tied(nn.Module):
    """An embedding and a head that share one weight (10 x 8), with a Linear between."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, WIDTH)
        self.mid = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.mid(self.emb(ids)))  # type: ignore[no-any-return]


def make_toy() -> nn.Module:
    model = Toy()
    model.torchplace_inputs = (TensorSpec("x", "FP32", (-1, 4)),)  # type: ignore[assignment]
    return model


def make_tied() -> nn.Module:
    model = Tied()
    model.torchplace_inputs = (TensorSpec("ids", "INT64", (-1, -1)),)  # type: ignore[assignment]
    return model
