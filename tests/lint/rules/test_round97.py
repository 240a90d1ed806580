"""Round 97, what the whole corpus and round 45 showed."""

from __future__ import annotations

from .helpers import lines as _lines

LEARNING_RATE = """\
import logging

import torch


def train(model, loader, build_optimizer, build_lr_scheduler, epochs, noise_scheduler):
    model.to(torch.device("cuda"))
    optimizer = build_optimizer(model)
    lr_scheduler = build_lr_scheduler(optimizer)
    for epoch in range(epochs):
        for x, y in loader:
            loss = model(x.cuda()).sub(y.cuda()).pow(2).mean()
            loss.backward()
            optimizer.step()
            lr = lr_scheduler.get_epoch_values(epoch + 1)[0]
            logging.info(f"lr: {lr}")
            step = noise_scheduler.get_velocity(loss, x.cuda(), y.cuda())
            logging.info(f"velocity: {step}")
"""


def test_a_learning_rate_schedulers_getters_answer_python_floats() -> None:
    assert _lines(LEARNING_RATE, "TPL201") == [18]


GLOBAL_DEVICE = """\
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
fallback = "cuda" if torch.cuda.is_available() else "cpu"


class Decoder(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.kernel = torch.ones(3, 3).to(device)
        self.embed = nn.Embedding(n, 8)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=fallback)
        return self.embed(idx) + self.embed(pos)


model = Decoder(10).to(device)
"""


def test_a_module_global_chosen_by_the_machine_is_a_hard_coded_device_in_a_module() -> None:
    assert _lines(GLOBAL_DEVICE, "TPL102") == [11, 16]


CLOSURE = """\
import torch


def sample(model, x, steps):
    model.cuda()
    x = x.cuda()
    alphas = torch.linspace(0.1, 0.9, steps, device="cuda")
    for index in range(steps):
        x = step(model, x, index, alphas)
    return x


def step(model, x, index, alphas):
    b = x.shape[0]

    def update(e_t):
        a_t = torch.full((b, 1), alphas[index], device=x.device)
        return x - a_t * e_t

    return update(model(x))
"""


def test_a_nested_function_reads_the_enclosing_functions_names() -> None:
    assert _lines(CLOSURE, "TPL201") == [17]


FORECAST = """\
import numpy as np
import torch


def forecast(model, first, steps):
    device = torch.device("cuda")
    seq = torch.zeros((steps, *first.shape)).to(device)
    x = first.to(device)
    for i in range(steps):
        x = model(x)
        seq[i] = x
    seq = seq.cpu().numpy()
    return np.expand_dims(seq, 0)


def main(model, starts):
    model.cuda()
    runs = []
    for first in starts:
        runs.append(forecast(model, first.cuda(), 20))
    return np.concatenate(runs)
"""


def test_a_read_once_after_a_functions_own_loop_of_steps_is_not_per_batch() -> None:
    assert _lines(FORECAST, "TPL201") == []


GPU_LIST = """\
import argparse

import torch


def main(model_file, build):
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=str)
    args = parser.parse_args()
    config = {"GPUS": "0"}
    if args.gpus:
        config["GPUS"] = args.gpus
    model = build()
    model.load_state_dict(torch.load(model_file))
    gpus = [int(i) for i in config["GPUS"].split(",")]
    return torch.nn.DataParallel(model, device_ids=gpus).cuda()
"""


def test_a_gpu_list_option_copied_into_the_settings_leaves_no_cpu_path() -> None:
    assert _lines(GPU_LIST, "TPL401") == []


TORCHVISION_BASE = """\
from torchvision.models import ResNet
from torchvision.models.resnet import Bottleneck


class ReIDNetwork(ResNet):
    def __init__(self):
        super().__init__(Bottleneck, [3, 4, 6, 3])

    def sum_losses(self, x, labels):
        return (self(x) - labels.cuda()).pow(2).mean()
"""


def test_a_torchvision_model_subclass_is_a_module() -> None:
    assert _lines(TORCHVISION_BASE, "TPL102") == [10]


ERROR_DETAIL = """\
import torch


def train(model, loader, opt):
    model.cuda()
    for x, y in loader:
        loss = (model(x.cuda()) - y.cuda()).pow(2).mean()
        loss.backward()
        norms = torch.stack([p.grad.norm() for p in model.parameters()])
        if not bool(torch.isfinite(norms).all()):
            detail = "\\n".join(f"{r}: {n:.8f}" for r, n in enumerate(norms.tolist()))
            raise FloatingPointError(detail)
        opt.step()
"""


def test_a_read_walked_once_by_a_failure_branchs_message_is_rare() -> None:
    assert _lines(ERROR_DETAIL, "TPL201") == [10]


LOADER_INFO = """\
import torch

model = build().cuda()
for data in progressbar(test_loader, max_value=len(test_loader)):
    rgb = data["rgb"]
    msk = data["gt"][0]
    info = data["info"]
    gt_obj = info["gt_obj"]
    processor = Core(model, rgb)
    for i, frame_idx in enumerate(sorted(gt_obj.keys())):
        obj_idx = gt_obj[frame_idx][0].tolist()
        obj_idx = [info["label_convert"][o].item() for o in obj_idx]
        with_bg = torch.cat([msk[:, frame_idx], msk[:, frame_idx]], 0).cuda()
        scores = processor.interact(with_bg, frame_idx, obj_idx)
        best = scores[0].item()
"""


def test_a_part_of_a_loaders_batch_that_nothing_moves_is_read_on_the_host() -> None:
    assert _lines(LOADER_INFO, "TPL201") == [15]


DATASET_SCORES = """\
import torch


def evaluate(net, eval_dataset, loader, device):
    net.to(device)
    detections = []
    for example in loader:
        detections += net(example["voxels"].to(device))
    result = eval_dataset.evaluation(detections, "out")
    for k, v in result["results"].items():
        print(k, v)
"""


