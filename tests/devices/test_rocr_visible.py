"""ROCm: ``ROCR_VISIBLE_DEVICES`` first, then ``HIP_VISIBLE_DEVICES`` (or ``CUDA_VISIBLE_DEVICES``)
indexing into the GPUs it left visible, as the ROCr and HIP runtimes read them."""

from __future__ import annotations

import pytest

from torchplace.devices import (
    device_inventory,
    resolve_device,
    visible_devices,
)
from torchplace.errors import DeviceUnavailableError

from .machines import H200, gpus, rocm


def test_hip_visible_devices_indexes_into_what_rocr_leaves() -> None:
    probe = rocm(ROCR_VISIBLE_DEVICES="2,3", HIP_VISIBLE_DEVICES="1")
    vis = visible_devices(probe=probe)
    assert vis.physical_ids == ("3",)
    assert vis.variable == "HIP_VISIBLE_DEVICES"
    assert vis.applied == ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
    assert vis.describe() == "ROCR_VISIBLE_DEVICES='2,3', then HIP_VISIBLE_DEVICES='1'"
    inv = device_inventory(probe=probe)
    assert [(d.device, d.physical_id, d.name) for d in inv] == [
        ("cuda:0", "3", "AMD Instinct MI300X #3")
    ]


def test_cuda_visible_devices_on_rocm_indexes_into_what_rocr_leaves() -> None:
    probe = rocm(ROCR_VISIBLE_DEVICES="3,1,2", CUDA_VISIBLE_DEVICES="2,0")
    vis = visible_devices(probe=probe)
    assert vis.physical_ids == ("2", "3")
    assert vis.applied == ("ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
    assert [d.name for d in device_inventory(probe=probe)] == [
        "AMD Instinct MI300X #2",
        "AMD Instinct MI300X #3",
    ]


def test_rocr_visible_devices_alone_picks_and_orders_physical_gpus() -> None:
    probe = rocm(ROCR_VISIBLE_DEVICES="3,1")
    vis = visible_devices(probe=probe)
    assert (vis.variable, vis.value, vis.physical_ids) == (
        "ROCR_VISIBLE_DEVICES",
        "3,1",
        ("3", "1"),
    )
    assert vis.applied == ("ROCR_VISIBLE_DEVICES",)
    assert vis.describe() == "ROCR_VISIBLE_DEVICES='3,1'"
    assert [(d.physical_id, d.name) for d in device_inventory(probe=probe)] == [
        ("3", "AMD Instinct MI300X #3"),
        ("1", "AMD Instinct MI300X #1"),
    ]


def test_a_cuda_build_does_not_read_rocr_visible_devices() -> None:
    vis = visible_devices(probe=gpus(H200, env={"ROCR_VISIBLE_DEVICES": "-1"}))
    assert (vis.variable, vis.physical_ids, vis.applied) == ("CUDA_VISIBLE_DEVICES", None, ())
    assert not vis.hides_all


@pytest.mark.parametrize(
    ("value", "ids"),
    [
        ("", ()),  # set but empty: no GPU at all
        ("-1", ()),
        ("1,0", ("1", "0")),
        (" 2 , 1 ", ("2", "1")),
        ("0,0,1", ("0",)),  # a repeated GPU ends the list (it does not hide everything)
        ("1,,0", ("1",)),
        ("1gpu,0", ()),  # the whole entry must be a number (strtol, base 0)
        ("0x2", ("2",)),
        ("010", ("8",)),  # octal, as strtol reads base 0
        ("08", ()),
        ("+1", ("1",)),
        ("gpu-3b2c1a9f", ("GPU-3B2C1A9F",)),  # a UUID prefix, read in upper case
        ("GPU-", ()),  # too short to be a UUID
        ("GPU-3b2c1a9f8d3e6f733", ()),  # too long to be a UUID
        ("all", ()),
    ],
)
def test_rocr_visible_devices_is_read_as_rocr_reads_it(value: str, ids: tuple[str, ...]) -> None:
    assert visible_devices(probe=rocm(ROCR_VISIBLE_DEVICES=value)).physical_ids == ids


def test_fake_probe_follows_rocr_by_uuid_and_stops_at_a_repeat() -> None:
    probe = rocm(ROCR_VISIBLE_DEVICES="gpu-2B2C1A9F,1,GPU-2b2c,0")
    assert [d.name for d in device_inventory(probe=probe)] == [
        "AMD Instinct MI300X #2",
        "AMD Instinct MI300X #1",
    ]


def test_a_hip_index_beyond_what_rocr_leaves_hides_every_gpu() -> None:
    probe = rocm(ROCR_VISIBLE_DEVICES="2,3", HIP_VISIBLE_DEVICES="2")
    vis = visible_devices(probe=probe)
    assert vis.hides_all
    assert probe.device_count() == 0
    why = vis.why_hidden() or ""
    assert "'2' is beyond the 2 GPU(s) ROCR_VISIBLE_DEVICES='2,3' leaves visible" in why
    assert "HIP_VISIBLE_DEVICES counts those from 0" in why
    with pytest.raises(DeviceUnavailableError) as info:
        resolve_device("cuda", probe=probe)
    msg = str(info.value)
    assert "ROCR_VISIBLE_DEVICES='2,3', then HIP_VISIBLE_DEVICES='2'" in msg
    assert "beyond" in msg


def test_a_hip_index_beyond_what_rocr_leaves_ends_the_list() -> None:
    probe = rocm(ROCR_VISIBLE_DEVICES="2,3", HIP_VISIBLE_DEVICES="1,5,0")
    vis = visible_devices(probe=probe)
    assert vis.physical_ids == ("3",)
    assert probe.device_count() == 1
    assert (vis.stopped_at, vis.ignored) == ("5", ("5", "0"))
    assert "'5' is beyond the 2 GPU(s) ROCR_VISIBLE_DEVICES='2,3' leaves visible" in (
        vis.why_stopped() or ""
    )
    assert len(vis.notes()) == 1
    assert vis.notes()[0].startswith("HIP_VISIBLE_DEVICES='1,5,0': ")


def test_rocr_hiding_every_gpu_is_the_variable_to_fix() -> None:
    probe = rocm(ROCR_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="0")
    vis = visible_devices(probe=probe)
    assert vis.hides_all
    assert vis.variable == "ROCR_VISIBLE_DEVICES"
    assert vis.why_hidden() == "it is empty"
    with pytest.raises(DeviceUnavailableError, match="unset ROCR_VISIBLE_DEVICES"):
        resolve_device("cuda", probe=probe)


def test_rocr_read_in_part_is_a_note_with_its_reason() -> None:
    vis = visible_devices(probe=rocm(ROCR_VISIBLE_DEVICES="2,2,3", HIP_VISIBLE_DEVICES="0"))
    assert vis.physical_ids == ("2",)
    assert vis.notes() == (
        "ROCR_VISIBLE_DEVICES='2,2,3': '2' names a GPU already listed, which ROCr reads as the "
        "end of the list ('3' is never read)",
    )
    assert vis.rocr is not None
    assert vis.rocr.why_stopped() is not None


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("-1", "'-1' ends the list"),
        ("0,,1", "an empty entry ends the list"),
        ("0,x,1", "'x' is not a GPU index or UUID, and it ends the list"),
    ],
)
def test_why_stopped_on_cuda(value: str, why: str) -> None:
    vis = visible_devices(probe=gpus(H200, env={"CUDA_VISIBLE_DEVICES": value}))
    assert (vis.why_stopped() or "").startswith(why)
    assert visible_devices(probe=gpus(H200)).why_stopped() is None
