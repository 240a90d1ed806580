"""Corpus round 14: patterns found on new real code (RL, detection, diffusion, speech, LLM
pre-training), each as a minimal snippet: what is now reported and its look-alikes."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchplace.lint import lint_source
from torchplace.lint.engine import lint_bytes

from .helpers import lines

# ---- TPL201: copies made per element of a step are not the step's one bulk output

PER_ROW = """\
import torch


def evaluate(model, loader, device):
    results = []
    for x, y in loader:
        x = x.to(device)
        out = model(x)
        for i in range(out.size(0)):
            results.append("{} {}".format(out[i].cpu().numpy().tolist(), y[i]))
    with open("results.txt", "w") as f:
        f.writelines(results)
"""

PER_CLASS = """\
import pickle
import numpy as np


def detect(net, dataset, device):
    boxes = [[None] * len(dataset) for _ in range(21)]
    for i in range(len(dataset)):
        x = dataset[i].unsqueeze(0).to(device)
        dets = net(x)
        for j in range(1, dets.size(1)):
            d = dets[0, j]
            boxes[j][i] = d.cpu().numpy()
    with open("dets.pkl", "wb") as f:
        pickle.dump(boxes, f)
"""

PER_IMAGE_FILE = """\
import torch
from PIL import Image


def save_all(model, loader, device):
    for n, x in enumerate(loader):
        x = x.to(device)
        out = model(x)
        for i in range(len(out)):
            image = out[i].cpu().numpy()
            Image.fromarray(image).save("%d_%d.png" % (n, i))
"""

GATHERED = """\
import numpy as np
import torch
import torch.distributed as dist


def sample(model, loader, device, world):
    images = []
    for x in loader:
        y = model(x.to(device))
        parts = [torch.zeros_like(y) for _ in range(world)]
        dist.all_gather(parts, y)
        for part in parts:
            images.append(part.cpu().numpy())
    np.savez("samples.npz", np.concatenate(images))
"""


def test_per_row_copies_collected_for_a_file_are_reported() -> None:
    assert lines(PER_ROW, "TPL201") == [10]


def test_per_class_copies_of_each_images_detections_are_reported() -> None:
    assert lines(PER_CLASS, "TPL201") == [12]


def test_a_loop_that_writes_each_element_out_is_the_output() -> None:
    assert lines(PER_IMAGE_FILE, "TPL201") == []


def test_bulk_copies_of_a_list_of_whole_tensors_are_the_output() -> None:
    assert lines(GATHERED, "TPL201") == []


def test_an_unmoved_item_of_a_batch_indexed_by_position_is_on_the_host() -> None:
    source = """\
def evaluate(model, loader, device):
    lines = []
    for batch in loader:
        videos = batch[0]
        ids = batch[2]
        videos = videos.to(device)
        out = model(videos)
        for i in range(out.size(0)):
            lines.append("{} {}".format(int(ids[i].cpu().numpy()), i))
    return lines
"""
    assert lines(source, "TPL201") == []


# ---- TPL201: str() and repr() of a device tensor are reads, as print() is

STR = """\
def run(net, loader, f):
    for x in loader:
        x = x.cuda()
        y = net(x)
        score = y[0, 1]
        f.write("score: " + str(score) + "\\n")
        f.write(str(len(y)) + repr(x.shape))
"""


def test_str_of_a_device_value_in_a_batch_loop_is_reported() -> None:
    found = lint_source(STR, "run.py", select={"TPL201"})
    assert [(f.line, "`str()`" in f.message) for f in found] == [(6, True)]


# ---- TPL201: a test.py with argparse at import, or test_* helpers it calls itself, runs

EVAL_SCRIPT = """\
import argparse
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--weights")
args = parser.parse_args()


def test_net(net, images):
    for image in images:
        y = net(image.cuda())
        print(y.sum().item())


def test_all():
    net = torch.load(args.weights, map_location="cpu", weights_only=False).cuda()
    test_net(net, [])


if __name__ == "__main__":
    test_all()
"""


def test_an_evaluation_script_named_test_py_is_linted() -> None:
    assert lines(EVAL_SCRIPT, "TPL201", "test.py") == [12]
    helpers = EVAL_SCRIPT.replace("args = parser.parse_args()", "args = None")
    helpers = helpers.replace("test_all", "main")
    assert lines(helpers, "TPL201", "test.py") == [12]  # `test_net(net, [])`: a helper
    assert (
        lines(EVAL_SCRIPT.replace("args = parser.parse_args()", "args = None"), "TPL201", "test.py")
        == []
    )  # `test_all()`: a runner collects it


def test_a_test_module_with_its_own_main_is_still_a_test() -> None:
    source = """\
import torch


def test_sum():
    x = torch.ones(3).cuda()
    for _ in range(3):
        assert x.sum().item() == 3


if __name__ == "__main__":
    test_sum()
"""
    assert lines(source, "TPL201", "test.py") == []


# ---- TPL201: rare branches through flags and `or`

FLAGS = """\
def train(model, loader, device, interval, to_np):
    steps = len(loader)
    for i, (x, y) in enumerate(loader, 1):
        x = x.to(device)
        out = model(x)
        out.sum().backward()
        epoch_eval = interval == -1 and i == steps
        step_eval = interval > 0 and i % interval == 0
        if epoch_eval or step_eval:
            to_np(out)
            print(out.sum().item())
        if epoch_eval or x.sum() > 0:
            print(out.mean().item())
