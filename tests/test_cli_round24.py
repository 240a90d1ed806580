"""Round 24 of the command-line output convention: defects found and fixed.

* ``lint --list-rules`` ignored ``-o PATH`` (the listing went to stdout, no file was written)
  and ``--json`` (text on stdout where a program expected JSON, exit 0).
* A text report naming a file whose name is not UTF-8 failed with a UnicodeEncodeError
  traceback when written to ``-o PATH`` (or to a strict stdout, ``PYTHONIOENCODING=utf-8``).
* ``guard -o FILE`` refused only a script named by path as FILE: ``-m module`` (its file, or a
  package's ``__main__.py``) and a directory program (its ``__main__.py``) were overwritten by
  the report.
* ``lint DIR -o FILE`` refused only a ``.py``/``.pyi`` FILE under DIR: a linted notebook, or a
  linted source reached through a symbolic link (``-o report.txt`` -> ``src/a.py``), was
  overwritten by the report.
* ``-o PATH/`` (a trailing slash: a directory) that is not an existing directory wrote the file
  PATH, replacing one already there, where a shell's ``> PATH/`` fails.
* ``plan``, ``bench``, ``guard`` and ``serve`` ended in a traceback (exit 1) when ``import torch`` itself
  fails (``TORCH_LOGS=bogus``); ``doctor`` alone said why and how to fix it.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchplace import report
from torchplace.cli import main
from torchplace.errors import ConfigError

NOT_UTF8 = os.fsdecode(b"f\xffind.py")  # '\udcff' stands for the byte python cannot decode
FINDING = (
    "import torch\n"
    "class M(torch.nn.Module):\n"
    "    def forward(self, x):\n"
    "        x.cuda()\n"
    "        return x\n"
)


def test_list_rules_writes_to_the_output_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "rules.txt"
    assert main(["lint", "--list-rules", "-o", str(target)]) == 0
    out = capsys.readouterr().out
    assert out == ""
    assert "TPL101" in target.read_text(encoding="utf-8")


def test_list_rules_into_a_missing_directory_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["lint", "--list-rules", "-o", str(tmp_path / "no" / "rules.txt")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "does not exist" in captured.err


@pytest.mark.parametrize("flags", [["--json"], ["--format", "json"], ["--format", "sarif"]])
def test_list_rules_in_a_machine_format_is_a_usage_error_not_text(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["lint", "--list-rules", *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no text where a program expects JSON
    assert "--list-rules" in captured.err


def _not_utf8_file(tmp_path: Path) -> Path:
    if sys.platform == "win32":  # pragma: no cover - names are UTF-16 there
        pytest.skip("POSIX file names only")
    path = tmp_path / NOT_UTF8
    try:
        path.write_text(FINDING, encoding="utf-8")
    except (OSError, UnicodeEncodeError):  # pragma: no cover - a file system that refuses it
        pytest.skip("this file system refuses a name that is not UTF-8")
    return path


@pytest.mark.parametrize("fmt", ["text", "github", "json", "sarif"])
def test_a_non_utf8_file_name_is_written_to_the_output_file(
    fmt: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _not_utf8_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "report.out"
    assert main(["lint", "--format", fmt, NOT_UTF8, "-o", str(target)]) == 1
    assert "Traceback" not in capsys.readouterr().err
    text = target.read_bytes().decode("utf-8")  # still valid UTF-8
    assert "TPL102" in text
    assert "\\udcff" in text or "\\\\udcff" in text


def test_a_non_utf8_file_name_on_a_strict_stdout_is_written_not_a_traceback(
    tmp_path: Path,
) -> None:
    _not_utf8_file(tmp_path)
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}  # strict: surrogates cannot be encoded
    done = subprocess.run(
        [sys.executable, "-m", "torchplace", "lint", os.fsencode(NOT_UTF8)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
    assert done.returncode == 1
    assert b"f\\udcffind.py:4:9: TPL102" in done.stdout


def test_write_report_escapes_what_a_strict_stream_cannot_encode() -> None:
    buffer = io.BytesIO()
    stream = io.TextIOWrapper(buffer, encoding="utf-8", errors="strict")
    report.write_report(f"{NOT_UTF8}: finding\n", None, stream=stream)
    assert buffer.getvalue() == b"f\\udcffind.py: finding\n"


def _torchplace(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``torchplace ARGS`` in ``cwd``, with ``env`` over this environment."""
    return subprocess.run(
        [sys.executable, "-m", "torchplace", *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _guard(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return _torchplace(["guard", *args], cwd, PYTHONPATH=str(cwd))


@pytest.mark.parametrize(
    ("files", "output", "program"),
    [
        ({"solo.py": "print('solo')\n"}, "solo.py", ["-m", "solo"]),
        (
            {"pkg/__init__.py": "", "pkg/__main__.py": "print('pkg')\n"},
            "pkg/__main__.py",
            ["python", "-m", "pkg"],
        ),
        (
            {"pkg/__init__.py": "", "pkg/tool.py": "print('tool')\n"},
            "pkg/tool.py",
            ["-m", "pkg.tool"],
        ),
        ({"app/__main__.py": "print('app')\n"}, "app/__main__.py", ["app"]),
    ],
)
def test_guard_output_onto_the_file_the_program_runs_from_is_refused(
    files: dict[str, str], output: str, program: list[str], tmp_path: Path
) -> None:
    for name, source in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    proc = _guard(["-o", output, "--", *program], tmp_path)
    assert (tmp_path / output).read_text() == files[output], "the report overwrote the program"
    assert proc.returncode == 2, proc.stderr
    assert "also an input" in proc.stderr
    assert proc.stdout == ""  # refused before the program ran


def test_guard_module_beside_its_report_still_runs(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "__main__.py").write_text("print('ran')\n")
    proc = _guard(["--json", "-o", "report.json", "--", "-m", "pkg"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ran\n"
    assert '"command": "guard"' in (tmp_path / "report.json").read_text()


@pytest.mark.parametrize(
    "command",
    [
        ["plan", "--json"],
        ["bench", "timing", "--json"],
        ["guard", "--json", "--", "prog.py"],
        ["serve", "--port", "0", "--grpc-port", "0"],
    ],
)
def test_a_torch_that_cannot_be_imported_is_named_not_a_traceback(
    command: list[str], tmp_path: Path
) -> None:
    (tmp_path / "prog.py").write_text("print('ran')\n")
    done = _torchplace(command, tmp_path, TORCH_LOGS="no-such-log")  # torch raises on import
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 1
    assert done.stdout == ""
    assert "torch cannot be imported" in done.stderr
    assert "TORCH_LOGS=no-such-log" in done.stderr  # the fix names the variable


NOTEBOOK = (
    '{"cells": [{"cell_type": "code", "source": ["import torch\\n", '
    '"x = torch.load(\'m.pt\')\\n"], "metadata": {}, "outputs": [], '
    '"execution_count": null}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
)


def test_lint_output_onto_a_linted_notebook_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nbs").mkdir()
    (tmp_path / "nbs" / "train.ipynb").write_text(NOTEBOOK)
    assert main(["lint", "nbs", "-o", "nbs/train.ipynb"]) == 2
    assert (tmp_path / "nbs" / "train.ipynb").read_text() == NOTEBOOK
    assert "also an input" in capsys.readouterr().err


@pytest.mark.parametrize("link", ["report.txt", "src/report.txt"])
def test_lint_output_through_a_link_to_a_linted_source_is_refused(
    link: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "a.py"
    source.write_text(FINDING)
    (tmp_path / link).symlink_to(source)
    assert main(["lint", "src", "-o", link]) == 2
    assert source.read_text() == FINDING, "the report overwrote the linted source"
    assert "also an input" in capsys.readouterr().err


def test_lint_output_beside_its_sources_is_still_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text(FINDING)
    (tmp_path / "src" / "old.ipynb.txt").write_text("old")
    assert main(["lint", "src", "-o", "src/report.txt"]) == 1
    assert "TPL102" in (tmp_path / "src" / "report.txt").read_text()


@pytest.mark.parametrize("exists", [False, True])
def test_an_output_with_a_trailing_slash_is_not_written_as_a_file(
    exists: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.py").write_text("x = 1\n")
    if exists:
        (tmp_path / "out").write_text("keep")
    assert main(["lint", "a.py", "-o", "out/"]) == 2
    assert "names a directory" in capsys.readouterr().err
    if exists:
        assert (tmp_path / "out").read_text() == "keep"
    else:
        assert not (tmp_path / "out").exists()


def test_check_output_refuses_a_trailing_slash_for_any_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--export device-map .*names a directory"):
        report.check_output(f"{tmp_path}/map.json/", flag="--export device-map")
    with pytest.raises(ConfigError, match="is a directory"):  # an existing one, as before
        report.check_output(f"{tmp_path}/")
