"""How the planner calls a model: declared inputs in order, keyword-only ones by name."""

from __future__ import annotations

import torch

from tests.planner.conftest import toy_plan
from tests.planner.toy import KeywordOnly
from torchplace.planner.inputs import call_arguments
from torchplace.planner.verify import verify


def test_an_input_taken_by_keyword_only_is_passed_by_its_name() -> None:
    x, mask = torch.zeros(2, 8), torch.ones(2, 8)
    args, kwargs = call_arguments(KeywordOnly(), [x, mask], ["x", "mask"])
    assert args == [x]
    assert kwargs == {"mask": mask}


def test_a_keyword_only_model_is_planned_and_verifies() -> None:
    p = toy_plan("make_keyword_only", strategy="pipeline")
    assert p.traces[2].flops == {"a": 2 * 2 * 8 * 8}
    assert verify(p, devices=["cpu"]).ok
