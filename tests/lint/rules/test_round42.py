"""Corpus round 42: false positives found on NLP fine-tuning scripts (token classification with
a CRF head), diffusion fine-tuning (DreamBooth, LoRA), speech recognition training (an
attention/CTC recogniser, a speech transformer), self-supervised learning (SimCLR, SimSiam,
BYOL), object detection training (an efficient YOLO, an anchor-free mobile detector),
semantic segmentation training, super-resolution and image restoration (SRCNN, VDSR, NAFNet)
and tabular deep learning, each as the look-alike that must stay clean next to the pitfall
that must still be found."""

from __future__ import annotations

from .helpers import lines

# ---- TPL201: `model = model.cpu()` in a script's own loop moves the model, reads nothing

EVAL_SCRIPT = """\
import argparse
import time

import numpy as np
import scipy.io as sio
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--cuda", action="store_true")
opt = parser.parse_args()
cuda = opt.cuda
model = torch.load(opt.model, map_location="cpu", weights_only=False)["model"]
total = 0.0
for image_name in opt.images:
    im_b_y = sio.loadmat(image_name)["im_b_y"].astype(float) / 255.0
    im_input = torch.from_numpy(im_b_y).float().view(1, -1, *im_b_y.shape)
    if cuda:
        model = model.cuda()
        im_input = im_input.cuda()
    else:
        model = model.cpu()
    start_time = time.time()
    HR = model(im_input)
    {read}
"""


def test_model_moved_back_to_the_host_in_a_scripts_loop_is_clean() -> None:
    source = EVAL_SCRIPT.format(read="total += 1.0")
    assert lines(source, "TPL201", "eval.py") == []


def test_output_copied_back_in_a_scripts_loop_is_found() -> None:
    source = EVAL_SCRIPT.format(read="total += float(np.mean(HR.cpu().numpy()))")
    assert lines(source, "TPL201", "eval.py") == [24]


# ---- TPL501: a recurrent state that every forward pass rebuilds on the module's device

DECODER = """\
import torch
import torch.nn as nn


class Decoder(nn.Module):
    def __init__(self, dim, layer):
        super().__init__()
        self.dim, self.layer = dim, layer
        self.layers = nn.LSTM(dim, dim, num_layers=layer, batch_first=True)
        self.hidden_state = None

    def init_state(self, bs):
        device = next(self.parameters()).device
        self.hidden_state = {state}
        return self.hidden_state

    def forward(self, x):
        {step}
        x, self.hidden_state = self.layers(x.unsqueeze(1), self.hidden_state)
        return x


class ASR(nn.Module):
    def __init__(self, dim, layer):
        super().__init__()
        self.decoder = Decoder(dim, layer)

    def forward(self, x):
        {outer}
        return self.decoder(x)
"""

PAIR = (
    "(torch.zeros((self.layer, bs, self.dim), device=device),\n"
    "                             torch.zeros((self.layer, bs, self.dim), device=device))"
)
SINGLE = "torch.zeros((self.layer, bs, self.dim), device=device)"


def test_state_rebuilt_by_the_holding_modules_forward_is_clean() -> None:
    for state in (PAIR, SINGLE):
        source = DECODER.format(state=state, step="pass", outer="self.decoder.init_state(len(x))")
        assert lines(source, "TPL501", "asr.py") == []


def test_state_rebuilt_by_its_own_forward_is_clean() -> None:
    source = DECODER.format(state=PAIR, step="self.init_state(x.shape[0])", outer="pass")
    assert lines(source, "TPL501", "asr.py") == []


def test_state_set_up_once_by_a_caller_outside_any_forward_is_found() -> None:
    source = DECODER.format(state=PAIR, step="pass", outer="pass") + (
        "\n\ndef generate(model, x):\n    model.decoder.init_state(1)\n    return model(x)\n"
    )
    assert lines(source, "TPL501", "asr.py") == [14]


def test_parameters_made_by_each_forward_pass_are_found() -> None:
    state = "[nn.Parameter(torch.zeros(self.dim, device=device)) for _ in range(bs)]"
    source = DECODER.format(state=state, step="pass", outer="self.decoder.init_state(len(x))")
    assert lines(source, "TPL501", "asr.py") == [14]


