"""docs/bench.md: its Python examples run, and the picture it shows exists."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "bench.md"


def test_bench_doc_examples_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "bench_doc"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    assert namespace["m"].input_sets == 4


def test_bench_doc_image_exists() -> None:
    targets = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", DOC.read_text(encoding="utf-8"))
    assert targets  # the doc shows a picture
    for target in targets:
        assert (DOC.parent / target).read_bytes().startswith(b"\x89PNG"), target
