"""Rendering a plan: the chart of a plan that places nothing on any device."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchplace.planner.api import plan
from torchplace.planner.render import plot_plan


def test_a_plan_that_places_nothing_still_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    p = plan("seed-mlp", assume="2x1MiB", strategy="accelerate")  # all of it on the host
    plot_plan(p, tmp_path / "plan.png")
    assert (tmp_path / "plan.png").stat().st_size > 0
