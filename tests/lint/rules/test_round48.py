"""Round 48: a moved model's method that only counts and does arithmetic answers a Python
number (nanoGPT's and llama2.c's ``raw_model.estimate_mfu(...)``, printed every step with
``log_interval = 1``), also through the model a DDP wrapper holds (``model.module if ddp else
model``) and one a ``@classmethod`` builds (``GPT.from_pretrained(...)``); a method that runs
the network, or hands back a tensor it holds, still answers on the device."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import lines, project

MODEL = """\
import torch
from torch import nn


class GPT(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.n = n
        self.head = nn.Linear(n, n)
        self.emb = nn.Parameter(torch.zeros(n))

    @classmethod
    def from_pretrained(cls, name):
        return cls(8)

    def forward(self, x):
        return self.head(x)

    def get_num_params(self):
        n_params = sum(p.numel() for p in self.parameters())
        n_params -= self.head.weight.numel()
        return n_params

    def estimate_mfu(self, fwdbwd_per_iter, dt):
        N = self.get_num_params()
        flops_achieved = 6 * N * fwdbwd_per_iter * (1.0 / dt)
        mfu = flops_achieved / 312e12
        return mfu

    def score(self, x):
        return self(x).mean()

    def embedding(self):
        return self.emb
"""

TRAIN = """\
import time

import torch

from model import GPT

log_interval = 1
ddp = False
device = "cuda"
model = GPT(8) if {fresh} else GPT.from_pretrained("gpt2")
model.to(device)
raw_model = model.module if ddp else model
running_mfu = -1.0
t0 = time.time()
x = torch.ones(4, 8).to(device)
for iter_num in range(100):
    loss = model(x).sum()
    loss.backward()
    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    if iter_num % log_interval == 0:
        mfu = {call}
        running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
        print(f"{{iter_num}} | mfu {{running_mfu*100:.2f}}%")
"""


@pytest.fixture
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("project")  # not under a test* folder: linted as code


def _found(root: Path, call: str, fresh: str = "True") -> list[tuple[str, int]]:
    train = TRAIN.format(call=call, fresh=fresh)
    return project(root, {"model.py": MODEL, "train.py": train}, "TPL201")


def test_a_counting_method_of_the_unwrapped_model_answers_a_number(root: Path) -> None:
    assert _found(root, "raw_model.estimate_mfu(8, dt)") == []


def test_a_model_a_classmethod_builds_is_one_of_its_class(root: Path) -> None:
    assert _found(root, "raw_model.estimate_mfu(8, dt)", fresh="iter_num") == []


def test_a_method_that_runs_the_network_answers_on_the_device(root: Path) -> None:
    assert _found(root, "raw_model.score(x)") == [("train.py", 25)]


def test_a_method_that_hands_back_a_tensor_answers_on_the_device(root: Path) -> None:
    assert _found(root, "raw_model.embedding().sum()") == [("train.py", 25)]


# ---- TPL201: a cast of arithmetic reads a device value only through one of its values

EXTRACT = """\
import torch


def extract(model, loader):
    model.cuda()
    for samples in loader:
        samples = samples.cuda(non_blocking=True)
        feats = model.get_intermediate_layers(samples, n=1)[0]
        h = int({operand} / model.patch_embed.patch_size)
        print(h)
"""


def test_a_cast_of_a_shape_over_a_module_setting_is_clean() -> None:
    """DINO's ``int(samples.shape[-2] / model.patch_embed.patch_size)``: a size over a
    module's setting, no tensor's data."""
    assert lines(EXTRACT.format(operand="samples.shape[-2]"), "TPL201") == []


def test_a_cast_of_an_element_over_a_module_setting_is_found() -> None:
    assert lines(EXTRACT.format(operand="feats[0, 0, 0]"), "TPL201") == [9]
