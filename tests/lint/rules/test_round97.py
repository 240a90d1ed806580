"""Round 97, what the whole corpus and round 45 showed."""

from __future__ import annotations

from .helpers import lines as _lines

LEARNING_RATE = """\
import logging

import torch


def train(model, loader, build_optimizer, build_lr_scheduler, epochs, noise_scheduler):
    model.to(torch.device("cuda"))
    optimizer = build_optimizer(model)
    lr_scheduler = build_lr_scheduler(optimizer)
    for epoch in range(epochs):
        for x, y in loader:
            loss = model(x.cuda()).sub(y.cuda()).pow(2).mean()
            loss.backward()
            optimizer.step()
            lr = lr_scheduler.get_epoch_values(epoch + 1)[0]
            logging.info(f"lr: {lr}")
            step = noise_scheduler.get_velocity(loss, x.cuda(), y.cuda())
            logging.info(f"velocity: {step}")
"""


def test_a_learning_rate_schedulers_getters_answer_python_floats() -> None:
    assert _lines(LEARNING_RATE, "TPL201") == [18]


GLOBAL_DEVICE = """\
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
fallback = "cuda" if torch.cuda.is_available() else "cpu"


class Decoder(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.kernel = torch.ones(3, 3).to(device)
        self.embed = nn.Embedding(n, 8)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=fallback)
        return self.embed(idx) + self.embed(pos)


model = Decoder(10).to(device)
"""


def test_a_module_global_chosen_by_the_machine_is_a_hard_coded_device_in_a_module() -> None:
    assert _lines(GLOBAL_DEVICE, "TPL102") == [11, 16]


CLOSURE = """\
import torch


def sample(model, x, steps):
    model.cuda()
    x = x.cuda()
    alphas = torch.linspace(0.1, 0.9, steps, device="cuda")
    for index in range(steps):
        x = step(model, x, index, alphas)
    return x


def step(model, x, index, alphas):
    b = x.shape[0]

    def update(e_t):
        a_t = torch.full((b, 1), alphas[index], device=x.device)
        return x - a_t * e_t

    return update(model(x))
"""


def test_a_nested_function_reads_the_enclosing_functions_names() -> None:
    assert _lines(CLOSURE, "TPL201") == [17]


FORECAST = """\
import numpy as np
import torch


def forecast(model, first, steps):
    device = torch.device("cuda")
    seq = torch.zeros((steps, *first.shape)).to(device)
    x = first.to(device)
    for i in range(steps):
        x = model(x)
        seq[i] = x
    seq = seq.cpu().numpy()
    return np.expand_dims(seq, 0)


def main(model, starts):
    model.cuda()
    runs = []
    for first in starts:
        runs.append(forecast(model, first.cuda(), 20))
    return np.concatenate(runs)
"""


def test_a_read_once_after_a_functions_own_loop_of_steps_is_not_per_batch() -> None:
    assert _lines(FORECAST, "TPL201") == []


GPU_LIST = """\
import argparse

import torch


def main(model_file, build):
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=str)
    args = parser.parse_args()
    config = {"GPUS": "0"}
    if args.gpus:
        config["GPUS"] = args.gpus
    model = build()
    model.load_state_dict(torch.load(model_file))
    gpus = [int(i) for i in config["GPUS"].split(",")]
    return torch.nn.DataParallel(model, device_ids=gpus).cuda()
"""


def test_a_gpu_list_option_copied_into_the_settings_leaves_no_cpu_path() -> None:
    assert _lines(GPU_LIST, "TPL401") == []


TORCHVISION_BASE = """\
from torchvision.models import ResNet
from torchvision.models.resnet import Bottleneck


class ReIDNetwork(ResNet):
    def __init__(self):
        super().__init__(Bottleneck, [3, 4, 6, 3])

    def sum_losses(self, x, labels):
        return (self(x) - labels.cuda()).pow(2).mean()
"""


def test_a_torchvision_model_subclass_is_a_module() -> None:
    assert _lines(TORCHVISION_BASE, "TPL102") == [10]


ERROR_DETAIL = """\
import torch


def train(model, loader, opt):
    model.cuda()
    for x, y in loader:
        loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
        loss.backward()
        norms = torch.stack([p.grad.norm() for p in model.parameters()])
        if not bool(torch.isfinite(norms).all()):
            detail = "\\n".join(f"{r}: {n:.8f}" for r, n in enumerate(norms.tolist()))
            raise FloatingPointError(detail)
        opt.step()
"""


def test_a_read_walked_once_by_a_failure_branchs_message_is_rare() -> None:
    assert _lines(ERROR_DETAIL, "TPL201") == [10]
