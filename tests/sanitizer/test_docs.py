"""Every ``python`` block of docs/guard.md runs as written (on the CPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "guard.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
SCRIPTS = [b for b in BLOCKS if "import pytest" not in b]
SUITES = [b for b in BLOCKS if "import pytest" in b]


def test_the_doc_has_examples() -> None:
    assert len(SCRIPTS) >= 3
    assert len(SUITES) >= 1


@pytest.mark.parametrize("code", SCRIPTS, ids=[f"script{i}" for i in range(len(SCRIPTS))])
def test_script_runs(code: str, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(code, str(DOC), "exec"), {"__name__": "guard_doc"})


@pytest.mark.parametrize("code", SUITES, ids=[f"suite{i}" for i in range(len(SUITES))])
def test_pytest_example_passes_under_the_plugin(code: str, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_doc_example=code)
    result = pytester.runpytest("--strict-markers", "-p", "no:cacheprovider")
    tests = len(re.findall(r"^def test_", code, flags=re.M))
    result.assert_outcomes(passed=tests)
