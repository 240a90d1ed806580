"""Corpus round 32: false positives found on LLM quantization code, self-supervised learning
libraries, remote-sensing trainers and video models, each as the look-alike that must stay
clean next to the pitfall that must still be found."""

from __future__ import annotations

from .helpers import lines


def _lines(source: str, code: str, path: str = "pipeline.py") -> list[int]:
    return lines(source, code, path)


# ---- TPL201: the text of a dunder attribute (`module.__class__`) in a per-block helper

CALIBRATE = """\
import torch


def smooth(block, acts):
    family = str(block.__class__).lower()
    gain = torch.ones(acts.shape[-1]).to(acts.device)
    return family, acts * gain


def calibrate(blocks, acts):
    found = []
    for j in range(len(blocks)):
        block = blocks[j]
        block = block.cuda()
        acts = acts.to(next(block.parameters()).device)
        acts = block(acts)
        found.append(smooth(block, acts))
    return found
"""


def test_the_text_of_a_dunder_attribute_is_left_alone() -> None:
    assert _lines(CALIBRATE, "TPL201", "calib.py") == []


def test_the_text_of_an_activation_statistic_is_reported() -> None:
    source = CALIBRATE.replace(
        "family = str(block.__class__).lower()", "family = str(acts.abs().max()).lower()"
    )
    assert _lines(source, "TPL201", "calib.py") == [5]


# ---- TPL103: a module that is a collate function builds batches on the host

COLLATE = """\
import torch
import torch.nn as nn


class TwoViewCollate(nn.Module):
    def __init__(self, augment):
        super().__init__()
        self.augment = augment

    def forward(self, items):
        left = torch.stack([self.augment(it[0]) for it in items])
        right = torch.stack([self.augment(it[0]) for it in items])
        ids = torch.LongTensor([it[1] for it in items])
        return (left, right), ids
"""


def test_a_collate_module_building_labels_is_left_alone() -> None:
    assert _lines(COLLATE, "TPL103", "views.py") == []


def test_a_module_not_named_for_collating_is_reported() -> None:
    source = COLLATE.replace("TwoViewCollate", "TwoViewHead")
    assert _lines(source, "TPL103", "views.py") == [13]


# ---- TPL103: a 0-dim tensor of a parameter annotated as a number

TEMPERATURE = """\
from typing import Optional

import torch
import torch.nn as nn


class SoftTargets(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def forward(self, scores, tau: Optional[float] = None, floor: float = 0.1):
        if tau is not None:
            t = torch.tensor(tau)
        else:
            t = torch.tensor(floor)
        return self.proj(scores) / t
"""


def test_a_zero_dim_tensor_of_a_number_parameter_is_left_alone() -> None:
    assert _lines(TEMPERATURE, "TPL103", "soft.py") == []


def test_a_tensor_of_an_unannotated_parameter_is_reported() -> None:
    source = TEMPERATURE.replace("tau: Optional[float] = None", "tau=None")
    assert _lines(source, "TPL103", "soft.py") == [14]


def test_a_tensor_of_a_sequence_parameter_is_reported() -> None:
    source = TEMPERATURE.replace("Optional[float]", "Optional[list]")
    assert _lines(source, "TPL103", "soft.py") == [14]


def test_a_number_parameter_rebound_to_a_tensor_is_reported() -> None:
    source = TEMPERATURE.replace(
        "            t = torch.tensor(floor)",
        "            floor = scores.std(0)\n            t = torch.tensor(floor)",
    )
    assert _lines(source, "TPL103", "soft.py") == [17]


# ---- TPL501: an empty placeholder attribute that a forward hook fills

HOOKED = """\
import torch
import torch.nn as nn


class Tap(nn.Module):
    def __init__(self, trunk):
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(16, 8)
        self._tapped = torch.empty(0)
        trunk[-1].register_forward_hook(self._grab)

    def _grab(self, mod, args, out):
        self._tapped = self.head(out.flatten(1))

    def forward(self, x):
        self.trunk(x)
        return self._tapped
"""


def test_an_empty_placeholder_a_hook_fills_is_left_alone() -> None:
    assert _lines(HOOKED, "TPL501", "tap.py") == []


