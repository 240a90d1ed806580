"""TPL501 (rules/state.py): ``torch.tensor`` of a parameter annotated (or defaulting) as a
number is a 0-dim tensor, which mixes with tensors on any device; of another parameter it may
hold many values and is reported."""

from __future__ import annotations

from torchplace.lint import lint_source

BLOCK = """\
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, main: nn.Module, drop_rate: float = 0.2):
        super().__init__()
        self.drop_rate = torch.tensor(drop_rate)
        self.main = main

    def forward(self, x):
        if bool(torch.bernoulli(1 - self.drop_rate)):
            return self.main(x) * (1 - self.drop_rate)
        return x
"""


def _lines(source: str) -> list[int]:
    return [f.line for f in lint_source(source, "layers.py", select={"TPL501"})]


def test_a_tensor_of_a_number_parameter_is_0_dim() -> None:
    assert _lines(BLOCK) == []


def test_a_tensor_of_an_unannotated_number_default_is_0_dim() -> None:
    assert _lines(BLOCK.replace("drop_rate: float = 0.2", "drop_rate=0.2")) == []


def test_a_tensor_of_a_sequence_parameter_is_reported() -> None:
    source = BLOCK.replace("drop_rate: float = 0.2", "drop_rate: list[float]")
    assert _lines(source) == [8]


def test_a_tensor_of_an_unannotated_parameter_without_default_is_reported() -> None:
    assert _lines(BLOCK.replace("drop_rate: float = 0.2", "drop_rate")) == [8]
