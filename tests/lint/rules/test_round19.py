"""Corpus round 19: false positives found on new real code (a lip-sync trainer, its face
detector and SyncNet scorer, SwinIR, SwAV's multi-crop wrapper, a YOLOv4 port's detection
helpers, RAFT's demo, StyleGAN3's training loop and metrics, a speech separator's validation),
each as the look-alike that must stay clean next to the pitfall that must still be found."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import lines

# ---- TPL401: the load without `map_location` is the CUDA side of a CPU fallback

FALLBACK = """\
import torch

use_cuda = torch.cuda.is_available()
device = "cuda" if use_cuda else "cpu"


def _load(path):
    if use_cuda:
        return torch.load(path, weights_only=True)
    return torch.load(path, map_location=lambda storage, loc: storage, weights_only=True)


def _load_model(path):
    if device == "cuda":
        checkpoint = torch.load(path, weights_only=True)
    else:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return checkpoint
"""


def test_a_load_under_a_flag_bound_to_cuda_availability_is_left_alone() -> None:
    assert lines(FALLBACK, "TPL401") == []


def test_a_load_on_the_cpu_side_of_the_fallback_is_reported() -> None:
    source = FALLBACK.replace('if device == "cuda":', 'if device == "cpu":')
    assert lines(source, "TPL401") == [15]


# ---- TPL401: a script pinned to CUDA by a module constant in capitals (RAFT's demo)

PINNED = """\
import torch

DEVICE = 'cuda'


def demo(args):
    model = torch.nn.DataParallel(RAFT(args))
    model.load_state_dict(torch.load(args.model, weights_only=True))
    model.to(DEVICE)
"""


def test_a_script_pinned_by_a_capitalised_device_constant_is_left_alone() -> None:
    assert lines(PINNED, "TPL401") == []


def test_a_capitalised_device_constant_with_a_fallback_is_reported() -> None:
    source = PINNED.replace(
        "DEVICE = 'cuda'", "DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'"
    )
    assert lines(source, "TPL401") == [8]


# ---- TPL103: a mask method called in `__init__` (a buffer) and placed in `forward` (SwinIR)

SWIN_BLOCK = """\
import torch
import torch.nn as nn


class SwinTransformerBlock(nn.Module):
    def __init__(self, input_resolution, window_size):
        super().__init__()
        self.input_resolution = input_resolution
        self.window_size = window_size
        self.register_buffer("attn_mask", self.calculate_mask(input_resolution))

    def calculate_mask(self, x_size):
        h, w = x_size
        img_mask = torch.zeros((1, h, w, 1))
        return img_mask.view(-1, self.window_size * self.window_size)

    def forward(self, x, x_size):
        if self.input_resolution == x_size:
            return self.attn(x, mask=self.attn_mask)
        return self.attn(x, mask=self.calculate_mask(x_size).to(x.device))
"""


def test_a_mask_placed_in_forward_and_built_in_init_is_left_alone() -> None:
    assert lines(SWIN_BLOCK, "TPL103") == []


def test_a_mask_left_unplaced_in_forward_is_reported() -> None:
    source = SWIN_BLOCK.replace(
        "self.calculate_mask(x_size).to(x.device)", "self.calculate_mask(x_size)"
    )
    assert lines(source, "TPL103") == [14]


# ---- TPL103: a tensor of crop widths used only as Python slice bounds (DINO, SwAV)

MULTI_CROP = """\
import torch
import torch.nn as nn


class MultiCropWrapper(nn.Module):
    def __init__(self, backbone, head):
        super().__init__()
        self.backbone, self.head = backbone, head

    def forward(self, x):
        idx_crops = torch.cumsum(torch.unique_consecutive(
            torch.tensor([inp.shape[-1] for inp in x]),
            return_counts=True,
        )[1], 0)
        start_idx = 0
        for end_idx in idx_crops:
            _out = self.backbone(torch.cat(x[start_idx: end_idx]))
            if start_idx == 0:
                output = _out
            else:
                output = torch.cat((output, _out))
            start_idx = end_idx
        return self.head(output)
