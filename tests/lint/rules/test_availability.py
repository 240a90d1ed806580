"""TPL601 (rules/availability.py): ``set_device`` after a process group whose backend setting
defaults to NCCL (``kwargs.get("backend", "nccl")``) runs in code written for CUDA; one whose
default is another backend is still reported."""

from __future__ import annotations

from torchplace.lint import lint_source

TRAIN = """\
import os

import torch
import torch.distributed as dist


def main(**kwargs):
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if kwargs.get("use_ddp", False):
        dist.init_process_group(backend=kwargs.get("backend", "nccl"), init_method="env://")
        torch.cuda.set_device(local_rank)
"""


def _lines(source: str) -> list[int]:
    return [f.line for f in lint_source(source, "train.py", select={"TPL601"})]


def test_set_device_after_a_backend_defaulting_to_nccl_is_left_alone() -> None:
    assert _lines(TRAIN) == []


def test_getattr_defaulting_to_nccl_is_left_alone() -> None:
    source = TRAIN.replace('kwargs.get("backend", "nccl")', 'getattr(args, "backend", "nccl")')
    assert _lines(source) == []


def test_set_device_after_a_backend_defaulting_to_gloo_is_reported() -> None:
    assert _lines(TRAIN.replace('"backend", "nccl"', '"backend", "gloo"')) == [11]