"""


def test_an_or_of_rare_flags_is_a_rare_branch() -> None:
    assert lines(FLAGS, "TPL201") == [12, 13]


# ---- TPL201: what the project's own functions and methods hand back

CHECKPOINT = """\
import torch


def load_checkpoint(path, model, optimizer):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    return model, optimizer, state["iteration"]


def train(path, model, optimizer, loader):
    model = model.cuda()
    model, optimizer, iteration = load_checkpoint(path, model, optimizer)
    for x in loader:
        loss = model(x.cuda()).sum()
        loss.backward()
        optimizer.step()
        print("{}: {}".format(iteration, iteration + 1))
        print("{}".format(model(x.cuda()).sum()))
"""


def test_tuple_elements_of_a_project_functions_return_keep_their_own_place() -> None:
    assert lines(CHECKPOINT, "TPL201") == [18]


STEP_COUNTER = """\
import numpy as np
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("step", torch.zeros(1, dtype=torch.long))

    def forward(self, x):
        self.step += 1
        return self.fc(x)

    def get_step(self):
        return self.step.item()

    def get_name(self) -> str:
        return "net"


def train(loader, device):
    model = Net().to(device)
    for x in loader:
        loss = model(x.to(device)).sum()
        loss.backward()
        step = model.get_step()
        k = np.ceil(step / 1000)
        print(f"{model.get_name()} {step} {k}")
"""


def test_a_moved_models_method_returning_a_number_gives_a_host_value() -> None:
    # the read is inside `get_step` (line 17), once per batch, on the moved model's buffer;
    # what it returns, and NumPy of it, are host numbers in the caller
    assert lines(STEP_COUNTER, "TPL201") == [17]


def test_a_moved_models_method_reading_a_plain_attribute_is_left_alone() -> None:
    source = STEP_COUNTER.replace(
        'self.register_buffer("step", torch.zeros(1, dtype=torch.long))', "self.step = None"
    )
    assert lines(source, "TPL201") == []


def test_a_model_method_called_from_another_module_per_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "pkg"
    (package / "models").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models" / "__init__.py").write_text("")
    model = "\n".join(STEP_COUNTER.splitlines()[:20]) + "\n"
    (package / "models" / "net.py").write_text(model)
    (package / "train.py").write_text(
        "from pkg.models.net import Net\n\n\n"
        "def train(loader, device):\n"
        "    model = Net().to(device)\n"
        "    for x in loader:\n"
        "        model(x.to(device)).sum().backward()\n"
        "        print(model.get_step())\n"
    )
    monkeypatch.chdir(tmp_path)
    found = lint_bytes(model.encode(), "pkg/models/net.py", select={"TPL201"})
    assert [f.line for f in found] == [17]


# ---- TPL201: copies of a batch's output collected row by row and returned

RETURNED_ROWS = """\
import numpy as np
import torch


def synthesize(model, batches, device, with_attention=False):
    specs = []
    for batch in batches:
        chars = np.stack([np.asarray(t) for t in batch])
        chars = torch.tensor(chars).long().to(device)
        mels, attention = model(chars)
        mels = mels.detach().cpu().numpy()
        for m in mels:
            while np.max(m[:, -1]) < 0.1:
                m = m[:, :-1]
            specs.append(m)
    return (specs, attention) if with_attention else specs
"""


def test_rows_of_the_copies_appended_and_returned_are_the_output() -> None:
    assert lines(RETURNED_ROWS, "TPL201") == []


# ---- TPL701: a host dtype conversion allocates pageable memory again

PAGEABLE = """\
import torch


def batches(n):
    while True:
        lengths = torch.full((n,), 4)
        lengths[0] = 0
        lengths = lengths.to(dtype=torch.int32)
        pinned = torch.empty(n, dtype=torch.int32, pin_memory=True)
        pinned = pinned.to(dtype=torch.int32)
        yield (
            lengths.to(device="cuda:0", non_blocking=True),
            pinned.to(device="cuda:0", non_blocking=True),
        )
"""


def test_a_dtype_conversion_of_a_factory_result_stays_pageable() -> None:
    assert lines(PAGEABLE, "TPL701", "data.py") == [12]


# ---- TPL102: the `else` of a test that the value is on CUDA is not a CUDA branch

ELSE_OF_CUDA = """\
import torch
import torch.nn as nn


class Flow(nn.Module):
    def infer(self, spect):
        if spect.type() == "torch.cuda.HalfTensor":
            noise = torch.cuda.HalfTensor(spect.size(0), 8).normal_()
        else:
            noise = torch.cuda.FloatTensor(spect.size(0), 8).normal_()
        if spect.is_cuda:
            spect = spect.cuda()
        else:
            spect = spect.cpu()
        return noise, spect
"""


def test_cuda_placement_in_the_else_of_a_cuda_test_is_reported() -> None:
    assert lines(ELSE_OF_CUDA, "TPL102", "flow.py") == [10]