"""


def test_a_tensor_of_slice_bounds_in_forward_is_left_alone() -> None:
    assert lines(MULTI_CROP, "TPL103") == []


def test_a_tensor_of_slice_bounds_also_computed_with_is_reported() -> None:
    source = MULTI_CROP.replace(
        "return self.head(output)", "return self.head(output) / idx_crops[-1]"
    )
    assert lines(source, "TPL103") == [12]


# ---- TPL201: a detector helper star-imported from a module beside it returns NumPy

DETECT = """\
import numpy as np
import torch


def detect(net, img, device):
    img = torch.from_numpy(img).float().to(device)
    with torch.no_grad():
        out = net(img)
    boxes = out.cpu().numpy()
    return np.array(boxes)
"""

DETECTOR = """\
from detect import *


class SFDDetector:
    def __init__(self, device, net):
        self.device = device
        self.face_detector = net.to(device)

    def detect_from_image(self, image):
        bboxlist = detect(self.face_detector, image, device=self.device)
        return [x for x in bboxlist if x[-1] > 0.5]
"""


def _detector(tmp_path_factory: pytest.TempPathFactory, helper: str) -> Path:
    root = tmp_path_factory.mktemp("project")  # not a `test*` folder: linted as code
    (root / "detect.py").write_text(helper)
    (root / "sfd_detector.py").write_text(DETECTOR)
    return root / "sfd_detector.py"


def test_a_star_imported_helper_returning_numpy_is_left_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = _detector(tmp_path_factory, DETECT)
    assert lines(DETECTOR, "TPL201", str(path)) == []


def test_a_star_imported_helper_returning_the_output_is_reported(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    helper = DETECT.replace("return np.array(boxes)", "return out")
    path = _detector(tmp_path_factory, helper)
    assert lines(DETECTOR, "TPL201", str(path)) == [11]


# ---- TPL201 and TPL301: a helper returning what an imported module's function makes of the
# output (YOLOv4's `return utils.post_processing(img, conf, nms, output)`)

POST = """\
import numpy as np


def post_processing(img, conf_thresh, output):
    boxes = output[0].cpu().detach().numpy()
    return [list(b) for b in boxes if np.max(b) > conf_thresh]
"""

TORCH_UTILS = """\
import numpy as np
import torch

from tool import utils


def do_detect(model, img, conf_thresh, use_cuda=1):
    model.eval()
    with torch.no_grad():
        img = torch.from_numpy(img.transpose(2, 0, 1)).float().div(255.0).unsqueeze(0)
        if use_cuda:
            img = img.cuda()
        output = model(img)
        return utils.post_processing(img, conf_thresh, output)
"""

EVALUATE = """\
import time

from tool.torch_utils import do_detect


def evaluate(model, images, use_cuda):
    if use_cuda:
        model.cuda()
    results = []
    for image in images:
        start = time.time()
        boxes = do_detect(model, image, 0.4, use_cuda)
        finish = time.time()
        for box in boxes:
            results.append({"score": float(box[-2]), "timing": finish - start})
    return results
"""


def _yolo(tmp_path_factory: pytest.TempPathFactory, post: str) -> Path:
    root = tmp_path_factory.mktemp("project")
    (root / "tool").mkdir()
    (root / "tool" / "__init__.py").write_text("")
    (root / "tool" / "utils.py").write_text(post)
    (root / "tool" / "torch_utils.py").write_text(TORCH_UTILS)
    (root / "evaluate.py").write_text(EVALUATE)
    return root / "evaluate.py"


def test_boxes_an_imported_modules_function_makes_on_the_host_are_left_alone(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = _yolo(tmp_path_factory, POST)
    assert lines(EVALUATE, "TPL201", str(path)) == []
    assert lines(EVALUATE, "TPL301", str(path)) == []


def test_boxes_handed_back_on_the_device_are_reported(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    post = POST.replace("output[0].cpu().detach().numpy()", "output[0]").replace(
        "return [list(b) for b in boxes if np.max(b) > conf_thresh]", "return boxes"
    )
    path = _yolo(tmp_path_factory, post)
    assert lines(EVALUATE, "TPL201", str(path)) == [15]
    assert lines(EVALUATE, "TPL301", str(path)) == [11]


# ---- TPL201: names unpacked from a project function that returns several values
# (sd-scripts' `optimizer_name, optimizer_args, optimizer = train_util.get_optimizer(args,
# params)`): which of them holds what it was given is not followed, so none is a device value

TRAIN_UTIL = """\
import torch


