"""``torchplace doctor``: facts, checks, verdicts and the command line."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import torchplace.doctor as doctor
from torchplace.cli import main
from torchplace.devices import DeviceProperties, DriverInfo, FakeProbe
from torchplace.doctor import (
    Check,
    arch_support,
    collect,
    matmul_check,
    pinned_memory_check,
    render,
    round_trip_check,
)
from torchplace.errors import ConfigError

GiB = 2**30
H200 = DeviceProperties("NVIDIA H200", 9, 0, 141 * GiB, 132, "GPU-aaaa1111")
K80 = DeviceProperties("Tesla K80", 3, 7, 12 * GiB, 13, "GPU-cccc3333")
CU128_ARCHES = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
NVML_OK = DriverInfo(True, "570.86", "12.8", 3, ("0: NVIDIA H200 (GPU-aaaa1111)",))
CPU_BUILD = torch.version.cuda is None and torch.version.hip is None


def machine(
    *devices: DeviceProperties,
    env: dict[str, str] | None = None,
    driver: DriverInfo = NVML_OK,
    **kw: Any,
) -> FakeProbe:
    return FakeProbe(
        devices=list(devices),
        cuda_version="12.8",
        version="2.13.0+cu128",
        cudnn=91002,
        arches=CU128_ARCHES,
        env_vars=env or {},
        driver_info=driver,
        **kw,
    )


def report_for(spec: str, probe: FakeProbe, **kw: Any) -> dict[str, Any]:
    return collect(spec, probe=probe, smoke=False, toolkit=lambda: "12.8.93", **kw)


def check(report: dict[str, Any], name: str) -> dict[str, Any]:
    hits = [c for c in report["checks"] if c["name"] == name]
    assert len(hits) == 1, [c["name"] for c in report["checks"]]
    return hits[0]


# -- compute capability against the arch list -------------------------------------------------


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


# -- collect on fake machines -----------------------------------------------------------------


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


def test_cpu_only_build_asked_for_cuda() -> None:
    report = report_for("cuda:0", FakeProbe())
    verdict = report["verdict"]
    assert not verdict["usable"]
    assert verdict["status"] == "fail"
    assert verdict["device"] is None
    assert "CPU-only build" in verdict["summary"]
    assert any("pip install torch" in fix for fix in verdict["fixes"])


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


class BrokenProbe(FakeProbe):
    def device_count(self) -> int:
        raise RuntimeError("CUDA error: no CUDA-capable device is detected")


def test_torch_warnings_become_checks() -> None:
    probe = WarningProbe(devices=[H200], cuda_version="12.8", arches=CU128_ARCHES)
    report = report_for("auto", probe)
    warned = check(report, "warning")  # reported once, though raised several times
    assert warned["status"] == "warn"
    assert "driver on your system is too old" in warned["detail"]
    assert any("too old" in w for w in report["verdict"]["warnings"])


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


# -- smoke tests on the CPU (honestly labelled) -----------------------------------------------


def test_smoke_on_cpu() -> None:
    cpu = torch.device("cpu")
    rt = round_trip_check(cpu)
    assert rt.status == "pass"
    assert "cpu check" in rt.detail
    assert "equal" in rt.detail
    mm, error = matmul_check(cpu, tf32=False)
    assert mm.status == "pass"
    assert "cpu check" in mm.detail
    assert error is not None
    assert 0 <= error < 1e-4
    assert pinned_memory_check(cpu).status == "skip"


def test_smoke_on_meta_is_skipped() -> None:
    meta = torch.device("meta")
    assert round_trip_check(meta).status == "skip"
    assert matmul_check(meta)[0].status == "skip"
    report = collect("meta", probe=FakeProbe(), toolkit=lambda: None)
    assert report["verdict"]["usable"]
    assert report["verdict"]["device"] == "meta"


def test_matmul_error_over_the_limit_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "_MATMUL_TOL", 0.0)
    mm, error = matmul_check(torch.device("cpu"), tf32=False)
    assert error is not None
    assert error > 0
    assert mm.status == "fail"
    assert mm.fix is not None


def test_tf32_loosens_the_limit() -> None:
    mm, _ = matmul_check(torch.device("cpu"), tf32=True)
    assert "TF32 allowed" in mm.detail
    assert "limit 1e-02" in mm.detail


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch < 2.9")
def test_new_tf32_api_neither_breaks_the_report_nor_hides_tf32() -> None:
    # After torch.backends.cuda.matmul.fp32_precision = "tf32" the legacy getters raise
    # ("mix of the legacy and new APIs"): the doctor must still report, and allow for TF32.
    matmul: Any = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "tf32"
    try:
        with pytest.raises(RuntimeError, match="legacy"):
            torch.get_float32_matmul_precision()
        flags = doctor._torch_flags()
        report = collect("cpu", probe=FakeProbe(), smoke=False, toolkit=lambda: None)
        out = io.StringIO()
        render(report, file=out)
    finally:
        matmul.fp32_precision = before
    assert flags["cuda_matmul_fp32_precision"] == "tf32"
    assert doctor._tf32(flags)
    assert report["build"]["cuda_matmul_fp32_precision"] == "tf32"
    assert "fp32_precision tf32" in out.getvalue()
    assert report["verdict"]["usable"]


def test_tf32_flags() -> None:
    base = {
        "cuda_matmul_fp32_precision": None,
        "cuda_matmul_allow_tf32": False,
        "float32_matmul_precision": "highest",
    }
    assert not doctor._tf32(base)
    assert doctor._tf32({**base, "cuda_matmul_allow_tf32": True})
    assert doctor._tf32({**base, "float32_matmul_precision": "high"})
    assert doctor._tf32({**base, "float32_matmul_precision": None})  # torch refused: be safe
    assert not doctor._tf32({**base, "cuda_matmul_fp32_precision": "ieee"})
    assert doctor._tf32({**base, "cuda_matmul_fp32_precision": "tf32"})


def test_round_trip_mismatch_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "equal", lambda a, b: False)
    rt = round_trip_check(torch.device("cpu"))
    assert rt.status == "fail"
    assert "DIFFERS" in rt.detail
    assert rt.fix


def test_smoke_failure_makes_the_device_unusable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doctor, "_MATMUL_TOL", 0.0)
    report = collect("cpu", probe=FakeProbe(), toolkit=lambda: None)
    assert report["smoke"]["ran"]
    assert not report["verdict"]["usable"]
    assert check(report, "matmul")["status"] == "fail"


# -- rendering and the command line -----------------------------------------------------------


def test_render_shows_mapping_and_verdict() -> None:
    probe = machine(K80, H200, env={"CUDA_VISIBLE_DEVICES": "1,0"})
    out = io.StringIO()
    render(report_for("cuda:1", probe), file=out)
    text = out.getvalue()
    assert "NVIDIA H200" in text
    assert "Tesla K80" in text
    assert "CUDA_VISIBLE_DEVICES" in text
    assert "1,0" in text
    assert "verdict: cuda:1 is not usable" in text
    assert "TORCH_CUDA_ARCH_LIST=3.7" in text


def test_cli_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "torchplace doctor" in out
    assert "verdict:" in out
    assert "is usable" in out
    assert "CUDA used to build torch" in out
    assert "NVIDIA driver" in out


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json", "--no-smoke"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["build"]["cpu_only"] is CPU_BUILD
    assert report["verdict"]["usable"] is True
    assert report["smoke"]["ran"] is False
    assert isinstance(report["checks"], list)
    assert report["checks"]


def test_cli_device_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--device", "cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"]["device"] == "cpu"
    assert report["smoke"]["matmul_relative_error"] < 1e-4


@pytest.mark.skipif(not CPU_BUILD, reason="checks the CPU-only build's answer")
def test_cli_cuda_on_cpu_only_build(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--device", "cuda:0"]) == 1
    captured = capsys.readouterr()
    assert "verdict: cuda:0 is not usable: torch" in captured.out
    assert "CPU-only build" in captured.out
    assert "fix: install a CUDA build of torch" in captured.out
    assert main(["doctor", "--device", "cuda:0", "--json"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["verdict"]["usable"] is False
    assert "CPU-only build" in captured.err
    assert "pip install torch" in captured.err


def test_cli_unusable_index(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--device", "cuda:99", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"]["status"] == "fail"
    assert report["verdict"]["fixes"]


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--device", "tpu"]) == 2
    assert "tpu" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["doctor", "--bogus"])
    assert info.value.code == 2


def test_cli_as_a_subprocess() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TORCHPLACE_DEVICE", None)
    cmd = [sys.executable, "-m", "torchplace.cli", "doctor"]
    ok = subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["verdict"]["device"] == "cpu"
    assert report["environment"]["CUDA_VISIBLE_DEVICES"] == ""
    bad = subprocess.run(
        [*cmd, "--device", "cuda", "--no-smoke", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 1
    assert "CUDA_VISIBLE_DEVICES=''" in bad.stderr


# -- real CUDA --------------------------------------------------------------------------------


@pytest.mark.cuda
def test_cuda_smoke_tests() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    pinned = pinned_memory_check(device)
    assert pinned.status == "pass"
    rt = round_trip_check(device)
    assert rt.status == "pass", rt.detail
    assert "pinned, non_blocking" in rt.detail
    assert "equal" in rt.detail
    mm, error = matmul_check(device)
    assert mm.status == "pass", mm.detail
    assert error is not None
    assert error < 1e-2


@pytest.mark.cuda
def test_cuda_doctor_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--device", "cuda:0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"]["usable"]
    assert report["verdict"]["device"] == "cuda:0"
    assert report["cuda"]["is_available"] is True
    assert report["cuda"]["device_count"] == torch.cuda.device_count()
    assert len([d for d in report["devices"] if d["device"].startswith("cuda")]) == (
        torch.cuda.device_count()
    )
    assert report["build"]["cuda_compiled_version"] == torch.version.cuda
    assert check(report, "arch cuda:0")["status"] in ("pass", "warn")
    assert check(report, "round-trip")["status"] == "pass"
    assert check(report, "matmul")["status"] == "pass"


# -- the user doc's examples ------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "doctor.md"


def test_doc_python_examples_run(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 3
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})
    out = capsys.readouterr().out
    # the printed lines are the ones the doc shows
    assert "cuda:0 = physical 2 Tesla T4 sm_75" in out
    assert "cuda:1 = physical 0 NVIDIA H200 sm_90" in out


def test_doc_commands_are_real(capsys: pytest.CaptureFixture[str]) -> None:
    lines = re.findall(r"^\$ torchplace (doctor[^;#\n|]*)", DOC.read_text(encoding="utf-8"), re.M)
    assert len(lines) >= 4
    for line in lines:
        argv = line.split()
        if "--no-smoke" not in argv:
            argv.append("--no-smoke")  # keep the suite fast; the flags are what is checked
        assert main(argv) in (0, 1), line
    capsys.readouterr()


@pytest.mark.cuda
def test_cuda_visible_devices_on_real_hardware() -> None:
    # the doctor in a fresh process (CUDA reads the variable once, at initialisation)
    from torchplace.devices import visible_devices

    first = visible_devices().physical_id(0)  # what logical cuda:0 is here: "0", "3", a UUID
    cmd = [sys.executable, "-m", "torchplace.cli", "doctor", "--json", "--no-smoke"]
    base = {k: v for k, v in os.environ.items() if k != "TORCHPLACE_DEVICE"}
    one = subprocess.run(
        [*cmd, "--device", "cuda:0"],
        capture_output=True,
        text=True,
        env={**base, "CUDA_VISIBLE_DEVICES": first},
        timeout=25,
    )
    assert one.returncode == 0, one.stderr
    report = json.loads(one.stdout)
    assert report["cuda"]["device_count"] == 1
    assert report["cuda"]["visible_physical_ids"] == [first]
    assert [(d["device"], d["physical_id"]) for d in report["devices"]] == [("cuda:0", first)]
    assert f"cuda:0 = physical {first}" in check(report, "visible-devices")["detail"]
    hidden = subprocess.run(
        [*cmd, "--device", "cuda"],
        capture_output=True,
        text=True,
        env={**base, "CUDA_VISIBLE_DEVICES": "-1"},
        timeout=25,
    )
    assert hidden.returncode == 1, hidden.stdout
    assert json.loads(hidden.stdout)["cuda"]["is_available"] is False
    assert "CUDA_VISIBLE_DEVICES='-1' hides every GPU" in hidden.stderr