def test_what_a_dataset_scores_is_host_data() -> None:
    assert _lines(DATASET_SCORES, "TPL201") == []


MESH_GRID = """\
import torch
from torch import nn


class Corner(nn.Module):
    def __init__(self, size, stride):
        super().__init__()
        self.conv = nn.Conv2d(8, 1, 1)
        with torch.no_grad():
            self.indice = torch.arange(0, size).view(-1, 1) * stride
            self.coord_x = self.indice.repeat((size, 1)).view((size * size,)).float().cuda()

    def forward(self, x):
        score = self.conv(x).flatten(1).softmax(-1)
        return (score * self.coord_x).sum(-1)
"""


def test_a_plain_attribute_built_from_an_earlier_plain_tensor_attribute() -> None:
    assert _lines(MESH_GRID, "TPL501") == [11]


NAMED_NET = """\
import torch


class InferenceCore:
    def __init__(self, prop_net, images, num_objects):
        self.prop_net = prop_net
        self.images = images
        self.device = "cuda"
        self.prob = torch.zeros((num_objects + 1, *images.shape[1:]), device=self.device)
"""


def test_a_class_holding_a_network_named_for_one_holds_a_model() -> None:
    assert _lines(NAMED_NET, "TPL104") == [8]


REDEFINED = """\
import torch


def model_fn_decorator(criterion):
    def model_fn(model, data):
        return criterion(model(data), data)

    return model_fn


def model_fn_decorator(criterion):
    def model_fn(model, data):
        loss = criterion(model(data.cuda()), data.cuda())
        return loss, {"loss": loss.item()}

    return model_fn


if __name__ == "__main__":
    model = build().cuda()
    model_fn = model_fn_decorator(torch.nn.MSELoss())
    for data in loader:
        loss, stats = model_fn(model, data)
        loss.backward()
"""


def test_a_function_defined_twice_runs_as_its_last_definition() -> None:
    assert _lines(REDEFINED, "TPL201") == [14]


FIRST_ONLY = """\
import torch


class CheckBatchGradient:
    def on_train_start(self, trainer, model):
        x = model.example_input_array.to(model.device)
        x.requires_grad = True
        output = model(x)
        for key, out in output.items():
            out[0].abs().sum().backward()
            if x.grad[1:].abs().sum().item() > 0:
                raise RuntimeError(f"mixes the batch for {key}")
            break
"""


def test_a_loop_that_breaks_after_its_first_turn_runs_once() -> None:
    assert _lines(FIRST_ONLY, "TPL201") == []


STATEMENT_CHOICE = """\
import torch
import torch.nn as nn

device = torch.device("cpu")
if torch.cuda.is_available():
    device = torch.device("cuda:0")
    torch.cuda.empty_cache()


class ActorCritic(nn.Module):
    def __init__(self, dim, std):
        super().__init__()
        self.action_var = torch.full((dim,), std * std).to(device)
        self.actor = nn.Linear(dim, dim)


policy = ActorCritic(4, 0.5).to(device)
"""


def test_the_statement_form_of_the_machines_choice_is_a_hard_coded_device() -> None:
    assert _lines(STATEMENT_CHOICE, "TPL102") == [13]


DETECTRON_BASE = """\
import torch
from detectron2.modeling.roi_heads.roi_heads import StandardROIHeads


class UnifiedROIHeads(StandardROIHeads):
    def _init_box_head(self, cfg, input_shape):
        self.dataset_inds = [torch.tensor(ids).long() for ids in cfg.LABEL_MAP]
        return super()._init_box_head(cfg, input_shape)
"""


def test_a_detectron2_model_subclass_is_a_module() -> None:
    assert _lines(DETECTRON_BASE, "TPL501") == [7]


GRAPH_FEATURE = """\
import torch
import torch.nn as nn


def get_graph_feature(x, k=20):
    batch_size, num_points = x.shape[0], x.shape[2]
    device = torch.device("cuda")
    idx_base = torch.arange(0, batch_size, device=device).view(-1, 1, 1) * num_points
    return x, idx_base


class DGCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 8, 1)

    def forward(self, x):
        x, idx = get_graph_feature(x)
        return self.conv(x) + idx.sum()
"""


def test_a_hard_coded_device_in_a_helper_only_a_module_calls() -> None:
    assert _lines(GRAPH_FEATURE, "TPL102") == [7]


PLAIN_EPOCH = """\
import time

from torch.cuda.amp import GradScaler


def train(model, loader, loss_fn, optimizer, epochs):
    model.cuda()
    scaler = GradScaler()
    for epoch in range(epochs):
        start = time.time()
        for x, y in loader:
            loss = loss_fn(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(time.time() - start)
"""


def test_a_grad_scalers_step_reads_back_and_waits() -> None:
    assert _lines(PLAIN_EPOCH, "TPL301") == [10]
    scaled = PLAIN_EPOCH.replace(
        "            loss.backward()\n            optimizer.step()\n",
        "            scaler.scale(loss).backward()\n            scaler.step(optimizer)\n",
    )
    assert _lines(scaled, "TPL301") == []


WEB_LOADER = """\
import torch
import webdataset as wds


def train(model, dataset, device, pinned):
    model.to(device)
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=4, pin_memory=pinned)
    for x, y in loader:
        x = x.to(device, non_blocking=True)
        model(x).sum().backward()
"""


def test_a_webdataset_loader_pins_as_a_data_loader_does() -> None:
    assert _lines(WEB_LOADER.replace(", pin_memory=pinned", ""), "TPL701") == [9]
    assert _lines(WEB_LOADER.replace("pinned)", "True)"), "TPL701") == []