def get_optimizer(args, trainable_params):
    optimizer = torch.optim.AdamW(trainable_params, lr=args.lr)
    return args.optimizer_type, str(args.optimizer_args), optimizer
"""

TRAIN = """\
from library import train_util


def train(args, network, loader, accelerator):
    network.to(accelerator.device)
    params = network.prepare_optimizer_params(args.lr)
    name, extra, optimizer = train_util.get_optimizer(args, params)
    for batch in loader:
        loss = network(batch)
        accelerator.backward(loss)
        optimizer.step()
    metadata = {"ss_optimizer": name + extra, "ss_steps": len(loader)}
    metadata = {k: str(v) for k, v in metadata.items()}
    return metadata
"""


def test_names_unpacked_from_a_project_function_returning_several_values_are_not_device(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("project")
    (root / "library").mkdir()
    (root / "library" / "__init__.py").write_text("")
    (root / "library" / "train_util.py").write_text(TRAIN_UTIL)
    (root / "train.py").write_text(TRAIN)
    assert lines(TRAIN, "TPL201", str(root / "train.py")) == []


# ---- TPL301: a host copy in two statements, under a flag, timed up to a stop taken before
# the model runs (YOLOv4's `do_detect`)

PREPROCESS = """\
import time

import numpy as np
import torch


def do_detect(model, img, use_cuda=1):
    with torch.no_grad():
        t0 = time.time()
        if type(img) == np.ndarray:
            img = torch.from_numpy(img.transpose(2, 0, 1)).float().div(255.0).unsqueeze(0)
        if use_cuda:
            img = img.cuda()
        img = torch.autograd.Variable(img)
        t1 = time.time()
        output = model(img)
        print("Preprocess : %f" % (t1 - t0))
        return output
"""


def test_timing_a_host_copy_made_in_two_statements_is_left_alone() -> None:
    assert lines(PREPROCESS, "TPL301") == []


def test_timing_the_model_from_the_same_start_is_reported() -> None:
    source = PREPROCESS.replace("(t1 - t0)", "(time.time() - t0)")
    # `t1` is then subtracted from nowhere: the measurement is the one from `t0`
    assert lines(source, "TPL301") == [9]


# ---- TPL201: the chunks `split` makes of a device tensor, each run and copied (StyleGAN3)

CHUNKS = """\
import torch


def snapshot(G, labels, batch_gpu, device, path):
    grid_z = torch.randn([labels.shape[0], 512], device=device).split(batch_gpu)
    images = torch.cat([G(z).cpu() for z in grid_z]).numpy()
    save_image_grid(images, path)
"""


def test_copies_of_the_chunks_a_split_makes_are_left_alone() -> None:
    assert lines(CHUNKS, "TPL201") == []
    source = (
        CHUNKS.replace(".split(batch_gpu)", "")
        .replace("torch.randn(", "torch.split(torch.randn(")
        .replace("device=device)", "device=device), batch_gpu)")
    )
    assert lines(source, "TPL201") == []


def test_copies_of_the_rows_of_a_tensor_are_reported() -> None:
    source = CHUNKS.replace(".split(batch_gpu)", "").replace("G(z)", "G(z[None])")
    assert lines(source, "TPL201") == [6]


# ---- TPL201: a loop over a mapping's entries, each broadcast and read back (StyleGAN3)

ENTRIES = """\
import torch


