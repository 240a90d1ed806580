"""docs/core.md: its examples run."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

# --------------------------------------------------------------------------------------------
# docs/core.md: its examples run
# --------------------------------------------------------------------------------------------


def test_core_doc_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "core.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "docs/core.md has no python examples"
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("core_doc")  # dataclasses look their module up in sys.modules
    monkeypatch.setitem(sys.modules, "core_doc", module)
    for block in blocks:
        exec(compile(block, str(doc), "exec"), module.__dict__)


def test_core_doc_outputs_are_what_the_examples_print(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each ```text block of docs/core.md (a "prints" block) is in what the examples print;
    "..." stands for the rest of a line that the doc shortens."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "core.md"
    text = doc.read_text(encoding="utf-8")
    shown = re.findall(r"```text\n(.*?)```", text, flags=re.S)
    assert shown, "docs/core.md shows no output"
    test_core_doc_examples_run(tmp_path, monkeypatch)
    out = capsys.readouterr().out
    for block in shown:
        pattern = "\n".join(
            re.escape(line.split("...")[0].rstrip("(")) + "[^\n]*"
            if "..." in line
            else re.escape(line)
            for line in block.splitlines()
        )
        assert re.search(pattern, out), (
            f"docs/core.md shows output the examples do not print:\n{block}"
        )
