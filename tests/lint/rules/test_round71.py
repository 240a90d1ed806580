"""Round 71 (TPL201): a method of a parameter annotated with a class of the linted code that
hands back a Python number; NumPy's scalar tests and more ``math`` functions as reads; an
identity test (``x is None``) as a Python bool; a torch test in a function that is a whole
training step; the body of ``if isinstance(x, float):`` as a Python number."""

from __future__ import annotations

from pathlib import Path

from .helpers import lines as _lines
from .helpers import project as _project

MODEL = """\
import torch
from torch import nn


class Vocoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("step", torch.zeros(1, dtype=torch.long))
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        self.step += 1
        return self.fc(x)

    def get_step(self):
        return self.step.data.item()
"""

TRAIN = """\
import torch
from model import Vocoder


def train_loop(model: Vocoder, optimizer, loader, device):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step = model.get_step()
        print(f"step {step // 1000}k")


def main():
    device = torch.device("cuda")
    model = Vocoder().to(device)
    train_loop(model, torch.optim.Adam(model.parameters()), [], device)
"""


def test_a_method_of_an_annotated_parameter_that_returns_a_number(tmp_path: Path) -> None:
    found = _project(tmp_path, {"model.py": MODEL, "train.py": TRAIN}, "TPL201")
    assert ("train.py", 13) not in found


def test_without_the_annotation_the_call_is_still_unknown(tmp_path: Path) -> None:
    plain = TRAIN.replace("model: Vocoder", "model")
    found = _project(tmp_path, {"model.py": MODEL, "train.py": plain}, "TPL201")
    assert ("train.py", 13) in found


NUMPY_TEST = """\
import numpy as np
import torch


def train(model, loader, optimizer, device):
    model.to(device)
    for x, y in loader:
        loss = model(x.to(device), y.to(device))
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if np.isnan(grad_norm):
            print("grad_norm was NaN!")
        optimizer.step()
"""


def test_numpy_scalar_test_of_a_device_norm_is_a_read() -> None:
    assert _lines(NUMPY_TEST, "TPL201") == [11]


def test_numpy_scalar_test_of_a_host_number_is_not() -> None:
    host = NUMPY_TEST.replace("np.isnan(grad_norm)", "np.isnan(float(0))")
    assert _lines(host, "TPL201") == []


def test_a_python_number_branch_is_not_a_read() -> None:
    narrowed = NUMPY_TEST.replace(
        "        if np.isnan(grad_norm):",
        "        if isinstance(grad_norm, float) and np.isnan(grad_norm):",
    )
    assert _lines(narrowed, "TPL201") == [11]  # the `and` reads nothing in the isinstance arm
    nested = NUMPY_TEST.replace(
        "        if np.isnan(grad_norm):\n            print",
        "        if isinstance(grad_norm, float):\n            if np.isnan(grad_norm):\n"
        "                print",
    )
    assert _lines(nested, "TPL201") == []


MATH_TAN = """\
import math
import torch


def render(views, device):
    images = []
    for view in views:
        fov = torch.atan(view.to(device)) * 2
        images.append(math.tan(fov * 0.5))
    return images
"""


def test_math_tan_of_a_device_value_in_a_loop_is_a_read() -> None:
    assert _lines(MATH_TAN, "TPL201") == [9]


IDENTITY = """\
import torch


def step(model, loader, device):
    model.to(device)
    for x, targets in loader:
        x, targets = x.to(device), targets.to(device)
        out = model(x)
        keep = out[:, : -int(targets is None)]
        print(keep.shape)
"""


def test_an_identity_test_is_a_python_bool() -> None:
    assert _lines(IDENTITY, "TPL201") == []


def test_a_comparison_of_the_device_output_still_is_a_read() -> None:
    compared = IDENTITY.replace("int(targets is None)", "int(out.sum() > 0)")
    assert _lines(compared, "TPL201") == [9]


WHOLE_STEP = """\
import torch


class Trainer:
    def __init__(self, net):
        self.model = net.cuda()

    def run_step(self, data):
        loss = self.model(data)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
"""


def test_a_torch_test_in_a_whole_training_step_is_a_read() -> None:
    assert _lines(WHOLE_STEP, "TPL201") == [12]


def test_a_torch_test_in_a_function_that_trains_nothing_is_left_alone() -> None:
    no_step = WHOLE_STEP.replace("        loss.backward()\n", "").replace(
        "self.optimizer.step()", "self.norms.append(grad_norm)"
    )
    assert _lines(no_step, "TPL201") == []
