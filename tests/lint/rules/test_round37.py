"""Corpus round 37: false positives found on LLM fine-tuning and preference-optimisation code,
vision-language models, multi-object trackers and YOLO detectors, speech synthesis and vocoders,
graph attention networks, continual and meta-learning, and human pose estimation, each as the
look-alike that must stay clean next to the pitfall that must still be found.

Tried and kept as findings: per-step ``.item()``/``.cpu()`` reads of losses and metrics in
training and evaluation loops, per-row reads of generated tokens and detections, a KV cache
built with ``.cuda()`` in an attention module's ``__init__``, ``.to('cuda')`` inside
``forward``, ``--device`` defaulting to bare ``"cuda"`` in multi-rank scripts, a plain tensor
attribute holding a random gate mask that ``state_dict()`` never saves, ``non_blocking=True``
copies from pageable memory, ``torch.load`` without ``map_location``/``weights_only`` (also of a
saved point cloud read with ``.numpy()``), and step timers read without a synchronize."""

from __future__ import annotations

import pytest

from .helpers import lines, project

# ---- TPL103: a target-assignment helper that brings its inputs to the host with `.to("cpu")`

REGION_LAYER = """\
import torch
import torch.nn as nn


def multi_bbox_ious(boxes1, boxes2):
    return (boxes1 * boxes2).sum(0)


class YoloLayer(nn.Module):
    def __init__(self, anchors, device):
        super().__init__()
        self.device = device
        self.anchors = torch.FloatTensor(anchors).view(-1, 2).to(device)

    def build_targets(self, pred_boxes, target, nA, nH, nW):
        nB = target.size(0)
        nAnchors = nA * nH * nW
        conf_mask = torch.ones(nB, nA, nH, nW)
{move}
        for b in range(nB):
            cur_pred_boxes = pred_boxes[b * nAnchors:(b + 1) * nAnchors].t()
            cur_ious = torch.zeros(nAnchors)
            tbox = target[b].view(-1, 5).to("cpu")
            gx, gy = tbox[0][1] * nW, tbox[0][2] * nH
            gw, gh = anchors[0][0], anchors[0][1]
            cur_gt_boxes = torch.FloatTensor([gx, gy, gw, gh]).repeat(nAnchors, 1).t()
            cur_ious = torch.max(cur_ious, multi_bbox_ious(cur_pred_boxes, cur_gt_boxes))
            conf_mask[b][(cur_ious > 0.6).view(nA, nH, nW)] = 0
        return conf_mask

    def forward(self, output, target):
        nA, nH, nW = 3, output.size(2), output.size(3)
        pred_boxes = output.detach().transpose(0, 1).contiguous().view(-1, 4).cpu()
        conf_mask = self.build_targets(pred_boxes, target.detach(), nA, nH, nW)
        conf_mask = conf_mask.to(self.device)
        return (output * conf_mask).sum()
"""


def test_host_helpers_that_move_their_inputs_with_to_cpu_are_clean() -> None:
    source = REGION_LAYER.format(move='        anchors = self.anchors.to("cpu")')
    assert lines(source, "TPL103", "yolo_layer.py") == []


def test_host_helpers_that_move_with_a_cpu_device_are_clean() -> None:
    move = '        anchors = self.anchors.to(device=torch.device("cpu"))'
    assert lines(REGION_LAYER.format(move=move), "TPL103", "yolo_layer.py") == []


def test_helpers_that_keep_their_inputs_where_they_are_are_found() -> None:
    source = REGION_LAYER.format(move="        anchors = self.anchors.to(target.device)")
    assert lines(source, "TPL103", "yolo_layer.py") == [22, 26]
    source = REGION_LAYER.format(move="        anchors = self.anchors")
    assert lines(source, "TPL103", "yolo_layer.py") == [22, 26]


# ---- TPL403: a saved tensor loaded as data in a request handler

POINT_VIEWER = """\
import gradio as gr
import numpy as np
import torch


def show_point_cloud(file):
    point = {load}
    return np.asarray(point)[:, :3]


with gr.Blocks() as demo:
    upload = gr.File()
    plot = gr.Plot()
    button = gr.Button("Show")
    button.click(show_point_cloud, upload, plot)
"""


def test_tensors_loaded_as_arrays_in_handlers_are_clean() -> None:
    source = POINT_VIEWER.format(load="torch.load(file.name).numpy()")
    assert lines(source, "TPL403", "app.py") == []


def test_tensors_loaded_as_arrays_through_a_host_copy_are_clean() -> None:
    source = POINT_VIEWER.format(load='torch.load(file.name, map_location="cpu").cpu().numpy()')
    assert lines(source, "TPL403", "app.py") == []


def test_models_loaded_in_handlers_are_still_found() -> None:
    source = POINT_VIEWER.format(load='torch.load("encoder.pt")(file.name)')
    assert lines(source, "TPL403", "app.py") == [7]


DATA_HELPERS = """\
import numpy
import torch


def load_and_transform_point_cloud_data(point_paths, device):
    outputs = []
    for point_path in point_paths:
        if ".pt" in point_path:
            point = {load}
        else:
            point = numpy.load(point_path)
        outputs.append(torch.from_numpy(point).to(device))
    return torch.stack(outputs)
"""

