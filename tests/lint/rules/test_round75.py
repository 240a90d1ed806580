"""Round 75: the grids ``torch.meshgrid`` makes of factories handed to it directly, in a
function that places its own tensors where an input is before handing NumPy back (TPL103);
arithmetic of an attribute the batch loop accumulates device counts into (TPL201)."""

from __future__ import annotations

from .helpers import lines as _lines

GRIDS = """\
import torch


def show_mask(annotation, height, width):
    index = (annotation != 0).to(torch.long).argmax(dim=0)
    show = torch.zeros((height, width, 4)).to(annotation.device)
    h_indices, w_indices = torch.meshgrid(
        torch.arange(height), torch.arange(width), indexing="ij"
    )
    show[h_indices, w_indices, :] = index[h_indices, w_indices, None].float()
    return show.cpu().numpy()
"""


def test_meshgrid_of_host_factories_indexing_placed_tensors() -> None:
    assert _lines(GRIDS, "TPL103") == [8, 8]


def test_a_function_that_never_places_and_hands_back_numpy_is_host_work() -> None:
    host = GRIDS.replace(".to(annotation.device)", "")
    assert _lines(host, "TPL103") == []


TOKENS = """\
import math


class Trainer:
    def train(self, model, loader, optimizer, config, device):
        self.tokens = 0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = model(x, y)
            loss.backward()
            optimizer.step()
            self.tokens += (y >= 0).sum()
            progress = float(self.tokens - config.warmup_tokens) / config.final_tokens
            print(0.5 * (1.0 + math.cos(math.pi * progress)))
"""


def test_arithmetic_of_an_attribute_the_loop_accumulates_into() -> None:
    assert _lines(TOKENS, "TPL201") == [13]


def test_arithmetic_of_settings_alone_is_left_alone() -> None:
    settings = TOKENS.replace(
        "float(self.tokens - config.warmup_tokens)", "float(self.total - config.warmup_tokens)"
    )
    assert _lines(settings, "TPL201") == []
