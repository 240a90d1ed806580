"""Recall round 30: pitfalls missed across functions of training code, each next to the
look-alike that must stay clean: a trainer class split in methods, one that backpropagates
and one that steps the optimizer, whose helper reads gradient norms back on every step; a
helper in a sibling module that a submodule's ``forward`` calls, with the lengths the batch
loop moved, three calls from the loop that runs the model."""

from __future__ import annotations

import pytest

from .helpers import lines as _lines
from .helpers import project as _project

# ---- TPL201: a helper of the method that steps the optimizer, in a class that backpropagates

SPLIT_STEP = """\
import numpy as np
import torch as th


class MixedPrecisionTrainer:
    def __init__(self, model):
        self.model = model
        self.master_params = list(self.model.parameters())

    def backward(self, loss):
        loss.backward()

    def optimize(self, opt: th.optim.Optimizer):
        grad_norm = self._compute_norms()
        print(grad_norm)
        opt.step()

    def _compute_norms(self):
        grad_norm = 0.0
        for p in self.master_params:
            grad_norm += th.norm(p.grad, p=2).item() ** 2
        return np.sqrt(grad_norm)
"""


def test_a_norm_read_in_a_helper_of_a_split_training_step_is_reported() -> None:
    assert _lines(SPLIT_STEP, "TPL201", "fp16_util.py") == [21]


def test_a_class_that_never_backpropagates_or_steps_per_epoch_is_left_alone() -> None:
    # no method backpropagates: nothing says `optimize` is a training step
    assert _lines(SPLIT_STEP.replace("loss.backward()", "self.loss = loss"), "TPL201") == []
    # the method walks the loader itself and reads the norms once after its loop: an epoch
    epoch = SPLIT_STEP.replace(
        "    def optimize(self, opt: th.optim.Optimizer):\n"
        "        grad_norm = self._compute_norms()\n"
        "        print(grad_norm)\n"
        "        opt.step()\n",
        "    def optimize(self, opt: th.optim.Optimizer, train_loader):\n"
        "        for batch in train_loader:\n"
        "            self.model(batch).sum().backward()\n"
        "            opt.step()\n"
        "        print(self._compute_norms())\n",
    )
    assert _lines(epoch, "TPL201", "fp16_util.py") == []


# ---- TPL201: a sibling module's helper of a submodule's `forward`, three calls from the loop

MASK_UTILS = """\
import torch


def get_mask_from_lengths(lengths):
    max_len = torch.max(lengths).item()
    ids = torch.arange(0, max_len, device=lengths.device)
    return ids < lengths.unsqueeze(1)
"""

SEQ_MODEL = """\
from torch import nn
from utils import get_mask_from_lengths


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, memory, memory_lengths):
        mask = ~get_mask_from_lengths(memory_lengths)
        return self.proj(memory).masked_fill(mask.unsqueeze(2), 0)


class Tacotron(nn.Module):
    def __init__(self):
        super().__init__()
        self.decoder = Decoder()

    def forward(self, inputs):
        text, lengths = inputs
        return self.decoder(text, memory_lengths=lengths)
"""

SEQ_TRAIN = """\
import torch
from model import Tacotron


def train(loader):
    model = Tacotron().cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for batch in loader:
        x = [t.cuda() for t in batch]
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
"""


def test_a_helper_of_a_submodules_forward_in_a_sibling_module_is_reported(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("project")
    files = {"utils.py": MASK_UTILS, "model.py": SEQ_MODEL, "train.py": SEQ_TRAIN}
    assert _project(root, files, "TPL201") == [("utils.py", 5)]


def test_a_helper_of_a_submodule_given_host_lengths_is_left_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # the model hands the decoder host lengths: the helper reads host data (the model's own
    # copy is the per-batch read)
    model = SEQ_MODEL.replace("memory_lengths=lengths)", "memory_lengths=lengths.cpu())")
    files = {"utils.py": MASK_UTILS, "model.py": model, "train.py": SEQ_TRAIN}
    assert _project(tmp_path_factory.mktemp("project"), files, "TPL201") == [("model.py", 22)]
    # a sibling helper called by a model's other method that nothing runs per batch
    model = SEQ_MODEL.replace(
        "        mask = ~get_mask_from_lengths(memory_lengths)\n"
        "        return self.proj(memory).masked_fill(mask.unsqueeze(2), 0)\n",
        "        return self.proj(memory)\n\n"
        "    def summary(self, lengths):\n"
        "        return get_mask_from_lengths(lengths)\n",
    )
    files = {"utils.py": MASK_UTILS, "model.py": model, "train.py": SEQ_TRAIN}
    assert _project(tmp_path_factory.mktemp("project"), files, "TPL201") == []
