"""TPL401 (rules/loading.py): a script that saves a file at module level and loads it again
below reads back what it just wrote, on a device that exists."""

from __future__ import annotations

from torchplace.lint import lint_source

SCRIPT = """\
import torch
import torchvision

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = torchvision.models.resnet18()
torch.save(model.state_dict(), "params.ckpt")
model.load_state_dict(torch.load("params.ckpt", weights_only=True))
other = torch.load("other.ckpt", weights_only=True)
early = torch.load("later.ckpt", weights_only=True)
torch.save(model.state_dict(), "later.ckpt")


def export(net):
    torch.save(net.state_dict(), "exported.ckpt")


again = torch.load("exported.ckpt", weights_only=True)
"""


def test_a_module_level_round_trip_is_left_alone() -> None:
    lines = [f.line for f in lint_source(SCRIPT, "train.py", select={"TPL401"})]
    assert 7 not in lines


def test_other_module_level_loads_are_still_reported() -> None:
    # a file never saved, one saved only below the load (an earlier run's), and one that a
    # function saves (it may never run)
    lines = [f.line for f in lint_source(SCRIPT, "train.py", select={"TPL401"})]
    assert lines == [8, 9, 17]


def test_weights_only_is_unchanged_for_module_level_round_trips() -> None:
    source = SCRIPT.replace(", weights_only=True", "")
    lines = [f.line for f in lint_source(source, "train.py", select={"TPL402"})]
    assert 7 in lines
