"""What the per-round rule tests share: lint one source, a notebook, or a small project written
to disk."""

from __future__ import annotations

import json
from pathlib import Path

from torchplace.lint import lint_paths, lint_source
from torchplace.lint.notebook import lint_notebook


def lines(source: str, code: str, path: str = "train.py") -> list[int]:
    """The lines ``code`` reports in ``source``, linted as the file ``path``."""
    return [f.line for f in lint_source(source, path, select={code})]


def notebook(*cells: str) -> bytes:
    """A Jupyter notebook of code ``cells``, as its file's bytes."""
    document = {
        "cells": [{"cell_type": "code", "metadata": {}, "source": cell} for cell in cells],
        "metadata": {"language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(document).encode()


def notebook_cells(raw: bytes, code: str, path: str = "nb.ipynb") -> list[tuple[int | None, int]]:
    """Where ``code`` is reported in the notebook ``raw``, as (cell, line)."""
    return [(f.cell, f.line) for f in lint_notebook(raw, path, select={code})]


def project(root: Path, files: dict[str, str], code: str) -> list[tuple[str, int]]:
    """Write ``files`` under ``root`` (not a ``test*`` folder: linted as code), lint them, and
    return where ``code`` is reported, as (relative path, line)."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    result = lint_paths([str(root)], jobs=1)
    return sorted(
        (Path(f.path).relative_to(root).as_posix(), f.line)
        for f in result.findings
        if f.code == code
    )
