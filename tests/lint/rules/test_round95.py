"""Round 95, what the older corpus and round 38 showed: a tokenizer's call
(``clip.tokenize(texts)``, ``self.model.tokenizer(prompts)``) builds new host tensors, never
pinned, so a ``non_blocking=True`` copy of what it returns cannot overlap (TinyCLIP's zero-shot
classifier, stable-audio-tools' CLAP conditioner)."""

from __future__ import annotations

from torchplace.lint import lint_source

from .helpers import lines as _lines

TOKENS = """\
import torch
from open_clip import tokenize


def classifier(model, classnames, templates):
    weights = []
    for classname in classnames:
        texts = tokenize([t.format(classname) for t in templates]).cuda(non_blocking=True)
        weights.append(model.encode_text(texts))
    return torch.stack(weights)


class Conditioner(torch.nn.Module):
    def clap_features(self, prompts, device):
        tokens = self.model.tokenizer(prompts)
        mask = tokens["attention_mask"].to(device=device, non_blocking=True)
        ids = tokens["input_ids"].to(device=device, non_blocking=True)
        return self.model.text_branch(input_ids=ids, attention_mask=mask)

    def pinned(self, prompts, device):
        tokens = self.model.tokenizer(prompts)
        ids = tokens["input_ids"].pin_memory().to(device=device, non_blocking=True)
        return self.model.text_branch(input_ids=ids)
"""


def test_a_tokenizers_output_is_pageable() -> None:
    assert _lines(TOKENS, "TPL701") == [8, 16, 17]


WINDOWS = """\
import torch
from tqdm import tqdm


def kl_divergence(ref_model, eval_model, tokenizer, seqlen, text):
    data = tokenizer(text, return_tensors="pt").input_ids.to(ref_model.device)
    top1 = 0
    with tqdm(range(data.numel() // seqlen)) as progress:
        for i in progress:
            start = i * seqlen
            end = min(start + seqlen, data.numel())
            window = data[:, start:end]
            y1, y2 = ref_model(window)[0], eval_model(window)[0]
            top1 += (y1.argmax(-1) == y2.argmax(-1)).sum().item()
    return top1
"""


def test_a_window_sliced_by_offsets_of_the_step_makes_a_batch_loop() -> None:
    # AutoAWQ's KL-divergence evaluation: `start = i * seqlen`, then `data[:, start:end]`
    assert _lines(WINDOWS, "TPL201") == [14]


LAYERS = """\
import torch
from torch import nn
from typing import Sequence


def update_outs(layer: nn.Module, inps: torch.Tensor, device) -> Sequence[float]:
    losses = []
    for j in range(len(inps)):
        losses.append(layer(inps[j].to(device)).square().mean().item())
    return losses


def quantize(layers, inps, device):
    bits = 0
    for index in range(len(layers)):
        original = next(layers[index].parameters()).device
        layer = layers[index].to(device)
        print(layer)
        losses = update_outs(layer, inps, device)
        print(torch.mean(torch.Tensor(losses)).item())
        bits += torch.numel(layer.weight) * 4
        print(int(bits / 8))
        layers[index] = layer.to(original)
    for index in range(len(layers)):
        layer = layers[index].to(device)
        update_outs(layer, inps, device)
        layers[index] = layer.cpu()
"""


def test_a_module_is_neither_printed_nor_copied_as_a_tensor() -> None:
    # AQLM's layer-by-layer quantization: a layer whose parameters the loop asks for, or that
    # it hands to a function taking an `nn.Module`, is printed and offloaded as a module; a
    # function annotated `-> Sequence[float]` answers with host numbers; `torch.numel` counts
    assert _lines(LAYERS, "TPL201") == [9]


SAFE = """\
from contextlib import nullcontext

import torch


def load_cavs(path):
    if hasattr(torch.serialization, "safe_globals"):
        ctx = torch.serialization.safe_globals([dict])
    else:
        ctx = nullcontext()
    with ctx:
        return torch.load(path, map_location="cpu")
"""


def test_a_safe_globals_block_entered_through_a_name_decides_weights_only() -> None:
    assert _lines(SAFE, "TPL402") == []


TIMERS = """\
import torch

net = make_net()
starter, ender = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
torch.cuda.synchronize()
"""


def test_the_first_cuda_only_call_of_a_tuple_is_the_one_reported() -> None:
    # hlb-CIFAR10: the first `Event` raises before the second, or the synchronize, runs
    assert [f.col for f in lint_source(TIMERS, "train.py", select={"TPL601"})] == [18]


DRAWS = """\
import torch


def kernel_shap_perturb(original_inp, num_features, distribution):
    device = original_inp.device
    while True:
        selected = distribution.sample()
        rand_vals = torch.randn(1, num_features)
        threshold = torch.kthvalue(rand_vals, num_features - selected).values.item()
        yield (rand_vals > threshold).to(device=device).long()
"""


def test_an_op_on_a_host_tensor_runs_on_the_host() -> None:
    # captum's KernelSHAP sampler: whatever `k` is, `kthvalue` of a host draw is on the host
    assert _lines(DRAWS, "TPL201") == []
