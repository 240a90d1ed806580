"""Crossings of the toy model split over two devices, by hand, for a stage runner and for hooks."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from tests.planner.conftest import toy_plan
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


def test_a_weight_read_away_from_its_device_is_a_copy(tmp_path: Path) -> None:
    """Top-level parameters on two devices: the model's code multiplies them where it runs
    (cuda:0), and a block on cuda:1 takes one as an argument; each read elsewhere is a copy."""
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"pos": 0, "scale": 1, "a": 0, "b": 1}))
    p = toy_plan("make_shared_position", map_file=path)
    row = 8 * F32  # one (1, 8) float32 parameter
    weights = [(c.src, c.dst, c.producer, c.consumer, c.total) for c in p.flow.crossings]
    assert ("cuda:1", "cuda:0", "scale", GLUE, row) in weights
    assert ("cuda:0", "cuda:1", "pos", "b", row) in weights
    # the copies are activations where they land: cuda:1 holds pos's copy to the end
    assert p.budgets["cuda:1"].activation[B] >= row
    assert p.budgets["cuda:0"].weights == 288 + row  # a's weights and pos, not the copies


def test_a_crossing_has_the_shape_its_consumer_receives() -> None:
    # each Linear on (B, 6, 8) makes a (B*6, 8) matmul output and hands on a (B, 6, 8) view
    # of it: the crossings showed (B*6, 8); batch 5 is derived from the traces at 2 and 8
    from torchplace.planner.render import render_text

    p = toy_plan("make_two_linear", strategy="pipeline", batch_sizes=[1, 2, 5, 8])
    for b in (1, 2, 5, 8):
        shown = [
            (c.producer, c.consumer, c.shape, c.nbytes)
            for c in flow(p.traces[b], p.placement).crossings
        ]
        assert shown == [
            ("input", "a", (b, 6, 8), b * 6 * 8 * F32),
            ("a", "b", (b, 6, 8), b * 6 * 8 * F32),
            ("b", "(host)", (b, 6, 8), b * 6 * 8 * F32),
        ]
    assert [e["shape"] for e in p.to_dict()["crossings"]["edges"]] == [[8, 6, 8]] * 3
    (row,) = [
        line for line in render_text(p).splitlines() if line.startswith("| cuda:0 | cuda:1 |")
    ]
    assert "| 8x6x8 |" in row


def test_hooks_copy_once_into_a_container_whose_layers_take_fused_kernels() -> None:
    # accelerate's map may name a ModuleList ('layers'), never called itself: its calls are
    # found by its weights. A fused kernel's operands and then its parts, read at one operator
    # index, were two calls, so the hooks copied the embedding's output to it twice
    from torchplace.planner.trace import trace_forward

    model = _Stack().to("meta").eval()
    ids = torch.empty(B, 5, dtype=torch.int64, device="meta")
    trace = trace_forward(model, [ids], ["emb", "layers"], batch=B, seq=None)
    starts = [c.start for c in trace.calls]
    assert len(starts) == len(set(starts))
    assign = {"emb": "d0", "layers": "d1"}
    f = flow(trace, Placement("accelerate", ("d0", "d1"), assign, hooks=True))
    into = [(c.producer, c.shape, c.count, c.kind) for c in f.crossings if c.consumer == "layers"]
    assert into == [("emb", (B, 5, 32), 1, "d2d")]


class _Stack(nn.Module):
    """An embedding and a ModuleList of encoder layers (on their fused fast path)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 32)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True) for _ in range(2)
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        for layer in self.layers:
            h = layer(h)
        return h  # type: ignore[no-any-return]
