"""Round 69: code under a one-process flag (`if single_device:`) is not multi-rank (TPL104)."""

from __future__ import annotations

from .helpers import lines as _lines

SINGLE_DEVICE = """\
import torch
from accelerate import Accelerator

class HFLM:
    def __init__(self, device=None, parallelize=False):
        accelerator = Accelerator()
        if accelerator.num_processes > 1:
            self.accelerator = accelerator
        single_device = not parallelize and not getattr(self, "accelerator", None)
        if single_device:
            self._device = (
                torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
            )
        else:
            self._device = torch.device("cuda")
        torch.distributed.all_reduce(torch.ones(1, device=self._device))
"""


def test_a_fallback_under_a_single_device_flag_runs_in_one_process() -> None:
    assert _lines(SINGLE_DEVICE, "TPL104") == [15]


TOPK_BRANCH = """\
import torch

def top(model, x, device, as_dict):
    probs = model(x.to(device))
    values, indices = torch.topk(probs, k=5)
    if as_dict:
        values = [float(v) for v in values]
        return values
    return indices

def after_early_return(model, x, device, done):
    if done:
        return None
    else:
        ids = model(x.to(device)).argmax(-1)
        return [int(i) for i in ids]
"""


def test_a_comprehension_in_a_branch_that_returns_is_still_a_loop_over_rows() -> None:
    # the branch runs once, but the comprehension inside it reads every row; and the `else`
    # of an `if` whose body returns is no branch that leaves
    assert _lines(TOPK_BRANCH, "TPL201") == [7, 16]


SETTINGS_MODULE = """\
import torch
from modules import shared

def logits(prompt, device):
    tokens = shared.tokenizer.encode(prompt, return_tensors="pt").to(device)
    output = shared.model(input_ids=tokens)
    values, indices = torch.topk(output["logits"][-1][-1], k=5)
    words = [shared.tokenizer.decode(i) for i in indices]
    for word in words:
        print(word)
    return [float(v) for v in values]
"""


def test_a_model_held_by_an_imported_module_runs_where_its_inputs_are() -> None:
    # the decoded words are host text: printing them reads nothing
    assert _lines(SETTINGS_MODULE, "TPL201") == [11]


ACCUMULATION = """\
import torch

def train_epoch(model, loader, optim, accum_grad, log_every, to_device, device):
    for batch_idx, batch in enumerate(loader):
        batch = to_device(batch, device)
        loss, stats = model(**batch)
        loss.backward()
        if (batch_idx + 1) % accum_grad == 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if not torch.isfinite(grad_norm):
                optim.zero_grad()
                continue
            optim.step()
            optim.zero_grad()
        if (batch_idx + 1) % log_every == 0:
            print(stats["acc"].item())
"""


def test_a_step_of_gradient_accumulation_is_every_optimizer_step_not_a_log_interval() -> None:
    # the norm of a module that ran on device inputs (whatever placed it) is on the device
    assert _lines(ACCUMULATION, "TPL201") == [10]
