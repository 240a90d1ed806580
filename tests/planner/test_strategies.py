"""Strategies: parity with accelerate, tied weights, a model too big for one device."""

from __future__ import annotations

import math

import pytest

from tests.planner.conftest import NO_RESERVES, toy_plan, weights_and_buffers
from torchplace.planner.api import plan
from torchplace.planner.shapes import build_shape
from torchplace.planner.strategies import _best_cut, accelerate_placement, fill
from torchplace.planner.units import select_units

MiB = 1 << 20
DEVICES = ["cuda:0", "cuda:1"]


@pytest.mark.parametrize(
    ("model", "budget"),
    [
        ("gpt2-like", (300 * MiB, 600 * MiB)),
        ("gpt2-like", (200 * MiB, 400 * MiB)),
        ("gpt2-like", (400 * MiB, 400 * MiB)),
        ("gpt2-like", (250 * MiB, 150 * MiB)),  # too small: the rest spills to the host
    ],
)
def test_fill_gives_accelerates_map_for_the_same_max_memory(
    model: str, budget: tuple[int, int]
) -> None:
    module = build_shape(model)
    units = select_units(module)
    ours = fill(units, DEVICES, list(budget))
    theirs, _keys = accelerate_placement(module, units, DEVICES, list(budget))
    for unit in units.paths:  # accelerate may name a whole container ('h') where we name h.N
        owner = next(k for k in theirs.assign if unit == k or unit.startswith(k + "."))
        assert ours.assign[unit] == theirs.assign[owner], unit


def test_wide_mlp_fill_matches_accelerate() -> None:
    from torchplace.models import build_model

    module = build_model("wide-mlp").to("meta")
    units = select_units(module)
    for budget in ([5 * MiB, 30 * MiB], [21 * MiB, 30 * MiB], [30 * MiB, 30 * MiB]):
        ours = fill(units, DEVICES, budget)
        theirs, _ = accelerate_placement(module, units, DEVICES, budget)
        flat = {
            u: next(d for k, d in theirs.assign.items() if u == k or k == "") for u in units.paths
        }
        assert ours.assign == flat, budget


def test_tied_weights_are_one_group_counted_on_each_device_holding_them() -> None:
    p = toy_plan("make_tied", seq=3, strategy="pipeline")
    assert p.units.tied == (("emb.weight", "head.weight"),) or p.units.tied == (
        ("head.weight", "emb.weight"),
    )
    where = {u: p.placement.device_of(u) for u in ("emb", "mid", "head")}
    assert where == {"emb": "cuda:0", "mid": "cuda:0", "head": "cuda:1"}
    shared = 10 * 8 * 4
    assert p.budgets["cuda:0"].weights == shared + 8 * 8 * 4 + 8 * 4  # with mid
    assert p.budgets["cuda:1"].weights == shared  # the head's copy
    assert [w.code for w in p.warnings] == ["tied-split"]


def test_fill_keeps_tied_units_together() -> None:
    p = toy_plan("make_tied", seq=3, strategy="pipeline", balance="fill", max_memory=[400, 10_000])
    assert p.placement.device_of("emb") == p.placement.device_of("head")
    assert "tied-split" not in [w.code for w in p.warnings]


def test_a_model_too_big_for_one_device_is_pipelined_over_three() -> None:
    # wide-mlp: 4.0 + 16.0 + 4.0 MiB of weights; no device of 18 MiB holds all 24.
    p = plan("wide-mlp", batch_sizes=[1], assume="3x18MiB", reserves=NO_RESERVES)
    assert p.considered["replicate"]["fits"] is False
    assert p.placement.strategy.startswith("pipeline")
    assert p.fits()
    assert len({p.placement.device_of(u) for u in ("0", "2", "4")}) == 3


