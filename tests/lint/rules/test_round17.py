"""Corpus round 17: pitfalls the labelled corpus showed were missed, in general form (a helper
a sibling module calls per batch, a batch fetched by a helper in a counter loop, a list of
device scalars turned into a tensor, a trimmed format string, a buffer read in a method the
module's forward calls, a `|` of tensor tests), each next to the look-alike that must stay
clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import lines

# ---- TPL201: a module-level helper that a sibling script imports and calls per batch

MEL = """\
import torch


def mel_spectrogram(y):
    if torch.min(y) < -1.0:
        print("min value is", torch.min(y))
    return torch.stft(y, 1024)
"""

TRAINS = """\
from mel import mel_spectrogram


def train(model, loader, optimizer, device):
    for x in loader:
        x = x.to(device)
        loss = mel_spectrogram(model(x)).abs().mean()
        loss.backward()
        optimizer.step()
"""

SHOWS_ONCE = """\
from mel import mel_spectrogram


def show(model, x, device):
    return mel_spectrogram(model(x.to(device)))
"""


def _project(tmp_path_factory: pytest.TempPathFactory, caller: str) -> Path:
    root = tmp_path_factory.mktemp("project")  # not a `test*` folder: linted as code
    (root / "mel.py").write_text(MEL)
    (root / "caller.py").write_text(caller)
    return root / "mel.py"


def test_a_helper_a_sibling_calls_in_its_batch_loop_is_per_batch(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = _project(tmp_path_factory, TRAINS)
    # the range test reads every batch; the print runs only for a value out of range
    assert lines(MEL, "TPL201", str(path)) == [5]


def test_a_helper_a_sibling_calls_once_is_left_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = _project(tmp_path_factory, SHOWS_ONCE)
    assert lines(MEL, "TPL201", str(path)) == []


# ---- TPL201: a counter loop that fetches a device batch from a helper each turn (nanoGPT)

EVAL_ITERS = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"


def get_batch(data):
    ix = torch.randint(len(data), (8,))
    x = torch.stack([data[i] for i in ix])
    return x.pin_memory().to(device, non_blocking=True)


@torch.no_grad()
def estimate_loss(model, data):
    losses = torch.zeros(100)
    for k in range(100):
        x = get_batch(data)
        losses[k] = model(x).sum().item()
    return losses.mean()
"""


def test_a_counter_loop_fetching_a_device_batch_is_a_batch_loop() -> None:
    assert lines(EVAL_ITERS, "TPL201") == [17]


def test_a_counter_loop_fetching_a_host_batch_is_left_alone() -> None:
    source = EVAL_ITERS.replace(".pin_memory().to(device, non_blocking=True)", "")
    assert lines(source, "TPL201") == []


# ---- TPL201: `torch.tensor(...)` of a list of 0-dim device tensors, and a trimmed format

DETECT = """\
import torch


def detect(model, dataset, device, txt_path):
    for path, img in dataset:
        img = torch.from_numpy(img).to(device)
        pred = model(img)[0]
        for *xyxy, conf, cls in reversed(pred):
            xywh = torch.tensor(xyxy).view(-1).tolist()
            line = (cls, *xywh, conf)
            with open(txt_path, "a") as f:
                f.write(("%g " * len(line)).rstrip() % line + "\\n")
"""


def test_a_tensor_of_device_scalars_and_a_trimmed_format_are_reported() -> None:
    assert lines(DETECT, "TPL201") == [9, 12]


def test_the_same_rows_of_a_host_array_are_left_alone() -> None:
    source = DETECT.replace("import torch", "import numpy as np\nimport torch").replace(
        "pred = model(img)[0]", "pred = np.loadtxt(path)"
    )
    assert lines(source, "TPL201") == []


PAIRS = """\
import torch


def evaluate(model, loader, device):
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        picked = []
        for i in range(images.shape[0]):
            index = torch.randint(0, images.shape[0], (1,)).item()
            picked.append(labels[index])
        other = torch.tensor(picked).to(device)
        model(images, other)
"""


def test_a_tensor_of_a_list_grown_with_device_scalars_is_reported() -> None:
    assert lines(PAIRS, "TPL201") == [11]


def test_a_tensor_of_a_list_grown_with_host_indices_is_left_alone() -> None:
    source = PAIRS.replace("picked.append(labels[index])", "picked.append(index)")
    assert lines(source, "TPL201") == []


# ---- TPL201: a buffer read in a helper method that the moved module's forward calls (MoCo)

QUEUE = """\
import torch
import torch.nn as nn


class Queue(nn.Module):
    def __init__(self, dim, k):
        super().__init__()
        self.k = k
        self.encoder = nn.Linear(dim, dim)
        self.register_buffer("queue", torch.randn(dim, k))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    def _enqueue(self, keys):
        ptr = int(self.queue_ptr)
        self.queue[:, ptr : ptr + keys.shape[0]] = keys.T

    def forward(self, x):
        keys = self.encoder(x)
        self._enqueue(keys)
        return keys.sum()


def main(loader):
    model = Queue(128, 4096).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in loader:
        loss = model(x.cuda(non_blocking=True))
        loss.backward()
        optimizer.step()
"""


def test_a_buffer_read_in_a_method_forward_calls_is_per_batch() -> None:
    assert lines(QUEUE, "TPL201") == [14]


def test_a_plain_int_attribute_read_there_is_left_alone() -> None:
    source = QUEUE.replace(
        'self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))',
        "self.queue_ptr = 0",
    )
    assert lines(source, "TPL201") == []


# ---- TPL201: tensor tests joined with `|` in a condition

NAN_OR_INF = """\
import torch


def train(model, loader, optimizer, device):
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        if torch.isnan(loss).any() | torch.isinf(loss).any():
            print("bad loss")
        loss.backward()
        optimizer.step()
"""


def test_tensor_tests_joined_with_a_bar_are_reported() -> None:
    assert lines(NAN_OR_INF, "TPL201") == [8]


def test_host_flags_joined_with_a_bar_are_left_alone() -> None:
    source = """\
import torch


def rollout(env, policy, device, steps):
    obs = env.reset()
    for t in range(steps):
        action = policy(torch.as_tensor(obs).to(device)).argmax()
        obs, reward, terminated, truncated, info = env.step(action.item())
        if terminated | truncated:
            obs = env.reset()
"""
    assert lines(source, "TPL201") == []


# ---- TPL104: a name bound to bare "cuda" that places tensors in multi-rank code

DDP_SCRIPT = """\
import torch
import torch.distributed as dist

if __name__ == "__main__":
    device = "cuda"
    dist.init_process_group(backend="nccl")
    generator = Generator().to(device)
"""


def test_a_name_bound_to_bare_cuda_that_places_is_reported() -> None:
    assert lines(DDP_SCRIPT, "TPL104") == [5]


def test_the_same_name_in_a_single_process_script_is_left_alone() -> None:
    source = DDP_SCRIPT.replace('    dist.init_process_group(backend="nccl")\n', "")
    assert lines(source, "TPL104") == []


def test_the_same_name_compared_as_a_backend_is_left_alone() -> None:
    source = (
        DDP_SCRIPT + '    if device == "cuda":\n        torch.backends.cudnn.benchmark = True\n'
    )
    assert lines(source, "TPL104") == []
