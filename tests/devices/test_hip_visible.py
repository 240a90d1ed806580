"""ROCm: ``HIP_VISIBLE_DEVICES`` (or ``CUDA_VISIBLE_DEVICES``) read by HIP's rules, which are not
CUDA's (clr ``rocclr/device/rocm/rocdevice.cpp``, ``Device::init``; ``rocclr/utils/flags.cpp``)."""

from __future__ import annotations

import pytest

from torchplace.devices import FakeProbe, device_inventory, visible_devices
from torchplace.devices.visible import parse_hip_visible_devices

from .machines import H200, L4, T4, gpus, rocm


def names(probe: FakeProbe) -> list[str]:
    return [d.name[-2:] for d in device_inventory(probe=probe)]


@pytest.mark.parametrize(
    ("value", "ids"),
    [
        ("1,0", ["1", "0"]),
        ("1,1,0", ["1", "0"]),  # a repeated entry is skipped, the rest still read
        ("0,1,0,2", ["0", "1", "2"]),
        ("1gpu", []),  # the whole entry must be the index: HIP compares it with to_string(atoi)
        ("1,1gpu,0", ["1"]),
        ("01", []),
        ("+1", []),
        (" 1", []),  # HIP does not trim: ' 1' is not '1'
        ("1, 0", ["1"]),
        ("-1", []),
        ("0,,1", ["0"]),
        ("0,", ["0"]),  # a trailing comma ends the list with nothing lost
        ("", []),  # HIP reads an empty value as ' ': no GPU
        ("GPU-3b2c", ["GPU-3b2c"]),  # a UUID (or part of one), matched against the GPUs
        ("MIG-dddd4444", []),  # no MIG on AMD: not an index, not a GPU- UUID
    ],
)
def test_parse_hip_visible_devices_reads_as_hip_does(value: str, ids: list[str]) -> None:
    assert parse_hip_visible_devices(value) == ids
    assert parse_hip_visible_devices(None) is None


def test_hip_skips_a_repeated_gpu_where_cuda_hides_them_all() -> None:
    probe = rocm(HIP_VISIBLE_DEVICES="2,2,0")
    vis = visible_devices(probe=probe)
    assert vis.physical_ids == ("2", "0")
    assert not vis.hides_all
    assert names(probe) == ["#2", "#0"]
    # the same value on a CUDA build hides every GPU
    cuda = visible_devices(probe=gpus(H200, L4, T4, env={"CUDA_VISIBLE_DEVICES": "2,2,0"}))
    assert cuda.hides_all


def test_cuda_visible_devices_on_rocm_is_read_by_hips_rules() -> None:
    probe = rocm(CUDA_VISIBLE_DEVICES="1,1,3")
    assert visible_devices(probe=probe).physical_ids == ("1", "3")
    assert names(probe) == ["#1", "#3"]


def test_hip_refuses_1gpu_where_cuda_reads_1() -> None:
    probe = rocm(HIP_VISIBLE_DEVICES="1gpu")
    vis = visible_devices(probe=probe)
    assert vis.hides_all
    assert probe.device_count() == 0
    why = vis.why_hidden() or ""
    assert "'1gpu' is not a GPU index or UUID" in why
    assert "twice" not in why
    assert visible_devices(
        probe=gpus(H200, L4, env={"CUDA_VISIBLE_DEVICES": "1gpu"})
    ).physical_ids == ("1",)


def test_a_hip_entry_it_cannot_read_ends_the_list_and_says_why() -> None:
    probe = rocm(HIP_VISIBLE_DEVICES="2,01,0")
    vis = visible_devices(probe=probe)
    assert vis.physical_ids == ("2",)
    assert names(probe) == ["#2"]
    assert (vis.stopped_at, vis.ignored) == ("01", ("01", "0"))
    why = vis.why_stopped() or ""
    assert why.startswith("'01' is not a GPU index or UUID as HIP reads them")
    assert "('0' is never read)" in why


def test_a_hip_repeat_behind_an_unreadable_first_entry_is_not_the_reason() -> None:
    vis = visible_devices(probe=rocm(HIP_VISIBLE_DEVICES="1gpu,1,1"))
    assert vis.hides_all
    assert "twice" not in (vis.why_hidden() or "")


def test_hip_matches_a_uuid_against_the_gpus_and_skips_one_named_twice() -> None:
    probe = rocm(HIP_VISIBLE_DEVICES="GPU-3b2c,1,3")
    assert names(probe) == ["#3", "#1"]


def test_hip_uuid_of_a_gpu_rocr_hid_ends_the_list() -> None:
    probe = rocm(ROCR_VISIBLE_DEVICES="0,1", HIP_VISIBLE_DEVICES="1,GPU-3b2c,0")
    assert names(probe) == ["#1"]


def test_hip_indexes_into_rocr_and_skips_a_repeat_there_too() -> None:
    probe = rocm(ROCR_VISIBLE_DEVICES="3,2", HIP_VISIBLE_DEVICES="1,1,0")
    vis = visible_devices(probe=probe)
    assert vis.physical_ids == ("2", "3")
    assert names(probe) == ["#2", "#3"]


# HIP maps an empty variable to ' ' (clr flags.cpp, since SWDEV-363536, 2022: "HIP_VISIBLE_DEVICES=
# should disable the device ... This matches the CUDA behavior"), so set-but-empty hides every GPU
# and does not fall back to CUDA_VISIBLE_DEVICES.
@pytest.mark.parametrize(
    "env",
    [
        {"HIP_VISIBLE_DEVICES": ""},
        {"HIP_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": "0"},
        {"HIP_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": ""},
        {"CUDA_VISIBLE_DEVICES": ""},
    ],
)
def test_an_empty_hip_variable_hides_every_gpu(env: dict[str, str]) -> None:
    probe = rocm(**env)
    vis = visible_devices(probe=probe)
    assert vis.hides_all
    assert vis.why_hidden() == "it is empty"
    assert probe.device_count() == 0


def test_unset_hip_variables_show_every_gpu() -> None:
    probe = rocm()
    assert visible_devices(probe=probe).physical_ids is None
    assert probe.device_count() == 4
