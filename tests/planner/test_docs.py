"""docs/plan.md: each exercise-8 table is what the command prints; the Python example runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from torchplace.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "plan.md"
TEXT = DOC.read_text(encoding="utf-8")
TABLES = re.findall(r"<!-- exercise8: (.*?) -->\n```text\n(.*?)```", TEXT, flags=re.S)
VERIFY = re.findall(r"<!-- verify: (.*?) -->\n```text\n(.*?)```", TEXT, flags=re.S)


def test_the_doc_shows_the_tables_of_the_embedded_models() -> None:
    models = {shlex.split(args)[1] for args, _ in TABLES}
    assert {"seed-mlp", "wide-mlp", "gpt2-like"} <= models


@pytest.mark.parametrize(("args", "table"), TABLES, ids=[a for a, _ in TABLES])
def test_each_table_is_the_commands_output(
    args: str, table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *shlex.split(args)]) == 0
    out = capsys.readouterr().out
    assert out[out.index("Exercise 8:") :] == table


@pytest.mark.parametrize(("args", "shown"), VERIFY, ids=[a for a, _ in VERIFY])
def test_the_verify_example_is_the_commands_output(
    args: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("the doc shows --verify on a machine without CUDA")
    assert main(["plan", *shlex.split(args), "--verify"]) == 0
    out = capsys.readouterr().out
    assert out[out.index("verify (") :] == shown


def test_the_python_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    (source,) = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
    exec(compile(source, str(DOC), "exec"), {"__name__": "doc"})
    assert "bytes between devices per forward" in capsys.readouterr().out


def test_the_image_the_doc_shows_exists() -> None:
    for name in re.findall(r"!\[[^\]]*\]\((img/[^)]+)\)", TEXT):
        assert (DOC.parent / name).read_bytes()[:4] == b"\x89PNG"
