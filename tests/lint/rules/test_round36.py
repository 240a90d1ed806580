"""Corpus round 36: false positives found on scientific ML, biology, climate, time-series,
point-cloud, Kaggle and LLM-inference code (neural operators, protein language and design
models, a weather foundation model, forecasting libraries, speculative decoding, streaming
attention, point-cloud classifiers), each as the look-alike that must stay clean next to the
pitfall that must still be found.

Tried and kept as findings: per-step ``.item()``/``.cpu()`` reads in training and evaluation
loops, a ``.cuda()`` chosen by a device-type conditional expression (the current device, not
the configured one's index), ``torch.randint`` index tensors in ProbSparse attention, factories
moved to a module-level device, ``device="cuda"`` parameter defaults that place tensors, and
``torch.load`` without ``map_location``/``weights_only``."""

from __future__ import annotations

import json

from .helpers import lines, notebook_cells

# ---- TPL501: a plain list of modules that hold nothing (moving averages over AvgPool1d)

DECOMPOSITION = """\
import torch
import torch.nn as nn


class moving_avg(nn.Module):
    def __init__(self, kernel_size, stride):
        super(moving_avg, self).__init__()
        self.kernel_size = kernel_size
        self.avg = nn.AvgPool1d(kernel_size=kernel_size, stride=stride, padding=0)

    def forward(self, x):
        front = x[:, 0:1, :].repeat(1, (self.kernel_size - 1) // 2, 1)
        x = torch.cat([front, x], dim=1)
        return self.avg(x.permute(0, 2, 1)).permute(0, 2, 1)


class series_decomp(nn.Module):
    def __init__(self, kernel_size):
        super(series_decomp, self).__init__()
        self.moving_avg = moving_avg(kernel_size, stride=1)
{extra}
    def forward(self, x):
        moving_mean = self.moving_avg(x)
        return x - moving_mean, moving_mean


class series_decomp_multi(nn.Module):
    def __init__(self, kernel_size):
        super(series_decomp_multi, self).__init__()
        self.series_decomp = [series_decomp(kernel) for kernel in kernel_size]
        self.activations = [nn.ReLU(), nn.GELU()]

    def forward(self, x):
        parts = [func(x) for func in self.series_decomp]
        return sum(p[0] for p in parts) / len(parts)
"""


def test_decompositions_that_hold_nothing_are_clean() -> None:
    assert lines(DECOMPOSITION.format(extra=""), "TPL501", "decomp.py") == []


def test_decompositions_that_learn_are_found() -> None:
    extra = "        self.proj = nn.Linear(kernel_size, kernel_size)\n"
    assert lines(DECOMPOSITION.format(extra=extra), "TPL501", "decomp.py") == [31]


def test_decompositions_with_a_mode_switch_are_found() -> None:
    extra = "        self.drop = nn.Dropout(0.1)\n"
    assert lines(DECOMPOSITION.format(extra=extra), "TPL501", "decomp.py") == [31]


def test_decompositions_that_read_the_training_flag_are_found() -> None:
    extra = "        self.jitter = 0.1 if self.training else 0.0\n"
    assert lines(DECOMPOSITION.format(extra=extra), "TPL501", "decomp.py") == [31]


def test_decompositions_that_keep_a_tensor_are_found() -> None:
    extra = "        self.weights = torch.ones(kernel_size)\n"
    assert 31 in lines(DECOMPOSITION.format(extra=extra), "TPL501", "decomp.py")


def test_a_stored_argument_run_as_a_module_is_found() -> None:
    source = DECOMPOSITION.replace(
        "    def __init__(self, kernel_size):\n        super(series_decomp, self).__init__()",
        "    def __init__(self, kernel_size, head=None):\n"
        "        super(series_decomp, self).__init__()\n"
        "        self.head = head",
    ).replace("moving_mean = self.moving_avg(x)", "moving_mean = self.head(self.moving_avg(x))")
    assert lines(source.format(extra=""), "TPL501", "decomp.py") == [31]


def test_dropout_in_a_plain_list_is_found() -> None:
    source = DECOMPOSITION.format(extra="").replace("nn.GELU()", "nn.Dropout(0.1)")
    assert lines(source, "TPL501", "decomp.py") == [31]


# ---- TPL000: notebook cells the editor marks as another language


def _notebook(*cells: tuple[str, str | None]) -> bytes:
    """A notebook of code cells, each with the VS Code language it is marked with (or none)."""
    document = {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {} if language is None else {"vscode": {"languageId": language}},
                "source": source,
            }
            for source, language in cells
        ],
        "metadata": {"language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(document).encode()


SHELL = "model_name=TimesNet\n\npython -u run.py \\\n  --task_name long_term_forecast \\\n  --d_model 16\n"
LOG = "Epoch: 1, Steps: 264 | Train Loss: 0.4964185 Vali Loss: 0.8412074\n"
TRAIN = "import torch\nmodel = torch.nn.Linear(4, 4).cuda()\nstate = torch.load('ckpt.pth')\n"


def test_cells_marked_as_shell_or_plain_text_are_not_parsed() -> None:
    raw = _notebook((TRAIN, None), (SHELL, "shellscript"), (LOG, "plaintext"))
    assert notebook_cells(raw, "TPL000") == []


def test_the_same_cells_unmarked_are_syntax_errors() -> None:
    raw = _notebook((TRAIN, None), (SHELL, None), (LOG, "python"))
    assert notebook_cells(raw, "TPL000") == [(2, 3), (3, 1)]


def test_python_cells_beside_marked_ones_are_still_linted() -> None:
    raw = _notebook((SHELL, "shellscript"), (TRAIN, "python"))
    assert notebook_cells(raw, "TPL402") == [(2, 3)]


def test_a_marked_cell_hides_its_code_from_the_rules() -> None:
    raw = _notebook((TRAIN, "plaintext"))
    assert notebook_cells(raw, "TPL402") == []
