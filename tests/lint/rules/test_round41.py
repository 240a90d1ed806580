"""Corpus round 41: false positives found on reinforcement learning (SAC, PPO, offline BCQ),
graph networks (GIN, temporal graph networks), 3D vision (monocular depth, a tensorial radiance
field, a deep visual SLAM), generative audio, document understanding, video recognition,
federated learning (a personalised-FL library and a FedAvg baseline) and scientific
surrogates (PDE benchmarks, molecular dynamics), each as the look-alike that must stay clean
next to the pitfall that must still be found."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import lines, project

# ---- TPL501: a dict of layers whose values a module container registers under another name

POSE_CNN = """\
import torch.nn as nn


class PoseCNN(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.convs = {{}}
        self.convs[0] = nn.Conv2d(3 * n, 16, 7, 2, 3)
        self.convs[1] = nn.Conv2d(16, 32, 5, 2, 2)
        self.relu = nn.ReLU(True)
        {register}

    def forward(self, out):
        for i in range(len(self.convs)):
            out = self.relu(self.convs[i](out))
        return out
"""


def test_layers_kept_only_in_a_plain_dict_are_found() -> None:
    source = POSE_CNN.format(register="self.count = len(self.convs)")
    assert lines(source, "TPL501", "pose_cnn.py") == [8, 9]


def test_layers_copied_into_another_plain_list_are_found() -> None:
    source = POSE_CNN.format(register="self.net = list(self.convs.values())")
    assert lines(source, "TPL501", "pose_cnn.py") == [8, 9]


def test_layers_registered_by_a_module_list_under_another_name_are_clean() -> None:
    source = POSE_CNN.format(register="self.net = nn.ModuleList(list(self.convs.values()))")
    assert lines(source, "TPL501", "pose_cnn.py") == []


def test_layers_registered_by_a_sequential_under_another_name_are_clean() -> None:
    source = POSE_CNN.format(register="self.net = nn.Sequential(*self.convs.values())")
    assert lines(source, "TPL501", "pose_cnn.py") == []


# ---- TPL801: a model bound in every branch of an `if`/`elif` chain, each already moved

FNO_TRAIN = """\
import torch
from models import FNO1d, FNO2d


def run_training(dims, lr, device, {params}):
    if dims == 4:
        model = FNO1d(width=20).to(device)
    elif dims == 5:
        model = {second}
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    if continue_training:
        checkpoint = torch.load("fno.pt", map_location=device, weights_only=True)
        model.load_state_dict(checkpoint["model_state_dict"])
        model.to(device)
    for x, y in loader:
        loss = (model(x.to(device)) - y.to(device)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_an_unmoved_model_in_one_branch_is_found() -> None:
    source = FNO_TRAIN.format(params="loader, continue_training", second="FNO2d(width=20)")
    assert lines(source, "TPL801") == [10]


def test_a_given_model_rebound_in_some_branches_only_is_found() -> None:
    # the caller's `model` reaches the optimizer unmoved when `dims` is neither 4 nor 5
    source = FNO_TRAIN.format(
        params="loader, continue_training, model", second="FNO2d(width=20).to(device)"
    )
    assert lines(source, "TPL801") == [10]


def test_a_model_moved_in_every_branch_that_binds_it_is_clean() -> None:
    source = FNO_TRAIN.format(
        params="loader, continue_training", second="FNO2d(width=20).to(device)"
    )
    assert lines(source, "TPL801") == []


def test_a_model_moved_in_every_branch_with_a_raising_else_is_clean() -> None:
    source = FNO_TRAIN.format(
        params="loader, continue_training",
        second="FNO2d(width=20).to(device)\n    else:\n        raise ValueError(dims)",
    )
    assert lines(source, "TPL801") == []


def test_a_model_bound_inside_a_with_block_of_one_branch_is_found() -> None:
    source = FNO_TRAIN.format(
        params="loader, continue_training",
        second="FNO2d(width=20).to(device)\n    else:\n"
        '        with torch.device("meta"):\n            model = FNO2d(width=20)',
    )
    assert lines(source, "TPL801") == [13]


# ---- TPL201: a helper called on chosen steps only, `if iteration in upsamp_list:`

RADIANCE_FIELD = """\
import torch
from tqdm import tqdm


def n_to_reso(n_voxels, bbox):
    xyz_min, xyz_max = bbox
    voxel = ((xyz_max - xyz_min).prod() / n_voxels).pow(1 / 3)
    return ((xyz_max - xyz_min) / voxel).long().tolist()


def reconstruction(args, tensorf, sampler, device, upsamp_list):
    optimizer = torch.optim.Adam(tensorf.parameters())
    pbar = tqdm(range(args.n_iters))
    for iteration in pbar:
        rays = sampler.next().to(device)
        loss = tensorf(rays).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        {branch}
            reso = n_to_reso(args.n_voxels, tensorf.aabb)
            tensorf.upsample_volume_grid(reso)
"""


def test_a_helper_called_on_every_step_is_found() -> None:
    source = RADIANCE_FIELD.format(branch="if True:")
    assert lines(source, "TPL201") == [8]


def test_a_helper_called_for_the_steps_of_a_range_is_found() -> None:
    # `in range(n)` may hold on every step
    source = RADIANCE_FIELD.format(branch="if iteration in range(args.n_iters):")
    assert lines(source, "TPL201") == [8]


def test_a_helper_called_on_a_list_of_chosen_steps_is_clean() -> None:
    source = RADIANCE_FIELD.format(branch="if iteration in upsamp_list:")
    assert lines(source, "TPL201") == []


def _inline(branch: str) -> str:
    return RADIANCE_FIELD.format(branch=branch).replace(
        "reso = n_to_reso(args.n_voxels, tensorf.aabb)", "reso = loss.detach().long().tolist()"
    )


def test_a_read_in_a_progress_bar_loop_on_every_step_is_found() -> None:
    assert lines(_inline("if True:"), "TPL201") == [21]


def test_a_read_in_a_progress_bar_loop_on_chosen_steps_is_clean() -> None:
    assert lines(_inline("if iteration in upsamp_list:"), "TPL201") == []


# ---- TPL201: a loop that builds a model each step into an attribute of the run's settings

RUNS = """\
import torch
import torch.nn as nn
from servers import Server


class Logistic(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, 10)


def run(args):
    for i in range(args.prev, args.times):
        {build}
        print(args.model)
        server = Server(args, i)
        server.train()
"""


def test_a_tensor_computed_each_step_into_the_settings_is_found() -> None:
    source = RUNS.format(build="args.model = torch.randn(4).to(args.device) * args.scale")
    assert lines(source, "TPL201", "main.py") == [15]


def test_a_model_built_each_step_into_the_settings_is_clean() -> None:
    source = RUNS.format(build="args.model = Logistic(784).to(args.device)")
    assert lines(source, "TPL201", "main.py") == []


def test_a_torchvision_model_built_each_step_is_clean() -> None:
    source = "import torchvision\n" + RUNS.format(
        build="args.model = torchvision.models.resnet18(num_classes=10).to(args.device)"
    )
    assert lines(source, "TPL201", "main.py") == []


PFL_MAIN = """\
import torch
from servers import Server
from trainmodel.models import *
from trainmodel.alexnet import *


def run(args):
    for i in range(args.prev, args.times):
        if args.model_str == "MLR":
            args.model = Logistic(784).to(args.device)
        elif args.model_str == "AlexNet":
            args.model = alexnet(num_classes=10).to(args.device)
        else:
            args.model = Logistic(60).to(args.device)
        print(args.model)
        {extra}
        server = Server(args, i)
        server.train()
"""

PFL_MODELS = """\
import torch.nn as nn


class Logistic(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, 10)
"""

PFL_ALEXNET = """\
import torch.nn as nn


class AlexNet(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.classifier = nn.Linear(256, num_classes)


def alexnet(pretrained=False, **kwargs):
    model = AlexNet(**kwargs)
    if pretrained:
        model.load_state_dict(load_weights())
    return model


def features(n):
    return torch.randn(n, 4)
"""


def _pfl(root: Path, extra: str) -> list[tuple[str, int]]:
    files = {
        "system/main.py": PFL_MAIN.format(extra=extra),
        "system/trainmodel/__init__.py": "",
        "system/trainmodel/models.py": PFL_MODELS,
        "system/trainmodel/alexnet.py": PFL_ALEXNET,
    }
    return project(root, files, "TPL201")


def test_star_imported_models_and_builders_each_step_are_clean(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    assert _pfl(tmp_path_factory.mktemp("project"), "server_args = args") == []


def test_a_star_imported_tensor_helper_each_step_is_found(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # `features(n)` builds data, not a model: moved every step, then read
    extra = "args.feats = features(4).to(args.device)\n        print(args.feats.sum().item())"
    found = _pfl(tmp_path_factory.mktemp("project"), extra)
    assert found == [("system/main.py", 17)]


# ---- TPL201: the text of a model printed in a batch loop

PRINT_MODEL = """\
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)


def train(loader, device, {params}):
    {build}
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(model)
"""


def test_a_printed_value_moved_but_of_unknown_kind_is_found() -> None:
    source = PRINT_MODEL.format(params="model, optimizer", build="model = model.to(device)")
    assert lines(source, "TPL201") == [18]


def test_a_printed_model_the_function_builds_is_clean() -> None:
    source = PRINT_MODEL.format(params="optimizer", build="model = Net().to(device)")
    assert lines(source, "TPL201") == []


def test_a_printed_value_whose_parameters_the_function_asks_for_is_a_module() -> None:
    build = "model = model.to(device)\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)"
    source = PRINT_MODEL.format(params="model", build=build)
    assert lines(source, "TPL201") == []


# ---- TPL201: a dict comprehension that copies each entry of a mapping under its own key

MCMC = """\
import torch
from pyro.infer import MCMC, NUTS


def invert(model_inverse, grid, y, device, cfg):
    model_inverse.to(device)
    mcmc = MCMC(NUTS(model_inverse), num_samples=cfg.num_samples)
    mcmc.run(grid, y)
    {copy}
    return mc_samples
"""


def test_rows_of_a_device_tensor_copied_one_by_one_are_found() -> None:
    source = MCMC.format(
        copy='mc_samples = [row.cpu().numpy() for row in mcmc.get_samples()["u0"]]'
    )
    assert lines(source, "TPL201", "inverse.py") == [9]


def test_each_entry_of_a_mapping_copied_under_its_key_is_clean() -> None:
    source = MCMC.format(
        copy="mc_samples = {k: v.detach().cpu().numpy() for k, v in mcmc.get_samples().items()}"
    )
    assert lines(source, "TPL201", "inverse.py") == []


# ---- TPL201: a prediction hook that returns its outputs copied entry by entry

PREDICT_STEP = """\
import torch
import pytorch_lightning as pl


class Wrapper(pl.LightningModule):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        results = self(batch)
        {copy}
"""


def test_a_prediction_read_as_numbers_entry_by_entry_is_found() -> None:
    source = PREDICT_STEP.format(copy="return {k: v.item() for k, v in results.items()}")
    assert lines(source, "TPL201", "cli.py") == [15]


def test_a_prediction_copied_row_by_row_is_found() -> None:
    source = PREDICT_STEP.format(copy='return [row.cpu() for row in results["energy"]]')
    assert lines(source, "TPL201", "cli.py") == [15]


def test_a_prediction_returned_copied_entry_by_entry_is_clean() -> None:
    source = PREDICT_STEP.format(
        copy="results = {k: v.detach().cpu() for k, v in results.items()}\n        return results"
    )
    assert lines(source, "TPL201", "cli.py") == []
