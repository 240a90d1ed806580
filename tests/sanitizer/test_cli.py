"""``torchplace guard -- python script.py``: in-process runs, exit codes, report at exit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipapp
from pathlib import Path

import pytest

from torchplace.cli import main
from torchplace.sanitizer.cli import split_program

DEMO = textwrap.dedent(
    """\
    import sys
    import torch

    x = torch.ones(4, 8)
    for _ in range(3):
        y = x.to("meta")
    print("argv", sys.argv[1:], __name__)
    if len(sys.argv) > 1 and sys.argv[1] == "boom":
        raise ValueError("boom")
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    """
)


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    path = tmp_path / "demo.py"
    path.write_text(DEMO)
    return path


def _h2d_rows(data: dict[str, object], path: Path) -> list[dict[str, object]]:
    sites = data["sites"]
    assert isinstance(sites, list)
    return [s for s in sites if s["kind"] == "h2d" and s["file"] == str(path)]


def test_runs_the_script_with_its_argv_and_reports_json(
    demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.json"
    code = main(["guard", "--json", "-o", str(out), "--", "python", str(demo), "3"])
    assert code == 1  # the program failed; its own status is in the report
    assert "argv ['3'] __main__" in capsys.readouterr().out
    document = json.loads(out.read_text())
    assert document["schema"] == "torchplace.guard/v1"
    data = document["result"]
    assert data["program"] == {"argv": [str(demo), "3"], "exit_status": 3, "violations": 0}
    (row,) = _h2d_rows(data, demo)
    assert (row["line"], row["count"], row["bytes"]) == (6, 3, 3 * 128)
    syncs = [s for s in data["sites"] if s["kind"] == "sync" and s["file"] == str(demo)]
    assert [(s["line"], s["count"]) for s in syncs] == [(6, 3)]  # each copy is blocking
    assert sys.argv[0] != str(demo)  # restored


def test_threads_of_the_program_are_watched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "pool.py"
    script.write_text(
        "from concurrent.futures import ThreadPoolExecutor\n"
        "import torch\n"
        "def work(n):\n"
        "    return torch.ones(n).to('meta')\n"
        "with ThreadPoolExecutor(2) as pool:\n"
        "    list(pool.map(work, [1, 2, 3]))\n"
    )
    out = tmp_path / "report.json"
    assert main(["guard", "--json", "-o", str(out), "--", str(script)]) == 0
    (row,) = _h2d_rows(json.loads(out.read_text())["result"], script)
    assert (row["line"], row["function"], row["count"], row["bytes"]) == (4, "work", 3, 24)


def test_report_is_printed_when_the_script_raises(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["guard", "--top", "1", str(demo), "boom"])
    assert code == 1
    err = capsys.readouterr().err
    assert "ValueError: boom" in err
    assert "the program exited with status 1" in err
    assert "demo.py" in err
    assert "cli.py" not in err
    assert "h2d" in err


def test_module_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "guarddemo_pkg").mkdir()
    (tmp_path / "guarddemo_pkg" / "__init__.py").write_text("")
    (tmp_path / "guarddemo_pkg" / "run.py").write_text(DEMO)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "r.json"
    code = main(["guard", "--json", "-o", str(out), "--", "-m", "guarddemo_pkg.run"])
    assert code == 0
    data = json.loads(out.read_text())["result"]
    assert data["totals"]["h2d"]["count"] == 3


@pytest.mark.parametrize(
    ("words", "message"),
    [
        ([], "no program"),
        (["--", "python"], "no program"),
        (["python", "-m"], "-m needs a module"),
        (["python", "-c", "pass"], "unsupported interpreter option"),
        (["no_such_script.py"], "no such script"),
    ],
)
def test_usage_errors_exit_2(
    words: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["guard", *words]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("interpreter", ["bash", "sh"])
def test_a_non_python_interpreter_is_refused_as_python_only(
    interpreter: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "x.sh"
    script.write_text("echo hi\n")
    assert main(["guard", "--", interpreter, str(script)]) == 2
    err = capsys.readouterr().err
    assert "no such script" not in err
    assert f"{interpreter!r} is not a Python program" in err
    assert "guard runs Python programs only" in err
    assert "-m module" in err


@pytest.mark.parametrize(
    ("name", "text"),
    [("x.sh", "echo hi\n"), ("run", "#!/bin/bash\necho hi\n")],
)
def test_a_shell_script_is_refused_as_python_only(
    name: str, text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / name
    script.write_text(text)
    assert main(["guard", "--", str(script)]) == 2
    assert "guard runs Python programs only" in capsys.readouterr().err


def test_a_native_executable_is_refused_as_python_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "tool"
    binary.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(64))
    assert main(["guard", "--", str(binary)]) == 2
    assert "is not a Python program" in capsys.readouterr().err


def test_a_python_script_without_suffix_still_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "tool"
    script.write_text("#!/usr/bin/env python3\nprint('ran')\n")
    assert main(["guard", "--", str(script)]) == 0
    assert "ran" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["missing_dir", "is_a_dir"])
def test_unusable_output_path_is_refused_before_the_program_runs(
    where: str, demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "no_such_dir" / "r.json" if where == "missing_dir" else tmp_path
    assert main(["guard", "-o", str(out), "--", "python", str(demo)]) == 2
    captured = capsys.readouterr()
    assert "argv" not in captured.out  # the program never ran
    assert str(out) in captured.err
    assert "give -o a file in an existing, writable directory" in captured.err


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root writes anywhere")
def test_unwritable_output_directory_is_refused_before_the_program_runs(
    demo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        out = locked / "r.json"
        assert main(["guard", "-o", str(out), "--", "python", str(demo)]) == 2
        captured = capsys.readouterr()
        assert "argv" not in captured.out
        assert "is not writable" in captured.err
        assert str(out) in captured.err
    finally:
        locked.chmod(0o700)


def test_split_program_strips_the_interpreter(demo: Path) -> None:
    assert split_program(["--", sys.executable, str(demo), "a"]) == (
        "path",
        str(demo),
        [str(demo), "a"],
    )
    assert split_program(["python3", "-m", "pkg.mod", "x"]) == (
        "module",
        "pkg.mod",
        ["pkg.mod", "x"],
    )


def test_console_command_end_to_end(demo: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "torchplace.cli", "guard", "--", "python", str(demo)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "argv [] __main__" in proc.stdout
    assert "demo.py" in proc.stderr
    assert "6 events" in proc.stderr  # three H2D copies, each a blocking sync


def _guard_proc(
    tmp_path: Path, source: str, *words: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, "-m", "torchplace.cli", "guard", *words, "--", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        input=stdin,
    )


def test_os_exit_still_writes_the_report(tmp_path: Path) -> None:
    proc = _guard_proc(
        tmp_path,
        """\
        import os
        import torch
        torch.ones(2).to("meta")
        os._exit(3)
        """,
        "--json",
        "-o",
        "r.json",
    )
    # guard's own status says the program failed (1), as for sys.exit(3); its 3 is reported
    assert proc.returncode == 1, proc.stderr
    data = json.loads((tmp_path / "r.json").read_text())["result"]
    assert data["program"]["exit_status"] == 3
    assert data["totals"]["h2d"]["count"] == 1


def test_a_forked_child_does_not_write_a_second_report(tmp_path: Path) -> None:
    proc = _guard_proc(
        tmp_path,
        """\
        import os
        import torch
        torch.ones(2).to("meta")
        pid = os.fork()
        if pid:
            os.waitpid(pid, 0)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("torchplace guard: device crossings") == 1