def calc_metric(metric, opts):
    results = _metric_dict[metric](opts)
    for key, value in list(results.items()):
        if opts.num_gpus > 1:
            value = torch.as_tensor(value, dtype=torch.float64, device=opts.device)
            torch.distributed.broadcast(tensor=value, src=0)
            value = float(value.cpu())
        results[key] = value
    return results
"""


def test_a_loop_over_a_mappings_entries_is_not_a_batch_loop() -> None:
    assert lines(ENTRIES, "TPL201") == []


def test_a_loop_over_values_made_into_device_tensors_is_a_batch_loop() -> None:
    source = ENTRIES.replace("for key, value in list(results.items()):", "for value in results:")
    assert lines(source, "TPL201") == [10]


# ---- TPL201: a demo's per-frame result shown on screen is its output (RAFT's `viz`)

SHOWN = """\
import cv2
import torch

DEVICE = "cuda"


def viz(img, flo):
    flo = flo[0].permute(1, 2, 0).cpu().numpy()
    cv2.imshow("image", flow_to_image(flo))
    cv2.waitKey()


def demo(model, images):
    model.to(DEVICE)
    with torch.no_grad():
        for imfile1, imfile2 in zip(images[:-1], images[1:]):
            image1, image2 = load_image(imfile1), load_image(imfile2)
            flow_up = model(image1.to(DEVICE), image2.to(DEVICE))
            viz(image1, flow_up)
"""


def test_a_result_shown_per_frame_in_a_demo_is_left_alone() -> None:
    assert lines(SHOWN, "TPL201") == []


def test_a_result_shown_every_training_step_is_reported() -> None:
    source = SHOWN.replace(
        "            viz(image1, flow_up)",
        "            flow_up.mean().backward()\n            viz(image1, flow_up)",
    ).replace("    with torch.no_grad():\n", "    if True:\n")
    assert lines(source, "TPL201") == [8]


# ---- TPL201: a loop that takes one batch and leaves, by a `break` ending its body (voicefilter)

ONE_BATCH = """\
import torch


def validate(model, testloader, writer, step):
    with torch.no_grad():
        for batch in testloader:
            mixed_mag = batch[0].cuda()
            est_mag = model(mixed_mag)
            writer.log_evaluation(est_mag[0].cpu().detach().numpy(), step)
            break
"""


def test_a_loop_that_leaves_after_its_first_batch_is_left_alone() -> None:
    assert lines(ONE_BATCH, "TPL201") == []


def test_a_loop_that_may_skip_its_break_is_reported() -> None:
    source = ONE_BATCH.replace(
        "            est_mag = model(mixed_mag)\n",
        "            est_mag = model(mixed_mag)\n            if est_mag is None:\n"
        "                continue\n",
    )
    assert lines(source, "TPL201") == [11]


# ---- TPL201: features of sliding windows over the input, collected and returned (SyncNet)

WINDOWS = """\
import torch


class SyncNetInstance(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net.cuda()

    def extract_feature(self, imtv, lastframe, batch_size):
        im_feat = []
        for i in range(0, lastframe, batch_size):
            im_batch = [imtv[:, :, v : v + 5] for v in range(i, min(lastframe, i + batch_size))]
            im_in = torch.cat(im_batch, 0)
            im_out = self.net(im_in.cuda())
            im_feat.append(im_out.data.cpu())
        im_feat = torch.cat(im_feat, 0)
        return im_feat
"""


def test_window_features_collected_and_returned_are_left_alone() -> None:
    assert lines(WINDOWS, "TPL201") == []


def test_window_features_reduced_after_the_loop_are_reported() -> None:
    source = WINDOWS.replace("        return im_feat\n", "        return im_feat.mean().item()\n")
    assert lines(source, "TPL201") == [15]
