"""Every subpackage says, in its ``__init__`` docstring, what each of its modules is for."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

PACKAGES = [
    "torchplace.bench",
    "torchplace.devices",
    "torchplace.placement",
    "torchplace.prefetch",
    "torchplace.sanitizer",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_init_docstring_names_every_module(name: str) -> None:
    package = importlib.import_module(name)
    assert package.__file__ is not None
    doc = package.__doc__ or ""
    modules = sorted(p.stem for p in Path(package.__file__).parent.glob("*.py"))
    missing = [m for m in modules if m != "__init__" and f"``{m}``" not in doc]
    assert missing == [], f"{name}.__init__ does not say what these modules are for: {missing}"
