"""Recall round 29: pitfalls missed on inference and deployment code (multimodal chat
models, GAN metrics and training loops, numbered tutorial projects), beyond host reads, each
next to the look-alike that must stay clean: a ``non_blocking`` copy of the host mask a helper
builds, ``pin_memory()`` in a function that runs once per batch or in a loop that generates
with a moved model, the training script of a tutorial folder whose name starts with
``Test``, a ``device="cuda"`` default of a detector class that asks whether it is the CPU,
and an FPS measurement of a model moved with ``model.to(device).eval()``."""

from __future__ import annotations

from pathlib import Path

from .helpers import lines as _lines
from .helpers import project as _project

# ---- TPL701: a non_blocking copy of the host tensor a helper builds

ATTENTION = """\
import torch
import torch.nn as nn


def make_mask(n):
    q = torch.arange(n) - n
    return q.view(-1, 1) >= q.view(1, -1)


class Attention(nn.Module):
    def forward(self, xq, mask=None):
        if isinstance(mask, str):
            mask = self._make_causal_mask(xq.size(2), xq.size(2))
            mask = mask.to(xq.device, non_blocking=True)
        other = make_mask(xq.size(1)).to(xq.device, non_blocking=True)
        return xq, mask, other

    def _make_causal_mask(self, q_len: int, kv_len: int) -> torch.Tensor:
        q_indices = torch.arange(q_len) - q_len
        kv_indices = torch.arange(kv_len) - kv_len
        causal_mask_bool = q_indices.view(-1, 1) >= kv_indices.view(1, -1)
        return causal_mask_bool
"""


def test_a_non_blocking_copy_of_a_helpers_host_mask_is_reported() -> None:
    assert _lines(ATTENTION, "TPL701", "model.py") == [14, 15]


def test_a_helper_that_builds_on_the_device_or_pins_is_left_alone() -> None:
    source = ATTENTION.replace(
        "q_indices = torch.arange(q_len) - q_len",
        "q_indices = torch.arange(q_len, device=self.device) - q_len",
    ).replace("q = torch.arange(n) - n", "q = torch.arange(n).pin_memory() - n")
    assert _lines(source, "TPL701", "model.py") == []


def test_a_helper_that_compares_a_parameter_is_left_alone() -> None:
    # `x > 0` of what the caller hands: it may already be on the device
    source = ATTENTION.replace(
        "q_indices = torch.arange(q_len) - q_len", "q_indices = q_len"
    ).replace("q = torch.arange(n) - n", "q = n")
    assert _lines(source, "TPL701", "model.py") == []


# ---- TPL702: pin_memory() in a function that runs once per batch, or in a generation loop

GET_BATCH = """\
import numpy as np
import torch

device = "cuda"
data = np.memmap("train.bin", dtype=np.uint16, mode="r")


def get_batch(split):
    ix = torch.randint(len(data) - 8, (4,))
    x = torch.stack([torch.from_numpy(data[i : i + 8].astype(np.int64)) for i in ix])
    x = x.pin_memory().to(device, non_blocking=True)
    return x


def train(model, optimizer):
    for it in range(1000):
        x = get_batch("train")
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
"""


def test_pin_memory_in_a_batch_helper_is_reported() -> None:
    assert _lines(GET_BATCH, "TPL702") == [11]


def test_pin_memory_in_a_helper_called_once_or_a_collate_function_is_left_alone() -> None:
    once = GET_BATCH.replace(
        '    for it in range(1000):\n        x = get_batch("train")\n',
        '    x = get_batch("train")\n    for it in range(1000):\n',
    )
    assert _lines(once, "TPL702") == []
    collate = GET_BATCH.replace("def get_batch(split):", "def collate_batch(split):").replace(
        'get_batch("train")', 'collate_batch("train")'
    )
    assert _lines(collate, "TPL702") == []


METRICS = """\
import copy

import numpy as np
import torch


def compute_features(opts, dataset, batch_size, num_items):
    G = copy.deepcopy(opts.G).eval().requires_grad_(False).to(opts.device)
    feats = []
    while len(feats) < num_items:
        z = torch.randn([batch_size, G.z_dim], device=opts.device)
        c = [dataset.get_label(np.random.randint(len(dataset))) for _i in range(batch_size)]
        c = torch.from_numpy(np.stack(c)).pin_memory().to(opts.device)
        feats.append(run_generator(G, z, c))
    return feats
"""


def test_pin_memory_in_a_generation_loop_is_reported() -> None:
    assert _lines(METRICS, "TPL702", "metric_utils.py") == [13]


OFFLOAD = """\
import torch


def onload(tensors, params, device):
    for key, param in params.items():
        pinned = tensors[key].pin_memory()
        param.data = pinned.to(device, non_blocking=True)


def cases(arrays, preprocess):
    for a in arrays:
        data = preprocess(a)
        yield {"data": torch.from_numpy(data).contiguous().pin_memory()}
"""


def test_pin_memory_in_an_offload_pass_or_a_generator_is_left_alone() -> None:
    # a pass moving a state's tensors one by one, and a generator handing out pinned cases
    # as a pinning loader does: no step of work per pin
    assert _lines(OFFLOAD, "TPL702", "offload.py") == []


# ---- test folders: a numbered tutorial's training script is a program, not a test

