"""Corpus round 40: false positives found on medical-image segmentation (semi-supervised
training scripts, a 3D U-Net), speech enhancement, anomaly detection, stereo matching, table
detection and structure recognition (a DETR derivative) and a small vision-language model's
training script, each as the look-alike that must stay clean next to the pitfall that must
still be found."""

from __future__ import annotations

from .helpers import lines


def _lines(source: str, code: str, path: str = "losses.py") -> list[int]:
    return lines(source, code, path)


# ---- TPL501: a weight tensor moved under a test of its type name, `self.alpha.type()`

FOCAL_LOSS = """\
import torch
import torch.nn as nn
import torch.nn.functional as F


class FocalLoss(nn.Module):
    def __init__(self, gamma=2, alpha=None):
        super().__init__()
        self.gamma = gamma
        self.alpha = alpha
        if isinstance(alpha, list):
            self.alpha = torch.Tensor(alpha)

    def forward(self, input, target):
        logpt = F.log_softmax(input, dim=1).gather(1, target.view(-1, 1)).view(-1)
        if self.alpha is not None:
            if self.alpha.type() != input.data.type():
                {move}
            logpt = logpt * self.alpha.gather(0, target.view(-1))
        return -1 * (1 - logpt.exp()) ** self.gamma * logpt
"""


def test_weights_read_after_a_type_name_test_without_a_move_are_found() -> None:
    source = FOCAL_LOSS.format(move="print('type differs')")
    assert _lines(source, "TPL501") == [12]


def test_weights_cast_to_a_named_type_before_the_read_are_found() -> None:
    # `.type(torch.FloatTensor)` casts to a fixed host type: the read is not moved
    source = FOCAL_LOSS.replace("self.alpha.type() != input.data.type()", "True").format(
        move="self.alpha = self.alpha.type(torch.FloatTensor).gather(0, target.view(-1))"
    )
    assert _lines(source, "TPL501") == [12]


def test_weights_moved_when_their_type_name_differs_are_clean() -> None:
    source = FOCAL_LOSS.format(move="self.alpha = self.alpha.type_as(input.data)")
    assert _lines(source, "TPL501") == []


# ---- TPL201: DETR-style loader names with the split last (`data_loader_train`)

EPOCH_LOOP = """\
import torch
from engine import evaluate, train_one_epoch


def train(args, model, criterion, postprocessors, device):
    if args.model_load_path:
        model.to(device)
    for epoch in range(args.start_epoch, args.epochs):
        train_stats = train_one_epoch(model, criterion, {train}, device, epoch)
        stats, coco_evaluator = evaluate(model, criterion, postprocessors, {val}, device)
        print("AP50: {{:.3f}}".format(stats["coco_eval_bbox"][1]))
"""


def test_stats_of_one_batch_step_per_turn_are_found() -> None:
    source = EPOCH_LOOP.format(train="samples_train", val="samples_val")
    assert _lines(source, "TPL201", "main.py") == [11]


def test_stats_of_whole_passes_over_split_named_loaders_are_clean() -> None:
    source = EPOCH_LOOP.format(train="data_loader_train", val="data_loader_val")
    assert _lines(source, "TPL201", "main.py") == []


def test_stats_of_whole_passes_over_split_named_datasets_are_clean() -> None:
    source = EPOCH_LOOP.format(train="dataset_train", val="dataset_val")
    assert _lines(source, "TPL201", "main.py") == []


# ---- TPL102: a device that only says where a checkpoint loads before `load_state_dict`

LOAD_FROM = """\
import torch
import torch.nn as nn


class SwinUnet(nn.Module):
    def __init__(self):
        super().__init__()
        self.swin_unet = nn.Linear(4, 4)

    def load_from(self, path):
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        pretrained_dict = torch.load(path, map_location=device)
        {use}

    def forward(self, x):
        return self.swin_unet(x)
"""


def test_a_checkpoint_kept_as_loaded_on_the_chosen_device_is_found() -> None:
    source = LOAD_FROM.format(use="self.table = pretrained_dict['table']")
    assert _lines(source, "TPL102", "vision_transformer.py") == [11]


def test_the_chosen_device_also_placing_a_tensor_is_found() -> None:
    source = LOAD_FROM.format(
        use="self.swin_unet.load_state_dict(pretrained_dict)\n"
        "        self.scale = torch.ones(4).to(device)"
    )
    assert _lines(source, "TPL102", "vision_transformer.py") == [11]


def test_a_checkpoint_copied_into_the_module_is_clean() -> None:
    source = LOAD_FROM.format(use="self.swin_unet.load_state_dict(pretrained_dict, strict=False)")
    assert _lines(source, "TPL102", "vision_transformer.py") == []


def test_the_device_written_as_the_load_location_itself_is_clean() -> None:
    source = LOAD_FROM.replace(
        'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n        ', ""
    ).format(use="self.swin_unet.load_state_dict(pretrained_dict)")
    source = source.replace("map_location=device", 'map_location=torch.device("cuda")')
    assert _lines(source, "TPL102", "vision_transformer.py") == []
