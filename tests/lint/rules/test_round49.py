"""Round 49: a loop whose step moves what it works on to the device in place and back to the
CPU before the next one (llm-awq's ``apply_scale``: ``prev_op.cuda()``, the scaling, then
``prev_op.cpu()``) offloads a model's layers one at a time: a walk over layers, not over
batches, so a helper it calls is not a per-batch function. A loop that also runs a model on
what it moves stays a batch loop, whatever it moves back."""

from __future__ import annotations

from .helpers import lines

AWQ = """\
import torch


@torch.no_grad()
def scale_ln_fcs(ln, fcs, scales):
    scales = scales.to(ln.weight.device)
    ln.weight.div_(scales)
    for fc in fcs:
        fc.weight.mul_(scales.view(1, -1))
    for p in ln.parameters():
        assert torch.isnan(p).sum() == 0


def apply_scale(module, scales_list):
    for prev_op_name, layer_names, scales in scales_list:
        prev_op = module.get_submodule(prev_op_name)
        layers = [module.get_submodule(name) for name in layer_names]
        prev_op.cuda()
        for layer in layers:
            layer.cuda()
        scale_ln_fcs(prev_op, layers, scales)
        prev_op.cpu()
        for layer in layers:
            layer.cpu()
"""

OFFLOADED_BATCH = """\
import torch


def evaluate(model, loader, device):
    for data in loader:
        data.to(device)
        out = model(data)
        assert torch.isnan(out).sum() == 0
        data.cpu()
"""


def test_layer_offload_walk_is_not_a_batch_loop() -> None:
    assert lines(AWQ, "TPL201", "awq/quantize/auto_scale.py") == []


def test_walk_without_offload_still_reported() -> None:
    kept = AWQ.replace("        prev_op.cpu()\n", "")
    assert lines(kept, "TPL201") == [11]


def test_batch_moved_back_after_the_model_run_still_reported() -> None:
    assert lines(OFFLOADED_BATCH, "TPL201") == [8]
