"""TPL102 (rules/placement.py): a tensor's own backend query is a branch on the device type."""

from __future__ import annotations

from torchplace.lint import lint_source

SOURCE = """\
import torch
import torch.nn as nn


class DiagGaussian(nn.Module):
    def forward(self, x):
        zeros = torch.zeros(x.size())
        if x.is_cuda:
            zeros = zeros.cuda()
        return zeros


class Hardcoded(nn.Module):
    def forward(self, x):
        if x.dim() == 2:
            x = x.cuda()
        return x
"""


def test_cuda_under_is_cuda_follows_the_input_and_is_left_alone() -> None:
    lines = [f.line for f in lint_source(SOURCE, "model.py", select={"TPL102"})]
    assert lines == [16]
