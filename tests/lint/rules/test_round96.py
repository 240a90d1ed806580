"""Round 96, what the whole corpus and round 41 showed: a factory's tensor that the function
only reads back to the host (``times.int().tolist()``, DiffusionDet's sampling schedule) is host
bookkeeping, as one that only bounds slices is."""

from __future__ import annotations

from torchplace.lint import lint_source

from .helpers import lines as _lines

SCHEDULE = """\
import torch


class Detector(torch.nn.Module):
    def forward(self, feats, steps):
        return self.sample(feats, steps, 1000), self.noisy(feats, steps)

    def sample(self, feats, steps, total):
        noise = torch.randn(feats.shape, device=feats.device)
        times = torch.linspace(-1, total - 1, steps=steps + 1)
        times = list(reversed(times.int().tolist()))
        pairs = list(zip(times[:-1], times[1:]))
        out = feats + noise
        for t, _ in pairs:
            out = self.head(out, t)
        return out

    def noisy(self, feats, steps):
        feats = feats.unsqueeze(0)
        scale = torch.linspace(0, 1, steps=steps)
        first = scale.float().tolist()[0]
        return feats * scale, first
"""


def test_a_factory_only_read_back_to_the_host_stays_there() -> None:
    assert _lines(SCHEDULE, "TPL103") == [20]


EXTENDED = """\
import math

import torch
from torch import nn


class SinePositions(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.pe = None
        self.extend_pe(torch.tensor(0.0).expand(1, 4000))

    def extend_pe(self, x):
        if self.pe is not None:
            if self.pe.size(1) >= x.size(1):
                if self.pe.dtype != x.dtype or self.pe.device != x.device:
                    self.pe = self.pe.to(dtype=x.dtype, device=x.device)
                return
        pe = torch.zeros(x.size(1), self.dim)
        position = torch.arange(0, x.size(1), dtype=torch.float32).unsqueeze(1)
        div = torch.exp(torch.arange(0, self.dim, 2).float() * -(math.log(1e4) / self.dim))
        pe[:, 0::2] = torch.sin(position * div)
        pe[:, 1::2] = torch.cos(position * div)
        self.pe = pe.unsqueeze(0).to(device=x.device, dtype=x.dtype)

    def forward(self, x):
        self.extend_pe(x)
        return x + self.pe[:, : x.size(1)]

    def peek(self, x):
        return x + self.pe[:, : x.size(1)]
"""


def test_a_cache_each_reader_places_first_through_a_method_is_not_left_behind() -> None:
    assert _lines(EXTENDED, "TPL501") == [25]
    kept = EXTENDED.replace(
        "    def peek(self, x):\n        return x + self.pe[:, : x.size(1)]\n", ""
    )
    assert _lines(kept, "TPL501") == []


OLD_LOSS = """\
import torch.nn.functional as F


def test(model, loader):
    total = 0
    for data, target in loader:
        data, target = data.cuda(), target.cuda()
        output = model(data)
        total += F.cross_entropy(output, target, size_average=False).data[0]
        first = output.data[0]
    return total, first
"""


def test_the_old_read_of_a_functional_loss_is_a_sync() -> None:
    assert _lines(OLD_LOSS, "TPL201") == [9]


HEAD = """\
import torch
from mmengine.model import BaseModule
from mmpose.registry import MODELS


def to_numpy(x):
    return x.detach().cpu().numpy()


@MODELS.register_module()
class HeatmapHead(BaseModule):
    def loss(self, feats, batch_data_samples, train_cfg={}):
        pred_fields = self.forward(feats)
        losses = dict(loss_kpt=self.loss_module(pred_fields, batch_data_samples))
        acc = float(pred_fields.max())
        losses.update(acc_pose=torch.tensor(acc, device=pred_fields.device))
        return losses
"""


def test_an_openmmlab_heads_loss_runs_every_training_step() -> None:
    assert _lines(HEAD, "TPL201") == [15]
    plain = HEAD.replace("mmengine.model", "base").replace("mmpose.registry", "registry")
    assert _lines(plain, "TPL201") == []


MEAN_POSE = """\
import torch
from torch import nn


class Hand(nn.Module):
    def __init__(self, data):
        super().__init__()
        self.register_buffer("hand_mean", torch.tensor(data["mean"]))
        self.register_buffer("pose_mean", self.create_mean_pose())
        self.register_buffer("rest", self.rest_pose())

    def create_mean_pose(self):
        orient = torch.zeros([3], dtype=self.hand_mean.dtype)
        return torch.cat([orient, self.hand_mean], dim=0)

    def rest_pose(self):
        orient = torch.zeros([3], dtype=self.hand_mean.dtype)
        return torch.cat([orient, self.hand_mean], dim=0)

    def forward(self, pose):
        return pose + self.pose_mean + self.rest_pose()
"""


