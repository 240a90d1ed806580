"""Round 80 (TPL201): a tensor method of a host copy (``x.cpu().squeeze(0)``) is a host copy
too, whose arithmetic with values of unknown place stays on the host (RAFT-Stereo's per-image
end-point errors)."""

from __future__ import annotations

from .helpers import lines as _lines

EPE = """\
import torch


def validate(model, dataset, padder):
    for val_id in range(len(dataset)):
        image1, image2, flow_gt, valid_gt = dataset[val_id]
        flow_pr = model(image1[None].cuda(), image2[None].cuda())
        flow_pr = padder.unpad(flow_pr.float()).cpu().squeeze(0)
        epe = torch.sum((flow_pr - flow_gt) ** 2, dim=0).sqrt()
        out = epe.flatten() > 1.0
        print(out[valid_gt.flatten() >= 0.5].float().mean().item())
"""


def test_arithmetic_of_a_host_copy_view_stays_on_the_host() -> None:
    assert _lines(EPE, "TPL201") == [8]


def test_without_the_copy_the_read_is_of_the_device() -> None:
    device = EPE.replace(".cpu().squeeze(0)", ".squeeze(0)")
    assert _lines(device, "TPL201") == [11]
