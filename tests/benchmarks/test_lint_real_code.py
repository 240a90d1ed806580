"""benchmarks/lint_real_code.py: label files, fetching at a pinned commit, scoring and targets.

Everything runs on a tiny git repository made in ``tmp_path``: no network.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts import load_benchmark, usage_error

SOURCE = """import torch


def train(model, loader, opt, device):
    total = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        total += loss.item()
    return total


def restore(path):
    return torch.load(path, map_location="cpu")
"""
LOAD_LINE = 17  # torch.load without weights_only: TPL402 reports it
ITEM_LINE = 12  # loss.item() per batch

# A notebook: cells 1 and 3 are markdown. Cell 4 reads the loss every batch at its line 7 (TPL201
# reports cell 4, line 7); cell 5 reads it once after a loop, also at its line 7 (not reported).
NOTEBOOK_CELLS = [
    ("markdown", "# Train"),
    (
        "code",
        "import torch\n\n"
        'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n'
        "model = torch.nn.Linear(4, 1).to(device)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(10)]",
    ),
    ("markdown", "## The loop"),
    (
        "code",
        "total = 0.0\n"
        "for x, y in loader:\n"
        "    x, y = x.to(device), y.to(device)\n"
        "    loss = (model(x) - y).pow(2).mean()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    total += loss.item()",
    ),
    (
        "code",
        "steps = 0\n"
        "for x, y in loader:\n"
        "    steps += 1\n"
        "    opt.zero_grad()\n"
        "print(steps)\n"
        "print(total)\n"
        "print(loss.item())",
    ),
]
NB_CELL, NB_LINE = 4, 7  # the per-batch read
NB_AFTER_CELL = 5  # a read after the loop, at the same line of another cell


def _notebook() -> str:
    cells = [
        {"cell_type": kind, "metadata": {}, "source": text.splitlines(keepends=True)}
        | ({"execution_count": None, "outputs": []} if kind == "code" else {})
        for kind, text in NOTEBOOK_CELLS
    ]
    kernel = {"name": "python3", "language": "python", "display_name": "Python 3"}
    document = {"cells": cells, "metadata": {"kernelspec": kernel}, "nbformat": 4}
    return json.dumps(document | {"nbformat_minor": 5}, indent=1)


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("lint_real_code")


def _git(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _label(
    path: str, line: int, rule: str, verdict: str, scope: str = "local", cell: int | None = None
) -> str:
    return (
        f'[[label]]\npath = "{path}"\n'
        + ("" if cell is None else f"cell = {cell}\n")
        + f'line = {line}\nrule = "{rule}"\n'
        f'verdict = "{verdict}"\nscope = "{scope}"\nreason = "test row"\n'
    )


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, Path, str]:
    """A git repository acme/demo with two commits, and a corpus that pins the first."""
    repo = tmp_path / "mirrors" / "acme" / "demo"
    (repo / "pkg").mkdir(parents=True)
    _git("init", "--quiet", cwd=repo)
    (repo / "pkg" / "train.py").write_text(SOURCE)
    (repo / "big.bin").write_bytes(b"\0" * 64)  # outside `paths`: never checked out
    _git("add", ".", cwd=repo)
    _git("commit", "--quiet", "-m", "first", cwd=repo)
    commit = _git("rev-parse", "HEAD", cwd=repo)
    (repo / "pkg" / "train.py").write_text("# the second commit changes everything\n")
    _git("commit", "--quiet", "-am", "second", cwd=repo)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = [
        _label("pkg/train.py", LOAD_LINE, "TPL402", "pitfall"),  # reported: TP
        _label("pkg/train.py", LOAD_LINE, "TPL401", "clean"),  # map_location given: TN
        _label("pkg/train.py", 7, "TPL501", "pitfall", "cross"),  # nothing there: FN
    ]
    (corpus / "acme__demo.toml").write_text(
        f'repo = "acme/demo"\ncommit = "{commit}"\nkind = "training"\npaths = ["pkg"]\n\n'
        + "\n".join(rows)
    )
    return tmp_path, corpus, commit


def test_fetch_checks_out_only_the_paths_at_the_pinned_commit(
    bench: ModuleType, project: tuple[Path, Path, str]
) -> None:
    tmp_path, corpus, commit = project
    (proj,) = bench.load_corpus(corpus)
    template = str(tmp_path / "mirrors" / "{owner}" / "{name}")
    where = bench.fetch(proj, tmp_path / "cache", template)
    assert where == tmp_path / "cache" / "acme__demo"
    assert (where / "pkg" / "train.py").read_text() == SOURCE  # the first commit, not HEAD
    assert not (where / "big.bin").exists()
    assert _git("rev-parse", "HEAD", cwd=where) == commit
    (where / "pkg" / "train.py").write_text("edited")  # a second fetch trusts the checkout
    assert bench.fetch(proj, tmp_path / "cache", template) == where
    assert (where / "pkg" / "train.py").read_text() == "edited"


def test_score_counts_each_row_once_and_lists_unlabelled_findings(bench: ModuleType) -> None:
    labels = (
        bench.Label("a.py", 1, "TPL201", "pitfall", "local", "r"),  # TP
        bench.Label("a.py", 2, "TPL201", "pitfall", "cross", "r"),  # FN
        bench.Label("a.py", 3, "TPL201", "clean", "local", "r"),  # FP
        bench.Label("a.py", 4, "TPL401", "clean", "local", "r"),  # TN
    )
    proj = bench.Project("o/n", "0" * 40, "training", ("a.py",), labels, Path("o__n.toml"))
    found = {("a.py", 0, 1, "TPL201"), ("a.py", 0, 3, "TPL201"), ("a.py", 0, 9, "TPL103")}
    result = bench.score([(proj, found)])
    rule = result.by_rule["TPL201"]
    assert (rule.tp, rule.fn, rule.fp, rule.tn) == (1, 1, 1, 0)
    assert rule.precision == 0.5
    assert rule.recall == 0.5
    assert result.by_rule["TPL401"].precision is None  # no finding: nothing to be precise about
    assert (result.overall.tp, result.overall.fn, result.overall.fp, result.overall.tn) == (
        1,
        1,
        1,
        1,
    )
    assert result.by_scope["local"].recall == 1.0
    assert result.by_scope["cross"].recall == 0.0
    assert [label.line for _, label in result.misses] == [2]
    assert [label.line for _, label in result.false_alarms] == [3]
    assert result.unlabelled == [("o/n", ("a.py", 0, 9, "TPL103"))]


def test_a_notebook_row_matches_a_finding_in_its_cell_only(bench: ModuleType) -> None:
    labels = (
        bench.Label("nb.ipynb", 7, "TPL201", "pitfall", "local", "r", cell=4),  # TP
        bench.Label("nb.ipynb", 7, "TPL201", "clean", "local", "r", cell=5),  # TN
        bench.Label("nb.ipynb", 2, "TPL402", "pitfall", "local", "r", cell=3),  # FN
    )
    proj = bench.Project("o/n", "0" * 40, "training", ("nb.ipynb",), labels, Path("o__n.toml"))
    # cell 4's finding is at the same line as the clean row of cell 5, and one of cell 6 at the
    # line of cell 3's pitfall row: neither matches a row of another cell
    found = {("nb.ipynb", 4, 7, "TPL201"), ("nb.ipynb", 6, 2, "TPL402")}
    result = bench.score([(proj, found)])
    assert (result.overall.tp, result.overall.fn, result.overall.fp, result.overall.tn) == (
        1,
        1,
        0,
        1,
    )
    assert [(label.cell, label.line) for _, label in result.misses] == [(3, 2)]
    assert result.false_alarms == []
    assert result.unlabelled == [("o/n", ("nb.ipynb", 6, 2, "TPL402"))]
    text = bench.render(result, [], -1)
    assert "o/n:nb.ipynb:cell 3:2 TPL402 [local] r" in text
    assert "o/n:nb.ipynb:cell 6:2 TPL402" in text
    rows = bench.as_json(result, [], [])
    assert rows["misses"][0]["cell"] == 3
    assert rows["unlabelled"] == [
        {"repo": "o/n", "path": "nb.ipynb", "cell": 6, "line": 2, "rule": "TPL402"}
    ]


def test_targets_follow_the_issue(bench: ModuleType) -> None:
    result = bench.Score()
    result.overall = bench.Tally(tp=9, fn=1, fp=1, tn=5)  # precision 90%
    result.by_scope = {"local": bench.Tally(tp=8, fn=1), "cross": bench.Tally(tp=1, fn=1)}
    result.by_rule = {
        "TPL201": bench.Tally(tp=3, fn=2),  # 5 pitfalls, recall 60%: checked, passes
        "TPL104": bench.Tally(tp=0, fn=4),  # 4 pitfalls: not checked
    }
    checks = dict(bench.targets(result))
    assert all(checks.values())
    assert not any("TPL104" in name for name in checks)
    result.by_rule["TPL201"] = bench.Tally(tp=2, fn=3)
    failed = [name for name, ok in bench.targets(result) if not ok]
    assert len(failed) == 1
    assert "TPL201" in failed[0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('repo = "acme/demo"\ncommit = "abc"\nkind = "training"\npaths = ["a"]\n', "40-hex"),
        ('repo = "acme/demo"\ncommit = "' + "a" * 40 + '"\nkind = "toy"\npaths = ["a"]\n', "kind"),
        (
            'repo = "acme/demo"\ncommit = "'
            + "a" * 40
            + '"\nkind = "training"\npaths = ["a"]\n'
            + _label("a.py", 1, "TPL201", "maybe"),
            "verdict",
        ),
        (
            'repo = "acme/demo"\ncommit = "'
            + "a" * 40
            + '"\nkind = "training"\npaths = ["a"]\n'
            + _label("a.py", 1, "TPL201", "clean")
            + _label("a.py", 1, "TPL201", "pitfall"),
            "labelled twice",
        ),
        (
            'repo = "acme/demo"\ncommit = "'
            + "a" * 40
            + '"\nkind = "training"\npaths = ["nb"]\n'
            + _label("nb/train.ipynb", 7, "TPL201", "pitfall"),
            r"label 1: nb/train\.ipynb is a notebook: name the cell",
        ),
        (
            'repo = "acme/demo"\ncommit = "'
            + "a" * 40
            + '"\nkind = "training"\npaths = ["a"]\n'
            + _label("a.py", 7, "TPL201", "pitfall", cell=2),
            "not a notebook",
        ),
        (
            'repo = "acme/demo"\ncommit = "'
            + "a" * 40
            + '"\nkind = "training"\npaths = ["nb"]\n'
            + _label("nb/train.ipynb", 7, "TPL201", "pitfall", cell=0),
            "cells are 1-based",
        ),
        (
            'repo = "acme/demo"\ncommit = "'
            + "a" * 40
            + '"\nkind = "training"\npaths = ["nb"]\n'
            + _label("nb/train.ipynb", 7, "TPL201", "pitfall", cell=4)
            + _label("nb/train.ipynb", 7, "TPL201", "clean", cell=4),
            r"nb/train\.ipynb:cell 4:7 TPL201 is labelled twice",
        ),
    ],
)
def test_bad_label_files_are_named(
    bench: ModuleType, tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "acme__demo.toml"
    path.write_text(text)
    with pytest.raises(bench.CorpusError, match=message):
        bench.load_project(path)


def test_notebook_rows_of_different_cells_may_share_a_line(
    bench: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "acme__demo.toml"
    path.write_text(
        'repo = "acme/demo"\ncommit = "'
        + "a" * 40
        + '"\nkind = "training"\npaths = ["nb"]\n'
        + _label("nb/train.ipynb", 7, "TPL201", "pitfall", cell=4)
        + _label("nb/train.ipynb", 7, "TPL201", "clean", cell=5)
        + _label("a.py", 7, "TPL201", "clean")
    )
    proj = bench.load_project(path)
    assert [(label.cell, label.line) for label in proj.labels] == [(4, 7), (5, 7), (0, 7)]


def test_label_file_must_be_named_after_the_repo(bench: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "other.toml"
    path.write_text(
        'repo = "acme/demo"\ncommit = "' + "a" * 40 + '"\nkind = "training"\npaths = ["a"]\n'
    )
    with pytest.raises(bench.CorpusError, match=r"acme__demo\.toml"):
        bench.load_project(path)


def test_held_out_repositories_are_refused(bench: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "karpathy__nanoGPT.toml"
    path.write_text(
        'repo = "karpathy/nanoGPT"\ncommit = "' + "a" * 40 + '"\nkind = "training"\npaths = ["a"]\n'
    )
    with pytest.raises(bench.CorpusError, match="held out"):
        bench.load_project(path)


def test_main_lints_and_scores_end_to_end(
    bench: ModuleType, project: tuple[Path, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    tmp_path, corpus, _ = project
    out = tmp_path / "result.json"
    args = [
        "--corpus",
        str(corpus),
        "--cache",
        str(tmp_path / "cache"),
        "--git-dir-template",
        str(tmp_path / "mirrors" / "{owner}" / "{name}"),
        "--json",
        str(out),
    ]
    assert bench.main(args) == 0
    text = capsys.readouterr().out
    assert "1 of 1 repositories, 3 labelled locations (2 pitfalls, 1 clean)" in text
    assert "FAIL: recall on cross rows" in text
    result = json.loads(out.read_text())
    assert result["by_rule"]["TPL402"]["tp"] == 1
    assert result["by_rule"]["TPL401"]["fp"] == 0
    assert result["by_rule"]["TPL501"]["fn"] == 1
    assert [row["line"] for row in result["misses"]] == [7]
    # the per-batch loss.item() is reported but not labelled: listed, never scored
    assert {
        "repo": "acme/demo",
        "path": "pkg/train.py",
        "cell": None,
        "line": ITEM_LINE,
        "rule": "TPL201",
    } in result["unlabelled"]
    assert bench.main([*args, "--check"]) == 1


@pytest.fixture
def notebook_project(tmp_path: Path) -> Callable[[list[str]], tuple[list[str], Path]]:
    """A git repository acme/notes holding nb/train.ipynb; called with label rows, the
    arguments of a run over a corpus of those rows, and the path of its JSON results."""
    repo = tmp_path / "mirrors" / "acme" / "notes"
    (repo / "nb").mkdir(parents=True)
    _git("init", "--quiet", cwd=repo)
    (repo / "nb" / "train.ipynb").write_text(_notebook())
    _git("add", ".", cwd=repo)
    _git("commit", "--quiet", "-m", "first", cwd=repo)
    commit = _git("rev-parse", "HEAD", cwd=repo)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    out = tmp_path / "result.json"

    def make(rows: list[str]) -> tuple[list[str], Path]:
        (corpus / "acme__notes.toml").write_text(
            f'repo = "acme/notes"\ncommit = "{commit}"\nkind = "training"\npaths = ["nb"]\n\n'
            + "\n".join(rows)
        )
        args = ["--corpus", str(corpus), "--cache", str(tmp_path / "cache")]
        args += ["--git-dir-template", str(tmp_path / "mirrors" / "{owner}" / "{name}")]
        return [*args, "--json", str(out)], out

    return make


def test_main_matches_notebook_rows_by_cell_end_to_end(
    bench: ModuleType,
    notebook_project: Callable[[list[str]], tuple[list[str], Path]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    args, out = notebook_project(
        [
            _label("nb/train.ipynb", NB_LINE, "TPL201", "pitfall", cell=NB_CELL),  # TP
            _label("nb/train.ipynb", NB_LINE, "TPL201", "clean", cell=NB_AFTER_CELL),  # TN
            _label("nb/train.ipynb", 1, "TPL201", "pitfall", cell=NB_CELL),  # FN
        ]
    )
    assert bench.main(args) == 0
    text = capsys.readouterr().out
    assert "1 of 1 repositories, 3 labelled locations (2 pitfalls, 1 clean)" in text
    assert f"acme/notes:nb/train.ipynb:cell {NB_CELL}:1 TPL201 [local] test row" in text
    assert "false alarms on clean rows: 0" in text
    assert "findings on unlabelled lines (not scored): 0" in text
    tally = json.loads(out.read_text())["by_rule"]["TPL201"]
    assert (tally["tp"], tally["fn"], tally["fp"], tally["tn"]) == (1, 1, 0, 1)


def test_main_lists_an_unlabelled_notebook_finding_with_its_cell(
    bench: ModuleType,
    notebook_project: Callable[[list[str]], tuple[list[str], Path]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # a row at the finding's line, but in the cell after it: it neither matches nor hides it
    args, out = notebook_project(
        [_label("nb/train.ipynb", NB_LINE, "TPL201", "pitfall", cell=NB_AFTER_CELL)]
    )
    assert bench.main(args) == 0
    assert f"acme/notes:nb/train.ipynb:cell {NB_CELL}:{NB_LINE} TPL201" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["by_rule"]["TPL201"]["fn"] == 1
    assert result["unlabelled"] == [
        {"repo": "acme/notes", "path": "nb/train.ipynb", "cell": NB_CELL, "line": NB_LINE}
        | {"rule": "TPL201"}
    ]


@pytest.mark.parametrize(
    ("cell", "line", "message"),
    [
        (3, 1, "cell 3 is a markdown cell; cells are counted from 1 among all cells"),
        (6, 1, "the notebook has 5 cells"),
        (NB_CELL, 8, f"cell {NB_CELL} has 7 lines"),
    ],
)
def test_a_notebook_row_off_the_notebook_is_a_usage_error(
    bench: ModuleType,
    notebook_project: Callable[[list[str]], tuple[list[str], Path]],
    capsys: pytest.CaptureFixture[str],
    cell: int,
    line: int,
    message: str,
) -> None:
    args, _ = notebook_project([_label("nb/train.ipynb", line, "TPL201", "pitfall", cell=cell)])
    assert bench.main(args) == 2
    err = capsys.readouterr().err
    assert "acme__notes.toml: label 1 (nb/train.ipynb:cell" in err
    assert message in err


def test_unreachable_sources_are_reported_not_scored(
    bench: ModuleType, project: tuple[Path, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    tmp_path, corpus, _ = project
    args = ["--corpus", str(corpus), "--cache", str(tmp_path / "cache")]
    args += ["--git-dir-template", str(tmp_path / "nowhere" / "{owner}" / "{name}")]
    assert bench.main(args) == 0
    captured = capsys.readouterr()
    assert "acme/demo" in captured.err
    assert "--git-dir-template" in captured.err
    assert "0 of 1 repositories" in captured.out
    assert bench.main([*args, "--check"]) == 1
    assert bench.main([*args, "--fetch-only"]) == 1


def test_a_broken_corpus_is_a_usage_error(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "acme__demo.toml").write_text("repo = \n")
    assert bench.main(["--corpus", str(tmp_path)]) == 2
    assert "acme__demo.toml" in capsys.readouterr().err


# ---------------------------------------------------------------- --quick
# No repository is made here: the cache holds a plain folder, and git's answer to
# `rev-parse HEAD` in it is the pinned commit; any other git command fails the test.
QUICK_COMMIT = "c" * 40


@pytest.fixture
def cached(bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(corpus, cache): acme/demo pinned at QUICK_COMMIT, its checkout in the cache."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = [
        _label("pkg/train.py", LOAD_LINE, "TPL402", "pitfall"),  # reported: TP
        _label("pkg/train.py", 7, "TPL501", "pitfall", "cross"),  # nothing there: FN
    ]
    (corpus / "acme__demo.toml").write_text(
        f'repo = "acme/demo"\ncommit = "{QUICK_COMMIT}"\nkind = "training"\npaths = ["pkg"]\n\n'
        + "\n".join(rows)
    )
    cache = tmp_path / "cache"
    checkout = cache / "acme__demo"
    (checkout / ".git").mkdir(parents=True)
    (checkout / "pkg").mkdir()
    (checkout / "pkg" / "train.py").write_text(SOURCE)

    def git(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        assert list(args) == ["rev-parse", "HEAD"], f"--quick ran git {args}"
        found = cwd == checkout
        return subprocess.CompletedProcess(args, 0 if found else 128, f"{QUICK_COMMIT}\n", "")

    monkeypatch.setattr(bench, "_git", git)
    return corpus, cache


def _other_project(corpus: Path) -> None:
    """A second label file, of a repository with nothing in the cache."""
    (corpus / "acme__other.toml").write_text(
        f'repo = "acme/other"\ncommit = "{"b" * 40}"\nkind = "library"\npaths = ["lib"]\n\n'
        + _label("lib/a.py", 1, "TPL402", "pitfall")
    )


def test_quick_judges_the_targets_when_the_whole_corpus_is_at_hand(
    bench: ModuleType, cached: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    corpus, cache = cached
    args = ["--quick", "--corpus", str(corpus), "--cache", str(cache)]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert "1 of 1 repositories, 2 labelled locations" in out
    assert "PASS: the label files follow the format (1 files, 2 labels)" in out
    assert "FAIL: recall on cross rows" in out
    assert bench.main([*args, "--check"]) == 1


def test_quick_scores_what_is_at_hand_and_fetches_nothing(
    bench: ModuleType, cached: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    corpus, cache = cached
    _other_project(corpus)
    args = ["--quick", "--corpus", str(corpus), "--cache", str(cache)]
    assert bench.main(args) == 0
    assert bench.main([*args, "--check"]) == 0  # a part of the corpus judges no target
    captured = capsys.readouterr()
    assert "1 of 2 repositories" in captured.out
    assert "SKIP: 1 of 2 repositories not at hand" in captured.out
    assert "scripts/lint-corpus-fetch" in captured.out
    assert "INFO: recall on cross rows" in captured.out
    assert "FAIL" not in captured.out
    assert captured.err == ""
    assert not (cache / "acme__other").exists()  # no fetch was tried


def test_quick_borrows_from_local_repositories_only(
    bench: ModuleType,
    cached: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    corpus, cache = cached
    _other_project(corpus)
    fetched: list[tuple[str, str]] = []

    def fetch(project: object, where: Path, template: str) -> Path:
        repo = project.repo  # type: ignore[attr-defined]
        fetched.append((repo, template))
        raise RuntimeError(f"{repo}: not this time")

    monkeypatch.setattr(bench, "fetch", fetch)
    (tmp_path / "mirrors" / "acme" / "other" / "objects").mkdir(parents=True)
    local = str(tmp_path / "mirrors" / "{owner}" / "{name}")
    args = ["--quick", "--corpus", str(corpus), "--cache", str(cache)]
    assert bench.main([*args, "--git-dir-template", local]) == 0
    assert fetched == [("acme/other", local)]  # acme/demo came from the cache
    assert "acme/other: not this time" in capsys.readouterr().err
    fetched.clear()
    assert bench.main([*args, "--git-dir-template", "https://example.com/{owner}/{name}"]) == 0
    assert fetched == []  # never over the network
    assert "SKIP: 1 of 2 repositories not at hand" in capsys.readouterr().out


def test_quick_without_sources_is_a_skip_line_with_the_reason(
    bench: ModuleType, cached: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus, _ = cached
    empty = tmp_path / "empty"
    assert bench.main(["--quick", "--corpus", str(corpus), "--cache", str(empty)]) == 0
    out = capsys.readouterr().out
    assert "0 of 1 repositories" in out
    assert "SKIP: 1 of 1 repositories not at hand" in out
    assert "FAIL" not in out
    assert not empty.exists()


def test_quick_stops_linting_when_its_budget_is_spent(
    bench: ModuleType,
    cached: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    corpus, cache = cached
    monkeypatch.setattr(bench, "QUICK_BUDGET_S", 0.0)
    assert bench.main(["--quick", "--corpus", str(corpus), "--cache", str(cache)]) == 0
    out = capsys.readouterr().out
    assert "0 of 1 repositories" in out
    assert "SKIP: 1 repositories not linted: the --quick time budget" in out
    assert "INFO: recall on cross rows" in out


def test_quick_with_fetch_only_is_a_usage_error(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--fetch-only" in usage_error(bench.main, ["--quick", "--fetch-only"], capsys)
