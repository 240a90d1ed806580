"""Apply the safe fixes of findings to source text."""

from __future__ import annotations

import codecs
import re
import tokenize
from collections.abc import Iterable
from io import BytesIO

from torchplace.lint.finding import Edit, Finding

__all__ = ["apply_fixes", "fix_file_bytes"]

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


def _encoding(raw: bytes) -> str:
    """The codec the linter read ``raw`` with: UTF-8 after a BOM, UTF-8 when the bytes are,
    else the file's PEP 263 cookie."""
    if raw.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return tokenize.detect_encoding(BytesIO(raw).readline)[0]
    return "utf-8"


def fix_file_bytes(raw: bytes, findings: Iterable[Finding]) -> tuple[bytes, int]:
    """A Python file's bytes with the fixes applied, written back in the file's own encoding
    (a BOM, a ``# -*- coding: latin-1 -*-`` cookie kept), and how many were applied; the bytes
    unchanged (0) when they do not decode, or the fixed text does not encode, losslessly."""
    try:
        encoding = _encoding(raw)
        source = raw.decode(encoding)
        if source.encode(encoding) != raw:
            return raw, 0
    except (SyntaxError, LookupError, UnicodeError):
        return raw, 0
    fixed, count = apply_fixes(source, findings)
    if not count or fixed == source:
        return raw, 0
    try:
        return fixed.encode(encoding), count
    except UnicodeError:
        return raw, 0
