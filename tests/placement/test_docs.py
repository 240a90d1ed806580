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
