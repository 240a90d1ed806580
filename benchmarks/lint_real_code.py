"""torchplace lint on real code: precision and recall against the hand-labelled corpus.

Every ``benchmarks/lint_corpus/OWNER__NAME.toml`` names a public repository, a pinned commit, the
paths to lint and labelled locations: ``pitfall`` rows (the rule should report that line) and
``clean`` rows (look-alikes the rule must not report). The sources are fetched at the pinned
commit into a cache outside this repository (``scripts/lint-corpus-fetch`` does only that step),
linted with the torchplace installed for the running interpreter, and scored:

- TP: a pitfall row reported (same path, line and rule, and in a notebook the same cell);
  FN: a pitfall row not reported; FP: a clean row reported. Precision = TP / (TP + FP),
  recall = TP / (TP + FN).
- Per rule, overall, and apart for ``scope = "local"`` (decidable inside one function) and
  ``scope = "cross"`` (needs another function or file) rows.
- Findings on unlabelled lines are counted and listed for review, never scored.

A row on a Jupyter notebook (``.ipynb``) names its cell as ``torchplace lint`` reports it
(``cell``: the 1-based position among all cells, markdown ones too) and ``line`` is the line in
that cell; a notebook row without a cell, or a cell on any other file, breaks the format.

Targets (``--check`` exits 1 when one fails): overall precision >= 90%, recall >= 75% on local
rows, recall >= 60% for every rule with at least 5 pitfall rows, recall >= 50% on cross rows.
Without ``--check`` the exit status is 0 whatever the scores; a label file that breaks the
format is a usage error (exit 2) naming the file and the field.

Sources come from ``https://github.com/OWNER/NAME`` by ``git fetch``, or from a local bare
repository per project with ``--git-dir-template '/mirrors/{owner}/{name}.git'``. The cache is
``~/.cache/torchplace/lint-corpus`` unless ``--cache DIR`` or ``TORCHPLACE_LINT_CORPUS`` says
otherwise. No GPU is involved: ``--device`` is accepted for a uniform benchmark interface.

``--quick`` (used by ``make bench ARGS=--quick``) fetches nothing: it scores the repositories at
hand (in the cache at their commit, or borrowed from a local repository named by
``--git-dir-template``) within a time budget of 45 s, prints one SKIP line with the reason for
the rest, and checks the label files' format all the same. The targets are judged only when the
whole corpus was scored; for a part of it they are INFO lines, and ``--check`` fails on none.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the package depends on tomli there
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

CORPUS = Path(__file__).resolve().parent / "lint_corpus"
DEFAULT_CACHE = Path("~/.cache/torchplace/lint-corpus")
GITHUB = "https://github.com/{owner}/{name}"
KINDS = ("training", "inference", "server", "distributed", "library")
VERDICTS = ("pitfall", "clean")
SCOPES = ("local", "cross")
NOTEBOOK_SUFFIX = ".ipynb"
_SOURCE_LINE = re.compile(r"[^\n]*\n|[^\n]+")  # a line of a cell, as nbformat splits them
MIN_PRECISION = 0.90
MIN_LOCAL_RECALL = 0.75
MIN_RULE_RECALL = 0.60
MIN_RULE_PITFALLS = 5
MIN_CROSS_RECALL = 0.50
GIT_TIMEOUT_S = 600.0
QUICK_BUDGET_S = 45.0  # for finding and linting sources under --quick
NOT_AT_HAND = (
    "--quick fetches nothing: fill the cache with scripts/lint-corpus-fetch, or pass "
    "--git-dir-template with a local repository per project"
)
# Kept out of the corpus on purpose: a held-out measure of the rules.
HELD_OUT = frozenset(
    {
        "karpathy/nanogpt",
        "karpathy/mingpt",
        "pytorch/examples",
        "eriklindernoren/pytorch-gan",
        "lucidrains/denoising-diffusion-pytorch",
        "openai/whisper",
        "facebookresearch/detr",
        "pytorch/serve",
    }
)


class CorpusError(Exception):
    """A label file that does not follow the format; the message names the file and the field."""


#: a finding, or a row's place and rule: ``(path, cell, line, rule)``, ``cell`` 0 outside notebooks
Found = tuple[str, int, int, str]


def _place(path: str, cell: int, line: int) -> str:
    return f"{path}:cell {cell}:{line}" if cell else f"{path}:{line}"


@dataclass(frozen=True)
class Label:
    path: str
    line: int
    rule: str
    verdict: str
    scope: str
    reason: str
    cell: int = 0  # in a notebook: the 1-based cell, every cell counted; 0 elsewhere

    @property
    def key(self) -> Found:
        return (self.path, self.cell, self.line, self.rule)

    @property
    def place(self) -> str:
        """``path:line``, or ``path:cell N:line`` in a notebook (as ``torchplace lint`` says)."""
        return _place(self.path, self.cell, self.line)


@dataclass(frozen=True)
class Project:
    repo: str
    commit: str
    kind: str
    paths: tuple[str, ...]
    labels: tuple[Label, ...]
    source: Path  # the label file

    @property
    def slug(self) -> str:
        return self.repo.replace("/", "__")


@dataclass
class Tally:
    tp: int = 0
    fn: int = 0
    fp: int = 0
    tn: int = 0

    @property
    def pitfalls(self) -> int:
        return self.tp + self.fn

    @property
    def cleans(self) -> int:
        return self.fp + self.tn

    @property
    def precision(self) -> float | None:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        return self.tp / self.pitfalls if self.pitfalls else None

    def add(self, label: Label, reported: bool) -> None:
        if label.verdict == "pitfall":
            if reported:
                self.tp += 1
            else:
                self.fn += 1
        elif reported:
            self.fp += 1
        else:
            self.tn += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "fn": self.fn,
            "fp": self.fp,
            "tn": self.tn,
            "precision": self.precision,
            "recall": self.recall,
        }


@dataclass
class Score:
    by_rule: dict[str, Tally] = field(default_factory=dict)
    by_scope: dict[str, Tally] = field(default_factory=dict)
    by_repo: dict[str, Tally] = field(default_factory=dict)
    overall: Tally = field(default_factory=Tally)
    misses: list[tuple[str, Label]] = field(default_factory=list)  # FN rows
    false_alarms: list[tuple[str, Label]] = field(default_factory=list)  # FP rows
    unlabelled: list[tuple[str, Found]] = field(default_factory=list)  # (repo, finding)


# ---------------------------------------------------------------- label files


def _field(table: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = table.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CorpusError(f"{where}: {key!r} must be a {kind.__name__}, got {value!r}")
    return value


def _choice(table: dict[str, Any], key: str, allowed: Sequence[str], where: str) -> str:
    value = _field(table, key, str, where)
    if value not in allowed:
        raise CorpusError(f"{where}: {key} = {value!r}; use one of {', '.join(allowed)}")
    return str(value)


def load_project(path: Path) -> Project:
    """Read and validate one label file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CorpusError(f"{path}: {exc}") from exc
    repo = _field(data, "repo", str, str(path))
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", repo):
        raise CorpusError(f"{path}: repo = {repo!r} is not 'owner/name'")
    if repo.lower() in HELD_OUT:
        raise CorpusError(f"{path}: {repo} is held out of the corpus; label another repository")
    if path.stem != repo.replace("/", "__"):
        raise CorpusError(
            f"{path}: the file of repo {repo!r} must be named {repo.replace('/', '__')}.toml"
        )
    commit = _field(data, "commit", str, str(path))
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise CorpusError(f"{path}: commit = {commit!r} is not a 40-hex commit id")
    kind = _choice(data, "kind", KINDS, str(path))
    paths = _field(data, "paths", list, str(path))
    if not paths or not all(isinstance(p, str) and p for p in paths):
        raise CorpusError(f"{path}: paths must be a non-empty list of file or folder names")
    labels: list[Label] = []
    seen: set[Found] = set()
    for index, row in enumerate(data.get("label", []), start=1):
        where = f"{path}: label {index}"
        label = Label(
            path=_field(row, "path", str, where),
            line=_field(row, "line", int, where),
            rule=_field(row, "rule", str, where),
            verdict=_choice(row, "verdict", VERDICTS, where),
            scope=_choice(row, "scope", SCOPES, where),
            reason=_field(row, "reason", str, where).strip(),
            cell=_field(row, "cell", int, where) if "cell" in row else 0,
        )
        notebook = label.path.endswith(NOTEBOOK_SUFFIX)
        if notebook and "cell" not in row:
            raise CorpusError(
                f"{where}: {label.path} is a notebook: name the cell as well as the line "
                "(cell = N, the 1-based position among all cells, markdown ones too, as "
                "`torchplace lint` reports it; line = the line in that cell)"
            )
        if not notebook and "cell" in row:
            raise CorpusError(
                f"{where}: cell = {label.cell} on {label.path}, which is not a notebook "
                f"({NOTEBOOK_SUFFIX}); only a notebook's rows name a cell"
            )
        if notebook and label.cell < 1:
            raise CorpusError(f"{where}: cell = {label.cell}; cells are 1-based")
        if label.line < 1:
            raise CorpusError(f"{where}: line = {label.line}; lines are 1-based")
        if not re.fullmatch(r"TPL\d{3}", label.rule):
            raise CorpusError(f"{where}: rule = {label.rule!r} is not a code like 'TPL201'")
        if not label.reason:
            raise CorpusError(f"{where}: reason is empty; say in one line why")
        if label.key in seen:
            raise CorpusError(f"{where}: {label.place} {label.rule} is labelled twice")
        seen.add(label.key)
        labels.append(label)
    return Project(repo, commit, kind, tuple(paths), tuple(labels), path)


