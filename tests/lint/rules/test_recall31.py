"""Recall round 31: pitfalls missed in training code split across a class hierarchy and its
helpers, each next to the look-alike that must stay clean: the hook a base class's loop calls
on each item of its loader, implemented by a subclass in another module; a loss module's NaN
test in ``forward``, reached straight from a training step; an element of a device tensor used
as a slice bound in a batch loop; plus two precision fixes: a device fallback spelled with
``torch.device`` in a class that holds a model, and CUDA-event timing under a backend branch."""

from __future__ import annotations

import pytest

from .helpers import lines as _lines
from .helpers import project as _project

# ---- TPL201: the hook a base class's loader loop calls, implemented in a subclass module

RUNNER_BASE = """\
import torch


class Runner:
    def __init__(self, net, eval_loader, device):
        self.net = net
        self.eval_loader = eval_loader
        self.device = device

    def score_batch(self, batch):
        raise NotImplementedError

    def evaluate(self):
        totals = []
        for step, batch in enumerate(self.eval_loader):
            totals.append(self.score_batch(batch))
        return totals
"""

RUNNER_IMPL = """\
import torch
from .runner_base import Runner


class DepthRunner(Runner):
    def score_batch(self, batch):
        images = batch["rgb"].to(self.device)
        err = (self.net(images) - batch["depth"].to(self.device)).abs().mean()
        return {"err": err.item()}
"""


