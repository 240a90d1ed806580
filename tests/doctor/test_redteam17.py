"""Round 17 of the new-user red team on ``torchplace doctor``: a ``--timeout`` too short for the
checks, and the advice when the limit is hit where no GPU driver is involved."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import torchplace
from torchplace.cli import main

#: the torchplace these tests import, for the doctors they start
SRC = str(Path(torchplace.__file__).resolve().parents[1])

_STUCK = """
import sys, time
from torchplace.doctor import cli

cli._DRIVER_FILES = tuple(sys.argv[2:])  # what says a GPU driver is loaded here

def collect(spec, smoke=True):  # the doctor's own work, slow: nothing waits on a device
    time.sleep(60)

cli.collect = collect
from torchplace.cli import main
sys.exit(main(["doctor", "--device", "cpu", "--timeout", sys.argv[1]]))
"""


def _doctor(*argv: str, script: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop("TORCHPLACE_DEVICE", None)
    command = ["-c", textwrap.dedent(script)] if script else ["-m", "torchplace", "doctor"]
    return subprocess.run(
        [sys.executable, *command, *argv], capture_output=True, text=True, env=env, timeout=90
    )


@pytest.mark.parametrize("value", ["0.01", "0.5"])
def test_a_timeout_under_a_second_is_a_usage_error(value: str) -> None:
    # was: the watchdog fired on a healthy CPU-only machine, blaming "a driver, GPU or probe
    # that hangs" and telling to reset the GPU or reboot (exit 1)
    done = _doctor("--timeout", value)
    assert done.returncode == 2, done.stderr
    assert f"--timeout {value} is under 1 s" in done.stderr
    assert "0 for no limit" in done.stderr
    assert "reboot" not in done.stderr


def test_the_shortest_limit_still_checks_a_healthy_cpu() -> None:
    assert main(["doctor", "--device", "cpu", "--timeout", "1", "-o", os.devnull]) == 0


def test_a_limit_hit_without_a_driver_says_it_is_likely_too_short() -> None:
    # was: "Fix: run 'nvidia-smi' ... reset the GPU or reboot" on a machine without a GPU
    done = _doctor("1", script=_STUCK)
    assert done.returncode == 1
    assert "no answer within 1 s in collect" in done.stderr
    assert "no GPU driver is loaded here" in done.stderr
    assert "the limit is likely too short" in done.stderr
    assert "longer --timeout" in done.stderr
    assert "reset the GPU" not in done.stderr
    assert "nvidia-smi" not in done.stderr


def test_a_limit_hit_with_a_driver_loaded_gives_the_drivers_fixes() -> None:
    done = _doctor("1", SRC, script=_STUCK)  # SRC exists: stands for /dev/nvidiactl
    assert done.returncode == 1
    assert "a driver, GPU or probe that hangs" in done.stderr
    assert "nvidia-smi" in done.stderr
    assert "--timeout SECONDS changes the limit" in done.stderr
