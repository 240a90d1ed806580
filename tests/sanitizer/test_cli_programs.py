"""``torchplace guard``: a program behaves under guard as it does when python runs it plainly."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

GUARD = [sys.executable, "-m", "torchplace.cli", "guard"]
REPORT_TITLE = "torchplace guard: device crossings"

SHOW = textwrap.dedent(
    """\
    import sys
    print("file", __file__)
    print("path0", sys.path[0])
    print("argv", sys.argv)
    """
)


def _run(words: list[str], cwd: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        words,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        **kwargs,  # type: ignore[call-overload]
    )


def _program_part(stderr: str) -> str:
    """The program's own stderr: what comes before guard's report."""
    return stderr[: stderr.index(REPORT_TITLE)].rstrip(" \n")


def test_a_script_named_relatively_sees_what_python_gives_it(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(SHOW + "raise ValueError('bad')\n")
    plain = _run([sys.executable, "prog.py", "a"], tmp_path)
    guarded = _run([*GUARD, "--", "prog.py", "a"], tmp_path)
    assert plain.stdout == guarded.stdout  # __file__ absolute, argv[0] as given
    assert f'File "{tmp_path / "prog.py"}", line' in plain.stderr
    assert _program_part(guarded.stderr) == plain.stderr.rstrip("\n")


def test_ctrl_c_prints_the_traceback_python_prints(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text("def f():\n    raise KeyboardInterrupt\nf()\n")
    plain = _run([sys.executable, "prog.py"], tmp_path)
    guarded = _run([*GUARD, "--", "prog.py"], tmp_path)
    assert guarded.returncode == 130
    assert plain.stderr.rstrip("\n").endswith("KeyboardInterrupt")
    assert _program_part(guarded.stderr) == plain.stderr.rstrip("\n")


def test_a_report_to_stdout_survives_the_program_closing_sys_stdout(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text("import sys\nprint('hi')\nsys.stdout.close()\n")
    guarded = _run([*GUARD, "-o", "-", "--", "prog.py"], tmp_path)
    assert guarded.returncode == 0, guarded.stderr
    assert guarded.stdout.startswith("hi\n")
    assert REPORT_TITLE in guarded.stdout


@pytest.mark.parametrize(
    ("words", "closed", "stream"),
    [([], 2, "standard error"), (["-o", "-"], 1, "standard output")],
)
def test_a_report_stream_closed_at_start_is_refused_before_the_program_runs(
    words: list[str], closed: int, stream: str, tmp_path: Path
) -> None:
    (tmp_path / "prog.py").write_text("open('ran', 'w').close()\n")
    log = tmp_path / "log"
    with log.open("w") as handle:
        proc = subprocess.run(
            [*GUARD, *words, "--", "prog.py"],
            cwd=tmp_path,
            timeout=120,
            check=False,
            stdout=handle if closed == 2 else None,
            stderr=handle if closed == 1 else None,
            preexec_fn=lambda: os.close(closed),
        )
    assert proc.returncode == 2
    assert not (tmp_path / "ran").exists()  # refused before the program ran
    if closed == 1:  # the message still reaches the open stream
        assert f"{stream} is closed" in log.read_text()


COMPILED_LOSS = textwrap.dedent(
    """\
    import torch
    import torch.nn.functional as F

    model = torch.nn.Linear(8, 4)

    @torch.compile(backend="eager")
    def loss_of(x, y):
        return F.cross_entropy(model(x), y)

    for _ in range(3):
        loss_of(torch.randn(5, 8), torch.randint(0, 4, (5,))).backward()
    print("done")
    """
)


def test_a_compiled_call_the_guard_inspects_leaves_dynamo_silent(tmp_path: Path) -> None:
    # cross_entropy runs under the dispatch layer, outside the graph: dynamo must not try to
    # compile the layer's __torch_dispatch__ once per aten op (its recompile-limit warning,
    # pointing at torchplace's code, was the program's stderr under guard only)
    (tmp_path / "prog.py").write_text(COMPILED_LOSS)
    plain = _run([sys.executable, "prog.py"], tmp_path)
    guarded = _run([*GUARD, "--", "prog.py"], tmp_path)
    assert (guarded.returncode, guarded.stdout) == (0, plain.stdout) == (0, "done\n")
    assert _program_part(guarded.stderr) == plain.stderr.rstrip("\n")


MISMATCH = "torch.mm(torch.ones(2, 3), torch.ones(2, 3))"


@pytest.mark.parametrize(
    ("code", "last"),
    [
        (f"def step():\n    {MISMATCH}\n\nstep()\n", "cannot be multiplied (2x3 and 2x3)"),
        (
            f"try:\n    {MISMATCH}\nexcept RuntimeError as e:\n    raise ValueError('x') from e\n",
            "ValueError: x",
        ),
    ],
)
def test_a_torch_error_of_the_program_shows_the_traceback_python_shows(
    code: str, last: str, tmp_path: Path
) -> None:
    # the guard's layers, through which torch calls every op, were frames of the traceback
    (tmp_path / "prog.py").write_text(f"import torch\n\n{code}")
    plain = _run([sys.executable, "prog.py"], tmp_path)
    guarded = _run([*GUARD, "--", "prog.py"], tmp_path)
    assert plain.stderr.rstrip("\n").endswith(last)
    assert guarded.returncode == 1
    assert _program_part(guarded.stderr) == plain.stderr.rstrip("\n")
