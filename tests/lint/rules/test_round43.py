"""Corpus round 43: false positives and misses found on a one-stage detector's training,
evaluation and visualisation scripts (RetinaNet), an RNN language model's CPU demo and
Lightning trainer (RWKV), each as the look-alike that must stay clean next to the pitfall
that must still be found."""

from __future__ import annotations

from .helpers import lines

# ---- TPL201: a host copy's arithmetic with a value of unknown place stays on the host

COCO_EVAL = """\
import torch


def evaluate_coco(dataset, model):
    results = []
    for index in range(len(dataset)):
        data = dataset[index]
        scale = data["scale"]
        scores, boxes = model(data["img"].permute(2, 0, 1).cuda().float().unsqueeze(dim=0))
        boxes = boxes{copy}
        boxes /= scale
        for box_id in range(boxes.shape[0]):
            box = boxes[box_id, :]
            results.append({{"bbox": box.tolist()}})
    return results
"""


def test_rows_of_a_host_copy_scaled_by_a_batch_item_are_clean() -> None:
    source = COCO_EVAL.format(copy=".cpu()")
    assert 14 not in lines(source, "TPL201", "coco_eval.py")


def test_rows_of_a_host_copy_divided_by_a_batch_item_are_clean() -> None:
    source = COCO_EVAL.format(copy=".cpu()").replace("boxes /= scale", "boxes = boxes / scale")
    assert 14 not in lines(source, "TPL201", "coco_eval.py")


def test_rows_of_the_device_output_scaled_by_a_batch_item_are_found() -> None:
    source = COCO_EVAL.format(copy=".float()")
    assert 14 in lines(source, "TPL201", "coco_eval.py")


# ---- TPL201: `int()` of arithmetic on a row of a device tensor reads it back

VISUALIZE = """\
import numpy as np
import torch


def detect_image(images, model, scale):
    for image in images:
        image = torch.from_numpy(image).cuda()
        scores, classification, anchors = model(image)
        idxs = np.where(scores.cpu() > 0.5)
        {copy}
        for j in range(idxs[0].shape[0]):
            bbox = anchors[idxs[0][j], :]
            x1 = int(bbox[0] / scale)
            y1 = int(bbox[1] * 2)
            print(x1, y1)
"""


def test_cast_of_arithmetic_on_a_device_row_is_found() -> None:
    source = VISUALIZE.format(copy="pass")
    assert lines(source, "TPL201", "visualize.py") == [9, 13, 14]


def test_cast_of_arithmetic_on_a_host_row_is_clean() -> None:
    source = VISUALIZE.format(copy="anchors = anchors.cpu()")
    assert lines(source, "TPL201", "visualize.py") == [9, 10]


def test_cast_of_arithmetic_of_python_numbers_is_clean() -> None:
    source = """\
import torch


def boxes(sizes, model, x):
    x = x.cuda()
    for w, h in sizes:
        y = model(x)
        print(int(w * 0.5), int(h / 2))
"""
    assert lines(source, "TPL201") == []


# ---- TPL501: `torch.from_numpy` of a literal array kept as a plain attribute

BBOX_TRANSFORM = """\
import numpy as np
import torch
import torch.nn as nn


class BBoxTransform(nn.Module):
    def __init__(self, mean=None):
        super().__init__()
        if mean is None:
            if torch.cuda.is_available():
                self.mean = torch.from_numpy(np.array([0, 0, 0, 0]).astype(np.float32)).cuda()
            else:
                self.mean = torch.from_numpy(np.array([0, 0, 0, 0]).astype(np.float32))
        else:
            self.mean = mean
        self.std = torch.as_tensor(np.array({std}))

    def forward(self, boxes, deltas):
        return boxes + deltas * self.std[0] + self.mean[0]
"""


def test_tensor_of_a_literal_array_as_a_plain_attribute_is_found() -> None:
    source = BBOX_TRANSFORM.format(std="[0.1, 0.1, 0.2, 0.2]")
    assert lines(source, "TPL501", "utils.py") == [11, 13, 16]


def test_tensor_of_a_one_element_array_as_a_plain_attribute_is_clean() -> None:
    source = BBOX_TRANSFORM.format(std="[0.1]")
    assert 16 not in lines(source, "TPL501", "utils.py")


def test_registered_tensor_of_a_literal_array_is_clean() -> None:
    source = """\
import numpy as np
import torch
import torch.nn as nn


class BBoxTransform(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("std", torch.from_numpy(np.array([0.1, 0.1, 0.2, 0.2])))

    def forward(self, deltas):
        return deltas * self.std
"""
    assert lines(source, "TPL501", "utils.py") == []


# ---- TPL102: a branch on the accelerator a run's config names is a device-type branch

INIT_WEIGHTS = """\
import torch
import torch.nn as nn


class RWKV(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.args = args

    def generate_init_weight(self, shapes):
        m = {{}}
        for n, shape in shapes.items():
            if {test}:
                m[n] = torch.empty((shape[0], shape[1]), device="cuda")
            else:
                m[n] = torch.empty((shape[0], shape[1]))
        return m
"""


def test_cuda_under_a_test_of_the_configured_accelerator_is_clean() -> None:
    source = INIT_WEIGHTS.format(test='self.args.accelerator.upper() == "GPU"')
    assert lines(source, "TPL102", "model.py") == []


def test_cuda_under_a_test_of_a_lightning_accelerator_name_is_clean() -> None:
    source = INIT_WEIGHTS.format(test='self.args.accelerator == "gpu"')
    assert lines(source, "TPL102", "model.py") == []


def test_cuda_under_a_test_of_something_else_is_found() -> None:
    source = INIT_WEIGHTS.format(test='self.args.precision == "bf16"')
    assert lines(source, "TPL102", "model.py") == [14]


# ---- TPL103: a module of a CPU-only script, built by the script's own top-level code

CPU_DEMO = """\
import torch
from torch.nn import functional as F


class RWKV_RNN(torch.jit.ScriptModule):
    def __init__(self, path):
        super().__init__()
        self.w = torch.load(path, map_location="cpu", weights_only=True)

    def forward(self, token, state):
        if state is None:
            state = torch.zeros(24, 768)
        return F.linear(self.w["emb"][token], self.w["head"]), state


{build}
"""


def test_factory_in_a_module_of_a_cpu_only_script_is_clean() -> None:
    source = CPU_DEMO.format(build='model = RWKV_RNN("rwkv.pth")\nout, state = model(0, None)')
    assert lines(source, "TPL103", "run.py") == []


def test_factory_in_a_module_of_a_script_that_moves_it_is_found() -> None:
    build = 'model = RWKV_RNN("rwkv.pth").to("cuda")\nout, state = model(0, None)'
    source = CPU_DEMO.format(build=build)
    assert lines(source, "TPL103", "run.py") == [12]


def test_factory_in_a_module_with_a_smoke_check_only_is_found() -> None:
    build = 'if __name__ == "__main__":\n    model = RWKV_RNN("rwkv.pth")\n'
    source = CPU_DEMO.format(build=build)
    assert lines(source, "TPL103", "model.py") == [12]
