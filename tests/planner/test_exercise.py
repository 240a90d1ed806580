"""The exercise-8 table: a replica's state is its weights and its buffers."""

from __future__ import annotations

from tests.planner.conftest import toy_plan
from torchplace.planner.api import plan
from torchplace.planner.exercise import exercise_rows
from torchplace.planner.render import render_text


def test_a_model_of_buffers_alone_shows_them_as_its_replica() -> None:
    p = toy_plan("make_buffers_only", strategy="replicate")
    _, rows = exercise_rows(p)
    assert dict(rows)["model replica"] == ["full copy, 64 B", "full copy, 64 B"]
    assert p.fits()


def test_a_scalar_output_is_named_as_one() -> None:
    # a 0-dim output (a model returning its loss) was an empty shape: "1x2 float32;  float32"
    p = plan("tests.planner.archs:make_scalar_out", assume="2x1GiB", strategy="pipeline")
    _, rows = exercise_rows(p)
    assert dict(rows)["final outputs"] == ["1x2 float32 to host; scalar float32 to host", "-"]
    assert "| scalar | float32 |" in render_text(p)
