"""Round 77 (TPL201): a torch test in a batch loop (``if torch.isnan(loss).any():``) is a read
as plain as ``.item()``, whatever is known of where the tested value lives."""

from __future__ import annotations

from .helpers import lines as _lines

NAN_TEST = """\
import os
import sys
import torch


def train(scene, gaussians, opt, iterations):
    for iteration in range(iterations):
        image = render(scene.camera(iteration), gaussians)
        loss = l1_loss(image, scene.target(iteration))
        loss.backward()
        if torch.isnan(loss).any():
            os.execv(sys.executable, [sys.executable] + sys.argv)
        gaussians.optimizer.step()
"""


def test_a_torch_test_in_a_training_loop_of_a_value_from_elsewhere() -> None:
    assert _lines(NAN_TEST, "TPL201") == [11]


def test_a_torch_test_in_a_loop_that_is_no_batch_loop() -> None:
    plain = (
        NAN_TEST.replace("        loss.backward()\n", "")
        .replace("        gaussians.optimizer.step()\n", "")
        .replace("for iteration in range(iterations):", "for iteration in [0]:")
    )
    assert _lines(plain, "TPL201") == []