def load_corpus(directory: Path) -> list[Project]:
    files = sorted(directory.glob("*.toml"))
    if not files:
        raise CorpusError(f"{directory}: no label files (*.toml)")
    return [load_project(p) for p in files]


# ---------------------------------------------------------------- sources


def _git(args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S
    )


def _objects(origin: str) -> Path | None:
    """The object folder of a local git repository (bare or not), or None for a URL."""
    path = Path(origin).expanduser()
    for candidate in (path / "objects", path / ".git" / "objects"):
        if candidate.is_dir():
            return candidate.resolve()
    return None


def _checked_out(project: Project, cache: Path) -> Path | None:
    """The project's checkout in ``cache`` when it is at its commit with every path, else None."""
    dest = cache / project.slug
    if (dest / ".git").exists():
        head = _git(["rev-parse", "HEAD"], dest)
        on_commit = head.returncode == 0 and head.stdout.strip() == project.commit
        if on_commit and all((dest / p).exists() for p in project.paths):
            return dest
    return None


def _origin(project: Project, git_dir_template: str | None) -> str:
    owner, name = project.repo.split("/")
    return (git_dir_template or GITHUB).format(owner=owner, name=name)


def fetch(project: Project, cache: Path, git_dir_template: str | None) -> Path:
    """The project's linted paths at its pinned commit under ``cache``; fetched when missing.

    Only ``paths`` are checked out (a sparse checkout), so large files elsewhere in the history
    are never needed. A local repository is borrowed through git's alternates, not copied.
    """
    found = _checked_out(project, cache)
    if found is not None:
        return found
    dest = cache / project.slug
    origin = _origin(project, git_dir_template)
    dest.mkdir(parents=True, exist_ok=True)
    steps = [["init", "--quiet"]]
    objects = _objects(origin)
    if objects is None:
        steps += [
            ["config", "remote.origin.url", origin],
            ["config", "remote.origin.promisor", "true"],
            ["config", "remote.origin.partialclonefilter", "blob:none"],
            ["fetch", "--quiet", "--filter=blob:none", "--depth", "1", "origin", project.commit],
        ]
    else:
        alternates = dest / ".git" / "objects" / "info" / "alternates"
        alternates.parent.mkdir(parents=True, exist_ok=True)
        alternates.write_text(f"{objects}\n", encoding="utf-8")
    steps += [
        ["sparse-checkout", "set", "--no-cone", *(f"/{p.strip('/')}" for p in project.paths)],
        ["checkout", "--quiet", "--force", "--detach", project.commit],
    ]
    for step in steps:
        done = _git(step, dest)
        if done.returncode != 0:
            raise RuntimeError(
                f"{project.repo}: git {' '.join(step)} failed in {dest}: "
                f"{done.stderr.strip()[-400:]} (offline? pass --git-dir-template with a local "
                "repository per project, or fill the cache beforehand)"
            )
    return dest


