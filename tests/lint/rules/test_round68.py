"""Round 68: `.to(int)` and `.to(x.dtype)` are casts, not moves (TPL201, TPL501, TPL103); the
object collectives make a file multi-rank (TPL104); `isinstance(out, Sequence)` finds whole
tensors, and an optimizer kept in a mapping steps a training step (TPL201)."""

from __future__ import annotations

import ast

from torchplace.lint import lint_source
from torchplace.lint.provenance.loops import steps_optimizer

from .helpers import lines as _lines

CAST_INT = """\
import numpy as np
import torch

def evaluate(env, policy, n):
    sums = []
    for batch in range(n):
        done = torch.from_numpy(env.step()).to(int)
        done_indices = torch.argmax(done, dim=1)
        sums.extend(done_indices.tolist())
        moved = torch.from_numpy(env.step()).to("cuda")
        print(moved.sum().item())
    return sums
"""


def test_to_a_python_type_is_a_cast_that_leaves_the_tensor_on_the_host() -> None:
    assert _lines(CAST_INT, "TPL201") == [11]


DTYPE_READ = """\
import torch
from torch import nn

class Rotary(nn.Module):
    def __init__(self):
        super().__init__()
        self.freqs_sin = torch.arange(4).float().sin().cuda()
        self.freqs_cos = torch.arange(4).float().cos()

    def forward(self, t):
        return t * self.freqs_sin.to(t.dtype) + self.freqs_cos.to(t.device)
"""


def test_an_attribute_cast_where_it_is_read_is_not_moved_there() -> None:
    assert _lines(DTYPE_READ, "TPL501") == [7]


DTYPE_FACTORY = """\
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        ones = torch.ones((2, 3)).to(x.dtype)
        placed = torch.ones((2, 3)).to(x.device)
        return self.lin(x) + ones + placed
"""


def test_a_factory_cast_to_the_inputs_dtype_stays_on_the_host() -> None:
    assert _lines(DTYPE_FACTORY, "TPL103") == [10]


OBJECTS = """\
import torch.distributed as dist

def share(obj, rank):
    object_list = [obj]
    dist.broadcast_object_list(object_list, src=rank, device="cuda")
    return object_list[0]
"""


def test_an_object_collective_makes_the_file_multi_rank() -> None:
    assert _lines(OBJECTS, "TPL104") == [5]


SEQUENCE = """\
from collections.abc import Sequence
import torch

def evaluate(model, loader, metric):
    model = model.cuda()
    for x in loader:
        outputs = model(x.cuda())
        if isinstance(outputs, Sequence):
            for v in outputs:
                metric.update(v.cpu())
        else:
            for row in outputs:
                metric.update(row.cpu())
"""


def test_a_loop_over_a_sequence_walks_whole_tensors_not_rows() -> None:
    found = [f for f in lint_source(SEQUENCE, "train.py", select={"TPL201"}) if f.line == 10]
    assert found
    assert "row" not in found[0].message


OPTIMIZERS = """\
import torch

class SAC:
    def __init__(self, policy, device):
        self.policy = policy.to(device)

    def update(self, batch):
        loss = self.policy.critic_loss(batch)
        self.optimizers["critic"].zero_grad()
        loss.backward()
        self.optimizers["critic"].step()
        self.logger.log("loss_critic", loss.item())
"""


def test_an_optimizer_kept_in_a_mapping_steps_a_training_step() -> None:
    assert _lines(OPTIMIZERS, "TPL201") == [12]


CLOSURE_IN_LOOP = """\
import torch
from copy import deepcopy

def main(model, data, num_steps, optimizer, booster):
    model = model.cuda()
    ema = deepcopy(model).cpu().eval().requires_grad_(False)

    def run_iter(batch):
        loss = model(batch.cuda()).sum()
        booster.backward(loss, optimizer)
        optimizer.step()
        return loss

    for step in range(num_steps):
        run_iter(next(data))
"""


def test_a_closure_called_in_a_nested_loop_is_no_step_of_the_function_itself() -> None:
    # `main` walks the batches; the closure it calls in that loop is the step, not `main`
    main = ast.parse(CLOSURE_IN_LOOP).body[2]
    assert isinstance(main, ast.FunctionDef)
    assert not steps_optimizer(main)
    called = CLOSURE_IN_LOOP.replace(
        "    for step in range(num_steps):\n        run_iter(next(data))\n", "    run_iter(data)\n"
    )
    once = ast.parse(called).body[2]
    assert isinstance(once, ast.FunctionDef)
    assert steps_optimizer(once)


REWRITTEN = """\
import torch

def log_videos(model, batch, writer):
    model = model.cuda()
    videos = model.log_video(batch.cuda())
    for k in videos:
        if isinstance(videos[k], torch.Tensor):
            videos[k] = videos[k].detach().float().cpu()
    writer.save(videos)
"""


def test_a_loop_that_rewrites_a_mappings_entries_under_their_keys_walks_no_rows() -> None:
    assert _lines(REWRITTEN, "TPL201") == []


GATHERED = """\
import torch

def pick(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.index_select(0, torch.arange(n))

def pick_fn(x: torch.Tensor, n: int) -> torch.Tensor:
    idx = torch.arange(n)
    return torch.index_select(x, 0, idx)

def pick_placed(x: torch.Tensor, n: int) -> torch.Tensor:
    return torch.gather(x, 0, torch.arange(n, device=x.device))
"""


def test_a_factory_handed_to_a_gather_of_a_tensor_is_combined_with_it() -> None:
    assert _lines(GATHERED, "TPL103") == [4, 7]


NORMALISED = """\
import torch

def mixstyle(x, alpha, eps=1e-6):
    sizes = x.size()
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True)
    x = (x - mean) / (var + eps).sqrt()
    idx_swap = torch.randperm(sizes[0])
    mean = alpha * mean + (1 - alpha) * mean[idx_swap]
    return x * mean

def rebuilt(x):
    x = torch.FloatTensor(x)
    return x[torch.randperm(3)]
"""


def test_a_parameter_rebound_to_arithmetic_on_itself_is_still_its_tensor() -> None:
    # a parameter rebound to a new tensor built from it is another value
    assert _lines(NORMALISED, "TPL103") == [8]


CLAMPED = """\
import torch

def uniform_temporal_subsample(x: torch.Tensor, num_samples: int) -> torch.Tensor:
    t = x.shape[-3]
    indices = torch.linspace(0, t - 1, num_samples)
    indices = torch.clamp(indices, 0, t - 1).long()
    return torch.index_select(x, -3, indices)

def placed(x: torch.Tensor, num_samples: int) -> torch.Tensor:
    indices = torch.linspace(0, 3, num_samples)
    indices = indices.long().to(x.device)
    return x[indices]
"""


def test_a_factory_rebound_to_a_torch_function_of_itself_is_still_on_the_host() -> None:
    # rebound to a move, it is placed
    assert _lines(CLAMPED, "TPL103") == [5]
