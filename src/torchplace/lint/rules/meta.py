"""TPL0xx: files the linter cannot read (reported as findings, never as crashes)."""

from __future__ import annotations

from torchplace.lint.base import Family, Rule

__all__ = ["FAMILY"]

SYNTAX_ERROR = Rule("TPL000", "syntax-error", "the file does not parse")
UNREADABLE = Rule("TPL001", "unreadable-file", "the file cannot be read or decoded")

FAMILY = Family(rules=(SYNTAX_ERROR, UNREADABLE), checks=(), triggers=())