def test_a_helper_only_the_constructor_runs_builds_with_the_cpu_buffers() -> None:
    assert _lines(MEAN_POSE, "TPL103") == [17]


SINCOS = """\
import torch
from torch import nn


def sinusoidal(n, dim):
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2) / dim))
    table = torch.einsum("i,j->ij", torch.arange(n).float(), inv)
    return torch.cat((torch.sin(table), torch.cos(table)), dim=1)


class Attention(nn.Module):
    def __init__(self, n, dim):
        super().__init__()
        self.embed_positions = sinusoidal(n, dim)
        self.table = sinusoidal(n, dim)

    def forward(self, x, position_ids):
        embed_positions = self.embed_positions
        if embed_positions.device != position_ids.device:
            embed_positions = embed_positions.to(position_ids.device)
            self.embed_positions = embed_positions
        table = self.table
        if table.dtype != x.dtype:
            table = table.to(x.dtype)
        return x * embed_positions[position_ids] + table[position_ids]
"""


def test_a_table_each_forward_moves_after_asking_its_device_is_placed() -> None:
    assert _lines(SINCOS, "TPL501") == [15]


FIXED_RANK = """\
import torch


def generate(model, tokens):
    seqinfo = tokens.to("cuda")
    return model(seqinfo)


def main(ckpt_dir):
    local_rank = 0
    device = f"cuda:{local_rank}"
    torch.cuda.set_device(local_rank)
    return device
"""


def test_a_local_rank_only_ever_zero_is_one_process() -> None:
    assert _lines(FIXED_RANK, "TPL104") == []
    ranked = FIXED_RANK.replace("def main(ckpt_dir):\n    local_rank = 0", "def main(local_rank):")
    assert _lines(ranked, "TPL104") == [5]


OLD_ACCURACY = """\
import utils


def train(model, loader, criterion, top1):
    for step, (x, y) in enumerate(loader):
        x, y = x.cuda(), y.cuda()
        logits = model(x)
        prec1, prec5 = utils.accuracy(logits, y, topk=(1, 5))
        top1.update(prec1.data[0], x.size(0))
        first = logits.data[0]
        top1.update(prec5[0], x.size(0))
    return first
"""


def test_the_old_read_of_an_accuracy_through_data_is_a_sync() -> None:
    assert _lines(OLD_ACCURACY, "TPL201") == [9]


CLOSURE = """\
import torch


def minimize(optimizer, closure, params, maxiters=100, ftol=1e-9):
    prev_loss = None
    for n in range(maxiters):
        loss = optimizer.step(closure)
        if prev_loss is not None and abs(prev_loss - loss.item()) < ftol:
            break
        prev_loss = loss.item()
    return prev_loss


def rollout(env, policy, steps):
    total = 0.0
    obs = env.reset()
    for t in range(steps):
        obs, reward, done, info = env.step(policy(obs))
        total += reward.item()
    return total
"""


def test_an_optimizer_step_handed_a_closure_is_a_training_step_returning_the_loss() -> None:
    found = lint_source(CLOSURE, "fit.py", select={"TPL201"})
    assert [f.line for f in found] == [8, 10]
    assert "`optimizer.step(closure)`" in found[0].message


NO_RANK = """\
import deepspeed
import torch


def main(args):
    if args.local_rank == -1:
        device = torch.device("cuda")
    else:
        torch.cuda.set_device(args.local_rank)
        device = torch.device("cuda", args.local_rank)
        deepspeed.init_distributed()
    if args.local_rank != -1:
        pass
    else:
        other = torch.device("cuda")
    return device, other
"""


def test_the_branch_without_a_launcher_rank_is_one_process() -> None:
    assert _lines(NO_RANK, "TPL104") == []
    ranked = NO_RANK.replace("== -1", "== 0").replace("!= -1", "!= 0")
    assert _lines(ranked, "TPL104") == [7, 15]


IDENTITY_ZERO = """\
def train(model, loader, optimizer, translate):
    for i, (x, y) in enumerate(loader):
        x, y = x.cuda(), y.cuda()
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        if i % 100 is 0:
            print(i, loss.item())
"""


def test_a_remainder_tested_with_is_zero_is_a_rare_branch() -> None:
    assert _lines(IDENTITY_ZERO, "TPL201") == []
    assert _lines(IDENTITY_ZERO.replace("is 0", "is not None"), "TPL201") == [8]


