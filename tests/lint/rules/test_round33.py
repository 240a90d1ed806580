"""Corpus round 33: false positives found on a distributed-training framework's trainers, a
metrics library's collectives, a vision-language library's notebooks and a sentence-embedding
library's losses, each as the look-alike that must stay clean next to the pitfall that must
still be found."""

from __future__ import annotations

from .helpers import lines


def _lines(source: str, code: str, path: str = "pipeline.py") -> list[int]:
    return lines(source, code, path)


# ---- TPL201: reads after a guard that returns unless this is a logging step

LOGGED_STEP = """\
import torch


class Runner:
    def __init__(self, model, optimizer, metrics):
        self.model = model
        self.optimizer = optimizer
        self.metrics = metrics
        self.step = 0

    def train_step(self, inputs, labels):
        loss = torch.nn.functional.cross_entropy(self.model(inputs), labels)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.step += 1
        if not self.metrics.should_log(self.step):
            return
        self.metrics.record(self.step, loss.item(), norm.item())


def fit(runner, loader, device):
    for inputs, labels in loader:
        runner.train_step(inputs.to(device), labels.to(device))
"""


def test_reads_after_a_guard_that_leaves_off_logging_steps_are_left_alone() -> None:
    assert _lines(LOGGED_STEP, "TPL201", "runner.py") == []


def test_reads_after_a_guard_on_a_setting_are_reported() -> None:
    source = LOGGED_STEP.replace(
        "if not self.metrics.should_log(self.step):", "if not self.metrics.enabled:"
    )
    assert _lines(source, "TPL201", "runner.py") == [20, 20]


# ---- TPL201: reads after `if step % n: continue`, which lets one step in n through

EVERY_NTH = """\
import torch


def train(model, loader, optimizer, device, every):
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % every:
            continue
        print(f"step {step}: {loss.item():.4f}")
"""


def test_reads_after_continuing_on_a_nonzero_remainder_are_left_alone() -> None:
    assert _lines(EVERY_NTH, "TPL201") == []


def test_reads_after_continuing_on_a_zero_remainder_are_reported() -> None:
    source = EVERY_NTH.replace("if step % every:", "if step % every == 0:")
    assert _lines(source, "TPL201") == [12]


# ---- TPL201: each rank's shape, gathered and compared before a padded all-gather

GATHERED_SHAPES = """\
import torch
import torch.distributed as dist


def gather_padded(result: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    local_size = torch.tensor(result.shape, device=result.device)
    sizes = [torch.zeros_like(local_size) for _ in range(world_size)]
    dist.all_gather(sizes, local_size)
    largest = torch.stack(sizes).max(dim=0).values
    if all(all(s == largest) for s in sizes):
        out = [torch.zeros_like(result) for _ in range(world_size)]
        dist.all_gather(out, result)
        return out
    return []
"""


def test_gathered_shapes_compared_per_rank_are_left_alone() -> None:
    assert _lines(GATHERED_SHAPES, "TPL201", "comm.py") == []


def test_gathered_reductions_compared_per_rank_are_reported() -> None:
    source = GATHERED_SHAPES.replace(
        "torch.tensor(result.shape, device=result.device)",
        "result.sum(dim=0).to(result.device)",
    )
    assert _lines(source, "TPL201", "comm.py") == [10]


def test_a_gathered_hash_of_host_data_is_left_alone() -> None:
    source = """\
import hashlib

import torch
import torch.distributed as dist


def check_same_plan(plan, device, world_size):
    digest = hashlib.sha256(repr(plan).encode()).digest()
    key = int.from_bytes(digest[:7], "little")
    local = torch.tensor(key, dtype=torch.int64, device=device)
    keys = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(keys, local)
    if any(k.item() != key for k in keys):
        raise RuntimeError("plans differ across ranks")
"""
    assert _lines(source, "TPL201", "comm.py") == []


# ---- TPL201: a text preprocessor a loader hands back beside its model

