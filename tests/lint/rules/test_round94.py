"""Round 94, what the older corpus and round 34 showed: a meter whose running statistics go through a
NumPy function (``self.std = np.sqrt(...)``, segmentation_models.pytorch's
``AverageValueMeter``) keeps no NumPy state, so a per-step host copy of the loss handed to it
is still a per-step sync; a confusion matrix kept in ``np.zeros`` still needs the copy. A
copy to the CPU spelled ``.to("cpu")`` beside ``.detach()`` is a read (AST's per-batch
validation loss)."""

from __future__ import annotations

from pathlib import Path

from .helpers import lines as _lines
from .helpers import project as _project

EPOCH = """\
import numpy as np
import torch


class AverageValueMeter:
    def __init__(self):
        self.n, self.sum, self.m_s = 0, 0.0, 0.0

    def add(self, value):
        self.n += 1
        self.sum += value
        self.m_s += value * value
        self.std = np.sqrt(self.m_s / self.n)


class Confusion:
    def __init__(self, n):
        self.hist = np.zeros((n, n))

    def add(self, pred):
        self.hist += np.bincount(pred, minlength=self.hist.size).reshape(self.hist.shape)


def evaluate(model, criterion, loader, device):
    meter = AverageValueMeter()
    confusion = Confusion(10)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = criterion(model(x), y)
        loss_value = loss.cpu().detach().numpy()
        meter.add(loss_value)
        pred = model(x).argmax(1).cpu().numpy()
        confusion.add(pred)
"""


def test_a_meter_of_numpy_math_keeps_no_numpy_state() -> None:
    assert _lines(EPOCH, "TPL201") == [30]


VALIDATE = """\
import numpy as np
import torch


def validate(audio_model, val_loader, loss_fn, device):
    predictions, losses = [], []
    with torch.no_grad():
        for audio, labels in val_loader:
            output = torch.sigmoid(audio_model(audio.to(device)))
            predictions.append(output.to("cpu").detach())
            loss = loss_fn(output, labels.to(device))
            losses.append(loss.to("cpu").detach())
            losses.append(loss.detach().to("cpu"))
    return torch.cat(predictions), np.mean(losses)
"""


def test_a_copy_to_the_cpu_of_a_tensor_it_detaches_is_a_read() -> None:
    """``.to("cpu")`` beside ``.detach()`` is a tensor's copy, read like ``.cpu()``; the
    per-batch outputs collected for after the loop stay the result."""
    assert _lines(VALIDATE, "TPL201") == [12, 13]


MULTIMODAL = """\
import torch
from torch import nn


class VideoModel(nn.Module):
    def forward(self, input_ids, inputs_embeds, features, token=32000):
        if input_ids.shape[1] == 1:
            return inputs_embeds
        features = self.projector(features)
        embeds = []
        for cur_ids, cur_embeds in zip(input_ids, inputs_embeds):
            if (cur_ids == token).sum() == 0:
                embeds.append(cur_embeds)
                continue
            for name in self.names:
                print(name)
            embeds.append(torch.cat([cur_embeds, features[0]]))
        return torch.stack(embeds)
"""


TRAIN = """\
def train(model, loader, optimizer):
    for batch in loader:
        model(**batch).mean().backward()
        optimizer.step()
"""


def test_a_count_over_the_rows_of_a_forward_input_is_tested_per_sample(tmp_path: Path) -> None:
    """The rows a loop walks of what the caller hands in (``zip(input_ids, inputs_embeds)``)
    are read as the inputs are: a test of their token count reads a device count per sample;
    a row printed bare may be anything (a file name of the batch) and stays unreported."""
    files = {"model.py": MULTIMODAL, "train.py": TRAIN, "setup.py": ""}
    found = _project(tmp_path, files, "TPL201")
    assert found == [("model.py", 12)]


UNET = """\
from torch import nn


class UNet(nn.Module):
    def forward(self, x, timesteps):
        if timesteps[0].item() > 1000:
            raise RuntimeError("timesteps larger than diffusion steps.",
                               timesteps[0].item(), 1000)
        if timesteps[0].item() < 0:
            return x * timesteps[1].item()
        return self.net(x, timesteps)
"""


