"""Units: every parameter and buffer of a model belongs to one, whatever the model's shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.planner.conftest import toy_plan, weights_and_buffers
from tests.planner.toy import WIDTH, RootTensors
from torchplace.errors import ConfigError
from torchplace.planner.api import plan
from torchplace.planner.units import select_units
from torchplace.planner.verify import verify

F32, LINEAR = 4, (WIDTH * WIDTH + WIDTH) * 4


def test_top_level_parameters_and_buffers_are_units_and_counted() -> None:
    units = select_units(RootTensors().to("meta"))
    assert units.paths == ["cls_token", "table", "first", "second"]
    assert {u.path: u.kind for u in units.units}["table"] == "Buffer"
    # a unit of buffers alone shows their dtype (was "-")
    assert {u.path: u.dtype for u in units.units}["table"] == "int8"
    p = toy_plan("make_root_tensors", strategy="pipeline")
    # the model is split (a top-level parameter no longer keeps it whole), and nothing is lost
    assert len(p.placement.used()) == 2
    assert weights_and_buffers(p) == WIDTH * F32 + 100 + 2 * LINEAR
    assert verify(p, devices=["cpu"]).ok


def test_a_module_registered_under_two_names_is_one_unit() -> None:
    p = toy_plan("make_aliased", strategy="pipeline")
    assert sorted(p.units.paths) == ["enc", "mid"]
    assert p.units.tied == ()
    assert weights_and_buffers(p) == 2 * LINEAR


def test_a_module_registered_in_two_containers_is_one_unit() -> None:
    # `layers.0` is `shared`: it was a second unit, placed on another device than itself
    p = plan("tests.planner.archs:make_shared_layer", assume="2x1GiB", strategy="pipeline")
    assert p.units.paths == ["shared", "head"]
    assert weights_and_buffers(p) == (16 * 16 + 16 + 16 * 2 + 2) * 4
    assert verify(p, devices=["cpu"]).ok


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
    p = toy_plan("make_root_tensors", map_file=path)
    assert p.budgets["cuda:1"].buffers == 100
    assert verify(p, devices=["cpu"]).ok


def test_a_hundred_billion_parameters_on_meta_are_planned_without_memory() -> None:
    p = toy_plan("make_huge", assume="4xH200", strategy="pipeline", batch_sizes=[1, 8])
    assert weights_and_buffers(p) == 100 * 10**9 * 2  # fp16, never allocated
    assert p.fits()
    assert [b.weights for b in p.budgets.values()] == [25 * 10**9 * 2] * 4