def at_hand(project: Project, cache: Path, git_dir_template: str | None) -> Path | None:
    """The project's sources without the network (``--quick``): its checkout in the cache, or
    one borrowed from the local repository ``git_dir_template`` names; None when neither."""
    found = _checked_out(project, cache)
    if found is not None:
        return found
    if git_dir_template is None or _objects(_origin(project, git_dir_template)) is None:
        return None
    return fetch(project, cache, git_dir_template)


# ---------------------------------------------------------------- linting and scoring


def _notebook_cells(path: Path) -> list[tuple[str, int]]:
    """``(cell_type, lines)`` of each cell of the notebook at ``path``, in order."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        cells = document["cells"]
        out: list[tuple[str, int]] = []
        for cell in cells:
            source = cell.get("source", "")
            text = "".join(source) if isinstance(source, list) else str(source)
            out.append((str(cell.get("cell_type", "")), len(_SOURCE_LINE.findall(text))))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorpusError(f"{path}: not a notebook the labels can name cells of: {exc}") from exc
    return out


def check_cells(project: Project, root: Path) -> None:
    """Refuse a notebook row whose cell is not a code cell of the notebook at the project's
    commit, or whose line is past the cell's end: such a row could never be reported, and a
    cell counted the wrong way (code cells only, or from 0) is the likely slip."""
    cells: dict[str, list[tuple[str, int]]] = {}
    for index, label in enumerate(project.labels, start=1):
        if not label.cell:
            continue
        if label.path not in cells:
            cells[label.path] = _notebook_cells(root / label.path)
        found = cells[label.path]
        where = f"{project.source}: label {index} ({label.place} {label.rule})"
        if label.cell > len(found):
            raise CorpusError(f"{where}: the notebook has {len(found)} cells")
        kind, lines = found[label.cell - 1]
        if kind != "code":
            raise CorpusError(
                f"{where}: cell {label.cell} is a {kind or 'untyped'} cell; cells are counted "
                "from 1 among all cells, markdown ones too"
            )
        if label.line > lines:
            raise CorpusError(f"{where}: cell {label.cell} has {lines} lines")


def lint(root: Path, paths: Sequence[str]) -> set[Found]:
    """``(path relative to root, cell, line, code)`` of every finding, from the installed
    torchplace; ``cell`` is the notebook cell (1-based), 0 outside notebooks."""
    from torchplace.lint import lint_paths

    missing = [p for p in paths if not (root / p).exists()]
    if missing:
        raise CorpusError(f"{root.name}: paths not in the repository at its commit: {missing}")
    here = Path.cwd()
    os.chdir(root)  # as a user runs it: `torchplace lint PATH...` inside the project
    try:
        result = lint_paths(list(paths), jobs=1)
    finally:
        os.chdir(here)
    found: set[Found] = set()
    for finding in result.findings:
        rel = Path(finding.path)
        if rel.is_absolute():
            rel = rel.relative_to(root.resolve())
        found.add((rel.as_posix(), finding.cell, finding.line, finding.code))
    return found


def score(results: Iterable[tuple[Project, set[Found]]]) -> Score:
    """Each row scored against the findings ``(path, cell, line, rule)`` of its project: a row
    matches a finding at the same path, cell (0 outside notebooks), line and rule."""
    out = Score()
    for project, found in results:
        labelled: set[Found] = set()
        for label in project.labels:
            labelled.add(label.key)
            reported = label.key in found
            for tally in (
                out.overall,
                out.by_rule.setdefault(label.rule, Tally()),
                out.by_scope.setdefault(label.scope, Tally()),
                out.by_repo.setdefault(project.repo, Tally()),
            ):
                tally.add(label, reported)
            if label.verdict == "pitfall" and not reported:
                out.misses.append((project.repo, label))
            if label.verdict == "clean" and reported:
                out.false_alarms.append((project.repo, label))
        for finding in sorted(found - labelled):
            out.unlabelled.append((project.repo, finding))
    return out


def targets(result: Score) -> list[tuple[str, bool]]:
    """``(description, passed)`` for each of the issue's targets."""
    checks: list[tuple[str, bool]] = []
    precision = result.overall.precision
    checks.append(
        (
            f"overall precision >= {MIN_PRECISION:.0%} ({_pct(precision)})",
            precision is not None and precision >= MIN_PRECISION,
        )
    )
    for scope, minimum in (("local", MIN_LOCAL_RECALL), ("cross", MIN_CROSS_RECALL)):
        recall = result.by_scope.get(scope, Tally()).recall
        checks.append(
            (
                f"recall on {scope} rows >= {minimum:.0%} ({_pct(recall)})",
                recall is not None and recall >= minimum,
            )
        )
    for rule, tally in sorted(result.by_rule.items()):
        if tally.pitfalls >= MIN_RULE_PITFALLS:
            recall = tally.recall or 0.0
            checks.append(
                (
                    f"{rule} recall >= {MIN_RULE_RECALL:.0%} ({_pct(recall)} of {tally.pitfalls})",
                    recall >= MIN_RULE_RECALL,
                )
            )
    return checks


