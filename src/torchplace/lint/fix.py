"""Apply the safe fixes of findings to source text."""

from __future__ import annotations

import re
from collections.abc import Iterable

from torchplace.lint.finding import Edit, Finding

__all__ = ["apply_fixes"]

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)?")


def _offsets(source: str) -> tuple[list[int], list[str]]:
    starts: list[int] = []
    lines: list[str] = []
    for match in _LINE.finditer(source):
        if match.start() == len(source) and starts:
            break
        starts.append(match.start())
        lines.append(match.group())
    return starts, lines


def _position(edit_line: int, byte_col: int, starts: list[int], lines: list[str]) -> int:
    text = lines[edit_line - 1]
    if text.isascii():
        col = byte_col
    else:
        col = len(text.encode("utf-8")[:byte_col].decode("utf-8", "replace"))
    return starts[edit_line - 1] + col


def apply_fixes(source: str, findings: Iterable[Finding]) -> tuple[str, int]:
    """``(new source, number of findings fixed)``; overlapping fixes wait for the next run."""
    starts, lines = _offsets(source)
    planned: list[tuple[int, int, list[tuple[int, int, str]]]] = []
    for finding in findings:
        if finding.fix is None:
            continue
        spans = [
            (
                _position(e.line, e.col, starts, lines),
                _position(e.end_line, e.end_col, starts, lines),
                e.text,
            )
            for e in finding.fix.edits
            if _valid(e, lines)
        ]
        if len(spans) != len(finding.fix.edits) or not spans:
            continue
        planned.append((min(s for s, _, _ in spans), max(e for _, e, _ in spans), spans))
    planned.sort(key=lambda item: (item[0], item[1]))
    accepted: list[tuple[int, int, list[tuple[int, int, str]]]] = []
    last_end = -1
    for start, end, spans in planned:
        if start < last_end or (accepted and start == accepted[-1][0] and start == end):
            continue  # overlaps an earlier fix
        accepted.append((start, end, spans))
        last_end = max(end, start + 1)
    edits = sorted((span for _, _, spans in accepted for span in spans), reverse=True)
    out = source
    for start, end, text in edits:
        out = out[:start] + text + out[end:]
    return out, len(accepted)


def _valid(edit: Edit, lines: list[str]) -> bool:
    return 1 <= edit.line <= len(lines) and 1 <= edit.end_line <= len(lines)
