"""Warnings: one leaf-too-big warning, however many units are bigger than their device."""

from __future__ import annotations

from pathlib import Path

from tests.planner.conftest import NO_RESERVES, toy_plan
from torchplace.planner.api import plan


def test_units_bigger_than_their_device_are_one_warning() -> None:
    # three 64 KiB Linears over two 32 KiB devices: each is too big for either
    p = toy_plan("make_wide_stack", assume="2x32KiB", strategy="pipeline")
    (big,) = [w for w in p.warnings if w.code == "leaf-too-big"]
    assert big.message.startswith("unit 0 holds 64.00 KiB of weights, more than cuda:0 has")
    assert "and 2 more unit(s) are bigger than their device (1, 2)" in big.message
    assert "add devices with more memory or lower the dtype" in big.message


def test_one_unit_too_big_is_named_alone() -> None:
    p = plan("wide-mlp", assume="2x12MiB", strategy="pipeline", reserves=NO_RESERVES)
    (big,) = [w for w in p.warnings if w.code == "leaf-too-big"]
    assert big.message.startswith("unit 2 holds 16.01 MiB of weights, more than cuda:1 has")
    assert "more unit(s)" not in big.message
    assert "it cannot be placed whole" in big.message


def test_a_plan_that_places_nothing_on_a_device_does_not_fit() -> None:
    # 1 MiB devices hold no CUDA context: accelerate leaves the whole model on the host
    p = plan("seed-mlp", batch_sizes=[1, 3], assume="2x1MiB", strategy="accelerate")
    (spill,) = [w for w in p.warnings if w.code == "cpu-spill"]
    assert spill.message.startswith("every unit is left on the host (")
    assert not p.budgets
    assert not p.fits()
    assert p.largest_batch() == 0


def test_a_map_that_puts_units_on_the_host_says_so_not_that_devices_are_full(
    tmp_path: Path,
) -> None:
    everything = tmp_path / "host.json"
    everything.write_text('{"": "cpu"}')
    p = plan("seed-mlp", assume="2xH200", map_file=everything)
    (spill,) = [w for w in p.warnings if w.code == "cpu-spill"]
    assert spill.message.startswith("the map puts every unit on the host (")
    assert "max_memory" not in spill.message
    assert "map them to the plan's devices (cuda:0, cuda:1" in spill.message
    first = tmp_path / "first.json"
    first.write_text('{"0": "cpu", "2": 1}')
    p = plan("seed-mlp", assume="2xH200", map_file=first)
    (spill,) = [w for w in p.warnings if w.code == "cpu-spill"]
    assert spill.message.startswith("the map puts 1 unit(s) on the host (0)")
    assert "max_memory" not in spill.message
