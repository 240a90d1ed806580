"""Corpus round 35: false positives found on generative media and 3D code (diffusion
pipelines and samplers, video generation, super-resolution, NeRF, speech and music), each as
the look-alike that must stay clean next to the pitfall that must still be found."""

from __future__ import annotations

from .helpers import lines


def _lines(source: str, code: str, path: str = "tiles.py") -> list[int]:
    return lines(source, code, path)


# ---- TPL103: a helper's CPU grid handed back through helpers to a caller that places it

BLEND_WEIGHTS = """\
import torch
from torch import nn


class TiledDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(4, 4, 1)

    def grid(self, rows, cols):
        r = torch.arange(rows).view(rows, 1, 1).expand(rows, cols, 1)
        c = torch.arange(cols).view(1, cols, 1).expand(rows, cols, 1)
        both = torch.cat([r, c], dim=-1)
        return both

    def edge_distance(self, rows, cols):
        far = torch.tensor([rows - 1, cols - 1]).view(1, 1, 2)
        scaled = self.grid(rows, cols) / far
        near = torch.min(scaled, dim=-1)[0]
        return near

    def blend(self, rows, cols, device):
        weights = self.edge_distance(rows, cols)
        weights = torch.clamp(weights, 0.05, 0.5)
        weights = weights.reshape(1, 1, rows, cols){placed}
        return weights

    def forward(self, x):
        return self.proj(x) * self.blend(x.shape[2], x.shape[3], x.device)
"""


def test_blend_weights_left_on_the_cpu_are_found() -> None:
    assert _lines(BLEND_WEIGHTS.format(placed=""), "TPL103") == [11, 12, 17]


def test_blend_weights_placed_by_the_caller_of_the_caller_are_clean() -> None:
    assert _lines(BLEND_WEIGHTS.format(placed=".to(device)"), "TPL103") == []


# ---- TPL201: a step count kept on the trainer, looked up among a few chosen steps

GROW_GRID = """\
import numpy as np
import torch


class GridTrainer:
    def __init__(self, model, optimizer, device, grow_at):
        self.model = model.to(device)
        self.optimizer = optimizer
        self.device = device
        self.grow_at = grow_at
        self.step = 0

    def epoch(self, loader):
        for rays, pixels in loader:
{counter}
            loss = ((self.model(rays.to(self.device)) - pixels.to(self.device)) ** 2).mean()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            if self.step in self.grow_at:
                bounds = self.model.bounds.cpu().numpy()
                self.model.grow(np.prod(bounds[3:] - bounds[:3]))
"""


def test_a_bounds_read_under_a_test_of_an_unstepped_count_is_found() -> None:
    source = GROW_GRID.format(counter="            self.step = len(self.grow_at)")
    assert _lines(source, "TPL201", "trainer.py") == [21]


def test_a_bounds_read_on_a_few_chosen_steps_of_a_stepped_count_is_clean() -> None:
    source = GROW_GRID.format(counter="            self.step += 1")
    assert _lines(source, "TPL201", "trainer.py") == []


# ---- TPL501: a tensor attribute that the constructor itself turns into a Python list

POSITIONAL = """\
import torch
from torch import nn


class Positional(nn.Module):
    def __init__(self, n_freqs, log_sampling=True):
        super().__init__()
        if log_sampling:
            self.bands = 2.0 ** torch.linspace(0.0, n_freqs - 1, n_freqs)
        else:
            self.bands = torch.linspace(1.0, 2.0 ** (n_freqs - 1), n_freqs)
{after}

    def forward(self, x):
        return torch.cat([torch.sin(x * b) for b in self.bands], dim=-1)
"""


def test_a_band_tensor_kept_as_a_plain_attribute_is_found() -> None:
    source = POSITIONAL.format(after="        self.bands = self.bands * 2")
    assert _lines(source, "TPL501", "embed.py") == [9, 11]


def test_a_band_tensor_the_constructor_turns_into_a_list_is_clean() -> None:
    source = POSITIONAL.format(after="        self.bands = self.bands.numpy().tolist()")
    assert _lines(source, "TPL501", "embed.py") == []
