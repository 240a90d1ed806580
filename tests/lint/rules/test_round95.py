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


TRAINER = """\
import torch


class Trainer:
    def __init__(self, model, criterion, optimizer, loader, device):
        self.model, self.criterion, self.optimizer = model, criterion, optimizer
        self.loader, self.device = loader, device
        self.total = {"mel": 0.0}

    def _train_epoch(self):
        for batch in self.loader:
            self._train_step(batch)

    def _train_step(self, batch):
        x, y, lengths = self._parse_batch(batch)
        mel_loss = self.criterion["mel"](self.model["generator"](*x), y)
        self.total["mel"] += mel_loss.item()
        print(lengths.item())
        self.optimizer["generator"].zero_grad()
        mel_loss.backward()
        self.optimizer["generator"].step()

    def _parse_batch(self, batch):
        inputs, targets = batch
        lengths = torch.tensor([len(t) for t in targets])
        if isinstance(inputs, torch.Tensor):
            x = [inputs.to(self.device)]
        else:
            x = [None if x is None else x.to(self.device) for x in inputs]
        return x, targets.to(self.device), lengths
"""


def test_a_criterion_kept_in_a_dict_runs_on_what_a_method_moves() -> None:
    # ParallelWaveGAN's trainer: `self._parse_batch(batch)` hands back the batch it moves
    # (not the host lengths it counts beside it), and `self.criterion["mel"](y_, y)` runs on it
    assert _lines(TRAINER, "TPL201") == [17]


COACH = """\
import torch
import torch.nn.functional as F


class LPIPS(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x, y):
        return self.lin(x - y).mean()


class Coach:
    def __init__(self, net, loader, device):
        self.net, self.loader, self.device = net.to(device), loader, device
        self.lpips_loss = LPIPS().to(self.device).eval()
        self.optimizer = torch.optim.Adam(self.net.parameters())

    def train(self):
        for x, y in self.loader:
            x, y = x.to(self.device), y.to(self.device)
            loss, logs = self.calc_loss(y, self.net(x))
            loss.backward()
            self.optimizer.step()

    def calc_loss(self, y, y_hat):
        logs = {}
        loss_lpips = self.lpips_loss(y_hat, y)
        logs["loss_lpips"] = float(loss_lpips)
        return loss_lpips, logs
"""


def test_the_output_of_a_module_the_class_builds_is_a_tensor() -> None:
    # pixel2style2pixel's coach: `float()` of what its LPIPS loss module answers, per batch
    assert _lines(COACH, "TPL201") == [30]


OBSERVER = """\
from typing import Optional

import torch
import torch.distributed as dist


class AWQObserver(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor]):
        super().__init__()
        self.weight, self.bias = weight, bias
        self.bias = bias
        self.device = self.weight.device
        if self.bias is not None:
            self.bias.to(self.device)

    def calculate_qparams(self):
        if self.bias is not None:
            self.bias = self.bias.to(self.device)


def sync_found_inf(per_device):
    for v in per_device.values():
        v_on_cuda = v.cuda()
        dist.all_reduce(v_on_cuda, async_op=True)
        v_on_cuda.cpu()
"""


def test_a_tensor_parameter_kept_or_a_reduced_name_is_a_tensor() -> None:
    # torchao's AWQ observer keeps `bias: Optional[torch.Tensor]`; fairscale's grad scaler
    # reduces `v_on_cuda` in place: a `.to()`/`.cpu()` of either as a statement is lost
    assert _lines(OBSERVER, "TPL101") == [14, 25]


WARMUP = """\
import torch


def capture(decode, input_ids, state, graph):
    for _ in range(1):
        torch.cuda.synchronize()
        decode(input_ids, state)
        torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        return decode(input_ids, state)
"""


def test_a_loop_over_range_one_is_no_step_loop() -> None:
    # lightllm's warm-up before a CUDA-graph capture runs its body once
    assert _lines(WARMUP, "TPL202") == []


RESTORER = """\
import torch


class TrainingRestorer:
    def __init__(self, cfg, model, optimizer):
        self.global_step = 0
        self.model, self.optimizer = model, optimizer


def train(cfg, model, loader, optimizer, writer, device):
    model.to(device)
    restorer = TrainingRestorer(cfg, model, optimizer)
    global_step = restorer.global_step
    for batch in loader:
        loss = model(batch.to(device))
        loss.backward()
        optimizer.step()
        global_step += 1
        writer.add_scalar("epoch", int(cfg.batch_size * global_step / cfg.examples))
"""


def test_the_state_of_a_plain_object_is_its_own() -> None:
    # ClipBERT: the step count a restorer object keeps is a Python int, whatever it was given
    assert _lines(RESTORER, "TPL201") == []


MAIN_BLOCK = """\
import numpy as np
import torch

if __name__ == "__main__":
    net = build().cuda()
    test_feats = []
    with torch.no_grad():
        for data in eval_loader:
            feat = net(data["x_lb"].cuda())
            test_feats.append(feat.cpu().numpy())
    test_feats = np.concatenate(test_feats)
"""


def test_copies_joined_after_the_loop_of_a_main_block_are_its_result() -> None:
    # USB's eval.py: the script's top level under `if __name__ == "__main__":`
    assert _lines(MAIN_BLOCK, "TPL201") == []


CUDA_DEFAULT = """\
import torch
from torch import optim

if args.cuda:
    torch.set_default_tensor_type("torch.cuda.FloatTensor")


def train(net):
    optimizer = optim.SGD(net.parameters(), lr=0.1)
    net = net.cuda()
    return optimizer
"""


def test_an_optimizer_of_parameters_born_on_the_gpu_is_built_in_time() -> None:
    # YOLACT: with CUDA torch's default tensor type, `Yolact()` is built on the GPU
    assert _lines(CUDA_DEFAULT, "TPL801") == []
    assert _lines(CUDA_DEFAULT.replace("torch.cuda.FloatTensor", "torch.FloatTensor"), "TPL801")


GATHERED = """\
import torch
import torch.distributed as dist


def gather_scalar(fn, world_size):
    value = torch.tensor(fn(), device=torch.cuda.current_device()).float()
    parts = [torch.zeros_like(value) for _ in range(world_size)]
    dist.gather(value, gather_list=parts, dst=0)
    values = []
    for tensor in parts:
        if tensor == tensor.int():
            values.append(int(tensor.item()))
        else:
            values.append(float(tensor.item()))
    return values
"""


def test_a_walk_over_the_list_a_gather_fills_is_a_pass_over_ranks() -> None:
    # axolotl's per-rank metric: one value per rank after one collective, not per batch
    assert _lines(GATHERED, "TPL201") == []
