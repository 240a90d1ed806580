"""The doctor in real environments, round 4: what an H200 with torch 2.11+cu130 (driver 580) did,
compared with the doctor's verdict. A ``CUDA_DEVICE_ORDER`` other than ``PCI_BUS_ID`` or
``FASTEST_FIRST`` stops CUDA from starting; a ``CUDA_VISIBLE_DEVICES`` that names no GPU of the
machine (``5``, the pre-R470 ``MIG-GPU-<uuid>/1/0``) leaves CUDA none; an allocator config
torch refuses raises ValueError when CUDA starts (it crashed the smoke tests);
``CUDA_LAUNCH_BLOCKING=1`` left on; a report that cannot be written to stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doctor.machines import H200, check, machine, report_for
from torchplace.devices import DeviceProperties, DriverInfo, FakeProbe
from torchplace.doctor.smoke import matmul_check, pinned_memory_check, round_trip_check

ROOT = Path(__file__).resolve().parents[2]


class _RefusesTheOrder(FakeProbe):
    """CUDA 13 with a CUDA_DEVICE_ORDER it does not take: 'invalid device ordinal', no device."""

    def _visible(self) -> list[DeviceProperties]:
        if self.env_vars.get("CUDA_DEVICE_ORDER") not in (None, "PCI_BUS_ID", "FASTEST_FIRST"):
            return []
        return super()._visible()


# -- CUDA_DEVICE_ORDER ------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["pci_bus_id", "bogus", ""])
def test_a_device_order_cuda_refuses_fails_even_on_one_gpu(value: str) -> None:
    # was: no check at all on a one-GPU machine ("CUDA numbers GPUs..." only for several)
    probe = _RefusesTheOrder(
        devices=[H200],
        cuda_version="12.8",
        arches=["sm_90"],
        env_vars={"CUDA_DEVICE_ORDER": value},
        driver_info=machine().driver_info,
    )
    report = report_for("cuda:0", probe)
    order = check(report, "device-order")
    assert order["status"] == "fail"
    assert f"CUDA_DEVICE_ORDER={value!r}" in order["detail"]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in order["fix"]
    assert not report["verdict"]["usable"]
    assert order["fix"] in report["verdict"]["fixes"]


@pytest.mark.parametrize("value", ["PCI_BUS_ID", "FASTEST_FIRST"])
def test_a_device_order_cuda_takes_on_one_gpu_says_nothing(value: str) -> None:
    one = DriverInfo(True, "570.86", "12.8", 1, ("0: NVIDIA H200 (GPU-aaaa1111)",))
    report = report_for("cuda:0", machine(H200, env={"CUDA_DEVICE_ORDER": value}, driver=one))
    assert "device-order" not in [c["name"] for c in report["checks"]]


# -- CUDA_VISIBLE_DEVICES naming no GPU of the machine ---------------------------------------


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("5", "'5' is not one of them"),
        ("GPU-zzzz", "'GPU-zzzz' is not one of them"),
        ("MIG-GPU-aaaa1111/1/0", "only drivers before R470 read"),
    ],
)
def test_a_visibility_value_naming_no_gpu_here_fails_with_the_value(value: str, said: str) -> None:
    # was "info: no device mapped", the visibility check blaming nothing
    report = report_for("cuda:0", machine(H200, env={"CUDA_VISIBLE_DEVICES": value}))
    vis = check(report, "visible-devices")
    assert vis["status"] == "fail"
    assert f"CUDA_VISIBLE_DEVICES={value!r}" in vis["detail"]
    assert said in vis["detail"]
    assert "nvidia-smi -L" in vis["fix"]
    assert vis["fix"] in report["verdict"]["fixes"]


def test_a_visibility_value_naming_no_gpu_without_nvml_stays_info() -> None:
    # without NVML nothing says GPUs are there: the driver may be the cause
    probe = machine(
        H200, env={"CUDA_VISIBLE_DEVICES": "5"}, driver=DriverInfo(nvml_installed=False)
    )
    assert check(report_for("cuda:0", probe), "visible-devices")["status"] == "info"


# -- allocator config -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("expandable_segment:True", "did you mean 'expandable_segments'?"),
        ("expandable_segments:true", "takes True or False, not 'true'"),
        ("expandable_segments=True", "is not key:value"),
        ("max_split_size_mb:abc", "a whole number of MiB"),
        ("max_split_size_mb:10", "must be 20 or more"),
        ("garbage_collection_threshold:1.5", "between 0 and 1"),
        ("backend:foo", "native or cudaMallocAsync"),
        ("foo:1", "'foo' is not an allocator option"),
    ],
)
def test_an_allocator_config_torch_refuses_is_a_warning(value: str, said: str) -> None:
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        report = report_for("cuda:0", machine(H200, env={name: value}))
        conf = check(report, "allocator-config")
        assert conf["status"] == "warn"
        assert f"{name}={value!r}" in conf["detail"]
        assert said in conf["detail"]
        assert name in conf["fix"]


@pytest.mark.parametrize(
    "value",
    [
        "expandable_segments:True",
        "expandable_segments: True,",
        "max_split_size_mb:512,garbage_collection_threshold:0.6",
        "backend:cudaMallocAsync",
        "roundup_power2_divisions:[256:1,512:2,>:4]",
        " ",
        "",
    ],
)
def test_an_allocator_config_torch_takes_says_nothing(value: str) -> None:
    report = report_for("cuda:0", machine(H200, env={"PYTORCH_CUDA_ALLOC_CONF": value}))
    assert "allocator-config" not in [c["name"] for c in report["checks"]]


class _RefusingTensors:
    """torch.empty as a CUDA build calls it with a refused allocator config: ValueError."""

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise ValueError("Unrecognized key 'expandable_segment' in Accelerator allocator config.")


def test_a_refused_allocator_config_fails_the_smoke_tests_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # was: ValueError traceback out of pinned_memory_check (only RuntimeError was caught)
    import torch

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segment:True")
    monkeypatch.setattr(torch, "empty", _RefusingTensors())
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: _RefusingTensors()())
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: _RefusingTensors()())
    device = torch.device("cuda", 0)
    for result in (
        pinned_memory_check(device),
        round_trip_check(device, elements=16),
        matmul_check(device, n=4, tf32=False)[0],
    ):
        assert result.status == "fail"
        assert "ValueError: Unrecognized key 'expandable_segment'" in result.detail
        assert "PYTORCH_CUDA_ALLOC_CONF='expandable_segment:True'" in (result.fix or "")


# -- CUDA_LAUNCH_BLOCKING ---------------------------------------------------------------------


def test_launch_blocking_left_on_is_a_warning() -> None:
    report = report_for("cuda:0", machine(H200, env={"CUDA_LAUNCH_BLOCKING": "1"}))
    blocking = check(report, "launch-blocking")
    assert blocking["status"] == "warn"
    assert "unset CUDA_LAUNCH_BLOCKING" in blocking["fix"]
    assert report["verdict"]["usable"]
    off = report_for("cuda:0", machine(H200, env={"CUDA_LAUNCH_BLOCKING": "0"}))
    assert "launch-blocking" not in [c["name"] for c in off["checks"]]


# -- the verdict and the output ---------------------------------------------------------------


@pytest.mark.parametrize("spec", ["cuda:0 ", "0", "CUDA:00"])
def test_a_device_that_did_not_resolve_is_named_in_its_plain_form(spec: str) -> None:
    # was "cuda:0  is not usable" (the spec as typed, trailing space and all), "0 is not usable"
    report = report_for(spec, FakeProbe())
    assert report["verdict"]["summary"].startswith("cuda:0 is not usable: ")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("fmt", ["--json", "--format=text"])
def test_a_report_stdout_cannot_take_is_an_error_not_a_traceback(fmt: str) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "torchplace", "doctor", "--no-smoke", "--device", "cpu", fmt],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=120,
        )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "cannot write the report to standard output" in done.stderr
    assert "-o PATH" in done.stderr


@pytest.mark.parametrize(
    "env",
    [
        {"CUDA_DEVICE_ORDER": "bogus"},
        {"CUDA_VISIBLE_DEVICES": "5"},
        {"PYTORCH_CUDA_ALLOC_CONF": "foo:1", "CUDA_LAUNCH_BLOCKING": "1"},
        {},
    ],
)
def test_each_new_verdict_matches_the_shipped_schema(env: dict[str, str]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from torchplace import report

    probe = _RefusesTheOrder(
        devices=[H200],
        cuda_version="12.8",
        arches=["sm_90"],
        env_vars=env,
        driver_info=machine().driver_info,
    )
    result = report_for("cuda:0", probe)
    document = json.loads(report.to_json(report.envelope("doctor", result, device="cuda:0")))
    jsonschema.Draft202012Validator(report.load_schema("doctor")).validate(document)
    assert result["verdict"]["usable"] == (
        env.get("CUDA_VISIBLE_DEVICES") is None and "CUDA_DEVICE_ORDER" not in env
    )


# -- CPU threads ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-1", "abc", "", "1.5"])
def test_a_thread_count_openmp_ignores_is_a_warning(value: str) -> None:
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        report = report_for("cpu", machine(env={name: value}))
        threads = check(report, "cpu-threads")
        assert threads["status"] == "warn"
        assert f"{name}={value!r}" in threads["detail"]
        assert f"set {name}" in threads["fix"]
        assert report["verdict"]["usable"]


@pytest.mark.parametrize("value", ["4", " 8 ", "8,1"])
def test_a_thread_count_openmp_takes_says_nothing(value: str) -> None:
    report = report_for("cpu", machine(env={"OMP_NUM_THREADS": value}), cpus=lambda: (None, None))
    assert "cpu-threads" not in [c["name"] for c in report["checks"]]


def test_more_threads_than_the_cgroup_quota_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch, "get_num_threads", lambda: 32)
    report = report_for("cpu", machine(), cpus=lambda: (64, 2.0))
    threads = check(report, "cpu-threads")
    assert "torch runs 32 CPU threads but this process may use 2 CPU(s)" in threads["detail"]
    assert "a cgroup quota of 2 CPU(s)" in threads["detail"]
    assert "OMP_NUM_THREADS=2" in threads["fix"]
    assert report["build"]["cpu_quota"] == 2.0
    assert report["build"]["cpu_affinity"] == 64
    fits = report_for("cpu", machine(), cpus=lambda: (64, 48.0))
    assert "cpu-threads" not in [c["name"] for c in fits["checks"]]


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "250000 100000\n"}, 2.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4.0),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu.max": "garbage"}, None),
        ({}, None),
    ],
)
def test_the_cgroup_cpu_quota_is_read_from_v2_or_v1(
    tmp_path: Path, files: dict[str, str], quota: float | None
) -> None:
    from torchplace.doctor.probes import cpu_limits

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cpu_limits(str(tmp_path))[1] == quota


# -- --device as users type it ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        ("gpu", "did you mean 'cuda'?"),
        ("GPU:1", "did you mean 'cuda:1'?"),
        ("cuda0", "did you mean 'cuda:0'?"),
        ("cuda 1", "did you mean 'cuda:1'?"),
        ("xpu-0", "did you mean 'xpu:0'?"),
    ],
)
def test_a_device_typed_loosely_is_a_usage_error_with_the_spelling_to_use(
    spec: str, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchplace.cli import main

    assert main(["doctor", "--no-smoke", "--device", spec]) == 2
    err = capsys.readouterr().err
    assert hint in err
    assert repr(spec) in err