# ---------------------------------------------------------------- report


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _row(name: str, tally: Tally, width: int = 12) -> str:
    return (
        f"{name:<{width}} {tally.pitfalls:>8} {tally.tp:>6} {_pct(tally.recall):>7} "
        f"{tally.cleans:>7} {tally.fp:>7} {_pct(tally.precision):>10}"
    )


def render(result: Score, skipped: Sequence[str], show_unlabelled: int) -> str:
    head = (
        f"{'':<12} {'pitfalls':>8} {'found':>6} {'recall':>7} "
        f"{'cleans':>7} {'flagged':>7} {'precision':>10}"
    )
    lines = [head]
    lines += [_row(rule, tally) for rule, tally in sorted(result.by_rule.items())]
    lines.append(_row("overall", result.overall))
    for scope in SCOPES:
        lines.append(_row(f"  {scope}", result.by_scope.get(scope, Tally())))
    lines += ["", "by repository:"]
    width = max((len(repo) for repo in result.by_repo), default=12)
    lines += [_row(repo, t, width) for repo, t in sorted(result.by_repo.items())]
    if skipped:
        lines += ["", "not scored:", *(f"  {s}" for s in skipped)]
    lines += ["", f"missed pitfalls: {len(result.misses)}"]
    lines += [f"  {r}:{lb.place} {lb.rule} [{lb.scope}] {lb.reason}" for r, lb in result.misses]
    lines += [f"false alarms on clean rows: {len(result.false_alarms)}"]
    lines += [
        f"  {r}:{lb.place} {lb.rule} [{lb.scope}] {lb.reason}" for r, lb in result.false_alarms
    ]
    shown = result.unlabelled if show_unlabelled < 0 else result.unlabelled[:show_unlabelled]
    lines += [f"findings on unlabelled lines (not scored): {len(result.unlabelled)}"]
    lines += [f"  {r}:{_place(p, cell, n)} {c}" for r, (p, cell, n, c) in shown]
    if len(shown) < len(result.unlabelled):
        lines.append(f"  ... {len(result.unlabelled) - len(shown)} more (--show-unlabelled -1)")
    return "\n".join(lines)


