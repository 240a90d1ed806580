"""Corpus round 24: false positives found on deployment and optimization code (post-training
quantization, pruning, distillation, export), each as the look-alike that must stay clean next
to the pitfall that must still be found."""

from __future__ import annotations

from torchplace.lint import lint_source


def _lines(source: str, code: str, path: str = "quant.py") -> list[int]:
    return [f.line for f in lint_source(source, path, select={code})]


# ---- TPL201: a loop over a mapping it indexes by its own target walks the mapping's keys

QUANTIZE = """\
import torch
from modelutils import find_layers


def quantize(layers, dev):
    for i in range(len(layers)):
        layer = layers[i].to(dev)
        subset = find_layers(layer)
        gptq = {}
        for name in subset:
            gptq[name] = GPTQ(subset[name])
        for name in subset:
            print(i, name)
            gptq[name].fasterquant()
"""


def test_the_names_of_a_mapping_of_layers_are_left_alone() -> None:
    assert _lines(QUANTIZE, "TPL201") == []


def test_the_rows_of_a_device_tensor_printed_in_a_loop_are_reported() -> None:
    source = """\
import torch


def quantize(layers, inps, dev):
    for i in range(len(layers)):
        layer = layers[i].to(dev)
        out = layer(inps.to(dev))
        for row in out:
            print(i, row)
"""
    assert _lines(source, "TPL201") == [9]


# ---- TPL103: a factory drawn from by a torch sampler and read back as a Python number

MIXUP = """\
import torch
import torch.nn as nn


class RandomMixup(nn.Module):
    def forward(self, batch):
        lam = float(torch._sample_dirichlet(torch.tensor([self.alpha, self.alpha]))[0])
        return batch.mul_(lam)
"""


def test_a_sampler_draw_read_back_as_a_number_is_left_alone() -> None:
    assert _lines(MIXUP, "TPL103") == []


def test_a_sampler_draw_kept_as_a_tensor_is_reported() -> None:
    source = MIXUP.replace(
        "float(torch._sample_dirichlet(torch.tensor([self.alpha, self.alpha]))[0])",
        "torch._sample_dirichlet(torch.tensor([self.alpha, self.alpha]))[0]",
    )
    assert _lines(source, "TPL103") == [7]


# ---- TPL403: a load inside a loop of one step (a progress bar around one checkpoint load)

LOAD_BAR = """\
import torch
from tqdm import tqdm


def load_checkpoint(model, checkpoint):
    pbar = tqdm(range(1))
    pbar.set_description("Loading checkpoint")
    for i in pbar:
        model.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
    return model
"""


def test_a_load_behind_a_one_step_progress_bar_is_left_alone() -> None:
    assert _lines(LOAD_BAR, "TPL403") == []


def test_a_load_inside_a_loop_of_many_steps_is_reported() -> None:
    source = LOAD_BAR.replace("tqdm(range(1))", "tqdm(range(steps))").replace(
        "(model, checkpoint)", "(model, checkpoint, steps)"
    )
    assert _lines(source, "TPL403") == [9]
