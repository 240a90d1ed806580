"""``torchplace lint``: find device-contract pitfalls in Python source, statically.

Pure :mod:`ast`; importing this package never imports torch. The public surface::

    from torchplace.lint import lint_source, lint_paths, ALL_RULES
    findings = lint_source("import torch\\nx = torch.load('m.pt')\\n")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ALL_RULES", "Finding", "Fix", "Rule", "lint_paths", "lint_source"]

if TYPE_CHECKING:
    from torchplace.lint.base import Rule
    from torchplace.lint.engine import lint_source
    from torchplace.lint.finding import Finding, Fix
    from torchplace.lint.rules import ALL_RULES
    from torchplace.lint.runner import lint_paths

_WHERE = {
    "ALL_RULES": "torchplace.lint.rules",
    "Finding": "torchplace.lint.finding",
    "Fix": "torchplace.lint.finding",
    "Rule": "torchplace.lint.base",
    "lint_paths": "torchplace.lint.runner",
    "lint_source": "torchplace.lint.engine",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'torchplace.lint' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
