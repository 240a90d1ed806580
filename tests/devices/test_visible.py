"""``CUDA_VISIBLE_DEVICES`` (and ``HIP_VISIBLE_DEVICES``) read the way the runtime reads them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torchplace.devices import (
    FakeProbe,
    device_inventory,
    parse_visible_devices,
    visible_devices,
)

from .machines import H200, L4, gpus

# -- CUDA_VISIBLE_DEVICES ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", []),
        ("-1", []),
        ("0", ["0"]),
        ("2,0", ["2", "0"]),
        (" 1 , 3 ", ["1", "3"]),
        ("0,-1,2", ["0"]),  # CUDA stops at the first invalid entry
        ("1gpu,2", ["1", "2"]),  # strtoul-like
        ("0,0", []),  # a repeated entry hides everything
        ("abc", []),
        ("GPU-aaaa,GPU-bbbb", ["GPU-aaaa", "GPU-bbbb"]),
        ("MIG-dddd4444-0000", ["MIG-dddd4444-0000"]),
        ("MIG-GPU-aaaa/1/0", ["MIG-GPU-aaaa/1/0"]),
    ],
)
def test_parse_visible_devices(value: str | None, expected: list[str] | None) -> None:
    assert parse_visible_devices(value) == expected


@given(st.lists(st.integers(min_value=0, max_value=63), unique=True, max_size=8))
def test_parse_visible_devices_roundtrips_distinct_ordinals(ordinals: list[int]) -> None:
    value = ",".join(str(i) for i in ordinals)
    assert parse_visible_devices(value) == [str(i) for i in ordinals]


def test_visible_devices_describes_the_variable() -> None:
    vis = visible_devices(probe=gpus(H200, env={"CUDA_VISIBLE_DEVICES": "-1"}))
    assert vis.hides_all
    assert vis.describe() == "CUDA_VISIBLE_DEVICES='-1'"
    unset = visible_devices(probe=gpus(H200))
    assert not unset.hides_all
    assert unset.physical_id(3) == "3"
    assert unset.describe() == "CUDA_VISIBLE_DEVICES unset"


def test_rocm_build_reads_hip_visible_devices() -> None:
    probe = FakeProbe(devices=[H200, L4], hip_version="6.2", env_vars={"HIP_VISIBLE_DEVICES": "1"})
    assert visible_devices(probe=probe).variable == "HIP_VISIBLE_DEVICES"
    assert [d.name for d in device_inventory(probe=probe)] == ["NVIDIA L4"]


@pytest.mark.parametrize(("value", "parsed"), [("٣", []), ("0,٣", ["0"]), ("１,0", [])])
def test_only_ascii_digits_are_indices_as_strtoul_reads_them(value: str, parsed: list[str]) -> None:
    assert parse_visible_devices(value) == parsed
