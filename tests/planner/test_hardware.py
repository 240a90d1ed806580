"""Device sets: assumed from the table, or this machine's inventory through a probe."""

from __future__ import annotations

import pytest

from torchplace.devices import DeviceProperties, FakeProbe
from torchplace.errors import ConfigError
from torchplace.planner.api import plan
from torchplace.planner.hardware import (
    ASSUMED,
    LINKS,
    assume_devices,
    inventory_devices,
    parse_size,
)

GiB = 1 << 30
H200 = DeviceProperties("NVIDIA H200", 9, 0, 139 * GiB, 132, "GPU-aaaa1111-0000")
L4 = DeviceProperties("NVIDIA L4", 8, 9, 22 * GiB, 58, "GPU-bbbb2222-0000")


def _probe(*devices: DeviceProperties) -> FakeProbe:
    return FakeProbe(devices=list(devices), cuda_version="12.8", version="2.13.0+cu128")


def test_assumed_models_sizes_and_links() -> None:
    four = assume_devices("4xA100-80GB")
    assert [d.device for d in four] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert all(d.assumed and d.memory == ASSUMED["a100-80gb"].memory for d in four)
    assert four[0].link is LINKS["nvlink3"]
    sized = assume_devices("2x80GiB", link="pcie5")
    assert sized[0].memory == 80 * GiB
    assert sized[0].link.gbps == 52.0


@pytest.mark.parametrize("bad", ["H200", "0xH200", "2xB300", "2x80Gib?"])
def test_bad_assume_names_the_value_and_the_fix(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"e\.g\. 2xH200|choose one of"):
        assume_devices(bad)


def test_sizes() -> None:
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("1.5GB") == 1_500_000_000
    with pytest.raises(ConfigError, match="80GiB"):
        parse_size("lots")


def test_the_inventory_takes_each_visible_devices_own_memory() -> None:
    probe = _probe(H200, L4)
    devices = inventory_devices("all", probe=probe)
    assert [(d.device, d.memory, d.assumed) for d in devices] == [
        ("cuda:0", 139 * GiB, False),
        ("cuda:1", 22 * GiB, False),
    ]
    assert devices[0].tflops == ASSUMED["h200"].tflops  # rates from the table, by name
    assert [d.device for d in inventory_devices("cuda:1", probe=probe)] == ["cuda:1"]
    with pytest.raises(ConfigError, match="cuda:2"):
        inventory_devices("cuda:2", probe=probe)
    with pytest.raises(ConfigError, match="--assume"):
        inventory_devices("all", probe=FakeProbe())


def test_plan_on_this_machines_devices_says_so() -> None:
    p = plan("seed-mlp", devices="all", probe=_probe(H200, L4))
    assert [b.capacity for b in p.budgets.values()] == [139 * GiB, 22 * GiB]
    assert p.to_dict()["devices"][0]["assumed"] is False


def test_devices_named_twice_are_refused_not_planned_as_two() -> None:
    """'cuda:0,cuda:0' planned two devices both named cuda:0, with one budget between them."""
    probe = _probe(H200, L4)
    for twice in ("cuda:0,cuda:0", "cuda:0,0"):
        with pytest.raises(ConfigError, match="names cuda:0 more than once"):
            inventory_devices(twice, probe=probe)


def test_devices_list_with_an_empty_entry_or_loose_all() -> None:
    probe = _probe(H200, L4)
    for empty in (",", "cuda:0,", "cuda:0,,cuda:1"):
        with pytest.raises(ConfigError, match="has an empty entry"):
            inventory_devices(empty, probe=probe)
    assert [d.device for d in inventory_devices(" ALL ", probe=probe)] == ["cuda:0", "cuda:1"]
    assert [d.device for d in inventory_devices("1,0", probe=probe)] == ["cuda:1", "cuda:0"]
