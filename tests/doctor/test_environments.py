"""The doctor in the environments users really have: visibility variables that stop early or hide
everything, containers, probes that raise, hang or answer in part, a toolkit or driver file that
prints something unexpected. Each gives a verdict with its cause, never a traceback or a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.doctor.machines import H200, NVML_OK, check, machine, report_for
from torchplace.cli import main
from torchplace.devices import DeviceProperties, DriverInfo, FakeProbe
from torchplace.doctor import nvcc_version
from torchplace.doctor.probes import driver_from_proc

GiB = 2**30
L4 = DeviceProperties("NVIDIA L4", 8, 9, 24 * GiB, 58, "GPU-bbbb2222")
T4 = DeviceProperties("Tesla T4", 7, 5, 16 * GiB, 40, "GPU-dddd4444")
MIG_A = DeviceProperties("NVIDIA H200 MIG 1g.18gb", 9, 0, 18 * GiB, 16, "MIG-aaaa0000-0001")
MIG_B = DeviceProperties("NVIDIA H200 MIG 1g.18gb", 9, 0, 18 * GiB, 16, "MIG-bbbb0000-0002")
ROOT = Path(__file__).resolve().parents[2]


def _round_trips(report: dict[str, Any]) -> None:
    json.dumps(report, allow_nan=False)


# -- CUDA_VISIBLE_DEVICES that CUDA reads only in part ----------------------------------------


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("0,5,1", "'5' names no GPU here"),
        ("0,,1", "an empty entry"),
        ("0,-1,2", "'-1'"),
        ("0,gpu1,2", "'gpu1' is not a GPU index or UUID"),
        ("GPU-aaaa1111,GPU-zzzz,GPU-bbbb2222", "'GPU-zzzz' names no GPU here"),
    ],
)
def test_a_visibility_list_cut_short_is_a_warning_that_names_the_entry(
    value: str, said: str
) -> None:
    report = report_for("cuda:0", machine(H200, L4, T4, env={"CUDA_VISIBLE_DEVICES": value}))
    vis = check(report, "visible-devices")
    assert vis["status"] == "warn"  # was "info", with nothing said about the lost GPUs
    assert said in vis["detail"]
    assert "CUDA sees 1" in vis["detail"]
    assert vis["fix"]
    assert report["verdict"]["usable"]  # cuda:0 itself is fine
    assert vis["detail"] in report["verdict"]["warnings"]


@pytest.mark.parametrize("value", ["-1", "abc", "0,-1", ""])
def test_on_a_build_without_cuda_the_visibility_list_is_information(value: str) -> None:
    """A CPU wheel's CUDA_VISIBLE_DEVICES=-1, the common way to hide GPUs, was a warning that
    "'-1' lists 1 GPU(s) but CUDA sees 0": nothing reads the variable there."""
    report = report_for("cpu", FakeProbe(env_vars={"CUDA_VISIBLE_DEVICES": value}))
    vis = check(report, "visible-devices")
    assert vis["status"] == "info", vis
    assert vis["detail"] == (
        f"CUDA_VISIBLE_DEVICES={value!r}: not read, this torch build has no CUDA or ROCm"
    )
    assert report["verdict"]["usable"]


def test_the_gpus_a_list_cut_short_names_leave_out_the_entry_it_stopped_at() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,-1,abc,2"}  # '0' read; '-1' stops it; '2' names a GPU
    vis = check(report_for("cuda:0", machine(H200, H200, H200, env=env)), "visible-devices")
    assert "lists 2 GPU(s) but CUDA sees 1" in vis["detail"], vis


def test_a_trailing_comma_is_not_a_warning() -> None:
    report = report_for("cuda:0", machine(H200, L4, env={"CUDA_VISIBLE_DEVICES": "1,0,"}))
    assert check(report, "visible-devices")["status"] == "info"


def test_two_mig_devices_in_one_process_warn() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "MIG-aaaa0000,MIG-bbbb0000"}
    report = report_for("cuda:0", machine(MIG_A, MIG_B, env=env))
    vis = check(report, "visible-devices")
    assert vis["status"] == "warn"
    assert "one MIG device per process" in vis["detail"]
    assert [d["device"] for d in report["devices"]] == ["cuda:0"]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("NoDevFiles", "job scheduler"),
        ("all", "NVIDIA_VISIBLE_DEVICES"),
        ("0,0", "names GPU 0 twice"),
        ("", "it is empty"),
    ],
)
def test_hiding_every_gpu_says_why(value: str, why: str) -> None:
    report = report_for("cuda", machine(H200, L4, env={"CUDA_VISIBLE_DEVICES": value}))
    assert why in check(report, "visible-devices")["detail"]
    assert why in report["verdict"]["summary"]


# -- containers -------------------------------------------------------------------------------


def test_a_container_started_without_a_gpu_is_the_cause() -> None:
    probe = FakeProbe(
        cuda_version="12.8",
        env_vars={"NVIDIA_VISIBLE_DEVICES": "void"},
        driver_info=DriverInfo(nvml_installed=True, error="NVML unavailable: driver not loaded"),
    )
    report = report_for("cuda:0", probe)
    assert not report["verdict"]["usable"]
    assert "NVIDIA_VISIBLE_DEVICES='void'" in report["verdict"]["summary"]


def test_nvidia_visible_devices_outside_a_container_changes_nothing() -> None:
    # read by the NVIDIA container runtime when a container starts, by nothing afterwards
    report = report_for("auto", machine(H200, L4, T4, env={"NVIDIA_VISIBLE_DEVICES": "1"}))
    hint = check(report, "nvidia-visible-devices")
    assert hint["status"] == "warn"
    assert "CUDA sees 3" in hint["detail"]
    assert "CUDA_VISIBLE_DEVICES" in hint["fix"]
    same = report_for("auto", machine(H200, env={"NVIDIA_VISIBLE_DEVICES": "all"}))
    assert "nvidia-visible-devices" not in [c["name"] for c in same["checks"]]


# -- CUDA_DEVICE_ORDER ------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["pci_bus_id", " PCI_BUS_ID", "PCI"])
def test_a_device_order_cuda_does_not_take_is_named(value: str) -> None:
    report = report_for("auto", machine(H200, L4, env={"CUDA_DEVICE_ORDER": value}))
    order = check(report, "device-order")
    assert order["status"] == "warn"
    assert f"CUDA_DEVICE_ORDER={value!r}" in order["detail"]


# -- specs the verdict must read as resolve_device reads them ---------------------------------


@pytest.mark.parametrize("spec", ["CUDA:0", " cuda:0", "0", "cuda:00"])
def test_a_loose_cuda_spec_gets_the_same_verdict_as_its_plain_form(spec: str) -> None:
    no_driver = FakeProbe(
        cuda_version="12.8",
        driver_info=DriverInfo(nvml_installed=True, error="NVML unavailable: no driver"),
    )
    plain = report_for("cuda:0", no_driver)["verdict"]
    loose = report_for(spec, no_driver)["verdict"]
    assert loose["fixes"] == plain["fixes"]
    assert (
        loose["summary"].split(" is not usable")[1] == plain["summary"].split(" is not usable")[1]
    )


@pytest.mark.parametrize("spec", ["AUTO", " auto", None])
def test_auto_in_any_spelling_names_the_environment_variable(spec: str | None) -> None:
    report = report_for(spec, machine(H200, env={"TORCHPLACE_DEVICE": "cpu"}))  # type: ignore[arg-type]
    assert "from $TORCHPLACE_DEVICE='cpu'" in check(report, "resolve")["detail"]


def test_auto_on_an_accelerator_torchplace_does_not_resolve_says_so() -> None:
    # torch.accelerator reports e.g. "npu" (Ascend) or "hpu" (Gaudi): auto stays on the CPU,
    # and the report must not claim there is no accelerator
    report = report_for("auto", FakeProbe(backends={"npu": 1}))
    detail = check(report, "resolve")["detail"]
    assert report["verdict"]["device"] == "cpu"
    assert "'npu'" in detail
    assert "CPU-only" not in detail


def test_an_index_past_what_torch_holds_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # was a ValueError traceback (int() of a 5000-digit string), exit 1
    assert main(["doctor", "--no-smoke", "--device", "cuda:" + "1" * 5000]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err) < 500


def test_a_very_long_device_is_shortened_in_the_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--no-smoke", "--device", "x" * 20_000]) == 2
    assert len(capsys.readouterr().err) < 500  # was 40 KB: the spec, twice


# -- probes that raise or answer in part ------------------------------------------------------

_METHODS = [
    "torch_version",
    "cuda_build",
    "hip_build",
    "cudnn_version",
    "cuda_available",
    "device_count",
    "current_device",
    "properties",
    "mem_get_info",
    "arch_list",
    "env",
    "backend_available",
    "backend_device_count",
    "backend_current_index",
    "accelerator",
    "driver",
]


@pytest.mark.parametrize("method", _METHODS)
@pytest.mark.parametrize("error", [RuntimeError, OSError, AssertionError, ValueError])
def test_a_probe_that_raises_gives_a_report_not_a_traceback(
    method: str, error: type[Exception]
) -> None:
    probe = machine(H200)

    def fail(*args: object) -> None:
        raise error(f"boom from {method}")

    setattr(probe, method, fail)
    report = report_for("auto", probe)
    _round_trips(report)
    text = json.dumps(report["checks"])
    if method not in ("mem_get_info", "backend_device_count", "backend_current_index"):
        # (free memory is optional, and those two are not asked on a CUDA machine)
        assert f"boom from {method}" in text


@pytest.mark.parametrize("method", ["cuda_available", "device_count", "properties", "driver"])
def test_a_probe_that_raises_on_the_command_line_exits_1_with_the_cause(
    method: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchplace.devices import probe as probe_module

    fake = machine(H200)

    def fail(*args: object) -> None:
        raise OSError(f"boom from {method}")

    setattr(fake, method, fail)
    monkeypatch.setattr(probe_module, "_DEFAULT_PROBE", fake)
    code = main(["doctor", "--no-smoke", "--device", "cuda:0", "--json"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)["result"]
    assert f"boom from {method}" in json.dumps(report["checks"])
    assert code == (0 if method == "driver" else 1)


def test_one_gpu_that_cannot_be_read_does_not_sink_the_others() -> None:
    class OneLost(FakeProbe):
        def properties(self, index: int) -> DeviceProperties:
            if index == 1:
                raise RuntimeError("CUDA error: unspecified launch failure (GPU fell off the bus)")
            return super().properties(index)

    probe = OneLost(
        devices=[H200, L4],
        cuda_version="12.8",
        arches=["sm_89", "sm_90"],
        driver_info=NVML_OK,
    )
    good = report_for("cuda:0", probe)
    assert good["verdict"]["usable"]  # was: "cuda:0 is not usable: querying CUDA devices failed"
    assert [d["device"] for d in good["devices"]] == ["cuda:0"]
    lost = check(good, "device cuda:1")
    assert lost["status"] == "fail"
    assert "fell off the bus" in lost["detail"]
    bad = report_for("cuda:1", probe)
    assert not bad["verdict"]["usable"]
    assert "fell off the bus" in bad["verdict"]["summary"]


def test_a_driver_older_than_the_runtime_without_nvml_still_names_the_driver() -> None:
    # torch itself warns "The NVIDIA driver on your system is too old"; CUDA does not start
    probe = FakeProbe(cuda_version="12.8", driver_info=DriverInfo(nvml_installed=False))
    report = report_for("cuda:0", probe)
    assert not report["verdict"]["usable"]
    assert "nvidia-smi" in " ".join(report["verdict"]["fixes"])


# -- a toolkit or driver file that prints something unexpected --------------------------------


def test_nvcc_printing_bytes_that_are_not_utf8(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvcc = tmp_path / "nvcc"
    nvcc.write_bytes(
        b"#!/bin/sh\nprintf 'Cuda compilation tools, release 12.8, V12.8.93 \\377\\376\\n'\n"
    )
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert nvcc_version() == "12.8.93"  # was UnicodeDecodeError


@pytest.mark.parametrize(
    ("content", "version"),
    [
        (b"NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Thu Jan 1\n", "570.86.15"),
        (
            b"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.51.03  Release\n",
            "575.51.03",
        ),
        (b"\xff\xfe garbage \x00\x01", None),
        (b"", None),
    ],
)
def test_the_driver_file_read_whatever_it_holds(
    tmp_path: Path, content: bytes, version: str | None
) -> None:
    path = tmp_path / "version"
    path.write_bytes(content)
    assert driver_from_proc(str(path)) == version
    assert driver_from_proc(str(tmp_path / "missing")) is None


# -- probes that hang -------------------------------------------------------------------------

_HANG = """
import sys, time
from torchplace.devices import probe as probe_module
from tests.doctor.machines import machine, H200

