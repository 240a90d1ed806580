"""``torchplace guard``: the crossings of the program's ``atexit`` handlers are in the report,
and the handlers run once, as python runs them at exit."""

from __future__ import annotations

import atexit
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from torchplace.cli import main

# line 5 copies 8 bytes while the program runs, line 6 4096 bytes at exit
SAVED_AT_EXIT = textwrap.dedent(
    """\
    import atexit
    import torch

    dev = torch.device("meta")  # stands in for cuda
    x = torch.ones(2).to(dev)
    atexit.register(lambda: print("saved", torch.ones(1024).to(dev).shape))
    """
)


def _h2d_by_line(report: dict[str, Any], program: Path) -> dict[int, int]:
    sites = report["result"]["sites"]
    return {
        s["line"]: s["bytes"] for s in sites if s["kind"] == "h2d" and s["file"] == str(program)
    }


def test_crossings_of_the_programs_atexit_handlers_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack: the report was written before python ran the program's atexit handlers, so a
    checkpoint saved at exit was left out of "every H2D/D2H/sync by source line, at exit"."""
    program, out = tmp_path / "train.py", tmp_path / "report.json"
    program.write_text(SAVED_AT_EXIT)
    pending = atexit._ncallbacks()
    assert main(["guard", "--json", "-o", str(out), "--", "python", str(program)]) == 0
    assert capsys.readouterr().out.count("saved") == 1
    report = json.loads(out.read_text())
    assert _h2d_by_line(report, program) == {5: 8, 6: 4096}
    assert report["result"]["totals"]["h2d"]["bytes"] == 8 + 4096
    assert atexit._ncallbacks() == pending  # run already: not left for this process's exit


def test_atexit_handlers_run_once_in_python_s_order_and_an_error_is_printed(
    tmp_path: Path,
) -> None:
    """The handlers run last registered first, an error in one is printed as python prints it
    and the next one still runs, and none runs again when guard's own process exits."""
    program = tmp_path / "prog.py"
    program.write_text(
        textwrap.dedent(
            """\
            import atexit
            import torch

            atexit.register(print, "first registered")
            atexit.register(lambda: torch.ones(4).to("meta"))
            @atexit.register
            def boom():
                raise ValueError("boom at exit")
            atexit.register(print, "last registered")
            """
        )
    )
    out = tmp_path / "report.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchplace.cli",
            "guard",
            "--json",
            "-o",
            str(out),
            "--",
            str(program),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0
    assert run.stdout.splitlines() == ["last registered", "first registered"]
    assert "Exception ignored in atexit callback: <function boom" in run.stderr
    assert "ValueError: boom at exit" in run.stderr
    assert _h2d_by_line(json.loads(out.read_text()), program) == {5: 16}
