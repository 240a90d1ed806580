"""What the linter reports: a :class:`Finding` at a place, with an optional :class:`Fix`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Edit", "Finding", "Fix"]


@dataclass(frozen=True)
class Edit:
    """Replace the text between two (1-based line, 0-based UTF-8 byte column) positions."""

    line: int
    col: int
    end_line: int
    end_col: int
    text: str


@dataclass(frozen=True)
class Fix:
    """A set of non-overlapping edits that resolve one finding, and what they do."""

    description: str
    edits: tuple[Edit, ...]


@dataclass(frozen=True, order=True)
class Finding:
    """One rule violation. ``line`` and ``col`` are 1-based; ``col`` counts characters. In a
    notebook, ``cell`` is the cell's 1-based position and ``line`` the line in that cell
    (``cell`` is 0 elsewhere)."""

    path: str
    cell: int = field(default=0, kw_only=True)
    line: int
    col: int
    code: str
    message: str
    end_line: int = field(default=0, compare=False)
    end_col: int = field(default=0, compare=False)
    fix: Fix | None = field(default=None, compare=False)

    @property
    def place(self) -> str:
        """``path:line:col``, or ``path:cell N:line:col`` in a notebook."""
        cell = f"cell {self.cell}:" if self.cell else ""
        return f"{self.path}:{cell}{self.line}:{self.col}"

    def short(self) -> str:
        """``line:col CODE message``, the form the golden files use."""
        return f"{self.line}:{self.col} {self.code} {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping (the shape of ``--format json``)."""
        return {
            "code": self.code,
            "message": self.message,
            "filename": self.path,
            "cell": self.cell or None,
            "location": {"row": self.line, "column": self.col},
            "end_location": {"row": self.end_line or self.line, "column": self.end_col or self.col},
            "fix": None
            if self.fix is None
            else {
                "message": self.fix.description,
                "applicability": "safe",
                "edits": [
                    {
                        "location": {"row": e.line, "byte_column": e.col},
                        "end_location": {"row": e.end_line, "byte_column": e.end_col},
                        "content": e.text,
                    }
                    for e in self.fix.edits
                ],
            },
        }
