from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from torchplace.cli import COMMANDS, main


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_no_command_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
    assert "frobnicate" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert f"torchplace {command}" in capsys.readouterr().out


def test_a_path_after_json_gets_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "timing", "--device", "cpu", "--json", "out.json"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: out.json" in err
    assert "--json takes no argument: write the report to a file with -o out.json" in err


@pytest.mark.parametrize(
    ("argv", "fix"),
    [
        (
            ["doctor", "-v"],
            "-v is torchplace's own option, given before the command: torchplace -v doctor",
        ),
        (["plan", "-vv"], "given before the command: torchplace -v plan"),
        (
            ["guard", "-m", "pkg"],
            "to run a module, give it after --: torchplace guard -- -m MODULE",
        ),
        (["guard", "--json", "-m", "pkg"], "give it after --: torchplace guard -- -m MODULE"),
    ],
)
def test_an_option_in_the_wrong_place_gets_the_fix(
    argv: list[str], fix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # it said "unrecognized arguments: -m" alone, or sent --json -m to "-o -m"
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert fix in err
    assert "-o -m" not in err


@pytest.mark.parametrize("module", ["torchplace", "torchplace.cli"])
def test_version(module: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", module, "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0
    assert out.stdout.startswith("torchplace ")


def _cli_isolated(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    """``torchplace ARGS`` as the console script runs it: the current directory not on sys.path."""
    code = "import sys; from torchplace.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-I", "-c", code, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_modules_in_the_current_directory_are_importable(tmp_path: Path) -> None:
    (tmp_path / "tp_cwd_probe.py").write_text("import sys\nprint('probe ran', sys.argv[1:])\n")
    proc = _cli_isolated(["guard", "--", "python", "-m", "tp_cwd_probe", "x"], tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "probe ran ['x']" in out


def test_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    source = tmp_path / "many.py"
    source.write_text("import torch\n" + "torch.load('m.pt')\n" * 2000)
    proc = _cli_isolated(["lint", "--format", "json", str(source)], tmp_path)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader goes away, like `| head`
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in err
    assert "BrokenPipe" not in err


def test_unwritable_output_path_is_a_usage_error_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    missing = tmp_path / "nodir" / "report.json"
    assert main(["guard", "-o", str(missing), "--", "python", str(script)]) == 2
    captured = capsys.readouterr()
    assert str(missing) in captured.err
    assert "ran" not in captured.out
    assert "Traceback" not in captured.err


def test_an_os_error_naming_a_file_is_reported_not_raised(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = types.ModuleType("fake_command")
    fake.configure = lambda parser: None  # type: ignore[attr-defined]

    def run(args: object) -> int:
        raise FileNotFoundError(2, "No such file or directory", "/no/such/file")

    fake.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_command", fake)
    monkeypatch.setitem(COMMANDS, "lint", COMMANDS["lint"]._replace(module="fake_command"))
    assert main(["lint"]) == 1
    err = capsys.readouterr().err
    assert "/no/such/file" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("encoding", ["ascii", "cp1252"])
def test_a_report_to_an_output_that_cannot_encode_its_symbols_is_written_whole(
    tmp_path: Path, encoding: str
) -> None:
    """``PYTHONIOENCODING=cp1252`` (a redirect on Windows): doctor's check marks stopped the
    report half-written with ``UnicodeEncodeError``; they are written as escapes instead."""
    env = {**os.environ, "PYTHONIOENCODING": encoding}
    code = "import sys; from torchplace.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, "doctor", "--no-smoke", "--device", "cpu"],
        cwd=tmp_path,
        capture_output=True,
        env=env,
        timeout=300,
    )
    assert b"Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.returncode in (0, 1)
    assert b"\\u2713" in done.stdout or b"\\u2717" in done.stdout
