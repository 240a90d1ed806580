"""Crossings of the toy model split over two devices, by hand, for a stage runner and for hooks."""

from __future__ import annotations

import torch

from tests.planner.toy import Toy
from torchplace.planner.crossings import flow
from torchplace.planner.strategies import Placement
from torchplace.planner.trace import GLUE

B, F32 = 2, 4
ROW = B * 8 * F32  # a (B, 8) float32 tensor: the hidden state, or the mask
ASSIGN = {"inp": "d0", "blocks.0": "d0", "blocks.1": "d1", "blocks.2": "d1", "out": "d1"}


def _trace():  # type: ignore[no-untyped-def]
    from torchplace.planner.trace import trace_forward

    model = Toy().to("meta")
    return trace_forward(model, [torch.empty(B, 4, device="meta")], list(ASSIGN), batch=B, seq=None)


def test_a_stage_runner_copies_each_tensor_once() -> None:
    f = flow(_trace(), Placement("pipeline", ("d0", "d1"), ASSIGN))
    edges = [(c.src, c.dst, c.producer, c.consumer, c.nbytes, c.count, c.kind) for c in f.crossings]
    assert edges == [
        ("cpu", "d0", "input", "inp", B * 4 * F32, 1, "h2d"),
        ("d0", "d1", "blocks.0", "blocks.1", ROW, 1, "d2d"),
        ("d0", "d1", GLUE, "blocks.1", ROW, 1, "d2d"),  # the mask, once
        ("d1", "cpu", "out", "(host)", B * 2 * F32, 1, "d2h"),
    ]
    assert f.bytes_between_devices() == 2 * ROW
    assert f.output_devices == ["d1"]


def test_hooks_copy_the_mask_for_every_block_and_send_the_output_back() -> None:
    f = flow(_trace(), Placement("accelerate", ("d0", "d1"), ASSIGN, hooks=True))
    kinds = [(c.src, c.dst, c.consumer, c.kind) for c in f.crossings]
    assert kinds == [
        ("cpu", "d0", "(model call)", "h2d"),
        ("d0", "d1", "blocks.1", "d2d"),
        ("d0", "d1", "blocks.1", "d2d"),
        ("d0", "d1", "blocks.2", "recopy"),  # the same mask, again
        ("d1", "d0", "(model return)", "return"),
        ("d0", "cpu", "(host)", "d2h"),
    ]
    assert f.bytes_between_devices() == 3 * ROW + B * 2 * F32


def test_each_device_holds_its_copies_while_the_original_lives() -> None:
    from torchplace.planner.budget import activation_peak

    f = flow(_trace(), Placement("pipeline", ("d0", "d1"), ASSIGN))
    # d0: mask, hidden, lin out, product; d1: the two copies, lin out, product.
    assert activation_peak(f.spans["d0"]) == 4 * ROW
    assert activation_peak(f.spans["d1"]) == 4 * ROW
