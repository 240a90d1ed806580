"""Which rules run where: ``--select``/``--ignore`` and ``[tool.torchplace.lint]``.

Codes expand by prefix, as in ruff: ``TPL2`` means every ``TPL2xx`` rule, ``ALL`` every rule.
Settings come from the nearest ``pyproject.toml`` (from the working directory upwards) that
has a ``[tool.torchplace.lint]`` table; command-line flags override it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchplace.errors import ConfigError
from torchplace.lint.rules import ALL_RULES

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

__all__ = ["Settings", "expand_codes", "find_pyproject", "load_settings"]

_KEYS = frozenset({"select", "ignore", "extend-select", "exclude", "per-file-ignores"})


def expand_codes(items: Iterable[str], *, origin: str) -> set[str]:
    """Expand codes and prefixes (``TPL2``, ``ALL``) into rule codes; unknown ones are errors."""
    out: set[str] = set()
    for raw in items:
        item = raw.strip().upper()
        if not item:
            continue
        if item == "ALL":
            out.update(ALL_RULES)
            continue
        matched = {code for code in ALL_RULES if code.startswith(item)}
        if not matched:
            known = ", ".join(ALL_RULES)
            raise ConfigError(
                f"{origin}: unknown rule code or prefix {raw!r}; known codes: {known} "
                "(a prefix such as 'TPL2' selects a family)"
            )
        out.update(matched)
    return out


def _some(chosen: set[str], origin: str, given: Sequence[str]) -> set[str]:
    """A selection that names no rule (``--select ""`` from an empty variable) would check
    nothing and pass everything: refused."""
    if not chosen:
        what = ", ".join(repr(g) for g in given) if given else "an empty value"
        raise ConfigError(
            f"{origin} was given {what}, which selects no rule; give codes or prefixes "
            "(TPL201, TPL2, ALL), or leave it out to run every rule"
        )
    return chosen


@dataclass(frozen=True)
class Settings:
    """The resolved configuration of one run."""

    select: frozenset[str] = frozenset(ALL_RULES)
    exclude: tuple[str, ...] = ()
    per_file_ignores: Mapping[str, frozenset[str]] = field(default_factory=dict)
    root: Path = field(default_factory=Path.cwd)

    def codes_for(self, relpath: str) -> frozenset[str]:
        """The codes that apply to a file (``per-file-ignores`` removed)."""
        if not self.per_file_ignores:
            return self.select
        codes = set(self.select)
        for pattern, ignored in self.per_file_ignores.items():
            if _pattern(pattern).match_file(relpath):
                codes -= ignored
        return frozenset(codes)


@lru_cache(maxsize=256)
def _pattern(pattern: str) -> GitIgnoreSpec:
    """One ``per-file-ignores`` pattern, compiled once (not once per file)."""
    from pathspec import GitIgnoreSpec

    return GitIgnoreSpec.from_lines([pattern])


def find_pyproject(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` with a ``[tool.torchplace.lint]`` table, upwards."""
    found = _nearest_table(start)
    return None if found is None else found[0]


def _nearest_table(start: Path) -> tuple[Path, dict[str, Any]] | None:
    for directory in [start, *start.parents]:
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            table = _table(candidate)
            if table is not None:
                return candidate, table
    return None


def _table(path: Path) -> dict[str, Any] | None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the TOML: {exc}") from exc
    table: Any = data
    for key, name in (("tool", "tool"), ("torchplace", "tool.torchplace")):
        table = table.get(key, {})
        if not isinstance(table, dict):
            raise ConfigError(
                f"{path}: {name} must be a table, not {table!r}; the settings go under "
                "[tool.torchplace.lint]"
            )
    table = table.get("lint")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.torchplace.lint] must be a table")
    return table


def _strings(value: Any, key: str, origin: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{origin}: {key} must be a list of strings, got {value!r}")
    return list(value)


def load_settings(
    *,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
    extend_select: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    start: Path | None = None,
    isolated: bool = False,
) -> Settings:
    """Merge ``pyproject.toml`` (unless ``isolated``) with command-line values."""
    start = (start or Path.cwd()).resolve()
    table: dict[str, Any] = {}
    root = start
    origin = "command line"
    if not isolated:
        found = _nearest_table(start)
        if found is not None:
            pyproject, table = found
            root = pyproject.parent
            origin = f"{pyproject} [tool.torchplace.lint]"
            unknown = set(table) - _KEYS
            if unknown:
                raise ConfigError(
                    f"{origin}: unknown key(s) {sorted(unknown)}; known: {sorted(_KEYS)}"
                )
    if select is not None:
        chosen = _some(expand_codes(select, origin="--select"), "--select", select)
    elif "select" in table:
        given = _strings(table["select"], "select", origin)
        chosen = _some(expand_codes(given, origin=origin), f"{origin}: select", given)
    else:
        chosen = set(ALL_RULES)
    if "extend-select" in table:
        chosen |= expand_codes(
            _strings(table["extend-select"], "extend-select", origin), origin=origin
        )
    if extend_select:
        chosen |= expand_codes(extend_select, origin="--extend-select")
    if "ignore" in table:
        chosen -= expand_codes(_strings(table["ignore"], "ignore", origin), origin=origin)
    if ignore:
        chosen -= expand_codes(ignore, origin="--ignore")
    excludes = list(_strings(table.get("exclude", []), "exclude", origin))
    if exclude:
        excludes.extend(exclude)
    per_file: dict[str, frozenset[str]] = {}
    raw_pfi = table.get("per-file-ignores", {})
    if not isinstance(raw_pfi, dict):
        raise ConfigError(f"{origin}: per-file-ignores must be a table of pattern = [codes]")
    for pattern, codes in raw_pfi.items():
        per_file[pattern] = frozenset(
            expand_codes(_strings(codes, f"per-file-ignores[{pattern!r}]", origin), origin=origin)
        )
    return Settings(
        select=frozenset(chosen), exclude=tuple(excludes), per_file_ignores=per_file, root=root
    )
