"""Round 79: a loop inside the branch a non-finite value takes runs only with that failed
step (TPL201); a set-test through a helper that only says whether its argument is ``None``
(``if exists(self.mask):``, also imported from a module of the linted tree) reads no tensor
(TPL501)."""

from __future__ import annotations

from pathlib import Path

from .helpers import lines as _lines
from .helpers import project as _project

NAN_ROWS = """\
import torch


def train(model, loader, optimizer, device):
    model.to(device)
    for x, y in loader:
        loss_simple = model(x.to(device), y.to(device))
        if torch.isnan(loss_simple).any():
            for i in range(loss_simple.shape[0]):
                if torch.isnan(loss_simple[i]).any():
                    loss_simple[i] = torch.zeros_like(loss_simple[i])
        loss = loss_simple.mean()
        loss.backward()
        optimizer.step()
"""


def test_a_loop_inside_the_branch_of_a_non_finite_loss() -> None:
    assert _lines(NAN_ROWS, "TPL201") == [8]


def test_the_same_loop_outside_such_a_branch_reads_per_row() -> None:
    every_step = NAN_ROWS.replace(
        "        if torch.isnan(loss_simple).any():\n            for i",
        "        if True:\n            for i",
    )
    assert _lines(every_step, "TPL201") == [10]


COMMON = """\
def exists(val):
    return val is not None
"""

ATTENTION = """\
import torch
from torch import nn
from common import exists


class TemporalAttention(nn.Module):
    def __init__(self, dim, causal=False, length=16):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        if causal:
            self.mask = torch.tril(torch.ones([1, length, length]))
        else:
            self.mask = None

    def forward(self, x):
        sim = torch.einsum("bid,bjd->bij", x, x)
        if exists(self.mask):
            sim = sim.masked_fill(self.mask.to(sim.device) == 0, -1e9)
        return self.proj(sim.softmax(-1) @ x)
"""


def test_a_set_test_through_an_imported_none_helper(tmp_path: Path) -> None:
    found = _project(tmp_path, {"common.py": COMMON, "attention.py": ATTENTION}, "TPL501")
    assert found == []


def test_a_helper_that_reads_the_mask_is_no_set_test(tmp_path: Path) -> None:
    reads = COMMON.replace("return val is not None", "return bool(val.any())")
    found = _project(tmp_path, {"common.py": reads, "attention.py": ATTENTION}, "TPL501")
    assert found == [("attention.py", 11)]
