"""The exercise-8 table: a replica's state is its weights and its buffers."""

from __future__ import annotations

from tests.planner.conftest import toy_plan
from torchplace.planner.exercise import exercise_rows


def test_a_model_of_buffers_alone_shows_them_as_its_replica() -> None:
    p = toy_plan("make_buffers_only", strategy="replicate")
    _, rows = exercise_rows(p)
    assert dict(rows)["model replica"] == ["full copy, 64 B", "full copy, 64 B"]
    assert p.fits()