def as_json(
    result: Score,
    skipped: Sequence[str],
    checks: Sequence[tuple[str, bool]],
    judged: bool = True,
) -> dict[str, Any]:
    def rows(items: list[tuple[str, Label]]) -> list[dict[str, Any]]:
        return [{"repo": r, **vars(lb), "cell": lb.cell or None} for r, lb in items]

    return {
        "overall": result.overall.as_dict(),
        "by_scope": {k: v.as_dict() for k, v in sorted(result.by_scope.items())},
        "by_rule": {k: v.as_dict() for k, v in sorted(result.by_rule.items())},
        "by_repo": {k: v.as_dict() for k, v in sorted(result.by_repo.items())},
        "misses": rows(result.misses),
        "false_alarms": rows(result.false_alarms),
        "unlabelled": [  # "cell": the notebook cell, as in `torchplace lint --json`; else null
            {"repo": r, "path": p, "cell": cell or None, "line": n, "rule": c}
            for r, (p, cell, n, c) in result.unlabelled
        ],
        "not_scored": list(skipped),
        "targets": [{"target": name, "passed": ok} for name, ok in checks],
        "targets_judged": judged,  # false under --quick when a part of the corpus was scored
    }


def _cache(arg: Path | None) -> Path:
    if arg is not None:
        return arg.expanduser()
    env = os.environ.get("TORCHPLACE_LINT_CORPUS")
    return Path(env).expanduser() if env else DEFAULT_CACHE.expanduser()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=CORPUS, help="folder of OWNER__NAME.toml files")
    p.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="where the sources go (default: $TORCHPLACE_LINT_CORPUS or ~/.cache/torchplace/lint-corpus)",
    )
    p.add_argument(
        "--git-dir-template",
        default=None,
        help="where each project's git repository is: a local path (borrowed, not copied) "
        "or a URL, {owner} and {name} substituted, e.g. '/mirrors/{owner}+{name}.git' "
        "(default: https://github.com/{owner}/{name})",
    )
    p.add_argument("--fetch-only", action="store_true", help="fetch the sources, do not lint")
    p.add_argument("--check", action="store_true", help="exit 1 when a target fails")
    p.add_argument(
        "--show-unlabelled",
        type=int,
        default=40,
        metavar="N",
        help="list N findings on unlabelled lines (-1: all; default 40)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--device", default="auto", help="ignored: linting needs no device")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"fetch nothing: score what is in the cache or in local repositories within "
        f"{QUICK_BUDGET_S:g} s, SKIP lines for the rest; the targets INFO lines unless the "
        "whole corpus was scored",
    )
    return p


