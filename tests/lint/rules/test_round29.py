"""Corpus round 29: false positives found on course and tutorial repositories, Chinese-language
tutorial code, detection and segmentation training scripts, research reimplementations and
explainability tools, each as the look-alike that must stay clean next to the pitfall that must
still be found."""

from __future__ import annotations

from .helpers import lines

# ---- TPL201: an epoch loop that calls a whole pass over a loader and saves a checkpoint

EPOCH_LOOP = """\
import torch
from train_utils import train_one_epoch, evaluate


def main(args):
    device = torch.device(args.device)
    model = build().to(device)
    for epoch in range(args.epochs):
        mean_loss, lr = train_one_epoch(model, optimizer, train_loader, device, epoch)
        confmat = evaluate(model, val_loader, device=device)
        print(f"loss {mean_loss:.4f} {confmat}")
        train_loss.append(mean_loss.item())
        save_files = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                      "epoch": epoch}
        torch.save(save_files, "model_{}.pth".format(epoch))
"""


def test_reads_after_a_whole_pass_in_an_epoch_loop_are_left_alone() -> None:
    assert lines(EPOCH_LOOP, "TPL201") == []


def test_reads_after_a_step_per_turn_are_reported() -> None:
    source = EPOCH_LOOP.replace(
        "train_one_epoch(model, optimizer, train_loader, device, epoch)",
        "train_step(model, optimizer, batches[epoch].to(device), epoch)",
    ).replace("evaluate(model, val_loader, device=device)", "model(images[epoch].to(device))")
    assert lines(source, "TPL201") == [11, 12]


# ---- TPL201: a loader item the step never moves beside one it moves in a comprehension

DETECTION_EVAL = """\
import torch


@torch.no_grad()
def evaluate(model, data_loader, device):
    cpu_device = torch.device("cpu")
    for images, targets in data_loader:
        images = list(img.to(device) for img in images)
        outputs = model(images)
        outputs = [{k: v.to(cpu_device) for k, v in t.items()} for t in outputs]
        res = {target["image_id"].item(): output for target, output in zip(targets, outputs)}
        boxes = targets[0]["boxes"].detach().cpu()
        coco_evaluator.update(res, boxes)
"""


def test_unmoved_loader_items_beside_moved_ones_are_left_alone() -> None:
    assert lines(DETECTION_EVAL, "TPL201", "engine.py") == []


def test_loader_items_moved_in_a_comprehension_are_reported() -> None:
    source = DETECTION_EVAL.replace(
        "        outputs = model(images)\n",
        "        outputs = model(images)\n"
        "        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]\n",
    )
    assert lines(source, "TPL201", "engine.py") == [12, 13]


# ---- TPL601: a test that returns in the `else` of a CUDA availability check

MEMORY_TEST = """\
import torch


def test_memory_usage_in_loop(model, batch):
    if torch.cuda.is_available():
        device = "cuda"
    else:
        print("CUDA not available")
        return
    model = model.to(device)
    initial = torch.cuda.mem_get_info()[0]
    model(batch.to(device))
    assert torch.cuda.mem_get_info()[0] <= initial * 1.5
"""


def test_cuda_calls_after_an_else_that_returns_are_left_alone() -> None:
    assert lines(MEMORY_TEST, "TPL601", "test_memory.py") == []


def test_cuda_calls_after_an_else_that_goes_on_are_reported() -> None:
    source = MEMORY_TEST.replace("        return\n", "        device = 'cpu'\n")
    assert lines(source, "TPL601", "test_memory.py") == [11, 13]


# ---- TPL103: the CPU branch of a CUDA availability test in a module's forward path

REPARAMETRIZE = """\
import torch
from torch import nn


class VAE(nn.Module):
    def reparametrize(self, mu, logvar):
        std = logvar.mul(0.5).exp_()
        if torch.cuda.is_available():
            eps = torch.cuda.FloatTensor(std.size()).normal_()
        else:
            eps = torch.FloatTensor(std.size()).normal_()
        return eps.mul(std).add_(mu)

    def forward(self, x):
        mu, logvar = self.encode(x)
        return self.reparametrize(mu, logvar)
"""


def test_a_factory_in_the_else_of_cuda_availability_is_left_alone() -> None:
    assert lines(REPARAMETRIZE, "TPL103", "vae.py") == []


def test_a_factory_in_the_cuda_branch_is_reported() -> None:
    source = REPARAMETRIZE.replace("torch.cuda.FloatTensor(", "torch.FloatTensor(")
    assert lines(source, "TPL103", "vae.py") == [9]


# ---- TPL103: a loss helper that brings its targets to the host to match anchors there