def test_an_empty_placeholder_no_method_fills_is_reported() -> None:
    source = HOOKED.replace(
        "self._tapped = self.head(out.flatten(1))", "self.seen = self.head(out.flatten(1))"
    )
    assert _lines(source, "TPL501", "tap.py") == [10]


def test_a_placeholder_holding_values_a_hook_replaces_is_reported() -> None:
    source = HOOKED.replace("torch.empty(0)", "torch.zeros(4, 8)")
    assert _lines(source, "TPL501", "tap.py") == [10]


# ---- TPL201: each rank's pickled bytes from an object all-gather, decoded one by one

GATHER = """\
import pickle

import torch
import torch.distributed as dist


def share(obj, device):
    raw = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)
    n = torch.tensor([raw.numel()], device=device)
    counts = [torch.zeros_like(n) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, n)
    counts = [int(c.item()) for c in counts]
    width = max(counts)
    padded = torch.zeros(width, dtype=torch.uint8, device=device)
    padded[: raw.numel()] = raw
    slots = [torch.empty(width, dtype=torch.uint8, device=device) for _ in counts]
    dist.all_gather(slots, padded)
    out = []
    for count, slot in zip(counts, slots):
        out.append(pickle.loads(slot.cpu().numpy().tobytes()[:count]))
    return out
"""


def test_pickled_buffers_of_an_all_gather_are_left_alone() -> None:
    assert _lines(GATHER, "TPL201", "comm.py") == []


def test_a_statistic_of_each_gathered_buffer_is_reported() -> None:
    source = GATHER.replace(
        "out.append(pickle.loads(slot.cpu().numpy().tobytes()[:count]))",
        "out.append(slot.float().mean().item())",
    )
    assert _lines(source, "TPL201", "comm.py") == [20]


# ---- TPL501: a list of host copies a module gathers for a pass after the epoch

BANK = """\
import torch
import torch.nn as nn


class Probe(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net
        self._bank = []
        self._labels = []

    def forward(self, x):
        return self.net(x)

    def collect(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self._bank.append(x.detach().cpu())
        self._labels.append(y.cpu())

    def finish(self):
        bank, labels = torch.cat(self._bank), torch.cat(self._labels)
        self._bank, self._labels = [], []
        return bank, labels
"""


def test_host_copies_kept_in_a_list_are_left_alone() -> None:
    assert _lines(BANK, "TPL501", "probe.py") == []


def test_device_tensors_kept_in_a_list_are_reported() -> None:
    source = BANK.replace("self._labels.append(y.cpu())", "self._labels.append(y.detach())")
    assert _lines(source, "TPL501", "probe.py") == [17]


def test_an_empty_cache_forward_rebuilds_when_too_small_is_reported() -> None:
    source = """\
import torch
import torch.nn as nn


class Table(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.codes = torch.zeros(0, 0)

    def forward(self, x):
        if x.shape[-1] > self.codes.shape[1]:
            self._grow(x.shape[-1], x)
        return x + self.codes[:, : x.shape[-1]]

    def _grow(self, n, x):
        self.codes = torch.randn(self.dim, n).to(x)
"""
    assert _lines(source, "TPL501", "table.py") == [9]


# ---- TPL501: a one-dimensional schedule read only one element at a time by an integer

SCHEDULE = """\
from typing import Optional

import torch
import torch.nn as nn


class WarmTemp(nn.Module):
    def __init__(self, start: float, end: float, epochs: int):
        super().__init__()
        self.epochs = epochs
        self.end = end
        self.temps = torch.linspace(start, end, epochs)

    def forward(self, logits, epoch: Optional[int] = None):
        if epoch is not None and epoch < self.epochs:
            return logits / self.temps[epoch]
        return logits / self.end
"""


def test_a_schedule_read_by_an_integer_epoch_is_left_alone() -> None:
    assert _lines(SCHEDULE, "TPL501", "temps.py") == []


def test_a_schedule_indexed_by_a_tensor_of_steps_is_reported() -> None:
    source = SCHEDULE.replace("epoch: Optional[int] = None", "epoch=None")
    assert _lines(source, "TPL501", "temps.py") == [12]


def test_a_schedule_read_whole_is_reported() -> None:
    source = SCHEDULE.replace("logits / self.temps[epoch]", "logits / self.temps.mean()")
    assert _lines(source, "TPL501", "temps.py") == [12]
