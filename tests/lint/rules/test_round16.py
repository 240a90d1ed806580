"""Corpus round 16: false positives found on new real code (a recommender library and its
tutorial notebooks, GNN benchmarks, a diffusion trainer, speech separation recipes, course
notebooks), each as the look-alike that must stay clean next to the pitfall that must still be
found."""

from __future__ import annotations

import json

import pytest

from torchplace.lint.notebook import lint_notebook

from .helpers import lines

# ---- TPL104: a process group of one rank is one process, not multi-rank code

ONE_RANK = """\
import os
import torch
import torch.distributed as dist

os.environ["RANK"] = "0"
os.environ["WORLD_SIZE"] = "1"
dist.init_process_group(backend="nccl")
model = Net(device=torch.device("cuda"))
"""


def test_a_process_group_of_one_rank_is_left_alone() -> None:
    assert lines(ONE_RANK, "TPL104") == []


def test_a_world_size_keyword_of_one_is_left_alone() -> None:
    source = ONE_RANK.replace('os.environ["WORLD_SIZE"] = "1"\n', "").replace(
        'backend="nccl"', 'backend="nccl", rank=0, world_size=1'
    )
    assert lines(source, "TPL104") == []


def test_a_world_size_default_for_a_launcher_is_still_multi_rank() -> None:
    source = ONE_RANK.replace(
        'os.environ["WORLD_SIZE"] = "1"',
        'if "WORLD_SIZE" not in os.environ:\n    os.environ["WORLD_SIZE"] = "1"',
    )
    assert lines(source, "TPL104") == [9]


# ---- TPL601: a device bound to an indexed CUDA f-string makes the code CUDA-only

INDEXED = """\
import torch
import torch.distributed as dist


def test_lookup():
    rank = dist.get_rank()
    device = torch.device(f"cuda:{rank}")
    torch.cuda.set_device(device)
"""


def test_set_device_after_an_f_string_cuda_device_is_left_alone() -> None:
    assert lines(INDEXED, "TPL601", "test_lookup.py") == []


def test_set_device_without_a_cuda_binding_is_reported() -> None:
    source = INDEXED.replace('torch.device(f"cuda:{rank}")', "pick(rank)")
    assert lines(source, "TPL601", "test_lookup.py") == [8]


# ---- TPL202: synchronizing each device in turn, by index

EACH_DEVICE = """\
import torch


def finish(loader, model):
    for di in range(torch.cuda.device_count()):
        torch.cuda.synchronize(torch.device(f"cuda:{di}"))
    for x in loader:
        model(x.cuda())
        torch.cuda.synchronize(x.device)
"""


def test_a_loop_over_device_indices_is_left_alone() -> None:
    # the batch loop's sync on the batch's device is still a sync per step
    assert lines(EACH_DEVICE, "TPL202") == [9]


# ---- TPL103: a factory handed to a helper together with the device it goes to

PIN_AND_MOVE = """\
import torch
from torch import nn


class Lookup(nn.Module):
    def forward(self, x, strides):
        spk = _pin_and_move(torch.tensor(strides), x.device)
        other = combine(torch.tensor(strides), x)
        return x[spk] + other
"""


def test_a_factory_moved_by_the_call_it_is_handed_to_is_left_alone() -> None:
    assert lines(PIN_AND_MOVE, "TPL103") == [8]


# ---- TPL501: a test's stand-in module

STAND_IN = """\
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.tensors = {"t1": torch.ones(2, 3)}
"""


def test_a_plain_container_in_a_test_module_is_left_alone() -> None:
    assert lines(STAND_IN, "TPL501", "tests/test_lazy.py") == []
    assert lines(STAND_IN, "TPL501", "model.py") == [8]


# ---- TPL301: the CPU path of a device-type branch, and a copy of host data

CPU_BRANCH = """\
import time
import torch


def bench(model, inputs, device):
    model = model.to(device)
    if device.type == "cuda":
        start = time.time()
        for x in inputs:
            model(x.to(device))
        duration = time.time() - start
    else:
        start = time.time()
        for x in inputs:
            model(x.to(device))
        duration = time.time() - start
    return duration
"""


def test_timing_in_the_cpu_branch_of_a_device_test_is_left_alone() -> None:
    assert lines(CPU_BRANCH, "TPL301") == [8]


HOST_COPY = """\
import time
import torch


def read(features, model, device):
    model.to(device)
    t = time.perf_counter()
    features = torch.from_numpy(features).float().to(device)
    print(time.perf_counter() - t)
    t = time.perf_counter()
    out = model(features)
    print(time.perf_counter() - t)
    return out
"""


def test_timing_a_blocking_copy_of_host_data_is_left_alone() -> None:
    assert lines(HOST_COPY, "TPL301") == [10]


def test_timing_a_non_blocking_copy_is_reported() -> None:
    source = HOST_COPY.replace(".float().to(device)", ".float().to(device, non_blocking=True)")
    assert lines(source, "TPL301") == [7, 10]


# ---- TPL201: a loop over a literal display of a few items under a periodic branch

SAMPLE_EVERY = """\
import torch


class Trainer:
    def train_step(self):
        steps = self.steps
        loss = self.model(next(self.dl).to(self.device))
        loss.backward()
        if not (steps % self.save_every):
            for model, name in ((self.ema, "ema"), (self.model, "model")):
                recons = model(next(self.dl).to(self.device))
                save(recons.detach().cpu(), name)

    def train(self):
        while True:
            self.train_step()
"""


def test_a_few_item_loop_under_a_periodic_branch_is_periodic() -> None:
    assert lines(SAMPLE_EVERY, "TPL201") == []


def test_the_same_loop_on_every_step_is_reported() -> None:
    source = SAMPLE_EVERY.replace("if not (steps % self.save_every):", "if True:")
    assert lines(source, "TPL201") == [12]