def test_a_multiprocessing_fork_child_writes_no_report(tmp_path: Path) -> None:
    proc = _guard_proc(
        tmp_path,
        """\
        import multiprocessing as mp
        import torch

        def work():
            torch.ones(2).to("meta")

        if __name__ == "__main__":
            p = mp.get_context("fork").Process(target=work)
            p.start()
            p.join()
            assert p.exitcode == 0, p.exitcode
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("torchplace guard: device crossings") == 1


def test_sigterm_still_writes_the_report(tmp_path: Path) -> None:
    proc = _guard_proc(
        tmp_path,
        """\
        import os
        import signal
        import time
        import torch
        torch.ones(2).to("meta")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        """,
    )
    assert proc.returncode == 143, proc.stderr
    assert "prog.py" in proc.stderr
    assert "the program was terminated (SIGTERM)" in proc.stderr


def test_a_program_that_closes_stdout_still_gets_its_report(tmp_path: Path) -> None:
    proc = _guard_proc(tmp_path, "import sys\nsys.stdout.close()\n")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "torchplace guard: device crossings" in proc.stderr


def test_a_relative_output_path_survives_the_program_changing_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    script = tmp_path / "cd.py"
    script.write_text(f"import os\nos.chdir({str(elsewhere)!r})\n")
    monkeypatch.chdir(tmp_path)
    assert main(["guard", "--json", "-o", "r.json", "--", str(script)]) == 0
    assert (tmp_path / "r.json").is_file()
    assert not (elsewhere / "r.json").exists()


def test_the_report_goes_to_the_stderr_guard_started_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "swap.py"
    script.write_text("import io, sys\nsys.stderr = io.StringIO()\n")
    saved = sys.stderr
    try:
        assert main(["guard", "--", str(script)]) == 0
    finally:
        sys.stderr = saved
    assert "torchplace guard: device crossings" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("no_such_module_xyz", "cannot run -m no_such_module_xyz: No module named"),
        ("guard_pkg_nomain", "is a package and cannot be directly executed"),
    ],
)
def test_a_module_that_cannot_run_is_a_one_line_usage_error(
    module: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "guard_pkg_nomain").mkdir()
    (tmp_path / "guard_pkg_nomain" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["guard", "--", "-m", module]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert "device crossings" not in err  # the program never ran: no report


def test_an_import_error_inside_a_module_program_is_the_program_failing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "guard_bad_import.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["guard", "--", "-m", "guard_bad_import"]) == 1
    err = capsys.readouterr().err
    assert "ModuleNotFoundError" in err
    assert "device crossings" in err


@pytest.mark.parametrize("pattern", [":", "train.py:", ":42", "train.py:step", "train.py:42:"])
def test_an_allow_location_that_can_match_nothing_is_refused(
    pattern: str, demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["guard", "--allow", pattern, "--", str(demo)]) == 2
    assert "is not a source location" in capsys.readouterr().err


def test_a_guard_violation_traceback_ends_at_the_programs_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "step.py"
    script.write_text(
        "import torch\n\n"
        "class Step(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x.to('meta')\n\n"
        "Step()(torch.ones(2))\n"
    )
    assert main(["guard", "--mode", "raise", "--allow", "sync", str(script)]) == 1
    err = capsys.readouterr().err
    traceback_text = err.split("GuardViolation:")[0]
    assert "line 5, in forward" in traceback_text  # the last frame shown is the program's line
    assert "torchplace/sanitizer" not in traceback_text  # no frame of the guard itself
    assert "torch/_ops.py" not in traceback_text
    assert "--allow h2d" in err  # the hint names the command-line option too


def test_threads_the_program_leaves_running_are_waited_for_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # python waits for non-daemon threads before it exits; so does guard, before its report
    script = tmp_path / "worker.py"
    script.write_text(
        "import threading, time, torch\n"
        "def train():\n"
        "    time.sleep(0.2)\n"
        "    for _ in range(3):\n"
        "        torch.ones(4).to('meta')\n"
        "threading.Thread(target=train).start()\n"
    )
    assert main(["guard", "--json", str(script)]) == 0
    data = json.loads(capsys.readouterr().err)["result"]
    assert data["totals"]["h2d"] == {"count": 3, "bytes": 48}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_mode_raise_stopping_a_thread_fails_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the thread dies of the violation, the program goes on and exits 0: a CI gate must fail
    script = tmp_path / "threaded.py"
    script.write_text(
        "import threading, torch\n"
        "t = threading.Thread(target=lambda: torch.ones(2).to('meta'))\n"
        "t.start()\n"
        "t.join()\n"
    )
    assert main(["guard", "--mode", "raise", str(script)]) == 1
    assert "--mode raise stopped 1 crossing" in capsys.readouterr().err
    assert main(["guard", "--mode", "raise", "--json", str(script)]) == 1
    err = capsys.readouterr().err  # the report (after the thread's traceback, outside pytest)
    program = json.loads(err[err.index("{\n") :])["result"]["program"]
    assert (program["exit_status"], program["violations"]) == (0, 1)


def test_a_directory_with_main_runs_as_python_runs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "helper.py").write_text("STEPS = 2\n")
    (app / "__main__.py").write_text(
        "import torch\nimport helper\nfor _ in range(helper.STEPS):\n    torch.ones(2).to('meta')\n"
    )
    assert main(["guard", "--json", "--", "python", str(app)]) == 0
    data = json.loads(capsys.readouterr().err)["result"]
    assert data["totals"]["h2d"] == {"count": 2, "bytes": 16}
    (tmp_path / "empty").mkdir()
    assert main(["guard", str(tmp_path / "empty")]) == 2
    assert "is a directory without a __main__.py" in capsys.readouterr().err


@pytest.mark.parametrize("zipped", [False, True])
def test_a_relative_directory_or_zip_app_imports_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, zipped: bool
) -> None:
    """python puts a directory or zip app on sys.path absolute; given relative here, it was
    relative, and a program that changed directory could no longer import its own modules."""
    app = tmp_path / "app"
    app.mkdir()
    helper = f"helper_after_chdir_{int(zipped)}"  # its own name: not one an earlier test imported
    (app / f"{helper}.py").write_text("STEPS = 3\n")
    (app / "__main__.py").write_text(
        f"import os, sys\nos.chdir(sys.argv[1])\nimport {helper} as helper\n"
        "raise SystemExit(0 if helper.STEPS == 3 and os.path.isabs(__file__) else 5)\n"
    )
    monkeypatch.delitem(sys.modules, helper, raising=False)  # removed again at the end
    target = "app"
    if zipped:
        zipapp.create_archive(app, tmp_path / "app.pyz")
        shutil.rmtree(app)
        target = "app.pyz"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["guard", "--", target, str(elsewhere)]) == 0


def test_sigterm_ends_the_run_although_a_thread_of_the_program_still_runs(
    tmp_path: Path,
) -> None:
    # SIGTERM kills python at once; guard must not then wait for the program's threads
    proc = _guard_proc(
        tmp_path,
        """\
        import os
        import signal
        import threading
        import time
        import torch
        threading.Thread(target=time.sleep, args=(600,)).start()
        torch.ones(2).to("meta")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(600)
        """,
    )
    assert proc.returncode == 143, proc.stderr
    assert "the program was terminated (SIGTERM)" in proc.stderr
    assert "prog.py" in proc.stderr


def test_the_programs_own_excepthook_reports_its_error(tmp_path: Path) -> None:
    """A program that sends uncaught errors to its own hook (a logger, a crash reporter): under
    guard the hook never ran, the default traceback was printed instead."""
    proc = _guard_proc(
        tmp_path,
        """\
        import sys
        def hook(kind, value, tb):
            print("custom hook:", value, file=sys.stderr)
        sys.excepthook = hook
        raise RuntimeError("oops")
        """,
    )
    assert proc.returncode == 1
    assert "custom hook: oops" in proc.stderr
    assert "Traceback" not in proc.stderr
