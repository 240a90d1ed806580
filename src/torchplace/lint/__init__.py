"""``torchplace lint``: find device-contract pitfalls in Python source and notebooks,
statically.

Pure :mod:`ast`; importing this package never imports torch. The public surface::

    from torchplace.lint import lint_source, lint_paths, ALL_RULES
    findings = lint_source("import torch\\nx = torch.load('m.pt')\\n")

What each module is for, from the command line down to a finding:

==============  ====================================================================================
``cli``         the ``torchplace lint`` flags, and running it from the command line
``config``      which rules run where: ``--select``/``--ignore`` and ``[tool.torchplace.lint]``
``runner``      finding the files, linting them (in parallel when there are many), the findings
``engine``      one file: parse once, walk once, dispatch each node to the selected rules' checks
``base``        the rule API: what a rule declares, and the context its checks read
``nodes``       fast walks over syntax trees, used by the rules instead of ``ast.walk``
``resolver``    which dotted name an expression refers to through the file's imports
``rules``       the rule families, one module each (``TPL<family><number>``)
``provenance``  where values live (device or host), which loops step through batches
``project``     what the file's project shows as a whole: whether any of its files pins memory
``sources``     reading the files around the one linted: regular files only, and up to a size
``finding``     what is reported: a :class:`Finding` at a place, with an optional :class:`Fix`
``fix``         applying the safe fixes of findings to source text
``notebook``    Jupyter notebooks: code cells linted as one module, findings placed by cell
``output``      the formats: ``text``, ``json`` (the report envelope), ``sarif`` and ``github``
==============  ====================================================================================
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
