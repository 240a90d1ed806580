"""Corpus round 25: false positives found on speech, text, OCR, tabular, continual and federated
learning, NeRF, medical-imaging and image-processing library code, each as the look-alike that
must stay clean next to the pitfall that must still be found."""

from __future__ import annotations

from torchplace.lint import lint_source


def _lines(source: str, code: str, path: str = "layers.py") -> list[int]:
    return [f.line for f in lint_source(source, path, select={code})]


# ---- TPL103: an empty placeholder (a shape with a literal 0) holds no element

EMBED = """\
import torch
import torch.nn as nn


class Embed(nn.Module):
    def forward(self, x):
        cont = x.get("continuous", torch.empty(0, 0))
        cache = (torch.empty(0, 0, 0, 0), torch.zeros((0, 4)))
        freed = torch.Tensor(0)
        return cont, cache, freed
"""


def test_an_empty_placeholder_is_left_alone() -> None:
    assert _lines(EMBED, "TPL103") == []


def test_a_placeholder_with_elements_is_reported() -> None:
    source = EMBED.replace("torch.empty(0, 0))", "torch.empty(1, 4))")
    assert _lines(source, "TPL103") == [7]


# ---- TPL103: a copy constructor around a factory, placed as a whole

PAD = """\
import torch
import torch.nn as nn


class Path(nn.Module):
    def forward(self, x):
        pad = torch.Tensor(torch.zeros(2, 3)).type(x.dtype).to(x.device)
        return torch.cat([pad, x])
"""


def test_a_copied_factory_placed_as_a_whole_is_left_alone() -> None:
    assert _lines(PAD, "TPL103") == []


def test_a_copied_factory_left_unplaced_is_reported() -> None:
    source = PAD.replace(".type(x.dtype).to(x.device)", "")
    assert _lines(source, "TPL103") == [7, 7]  # the copy and the factory inside it


# ---- TPL103: a random draw whose elements the host reads as numbers (layer drop, crop sizes)

LAYER_DROP = """\
import torch
import torch.nn as nn


class Encoder(nn.Module):
    def forward(self, x, w):
        keep = torch.rand(len(self.layers))
        r = torch.rand(2)
        left = int((w - 4) * r[0])
        for i, layer in enumerate(self.layers):
            if not self.training or keep[i] > self.p:
                x = layer(x[..., left:])
        return x
"""


def test_a_draw_read_element_by_element_on_the_host_is_left_alone() -> None:
    assert _lines(LAYER_DROP, "TPL103") == []


def test_a_draw_whose_elements_meet_the_input_is_reported() -> None:
    source = LAYER_DROP.replace("x = layer(x[..., left:])", "x = layer(x) * keep[i]")
    assert _lines(source, "TPL103") == [7]


# ---- TPL501: `torch.tensor(p)` under `if isinstance(p, float):` is 0-dim

RESCALE = """\
from typing import Union

import torch
import torch.nn as nn


class Rescale(nn.Module):
    def __init__(self, factor: Union[float, torch.Tensor]) -> None:
        super().__init__()
        if isinstance(factor, float):
            self.factor = torch.tensor(factor)
        else:
            self.factor = factor

    def forward(self, x):
        return x * self.factor
"""


def test_a_tensor_of_a_parameter_narrowed_to_a_number_is_left_alone() -> None:
    assert _lines(RESCALE, "TPL501") == []


def test_a_tensor_of_a_parameter_narrowed_to_a_list_is_reported() -> None:
    source = RESCALE.replace("isinstance(factor, float)", "isinstance(factor, list)")
    assert _lines(source, "TPL501") == [11]


# ---- TPL601: a GUI's `test_step` method is not a test; a unittest case's method is

GUI = """\
import torch


class Viewer:
    def test_step(self):
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        return self.render()
"""


def test_a_test_named_method_of_a_program_is_left_alone() -> None:
    assert _lines(GUI, "TPL601", "gui.py") == []


def test_a_test_method_of_a_unittest_case_is_reported() -> None:
    source = "import unittest\n" + GUI.replace("class Viewer:", "class Viewer(unittest.TestCase):")
    assert _lines(source, "TPL601", "gui.py") == [7]


def test_a_module_level_test_function_is_reported() -> None:
    source = """\
import torch


def test_speed():
    start = torch.cuda.Event(enable_timing=True)
    start.record()
"""
    assert _lines(source, "TPL601", "bench.py") == [5]


# ---- TPL401: a learning-rate schedule's class restores its own state

SCHEDULE = """\
import torch


class NoamScheduler:
    def save(self, path):
        torch.save({"lr": self.lr, "step": self.step}, path)

    def load(self, path, device=None):
        data = torch.load(path)
        self.lr = data["lr"]
"""


def test_a_schedule_restoring_its_own_state_is_left_alone() -> None:
    assert _lines(SCHEDULE, "TPL401", "schedulers.py") == []


def test_a_model_class_loading_its_weights_is_reported() -> None:
    source = SCHEDULE.replace("NoamScheduler", "Recognizer")
    assert _lines(source, "TPL401", "schedulers.py") == [9]


# ---- TPL201: a tokenizer's `detokenize` gives text

DECODE = """\
import torch


def recognize(model, loader, tokenizer, device):
    model.to(device)
    for feats in loader:
        hyps = model.decode(feats.to(device))
        for tokens in hyps:
            print("{}".format(tokenizer.detokenize(tokens)[0]))
            print("{}".format(tokens[0]))
"""


def test_detokenized_text_printed_per_hypothesis_is_left_alone() -> None:
    assert _lines(DECODE, "TPL201", "recognize.py") == [10]
