"""TPL301 (rules/timing.py): reading a placed tensor's metadata (``tuple(y[0].shape)``,
``y.size(0)``) inside a timed region is host work, not device work; computing with the tensor
is device work."""

from __future__ import annotations

from torchplace.lint import lint_source

METADATA = """\
import time
import torch


def report(model, y):
    t = time.time()
    s = tuple(y[0].shape)
    n = y.size(0)
    print(f"done {time.time() - t:.2f}s", s, n)


def run(model):
    im = torch.zeros(1, 3).to("cuda:0")
    y = model(im)
    report(model, y)
"""

WORK = """\
import time
import torch


def report(model, y):
    t = time.time()
    s = tuple(y[0].softmax(-1).shape)
    z = torch.sigmoid(y)
    print(f"done {time.time() - t:.2f}s", s, z.shape)


def run(model):
    im = torch.zeros(1, 3).to("cuda:0")
    y = model(im)
    report(model, y)
"""


def _lines(source: str) -> list[int]:
    return [f.line for f in lint_source(source, "export.py", select={"TPL301"})]


def test_metadata_of_a_placed_tensor_is_not_device_work() -> None:
    assert _lines(METADATA) == []


def test_computing_with_a_placed_tensor_is_device_work() -> None:
    assert _lines(WORK) == [6]
