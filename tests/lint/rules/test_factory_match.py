"""TPL103 (rules/factory_match.py): a factory built to match a tensor parameter is followed
through the grids ``torch.meshgrid`` builds from it."""

from __future__ import annotations

from torchplace.lint import lint_source

GRIDS = """\
import torch


def masks_to_boxes(masks):
    if masks.numel() == 0:
        return torch.zeros((0, 4), device=masks.device)
    h, w = masks.shape[-2:]
    y = torch.arange(0, h, dtype=torch.float)
    x = torch.arange(0, w, dtype=torch.float)
    y, x = torch.meshgrid(y, x)
    return masks * x.unsqueeze(0), masks * y.unsqueeze(0)


def grid_names(masks):
    h, w = masks.shape[-2:]
    ys = torch.arange(h, dtype=torch.float)
    gy, gx = torch.meshgrid([ys, ys])
    return (masks * gy).sum(), masks.device


def placed(masks):
    h, w = masks.shape[-2:]
    y = torch.arange(0, h, dtype=torch.float, device=masks.device)
    x = torch.arange(0, w, dtype=torch.float).to(masks.device)
    y, x = torch.meshgrid(y, x)
    return masks * x, masks * y


def host_grid(masks):
    h, w = masks.shape[-2:]
    y = torch.arange(0, h, dtype=torch.float)
    y, x = torch.meshgrid(y, y)
    return x.numpy(), masks.device
"""


def test_a_grid_built_from_a_factory_meets_the_parameter() -> None:
    lines = [f.line for f in lint_source(GRIDS, "box_ops.py", select={"TPL103"})]
    assert 8 in lines
    assert 9 in lines
    assert 16 in lines  # grids bound to other names, built from a list


def test_placed_factories_and_host_grids_are_left_alone() -> None:
    lines = [f.line for f in lint_source(GRIDS, "box_ops.py", select={"TPL103"})]
    assert not {23, 24, 31} & set(lines)


# ---- a module-level helper that only a dataset's collate function calls

MIX = """\
import torch
from torch.utils.data import Dataset


def mix_samples(wavs: torch.Tensor, mix_p: float):
    idx = torch.randperm(wavs.size(0))[: int(mix_p * wavs.size(0))]
    return wavs[idx]


def shuffle_rows(wavs: torch.Tensor):
    return wavs[torch.randperm(wavs.size(0))]


class SoundDataset(Dataset):
    def collater(self, samples):
        return mix_samples(torch.stack(samples), 0.5)


def train_step(model, wav, device):
    return model(shuffle_rows(wav.to(device)))
"""


def test_a_helper_only_a_dataset_calls_is_host_code() -> None:
    lines = [f.line for f in lint_source(MIX, "sound_dataset.py", select={"TPL103"})]
    assert lines == [11]  # `shuffle_rows` also serves a training step
