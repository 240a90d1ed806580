"""TPL201 (rules/sync.py): a copy written out only under a flag, but handed to a metric on
every step, is a per-batch read, not the loop's output."""

from __future__ import annotations

from torchplace.lint import lint_source

VALIDATE = """\
import torch
from PIL import Image


def validate(opts, model, loader, device, metrics):
    with torch.no_grad():
        for i, (images, labels) in enumerate(loader):
            images = images.to(device)
            labels = labels.to(device)
            preds = model(images).max(dim=1)[1].cpu().numpy()
            targets = labels.cpu().numpy()
            metrics.update(targets, preds)
            if opts.save_val_results:
                for j in range(len(images)):
                    image = images[j].cpu().numpy()
                    Image.fromarray(image).save("%d_image.png" % j)
                    Image.fromarray(preds[j]).save("%d_pred.png" % j)
    return metrics.get_results()
"""

SAMPLE = """\
import numpy as np
import torch


def sample(model, loader, device, args):
    outputs = []
    for x in loader:
        y = model(x.to(device)).cpu().numpy()
        outputs.append(y)
        print("created", len(outputs))
    if args.rank == 0:
        np.savez("samples.npz", np.concatenate(outputs))
"""


def test_copies_fed_to_a_metric_every_step_are_reported() -> None:
    lines = [f.line for f in lint_source(VALIDATE, "main.py", select={"TPL201"})]
    assert lines == [10, 11]


def test_copies_written_out_are_still_the_output() -> None:
    assert lint_source(SAMPLE, "sample.py", select={"TPL201"}) == []