def test_a_subclass_hook_called_on_each_loader_item_by_its_base_is_reported(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # a folder without `__init__.py`: the relative import names the module beside the file
    files = {"runner_base.py": RUNNER_BASE, "runner_impl.py": RUNNER_IMPL}
    root = tmp_path_factory.mktemp("project")
    assert _project(root, files, "TPL201") == [("runner_impl.py", 9)]
    # the same two classes in one file
    one = (
        RUNNER_BASE
        + "\n\n"
        + RUNNER_IMPL.replace("import torch\n", "").replace("from .runner_base import Runner\n", "")
    )
    assert _lines(one, "TPL201") == [26]


def test_a_hook_that_moves_nothing_or_runs_on_few_steps_is_left_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # the override never moves what the loop hands it: nothing says it is device work
    impl = RUNNER_IMPL.replace('batch["rgb"].to(self.device)', 'batch["rgb"]').replace(
        'batch["depth"].to(self.device)', 'batch["depth"]'
    )
    files = {"runner_base.py": RUNNER_BASE, "runner_impl.py": impl}
    assert _project(tmp_path_factory.mktemp("project"), files, "TPL201") == []
    # the base calls the hook only every 100 steps
    base = RUNNER_BASE.replace(
        "            totals.append(self.score_batch(batch))\n",
        "            if step % 100 == 0:\n                totals.append(self.score_batch(batch))\n",
    )
    files = {"runner_base.py": base, "runner_impl.py": RUNNER_IMPL}
    assert _project(tmp_path_factory.mktemp("project"), files, "TPL201") == []
    # the base's loop walks a list of names, not a loader
    base = RUNNER_BASE.replace("enumerate(self.eval_loader)", "enumerate(self.names)")
    files = {"runner_base.py": base, "runner_impl.py": RUNNER_IMPL}
    assert _project(tmp_path_factory.mktemp("project"), files, "TPL201") == []


# ---- TPL201: a loss module's NaN test in `forward`, computed in steps from what it is handed

LOSSES = """\
import torch
from torch import nn


class ScaleInvariantLoss(nn.Module):
    def forward(self, pred, target):
        diff = torch.log(pred + 1e-6) - torch.log(target + 1e-6)
        spread = torch.var(diff)
        value = torch.sqrt(spread)
        if torch.isnan(value):
            print("nan loss")
        return value
"""

STEP_TRAINER = """\
from losses import ScaleInvariantLoss


class DepthTrainer:
    def __init__(self, net, opt, device):
        self.net = net
        self.opt = opt
        self.device = device
        self.criterion = ScaleInvariantLoss()

    def train_on_batch(self, batch):
        images = batch["rgb"].to(self.device)
        depth = batch["depth"].to(self.device)
        loss = self.criterion(self.net(images), depth)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss
"""


def test_a_nan_test_in_a_loss_forward_called_by_a_training_step_is_reported(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    files = {"losses.py": LOSSES, "trainer.py": STEP_TRAINER}
    assert _project(tmp_path_factory.mktemp("project"), files, "TPL201") == [("losses.py", 10)]
    # in one file, the loss run in a batch loop
    script = LOSSES + (
        "\n\ndef fit(net, loader, opt, device):\n"
        "    crit = ScaleInvariantLoss()\n"
        "    net = net.to(device)\n"
        "    for x, y in loader:\n"
        "        loss = crit(net(x.to(device)), y.to(device))\n"
        "        loss.backward()\n"
        "        opt.step()\n"
    )
    assert _lines(script, "TPL201") == [10]


def test_a_loss_forward_run_once_on_host_values_is_left_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # the criterion runs once, on CPU tensors, in a method that is no training step
    trainer = STEP_TRAINER.replace(
        "    def train_on_batch(self, batch):\n"
        '        images = batch["rgb"].to(self.device)\n'
        '        depth = batch["depth"].to(self.device)\n'
        "        loss = self.criterion(self.net(images), depth)\n"
        "        loss.backward()\n"
        "        self.opt.step()\n"
        "        self.opt.zero_grad()\n"
        "        return loss\n",
        "    def sanity(self):\n        return self.criterion(torch.ones(4), torch.ones(4))\n",
    ).replace("from losses", "import torch\nfrom losses")
    files = {"losses.py": LOSSES, "trainer.py": trainer}
    assert _project(tmp_path_factory.mktemp("project"), files, "TPL201") == []


# ---- TPL201: an element of a device tensor as a slice bound, per row of each batch

SLICE_BOUND = """\
import torch


def train(net, loader, opt, device):
    net = net.to(device)
    for feats, lengths in loader:
        feats = feats.to(device)
        lengths = lengths.to(device)
        out = net(feats)
        keep = torch.ones_like(out)
        for row in range(out.size(0)):
            keep[row, lengths[row]:] = 0
        loss = (out * keep).mean()
        loss.backward()
        opt.step()
"""


def test_a_slice_bounded_by_a_device_element_in_a_batch_loop_is_reported() -> None:
    assert _lines(SLICE_BOUND, "TPL201") == [12]


def test_a_slice_bounded_by_host_lengths_is_left_alone() -> None:
    # the lengths stay on the host (only the features move)
    assert _lines(SLICE_BOUND.replace("        lengths = lengths.to(device)\n", ""), "TPL201") == []
    # read to a Python list once per batch, the bounds are ints (the `.tolist()` is the read)
    host = SLICE_BOUND.replace(
        "keep[row, lengths[row]:] = 0", "keep[row, bounds[row]:] = 0"
    ).replace(
        "        keep = torch.ones_like(out)\n",
        "        keep = torch.ones_like(out)\n        bounds = lengths.tolist()\n",
    )
    assert _lines(host, "TPL201") == [11]


# ---- TPL104 (precision): the availability fallback spelled with `torch.device`

HOLDER = """\
import torch


class Evaluator:
    def __init__(self, model, device=None):
        if device is None:
            device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        self.device = device
        self.model = model.to(device)
"""


def test_a_device_fallback_in_a_class_that_holds_a_model_is_left_alone() -> None:
    assert _lines(HOLDER, "TPL104") == []


def test_a_bare_cuda_device_in_a_class_that_holds_a_model_is_still_reported() -> None:
    bare = HOLDER.replace(
        'torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")',
        'torch.device("cuda")',
    )
    assert _lines(bare, "TPL104") == [7]


# ---- TPL202 (precision): CUDA events under a backend branch time each step

EVENT_TIMING = """\
import time

import torch


def bench(fn, x, device, reps=50):
    timings = []
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        if device.type == "cuda":
            start.record()
            fn(x)
            end.record()
            torch.cuda.synchronize()
            timings.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn(x)
            timings.append(time.perf_counter() - t0)
    return timings
"""


def test_event_timing_under_a_backend_branch_is_left_alone() -> None:
    assert _lines(EVENT_TIMING, "TPL202") == []


def test_a_sync_each_step_with_a_clock_read_only_when_logging_is_reported() -> None:
    logged = """\
import time

import torch


def run(fn, loader):
    for step, x in enumerate(loader):
        fn(x.cuda())
        torch.cuda.synchronize()
        if step % 100 == 0:
            print(time.time())
"""
    assert _lines(logged, "TPL202") == [9]
