"""Find the files, lint them (in parallel when there are many), collect the findings.

Directories are walked with ``.gitignore`` files respected (the ones inside the walked tree
and those above it up to the repository root) and the usual tool directories skipped. Files
named explicitly are always linted. A file that cannot be read is a ``TPL001`` finding.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from torchplace.lint.config import Settings
from torchplace.lint.engine import lint_bytes
from torchplace.lint.finding import Finding
from torchplace.lint.notebook import NOTEBOOK_SUFFIX, lint_notebook

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

__all__ = ["DEFAULT_EXCLUDES", "LintResult", "discover", "lint_paths"]

DEFAULT_EXCLUDES = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".bzr",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        ".eggs",
        "__pycache__",
        "node_modules",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        "site-packages",
        "__pypackages__",
        "build",
        "dist",
        ".ipynb_checkpoints",
    }
)
# Below this many files a process pool costs more than it saves.
_PARALLEL_MIN_FILES = 48


@dataclass
class LintResult:
    """Findings of a run, the files linted, and internal errors (file, message)."""

    findings: list[Finding] = field(default_factory=list)
    files: int = 0
    errors: list[tuple[str, str]] = field(default_factory=list)


class _Ignores:
    """``.gitignore`` specs by directory, plus ``exclude`` patterns from the settings."""

    def __init__(self, settings: Settings, *, stop: Path | None = None) -> None:
        from pathspec import GitIgnoreSpec

        self.stop = stop
        self.root = settings.root.resolve()
        self.exclude = GitIgnoreSpec.from_lines(settings.exclude) if settings.exclude else None
        self._specs: dict[Path, list[tuple[Path, GitIgnoreSpec]]] = {}

    def _own(self, directory: Path) -> list[tuple[Path, GitIgnoreSpec]]:
        from pathspec import GitIgnoreSpec

        gitignore = directory / ".gitignore"
        if not gitignore.is_file():
            return []
        try:
            lines = gitignore.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return []
        return [(directory, GitIgnoreSpec.from_lines(lines))]

    def specs(self, directory: Path) -> list[tuple[Path, GitIgnoreSpec]]:
        cached = self._specs.get(directory)
        if cached is not None:
            return cached
        parent = directory.parent
        inherited: list[tuple[Path, GitIgnoreSpec]] = []
        if parent != directory and directory != self.stop and not (directory / ".git").exists():
            inherited = self.specs(parent)
        result = inherited + self._own(directory)
        self._specs[directory] = result
        return result

    def ignored(self, path: Path, directory: Path, *, is_dir: bool) -> bool:
        suffix = "/" if is_dir else ""
        for base, spec in self.specs(directory):
            try:
                rel = path.relative_to(base).as_posix()
            except ValueError:
                continue
            if spec.match_file(rel + suffix):
                return True
        if self.exclude is not None:
            try:
                rel = path.relative_to(self.root).as_posix()
            except ValueError:
                rel = path.name
            if self.exclude.match_file(rel + suffix) or self.exclude.match_file(path.name + suffix):
                return True
        return False


#: how the worker processes start: from a clean server process where the platform has one
_START_METHOD = "forkserver" if sys.platform.startswith("linux") else "spawn"


def discover(paths: Sequence[str], settings: Settings) -> tuple[list[tuple[str, Path]], list[str]]:
    """``([(display path, absolute path)], [missing paths])`` for the given files and dirs."""
    found: list[tuple[str, Path]] = []
    missing: list[str] = []
    seen: set[Path] = set()
    ignores: _Ignores | None = None
    for given in paths:
        path = Path(given)
        try:
            absolute = path.resolve()
        except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13)
            found.append((given, path.absolute()))  # reading it reports why, as TPL001
            continue
        if absolute.is_file():
            if absolute not in seen:
                seen.add(absolute)
                found.append((given, absolute))
            continue
        if not absolute.is_dir():
            missing.append(given)  # or a FIFO, socket or device: read, it could block
            continue
        if ignores is None:
            ignores = _Ignores(settings)  # pathspec is only imported to walk a directory
        walk_ignores = ignores
        if ignores.ignored(absolute, absolute.parent, is_dir=True):
            # Named explicitly although ignored above it: honour only the rules inside it.
            walk_ignores = _Ignores(settings, stop=absolute)
        for dirpath, dirnames, filenames in os.walk(absolute):
            directory = Path(dirpath)
            keep = []
            for name in sorted(dirnames):
                if name in DEFAULT_EXCLUDES or name.endswith(".egg-info"):
                    continue
                if walk_ignores.ignored(directory / name, directory, is_dir=True):
                    continue
                keep.append(name)
            dirnames[:] = keep
            for name in sorted(filenames):
                if not name.endswith((".py", ".pyi", NOTEBOOK_SUFFIX)):
                    continue
                file = directory / name
                if file in seen or walk_ignores.ignored(file, directory, is_dir=False):
                    continue
                if file.exists() and not file.is_file():  # a FIFO would block the read
                    continue
                seen.add(file)
                rel = file.relative_to(absolute).as_posix()
                display = rel if given in {".", "./"} else f"{given.rstrip('/')}/{rel}"
                found.append((display, file))
    return found, missing


def _lint_one(display: str, path: str, codes: frozenset[str]) -> tuple[list[Finding], str | None]:
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        if "TPL001" not in codes:
            return [], None
        return [Finding(display, 1, 1, "TPL001", f"cannot read file: {exc.strerror or exc}")], None
    try:
        if path.endswith(NOTEBOOK_SUFFIX):
            return lint_notebook(raw, display, select=codes), None
        return lint_bytes(raw, display, select=codes), None
    except Exception as exc:  # an engine bug must not take the whole run down
        return [], f"{type(exc).__name__}: {exc}"


def _lint_chunk(
    jobs: list[tuple[str, str, frozenset[str]]],
) -> tuple[list[Finding], list[tuple[str, str]]]:
    findings: list[Finding] = []
    errors: list[tuple[str, str]] = []
    for display, path, codes in jobs:
        found, error = _lint_one(display, path, codes)
        findings.extend(found)
        if error is not None:
            errors.append((display, error))
    return findings, errors


def _chunks(
    items: list[tuple[str, str, frozenset[str]]], count: int
) -> Iterable[list[tuple[str, str, frozenset[str]]]]:
    size = max(1, -(-len(items) // count))
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _missing_words(given: str) -> str:
    if os.path.islink(given) and not os.path.exists(given):
        return "a symbolic link to a file that does not exist (or a loop of links)"
    if os.path.lexists(given):
        return "not a regular file or directory (a FIFO, socket or device is not read)"
    return "no such file or directory"


def lint_paths(
    paths: Sequence[str], settings: Settings | None = None, *, jobs: int | None = None
) -> LintResult:
    """Lint files and directories; ``jobs`` worker processes (default: CPU count)."""
    settings = settings or Settings()
    files, missing = discover(paths, settings)
    result = LintResult(files=len(files))
    for given in missing:
        if "TPL001" in settings.select:
            result.findings.append(Finding(given, 1, 1, "TPL001", _missing_words(given)))
    work: list[tuple[str, str, frozenset[str]]] = []
    root = settings.root
    for display, path in files:
        try:
            rel = path.relative_to(root).as_posix()
        except ValueError:
            rel = display
        work.append((display, str(path), settings.codes_for(rel)))
    # no more workers than files: `-j 60` on three files starts three
    workers = min(jobs if jobs is not None else (os.cpu_count() or 1), len(work))
    if workers > 1 and len(work) >= _PARALLEL_MIN_FILES:
        import multiprocessing  # only paid for when used
        from concurrent.futures import ProcessPoolExecutor

        # Workers start from a clean process, never a fork of this one: a fork of a process
        # with threads running (a notebook's kernel, a server, a test session) can hang.
        # Several chunks per worker so one slow file does not idle the others.
        context = multiprocessing.get_context(_START_METHOD)
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            for findings, errors in pool.map(_lint_chunk, _chunks(work, workers * 4)):
                result.findings.extend(findings)
                result.errors.extend(errors)
    else:
        findings, errors = _lint_chunk(work)
        result.findings.extend(findings)
        result.errors.extend(errors)
    result.findings.sort()
    return result
