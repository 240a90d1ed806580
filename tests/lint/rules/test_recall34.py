"""Recall round 34: pitfalls missed in detection scripts, each next to the look-alike that must
stay clean: an optimizer built from one parameter group per parameter (``params += [{"params":
[value], "lr": lr}]`` in a loop over ``named_parameters()``, in a script's own statements) before
the model is moved; and a timed detection step whose only host read is of the loader batch it
fetched by hand (``data = next(data_iter)``, never moved), which waits for nothing on the device.
"""

from __future__ import annotations

from .helpers import lines as _lines

# ---- TPL801: per-parameter groups gathered with `+=`, then the model moved

GROUPS_THEN_MOVE = """\
import torch


def build(args, detector, lr):
    groups = []
    for key, value in dict(detector.named_parameters()).items():
        if value.requires_grad:
            if "bias" in key:
                groups += [{"params": [value], "lr": lr * 2, "weight_decay": 0}]
            else:
                groups += [{"params": [value], "lr": lr}]
    optimizer = torch.optim.SGD(groups, momentum=0.9)
    if args.cuda:
        detector.cuda()
    return detector, optimizer
"""


def test_parameter_groups_gathered_with_plus_equals_before_the_move_are_reported() -> None:
    assert _lines(GROUPS_THEN_MOVE, "TPL801") == [12]
    # the same in a script's own statements, under `if __name__ == "__main__":`
    script = (
        "import torch\nfrom nets import Detector\n\n"
        'if __name__ == "__main__":\n'
        "    detector = Detector()\n"
        "    groups = []\n"
        "    for key, value in detector.named_parameters():\n"
        '        groups += [{"params": [value], "lr": 0.01}]\n'
        "    optimizer = torch.optim.Adam(groups)\n"
        "    detector.cuda()\n"
        "    optimizer.zero_grad()\n"
    )
    assert _lines(script, "TPL801") == [9]


def test_groups_built_after_the_move_or_from_other_values_are_left_alone() -> None:
    # the model is moved first, then its groups are gathered
    moved_first = GROUPS_THEN_MOVE.replace(
        "    if args.cuda:\n        detector.cuda()\n", ""
    ).replace("    groups = []\n", "    if args.cuda:\n        detector.cuda()\n    groups = []\n")
    assert _lines(moved_first, "TPL801") == []
    # `+=` onto a name the optimizer does not get (a running count)
    counted = GROUPS_THEN_MOVE.replace(
        '                groups += [{"params": [value], "lr": lr}]\n',
        "                total += value.numel()\n",
    ).replace(
        "torch.optim.SGD(groups, momentum=0.9)", "torch.optim.SGD(head.parameters(), momentum=0.9)"
    )
    counted = counted.replace(
        "def build(args, detector, lr):\n", "def build(args, detector, lr, head):\n"
    )
    assert _lines(counted, "TPL801") == []


# ---- TPL301: a timed detection step whose only read is of the host batch

TIMED_DETECTION = """\
import time

import torch
from torch.utils.data import DataLoader


def evaluate(args, detector, dataset, num_images):
    loader = DataLoader(dataset, batch_size=1, shuffle=False)
    data_iter = iter(loader)
    images = torch.FloatTensor(1)
    if args.cuda:
        images = images.cuda()
        detector.cuda()
    for i in range(num_images):
        data = next(data_iter)
        images.resize_(data[0].size()).copy_(data[0])
        tic = time.time()
        scores, boxes = detector(images)
        boxes /= data[1][0][2].item()
        toc = time.time()
        print(i, toc - tic)
"""


def test_a_read_of_the_unmoved_loader_batch_does_not_synchronize_a_timed_step() -> None:
    assert _lines(TIMED_DETECTION, "TPL301") == [17]
    # the iterator built over the loader in one expression
    inline = TIMED_DETECTION.replace(
        "    loader = DataLoader(dataset, batch_size=1, shuffle=False)\n"
        "    data_iter = iter(loader)\n",
        "    data_iter = iter(DataLoader(dataset, batch_size=1))\n",
    )
    assert _lines(inline, "TPL301") == [16]


def test_reads_of_device_values_or_of_batches_that_may_be_placed_still_synchronize() -> None:
    # the read is of the detector's output: it waits for the device
    output = TIMED_DETECTION.replace("data[1][0][2].item()", "scores.max().item()")
    assert _lines(output, "TPL301") == []
    # the batch itself is moved: its read waits for the copy and what came before
    moved = TIMED_DETECTION.replace(
        "        data = next(data_iter)\n",
        "        data = next(data_iter)\n        data = [d.cuda() for d in data]\n",
    ).replace("images.resize_(data[0].size()).copy_(data[0])", "images = data[0]")
    assert _lines(moved, "TPL301") == []
    # a loader whose own collate function may place the batch
    collated = TIMED_DETECTION.replace(
        "batch_size=1, shuffle=False)", "batch_size=1, collate_fn=to_gpu)"
    )
    assert _lines(collated, "TPL301") == []
    # a loader the function is handed: nothing says how it collates
    handed = TIMED_DETECTION.replace(
        "    loader = DataLoader(dataset, batch_size=1, shuffle=False)\n", ""
    ).replace("dataset, num_images", "loader, num_images")
    assert _lines(handed, "TPL301") == []