def test_a_read_in_the_error_a_forward_raises_runs_on_failure_only(tmp_path: Path) -> None:
    """Outside a loop, a branch that raises is a failed call; its tests still run every call,
    and a branch that returns ends every call that takes it."""
    files = {"unet.py": UNET, "train.py": TRAIN, "setup.py": ""}
    found = _project(tmp_path, files, "TPL201")
    assert found == [("unet.py", 6), ("unet.py", 9), ("unet.py", 10)]


VALIDATION = """\
import torch


def log_validation(accelerator, model, device):
    unwrap_model = accelerator.unwrap_model(model)
    guid_types = unwrap_model.guidance_types
    encoders = {
        f"guidance_encoder_{g}": getattr(unwrap_model, f"guidance_encoder_{g}") for g in guid_types
    }
    return encoders


def main(model, optimizer, loader, accelerator):
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        accelerator.backward(model(batch))
        optimizer.step()
        log_validation(accelerator, model, accelerator.device)
"""


def test_an_f_string_naming_an_attribute_is_a_name() -> None:
    assert _lines(VALIDATION, "TPL201") == []


HOOK = """\
import torch


def forward(x, param, mask):
    param.hint = torch.cat([param.hint, mask], dim=1)
    param.hint.to(x.dtype).to(x.device)
    mask.to(x.device)
    return x
"""


def test_a_conversion_chain_of_an_attribute_the_function_set_to_a_tensor() -> None:
    """``param.hint``, set to ``torch.cat(...)`` just before, converted and moved as a
    statement: the copy is discarded (ControlNet's inpaint hint); ``mask``, of unknown type,
    is left alone."""
    assert _lines(HOOK, "TPL101") == [6]


COUNTS = """\
import random

import torch


def train(model, loader, opt, device, steps):
    for x, mask in loader:
        x, mask = x.to(device), mask.to(device)
        n = mask.sum(-1).amin()
        t = random.randrange(0, n - 1)
        for i in range(n + 1):
            print(i)
        for j in range(steps):
            print(j)
        for k in range(x.shape[0]):
            print(k)
        model(x[:, t]).backward()
        opt.step()
"""


def test_python_counts_of_a_device_reduction_read_it() -> None:
    """``range(n + 1)`` and ``random.randrange(0, n - 1)`` make a device count a Python int
    with ``__index__`` (xtuner's per-sample image count, soundstorm's mask length); a setting
    or a shape is no read."""
    assert _lines(COUNTS, "TPL201") == [10, 11]


TERNARY = """\
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Ternary(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = np.eye(49).reshape((7, 7, 1, 49))
        self.w = np.transpose(self.w, (3, 2, 0, 1))
        self.w = torch.tensor(self.w).float().to(device)

    def forward(self, img):
        return F.conv2d(img, self.w, padding=3)


class Sin(nn.Module):
    def __init__(self, dim, w=10, train_freq=True):
        super().__init__()
        self.freq = nn.Parameter(w * torch.ones(1, dim)) if train_freq else w * torch.ones(1, dim)
        self.scale = nn.Parameter(torch.ones(dim)) if train_freq else None

    def forward(self, x):
        return torch.sin(self.freq * x) * self.scale
"""


def test_plain_tensors_built_from_an_array_or_on_one_branch() -> None:
    """``torch.tensor(self.w)`` of the NumPy array the constructor just built (a NumPy
    function of ``self.w`` registers nothing), and the plain branch of ``nn.Parameter(...) if
    train_freq else w * torch.ones(1, dim)`` (Practical-RIFE's Ternary, safari's Sin)."""
    assert _lines(TERNARY, "TPL501") == [14, 23]


LAMBADA = """\
import torch


def evaluate(model, data, tokenizer, device):
    results = []
    for prompt in data:
        target = tokenizer.encode(prompt.split(" ")[-1])
        out = model(torch.tensor([tokenizer.encode(prompt)]).to(device=device))
        preds = out.logits[0].argmax(-1)
        acc = all([pred == answer for pred, answer in zip(preds[-len(target):], target)])
        same = all(a == b for a, b in zip(target, target[::-1]))
        results.append(acc and same)
    return results
"""


def test_all_over_comparisons_of_the_rows_of_a_device_tensor() -> None:
    """``all([pred == answer for pred, answer in zip(preds, target)])``: one ``bool()`` of a
    device element per token (safari's LAMBADA); the same over host lists is none."""
    assert _lines(LAMBADA, "TPL201") == [10]


PRODIGY = """\
import torch
import torch.distributed.nn as dist_nn


def step(params):
    d_numerator = torch.tensor(0.0, device="cuda")
    dist_nn.all_reduce(d_numerator)
    return d_numerator
"""


