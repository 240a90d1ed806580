"""docs/cli.md documents every option every command accepts (regenerate it with
scripts/cli-reference)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _reference_module():  # type: ignore[no-untyped-def]
    loader = importlib.machinery.SourceFileLoader(
        "cli_reference", str(ROOT / "scripts" / "cli-reference")
    )
    spec = importlib.util.spec_from_loader("cli_reference", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_cli_reference_lists_every_command_and_option() -> None:
    module = _reference_module()
    doc = (ROOT / "docs" / "cli.md").read_text()
    for prog, parser in module.parsers():
        assert f"## `{prog}`" in doc, f"{prog} missing from docs/cli.md: run scripts/cli-reference"
        section = doc.split(f"## `{prog}`", 1)[1].split("\n## ", 1)[0]
        for action in parser._actions:
            for flag in action.option_strings:
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", section), (
                    f"{prog} {flag} missing from docs/cli.md: run scripts/cli-reference"
                )


def test_the_convention_names_a_trailing_slash_as_a_usage_error() -> None:
    # was: not said; -o out/ is refused (exit 2) rather than writing the file out
    convention = _reference_module().convention()
    assert "`-o PATH/`" in convention
    assert convention in (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
