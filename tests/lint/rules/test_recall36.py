"""Recall round 36: host reads whose evidence is in another file of the project, each next to
the look-alike that must stay clean.

- a model's ``forward`` run by the batch loop of its base class's ``fit`` (``model =
  self.train()``, then ``model(x)`` per batch), the base in another module;
- a model's ``forward`` its own class runs per batch from a training-framework hook
  (``self(inputs, sizes)`` in a Lightning ``training_step``);
- a project helper that copies its argument to the host (``to_cpu(t)`` returning
  ``t.detach().cpu()``), called per batch from a module that imports it;
- a function of a package's ``__init__.py`` that a module beside the package calls per batch
  as ``pkg.helper(...)``;
- a branch tested on a run's setting (``if args.augment_p == 0:``) holds on every step or on
  none: it is not a branch taken on few steps, as a step counter's ``if step == 0:`` is.
"""

from __future__ import annotations

import pytest

from .helpers import lines as _lines
from .helpers import project as _project

# ---- TPL201: a subclass's forward, run by its base class's fit loop

BASE = """\
import torch


class BaseModel(torch.nn.Module):
    def fit(self, loader, optimizer, loss_func):
        model = self.train()
        for x_train, y_train in loader:
            x = x_train.to(self.device).float()
            y = y_train.to(self.device).float()
            y_pred = model(x)
            loss = loss_func(y_pred, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    def summary(self, sample):
        return self(sample)
"""

SUBCLASS = """\
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from .base import BaseModel


class Interest(BaseModel):
    def forward(self, X):
        keys = X[:, :, :4]
        lengths = X[:, 0, 4]
        packed = pack_padded_sequence(keys, lengths=lengths.cpu(), batch_first=True)
        return self.gru(packed)
"""


def _package(files: dict[str, str]) -> dict[str, str]:
    return {"models/__init__.py": "", **files}