# ---- TPL401: a class named as a dataset, and a file a sibling script writes from host data

NAMED_DATASET = """\
import torch


class GraphPropPredDataset(object):
    def get_idx_split(self, path):
        return torch.load(path + "/split_dict.pt")


class GraphPropPredModel(object):
    def restore(self, path):
        return torch.load(path + "/split_dict.pt")


device = "cpu"
"""


def test_a_class_named_as_a_dataset_is_left_alone() -> None:
    assert lines(NAMED_DATASET, "TPL401", "ogb/graph.py") == [11]


LOADS = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.load("embedding.pt")
"""


def test_a_file_a_sibling_script_saves_from_host_data_is_left_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    tmp_path = tmp_path_factory.mktemp("project")  # not a `test*` folder: linted as code
    (tmp_path / "node2vec.py").write_text(
        "import torch\n\n\ndef save(model):\n"
        '    torch.save(model.embedding.weight.data.cpu(), "embedding.pt")\n'
    )
    assert lines(LOADS, "TPL401", str(tmp_path / "gnn.py")) == []


def test_a_file_a_sibling_script_saves_from_the_device_is_reported(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    tmp_path = tmp_path_factory.mktemp("project")
    (tmp_path / "node2vec.py").write_text(
        "import torch\n\n\ndef save(model):\n"
        '    torch.save(model.cuda().embedding.weight.data, "embedding.pt")\n'
    )
    assert lines(LOADS, "TPL401", str(tmp_path / "gnn.py")) == [4]


# ---- TPL102: a static training step the class hosts, and a method named for the GPU

HOSTED = """\
import torch
from torch import nn


class KGEModel(nn.Module):
    def forward(self, sample):
        return self.score(sample) + self.make_mask(sample.size(0))

    @staticmethod
    def make_mask(n):
        return torch.ones(n).cuda()

    @staticmethod
    def train_step(model, optimizer, iterator, args):
        positive = next(iterator)
        if args.cuda:
            positive = positive.cuda()
        return model(positive)

    def one_unet_in_gpu(self, unet):
        self.cuda()
        self.unets.to(torch.device("cpu"))
        unet.to(torch.device("cuda"))
"""


def test_a_static_step_and_a_gpu_named_method_are_left_alone() -> None:
    # the static helper `forward` calls places a tensor of the module's own computation
    assert lines(HOSTED, "TPL102") == [11]


# ---- TPL801: the moved model is one a loop's step binds before the move

NEW_EACH_STEP = """\
import torch
from torch import nn


def run(device, X):
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.step()
    for mod in range(3):
        model = nn.Sequential(nn.Linear(2, 2))
        model.to(device)
        optimizer = torch.optim.Adam(model.parameters())
        optimizer.step()
"""


def test_a_model_rebuilt_in_the_loop_before_its_move_is_left_alone() -> None:
    assert lines(NEW_EACH_STEP, "TPL801") == []


def test_the_same_model_moved_in_a_loop_is_reported() -> None:
    source = NEW_EACH_STEP.replace("        model = nn.Sequential(nn.Linear(2, 2))\n", "")
    assert lines(source, "TPL801") == [7]


# ---- TPL101: a notebook cell's last expression is its displayed output


def _notebook(*cells: str) -> bytes:
    document = {
        "cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "source": c} for c in cells],
        "metadata": {"kernelspec": {"language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(document).encode()


def test_a_transfer_shown_as_a_cells_output_is_left_alone() -> None:
    raw = _notebook(
        "import torch\nm = torch.ones(2)",
        'device = torch.device("cuda")\nm.to(device)\n# shows the copy',
        "m.to(device)\nprint(m)",
    )
    found = [(f.cell, f.line) for f in lint_notebook(raw, "nb.ipynb", select={"TPL101"})]
    assert found == [(3, 1)]


def test_a_wildcard_help_search_is_ipythons() -> None:
    raw = _notebook("import torch\ntorch.*Tensor?", "torch.* Tensor?")
    found = [(f.cell, f.line) for f in lint_notebook(raw, "nb.ipynb", select={"TPL000"})]
    assert found == [(2, 1)]


def test_a_package_magic_without_its_percent_is_ipythons() -> None:
    raw = _notebook("pip install -r requirements.txt", "pip = 3\nprint(pip)", "pip freeze x y")
    found = [(f.cell, f.line) for f in lint_notebook(raw, "nb.ipynb", select={"TPL000"})]
    assert found == [(3, 1)]  # only `install`/`uninstall` are taken for the magic


# ---- TPL103: a factory reshaped, then placed with the view

RESHAPED = """\
import torch
from einops import rearrange
from torch import nn


class Extrapolate(nn.Module):
    def forward(self, x, t):
        grid = rearrange(torch.arange(t, dtype=torch.float), "t -> () t").to(x.device)
        steps = rearrange(torch.arange(t, dtype=torch.float), "t -> () t")
        return x * grid + x * steps
"""


def test_a_factory_placed_through_a_reshape_is_left_alone() -> None:
    assert lines(RESHAPED, "TPL103") == [9]


# ---- TPL201: a copy handed only to in-place writes fills a table kept on the host

HOST_TABLE = """\
import torch


def update(self, loader):
    for idx, grad in loader:
        grad = grad.cuda()
        loss = self.model(grad)
        loss.backward()
        tmp = (-self.lr * grad).cpu()
        self.global_emb.index_add_(0, idx, tmp)
        rows = (-self.lr * grad).cpu()
        print(rows.sum())
"""


def test_a_copy_only_written_into_a_table_in_place_is_left_alone() -> None:
    assert lines(HOST_TABLE, "TPL201") == [11]
