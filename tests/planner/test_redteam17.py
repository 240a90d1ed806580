"""Round 17 of the new-user red team on ``torchplace plan``: ``--input`` with a built-in
transformer shape, and ``--devices cpu``."""

from __future__ import annotations

import json

import pytest

from torchplace.cli import main


@pytest.mark.parametrize("model", ["gpt2-like", "llama-7b-like"])
def test_input_with_a_built_in_shape_is_refused_naming_what_it_takes(
    model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # was: exit 0, the plan made with 1x128 int64 ids whatever --input declared
    assert main(["plan", "--model", model, "--input", "x:FP32:-1,8"]) == 2
    err = capsys.readouterr().err
    assert f"--input 'x' given, but {model!r} is a built-in transformer shape" in err
    assert "input_ids (int64 token ids, batch x sequence)" in err
    assert "--seq" in err
    assert "--batch" in err


def test_a_built_in_shape_without_input_still_plans(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "gpt2-like", "--seq", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["result"]["seq"] == 64


@pytest.mark.parametrize("devices", ["cpu", "CPU", "cpu:0"])
def test_devices_cpu_says_devices_takes_accelerators(
    devices: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # was: "--devices names 'cpu', which is not visible here (visible: none)"
    assert main(["plan", "--devices", devices]) == 2
    err = capsys.readouterr().err
    assert "which is not visible here" not in err
    assert "--devices takes this machine's accelerators only" in err
    assert "--assume" in err
    assert "--verify" in err