def test_a_forward_the_base_class_fit_runs_per_batch_is_per_batch(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    files = _package({"models/base.py": BASE, "models/interest.py": SUBCLASS})
    assert _project(tmp_path_factory.mktemp("project"), files, "TPL201") == [
        ("models/interest.py", 11)
    ]


def test_a_forward_the_base_class_calls_outside_a_batch_loop_is_left_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # the base only runs the model once (`summary`), or in a loop over epochs of no batches
    once = BASE.replace("        for x_train, y_train in loader:", "        if loader:")
    once = once.replace("            x = x_train.", "            x = loader.")
    once = once.replace("            y = y_train.", "            y = loader.")
    files = _package({"models/base.py": once, "models/interest.py": SUBCLASS})
    assert _project(tmp_path_factory.mktemp("project"), files, "TPL201") == []


LIGHTNING = """\
import lightning as L


class Speech(L.LightningModule):
    def forward(self, x, lengths):
        lengths = lengths.cpu().int()
        return self.rnn(x, lengths)

    def training_step(self, batch, batch_idx):
        inputs, targets, percentages = batch
        sizes = percentages.mul_(int(inputs.size(3))).int()
        out = self(inputs, sizes)
        return self.criterion(out, targets)
"""


def test_a_forward_its_own_step_hook_runs_is_per_batch() -> None:
    # Lightning moves the batch: `sizes` is a device tensor, copied back in `forward`
    assert _lines(LIGHTNING, "TPL201", path="model.py") == [6]


def test_a_forward_run_outside_the_step_hooks_is_left_alone() -> None:
    once = LIGHTNING.replace(
        "def training_step(self, batch, batch_idx):", "def summary(self, batch):"
    )
    assert _lines(once, "TPL201", path="model.py") == []


# ---- TPL201: a project helper that copies its argument to the host

UTILS = """\
def to_cpu(tensor):
    return tensor.detach().cpu()
"""

LOSS = """\
import torch

from utils import to_cpu


def train(model, loader, optimizer, device):
    for imgs, targets in loader:
        imgs = imgs.to(device)
        loss = model(imgs).sum()
        loss.backward()
        optimizer.step()
        logged = to_cpu(loss)
"""


def test_a_host_copy_helper_called_per_batch_is_the_read(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # the helper's own `.cpu()` is reported where it is (as before), and the call per batch
    found = _project(
        tmp_path_factory.mktemp("project"), {"utils.py": UTILS, "train.py": LOSS}, "TPL201"
    )
    assert found == [("train.py", 12), ("utils.py", 2)]
    # a NumPy copy, imported from a module of a package
    numpy_utils = "def tensor2numpy(t):\n    return t.data.cpu().numpy()\n"
    loss = LOSS.replace("from utils import to_cpu", "from lib.utils import tensor2numpy")
    loss = loss.replace("to_cpu(loss)", "tensor2numpy(loss)")
    files = {"lib/__init__.py": "", "lib/utils.py": numpy_utils, "train.py": loss}
    found = _project(tmp_path_factory.mktemp("project"), files, "TPL201")
    assert found == [("lib/utils.py", 2), ("train.py", 12)]


def test_a_helper_that_keeps_the_value_on_the_device_is_no_read(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    keeps = UTILS.replace("tensor.detach().cpu()", "tensor.detach()")
    assert (
        _project(
            tmp_path_factory.mktemp("project"), {"utils.py": keeps, "train.py": LOSS}, "TPL201"
        )
        == []
    )
    # called once, after the loop: the copy of the last loss
    after = LOSS.replace("        logged = to_cpu(loss)", "    logged = to_cpu(loss)")
    assert (
        _project(
            tmp_path_factory.mktemp("project"), {"utils.py": UTILS, "train.py": after}, "TPL201"
        )
        == []
    )


# ---- TPL201: a function of a package __init__, called per batch as `pkg.helper(...)`

ALIGN = """\
import numpy as np


def maximum_path(neg_cent, mask):
    path = neg_cent.data.cpu().numpy().astype(np.float32)
    return path
"""

TRAIN = """\
import torch

import align


def train(model, loader, optimizer, device):
    for x, mask in loader:
        x = x.to(device)
        mask = mask.to(device)
        scores = model(x)
        path = align.maximum_path(scores, mask)
        loss = scores.sum()
        loss.backward()
        optimizer.step()
"""


def test_a_package_init_function_called_per_batch_is_per_batch(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    files = {"align/__init__.py": ALIGN, "train.py": TRAIN}
    assert _project(tmp_path_factory.mktemp("project"), files, "TPL201") == [
        ("align/__init__.py", 5)
    ]


def test_a_package_init_function_called_once_is_left_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    once = TRAIN.replace("        path = align.maximum_path(scores, mask)\n", "")
    once = once.replace(
        "        optimizer.step()\n",
        "        optimizer.step()\n    align.maximum_path(scores, mask)\n",
    )
    files = {"align/__init__.py": ALIGN, "train.py": once}
    assert _project(tmp_path_factory.mktemp("project"), files, "TPL201") == []


# ---- TPL201: a branch on a run's setting holds on every step

SETTING = """\
import torch


def train(args, model, loader, device, optimizer):
    for step, (x, y) in enumerate(loader):
        x = x.to(device)
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        if args.augment and args.augment_p == 0:
            stat = loss.item()
"""


def test_a_branch_on_a_setting_runs_on_every_step() -> None:
    assert _lines(SETTING, "TPL201") == [11]
    nested = SETTING.replace("args.augment_p == 0", "self.cfg.warmup == 0")
    assert _lines(nested, "TPL201") == [11]


def test_a_branch_on_a_step_counter_is_still_rare() -> None:
    assert _lines(SETTING.replace("args.augment_p == 0", "step == 0"), "TPL201") == []
    assert _lines(SETTING.replace("args.augment_p == 0", "self.step == 0"), "TPL201") == []
