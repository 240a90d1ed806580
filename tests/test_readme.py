"""The README's Python examples run as written (those that need a running server are run by
the serve tests' own tritonclient checks)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
LOCAL = [block for block in BLOCKS if "127.0.0.1" not in block]


def test_readme_has_examples() -> None:
    assert len(LOCAL) >= 3


@pytest.mark.parametrize("source", LOCAL, ids=[f"block{i}" for i in range(len(LOCAL))])
def test_readme_example_runs(source: str, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(source, str(README), "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out.strip()


def test_readme_names_every_public_name() -> None:
    """Each name of ``torchplace.__all__`` is written as code in the "Python API" section (a
    bare substring would let ``measure`` pass on "measured")."""
    import torchplace

    section = README.read_text().split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    code = " ".join(re.findall(r"`([^`]+)`", section))
    missing = [
        name
        for name in torchplace.__all__
        if name != "__version__" and not re.search(rf"(?<![\w.]){name}\b", code)
    ]
    assert missing == []
