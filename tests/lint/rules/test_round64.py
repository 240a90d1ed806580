"""Round 64: a module's own ``forward`` as a per-batch function when no caller in sight runs
it, a branch on which a name is not a tensor, and copies handed to host solvers and helpers
(TPL201)."""

from __future__ import annotations

from pathlib import Path

from torchplace.lint import project as project_module

from .helpers import lines as _lines
from .helpers import project as _project

FORWARD = """\
import torch
from torch import nn

class TextEmbedding(nn.Module):
    def forward(self, text, seq_len):
        seq_len = seq_len.to(text.device)
        n = int(seq_len.max().item())
        return text[:, :n]

class Helper:
    def forward(self, text, seq_len):
        seq_len = seq_len.to(text.device)
        return int(seq_len.max().item())

def forward(text, seq_len):
    seq_len = seq_len.to(text.device)
    return int(seq_len.max().item())
"""


def test_a_module_forward_that_no_caller_runs_reads_its_own_device_values() -> None:
    # only the module's `forward`: a plain class's method or a function nobody calls may
    # never run per batch
    assert _lines(FORWARD, "TPL201") == [7]


def test_a_module_forward_leaves_values_of_unknown_origin_alone_out_of_a_project() -> None:
    source = """\
from torch import nn

class Loss(nn.Module):
    def forward(self, pred, target):
        loss = (pred - target).abs().mean()
        self.log = loss.item()
        return loss
"""
    assert _lines(source, "TPL201") == []


NOT_A_TENSOR = """\
import torch
from torch import nn

class Embed(nn.Module):
    def forward(self, text, seq_len):
        if torch.is_tensor(seq_len):
            seq_len = seq_len.to(text.device)
            n = int(seq_len.max().item())
        else:
            n = int(seq_len)
        if torch.is_tensor(seq_len):
            lens = seq_len.to(text.device)
        else:
            lens = torch.full((3,), int(seq_len), device=text.device)
        if not isinstance(seq_len, torch.Tensor):
            k = int(seq_len)
        else:
            k = int(seq_len.sum())
        m = int(seq_len) if not torch.is_tensor(seq_len) else int(seq_len.min())
        return text[:, :n], lens, k, m
"""


def test_a_branch_on_which_the_name_is_not_a_tensor_reads_nothing() -> None:
    # the flow merges the moved `seq_len` into the later tests; their negative sides hold a
    # Python number
    assert _lines(NOT_A_TENSOR, "TPL201") == [8, 18, 19]


HOST_SOLVER = """\
import torch
from scipy.optimize import linear_sum_assignment

def match(loader, model, device):
    for images, sizes in loader:
        out = model(images.to(device))
        cost = torch.cdist(out, out)
        cost = cost.view(len(sizes), -1).cpu()
        indices = [linear_sum_assignment(c[i]) for i, c in enumerate(cost.split(sizes, -1))]
        print(indices)
"""


def test_a_copy_split_for_a_host_solver_in_a_comprehension_is_its_input() -> None:
    assert _lines(HOST_SOLVER, "TPL201") == []
    unsolved = HOST_SOLVER.replace("linear_sum_assignment(c[i])", "sorted(c[i])")
    assert _lines(unsolved, "TPL201") == [8]


SIFT = """\
import torch

class Extractor:
    def extract_one(self, image):
        image_np = image.numpy().squeeze(0)
        return self.sift.detect(image_np)

    def run(self, loader, model, device):
        for batch in loader:
            image = model(batch.to(device))
            image = image.cpu()
            pred = []
            for k in range(len(image)):
                pred.append(self.extract_one(image[k]))
"""


def test_a_copy_handed_to_a_method_that_works_on_numpy_arrays_is_its_input() -> None:
    assert _lines(SIFT, "TPL201") == []
    kept = SIFT.replace("image_np = image.numpy().squeeze(0)", "image_np = image.squeeze(0)")
    assert _lines(kept, "TPL201") == [11]


