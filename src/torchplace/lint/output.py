"""Output formats: ``text`` (ruff-like), ``json`` (the report envelope of every torchplace
command, schema ``lint.v1.json``), ``sarif`` (2.1.0) and ``github`` annotations."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence

from torchplace import report
from torchplace.errors import ConfigError
from torchplace.lint.finding import Finding
from torchplace.lint.rules import ALL_RULES

__all__ = ["FORMATS", "format_findings", "format_statistics"]

FORMATS = ("text", "json", "sarif", "github")
_SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def _text(findings: Sequence[Finding], files: int) -> str:
    lines = [f"{f.place}: {f.code}{' [*]' if f.fix else ''} {f.message}" for f in findings]
    if findings:
        fixable = sum(1 for f in findings if f.fix is not None)
        noun = "finding" if len(findings) == 1 else "findings"
        lines.append(f"Found {len(findings)} {noun} in {files} file(s).")
        if fixable:
            lines.append(f"[*] {fixable} fixable with the `--fix` option.")
    else:
        lines.append(f"All checks passed ({files} file(s)).")
    return "\n".join(lines)


def _in_cell(finding: Finding) -> str:
    """Where a notebook's finding is, for the formats whose lines are the file's: its cell and
    the line in it; nothing elsewhere."""
    return f" (cell {finding.cell}, line {finding.line})" if finding.cell else ""


def _physical(finding: Finding) -> dict[str, object]:
    """A SARIF physical location: the file, and the region but in a notebook (whose lines are
    its JSON's: the cell and its line are in the message instead)."""
    where: dict[str, object] = {"artifactLocation": {"uri": finding.path.replace("\\", "/")}}
    if not finding.cell:
        where["region"] = {
            "startLine": finding.line,
            "startColumn": finding.col,
            "endLine": finding.end_line or finding.line,
            "endColumn": finding.end_col or finding.col,
        }
    return where


def _sarif(findings: Sequence[Finding], version: str) -> str:
    rules = [
        {
            "id": rule.code,
            "name": rule.name,
            "shortDescription": {"text": rule.summary},
            "properties": {"fixable": rule.fix == "safe"},
        }
        for rule in ALL_RULES.values()
    ]
    index = {code: i for i, code in enumerate(ALL_RULES)}
    results = [
        {
            "ruleId": f.code,
            "ruleIndex": index[f.code],
            "level": "error",
            "message": {"text": f.message + _in_cell(f)},
            "locations": [{"physicalLocation": _physical(f)}],
        }
        for f in findings
    ]
    document = {
        "$schema": _SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "torchplace-lint",
                        "version": version,
                        "rules": rules,
                    }
                },
                "results": results,
            }
        ],
    }
    return json.dumps(document, indent=2)


def _github_escape(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _github_property(text: str) -> str:
    """A property value: ``,`` would end it and ``:`` (as ``::``) the properties."""
    return _github_escape(text).replace(":", "%3A").replace(",", "%2C")


def _github(findings: Sequence[Finding]) -> str:
    return "\n".join(
        f"::error title=torchplace ({f.code}),file={_github_property(f.path)}{_github_lines(f)}::"
        f"{_github_escape(f'{f.code} {f.message}{_in_cell(f)}')}"
        for f in findings
    )


def _github_lines(finding: Finding) -> str:
    """The annotation's lines, but in a notebook (its lines are its JSON's): file-level there."""
    if finding.cell:
        return ""
    return (
        f",line={finding.line},col={finding.col},endLine={finding.end_line or finding.line},"
        f"endColumn={finding.end_col or finding.col}"
    )


def _json(
    findings: Sequence[Finding],
    files: int,
    errors: Sequence[tuple[str, str]],
    fixed: Mapping[str, int] | None,
    statistics: bool,
) -> str:
    result: dict[str, object] = {
        "files": files,
        "findings": [f.to_dict() for f in findings],
        "errors": [{"path": path, "message": message} for path, message in errors],
    }
    if fixed is not None:  # a --fix run: the files it changed and how many fixes each took
        result["fixed"] = [{"path": path, "count": count} for path, count in sorted(fixed.items())]
    if statistics:  # --statistics: the text mode's lines, as data
        result["statistics"] = [
            {"code": code, "name": ALL_RULES[code].name, "count": count, "fixable": fixable}
            for code, count, fixable in _statistics(findings)
        ]
    return report.to_json(report.envelope("lint", result)).rstrip("\n")


def format_findings(
    findings: Sequence[Finding],
    fmt: str,
    *,
    files: int = 0,
    version: str = "0",
    errors: Sequence[tuple[str, str]] = (),
    fixed: Mapping[str, int] | None = None,
    statistics: bool = False,
) -> str:
    """Render findings in one of :data:`FORMATS` (``errors``: files the linter could not read;
    ``fixed``: after ``--fix``, the fixes applied per file, listed in JSON; ``statistics``:
    the findings per rule, as :func:`format_statistics` counts them, added to JSON's
    ``result``)."""
    if fmt == "text":
        return _text(findings, files)
    if fmt == "json":
        return _json(findings, files, errors, fixed, statistics)
    if fmt == "sarif":
        return _sarif(findings, version)
    if fmt == "github":
        return _github(findings)
    raise ConfigError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")


def _statistics(findings: Sequence[Finding]) -> list[tuple[str, int, bool]]:
    """``(code, findings, whether one of them is fixable)`` per code, most frequent first."""
    counts = Counter(f.code for f in findings)
    fixable = {f.code for f in findings if f.fix is not None}
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [(code, count, code in fixable) for code, count in ranked]


def format_statistics(findings: Sequence[Finding]) -> str:
    """One line per code: count, code, fixable mark, rule name (most frequent first)."""
    rows = _statistics(findings)
    width = max((len(str(count)) for _, count, _ in rows), default=1)
    return "\n".join(
        f"{count:>{width}}\t{code}\t{'[*] ' if fixable else ''}{ALL_RULES[code].name}"
        for code, count, fixable in rows
    )
