"""TPL801 (rules/optimizer.py): moving a model moves the submodules an optimizer was given."""

from __future__ import annotations

from torchplace.lint import lint_source

SUBMODULE_GROUPS = """\
import torch
import torch.nn as nn


def main(opts, model, device):
    optimizer = torch.optim.SGD(params=[
        {"params": model.backbone.parameters(), "lr": 0.1 * opts.lr},
        {"params": model.classifier.parameters(), "lr": opts.lr},
    ], lr=opts.lr)
    if opts.ckpt is not None:
        model = nn.DataParallel(model)
        model.to(device)
    return optimizer


def after(model, device):
    model.to(device)
    return torch.optim.SGD(model.backbone.parameters(), lr=0.1)


def rebuilt(model, device):
    optimizer = torch.optim.SGD(model.backbone.parameters(), lr=0.1)
    model = nn.Linear(4, 4)
    model.to(device)
    return optimizer
"""


def test_moving_the_model_moves_the_submodule_the_optimizer_got() -> None:
    found = lint_source(SUBMODULE_GROUPS, "train.py", select={"TPL801"})
    assert [f.line for f in found] == [6]
    assert "`model.backbone.parameters()` before `model` is moved" in found[0].message


def test_an_optimizer_after_the_move_or_a_rebound_model_is_left_alone() -> None:
    found = lint_source(SUBMODULE_GROUPS, "train.py", select={"TPL801"})
    assert all(f.line < 16 for f in found)
