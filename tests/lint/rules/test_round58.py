"""Rule behaviour found on code the corpus does not hold: a join bound to a name, copied
asynchronously in a later statement."""

from __future__ import annotations

from .helpers import lines as _lines

# ---- TPL701: a batch's views joined into a new tensor, then copied with non_blocking=True

JOINED_VIEWS = """\
import torch


def train(loader, model):
    for images, labels in loader:
        images = torch.cat([images[0], images[1]], dim=0)
        if torch.cuda.is_available():
            images = images.cuda(non_blocking=True)
            labels = labels.cuda(non_blocking=True)
        model(images, labels)
"""


def test_a_join_rebinding_a_batch_reaches_the_copy_below_it() -> None:
    # the loop's batch may be pinned (its loader is not known here); the join is not
    assert _lines(JOINED_VIEWS, "TPL701") == [8]
    # in the same block as the copy, and through a factory as well as a join
    straight = (
        JOINED_VIEWS.replace("        if torch.cuda.is_available():\n", "")
        .replace("            images = images.cuda", "        images = images.cuda")
        .replace("            labels = labels.cuda", "        labels = labels.cuda")
    )
    assert _lines(straight, "TPL701") == [7]
    built = JOINED_VIEWS.replace(
        "torch.cat([images[0], images[1]], dim=0)", "torch.zeros(4, 3, 32, 32)"
    )
    assert _lines(built, "TPL701") == [8]


def test_a_pinned_or_device_join_or_a_branch_binding_is_left_alone() -> None:
    pinned = JOINED_VIEWS.replace("dim=0)", "dim=0).pin_memory()")
    assert _lines(pinned, "TPL701") == []
    on_device = JOINED_VIEWS.replace(
        "torch.cat([images[0], images[1]], dim=0)",
        "torch.cat([images[0].to('cuda'), images[1].to('cuda')], dim=0)",
    )
    assert _lines(on_device, "TPL701") == []
    # bound in a branch only: the batch itself may reach the copy, and its memory is unknown
    branch = JOINED_VIEWS.replace(
        "        images = torch.cat(",
        "        if len(images) == 2:\n            images = torch.cat(",
    )
    assert _lines(branch, "TPL701") == []
