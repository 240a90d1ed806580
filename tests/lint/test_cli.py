"""``torchplace lint`` end to end: formats, exit codes, selection, config, ignores, fixes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from torchplace import report
from torchplace.cli import main
from torchplace.lint.rules import ALL_RULES

BAD = "import torch\nstate = torch.load('m.pt')\n"
CLEAN = "import torch\nstate = torch.load('m.pt', map_location='cpu', weights_only=True)\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    (tmp_path / "bad.py").write_text(BAD)
    (tmp_path / "clean.py").write_text(CLEAN)
    return tmp_path


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["lint", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_exit_codes(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "clean.py")[0] == 0
    code, out, _ = _run(capsys, "bad.py")
    assert code == 1
    assert "bad.py:2:9: TPL401 " in out
    assert "bad.py:2:9: TPL402 [*] " in out
    assert _run(capsys, "--exit-zero", "bad.py")[0] == 0


def test_directory_default_is_current_dir(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys)
    assert code == 1
    assert "bad.py:2:9" in out
    assert "clean.py" not in out.split("Found")[0]


def test_usage_errors_exit_2(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "--select", "TPL999", "bad.py")
    assert code == 2
    assert "TPL999" in err
    with pytest.raises(SystemExit) as exc:
        main(["lint", "--format", "xml"])
    assert exc.value.code == 2


@pytest.mark.parametrize("given", ["", ",", " "])
def test_a_selection_of_no_rule_is_a_usage_error(
    project: Path, capsys: pytest.CaptureFixture[str], given: str
) -> None:
    """``--select "$CODES"`` with an empty variable checked nothing and passed every file."""
    code, out, err = _run(capsys, "--select", given, "bad.py")
    assert (code, out) == (2, "")
    assert "--select was given an empty value, which selects no rule" in err
    (project / "pyproject.toml").write_text("[tool.torchplace.lint]\nselect = ['']\n")
    code, _, err = _run(capsys, "bad.py")
    assert code == 2
    assert "selects no rule" in err


def test_select_and_ignore_prefixes(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(capsys, "--select", "TPL4", "--ignore", "TPL402", "bad.py")
    assert "TPL401" in out
    assert "TPL402" not in out
    _, out, _ = _run(capsys, "--select", "TPL401,TPL402", "bad.py")
    assert "TPL401" in out
    assert "TPL402" in out
    code, _, _ = _run(capsys, "--select", "TPL1", "bad.py")
    assert code == 0


def test_pyproject_settings(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "pyproject.toml").write_text(
        "[tool.torchplace.lint]\nignore = ['TPL401']\nexclude = ['skipped/']\n"
        "[tool.torchplace.lint.per-file-ignores]\n'other.py' = ['TPL4']\n"
    )
    (project / "skipped").mkdir()
    (project / "skipped" / "x.py").write_text(BAD)
    (project / "other.py").write_text(BAD)
    _, out, _ = _run(capsys, ".")
    assert "TPL401" not in out
    assert "bad.py:2:9: TPL402" in out
    assert "skipped" not in out
    assert "other.py" not in out
    _, out, _ = _run(capsys, "--isolated", ".")
    assert "TPL401" in out
    assert "skipped/x.py" in out
    (project / "pyproject.toml").write_text("[tool.torchplace.lint]\nbogus = 1\n")
    assert _run(capsys, ".")[0] == 2


def test_gitignore_respected(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / ".gitignore").write_text("generated/\nignored_*.py\n")
    (project / "generated").mkdir()
    (project / "generated" / "g.py").write_text(BAD)
    (project / "ignored_one.py").write_text(BAD)
    _, out, _ = _run(capsys, ".")
    assert "generated" not in out
    assert "ignored_one" not in out
    # Named explicitly, a file is always linted.
    _, out, _ = _run(capsys, "ignored_one.py")
    assert "ignored_one.py:2:9" in out


def test_noqa(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "bad.py").write_text(
        "import torch\nstate = torch.load('m.pt')  # noqa: TPL401\nx = torch.load('n.pt')  # noqa\n"
    )
    _, out, _ = _run(capsys, "bad.py")
    assert "2:9: TPL402" in out
    assert "2:9: TPL401" not in out
    assert ":3:" not in out


def test_json_format(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--format", "json", "bad.py")
    assert code == 1
    document = json.loads(out)
    assert document["schema"] == "torchplace.lint/v1"
    assert document["device"] is None
    assert document["result"]["files"] == 1
    assert document["result"]["errors"] == []
    data = document["result"]["findings"]
    assert _run(capsys, "--json", "bad.py")[1] == out  # the short form
    assert {d["code"] for d in data} == {"TPL401", "TPL402"}
    fixable = next(d for d in data if d["code"] == "TPL402")
    assert fixable["location"] == {"row": 2, "column": 9}
    assert fixable["fix"]["edits"][0]["content"] == ", weights_only=True"


def test_sarif_format(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(capsys, "--format", "sarif", "bad.py")
    sarif = json.loads(out)
    assert sarif["version"] == "2.1.0"
    assert "sarif-2.1.0" in sarif["$schema"]
    [run] = sarif["runs"]
    rules = run["tool"]["driver"]["rules"]
    assert all({"id", "shortDescription"} <= set(rule) for rule in rules)
    assert {r["ruleId"] for r in run["results"]} == {"TPL401", "TPL402"}
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        region = result["locations"][0]["physicalLocation"]["region"]
        assert region["startLine"] == 2
        assert region["startColumn"] == 9
        assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "bad.py"


def test_github_format(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(capsys, "--format", "github", "bad.py")
    lines = out.strip().splitlines()
    assert len(lines) == 2
    assert all(line.startswith("::error title=torchplace (TPL40") for line in lines)
    assert "file=bad.py,line=2,col=9" in lines[0]


def test_statistics(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "more.py").write_text(BAD + "other = torch.load('x.pt')\n")
    _, out, _ = _run(capsys, "--statistics", ".")
    lines = out.strip().splitlines()
    assert lines[0].split("\t")[:2] == ["3", "TPL401"]
    assert lines[1].split("\t") == ["3", "TPL402", "[*] load-without-weights-only"]


@pytest.mark.parametrize("flag", [["--json"], ["--format", "json"]])
def test_statistics_in_json(
    project: Path, capsys: pytest.CaptureFixture[str], flag: list[str]
) -> None:
    # was: --statistics ignored under --json: the envelope had the findings only
    jsonschema = pytest.importorskip("jsonschema")
    (project / "more.py").write_text(BAD + "other = torch.load('x.pt')\n")
    code, out, _ = _run(capsys, *flag, "--statistics", ".")
    document = json.loads(out)
    jsonschema.Draft202012Validator(report.load_schema("lint")).validate(document)
    result = document["result"]
    assert code == 1
    assert len(result["findings"]) == 6  # the findings stay, as the schema requires
    assert result["statistics"] == [
        {"code": "TPL401", "name": ALL_RULES["TPL401"].name, "count": 3, "fixable": False},
        {"code": "TPL402", "name": "load-without-weights-only", "count": 3, "fixable": True},
    ]
    _, text, _ = _run(capsys, "--statistics", ".")  # the same counts as the text lines
    assert [line.split("\t")[:2] for line in text.strip().splitlines()] == [
        [str(row["count"]), row["code"]] for row in result["statistics"]
    ]


def test_statistics_in_json_only_when_asked(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "statistics" not in json.loads(_run(capsys, "--json", "bad.py")[1])["result"]
    code, out, _ = _run(capsys, "--json", "--statistics", "clean.py")
    assert code == 0
    assert json.loads(out)["result"]["statistics"] == []


def test_fix_rewrites_files(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--fix", "bad.py")
    assert (project / "bad.py").read_text() == BAD.replace("'m.pt')", "'m.pt', weights_only=True)")
    assert "Fixed 1 finding" in err
    assert code == 1
    assert "TPL401" in out
    assert "TPL402" not in out


def test_syntax_error_and_unreadable(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "broken.py").write_text("def f(:\n")
    (project / "binary.py").write_bytes(b"x = '\xff'\n")
    code, out, _ = _run(capsys, "broken.py", "binary.py", "missing.py")
    assert code == 1
    assert "broken.py:1:7: TPL000 syntax error" in out
    assert "binary.py:1:1: TPL001" in out
    assert "missing.py:1:1: TPL001 no such file or directory" in out


def test_a_symlink_loop_is_a_finding(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "loop.py").symlink_to(project / "back.py")
    (project / "back.py").symlink_to(project / "loop.py")
    code, out, _ = _run(capsys, "loop.py", ".")
    assert code == 1
    assert "loop.py:1:1: TPL001 cannot read file" in out
    assert "back.py:1:1: TPL001 cannot read file" in out  # found by the walk


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_is_not_read(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(project / "pipe.py")  # opening it to read would block until a writer comes
    _, out, _ = _run(capsys, ".")
    assert "bad.py:2:9: TPL401" in out
    assert "pipe.py" not in out
    code, out, _ = _run(capsys, "pipe.py")
    assert code == 1
    assert "pipe.py:1:1: TPL001 not a regular file or directory" in out


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root reads all")
def test_permission_denied_is_a_finding(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = project / "secret.py"
    target.write_text(BAD)
    target.chmod(0)
    _, out, _ = _run(capsys, "secret.py")
    assert "TPL001 cannot read file" in out


def test_parallel_matches_sequential(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    many = project / "many"
    many.mkdir()
    for i in range(60):
        (many / f"m{i:02d}.py").write_text(BAD if i % 3 == 0 else CLEAN)
    _, parallel, _ = _run(capsys, "--jobs", "2", "many")
    _, sequential, _ = _run(capsys, "--jobs", "1", "many")
    assert parallel == sequential
    assert parallel.count("TPL401") == 20


def test_list_rules(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--list-rules")
    assert code == 0
    assert "TPL101" in out
    assert "discarded-transfer" in out


def test_internal_error_exits_2(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torchplace.lint.runner as runner

    def explode(raw: bytes, path: str, **kwargs: object) -> list[object]:
        raise RuntimeError("engine bug")

    monkeypatch.setattr(runner, "lint_bytes", explode)
    code, _, err = _run(capsys, "--jobs", "1", "bad.py")
    assert code == 2
    assert "internal error on bad.py: RuntimeError: engine bug" in err


def test_an_empty_path_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    # `torchplace lint "$SRC"` with SRC unset must not lint the current folder under made-up
    # absolute names (`/a.py`), which `--fix` then cannot write
    assert main(["lint", ""]) == 2
    assert "an empty path was given" in capsys.readouterr().err