DEMO = """\
import gradio as gr

import data


def predict(point_path):
    point = data.load_and_transform_point_cloud_data([point_path], device="cuda")
    return point.mean().item()


with gr.Blocks() as demo:
    path = gr.Textbox()
    button = gr.Button("Run")
    button.click(predict, path, None)
"""


def test_project_helpers_that_load_arrays_in_handlers_are_clean(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    files = {
        "data.py": DATA_HELPERS.format(load="torch.load(point_path).numpy()"),
        "demo.py": DEMO,
    }
    assert project(tmp_path_factory.mktemp("project"), files, "TPL403") == []


def test_project_helpers_that_load_models_in_handlers_are_found(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    files = {
        "data.py": DATA_HELPERS.format(load="torch.load(point_path)"),
        "demo.py": DEMO,
    }
    assert project(tmp_path_factory.mktemp("project"), files, "TPL403") == [("demo.py", 7)]


# ---- TPL501: an attribute read into a local name that is moved before it is used

FOLDING = """\
import torch
import torch.nn as nn


class Decoder(nn.Module):
    def __init__(self, grid_size, channels):
        super().__init__()
        self.grid_size = grid_size
        self.proj = nn.Conv1d(channels + 2, 3, 1)
        a = torch.linspace(-0.05, 0.05, steps=grid_size).view(1, grid_size).expand(
            grid_size, grid_size).reshape(1, -1)
        b = torch.linspace(-0.05, 0.05, steps=grid_size).view(grid_size, 1).expand(
            grid_size, grid_size).reshape(1, -1)
        self.folding_seed = torch.cat([a, b], dim=0).view(1, 2, grid_size ** 2)

    def forward(self, feature_global):
        bs = feature_global.size(0)
        seed = self.folding_seed.unsqueeze(2).expand(bs, -1, 1, -1)
{use}
        feature_global = feature_global.unsqueeze(2).expand(-1, -1, self.grid_size ** 2)
        return self.proj(torch.cat([feature_global, seed], dim=1))
"""


def test_attributes_moved_through_a_local_copy_are_clean() -> None:
    use = "        seed = seed.reshape(bs, 2, -1).to(feature_global.device)"
    assert lines(FOLDING.format(use=use), "TPL501", "dvae.py") == []


def test_attributes_whose_local_copy_is_used_unmoved_are_found() -> None:
    use = "        seed = seed.reshape(bs, 2, -1)\n        seed = seed.to(feature_global.device)"
    assert lines(FOLDING.format(use=use), "TPL501", "dvae.py") == [14]


def test_attributes_whose_local_copy_is_moved_into_another_name_are_found() -> None:
    use = "        moved = seed.reshape(bs, 2, -1).to(feature_global.device)"
    assert lines(FOLDING.format(use=use), "TPL501", "dvae.py") == [14]


# ---- TPL301: clock reads whose only elapsed times are printed under `if False:`

DETECT = """\
import time

import torch


def do_detect(model, img, use_cuda=True):
    model.eval()
    img = torch.from_numpy(img).float()
    t1 = time.time()
    img = img.to(torch.device("cuda" if use_cuda else "cpu"))
    boxes = model(img)
    t2 = time.time()
    boxes = boxes.sum(1)
    t3 = time.time()
    if {switch}:
        print("predict : %f" % (t2 - t1))
        print("    nms : %f" % (t3 - t2))
    return boxes
"""


def test_timings_printed_only_in_dead_code_are_clean() -> None:
    assert lines(DETECT.format(switch="False"), "TPL301", "utils.py") == []
    assert lines(DETECT.format(switch="0"), "TPL301", "utils.py") == []


def test_timings_printed_under_a_flag_are_found() -> None:
    assert lines(DETECT.format(switch="model.verbose"), "TPL301", "utils.py") == [9]


# ---- TPL201: each rank's pickled buffer from `dist.gather`, decoded one by one

GATHER = """\
import pickle

import torch
import torch.distributed as dist


def _serialize_to_tensor(data, device):
    buffer = pickle.dumps(data)
    return torch.ByteTensor(torch.ByteStorage.from_buffer(buffer)).to(device)


def gather(data, device, dst=0):
    rank = dist.get_rank()
    tensor = _serialize_to_tensor(data, device)
    size_list = [tensor.numel()] * dist.get_world_size()
    if rank == dst:
        tensor_list = [torch.empty_like(tensor) for _ in size_list]
        dist.gather(tensor, {gathered}, dst=dst)
        data_list = []
        for size, tensor in zip(size_list, tensor_list):
{decode}
        return data_list
    dist.gather(tensor, [], dst=dst)
    return []
"""
UNPICKLE = (
    "            buffer = tensor.cpu().numpy().tobytes()[:size]\n"
    "            data_list.append(pickle.loads(buffer))"
)


def test_buffers_of_a_gather_decoded_per_rank_are_clean() -> None:
    source = GATHER.format(gathered="tensor_list", decode=UNPICKLE)
    assert lines(source, "TPL201", "dist.py") == []
    source = GATHER.format(gathered="gather_list=tensor_list", decode=UNPICKLE)
    assert lines(source, "TPL201", "dist.py") == []


def test_statistics_of_gathered_buffers_are_found() -> None:
    decode = "            data_list.append(tensor.float().mean().item())"
    assert lines(GATHER.format(gathered="tensor_list", decode=decode), "TPL201", "dist.py") == [21]
