"""Find device-contract pitfalls in Python source and notebooks, statically (no torch import, no GPU).

The report goes to stdout (or ``-o PATH``) as text, JSON (``--json``), SARIF or GitHub
annotations. Exit status: 0 no findings, 1 findings, 2 usage or internal error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path

from torchplace import __version__, report
from torchplace.errors import ConfigError
from torchplace.lint.config import load_settings
from torchplace.lint.finding import Finding
from torchplace.lint.fix import fix_file_bytes
from torchplace.lint.notebook import NOTEBOOK_SUFFIX, fix_notebook
from torchplace.lint.output import FORMATS, format_findings, format_statistics
from torchplace.lint.rules import ALL_RULES
from torchplace.lint.runner import lint_paths

__all__ = ["configure", "run"]


def _codes(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    return [code for value in values for code in value.split(",") if code.strip()]


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare the ``torchplace lint`` arguments."""
    parser.epilog = (
        "Codes expand by prefix: --select TPL2 runs every TPL2xx rule. Silence one line with "
        "'# noqa' or '# noqa: TPL101'. Settings are read from [tool.torchplace.lint] in the "
        "nearest pyproject.toml (select, ignore, extend-select, exclude, per-file-ignores)."
    )
    parser.add_argument(
        "paths",
        nargs="*",
        default=["."],
        metavar="PATH",
        help="files or directories (default: .): Python files and Jupyter notebooks (.ipynb)",
    )
    parser.add_argument(
        "--select",
        action="append",
        metavar="CODES",
        help="comma-separated codes or prefixes to run",
    )
    parser.add_argument(
        "--ignore",
        action="append",
        metavar="CODES",
        help="comma-separated codes or prefixes to skip",
    )
    parser.add_argument(
        "--extend-select", action="append", metavar="CODES", help="add codes to the selection"
    )
    parser.add_argument(
        "--exclude", action="append", metavar="PATTERN", help="gitignore-style pattern to skip"
    )
    parser.add_argument("--fix", action="store_true", help="apply the fixes marked safe")
    parser.add_argument(
        "--statistics",
        action="store_true",
        help="print the number of findings per rule instead of the findings; with --json, "
        "add them to the report (result.statistics)",
    )
    parser.add_argument(
        "-j", "--jobs", type=int, default=None, metavar="N", help="worker processes (default: CPUs)"
    )
    parser.add_argument(
        "--exit-zero", action="store_true", help="exit 0 even when there are findings"
    )
    parser.add_argument("--isolated", action="store_true", help="ignore pyproject.toml settings")
    parser.add_argument("--list-rules", action="store_true", help="list the rules and exit")
    report.add_output_options(parser, formats=FORMATS)


def _apply_fixes(findings: list[Finding]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Fix files in place; return (fixes applied per file changed, files that could not be
    read or written back, with why): one such file leaves the others fixed."""
    by_file: dict[str, list[Finding]] = defaultdict(list)
    for finding in findings:
        if finding.fix is not None:
            by_file[finding.path].append(finding)
    changed: dict[str, int] = {}
    failed: list[tuple[str, str]] = []
    for path, file_findings in by_file.items():
        try:
            raw = Path(path).read_bytes()
            if path.endswith(NOTEBOOK_SUFFIX):
                fixed, count = fix_notebook(raw, file_findings)
            else:
                fixed, count = fix_file_bytes(raw, file_findings)
            if count and fixed != raw:
                Path(path).write_bytes(fixed)
                changed[path] = count
        except OSError as exc:
            failed.append((path, exc.strerror or str(exc)))
    return changed, failed


def _linted_files(paths: list[str], output: str | None) -> list[str]:
    """The files given to lint, and ``output`` itself when it is an existing source file or
    notebook under a folder given to lint: a report there would overwrite what it reports on."""
    files = [p for p in paths if os.path.isfile(p)]
    if not output:
        return files
    target = Path(output).resolve()  # a symbolic link is written through: where it leads counts
    linted = target.name.endswith((".py", ".pyi", NOTEBOOK_SUFFIX)) and target.is_file()
    if linted and any(target.is_relative_to(Path(p).resolve()) for p in paths if os.path.isdir(p)):
        files.append(str(target))
    return files


def _list_rules(args: argparse.Namespace) -> int:
    """``--list-rules``: a text listing, written where ``-o`` says; it has no JSON, SARIF or
    GitHub form (no report schema describes it), so another ``--format`` is a usage error
    rather than text where a program expects JSON."""
    if args.format != "text":
        raise ConfigError(
            f"--list-rules prints a text listing and has no {args.format} form; drop "
            + ("--json (or --format json)" if args.format == "json" else f"--format {args.format}")
        )
    report.check_output(args.output)
    report.check_stdout(args.output)
    lines = []
    for rule in ALL_RULES.values():
        mark = " [*]" if rule.fix == "safe" else ""
        lines.append(f"{rule.code}  {rule.name:<28} {rule.summary}{mark}\n")
    report.write_report("".join(lines), args.output)
    return report.EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Lint the paths; print the findings; return the exit status."""
    if args.list_rules:
        return _list_rules(args)
    report.check_output(args.output)
    report.check_distinct([args.output], _linted_files(args.paths, args.output))
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {args.jobs}")
    if "" in args.paths:  # `torchplace lint "$SRC"` with SRC unset
        raise ConfigError(
            "an empty path was given (an unset variable?); name a file or folder, or '.' for "
            "the current one"
        )
    settings = load_settings(
        select=_codes(args.select),
        ignore=_codes(args.ignore),
        extend_select=_codes(args.extend_select),
        exclude=args.exclude,
        isolated=args.isolated,
    )
    result = lint_paths(args.paths, settings, jobs=args.jobs)
    findings = result.findings
    fixed: dict[str, int] | None = None
    failed: list[tuple[str, str]] = []
    if args.fix:
        fixed, failed = _apply_fixes(findings)
        if fixed:  # what is left in the fixed files
            again = lint_paths(sorted(fixed), settings, jobs=args.jobs)
            findings = sorted([f for f in findings if f.path not in fixed] + again.findings)
            result.errors.extend(again.errors)
        print(f"Fixed {sum(fixed.values())} finding(s) in {len(fixed)} file(s).", file=sys.stderr)
    if args.statistics and args.format == "text":
        text = format_statistics(findings)
    else:
        text = format_findings(
            findings,
            args.format,
            files=result.files,
            version=__version__,
            errors=result.errors,
            fixed=fixed,
            statistics=args.statistics,
        )
    if text or args.output is not None:
        report.write_report(text + "\n" if text else "", args.output)
    for path, message in failed:
        print(
            f"torchplace lint: cannot fix {path}: {message}; its findings are reported as they "
            "were (make the file writable and run --fix again)",
            file=sys.stderr,
        )
    for path, message in result.errors:
        print(f"torchplace lint: internal error on {path}: {message}", file=sys.stderr)
    if result.errors:
        return report.EXIT_USAGE
    if failed:
        return report.EXIT_FAILED
    if findings and not args.exit_zero:
        return report.EXIT_FAILED
    return report.EXIT_OK
