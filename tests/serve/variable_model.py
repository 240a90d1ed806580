"""Models whose rows have a variable dimension (Triton's ``dims: [-1]``), for the repository
tests: each row's values summed (``dims: [-1]`` in, ``[1]`` out), and tokens of 16 features
scaled (``dims: [-1, 16]`` in and out)."""

from __future__ import annotations

import torch
from torch import nn


class RowSum(nn.Module):
    """``[batch, n]`` to ``[batch, 1]``: each row summed, whatever its length."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=1, keepdim=True)


class Tokens(nn.Module):
    """``[batch, n, 16]`` to ``[batch, n, 16]``: ``2x + 1``, token by token."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * x + 1


def row_sum() -> nn.Module:
    return RowSum()


def tokens() -> nn.Module:
    return Tokens()
