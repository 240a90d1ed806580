"""The whole report: everything collect_env says about devices, and warnings turned into checks."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from tests.doctor.machines import CU128_ARCHES, H200, K80, GiB, check, machine, report_for
from torchplace.devices import FakeProbe
from torchplace.doctor import collect


def test_reports_everything_collect_env_reports_about_devices() -> None:
    from torch.utils import collect_env

    not_devices = {
        "gcc_version",
        "clang_version",
        "cmake_version",
        "os",
        "libc_version",
        "python_version",
        "python_platform",
        "pip_version",
        "pip_packages",
        "conda_packages",
        "cpu_info",
    }
    device_fields = set(collect_env.SystemEnv._fields) - not_devices
    report = collect("auto", smoke=False)
    assert device_fields <= set(report["collect_env"])
    ours = report["collect_env"]
    assert ours["torch_version"] == torch.__version__
    assert ours["is_cuda_available"] == torch.cuda.is_available()
    assert ours["cuda_compiled_version"] == torch.version.cuda
    assert ours["is_debug_build"] == torch.version.debug
    # and more than collect_env: the mapping, the arch list and a verdict
    assert {"verdict", "checks", "devices", "cuda", "build"} <= set(report)
    assert "arch_list" in report["build"]


class WarningProbe(FakeProbe):
    def cuda_available(self) -> bool:
        warnings.warn(
            "CUDA initialization: The NVIDIA driver on your system is too old", stacklevel=1
        )
        return super().cuda_available()


def test_torch_warnings_become_checks() -> None:
    probe = WarningProbe(devices=[H200], cuda_version="12.8", arches=CU128_ARCHES)
    report = report_for("auto", probe)
    warned = check(report, "warning")  # reported once, though raised several times
    assert warned["status"] == "warn"
    assert "driver on your system is too old" in warned["detail"]
    assert any("too old" in w for w in report["verdict"]["warnings"])


def test_a_multi_gpu_report_matches_the_shipped_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from torchplace import report

    probe = machine(K80, H200, env={"CUDA_VISIBLE_DEVICES": "1,0"}, free_memory={0: 2 * GiB})
    result = report_for("cuda:1", probe)
    assert len(result["devices"]) == 2
    document = json.loads(report.to_json(report.envelope("doctor", result, device="cuda:1")))
    jsonschema.Draft202012Validator(report.load_schema("doctor")).validate(document)
    broken = {**document, "result": {**result, "devices": [{"device": "cuda:0"}]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(report.load_schema("doctor")).validate(broken)