LOSS = """\
from torch import nn

class Loss(nn.Module):
    def forward(self, pred, target):
        loss = (pred - target).abs().mean()
        self.log = loss.item()
        mask = target.cuda() > 0
        n = mask.sum().item()
        return loss / n
"""
TRAIN = """\
from losses import Loss

def train(model, loader, opt):
    crit = Loss()
    for x, y in loader:
        loss = crit(model(x), y)
        loss.backward()
        opt.step()
"""


def lint(root: Path, files: dict[str, str]) -> list[tuple[str, int]]:
    project_module._scan.cache_clear()
    project_module.project_root.cache_clear()
    return _project(root, {"setup.cfg": "", **files}, "TPL201")


def test_a_module_forward_of_a_project_that_runs_models_reads_what_it_computes(
    tmp_path: Path,
) -> None:
    # the training loop is out of the resolver's sight (`crit` is given no device), yet the
    # project runs its models: the loss's scalar reads are per batch
    assert lint(tmp_path, {"losses.py": LOSS, "scripts/train.py": TRAIN}) == [
        ("losses.py", 6),
        ("losses.py", 8),
    ]


def test_a_library_of_models_that_no_code_runs_is_left_alone(tmp_path: Path) -> None:
    assert lint(tmp_path, {"losses.py": LOSS}) == []


INPUTS = """\
import torch
from torch import nn

class Attention(nn.Module):
    def forward(self, value, spatial_shapes, startp, layers, flag=False):
        assert (spatial_shapes[:, 0] * spatial_shapes[:, 1]).sum() == value.shape[1]
        name = "up_" + str(startp + 1)
        if 3 == layers[-1]:
            pass
        return value

class Quantizer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("inited", torch.tensor(False))

    def forward(self, x):
        if not self.inited:
            self.inited.fill_(True)
        n = x.sum()
        if n:
            x = x / n
        return x
"""
SCRIPT = "def run(model, loader):\n    model.eval()\n    for x in loader:\n        model(x)\n"


def test_a_module_forward_of_a_project_that_runs_models_takes_tensor_inputs_as_device(
    tmp_path: Path,
) -> None:
    # inputs used as tensors (`spatial_shapes[:, 0]`, `x.sum()`) live where the module's
    # weights do; a count or a list of layer indices (`startp`, `layers`) is no tensor
    assert lint(tmp_path, {"attention.py": INPUTS, "run.py": SCRIPT}) == [
        ("attention.py", 6),
        ("attention.py", 18),
        ("attention.py", 21),
    ]
    assert lint(tmp_path / "library", {"attention.py": INPUTS}) == []


def test_a_module_forward_that_trains_is_not_a_batch_of_it(tmp_path: Path) -> None:
    trainer = """\
from torch import nn

class Trainer(nn.Module):
    def forward(self):
        step = self.step.item()
        for _ in range(self.num_train_steps):
            loss = self.net(next(self.data))
            self.accelerator.backward(loss)
            self.optimizer.step()
        return step
"""
    assert lint(tmp_path, {"trainer.py": trainer, "run.py": SCRIPT}) == []


def test_a_rank_or_setting_looked_up_by_its_key_is_no_rare_branch() -> None:
    source = """\
def train(loader, model, opt, device, config):
    for i, x in enumerate(loader):
        loss = model(x.to(device))
        loss.backward()
        opt.step()
        if config["global_rank"] == 0:
            print(f"{loss.item():.3f}")
        if i == 0:
            print(loss.item())
"""
    # `i == 0` is the first step; `config["global_rank"] == 0` is every step of the main
    # process
    assert _lines(source, "TPL201") == [7]


OLD_TIMER = """\
import time

def train(loader, model, criterion, opt):
    model.cuda()
    end = time.time()
    for x, y in loader:
        x, y = x.cuda(), y.cuda()
        loss = criterion(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.update(loss.data[0], x.size(0))
        batch_time.update(time.time() - end)
        end = time.time()
"""


def test_a_step_timed_across_a_pre_0_4_loss_read_waits_for_the_device() -> None:
    # `loss.data[0]` is `.item()` before PyTorch 0.4: the step's clock reads a finished step
    assert _lines(OLD_TIMER, "TPL301") == []
    # `x.data[0]` is the batch's first row: no wait
    assert _lines(OLD_TIMER.replace("loss.data[0]", "x.data[0]"), "TPL301") == [5]
