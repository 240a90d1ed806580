"""The verdict: usable or not, every cause once, each fix once."""

from __future__ import annotations

import pytest

import torchplace.doctor.smoke as smoke
from tests.doctor.machines import H200, check, machine, report_for
from torchplace.devices import DriverInfo, FakeProbe
from torchplace.doctor import collect


def test_cpu_only_build_asked_for_cuda() -> None:
    report = report_for("cuda:0", FakeProbe())
    verdict = report["verdict"]
    assert not verdict["usable"]
    assert verdict["status"] == "fail"
    assert verdict["device"] is None
    assert "CPU-only build" in verdict["summary"]
    assert any("pip install torch" in fix for fix in verdict["fixes"])


def test_every_cause_is_named_once_with_each_fix_once() -> None:
    # no driver AND every GPU hidden: the one-line summary names both, and no fix repeats
    probe = machine(
        env={"CUDA_VISIBLE_DEVICES": ""},
        driver=DriverInfo(True, error="NVML Shared Library Not Found"),
    )
    verdict = report_for("cuda", probe)["verdict"]
    assert not verdict["usable"]
    summary = verdict["summary"]
    assert "NVML Shared Library Not Found" in summary
    assert summary.count("CUDA_VISIBLE_DEVICES=''") == 1
    assert len(verdict["fixes"]) == len(set(verdict["fixes"])) >= 2


def test_out_of_range_device() -> None:
    report = report_for("cuda:4", machine(H200))
    assert not report["verdict"]["usable"]
    assert "1 CUDA device(s) visible" in report["verdict"]["summary"]


def test_smoke_failure_makes_the_device_unusable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smoke, "_MATMUL_TOL", 0.0)
    report = collect("cpu", probe=FakeProbe(), toolkit=lambda: None)
    assert report["smoke"]["ran"]
    assert not report["verdict"]["usable"]
    assert check(report, "matmul")["status"] == "fail"