YOLO_LOSS = """\
import torch
from torch import nn


class YOLOLoss(nn.Module):
    def forward(self, l, x, targets):
        y_true, noobj_mask = self.get_target(l, targets, x.shape[2], x.shape[3])
        noobj_mask = self.get_ignore(l, x, targets, noobj_mask)
        if self.cuda:
            y_true = y_true.type_as(x)
            noobj_mask = noobj_mask.type_as(x)
        return self.loss(x, y_true, noobj_mask)

    def get_target(self, l, targets, in_h, in_w):
        bs = len(targets)
        noobj_mask = torch.ones(bs, 3, in_h, in_w, requires_grad=False)
        y_true = torch.zeros(bs, 3, in_h, in_w, 85, requires_grad=False)
        for b in range(bs):
            batch_target = torch.zeros_like(targets[b])
            batch_target[:, 0] = targets[b][:, 0] * in_w
            batch_target = batch_target.cpu()
            gt_box = torch.FloatTensor(
                torch.cat((torch.zeros((batch_target.size(0), 2)), batch_target[:, 2:4]), 1)
            )
            y_true[b, 0] = self.match(gt_box)
        return y_true, noobj_mask
"""


def test_factories_of_a_helper_that_works_on_the_host_are_left_alone() -> None:
    assert lines(YOLO_LOSS, "TPL103", "yolo_training.py") == []


def test_factories_of_a_helper_that_keeps_its_targets_on_the_device_are_reported() -> None:
    source = YOLO_LOSS.replace("            batch_target = batch_target.cpu()\n", "")
    assert lines(source, "TPL103", "yolo_training.py") == [16, 17, 21, 22]


# ---- TPL401/TPL402: a tutorial's save function called before its restore function

SAVE_RELOAD = """\
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def save():
    net1 = train(build_net().to(DEVICE))
    torch.save(net1, "net.pkl")
    torch.save(net1.state_dict(), "net_params.pkl")


def restore_net():
    net2 = torch.load("net.pkl")
    return net2


def restore_params():
    net3 = torch.nn.Linear(1, 1)
    net3.load_state_dict(torch.load("net_params.pkl"))
    return net3


save()
restore_net()
restore_params()
"""


def test_loads_after_the_script_called_its_saving_function_are_left_alone() -> None:
    assert lines(SAVE_RELOAD, "TPL401", "save_reload.py") == []
    assert lines(SAVE_RELOAD, "TPL402", "save_reload.py") == []


def test_loads_before_the_script_calls_its_saving_function_are_reported() -> None:
    source = SAVE_RELOAD.replace("save()\nrestore_net()\n", "restore_net()\nsave()\n")
    assert lines(source, "TPL401", "save_reload.py") == [13]
    assert lines(source, "TPL402", "save_reload.py") == [13]


# ---- TPL201: the counter of an enumerate wrapped in `list(...)`

CROP_BOXES = """\
import torch


def detect(net, image, device):
    with torch.no_grad():
        outputs = net(image.to(device))
    boxes = outputs[0][:, :4]
    for i, c in list(enumerate(boxes)):
        print("save crop_" + str(i) + ".png")
"""


def test_the_counter_of_a_wrapped_enumerate_is_left_alone() -> None:
    assert lines(CROP_BOXES, "TPL201", "detect.py") == []


def test_the_rows_of_a_wrapped_enumerate_are_reported() -> None:
    source = CROP_BOXES.replace('str(i) + ".png"', 'str(c) + ".png"')
    assert lines(source, "TPL201", "detect.py") == [9]


# ---- TPL201: a helper object's method that converts its results to NumPy in place

DETECTOR = """\
import torch


class DecodeBox:
    def non_max_suppression(self, prediction, conf_thres=0.5):
        output = [None for _ in range(len(prediction))]
        for i, image_pred in enumerate(prediction):
            output[i] = image_pred[image_pred[:, 4] > conf_thres]
            if output[i] is not None:
                output[i] = output[i].cpu().numpy()
        return output


class YOLO:
    def __init__(self, net):
        self.net = net.cuda()
        self.bbox_util = DecodeBox()

    def detect_image(self, images):
        with torch.no_grad():
            outputs = self.net(images.cuda())
            results = self.bbox_util.non_max_suppression(outputs)
            top_label = results[0][:, 6]
            top_conf = results[0][:, 4]
            top_boxes = results[0][:, :4]
        for i, c in enumerate(top_label):
            box = top_boxes[i]
            score = str(top_conf[i])
            f.write("%s %s" % (score, box))
"""


def test_results_a_helper_converts_to_numpy_are_left_alone() -> None:
    assert lines(DETECTOR, "TPL201", "yolo.py") == []


def test_results_a_helper_keeps_on_the_device_are_reported() -> None:
    source = DETECTOR.replace("output[i].cpu().numpy()", "output[i].float()")
    assert lines(source, "TPL201", "yolo.py") == [28, 29]


SUBCLASS = """

class MapYOLO(YOLO):
    def get_map_txt(self, images):
        with torch.no_grad():
            outputs = self.bbox_util.non_max_suppression(self.net(images.cuda()))
            top_conf = outputs[0][:, 4]
        for i, c in enumerate(top_conf):
            print(float(top_conf[i]))
"""


def test_results_of_a_helper_a_base_class_builds_are_left_alone() -> None:
    assert lines(DETECTOR + SUBCLASS, "TPL201", "yolo.py") == []


def test_results_of_a_base_class_helper_kept_on_the_device_are_reported() -> None:
    source = (DETECTOR + SUBCLASS).replace("output[i].cpu().numpy()", "output[i].float()")
    assert lines(source, "TPL201", "yolo.py") == [28, 29, 38]
