"""Every subpackage says, in its ``__init__`` docstring, what each of its modules is for."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import torchplace

_SOURCE = Path(torchplace.__file__).parent
#: torchplace and every subpackage, found on disk (a new one is checked without a list to edit)
PACKAGES = sorted(
    ".".join(("torchplace", *init.parent.relative_to(_SOURCE).parts))
    for init in _SOURCE.rglob("__init__.py")
)


@pytest.mark.parametrize("name", PACKAGES)
def test_init_docstring_names_every_module(name: str) -> None:
    package = importlib.import_module(name)
    assert package.__file__ is not None
    doc = package.__doc__ or ""
    modules = sorted(p.stem for p in Path(package.__file__).parent.glob("*.py"))
    missing = [
        m
        for m in modules
        if not m.startswith("_")  # __init__, and private helpers of generated code
        and f"``{m}``" not in doc
        and not re.search(rf":mod:`[~.\w]*\.{m}`", doc)
    ]
    assert missing == [], f"{name}.__init__ does not say what these modules are for: {missing}"
