"""``torchplace doctor`` on the command line: tables, the JSON report, exit statuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.doctor.machines import CPU_BUILD, check
from torchplace.cli import main


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
    document = json.loads(capsys.readouterr().out)
    assert document["schema"] == "torchplace.doctor/v1"
    assert document["torch"] == torch.__version__
    report = document["result"]
    assert document["device"] == report["verdict"]["device"]
    assert report["build"]["cpu_only"] is CPU_BUILD
    assert report["verdict"]["usable"] is True
    assert report["smoke"]["ran"] is False
    assert isinstance(report["checks"], list)
    assert report["checks"]


def test_cli_device_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--device", "cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["result"]
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
    assert json.loads(captured.out)["result"]["verdict"]["usable"] is False
    assert "CPU-only build" in captured.err
    assert "pip install torch" in captured.err


def test_cli_unusable_index(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--device", "cuda:99", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)["result"]
    assert report["verdict"]["status"] == "fail"
    assert report["verdict"]["fixes"]


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--device", "tpu"]) == 2
    assert "tpu" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["doctor", "--bogus"])
    assert info.value.code == 2


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("-1", "--timeout -1 is negative; give a number of seconds such as"),
        ("nan", "--timeout nan is not a number of seconds; give a number of seconds such as"),
        ("1e9", "--timeout 1e+09 is over"),
    ],
)
def test_a_timeout_that_is_no_wait_names_the_value_and_the_fix(
    value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", f"--timeout={value}"]) == 2
    err = capsys.readouterr().err
    assert said in err, err
    assert "0 for no limit" in err


def test_cli_as_a_subprocess() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TORCHPLACE_DEVICE", None)
    cmd = [sys.executable, "-m", "torchplace.cli", "doctor"]
    ok = subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)["result"]
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


def test_an_environment_that_breaks_import_torch_is_a_clear_failure() -> None:
    # torch reads TORCH_LOGS on import and raises on a value it does not know
    env = {**os.environ, "TORCH_LOGS": "no-such-log"}
    cmd = [sys.executable, "-m", "torchplace.cli", "doctor", "--json"]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert "torch cannot be imported (ValueError: Invalid log settings: no-such-log" in run.stderr
    assert "TORCH_LOGS=no-such-log" in run.stderr  # the fix names the variable


@pytest.mark.cuda
def test_cuda_doctor_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--device", "cuda:0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["result"]
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
    report = json.loads(one.stdout)["result"]
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
    assert json.loads(hidden.stdout)["result"]["cuda"]["is_available"] is False
    assert "CUDA_VISIBLE_DEVICES='-1' hides every GPU" in hidden.stderr


def test_cli_text_report_to_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "doctor.txt"
    assert main(["doctor", "--device", "cpu", "--no-smoke", "-o", str(out)]) == 0
    assert capsys.readouterr().out == ""
    text = out.read_text()
    assert "torchplace doctor" in text
    assert "verdict: cpu is usable" in text