def test_a_unit_bigger_than_its_device_is_named() -> None:
    p = plan(
        "wide-mlp", batch_sizes=[1], assume="2x12MiB", strategy="pipeline", reserves=NO_RESERVES
    )
    codes = [w.code for w in p.warnings]
    assert "leaf-too-big" in codes
    assert "does-not-fit" in codes
    assert not p.fits()
    assert any("unit 2 " in w.message for w in p.warnings if w.code == "leaf-too-big")


def test_accelerate_spill_to_the_host_is_warned() -> None:
    p = plan(
        "wide-mlp",
        batch_sizes=[1],
        assume="2x1GiB",
        strategy="accelerate",
        max_memory=[5 * MiB, 5 * MiB],
        reserves=NO_RESERVES,
    )
    assert "cpu" in p.placement.assign.values()
    assert "cpu-spill" in [w.code for w in p.warnings]


def test_replicate_keeps_a_full_copy_per_device_and_copies_nothing_between_them() -> None:
    p = plan("seed-mlp", batch_sizes=[4], assume="2xH200", strategy="replicate")
    assert p.flow.bytes_between_devices() == 0
    assert {c.kind for c in p.flow.crossings} == {"h2d", "d2h"}
    weights = (8 * 16 + 16 + 16 * 2 + 2) * 4
    assert [b.weights for b in p.budgets.values()] == [weights, weights]


def test_accelerate_places_a_model_with_top_level_parameters() -> None:
    p = toy_plan("make_root_tensors", strategy="accelerate", max_memory=[400, 10_000])
    assert "cls_token" in p.placement.assign
    assert weights_and_buffers(p) == 8 * 4 + 100 + 2 * (8 * 8 + 8) * 4


def test_accelerates_own_failure_is_a_config_error_naming_the_way_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import accelerate.utils

    from torchplace.errors import ConfigError

    def broken(*_args: object, **_kwargs: object) -> None:
        # as accelerate 1.x does on ties of a module registered twice (tests.planner.toy.Aliased)
        raise IndexError("list index out of range")

    monkeypatch.setattr(accelerate.utils, "infer_auto_device_map", broken)
    with pytest.raises(ConfigError, match=r"IndexError.*--strategy pipeline --balance fill"):
        plan("tests.planner.toy:make_aliased", assume="2x1GiB", strategy="accelerate")


def test_the_stage_cut_is_the_exhaustive_searchs() -> None:
    costs = [0.0, 3.0, 0.0, 0.0, 1.0, 2.0, 0.0, 5.0, 1.0]
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    before = [0.0] + [math.inf] * len(costs)
    for share in (1.0, 0.5, 2.0):
        after = []
        for i in range(len(prefix)):
            worst = [max(before[j], (prefix[i] - prefix[j]) / share) for j in range(i + 1)]
            last = len(worst) - 1 - worst[::-1].index(min(worst))  # ties: the devices before
            expected = (min(worst), last)
            assert _best_cut(before, prefix, i, share) == expected
            after.append(expected[0])
        before = after


def test_a_model_of_one_unit_starts_on_the_first_device() -> None:
    # a wrapper whose only child is the whole model: one unit, which went to the last device
    p = toy_plan("make_wrapped", strategy="pipeline")
    assert p.placement.assign == {"inner": "cuda:0"}
    assert p.flow.bytes_between_devices() == 0


def test_a_tie_leaves_the_later_devices_empty() -> None:
    # four devices for two units: the best worst stage is one unit's whatever the split, so
    # the stages are the first two devices, not the last two
    p = toy_plan("make_two_linear", assume="4x1GiB", strategy="pipeline")
    assert p.placement.assign == {"a": "cuda:0", "b": "cuda:1"}


def test_a_thousand_layers_are_pipelined_in_contiguous_stages() -> None:
    p = toy_plan("make_deep", assume="4x1GiB", strategy="pipeline", batch_sizes=[1, 8])
    devices = [p.placement.device_of(str(i)) for i in range(1000)]
    assert devices == sorted(devices)  # contiguous, in order
    assert [devices.count(d) for d in p.placement.devices] == [250] * 4
    assert p.flow.bytes_between_devices() == 3 * 8 * 16 * 4