def _gather(
    projects: Sequence[Project], cache: Path, args: argparse.Namespace
) -> tuple[list[tuple[Project, Path]], list[str]]:
    """(project, sources) of each project with sources, and ``repo@commit`` of the others;
    under --quick only the sources at hand, nothing fetched."""
    sources: list[tuple[Project, Path]] = []
    missing: list[str] = []
    for project in projects:
        try:
            if args.quick:
                where = at_hand(project, cache, args.git_dir_template)
            else:
                where = fetch(project, cache, args.git_dir_template)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            print(f"warning: {exc}", file=sys.stderr)
            where = None
        if where is None:
            missing.append(f"{project.repo}@{project.commit[:12]}")
        else:
            sources.append((project, where))
    return sources, missing


def _lint_all(
    sources: Sequence[tuple[Project, Path]], deadline: float | None
) -> tuple[list[tuple[Project, set[Found]]], list[str]]:
    """Each project's findings, and ``repo@commit`` of those left once ``deadline`` (a
    ``time.monotonic()`` value; None: no limit) has passed."""
    results: list[tuple[Project, set[Found]]] = []
    late: list[str] = []
    for project, where in sources:
        if deadline is not None and time.monotonic() >= deadline:
            late.append(f"{project.repo}@{project.commit[:12]}")
        else:
            check_cells(project, where)
            results.append((project, lint(where, project.paths)))
    return results, late


def _print_checks(
    checks: Sequence[tuple[str, bool]], judged: bool, scored: int, projects: int
) -> None:
    for name, ok in checks:
        if judged:
            print(f"{'PASS' if ok else 'FAIL'}: {name}")
        else:
            print(
                f"INFO: {name} (--quick scored {scored} of {projects} repositories: a part of "
                "the corpus cannot judge its targets)"
            )


def main(argv: list[str] | None = None) -> int:
    options = parser()
    args = options.parse_args(argv)
    if args.quick and args.fetch_only:
        options.error("--quick fetches nothing: use --fetch-only without it")
    deadline = time.monotonic() + QUICK_BUDGET_S if args.quick else None
    try:
        projects = load_corpus(args.corpus)
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cache = _cache(args.cache)
    sources, missing = _gather(projects, cache, args)
    if args.fetch_only:
        for project, where in sources:
            print(f"{project.repo}@{project.commit[:12]} -> {where}")
        return 1 if missing else 0
    try:
        results, late = _lint_all(sources, deadline)
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    skipped = missing + late
    result = score(results)
    checks = targets(result)
    labels = sum(len(p.labels) for p, _ in results)
    print(
        f"lint corpus: {len(results)} of {len(projects)} repositories, {labels} labelled "
        f"locations ({result.overall.pitfalls} pitfalls, {result.overall.cleans} clean), "
        f"cache {cache}"
    )
    print(render(result, skipped, args.show_unlabelled))
    print()
    judged = not (args.quick and skipped)  # a full run judges whatever it could fetch
    if args.quick:
        total = sum(len(p.labels) for p in projects)
        print(f"PASS: the label files follow the format ({len(projects)} files, {total} labels)")
    _print_checks(checks, judged, len(results), len(projects))
    if args.quick:
        if missing:
            print(
                f"SKIP: {len(missing)} of {len(projects)} repositories not at hand ({NOT_AT_HAND})"
            )
        if late:
            print(
                f"SKIP: {len(late)} repositories not linted: the --quick time budget of "
                f"{QUICK_BUDGET_S:g} s was spent"
            )
    elif skipped:
        print(f"FAIL: {len(skipped)} repositories could not be fetched")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(as_json(result, skipped, checks, judged), indent=2))
    passed = all(ok for _, ok in checks) and not skipped and bool(results)
    return 1 if args.check and judged and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
