"""Hostile and unusual input to the command-line tools.

Every command follows one convention (docs/cli.md): exit 0 fine, 1 the check found something
or failed, 2 usage or input error; bad input gets one clear line naming the value and the fix,
never a Python traceback; an ``-o`` path that cannot be written is refused before any work.
Each test here pins one way that convention was broken by an odd input.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchplace.cli import main
from torchplace.errors import TorchplaceError


def _cli(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``torchplace ARGS`` in a fresh interpreter, run from ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "torchplace.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback (most recent call last)" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------- lint


@pytest.mark.parametrize("tool", ['[tool]\ntorchplace = "x"\n', "tool = 3\n"])
def test_lint_pyproject_whose_tool_is_not_a_table_is_a_usage_error(
    tmp_path: Path, tool: str
) -> None:
    # lint/config.py: data.get("tool", {}).get("torchplace", {}) assumes tables all the way
    (tmp_path / "pyproject.toml").write_text(tool)
    (tmp_path / "ok.py").write_text("x = 1\n")
    proc = _cli(["lint", "--json", "ok.py"], tmp_path)
    _no_traceback(proc)
    assert proc.returncode == 2, proc.stderr
    assert "pyproject.toml" in proc.stderr
    assert proc.stdout == ""


def test_lint_output_onto_a_linted_file_is_refused(tmp_path: Path) -> None:
    source = "import torch\nx = torch.zeros(3)\n"
    (tmp_path / "victim.py").write_text(source)
    proc = _cli(["lint", "--isolated", "victim.py", "-o", "victim.py"], tmp_path)
    assert (tmp_path / "victim.py").read_text() == source, "the report overwrote the source"
    assert proc.returncode == 2, proc.stderr
    assert "victim.py" in proc.stderr


@pytest.mark.parametrize(("name", "escaped"), [("a,b.py", "a%2Cb.py"), ("a:b.py", "a%3Ab.py")])
def test_lint_github_format_escapes_the_file_property(
    tmp_path: Path, name: str, escaped: str
) -> None:
    # GitHub workflow commands: in a property value ',' ends the property and ':' (as '::')
    # ends the properties; both must be escaped (%2C, %3A) as '%', CR and LF already are.
    (tmp_path / name).write_text('import torch\nx = torch.load("m.pt", weights_only=True)\n')
    proc = _cli(["lint", "--isolated", "--format", "github", name], tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines, proc.stderr
    for line in lines:
        assert f"file={escaped}," in line, line


# ---------------------------------------------------------------------------- -o paths


def test_output_into_a_symlink_loop_is_refused_before_the_work(tmp_path: Path) -> None:
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    proc = _cli(["doctor", "--no-smoke", "--json", "-o", "loop1"], tmp_path)
    _no_traceback(proc)
    assert proc.returncode == 2, proc.stderr  # an unwritable -o path is a usage error
    assert "loop1" in proc.stderr


def test_output_through_a_dangling_symlink_into_a_missing_directory_is_refused(
    tmp_path: Path,
) -> None:
    (tmp_path / "report.json").symlink_to(tmp_path / "missing" / "report.json")
    proc = _cli(["doctor", "--no-smoke", "--json", "-o", "report.json"], tmp_path)
    _no_traceback(proc)
    assert proc.returncode == 2, proc.stderr
    assert "report.json" in proc.stderr


def test_output_with_a_file_name_too_long_is_a_usage_error(tmp_path: Path) -> None:
    name = "a" * 300 + ".json"
    proc = _cli(["doctor", "--no-smoke", "--json", "-o", name], tmp_path)
    _no_traceback(proc)
    assert proc.returncode == 2, proc.stderr


def test_empty_output_path_is_named_as_given(capsys: pytest.CaptureFixture[str]) -> None:
    # `-o ''` was reported as "-o '.' is a directory": a value the user never typed
    assert main(["doctor", "--no-smoke", "--json", "-o", ""]) == 2
    err = capsys.readouterr().err
    assert "'.'" not in err, err
    assert "-o ''" in err or "empty" in err, err


# ---------------------------------------------------------------------------- guard


def test_guard_output_onto_its_own_script_is_refused(tmp_path: Path) -> None:
    source = "print('hi')\n"
    (tmp_path / "prog.py").write_text(source)
    proc = _cli(["guard", "-o", "prog.py", "--", "python", "prog.py"], tmp_path)
    assert (tmp_path / "prog.py").read_text() == source, "the report overwrote the program"
    assert proc.returncode == 2, proc.stderr


def test_guard_reports_when_the_program_closes_sys_stderr(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text("import sys\nsys.stderr.close()\n")
    proc = _cli(["guard", "--json", "--", "python", "prog.py"], tmp_path)
    assert "lost sys.stderr" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr  # the program ended well
    start = proc.stderr.index("{")
    document = json.loads(proc.stderr[start:])
    assert document["command"] == "guard"
    assert document["result"]["program"]["exit_status"] == 0


# ---------------------------------------------------------------------------- bench


@pytest.mark.parametrize(
    "module_text",
    [
        "def make(:\n",  # a syntax error
        "raise RuntimeError('import boom')\n",  # raises on import
        "import sys\nsys.exit(3)\n",  # exits on import
    ],
)
def test_bench_model_factory_module_that_fails_on_import_is_a_usage_error(
    tmp_path: Path, module_text: str
) -> None:
    (tmp_path / "badmod.py").write_text(module_text)
    proc = _cli(
        [
            "bench", "model", "--device", "cpu", "--json", "--model", "badmod:make",
            "--input-shape", "4", "--batch-sizes", "1", "--min-time", "0.01",
        ],
        tmp_path,
    )  # fmt: skip
    _no_traceback(proc)
    assert proc.returncode == 2, proc.stderr
    assert "badmod" in proc.stderr
    assert proc.stdout == ""


# ---------------------------------------------------------------------------- plan


def test_plan_documented_sequence_input_is_accepted(tmp_path: Path) -> None:
    # docs/plan.md: "--input x:FP32:-1,-1 --seq 256": the first -1 is the batch, a later -1 the
    # sequence; the API takes it, the command refused it as serve's declaration would
    (tmp_path / "emb.py").write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 2))\n"
    )
    proc = _cli(
        ["plan", "--model", "emb:build", "--input", "x:INT64:-1,-1", "--seq", "16", "--json"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["command"] == "plan"


@pytest.mark.parametrize("dim", ["99999999999999999999", "9223372036854775807"])
def test_plan_input_with_an_enormous_dimension_is_a_usage_error(tmp_path: Path, dim: str) -> None:
    proc = _cli(["plan", "--input", f"x:FP32:-1,{dim}", "--json"], tmp_path)
    _no_traceback(proc)
    assert proc.returncode == 2, proc.stderr
    assert dim in proc.stderr
    assert proc.stdout == ""


def test_plan_plot_that_is_not_a_png_is_refused_before_the_work(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    proc = _cli(["plan", "--plot", "plan.txt"], tmp_path)
    _no_traceback(proc)
    assert proc.returncode == 2, proc.stderr
    assert "plan.txt" in proc.stderr
    assert proc.stdout == ""  # refused before the plan is drawn and reported


def test_plan_output_and_export_to_the_same_file_is_refused(tmp_path: Path) -> None:
    proc = _cli(
        ["plan", "--json", "-o", "same.json", "--export", "device-map", "same.json"], tmp_path
    )
    # one of the two documents would silently overwrite the other
    assert proc.returncode == 2, proc.stderr
    assert "same.json" in proc.stderr


# ---------------------------------------------------------------------------- serve


def test_serve_refuses_a_torch_thread_count_that_crashes_torch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # torch.set_num_threads(100000) segfaults the process at the first op (bench caps
    # --threads at 1024 for that reason); serve accepted it and crashed at engine start.
    import torchplace.serve.cli as serve_cli
    import torchplace.serve.running as running

    started: list[Any] = []

    async def no_server(config: Any, **kwargs: Any) -> int:
        started.append(config)
        return 0

    monkeypatch.setattr(running, "serve", no_server)
    monkeypatch.setattr(serve_cli, "_require_serve_extra", lambda: None)
    interval = sys.getswitchinterval()
    try:
        code = main(["serve", "--device", "cpu", "--torch-threads", "100000"])
    finally:
        sys.setswitchinterval(interval)
    assert code == 2
    assert not started, "the server was started with 100000 torch threads"
    assert "torch-threads" in capsys.readouterr().err.replace("_", "-")


def test_serve_input_with_an_enormous_dimension_is_a_config_error() -> None:
    # the declaration passed validation, then numpy raised ValueError staging the dry run's
    # batch (serve/staging.py), a traceback out of `torchplace serve --input ...`
    from torchplace.serve.config import ServeConfig
    from torchplace.serve.engine import Engine

    async def start() -> None:
        config = ServeConfig.from_mapping(
            {"device": "cpu", "inputs": ["input:FP32:-1,99999999999999999999"]}
        )
        engine = Engine.from_config(config)
        await engine.start()

    with pytest.raises(TorchplaceError):
        asyncio.run(start())


# ---------------------------------------------------------------------------- messages


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["guard", "--max-events", "-5", "--", "python", "prog.py"], "--max-events must be >= 0"),
        (["bench", "transfer", "--min-time", "inf"], "'inf' is not a positive finite number"),
        (["plan", "--tolerance", "nan"], "--tolerance nan must be a fraction"),
        (["serve", "--exported", "."], "exported program '.' is a directory"),
        (["plan", "--exported", "prog.py"], "exported program 'prog.py' is not a .pt2 archive"),
        (["serve", "--weights", "missing.pt"], "weights 'missing.pt' does not exist"),
    ],
)
def test_bad_values_are_usage_errors_named_as_the_flags(
    tmp_path: Path, args: list[str], words: str
) -> None:
    """Named by the flag the user typed (not the API's parameter), refused before any work,
    exit 2: a missing --weights file is the user's path to fix, as a missing --exported is."""
    (tmp_path / "prog.py").write_text("pass\n")
    proc = _cli(args, tmp_path)
    _no_traceback(proc)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr, proc.stderr


def test_a_path_that_is_not_a_regular_file_is_named_for_what_it_is(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.py")
    (tmp_path / "dangling.py").symlink_to(tmp_path / "missing.py")
    guard = _cli(["guard", "--", "python", "fifo.py"], tmp_path)
    assert guard.returncode == 2
    assert "'fifo.py' is not a regular file" in guard.stderr, guard.stderr
    lint = _cli(["lint", "--isolated", "dangling.py"], tmp_path)
    assert "a symbolic link to a file that does not exist" in lint.stdout, lint.stdout
