"""Round 72 (TPL201): ``any()`` over a test of each parameter's gradient; a ``GradScaler``
bound as one arm of a choice; a NumPy array set through a setter that moves tensors only."""

from __future__ import annotations

from .helpers import lines as _lines

EACH_PARAMETER = """\
import torch


class Trainer:
    def __init__(self, net):
        self.model = net.cuda()
        self.model_params = list(self.model.parameters())

    def run_step(self, data):
        loss = self.model(data)
        loss.backward()
        if not any(not p.grad.isfinite().all() for p in self.model_params):
            self.optimizer.step()
"""


def test_any_over_a_test_of_each_parameter_is_a_read_per_parameter() -> None:
    assert _lines(EACH_PARAMETER, "TPL201") == [12]


def test_any_over_values_that_are_not_parameters_is_left_alone() -> None:
    names = EACH_PARAMETER.replace("for p in self.model_params", "for p in self.names")
    assert _lines(names, "TPL201") == []


SCALER = """\
import torch


class Trainer:
    def __init__(self, net, fp16):
        self.model = net.cuda()
        self.scaler = torch.GradScaler() if fp16 else None

    def run_step(self, data):
        loss = self.model(data)
        self.scaler.scale(loss).backward()
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return scale
"""


def test_a_grad_scaler_bound_as_an_arm_of_a_choice() -> None:
    assert _lines(SCALER, "TPL201") == [12]


def test_get_scale_of_something_else_is_left_alone() -> None:
    other = SCALER.replace("torch.GradScaler() if fp16 else None", "Scaler()")
    assert _lines(other, "TPL201") == []


SETTER = """\
import numpy as np
import torch


def schedule(alphacums, steps):
    alphas = alphacums[steps]
    alphas_prev = np.asarray([alphacums[0]] + alphacums[steps[:-1]].tolist())
    return alphas, alphas_prev


class Sampler:
    def __init__(self, model):
        self.model = model

    def register_buffer(self, name, attr):
        if type(attr) == torch.Tensor:
            if attr.device != torch.device("cuda"):
                attr = attr.to(torch.device("cuda"))
        setattr(self, name, attr)

    def make_schedule(self, steps):
        alphas, alphas_prev = schedule(self.model.alphas_cumprod.cpu(), steps)
        self.register_buffer("ddim_alphas", alphas)
        self.register_buffer("ddim_alphas_prev", alphas_prev)

    def sample(self, x, steps, device):
        for index in range(steps):
            a_t = torch.full((1,), self.ddim_alphas[index], device=device)
            a_prev = torch.full((1,), self.ddim_alphas_prev[index], device=device)
            x = x * a_t + a_prev
        return x
"""


def test_a_numpy_array_through_a_setter_that_moves_tensors_only_stays_on_the_host() -> None:
    assert _lines(SETTER, "TPL201") == [28]


def test_a_setter_that_moves_whatever_it_is_given_places_it() -> None:
    moves_all = SETTER.replace("        if type(attr) == torch.Tensor:\n", "        if True:\n")
    assert _lines(moves_all, "TPL201") == [28, 29]
