"""docs/doctor.md: its Python examples run and its commands are real."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchplace.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "doctor.md"


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