WRAPPED = """\
import torch
from torch import nn
from torch.autograd import Variable


def create_variable(tensor):
    if torch.cuda.is_available():
        return Variable(tensor.cuda())
    else:
        return Variable(tensor)


class Classifier(nn.Module):
    def forward(self, x):
        hidden = self._init_hidden(x.size(0))
        scores = create_variable(torch.zeros(x.size(1)))
        cell = Variable(torch.zeros(x.size(1)))
        return self.gru(x, hidden), scores + cell

    def _init_hidden(self, batch_size):
        hidden = torch.zeros(2, batch_size, 8)
        return create_variable(hidden)
"""


def test_a_helper_returning_its_argument_moved_inside_variable_places_it() -> None:
    assert _lines(WRAPPED, "TPL103") == [17]


SET_DEVICE_HELPER = """\
import torch
from classy_vision.generic.distributed_util import set_cuda_device_index


def setup(local_rank):
    torch.distributed.init_process_group(backend="nccl")
    set_cuda_device_index(local_rank)
    return torch.zeros(1).cuda()
"""


def test_a_helper_named_for_setting_the_device_picks_the_gpu() -> None:
    assert _lines(SET_DEVICE_HELPER, "TPL104") == []
    unpinned = SET_DEVICE_HELPER.replace("    set_cuda_device_index(local_rank)\n", "")
    assert _lines(unpinned, "TPL104") == [7]


FORMATTED = """\
def detect(model, dataset, device, names):
    for img in dataset:
        det = model(img.to(device))
        s = ""
        for c in det[:, -1].unique():
            s += "%g %ss, " % (c, names[0])
        print("%sDone." % s)
"""


def test_text_formatted_with_percent_is_a_host_string() -> None:
    assert _lines(FORMATTED, "TPL201") == [6]


EVAL_STEP = """\
import torch


class ClassificationTask:
    def eval_step(self):
        sample = next(self.data_iterator)
        sample = {k: v.cuda(non_blocking=True) for k, v in sample.items()}
        with torch.no_grad():
            output = self.model(sample["input"])
            loss = self.loss(output, sample["target"])
        self.losses.append(loss.data.cpu().item())
"""


def test_a_tasks_eval_step_runs_once_per_batch() -> None:
    assert _lines(EVAL_STEP, "TPL201") == [11]
    assert _lines(EVAL_STEP.replace("def eval_step", "def report"), "TPL201") == []


PERIODIC_VALID = """\
import torch


class Trainer:
    def valid_step(self):
        data = next(self.valid_dl_iter).to(self.device)
        loss = self.model(data)
        return loss.item()

    def train(self):
        step = 0
        while step < self.num_train_steps:
            self.train_step()
            if not (step % self.validate_every_step):
                self.valid_step()
            step += 1
"""


def test_a_step_method_the_file_calls_only_on_few_steps_is_not_per_batch() -> None:
    assert _lines(PERIODIC_VALID, "TPL201") == []
    always = PERIODIC_VALID.replace(
        "            if not (step % self.validate_every_step):\n                self.valid_step()",
        "            self.valid_step()",
    )
    assert _lines(always, "TPL201") == [8]


CPU_SCRIPT = """\
import torch

device = "cpu"


def run_learning(data, steps):
    model = torch.nn.Linear(2, 1).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    noise = torch.rand(1, 2, device=device)
    for step in range(steps):
        optimizer.zero_grad()
        loss = model(data + noise).pow(2).mean()
        loss.backward()
        optimizer.step()
        print(loss.item())


run_learning(torch.ones(4, 2), 100)
"""


def test_a_script_whose_one_device_is_the_cpu_reads_host_values() -> None:
    assert _lines(CPU_SCRIPT, "TPL201") == []
    commented = CPU_SCRIPT.replace(
        'device = "cpu"\n', 'device = torch.device("cpu")\n# device = torch.device("cuda")\n'
    )
    assert _lines(commented, "TPL201") == []
    assert _lines(CPU_SCRIPT.replace('device = "cpu"', 'device = "cuda"'), "TPL201") == [15]


BARE_MATH = """\
from math import log10


def validate(model, loader):
    psnr = 0.0
    for lr, hr in loader:
        hr = hr.cuda()
        sr = model(lr.cuda())
        mse = ((sr - hr) ** 2).mean()
        psnr += 10 * log10(1 / mse)
    return psnr
"""


def test_a_math_function_imported_bare_reads_its_tensor() -> None:
    assert _lines(BARE_MATH, "TPL201") == [10]


