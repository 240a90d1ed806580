"""--verify: the planned placement run for real on logical CPU devices agrees with the plan."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.planner.conftest import NO_RESERVES
from tests.planner.toy import make_toy
from torchplace.errors import ConfigError
from torchplace.planner.api import plan
from torchplace.planner.verify import verify


def test_a_pipeline_of_the_toy_model_verifies_exactly() -> None:
    p = plan(
        "tests.planner.toy:make_toy",
        batch_sizes=[2],
        assume="2x1GiB",
        strategy="pipeline",
        reserves=NO_RESERVES,
    )
    verdict = verify(p, module=make_toy())
    assert verdict.ok
    assert all(m["error"] == 0 for m in verdict.memory)
    assert [(e["src"], e["dst"], e["consumer"]) for e in verdict.edges] == [
        ("cpu", "cuda:0", "inp"),
        ("cuda:0", "cuda:1", "blocks.1"),
        ("cuda:1", "cpu", "(host)"),
    ]
    inner = next(e for e in verdict.edges if e["src"] == "cuda:0")
    assert inner["measured_count"] == 2
    assert inner["measured_bytes"] == 2 * 2 * 8 * 4


def test_accelerate_hooks_verify_with_their_re_copies() -> None:
    p = plan(
        "gpt2-like",
        batch_sizes=[1],
        seq=16,
        assume="2xH200",
        strategy="accelerate",
        max_memory=[300 << 20, 600 << 20],
    )
    verdict = verify(p)
    assert verdict.ok, verdict.render()
    mask = [e for e in verdict.edges if e["src"] == "cuda:0" and e["dst"] == "cuda:1"]
    assert (
        sum(e["measured_count"] for e in mask) == 1 + 8
    )  # the hidden state once, the mask per block


def test_a_wrong_plan_fails_past_the_tolerance() -> None:
    p = plan("wide-mlp", batch_sizes=[2], strategy="pipeline")
    dev = next(iter(p.budgets))
    budget = p.budgets[dev]
    p.budgets[dev] = dataclasses.replace(budget, activation={2: budget.activation[2] * 2})
    verdict = verify(p, tolerance=0.1)
    assert not verdict.ok
    assert "PAST TOLERANCE" in verdict.render()


def test_too_big_to_verify_on_the_host_is_refused() -> None:
    p = plan("llama-7b-like", batch_sizes=[1], seq=8, assume="2xH200", strategy="pipeline")
    with pytest.raises(ConfigError, match="verify a smaller model"):
        verify(p)


def test_an_exported_program_is_planned_by_its_weights_and_verifies(tmp_path: Path) -> None:
    import torch

    from torchplace.models import build_model

    model = build_model("wide-mlp")
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(model, (torch.randn(2, 512),), dynamic_shapes=({0: batch},))
    path = tmp_path / "wide.pt2"
    torch.export.save(program, path)
    p = plan("seed-mlp", exported=path, batch_sizes=[2], strategy="pipeline")
    # a graph module reads its weights without calling its submodules: still one crossing
    inner = [c for c in p.flow.crossings if c.kind == "d2d"]
    assert [(c.consumer, c.nbytes) for c in inner] == [("2", 2 * 2048 * 4)]
    assert verify(p).ok


def test_a_model_placed_whole_as_one_root_unit_verifies_exactly() -> None:
    # accelerate puts wide-mlp whole on cuda:1 (cuda:0 holds 1 MiB): the one unit is the root
    # module, path "", which once read as the model's own code between units
    p = plan(
        "wide-mlp",
        batch_sizes=[1],
        assume="2xH200",
        strategy="accelerate",
        max_memory=[1 << 20, 1 << 30],
    )
    assert p.units.paths == [""]
    inner = [c.to_dict() for c in p.flow.crossings if c.kind == "d2d"]
    assert [(c["producer"], c["consumer"]) for c in inner] == [("input", "(model)")]
    verdict = verify(p)
    assert verdict.ok, verdict.render()
    assert [m["error"] for m in verdict.memory] == [0.0]
    assert ("cuda:0", "cuda:1", "(model)") in {
        (e["src"], e["dst"], e["consumer"]) for e in verdict.edges
    }
    assert all(e["consumer"] for e in verdict.edges)
