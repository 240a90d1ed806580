"""The trace on meta, checked against figures worked out by hand."""

from __future__ import annotations

import pytest
import torch

from tests.planner.conftest import toy_plan
from tests.planner.toy import Toy
from torchplace.errors import ConfigError, PlacementError
from torchplace.models import build_model
from torchplace.planner.api import plan
from torchplace.planner.trace import GLUE, INPUT, trace_forward
from torchplace.planner.verify import verify

B = 2
F32 = 4


def test_seed_mlp_peak_and_flops_by_hand() -> None:
    model = build_model("seed-mlp").to("meta")
    trace = trace_forward(
        model, [torch.empty(B, 8, device="meta")], ["0", "1", "2"], batch=B, seq=None
    )
    # Linear(8,16) makes B x 16; ReLU makes another B x 16 while the first is still held;
    # then the first dies and Linear(16,2) makes B x 2.
    assert trace.peak() == 2 * B * 16 * F32
    assert trace.flops == {"0": 2 * B * 8 * 16, "2": 2 * B * 16 * 2}
    (out,) = trace.outputs
    assert trace.allocs[out].shape == (B, 2)
    assert [a.owner for a in trace.allocs if a.owner == INPUT] == [INPUT]


def test_toy_peak_flops_and_calls_by_hand() -> None:
    model = Toy().to("meta")
    units = ["inp", "blocks.0", "blocks.1", "blocks.2", "out"]
    trace = trace_forward(model, [torch.empty(B, 4, device="meta")], units, batch=B, seq=None)
    row = B * 8 * F32  # one (B, 8) float32 tensor
    # In a block: the mask, the block's input, lin's output and the product are alive at once.
    assert trace.peak() == 4 * row
    assert trace.flops == {
        "inp": 2 * B * 4 * 8,
        "blocks.0": 2 * B * 8 * 8,
        "blocks.1": 2 * B * 8 * 8,
        "blocks.2": 2 * B * 8 * 8,
        "out": 2 * B * 8 * 2,
    }
    assert [c.unit for c in trace.calls] == units
    mask = trace.allocs[trace.calls[1].args[1]]
    assert mask.owner == GLUE
    assert mask.nbytes == row
    assert all(mask.index in c.args for c in trace.calls[1:4])


def test_peak_is_linear_in_the_batch_for_a_transformer_shape() -> None:
    from torchplace.planner.shapes import build_shape

    model = build_shape("gpt2-like", layers=2)
    units = ["wte", "wpe", "h.0", "h.1", "ln_f", "lm_head"]
    peaks = []
    for b in (1, 2, 3):
        ids = torch.zeros(b, 16, dtype=torch.long, device="meta")
        peaks.append(trace_forward(model, [ids], units, batch=b, seq=16).peak())
    assert peaks[2] - peaks[1] == peaks[1] - peaks[0] > 0


def test_sizes_between_are_derived_exactly() -> None:
    from torchplace.planner.scaling import traces_for
    from torchplace.planner.shapes import build_shape

    model = build_shape("gpt2-like", layers=2)
    units = ["wte", "wpe", "h.0", "h.1", "ln_f", "lm_head"]
    traced: list[int] = []

    def run(b: int):  # type: ignore[no-untyped-def]
        traced.append(b)
        ids = torch.zeros(b, 16, dtype=torch.long, device="meta")
        return trace_forward(model, [ids], units, batch=b, seq=16)

    derived = traces_for([1, 2, 3, 5, 8], run)
    assert sorted(traced) == [1, 2, 8]  # 3 and 5 follow from 2 and 8
    for b in (3, 5):
        direct = run(b)
        assert derived[b].peak() == direct.peak()
        assert derived[b].flops == direct.flops
        assert [a.nbytes for a in derived[b].allocs] == [a.nbytes for a in direct.allocs]


def test_batch_lists_and_ranges() -> None:
    import pytest

    from torchplace.errors import ConfigError
    from torchplace.planner.cli import parse_batches

    assert parse_batches("1-4,16") == [1, 2, 3, 4, 16]
    with pytest.raises(ConfigError, match="1-64"):
        parse_batches("a few")


def test_a_dataclass_output_is_the_models_output() -> None:
    from tests.planner.toy import DataclassOut

    model = DataclassOut().to("meta")
    trace = trace_forward(model, [torch.empty(B, 4, device="meta")], ["a", "b"], batch=B, seq=None)
    shapes = sorted(trace.allocs[i].shape for i in trace.outputs)
    assert shapes == [(B, 2), (B, 8)]


# a DeprecationWarning up to torch 2.13, a FutureWarning from 2.14 on
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_a_torchscript_model_is_planned_by_its_weights_and_verifies() -> None:
    p = toy_plan("make_scripted", strategy="pipeline")
    assert p.units.paths[:2] == ["0", "2"]  # in run order: ReLU (no weights) is never "called"
    assert p.flow.bytes_between_devices() == B * 16 * F32
    assert verify(p, devices=["cpu"]).ok


def test_a_model_that_cannot_run_on_meta_is_a_usage_error_and_a_placement_error() -> None:
    with pytest.raises(ConfigError, match="give a non-tensor argument") as info:
        plan("tests.planner.toy:make_needs_flag")
    assert isinstance(info.value, PlacementError)
