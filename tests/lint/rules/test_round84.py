"""Round 84 (TPL801): an optimizer another library publishes under a name of torch's own,
``from transformers import AdamW``, built before the model is moved."""

from __future__ import annotations

from .helpers import lines as _lines

TUTORIAL = """\
import torch
from transformers import AdamW


def main(cuda):
    model = torch.nn.Linear(2, 2)
    groups = [{"params": [p for n, p in model.named_parameters()], "weight_decay": 0.01}]
    optimizer = AdamW(groups, lr=2e-5)
    if cuda:
        model = model.cuda()
    return model, optimizer
"""


def test_transformers_adamw_before_the_move() -> None:
    assert _lines(TUTORIAL, "TPL801") == [8]


def test_a_function_of_that_name_that_is_no_class_is_left_alone() -> None:
    helper = TUTORIAL.replace("from transformers import AdamW", "from mylib.train import adamw")
    assert _lines(helper.replace("AdamW(", "adamw("), "TPL801") == []
