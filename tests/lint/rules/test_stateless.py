"""Which modules hold nothing a plain container hides (:mod:`torchplace.lint.rules.stateless`),
seen through TPL501 on a list of them."""

from __future__ import annotations

import pytest

from .helpers import lines

LIST_OF = """\
import torch
from torch import nn
from torch.nn import AvgPool2d


class Smooth(nn.Module):
    def __init__(self, k):
        super().__init__()
        self.k = k
        self.pool = nn.AvgPool1d(k)


class Heads(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.blocks = [{element} for _ in range(n)]
"""


@pytest.mark.parametrize(
    "element",
    [
        "nn.ReLU()",
        "nn.Identity()",
        "nn.MaxPool2d(2)",
        "AvgPool2d(3)",
        "nn.ZeroPad2d(1)",
        "Smooth(3)",
    ],
)
def test_modules_that_hold_nothing_are_clean(element: str) -> None:
    assert lines(LIST_OF.format(element=element), "TPL501", "heads.py") == []


@pytest.mark.parametrize(
    "element",
    ["nn.Linear(4, 4)", "nn.Dropout(0.1)", "nn.PReLU()", "nn.BatchNorm1d(4)"],
)
def test_modules_that_learn_or_switch_modes_are_found(element: str) -> None:
    assert lines(LIST_OF.format(element=element), "TPL501", "heads.py") == [16]


def test_a_class_built_on_a_project_base_is_found() -> None:
    base = "class Base(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n\n"
    source = LIST_OF.replace("class Smooth(nn.Module):", base + "class Smooth(Base):")
    assert lines(source.format(element="Smooth(3)"), "TPL501", "heads.py") == [21]


def test_a_class_that_registers_a_buffer_is_found() -> None:
    source = LIST_OF.replace(
        "self.pool = nn.AvgPool1d(k)", 'self.register_buffer("w", torch.ones(k))'
    )
    assert lines(source.format(element="Smooth(3)"), "TPL501", "heads.py") == [16]


def test_a_subclass_of_a_layer_that_learns_is_found() -> None:
    source = LIST_OF.replace("class Smooth(nn.Module):", "class Smooth(nn.Linear):")
    assert lines(source.format(element="Smooth(3)"), "TPL501", "heads.py") == [16]