TUTORIAL = """\
import torch
from model import resnet34


def main():
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    net = resnet34().to(device)
    optimizer = torch.optim.Adam(net.parameters())
    for epoch in range(3):
        running_loss = 0.0
        for images, labels in train_loader:
            optimizer.zero_grad()
            loss = loss_function(net(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()


if __name__ == "__main__":
    main()
"""


def test_a_program_in_a_numbered_tutorial_folder_is_linted(tmp_path: Path) -> None:
    files = {"classification/Test2_cnn/train.py": TUTORIAL}
    assert _project(tmp_path / "repo", files, "TPL201") == [
        ("classification/Test2_cnn/train.py", 16)
    ]


def test_programs_in_a_test_suite_folder_and_test_modules_stay_tests(tmp_path: Path) -> None:
    suite = {"tests/train.py": TUTORIAL, "test_models/test_train.py": TUTORIAL}
    assert _project(tmp_path / "repo", suite, "TPL201") == []
    collected = TUTORIAL.replace("def main():", "def test_main():").replace(
        "    main()", "    test_main()"
    )
    assert _project(tmp_path / "other", {"test_cases/train.py": collected}, "TPL201") == []


# ---- TPL104: a "cuda" default of a class that places with it and asks whether it is the CPU

DETECTOR = """\
import torch


class Detector:
    def __init__(self, weight_path, device="cuda"):
        self.device = device
        self.model = build_model()
        self.model.load_state_dict(torch.load(weight_path, map_location=self.device))
        if self.device == "cpu":
            self.model = self.model.module.to(self.device)
"""


def test_a_cuda_default_compared_with_the_cpu_is_reported() -> None:
    assert _lines(DETECTOR, "TPL104", "detector.py") == [5]


def test_a_cuda_default_compared_as_a_backend_name_is_left_alone() -> None:
    # `if self.device == "cuda":` reads the setting as a backend's name
    source = DETECTOR.replace('if self.device == "cpu":', 'if self.device == "cuda":')
    assert _lines(source, "TPL104", "detector.py") == []


# ---- TPL301: a model moved in a chain that ends with `.eval()`, then its forward timed

FPS = """\
import time

import torch


def main(model, images, device):
    model.to(device).eval()
    total_fps = 0.0
    for image in images:
        image = torch.unsqueeze(image, 0)
        start_time = time.time()
        with torch.no_grad():
            outputs = model(image.to(device))
        end_time = time.time()
        total_fps += 1 / (end_time - start_time)
    return total_fps
"""


def test_a_forward_of_a_model_moved_then_set_to_eval_is_timed() -> None:
    assert _lines(FPS, "TPL301", "inference.py") == [11]
    assigned = FPS.replace("model.to(device).eval()", "model = model.to(device).eval()")
    assert _lines(assigned, "TPL301", "inference.py") == [11]


def test_a_synchronized_or_cpu_forward_is_left_alone() -> None:
    synced = FPS.replace(
        "        end_time = time.time()",
        "        torch.cuda.synchronize()\n        end_time = time.time()",
    )
    assert _lines(synced, "TPL301", "inference.py") == []
    on_cpu = FPS.replace("model.to(device).eval()", 'model.to("cpu").eval()').replace(
        "model(image.to(device))", "model(image)"
    )
    assert _lines(on_cpu, "TPL301", "inference.py") == []


# ---- TPL701: batches of a loader that the file's own caller builds without pin_memory

ENCODER = """\
import torch
from torch.utils.data import DataLoader


def setup_loader(dataset, workers):
    loader = DataLoader(dataset, num_workers=workers, collate_fn=dataset.collate_fn)
    return loader, dataset.classes


def train(model, optimizer, criterion, data_loader):
    for _, data in enumerate(data_loader):
        inputs, labels = data
        inputs = inputs.cuda(non_blocking=True)
        loss = criterion(model(inputs), labels.cuda(non_blocking=True))
        loss.backward()
        optimizer.step()


def main(model, optimizer, criterion, dataset):
    train_loader, classes = setup_loader(dataset, 4)
    train(model, optimizer, criterion, train_loader)
"""


def test_a_loader_the_caller_builds_without_pin_memory_is_reported() -> None:
    assert _lines(ENCODER, "TPL701", "train_encoder.py") == [13, 14]


def test_a_pinned_loader_or_one_of_unknown_origin_is_left_alone() -> None:
    pinned = ENCODER.replace("num_workers=workers,", "num_workers=workers, pin_memory=True,")
    assert _lines(pinned, "TPL701", "train_encoder.py") == []
    handed = ENCODER.replace(
        "def main(model, optimizer, criterion, dataset):\n"
        "    train_loader, classes = setup_loader(dataset, 4)\n",
        "def main(model, optimizer, criterion, train_loader):\n",
    )
    assert _lines(handed, "TPL701", "train_encoder.py") == []


def test_a_helper_copying_what_it_is_handed_is_left_alone() -> None:
    # `torch.tensor(x)` of a tensor the caller hands copies it where it lives
    source = ATTENTION.replace("q = torch.arange(n) - n", "q = torch.tensor(n) * 2").replace(
        "q_indices = torch.arange(q_len) - q_len", "q_indices = torch.as_tensor(q_len)"
    )
    assert _lines(source, "TPL701", "model.py") == []
