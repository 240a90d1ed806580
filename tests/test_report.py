"""The one output convention: every report command's JSON validates against its shipped schema,
whichever way it is asked for, and every report command gives the same exit statuses.

A command registered with ``report=True`` in ``torchplace.cli.COMMANDS`` is covered by both tests
as soon as it is registered: they fail, naming it, until it has sample invocations here.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
from pathlib import Path

import pytest

from torchplace import report
from torchplace.cli import COMMANDS, main
from torchplace.errors import ConfigError

# a GPU machine's image may lack the test extra: skip there, never fail the collection
jsonschema = pytest.importorskip("jsonschema")

REPORT_COMMANDS = sorted(name for name, command in COMMANDS.items() if command.report)
OUTPUT = "<output options>"  # where a sample takes --format/--json/-o
# Where each report goes without -o: stdout, except these.
STREAMS = {"guard": "err"}

GOOD_SCRIPT = "import torch\nx = torch.ones(2, 3).to('meta')\n"
FAILING_SCRIPT = "import sys\nsys.exit(3)\n"
BAD_SOURCE = "import torch\nstate = torch.load('m.pt')\n"
CLEAN_SOURCE = "import torch\nstate = torch.load('m.pt', map_location='cpu', weights_only=True)\n"


@pytest.fixture
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The inputs the samples name, in a directory whose name does not start with "test" (lint
    treats such paths as test code, where some rules do not apply)."""
    tmp_path = tmp_path_factory.mktemp("inputs")
    paths = {
        "good.py": GOOD_SCRIPT,
        "failing.py": FAILING_SCRIPT,
        "bad_source.py": BAD_SOURCE,
        "clean_source.py": CLEAN_SOURCE,
    }
    for name, text in paths.items():
        (tmp_path / name).write_text(text)
    return {name: str(tmp_path / name) for name in paths}


def samples(command: str, files: dict[str, str]) -> list[list[str]]:
    """Fast invocations (CPU, small sizes) that cover every subcommand of a report command."""
    cpu_bench = ["--device", "cpu", OUTPUT]
    table = {
        "doctor": [["--device", "cpu", "--no-smoke", OUTPUT]],
        "guard": [[OUTPUT, "--", "python", files["good.py"]]],
        "bench": [
            ["timing", "--size", "8", "--repeats", "2", "--warmup", "0", *cpu_bench],
            ["transfer", *cpu_bench],
            ["overlap", *cpu_bench],
            ["model", "--batch-sizes", "1", "--min-time", "0.001", *cpu_bench],
        ],
        "lint": [["--isolated", OUTPUT, files["bad_source.py"]]],
        "plan": [["--model", "seed-mlp", OUTPUT], ["--model", "seed-mlp", "--verify", OUTPUT]],
    }
    if command not in table:
        pytest.fail(f"report command {command!r} has no sample invocation in {__file__}")
    return table[command]


def exit_cases(command: str, files: dict[str, str]) -> dict[int, list[list[str]]]:
    """Invocations for each exit status: 0 fine, 1 found something or failed, 2 usage error."""
    table = {
        "doctor": {
            0: [["--device", "cpu", "--no-smoke"]],
            1: [["--device", "cuda:99", "--no-smoke"]],
            2: [["--device", "tpu"], ["--bogus"]],
        },
        "guard": {
            0: [["--", "python", files["good.py"]]],
            1: [["--", "python", files["failing.py"]], ["--mode", "raise", files["good.py"]]],
            2: [[], ["--top", "-1", files["good.py"]], ["--format", "xml", files["good.py"]]],
        },
        "bench": {
            0: [["timing", "--device", "cpu", "--size", "8", "--repeats", "2"]],
            1: [["timing", "--device", "meta"]],
            2: [["timing", "--device", "cpu", "--warmup", "-1"], ["timing", "--json", "x.json"]],
        },
        "lint": {
            0: [["--isolated", files["clean_source.py"]]],
            1: [["--isolated", files["bad_source.py"]]],
            2: [["--select", "TPL999", files["bad_source.py"]], ["--format", "xml"]],
        },
        "plan": {
            0: [["--model", "seed-mlp"]],
            1: [["--model", "wide-mlp", "--assume", "2x16MiB"]],
            2: [["--model", "seed-mlp", "--assume", "2xB300"], ["--bogus"]],
        },
    }
    if command not in table:
        pytest.fail(f"report command {command!r} has no exit-status cases in {__file__}")
    return table[command]


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        return int(exc.code or 0)


