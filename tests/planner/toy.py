"""Small models whose activation peak, crossings and FLOPs are worked out by hand in the tests."""

from __future__ import annotations

from dataclasses import dataclass

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


class RootTensors(nn.Module):
    """A ViT-like model: a class token and a scale at the top level, beside its layers, and a
    top-level buffer (int8) that its forward reads."""

    def __init__(self) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, WIDTH))
        self.register_buffer("table", torch.ones(100, dtype=torch.int8))
        self.first = nn.Linear(WIDTH, WIDTH)
        self.second = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x) + self.cls_token
        return self.second(h) * self.table[0]  # type: ignore[no-any-return]


class Aliased(nn.Module):
    """One Linear registered under two names (``dec`` is ``enc``), called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(WIDTH, WIDTH)
        self.mid = nn.Linear(WIDTH, WIDTH)
        self.dec = self.enc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dec(self.mid(self.enc(x)))  # type: ignore[no-any-return]


class Branches(nn.Module):
    """Two inputs through two Linears; the model's own code adds their outputs (a U-Net's skip
    connection, a BERT's mask arithmetic: code between units that reads two stages' tensors)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)
        self.b = nn.Linear(WIDTH, WIDTH)
        self.c = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.a(x) + self.b(y * 2)
        return self.c(h), h


@dataclass
class Output:
    logits: torch.Tensor
    hidden: torch.Tensor


class DataclassOut(nn.Module):
    """Returns a dataclass, as many libraries' models do."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, WIDTH)
        self.b = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor) -> Output:
        h = self.a(x)
        return Output(self.b(h), h)


def _declared(model: nn.Module, *specs: TensorSpec) -> nn.Module:
    model.torchplace_inputs = specs  # type: ignore[assignment]
    return model


def make_root_tensors() -> nn.Module:
    return _declared(RootTensors(), TensorSpec("x", "FP32", (-1, WIDTH)))


def make_aliased() -> nn.Module:
    return _declared(Aliased(), TensorSpec("x", "FP32", (-1, WIDTH)))


def make_branches() -> nn.Module:
    x, y = TensorSpec("x", "FP32", (-1, WIDTH)), TensorSpec("y", "FP32", (-1, WIDTH))
    return _declared(Branches(), x, y)


def make_dataclass_out() -> nn.Module:
    return _declared(DataclassOut(), TensorSpec("x", "FP32", (-1, 4)))
