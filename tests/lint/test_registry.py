"""The rule registry: unique codes, families, and documentation for every rule."""

from __future__ import annotations

import re
from pathlib import Path

from torchplace.lint.rules import ALL_RULES, FAMILIES

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules.md"
SECTIONS = ("What it does", "Why it matters", "Example", "Use instead", "Fix safety")


def test_codes_are_unique_and_well_formed() -> None:
    codes = [rule.code for family in FAMILIES for rule in family.rules]
    assert len(codes) == len(set(codes))
    assert all(re.fullmatch(r"TPL\d{3}", code) for code in codes)
    names = [rule.name for family in FAMILIES for rule in family.rules]
    assert len(names) == len(set(names))


def test_each_family_shares_one_hundreds_digit() -> None:
    for family in FAMILIES:
        assert len({rule.code[3] for rule in family.rules}) == 1, family.rules


def test_every_rule_is_documented_with_all_sections() -> None:
    text = DOCS.read_text(encoding="utf-8")
    headings = re.findall(r"^### (TPL\d{3}) ", text, flags=re.M)
    assert sorted(headings) == sorted(ALL_RULES)
    for code in ALL_RULES:
        start = text.index(f"### {code} ")
        end = text.find("\n### ", start + 1)
        section = text[start : end if end != -1 else len(text)]
        for title in SECTIONS:
            assert f"**{title}**" in section, f"{code} lacks '{title}'"


def test_precision_table_covers_every_rule() -> None:
    text = DOCS.read_text(encoding="utf-8")
    table = text[text.index("## Precision on real code") :]
    for code in ALL_RULES:
        if code in {"TPL000", "TPL001"}:
            continue
        assert f"| {code} " in table, code