# ---- TPL201: a loop that retries one pass after an out-of-memory error, leaving on success

EVALUATE = """\
import torch

import lib


@torch.no_grad()
def evaluate(model, X, parts, eval_batch_size, device):
    model.eval()
    predictions = {{}}
    for part in parts:
        while eval_batch_size:
            try:
                loader = lib.IndexLoader(len(X[part]), eval_batch_size, device)
                predictions[part] = torch.cat([model(X[part][i]) for i in loader]).cpu().numpy()
            except RuntimeError as err:
                if not lib.is_oom_exception(err):
                    raise
                eval_batch_size //= 2
{tail}
    return predictions
"""


def test_split_predicted_once_in_an_out_of_memory_retry_loop_is_clean() -> None:
    for tail in ("            else:\n                break", ""):
        source = EVALUATE.format(tail=tail)
        if not tail:  # the `break` ends the `try` body itself
            source = source.replace(".numpy()\n", ".numpy()\n                break\n")
        assert lines(source, "TPL201", "autoint.py") == []


def test_retry_loop_that_goes_on_after_success_is_found() -> None:
    source = EVALUATE.format(tail="            else:\n                eval_batch_size -= 1")
    assert lines(source, "TPL201", "autoint.py") == [14]


def test_retry_loop_that_skips_back_to_its_start_is_found() -> None:
    source = EVALUATE.format(tail="            else:\n                break").replace(
        "                loader = lib",
        "                if part == 'skip':\n"
        "                    continue\n                loader = lib",
    )
    assert lines(source, "TPL201", "autoint.py") == [16]


# ---- TPL201: what `load_state_dict` hands back is the missing and unexpected keys

LORA_LOADS = """\
import logging

import torch
from safetensors.torch import load_file

import lora_sd3

logger = logging.getLogger(__name__)


def main(args, mmdit, encoders):
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    mmdit.to(device)
    for weights_file in args.lora_weights:
        weights_sd = load_file(weights_file)
        lora_model = lora_sd3.create_network(mmdit, weights_sd)
        lora_model.apply_to(encoders, mmdit)
        lora_model.to(device)
        {line}
        logger.info(f"Loaded LoRA weights from {{weights_file}}: {{info}}")
"""


def test_keys_a_load_reports_are_clean() -> None:
    source = LORA_LOADS.format(line="info = lora_model.load_state_dict(weights_sd, strict=True)")
    assert lines(source, "TPL201", "minimal_inference.py") == []


def test_weights_read_from_the_moved_model_are_found() -> None:
    source = LORA_LOADS.format(line="info = lora_model(weights_sd['x'].to(device))")
    assert lines(source, "TPL201", "minimal_inference.py") == [20]


# ---- TPL402: the older torch's spelling of a load whose other branch chooses `weights_only`

CACHED_DATASET = """\
import torch


def load_cached(cache_dir, tag):
    torch_version = torch.__version__
    if torch_version < "2.6":
        dataset = torch.load(cache_dir / f"{{tag}}_dataset")
    {other}
    return dataset
"""


def test_load_for_an_older_torch_beside_an_explicit_choice_is_clean() -> None:
    for choice in ("False", "True"):
        other = (
            'elif torch_version >= "2.6":\n'
            f'        dataset = torch.load(cache_dir / f"{{tag}}_dataset", weights_only={choice})'
        )
        source = CACHED_DATASET.format(other=other)
        assert lines(source, "TPL402", "datamodule.py") == []


def test_load_under_a_version_test_with_no_choice_anywhere_is_found() -> None:
    other = 'else:\n        dataset = torch.load(cache_dir / f"{tag}_dataset", map_location="cpu")'
    source = CACHED_DATASET.format(other=other)
    assert lines(source, "TPL402", "datamodule.py") == [7, 9]


def test_load_under_another_test_beside_an_explicit_choice_is_found() -> None:
    other = 'else:\n        dataset = torch.load(cache_dir / f"{tag}_dataset", weights_only=False)'
    source = CACHED_DATASET.format(other=other).replace(
        'if torch_version < "2.6":', "if tag == 'train':"
    )
    assert lines(source, "TPL402", "datamodule.py") == [7]
