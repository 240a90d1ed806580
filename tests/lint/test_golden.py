"""Golden files: every rule's fixture, its expected findings, and the fix pairs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from torchplace.lint.engine import lint_bytes
from torchplace.lint.fix import apply_fixes
from torchplace.lint.rules import ALL_RULES

FIXTURES = Path(__file__).parent / "fixtures"
RULE_CODES = sorted(code for code in ALL_RULES if code != "TPL001")  # TPL001: see test_cli
FIXED_CODES = sorted(code for code, rule in ALL_RULES.items() if rule.fix == "safe")
# A rule's fixture `TPL104.py`, plus variants `TPL104-ranks.py` for facts that hold per file
# (multi-rank code) and so need a file of their own.
FIXTURE_NAMES = sorted(p.stem for p in (FIXTURES / "rules").glob("TPL*.py"))


def _lint(path: Path, code: str) -> list[str]:
    found = lint_bytes(path.read_bytes(), path.name, select={code}, resolve_module=False)
    return [finding.short() for finding in found]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_rule_matches_golden_output(name: str) -> None:
    source = FIXTURES / "rules" / f"{name}.py"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"  # TPL000 names its grammar
    text = (FIXTURES / "rules" / f"{name}.expected").read_text().replace("{python}", python)
    expected = text.splitlines()
    assert _lint(source, name.split("-")[0]) == expected


@pytest.mark.parametrize("name", [n for n in FIXTURE_NAMES if n != "TPL000"])
def test_fixture_marks_positive_and_negative_cases(name: str) -> None:
    """Lines marked ``# error`` are found, lines marked ``# ok`` are not, nothing else is."""
    code = name.split("-")[0]
    source = FIXTURES / "rules" / f"{name}.py"
    lines = source.read_text().splitlines()
    errors = {i for i, line in enumerate(lines, 1) if "# error" in line}
    oks = {i for i, line in enumerate(lines, 1) if "# ok" in line}
    if name == code:
        assert errors, f"{code} fixture has no positive case"
        assert oks, f"{code} fixture has no negative case"
    else:
        assert errors or oks, f"{name} fixture marks no case"
    flagged = {
        f.line
        for f in lint_bytes(source.read_bytes(), source.name, select={code}, resolve_module=False)
    }
    assert flagged == errors


@pytest.mark.parametrize("code", FIXED_CODES)
def test_fix_pair(code: str) -> None:
    before = FIXTURES / "fixes" / f"{code}.before.py"
    after = (FIXTURES / "fixes" / f"{code}.after.py").read_text()
    findings = lint_bytes(before.read_bytes(), before.name, select={code}, resolve_module=False)
    assert any(f.fix is not None for f in findings)
    fixed, count = apply_fixes(before.read_text(), findings)
    assert fixed == after
    assert count == sum(1 for f in findings if f.fix is not None)
    # The fixed file has nothing left to fix for this rule, and is still valid Python.
    compile(fixed, str(before), "exec")
    again = lint_bytes(fixed.encode(), before.name, select={code}, resolve_module=False)
    assert not [f for f in again if f.fix is not None]


def test_every_fixable_rule_has_a_fix_pair() -> None:
    pairs = {p.name.split(".")[0] for p in (FIXTURES / "fixes").glob("*.before.py")}
    assert pairs == set(FIXED_CODES)


def test_every_rule_has_a_fixture() -> None:
    assert {name for name in FIXTURE_NAMES if "-" not in name} == set(RULE_CODES)
    assert {name.split("-")[0] for name in FIXTURE_NAMES} == set(RULE_CODES)
