"""TPL403 behind a call: a constructor or helper of the linted tree that loads a model."""

from __future__ import annotations

import os
from pathlib import Path

from torchplace.lint import lint_paths

HELPER = """\
import torch


class Restorer:
    def __init__(self, path):
        self.net = torch.load(path, map_location="cpu", weights_only=True)


def get_checkers(enabled):
    return [Restorer("guard.pt")] if enabled else []
"""

SCRIPT = """\
from pkg.helpers import get_checkers
from pkg import Restorer


def main(dialogs, enabled):
    for dialog in dialogs:
        checkers = get_checkers(enabled)
        restorer = Restorer("face.pt")
        print(dialog, checkers, restorer)
"""


def _lint(root: Path, *paths: str) -> list[tuple[str, int]]:
    here = Path.cwd()
    os.chdir(root)
    try:
        result = lint_paths(list(paths), jobs=1)
    finally:
        os.chdir(here)
    return sorted((Path(f.path).name, f.line) for f in result.findings if f.code == "TPL403")


def test_loads_behind_helpers_of_a_src_layout_package_and_a_star_reexport(tmp_path: Path) -> None:
    package = tmp_path / "src" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from .helpers import *\n")
    (package / "helpers.py").write_text(HELPER)
    scripts = tmp_path / "examples" / "chat"
    scripts.mkdir(parents=True)
    (scripts / "run.py").write_text(SCRIPT)
    assert _lint(tmp_path, "examples", "src") == [("run.py", 7), ("run.py", 8)]


def test_calls_of_code_outside_the_tree_are_not_followed(tmp_path: Path) -> None:
    (tmp_path / "run.py").write_text(SCRIPT)  # pkg is not in the tree: nothing to read
    assert _lint(tmp_path, "run.py") == []