def _with_output(command: str, sample: list[str], options: list[str]) -> list[str]:
    """``command`` and a sample's words, its OUTPUT mark replaced by ``options``."""
    argv = [command]
    for word in sample:
        argv += options if word == OUTPUT else [word]
    return argv


def _subcommands(command: str) -> set[str]:
    module = importlib.import_module(COMMANDS[command].module)
    parser = argparse.ArgumentParser()
    module.configure(parser)
    return {
        name
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    }


def _validate(command: str, text: str) -> None:
    document = json.loads(text)
    schema = report.load_schema(command)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(document)
    assert document["schema"] == report.schema_id(command)
    assert document["command"] == command
    assert list(document) == ["schema", "command", "torchplace", "torch", "device", "result"]


def test_the_registry_marks_every_report_command() -> None:
    assert {"doctor", "guard", "bench", "lint"} <= set(REPORT_COMMANDS)
    for command in REPORT_COMMANDS:
        assert report.schema_path(command).is_file(), f"{command} ships no schema"


@pytest.mark.parametrize("form", ["format-json-output", "json-flag"])
@pytest.mark.parametrize("command", REPORT_COMMANDS)
def test_every_report_command_writes_json_that_its_schema_accepts(
    command: str,
    form: str,
    files: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    invocations = samples(command, files)
    covered = {argv[0] for argv in invocations}
    assert _subcommands(command) <= covered, f"a subcommand of {command} has no sample"
    for i, sample in enumerate(invocations):
        out = tmp_path / f"{command}-{i}.json"
        options = (
            ["--format", "json", "-o", str(out)] if form == "format-json-output" else ["--json"]
        )
        argv = _with_output(command, sample, options)
        code = _run(argv)
        captured = capsys.readouterr()
        assert code in (report.EXIT_OK, report.EXIT_FAILED), (argv, captured.err)
        stream = captured.err if STREAMS.get(command) == "err" else captured.out
        if form == "format-json-output":
            assert report.schema_id(command) not in stream  # the report went to the file only
            _validate(command, out.read_text())
        else:
            _validate(command, stream)


@pytest.mark.parametrize("command", REPORT_COMMANDS)
def test_output_dash_is_standard_output_for_every_report_command(
    command: str,
    files: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = _with_output(command, samples(command, files)[0], ["--format", "json", "-o", "-"])
    code = _run(argv)
    captured = capsys.readouterr()
    assert code in (report.EXIT_OK, report.EXIT_FAILED), (argv, captured.err)
    _validate(command, captured.out)  # on stdout, guard's too, as '-' asks
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("command", REPORT_COMMANDS)
def test_every_report_command_exits_0_fine_1_found_2_usage(
    command: str,
    files: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    cases = exit_cases(command, files)
    assert set(cases) == {report.EXIT_OK, report.EXIT_FAILED, report.EXIT_USAGE}
    for expected, invocations in cases.items():
        for argv in invocations:
            code = _run([command, *argv])
            captured = capsys.readouterr()
            assert code == expected, (argv, captured.err)
            if expected == report.EXIT_USAGE:
                assert "Traceback" not in captured.err
                assert captured.err.strip(), f"{argv}: a usage error must say what is wrong"


def test_json_never_takes_an_argument(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    report.add_output_options(parser)
    assert parser.parse_args(["--json"]).format == "json"
    assert parser.parse_args([]).format == "text"
    with pytest.raises(SystemExit):
        parser.parse_args(["--json", "out.json"])
    assert "unrecognized arguments: out.json" in capsys.readouterr().err


def test_envelope_names_the_schema_and_the_versions() -> None:
    import torch

    import torchplace

    document = report.envelope("lint", {"files": 0})
    assert document["schema"] == "torchplace.lint/v1"
    assert document["torchplace"] == torchplace.__version__
    assert document["torch"] == torch.__version__
    assert document["device"] is None
    assert document["result"] == {"files": 0}


@pytest.mark.parametrize("problem", ["missing-dir", "a-directory"])
def test_an_unwritable_output_is_a_usage_error(problem: str, tmp_path: Path) -> None:
    path = tmp_path / "nodir" / "r.json" if problem == "missing-dir" else tmp_path
    with pytest.raises(ConfigError, match=re.escape(str(path))):
        report.check_output(path)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_output_no_file_can_be_made_in_is_a_usage_error_for_root_too() -> None:
    """os.access says yes to root for /proc; the probe opens the file as the write would."""
    with pytest.raises(ConfigError, match=re.escape("/proc/torchplace-report.json")):
        report.check_output("/proc/torchplace-report.json")


def test_checking_an_output_changes_nothing(tmp_path: Path) -> None:
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    old.write_text("kept")
    report.check_output(new)
    report.check_output(old)
    assert not new.exists()
    assert old.read_text() == "kept"


def test_lint_reports_json_without_importing_torch(files: dict[str, str], tmp_path: Path) -> None:
    import subprocess
    import sys

    import torch

    source = files["bad_source.py"]
    code = (
        "import sys\n"
        "from torchplace.cli import main\n"
        f"code = main(['lint', '--isolated', '--json', {source!r}])\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == report.EXIT_FAILED, done.stderr
    document = json.loads(done.stdout)
    assert document["torch"] == torch.__version__  # read from the installed metadata
    assert {f["code"] for f in document["result"]["findings"]} >= {"TPL401"}


@pytest.mark.parametrize("command", REPORT_COMMANDS)
def test_the_schemas_refuse_a_broken_envelope(command: str) -> None:
    validator = jsonschema.Draft202012Validator(report.load_schema(command))
    good = report.envelope(command, {})
    for broken in (
        {key: value for key, value in good.items() if key != "result"},
        {**good, "schema": f"torchplace.{command}/v0"},
        {**good, "extra": 1},
        {**good, "result": {"unexpected": True}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(json.loads(report.to_json(broken)))


def test_the_bench_schema_checks_the_figures_of_each_benchmark() -> None:
    validator = jsonschema.Draft202012Validator(report.load_schema("bench"))
    result = {
        "benchmark": "timing",
        "threads": 1,
        "skipped": False,
        "reason": None,
        "figures": {"rows": "not a list"},
        "plot": None,
        "warnings": [],
    }
    with pytest.raises(jsonschema.ValidationError, match=r"required|rows"):
        validator.validate(report.envelope("bench", result, device="cpu"))


def test_a_failed_write_to_the_output_file_names_the_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    with pytest.raises(OSError, match="No space left") as caught:
        report.write_report("x" * 100_000, "/dev/full")
    assert caught.value.filename == "/dev/full"
    # and the command turns it into a one-line error, not a traceback
    assert main(["doctor", "--no-smoke", "--json", "-o", "/dev/full"]) == 1
    err = capsys.readouterr().err
    assert "cannot use '/dev/full'" in err
    assert "Traceback" not in err


def test_a_closed_stdout_is_a_clear_error_not_a_traceback() -> None:
    import subprocess
    import sys

    for words in (["--json"], []):
        proc = subprocess.run(
            [sys.executable, "-m", "torchplace.cli", "doctor", "--no-smoke", *words],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            # the child starts with file descriptor 1 closed, as `torchplace doctor >&-` does
            preexec_fn=lambda: __import__("os").close(1),
        )
        assert proc.returncode == 2, proc.stderr
        assert "standard output is closed" in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "work"),
    [
        (["doctor", "--no-smoke"], "torchplace.doctor.cli.collect"),
        (["bench", "timing", "--size", "8"], "torchplace.devices.resolve_device"),
        (["plan", "-o", "-"], "torchplace.planner.api.plan"),
    ],
)
def test_a_closed_stdout_is_refused_before_the_work(
    argv: list[str],
    work: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # it was found when the report was written, after minutes of benchmark or planning
    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the work started")

    monkeypatch.setattr(work, started)
    monkeypatch.setattr("sys.stdout", None)  # as `torchplace ... >&-` starts
    assert main(argv) == 2
    assert "standard output is closed" in capsys.readouterr().err


def test_check_stdout_leaves_a_report_written_to_a_file_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("sys.stdout", None)
    report.check_stdout(tmp_path / "report.txt")
    with pytest.raises(ConfigError, match="standard output is closed"):
        report.check_stdout("-")
