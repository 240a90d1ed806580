"""Zero crashes over every Python source of the installed torch package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from torchplace.lint.config import Settings
from torchplace.lint.runner import lint_paths


@pytest.mark.slow
def test_no_crash_over_installed_torch() -> None:
    spec = importlib.util.find_spec("torch")
    assert spec is not None
    assert spec.origin is not None
    root = Path(spec.origin).parent
    result = lint_paths([str(root)], Settings(root=root), jobs=2)
    assert result.files > 1000
    assert result.errors == []
    # Findings are allowed (it is real code); an engine failure is not.
    assert all(f.code.startswith("TPL") for f in result.findings)
