"""Round 87: TPL102 leaves alone a module's ``parallelize`` (transformers' model parallelism,
which callers run on purpose to spread it over the GPUs); TPL201 leaves alone each rank's
packed size that an all-gather hands back, read in a comprehension of a function that runs
per batch (``[t.item() for t in all_t]``)."""

from __future__ import annotations

from .helpers import lines as _lines

PARALLEL = """\
import torch
from torch import nn


class PromptModel(nn.Module):
    def __init__(self, plm, template):
        super().__init__()
        self.plm, self.template = plm, template

    def parallelize(self, device_map=None):
        self.plm.parallelize(device_map)
        self.template.cuda()

    def forward(self, x):
        return self.template(self.plm(x))
"""


def test_parallelize_places_on_purpose() -> None:
    assert _lines(PARALLEL, "TPL102") == []


def test_another_method_placing_so_is_reported() -> None:
    assert _lines(PARALLEL.replace("def parallelize(", "def prepare("), "TPL102") == [12]


GATHER = """\
import torch
import torch.distributed as dist
from torch import nn


def gather_frames(x, world):
    local = torch.tensor([x.size(2)], device=x.device, dtype=torch.int64)
    all_t = [torch.zeros(1, dtype=torch.int64, device=x.device) for _ in range(world)]
    dist.all_gather(all_t, local)
    all_t = [t.item() for t in all_t]
    return max(all_t)


class Decoder(nn.Module):
    def forward(self, x):
        return gather_frames(x, 2)
"""


def test_gathered_sizes_read_once_per_rank() -> None:
    assert _lines(GATHER, "TPL201") == []


def test_gathered_data_read_per_rank_is_still_reported() -> None:
    data = GATHER.replace(
        "torch.tensor([x.size(2)], device=x.device, dtype=torch.int64)", "x.sum(2)"
    )
    assert _lines(data, "TPL201") == [10]
