"""The inventory: every visible accelerator, with the physical device behind each logical index."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

import torchplace
from torchplace.devices import (
    FakeProbe,
    device_inventory,
    visible_devices,
)

from .machines import CPU_ONLY, H200, L4, MIG, T4, GiB, gpus

# -- inventory --------------------------------------------------------------------------------


def test_inventory_remaps_logical_to_physical() -> None:
    probe = gpus(H200, L4, T4, env={"CUDA_VISIBLE_DEVICES": "2,0"}, free_memory={1: 100 * GiB})
    inv = device_inventory(probe=probe)
    assert [(d.device, d.index, d.physical_id, d.name) for d in inv] == [
        ("cuda:0", 0, "2", "Tesla T4"),
        ("cuda:1", 1, "0", "NVIDIA H200"),
    ]
    t4, h200 = inv
    assert t4.capability == (7, 5)
    assert t4.sm == "sm_75"
    assert t4.total_memory == t4.free_memory == 16 * GiB
    assert h200.free_memory == 100 * GiB
    assert h200.total_memory == 141 * GiB
    assert h200.multi_processor_count == 132
    assert h200.uuid == H200.uuid


def test_inventory_without_visibility_variable_is_identity() -> None:
    inv = device_inventory(probe=gpus(H200, L4))
    assert [(d.index, d.physical_id) for d in inv] == [(0, "0"), (1, "1")]


def test_inventory_with_uuid_and_mig_entries() -> None:
    probe = gpus(H200, T4, MIG, env={"CUDA_VISIBLE_DEVICES": "MIG-dddd4444,GPU-aaaa1111"})
    inv = device_inventory(probe=probe)
    assert [(d.device, d.physical_id, d.name) for d in inv] == [
        ("cuda:0", "MIG-dddd4444", MIG.name),
        ("cuda:1", "GPU-aaaa1111", H200.name),
    ]


def test_inventory_stops_at_unknown_physical_index() -> None:
    # "0,7" on a two-GPU machine: CUDA shows only GPU 0
    inv = device_inventory(probe=gpus(H200, L4, env={"CUDA_VISIBLE_DEVICES": "0,7,1"}))
    assert [d.physical_id for d in inv] == ["0"]


def test_inventory_is_empty_without_accelerators() -> None:
    assert device_inventory(probe=CPU_ONLY) == []
    assert device_inventory(probe=gpus(H200, env={"CUDA_VISIBLE_DEVICES": ""})) == []


def test_inventory_lists_mps() -> None:
    inv = device_inventory(probe=FakeProbe(backends={"mps": 1}))
    assert [(d.device, d.name, d.capability) for d in inv] == [("mps:0", "MPS", None)]


def test_device_info_is_frozen_and_serialisable() -> None:
    (info,) = device_inventory(probe=gpus(H200))
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.name = "x"  # type: ignore[misc]
    data = json.loads(json.dumps(info.to_dict()))
    assert data["capability"] == "9.0"
    assert data["sm"] == "sm_90"
    assert data["physical_id"] == "0"
    assert data["total_memory"] == 141 * GiB
    assert isinstance(info, torchplace.DeviceInfo)


@pytest.mark.cuda
def test_cuda_inventory_matches_torch() -> None:
    inv = device_inventory()
    assert len(inv) == torch.cuda.device_count()
    vis = visible_devices()
    for i, info in enumerate(inv):
        props = torch.cuda.get_device_properties(i)
        assert info.device == f"cuda:{i}"
        assert info.index == i
        assert info.name == props.name
        assert info.capability == torch.cuda.get_device_capability(i)
        assert info.total_memory == props.total_memory
        assert info.free_memory is not None
        assert 0 < info.free_memory <= props.total_memory
        assert info.physical_id == vis.physical_id(i)
        assert info.multi_processor_count == props.multi_processor_count
        if torch.version.hip is None:
            # CUDA builds alias gcnArchName to the name: it must not pass for an arch
            assert info.arch is None
            assert info.uuid is not None
            assert info.uuid.startswith(("GPU-", "MIG-"))
        if info.pci_bus_id is not None:
            assert re.fullmatch(r"[0-9a-f]{8}:[0-9a-f]{2}:[0-9a-f]{2}\.0", info.pci_bus_id)
