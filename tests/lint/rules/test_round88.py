"""Round 88 (TPL201): ``for t in targets: for k, v in t.items(): t[k] = v.to(device)`` moves
each dict's entries in place, as ``t[k] = t[k].to(device)`` does, and so what the list of
dicts holds: table-transformer's evaluation then reads ``target["image_id"].item()`` of
each image, and copies every entry back with ``.cpu()``, once per batch."""

from __future__ import annotations

from .helpers import lines as _lines

EVALUATE = """\
import torch


def evaluate(model, data_loader, postprocessors, device, evaluator):
    for samples, targets in data_loader:
        samples = samples.to(device)
        for t in targets:
            for k, v in t.items():
                if k != "img_path":
                    t[k] = v.to(device)
        outputs = model(samples)
        results = postprocessors(outputs)
        res = {target["image_id"].item(): out for target, out in zip(targets, results)}
        evaluator.update(res)
        for target in targets:
            for k, v in target.items():
                if k != "img_path":
                    target[k] = v.cpu()
"""


def test_entries_moved_in_place_through_items() -> None:
    assert _lines(EVALUATE, "TPL201") == [13, 18]


def test_entries_copied_into_another_dict_move_nothing_in_the_list() -> None:
    copied = EVALUATE.replace(
        "                    t[k] = v.to(device)\n",
        "                    moved = {k: v.to(device)}\n",
    )
    assert _lines(copied, "TPL201") == []