MADE_ITER = """\
import torch


class TrainManager:
    def train_and_validate(self, train_data):
        self.train_iter = train_data.make_iter(32, device=self.device)
        for epoch in range(10):
            for i, batch in enumerate(self.train_iter):
                loss = self._train_step(batch)

    def _train_step(self, batch):
        loss = self.model(batch)
        loss.backward()
        return loss.item()
"""


def test_an_iterator_a_call_builds_for_the_device_yields_batches() -> None:
    assert _lines(MADE_ITER, "TPL201") == [14]


GPU_OR_NOT = """\
import torch
from torch import nn


class SWAVLoss(nn.Module):
    def forward(self, out):
        q = out / 0.05
        k = q.shape[1]
        if self.gpus > 0:
            u = torch.zeros(k).cuda(non_blocking=True)
            r = torch.ones(k).cuda(non_blocking=True) / k
        else:
            u = torch.zeros(k)
            r = torch.ones(k) / k
        if self.debug:
            w = torch.ones(k)
        return q * r + u + w
"""


def test_the_else_of_a_branch_that_builds_on_cuda_is_the_cpu_path() -> None:
    assert _lines(GPU_OR_NOT, "TPL103") == [16]


HELPER_TEST = """\
def divisible_by(num, den):
    return (num % den) == 0


def train(model, loader, optimizer):
    for i, (x, y) in enumerate(loader):
        loss = model(x.cuda(), y.cuda())
        loss.backward()
        optimizer.step()
        if divisible_by(i, 10):
            print(loss.item())
"""


def test_a_branch_on_a_helper_returning_a_remainder_test_is_periodic() -> None:
    assert _lines(HELPER_TEST, "TPL201") == []
    assert _lines(HELPER_TEST.replace("if divisible_by(i, 10):", "if True:"), "TPL201") == [11]


CONVERTER = """\
import torch

from models import Encoder


def loader(model):
    model.load_state_dict(torch.load("pth_models/encoder.pth"))
    model.head.load_state_dict(torch.load("pth_models/head.pth"))


if __name__ == "__main__":
    encoder = Encoder()
    torch.save(encoder.state_dict(), "pth_models/encoder.pth")
"""


def test_a_file_that_names_no_device_saves_host_data_for_its_loads() -> None:
    assert _lines(CONVERTER, "TPL401", "/nonexistent/lib/convert.py") == [8]


STATS = """\
import time

import torch


class Trainer:
    def cycle_dataset(self, loader):
        for i, data in enumerate(loader, 1):
            loss = self.actor(data)
            loss.backward()
            self.optimizer.step()
            torch.cuda.synchronize()
            self._print_stats(i, loader)

    def _print_stats(self, i, loader):
        current_time = time.time()
        self.fps = 1.0 / (current_time - self.prev_time)
        self.prev_time = current_time
"""


def test_a_loop_timing_each_step_through_a_method_synchronizes_on_purpose() -> None:
    assert _lines(STATS, "TPL202") == []
    untimed = STATS.replace("current_time = time.time()", "current_time = self.clock")
    assert _lines(untimed, "TPL202") == [12]


AGENT = """\
import torch
from torch import nn
from torch.optim import Adam


class Agent(nn.Module):
    def __init__(self, dim, lr):
        super().__init__()
        self.actor = nn.Linear(dim, dim)
        self.opt_actor = Adam(self.actor.parameters(), lr=lr)


def main(device):
    agent = Agent(
        4,
        lr=max(1e-4, 3e-4),
    ).to(device)
    return agent
"""


def test_an_optimizer_over_a_submodule_built_before_its_module_is_moved(tmp_path) -> None:
    path = tmp_path / "moved" / "agent.py"
    path.parent.mkdir()
    path.write_text(AGENT)
    assert _lines(AGENT, "TPL801", str(path)) == [10]
    unmoved = tmp_path / "unmoved" / "agent.py"
    unmoved.parent.mkdir()
    unmoved.write_text(AGENT.replace(").to(device)", ")"))
    assert _lines(unmoved.read_text(), "TPL801", str(unmoved)) == []


ITER_HOOK = """\
from mmengine.hooks import Hook


class PGGANFetchDataHook(Hook):
    def before_train_iter(self, runner, batch_idx, data_batch=None):
        model = runner.model
        _next_scale_int = model._next_scale_int
        if _next_scale_int.item() != self._last_scale:
            self.update_dataloader(runner.train_dataloader, _next_scale_int.item())

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        runner.message_hub.update_scalar("train/loss", outputs["loss"].item())
"""


def test_an_openmmlab_iteration_hook_runs_every_iteration() -> None:
    assert _lines(ITER_HOOK, "TPL201") == [8, 9, 12]
