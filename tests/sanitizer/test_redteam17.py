"""Round 17 of the new-user red team on ``torchplace guard``: warn mode under warnings-as-errors,
and python's own options (``python -u train.py``) on the guarded command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import torchplace
from torchplace.cli import main
from torchplace.sanitizer import GuardWarning
from torchplace.sanitizer.cli import split_program

#: the torchplace these tests import, for the programs they start
SRC = str(Path(torchplace.__file__).resolve().parents[1])

PROGRAM = textwrap.dedent(
    """\
    import sys
    import warnings
    import torch

    x = torch.randn(4).to("meta")
    filters = [(f[0], f[2].__name__) for f in warnings.filters[:2]]
    print("survived", sys.warnoptions, sys.dont_write_bytecode, filters)
    print("stdout", type(sys.stdout.buffer).__name__)
    """
)


@pytest.fixture
def program(tmp_path: Path) -> Path:
    path = tmp_path / "p.py"
    path.write_text(PROGRAM)
    return path


def _guard(*words: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": SRC, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "torchplace", "guard", *words],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )


# -- A: warn mode never raises into the program -------------------------------------------


def test_warn_mode_under_an_error_filter_shows_the_warning_and_records_on() -> None:
    # was: the GuardWarning was raised inside the program's .to(), which died of it, and the
    # sync of that same copy went unrecorded
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("error")
        with torchplace.guard(mode="warn") as report:
            torch.randn(4).to("meta")
            reached = True
    assert reached
    assert [e.kind for e in report.events] == ["h2d", "sync"]
    shown = [w for w in seen if issubclass(w.category, GuardWarning)]
    assert len(shown) == 2
    assert "H2D copy of 16 bytes" in str(shown[0].message)
    assert shown[0].filename == __file__


def test_pytest_warns_still_catches_the_guard_warning() -> None:
    with pytest.warns(GuardWarning, match="torchplace guard"), torchplace.guard(mode="warn"):
        torch.randn(4).to("meta")


def test_guard_warn_with_pythonwarnings_error_lets_the_program_run(program: Path) -> None:
    done = _guard(
        "--mode", "warn", "--json", "--", "python", str(program), env={"PYTHONWARNINGS": "error"}
    )
    assert done.returncode == 0, done.stderr
    assert "survived" in done.stdout
    assert "GuardWarning: torchplace guard: H2D copy" in done.stderr
    report = json.loads(done.stderr[done.stderr.index("{\n") :])["result"]
    assert report["totals"]["h2d"]["count"] == 1
    assert report["totals"]["sync"]["count"] == 1
    assert report["program"]["exit_status"] == 0


# -- E: python's own options -------------------------------------------------------------------


def test_u_b_and_w_are_applied_to_the_program(program: Path) -> None:
    # was: "unsupported interpreter option '-u'", exit 2
    done = _guard("--", "python", "-u", "-B", "-W", "ignore::DeprecationWarning", str(program))
    assert done.returncode == 0, done.stderr
    assert "survived ['ignore::DeprecationWarning'] True" in done.stdout
    assert "('ignore', 'DeprecationWarning')" in done.stdout
    assert "stdout FileIO" in done.stdout  # unbuffered, as python -u makes it


def test_the_options_are_undone_after_the_program(program: Path, tmp_path: Path) -> None:
    before = (sys.warnoptions[:], sys.dont_write_bytecode, sys.stdout, list(warnings.filters))
    out = tmp_path / "r.json"
    argv = ["guard", "--json", "-o", str(out), "--", "python", "-uB", "-Werror::UserWarning"]
    assert main([*argv, str(program)]) == 0
    after = (sys.warnoptions[:], sys.dont_write_bytecode, sys.stdout, list(warnings.filters))
    assert after == before
    assert json.loads(out.read_text())["result"]["totals"]["h2d"]["count"] == 1


@pytest.mark.parametrize(
    ("options", "named", "fix"),
    [
        (["-O"], "-O", "PYTHONOPTIMIZE=1"),
        (["-OO"], "-OO", "PYTHONOPTIMIZE=2"),
        (["-X", "dev"], "-X dev", "PYTHONDEVMODE=1"),
        (["-X", "utf8"], "-X utf8", "PYTHONUTF8=1"),
        (["-X", "importtime"], "-X importtime", "PYTHONPROFILEIMPORTTIME=1"),
        (["-s"], "-s", "PYTHONNOUSERSITE=1"),
        (["-u", "-E"], "-E", "python -E -m torchplace guard"),
        (["-I"], "-I", "python -I -m torchplace guard"),
    ],
)
def test_an_option_guard_cannot_apply_names_what_does(
    options: list[str],
    named: str,
    fix: str,
    program: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # was: "unsupported interpreter option '-O'; give a script path or -m module", no fix
    assert main(["guard", "--", "python", *options, str(program)]) == 2
    err = capsys.readouterr().err
    assert f"unsupported interpreter option {named!r}" in err
    assert fix in err


def test_a_bad_warnings_filter_is_a_usage_error(
    program: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["guard", "--", "python", "-W", "bogus", str(program)]) == 2
    err = capsys.readouterr().err
    assert "'-W bogus'" in err
    assert "ignore::DeprecationWarning" in err


def test_split_program_reads_python_options_before_a_module_or_script(program: Path) -> None:
    assert split_program(["python", "-u", "-m", "pkg.mod", "x"]) == (
        "module",
        "pkg.mod",
        ["pkg.mod", "x"],
    )
    assert split_program(["python", "-um", "pkg", "x"]) == ("module", "pkg", ["pkg", "x"])
    assert split_program(["python", "-Wignore", "-B", str(program), "a"]) == (
        "path",
        str(program),
        [str(program), "a"],
    )