PREPROCESSED = """\
import torch

from zoo import load_model_and_transforms

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model, image_processors, text_processors = load_model_and_transforms("base", device=device)
labels = ["cat", "dog", "bird"]
prompts = [text_processors["eval"](f"a photo of a {label}") for label in labels]
for label, prompt in zip(labels, prompts):
    print(f"{label}: {prompt}")
"""


def test_what_a_preprocessor_from_a_loader_returns_is_left_alone() -> None:
    assert _lines(PREPROCESSED, "TPL201", "demo.py") == []


def test_what_the_model_from_the_same_loader_returns_is_reported() -> None:
    source = PREPROCESSED.replace(
        'text_processors["eval"](f"a photo of a {label}")', 'model(f"a photo of a {label}")'
    )
    assert _lines(source, "TPL201", "demo.py") == [10]


# ---- TPL501: a tensor setting read back only as a number for a config record

CONFIGURED = """\
from typing import Optional

from torch import Tensor, nn


class ScaledLoss(nn.Module):
    def __init__(self, scale: Optional[Tensor] = None) -> None:
        super().__init__()
        self.scale = scale
        self.inner = nn.BCEWithLogitsLoss(pos_weight=scale)

    def forward(self, logits, targets):
        return self.inner(logits, targets)

    def describe(self):
        return {"scale": self.scale if self.scale is None else self.scale.item()}
"""


def test_a_tensor_setting_read_only_as_a_number_is_left_alone() -> None:
    assert _lines(CONFIGURED, "TPL501", "losses.py") == []


def test_a_tensor_setting_another_method_updates_is_reported() -> None:
    source = CONFIGURED.replace(
        "        return self.inner(logits, targets)",
        "        self.scale = self.scale * 0.99\n        return self.inner(logits, targets)",
    )
    assert _lines(source, "TPL501", "losses.py") == [9]


# ---- TPL201: packed host values moved for the backend, then read per rank

PEAKS = """\
import torch
import torch.distributed as dist


def peak_memory_by_rank(world_size):
    stats = torch.tensor([dist.get_rank(), torch.cuda.max_memory_allocated()])
    gathered = [torch.tensor([0, 0]) for _ in range(world_size)]
    if dist.get_backend() == "nccl":
        stats = stats.cuda()
        gathered = [g.cuda() for g in gathered]
    dist.all_gather(gathered, stats)
    peaks = {}
    for row in gathered:
        peaks[int(row[0])] = int(row[1])
    return peaks
"""


def test_packed_values_moved_for_the_backend_and_read_per_rank_are_left_alone() -> None:
    assert _lines(PEAKS, "TPL201", "memory.py") == []


def test_values_computed_from_the_packed_ones_are_reported() -> None:
    source = PEAKS.replace("stats = stats.cuda()\n", "stats = stats.cuda().cumsum(0)\n")
    assert _lines(source, "TPL201", "memory.py") == [14, 14]


# ---- TPL201: a loop over plans whose only device work is a host hash gathered from each rank

PLAN_CHECK = """\
import hashlib

import torch
import torch.distributed as dist


def check_same_plans(plans, world_size):
    for plan in plans:
        if plan.local:
            continue
        digest = hashlib.sha256(repr(plan.items).encode()).digest()
        key = int.from_bytes(digest[:7], "little")
        local = torch.tensor(key, dtype=torch.int64, device=plan.device)
        keys = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(keys, local, group=plan.group)
        if any(k.item() != key for k in keys):
            raise RuntimeError("plans differ across ranks")
"""


def test_a_host_hash_gathered_per_plan_is_left_alone() -> None:
    assert _lines(PLAN_CHECK, "TPL201", "plans.py") == []


def test_a_device_sum_gathered_per_plan_is_reported() -> None:
    source = PLAN_CHECK.replace(
        "torch.tensor(key, dtype=torch.int64, device=plan.device)",
        "plan.weights.to(plan.device).sum()",
    )
    assert _lines(source, "TPL201", "plans.py") == [16]
