"""Units: every parameter and buffer of a model belongs to one, whatever the model's shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.planner.conftest import NO_RESERVES
from tests.planner.toy import WIDTH, RootTensors
from torchplace.errors import ConfigError
from torchplace.planner.api import plan
from torchplace.planner.units import select_units
from torchplace.planner.verify import verify

F32, LINEAR = 4, (WIDTH * WIDTH + WIDTH) * 4


def _total(p: object) -> int:
    budgets = p.budgets.values()  # type: ignore[attr-defined]
    return sum(b.weights + b.buffers for b in budgets)


def test_top_level_parameters_and_buffers_are_units_and_counted() -> None:
    units = select_units(RootTensors().to("meta"))
    assert units.paths == ["cls_token", "table", "first", "second"]
    assert {u.path: u.kind for u in units.units}["table"] == "Buffer"
    p = plan(
        "tests.planner.toy:make_root_tensors",
        batch_sizes=[2],
        assume="2x1GiB",
        strategy="pipeline",
        reserves=NO_RESERVES,
    )
    # the model is split (a top-level parameter no longer keeps it whole), and nothing is lost
    assert len(p.placement.used()) == 2
    assert _total(p) == WIDTH * F32 + 100 + 2 * LINEAR
    assert verify(p, devices=["cpu"]).ok


def test_a_module_registered_under_two_names_is_one_unit() -> None:
    p = plan(
        "tests.planner.toy:make_aliased",
        batch_sizes=[2],
        assume="2x1GiB",
        strategy="pipeline",
        reserves=NO_RESERVES,
    )
    assert sorted(p.units.paths) == ["enc", "mid"]
    assert p.units.tied == ()
    assert _total(p) == 2 * LINEAR


@pytest.mark.parametrize(
    ("device_map", "message"),
    [
        ({"first": 0, "nothere": 1}, "names 'nothere', which is neither a module"),
        ({"first": 0, "second": 1}, "places no device for cls_token, table"),
        ({"": 0, "first": 1}, "places '' and also 'first' inside it"),
    ],
)
def test_a_device_map_must_name_the_models_modules_once_and_all_of_them(
    tmp_path: Path, device_map: dict[str, int], message: str
) -> None:
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"device_map": device_map}))
    with pytest.raises(ConfigError, match=message):
        plan("tests.planner.toy:make_root_tensors", assume="2x1GiB", map_file=path)


def test_a_device_map_may_place_a_top_level_parameter(tmp_path: Path) -> None:
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"cls_token": 0, "table": 1, "first": 0, "second": 1}))
    p = plan(
        "tests.planner.toy:make_root_tensors",
        batch_sizes=[2],
        assume="2x1GiB",
        map_file=path,
        reserves=NO_RESERVES,
    )
    assert p.budgets["cuda:1"].buffers == 100
    assert verify(p, devices=["cpu"]).ok
