"""The checks derived from the facts: arch support, build, driver, visibility, devices, resolve."""

from __future__ import annotations

import json

import pytest

from tests.doctor.machines import CU128_ARCHES, H200, K80, GiB, check, machine, report_for
from torchplace.devices import DriverInfo, FakeProbe
from torchplace.doctor import Check, arch_support
from torchplace.errors import ConfigError


@pytest.mark.parametrize(
    ("cap", "arches", "status"),
    [
        ((9, 0), CU128_ARCHES, "pass"),
        ((8, 9), ["sm_80", "sm_86"], "pass"),  # same major, later minor
        ((8, 7), ["sm_80", "sm_86"], "fail"),  # Orin (integrated) cannot run dGPU cubins
        ((9, 0), ["sm_90a"], "pass"),
        ((10, 0), ["sm_90a", "sm_90"], "fail"),
        ((8, 9), ["sm_75", "compute_80"], "warn"),  # PTX JIT
        ((3, 7), CU128_ARCHES, "fail"),
        ((12, 0), ["sm_100"], "fail"),
        ((9, 0), [], "fail"),
    ],
)
def test_arch_support(cap: tuple[int, int], arches: list[str], status: str) -> None:
    got, detail = arch_support(cap, arches)
    assert got == status
    assert f"sm_{cap[0]}{cap[1]}" in detail


def test_cpu_only_build_report() -> None:
    report = report_for("auto", FakeProbe())
    json.loads(json.dumps(report, allow_nan=False))
    assert report["build"]["cpu_only"] is True
    assert report["build"]["kind"] == "CPU-only"
    assert report["cuda"] == {
        "is_available": False,
        "device_count": 0,
        "visible_devices_variable": "CUDA_VISIBLE_DEVICES",
        "visible_devices": None,
        "visible_physical_ids": None,
    }
    assert report["verdict"]["usable"]
    assert report["verdict"]["device"] == "cpu"
    build = check(report, "build")
    assert build["status"] == "warn"
    assert "CPU-only" in build["detail"]
    assert "pip install torch" in build["fix"]
    assert "no accelerator" in check(report, "resolve")["detail"]


def test_a_cpu_only_build_beside_a_driver_names_what_the_driver_runs() -> None:
    """A GPU machine with a CPU wheel installed: the fix says which CUDA builds fit its driver."""
    probe = FakeProbe(driver_info=DriverInfo(True, "550.54", "12.4", 1))
    fix = check(report_for("auto", probe), "build")["fix"]
    assert "pytorch.org/get-started/locally" in fix
    assert "runs builds for CUDA 12.4 and older" in fix


def test_multi_gpu_inventory_with_remapping() -> None:
    probe = machine(K80, H200, H200, env={"CUDA_VISIBLE_DEVICES": "1,0"}, free_memory={0: 2 * GiB})
    report = report_for("auto", probe)
    assert [(d["device"], d["physical_id"], d["name"]) for d in report["devices"]] == [
        ("cuda:0", "1", "NVIDIA H200"),
        ("cuda:1", "0", "Tesla K80"),
    ]
    assert report["cuda"]["visible_physical_ids"] == ["1", "0"]
    assert report["devices"][0]["arch_support"] == "pass"
    assert report["devices"][1]["arch_support"] == "fail"
    mapping = check(report, "visible-devices")["detail"]
    assert "cuda:0 = physical 1" in mapping
    assert "cuda:1 = physical 0" in mapping
    assert check(report, "memory cuda:0")["status"] == "warn"
    assert check(report, "device-order")["status"] == "warn"
    # the K80 fails its arch check, but that does not make cuda:0 unusable
    assert report["verdict"]["usable"]
    assert report["verdict"]["device"] == "cuda:0"
    k80 = report_for("cuda:1", probe)
    assert not k80["verdict"]["usable"]
    assert "sm_37" in k80["verdict"]["summary"]
    assert any("TORCH_CUDA_ARCH_LIST=3.7" in f for f in k80["verdict"]["fixes"])


