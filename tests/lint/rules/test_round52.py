"""Round 52: a lambda that ``map`` applies right there runs on each element it is given, in
the step around it (denoising-diffusion-pytorch's elucidated sampler: ``sigma, sigma_next,
gamma = map(lambda t: t.item(), (sigma, sigma_next, gamma))`` on rows of a device schedule,
every sampling step). Its read of the parameter is a read of those elements (TPL201). A
lambda handed on to run later (a sort key, a callback) is still left alone, and so is a map
over host values."""

from __future__ import annotations

from .helpers import lines

SAMPLER = """\
import torch
from torch import nn


class ElucidatedDiffusion(nn.Module):
    @property
    def device(self):
        return next(self.net.parameters()).device

    @torch.no_grad()
    def sample(self, shape, n):
        sigmas = torch.linspace(1.0, 0.0, n, device=self.device)
        gammas = torch.where(sigmas > 0.1, 0.5, 0.0)
        pairs = list(zip(sigmas[:-1], sigmas[1:], gammas[:-1]))
        images = sigmas[0] * torch.randn(shape, device=self.device)
        for sigma, sigma_next, gamma in pairs:
            sigma, sigma_next, gamma = map(lambda t: t.item(), (sigma, sigma_next, gamma))
            images = self.net(images, sigma) * sigma_next + gamma
        return images
"""

LOSSES = """\
import torch


def train(model, loader, optimizer, device):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        losses = model(x, y)
        sum(losses).backward()
        optimizer.step()
        values = list(map(lambda l: l.item(), losses))
        history.append(values)
"""


def test_map_lambda_read_of_device_elements_reported() -> None:
    assert lines(SAMPLER, "TPL201") == [17]


def test_map_lambda_over_a_list_of_device_losses_reported() -> None:
    assert lines(LOSSES, "TPL201") == [10]


def test_map_lambda_over_host_values_clean() -> None:
    host = SAMPLER.replace("(sigma, sigma_next, gamma))", "(float(i), 1.0, 2.0))").replace(
        "for sigma, sigma_next, gamma in pairs:", "for i in range(n):"
    )
    assert lines(host, "TPL201") == []


def test_sort_key_lambda_reads_each_item_there() -> None:
    # a sort calls its key once per item right away, as map does (round 86)
    keyed = LOSSES.replace(
        "list(map(lambda l: l.item(), losses))", "sorted(losses, key=lambda l: l.item())"
    )
    assert lines(keyed, "TPL201") == [10]


def test_lambda_stored_for_later_still_left_alone() -> None:
    later = LOSSES.replace(
        "values = list(map(lambda l: l.item(), losses))", "values = lambda: losses[0].item()"
    )
    assert lines(later, "TPL201") == []


def test_map_lambda_reading_another_name_left_alone() -> None:
    other = LOSSES.replace(
        "map(lambda l: l.item(), losses)", "map(lambda l: y.sum().item(), losses)"
    )
    assert lines(other, "TPL201") == []
