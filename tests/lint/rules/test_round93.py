"""Round 93, what round 33 of the corpus showed: TPL104 reads ``device_map="cuda"`` (one
device named for a whole model, ``from_pretrained(p, device_map="cuda")``) as a placement,
not ``device_map="auto"``; TPL102 leaves alone a training step a module hosts (a method
that runs ``.backward()``, itself or through a method of its class, DINOv3's
``forward_backward``) moving the batch its caller hands it."""

from __future__ import annotations

from .helpers import lines as _lines

EVALUATE = """\
import os
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

dist.init_process_group(backend="nccl")
torch.cuda.set_device(int(os.getenv("LOCAL_RANK", 0)))
model = AutoModelForCausalLM.from_pretrained("m", device_map="cuda").eval()
other = AutoModelForCausalLM.from_pretrained("m", device_map="auto")
"""


def test_device_map_of_bare_cuda_in_rank_code() -> None:
    assert _lines(EVALUATE, "TPL104") == [8]


META_ARCH = """\
import torch
from torch import nn


class SSLMetaArch(nn.Module):
    def forward_backward(self, data, teacher_temp):
        crops = data["collated_global_crops"].cuda(non_blocking=True)
        loss = self.student(crops).mean()
        self.backprop_loss(loss)
        return loss

    def backprop_loss(self, loss):
        loss.backward()

    def prepare(self, data):
        return data["x"].cuda()
"""


def test_a_hosted_training_step_moves_its_batch() -> None:
    assert _lines(META_ARCH, "TPL102") == [16]


def test_a_method_that_trains_nothing_is_still_reported() -> None:
    idle = META_ARCH.replace("        self.backprop_loss(loss)\n", "")
    assert _lines(idle, "TPL102") == [7, 15]
