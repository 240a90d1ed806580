"""Round 76 (TPL501): an ``_apply`` override in a module beside the head's, which maps the
head's plain tensor attributes on every ``.to()`` (YOLOv6's ``Model._apply`` in ``yolo.py``
for ``Detect`` in ``effidehead.py``)."""

from __future__ import annotations

from pathlib import Path

from .helpers import project as _project

HEAD = """\
import torch
from torch import nn


class Detect(nn.Module):
    def __init__(self, strides=(8, 16, 32)):
        super().__init__()
        self.stride = torch.tensor(strides)
        self.conv = nn.Conv2d(3, 3, 1)

    def forward(self, x):
        return self.conv(x) * self.stride[0]
"""

MODEL = """\
from torch import nn
from effidehead import Detect


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.detect = Detect()

    def forward(self, x):
        return self.detect(x)

    def _apply(self, fn):
        self = super()._apply(fn)
        self.detect.stride = fn(self.detect.stride)
        return self
"""


def test_a_plain_attribute_an_apply_beside_it_maps(tmp_path: Path) -> None:
    found = _project(tmp_path, {"effidehead.py": HEAD, "yolo.py": MODEL}, "TPL501")
    assert found == []


def test_without_the_apply_the_plain_attribute_is_reported(tmp_path: Path) -> None:
    plain = MODEL.split("    def _apply")[0]
    found = _project(tmp_path, {"effidehead.py": HEAD, "yolo.py": plain}, "TPL501")
    assert found == [("effidehead.py", 8)]
