"""The doctor on ROCm: ``ROCR_VISIBLE_DEVICES`` applied before ``HIP_VISIBLE_DEVICES``, and the
report naming both."""

from __future__ import annotations

from typing import Any

from tests.doctor.machines import GiB, check, report_for
from torchplace.devices import DeviceProperties, FakeProbe

MI300X = [
    DeviceProperties(f"AMD Instinct MI300X #{i}", 9, 4, 192 * GiB, 304, f"GPU-{i}b2c1a9f8d3e6f7{i}")
    for i in range(4)
]


def rocm_report(spec: str, **env: str) -> dict[str, Any]:
    probe = FakeProbe(
        devices=MI300X,
        hip_version="6.2.41133",
        version="2.13.0+rocm6.2",
        arches=["gfx942"],
        env_vars=env,
    )
    return report_for(spec, probe)


def test_the_report_maps_through_rocr_then_hip() -> None:
    report = rocm_report("auto", ROCR_VISIBLE_DEVICES="2,3", HIP_VISIBLE_DEVICES="1")
    assert [(d["device"], d["physical_id"]) for d in report["devices"]] == [("cuda:0", "3")]
    assert report["cuda"]["visible_physical_ids"] == ["3"]
    assert report["environment"]["ROCR_VISIBLE_DEVICES"] == "2,3"
    detail = check(report, "visible-devices")["detail"]
    assert "ROCR_VISIBLE_DEVICES='2,3', then HIP_VISIBLE_DEVICES='1'" in detail
    assert "cuda:0 = physical 3" in detail


def test_rocr_alone_is_the_variable_reported() -> None:
    report = rocm_report("auto", ROCR_VISIBLE_DEVICES="1")
    assert report["cuda"]["visible_devices_variable"] == "ROCR_VISIBLE_DEVICES"
    assert report["cuda"]["visible_devices"] == "1"
    assert (
        "ROCR_VISIBLE_DEVICES='1': cuda:0 = physical 1"
        in check(report, "visible-devices")["detail"]
    )


def test_a_hip_index_beyond_rocr_fails_with_the_reason() -> None:
    report = rocm_report("cuda", ROCR_VISIBLE_DEVICES="2,3", HIP_VISIBLE_DEVICES="3")
    vis = check(report, "visible-devices")
    assert vis["status"] == "fail"
    assert "'3' is beyond the 2 GPU(s) ROCR_VISIBLE_DEVICES='2,3' leaves visible" in vis["detail"]
    assert not report["verdict"]["usable"]


def test_a_list_cut_short_by_a_hip_index_beyond_rocr_says_why_and_points_at_amd_smi() -> None:
    report = rocm_report("auto", ROCR_VISIBLE_DEVICES="2,3", HIP_VISIBLE_DEVICES="1,5,0")
    assert [d["physical_id"] for d in report["devices"]] == ["3"]
    found = [c for c in report["checks"] if "lists" in c["detail"] and "sees" in c["detail"]]
    assert found, report["checks"]
    detail, fix = found[0]["detail"], found[0].get("fix", "")
    assert "'5' is beyond the 2 GPU(s) ROCR_VISIBLE_DEVICES='2,3' leaves visible" in detail
    assert "not a GPU index or UUID" not in detail
    assert "'0' is never read" in detail
    assert "amd-smi list" in fix
    assert "nvidia-smi" not in fix