def test_pci_bus_order_silences_the_order_warning() -> None:
    probe = machine(H200, H200, env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    names = [c["name"] for c in report_for("auto", probe)["checks"]]
    assert "device-order" not in names


def test_visible_devices_hiding_everything() -> None:
    probe = machine(H200, env={"CUDA_VISIBLE_DEVICES": "-1"})
    auto = report_for("auto", probe)
    assert check(auto, "visible-devices")["status"] == "fail"
    assert auto["verdict"]["usable"]
    assert auto["verdict"]["device"] == "cpu"
    cuda = report_for("cuda", probe)
    assert not cuda["verdict"]["usable"]
    assert "CUDA_VISIBLE_DEVICES='-1'" in cuda["verdict"]["summary"]


@pytest.mark.parametrize(
    ("driver_cuda", "status"), [("12.8", "pass"), ("12.4", "warn"), ("11.8", "warn")]
)
def test_driver_against_build(driver_cuda: str, status: str) -> None:
    # CUDA initialised: an older kernel driver then runs through a forward-compatibility
    # package (as in datacenter containers), which the smoke tests would catch if it did not
    probe = machine(H200, driver=DriverInfo(True, "550.0", driver_cuda, 1))
    report = report_for("cuda:0", probe)
    assert check(report, "driver")["status"] == status
    assert report["driver"]["driver_version"] == "550.0"
    assert report["verdict"]["usable"] is True


def test_driver_too_old_for_the_build_fails_when_cuda_does_not_start() -> None:
    probe = machine(driver=DriverInfo(True, "450.0", "11.0", 1))  # NVML sees a GPU, CUDA none
    report = report_for("cuda:0", probe)
    driver = check(report, "driver")
    assert driver["status"] == "fail"
    assert "torch was built with CUDA 12.8" in driver["detail"]
    assert "update the NVIDIA driver" in driver["fix"]
    assert not report["verdict"]["usable"]
    assert "update the NVIDIA driver to one that supports CUDA 12.8" in " ".join(
        report["verdict"]["fixes"]
    )
    compat = report_for("cuda:0", machine(H200, driver=DriverInfo(True, "450.0", "11.0", 1)))
    assert "forward-compatibility" in check(compat, "driver")["detail"]


def test_nvml_not_installed_is_said() -> None:
    report = report_for("auto", machine(H200, driver=DriverInfo(nvml_installed=False)))
    assert report["driver"]["nvml"] == "not installed"
    driver = check(report, "driver")
    assert "not installed" in driver["detail"]
    assert "nvidia-ml-py" in driver["fix"]


def test_auto_names_the_environment_variable() -> None:
    report = report_for("auto", machine(H200, env={"TORCHPLACE_DEVICE": "cpu"}))
    assert report["verdict"]["device"] == "cpu"
    assert "from $TORCHPLACE_DEVICE='cpu'" in check(report, "resolve")["detail"]
    assert report["environment"]["TORCHPLACE_DEVICE"] == "cpu"


def test_bad_spec_is_a_usage_error() -> None:
    with pytest.raises(ConfigError):
        report_for("tpu:0", FakeProbe())


class BrokenProbe(FakeProbe):
    def device_count(self) -> int:
        raise RuntimeError("CUDA error: no CUDA-capable device is detected")


def test_runtime_failures_are_reported_not_raised() -> None:
    probe = BrokenProbe(devices=[H200], cuda_version="12.8", arches=CU128_ARCHES)
    report = report_for("cuda:0", probe)
    assert check(report, "cuda-init")["status"] == "fail"
    assert check(report, "resolve")["status"] == "fail"
    assert not report["verdict"]["usable"]
    assert "no CUDA-capable device" in report["verdict"]["summary"]


def test_check_scope() -> None:
    c = Check("x", "fail", "d", applies_to="cuda")
    assert c.concerns("cuda:1")
    assert not c.concerns("cpu")
    assert not c.concerns(None)
    assert Check("y", "fail", "d", applies_to="cuda:1").concerns("cuda:1")
    assert not Check("y", "fail", "d", applies_to="cuda:1").concerns("cuda:0")
    assert Check("z", "fail", "d").concerns("cpu")
