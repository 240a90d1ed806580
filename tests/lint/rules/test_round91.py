"""Round 91 (TPL104): a class with a placement method of its own, ``def to_device(self,
s="cuda:0")`` moving what it holds with ``.to(s)`` (FoundationPose's estimator), lets its
caller choose the device; a bare ``"cuda"`` in its other methods ignores that choice."""

from __future__ import annotations

from .helpers import lines as _lines

ESTIMATOR = """\
import torch


class PoseEstimator:
    def __init__(self, points):
        self.points = torch.as_tensor(points)

    def to_device(self, s="cuda:0"):
        self.points = self.points.to(s)

    def register(self, depth):
        depth = torch.as_tensor(depth, device="cuda")
        return depth @ self.points
"""


def test_a_bare_cuda_beside_the_class_own_placement_method() -> None:
    assert _lines(ESTIMATOR, "TPL104") == [12]


def test_a_class_without_one_is_left_alone() -> None:
    plain = ESTIMATOR.replace("def to_device(self, s=", "def describe(self, s=")
    assert _lines(plain, "TPL104") == []
