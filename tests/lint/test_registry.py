"""The rule registry: unique codes, families, and documentation for every rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


def test_precision_recall_table_covers_every_rule() -> None:
    text = DOCS.read_text(encoding="utf-8")
    table = text[text.index("## Precision and recall on real code") :]
    assert "| rule | real pitfalls | found | recall |" in table
    for code in ALL_RULES:
        if code in {"TPL000", "TPL001"}:
            continue
        assert f"| {code} " in table, code


def test_python_api_example_runs_and_names_every_public_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torchplace.lint

    section = DOCS.read_text(encoding="utf-8").split("\n## From Python\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    (tmp_path / "train.py").write_text("import torch\nm = torch.load('m.pt')\n")
    monkeypatch.chdir(tmp_path)
    [example] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    exec(compile(example, str(DOCS), "exec"), {"__name__": "docs"})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("model.py 2 9 TPL401 ")
    assert lines[1:] == ["load-without-map-location", "1 2"]
    for name in torchplace.lint.__all__:
        assert f"`{name}" in section, name