def test_a_collective_of_torch_distributed_nn_makes_a_file_multi_rank() -> None:
    """``torch.distributed.nn.all_reduce`` (the autograd collectives) runs on every rank as
    ``torch.distributed``'s own does (schedule_free's Prodigy submission)."""
    assert _lines(PRODIGY, "TPL104") == [6]


WARP = """\
import torch
import torch.nn as nn
from torch.autograd import Variable


class PWCDCNet(nn.Module):
    def warp(self, x, flo):
        B, C, H, W = x.size()
        grid = torch.ones(B, 2, H, W)
        if x.is_cuda:
            grid = grid.cuda()
        vgrid = Variable(grid) + flo
        output = nn.functional.grid_sample(x, vgrid)
        mask = torch.autograd.Variable(torch.ones(x.size())).cuda()
        mask = nn.functional.grid_sample(mask, vgrid)
        return output * mask
"""


def test_a_factory_in_a_legacy_variable_placed_right_away() -> None:
    """``Variable(torch.ones(n)).cuda()``: the wrapper returns the tensor it is given, which
    is placed at once (PWC-Net's warp)."""
    assert _lines(WARP, "TPL103") == []


FLOWNET = """\
import torch.nn as nn


class FlowNet(nn.Module):
    def compute_flow(self, im1, im2):
        if im1.get_device() != self.device:
            self.flowNet.cuda(im1.get_device())
        return self.flowNet(im1, im2)
"""


def test_a_move_onto_the_gpu_of_an_input_follows_it() -> None:
    """``.cuda(im1.get_device())``: the index of the GPU the input is on (few-shot-vid2vid)."""
    assert _lines(FLOWNET, "TPL102") == []


EVENTS = """\
import torch

if __name__ == "__main__":
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
"""


def test_a_bound_cuda_only_call_needs_cuda_for_what_follows() -> None:
    """``start = torch.cuda.Event(...)`` raises first where CUDA is missing: the calls after it
    are not reported again (DPIR's and SCUNet's timing)."""
    assert _lines(EVENTS, "TPL601") == [4]


TRACKER = """\
import torch


class Tracker:
    def __init__(self, params, network):
        network.load_state_dict(torch.load(params.checkpoint, map_location="cpu")["net"])
        self.network = network.cuda()
"""


def test_a_package_test_folder_of_inference_code_is_no_test_suite(tmp_path: Path) -> None:
    """``lib/test/tracker/`` (the pytracking family's trackers as they run at test time) holds
    the model's inference code; the project's own ``test/`` folder is its test suite."""
    files = {
        "setup.py": "",
        "lib/test/tracker/online.py": TRACKER,
        "test/helpers.py": TRACKER,
        "lib/test/test_online.py": TRACKER,
    }
    found = _project(tmp_path, files, "TPL402")
    assert found == [("lib/test/tracker/online.py", 6)]


DROPOUT = """\
import torch
import torch.nn as nn


class RandomDropout(nn.Module):
    def forward(self, x):
        theta = torch.Tensor(1).uniform_(0, 0.875)[0]
        noise = torch.Tensor(1)
        return x * theta + noise
"""


def test_a_one_element_tensor_filled_at_random_is_a_draw() -> None:
    """``torch.Tensor(1).uniform_(0, p)[0]``: a host random scalar, as ``torch.rand(1)`` is
    (votenet's ``RandomDropout``); an unfilled ``torch.Tensor(1)`` meeting the input is not."""
    assert _lines(DROPOUT, "TPL103") == [8]


HEAD = """\
import torch
from mmdet3d.models.dense_heads.centerpoint_head import CenterHead
from pytorch_lightning.core import LightningModule


class DepthHead(CenterHead):
    def get_targets_single(self, gt_bboxes_3d):
        return gt_bboxes_3d.new_zeros((4, 4), device="cuda")


class DepthModel(LightningModule):
    def training_step(self, batch):
        images, labels = batch
        return self(images.cuda()).mean()
"""


def test_openmmlab_model_parts_and_lightning_core_are_modules() -> None:
    """A head derived from mmdet3d's ``CenterHead`` (BEVDepth's), and a ``LightningModule``
    imported from ``pytorch_lightning.core``, are modules whose methods place by hand."""
    assert _lines(HEAD, "TPL102") == [8, 14]