class Hangs(type(machine())):
    def driver(self):
        {body}

probe_module._DEFAULT_PROBE = Hangs(devices=[H200], cuda_version="12.8")
from torchplace.cli import main
sys.exit(main(["doctor", "--no-smoke", "--timeout", sys.argv[1]]))
"""


def _doctor_that_hangs(body: str, timeout: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TORCHPLACE_DEVICE", None)
    script = textwrap.dedent(_HANG).replace("{body}", body)
    return subprocess.run(
        [sys.executable, "-c", script, timeout], capture_output=True, text=True, env=env, timeout=60
    )


def test_a_probe_that_hangs_is_given_up_with_where_it_hung() -> None:
    start = time.monotonic()
    done = _doctor_that_hangs("time.sleep(120)", "2")
    assert time.monotonic() - start < 40
    assert done.returncode == 1
    assert "no answer within 2 s" in done.stderr
    assert "Hangs.driver" in done.stderr
    assert "nvidia-smi" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_hang_that_holds_the_interpreter_lock_still_ends() -> None:
    # torch's own calls into the driver hold the GIL: no Python thread can run until they return
    start = time.monotonic()
    done = _doctor_that_hangs("import ctypes; ctypes.PyDLL(None).sleep(120)", "1")
    assert time.monotonic() - start < 40
    assert done.returncode == 1
    assert "driver" in done.stderr  # faulthandler's dump names the stuck frame


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "1e20"])
def test_a_bad_timeout_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["doctor", "--no-smoke", "--timeout", value])
    except SystemExit as stop:  # argparse's own refusal of a word
        code = stop.code
    assert code == 2
    assert "--timeout" in capsys.readouterr().err


def test_a_zero_timeout_turns_the_watchdog_off() -> None:
    argv = ["doctor", "--no-smoke", "--device", "cpu", "--timeout", "0", "-o", os.devnull]
    assert main(argv) == 0


def test_auto_that_fails_through_the_environment_names_the_variable() -> None:
    report = report_for("auto", FakeProbe(env_vars={"TORCHPLACE_DEVICE": "cuda:01"}))
    assert not report["verdict"]["usable"]
    assert "$TORCHPLACE_DEVICE='cuda:01'" in report["verdict"]["summary"]
    assert any("unset TORCHPLACE_DEVICE" in fix for fix in report["verdict"]["fixes"])
