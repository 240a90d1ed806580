"""Round 90 (TPL201): the tensor methods that build a new tensor from data,
``beam_scores.new([...])`` (the legacy spelling Oscar's and GIT's beam searches use) and
``x.new_tensor([...])``, read a list of 0-dim device tensors one element at a time, as
``torch.tensor([...])`` does; ``x.new(4)`` (a size) reads nothing."""

from __future__ import annotations

from .helpers import lines as _lines

BEAM = """\
import torch


def beam(model, x, steps):
    model = model.cuda()
    x = x.cuda()
    for step in range(steps):
        scores = model(x)
        beam_scores = scores.new([scores[i].max() for i in range(4)])
        ids = x.new_tensor([scores[0], scores[1]])
        empty = x.new(4)
        fixed = x.new([4, 5])
    return beam_scores, ids, empty, fixed
"""


def test_new_of_a_list_of_device_elements() -> None:
    assert _lines(BEAM, "TPL201") == [9, 10]
