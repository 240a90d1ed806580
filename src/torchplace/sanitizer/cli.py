"""Run a Python program under the placement guard and print every device crossing at exit.

``torchplace guard [--json] [--top N] [--mode MODE] [--allow X] -- python script.py args`` runs
the program in this process (like ``python -m cProfile``), with ``sys.argv`` set as the program
expects; ``script.py args`` and ``-m module args`` work too. The report goes to stderr (or
``-o PATH``) when the program ends, also when it raises, calls ``sys.exit`` or ``os._exit``, or
is sent SIGTERM, so that the program's own stdout stays clean; a child it forks writes none.
Threads the program starts through :mod:`threading` (thread pools included) are guarded too,
and, as python does, the non-daemon ones still running when the program's code ends are waited
for before the report, and then the :mod:`atexit` handlers the program registered are run,
guarded too (a checkpoint saved at exit), and not again when this process exits.

Exit status: 0 when the program ended well, 1 when it failed (a nonzero exit, an exception, or
``--mode raise`` stopping it, in any thread; its own exit status and the number of violations
raised are in the JSON report), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import atexit
import builtins
import contextlib
import importlib.machinery
import importlib.util
import os
import runpy
import shutil
import signal
import sys
import threading
import traceback
import types
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, NoReturn, TextIO

from torchplace import report
from torchplace.errors import ConfigError, GuardViolation
from torchplace.sanitizer.interpreter import InterpreterOptions, split_options
from torchplace.sanitizer.report import DEFAULT_MAX_EVENTS, MODES, GuardReport

__all__ = ["configure", "run", "split_command", "split_program"]


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare the ``torchplace guard`` arguments."""
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="record",
        help="record only (default), also warn once per new line, or raise at the first crossing",
    )
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="KIND_OR_LINE",
        help="ignore an event kind (h2d, d2h, d2d, transfer, sync, pageable_non_blocking, "
        "mixed_device) or a source location (file.py, file.py:42); repeatable",
    )
    parser.add_argument(
        "--max-events",
        type=int,
        default=DEFAULT_MAX_EVENTS,
        metavar="N",
        help="events kept one by one in the report (counts go on beyond); default %(default)s",
    )
    parser.add_argument(
        "--top", type=int, default=None, metavar="N", help="show only the N busiest lines"
    )
    report.add_output_options(parser, stream="stderr")
    parser.add_argument(
        "program",
        nargs=argparse.REMAINDER,
        help="the program (after --): [python] script.py args, or [python] -m module args; "
        "python's -u, -B and -W ARG before them apply to it",
    )


def split_program(words: Sequence[str]) -> tuple[str, str, list[str]]:
    """``(kind, target, argv)`` for a command line: kind is ``"path"`` or ``"module"``."""
    return split_command(words)[1:]


def split_command(words: Sequence[str]) -> tuple[InterpreterOptions, str, str, list[str]]:
    """:func:`split_program`, with python's own options (``-u``, ``-B``, ``-W arg``) first."""
    rest = list(words)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if rest and _is_python(rest[0]):
        rest = rest[1:]
    options, rest = split_options(rest)
    if not rest:
        raise ConfigError("no program given; use: torchplace guard -- python script.py [args]")
    if rest[0] == "-m":
        if len(rest) < 2:
            raise ConfigError("-m needs a module name: torchplace guard -- python -m pkg.mod")
        return options, "module", rest[1], rest[1:]
    if rest[0].startswith("-"):
        raise ConfigError(
            f"unsupported interpreter option {rest[0]!r}; give a script path or -m module"
        )
    return (options, *_script(rest))


def _script(rest: list[str]) -> tuple[str, str, list[str]]:
    """``("path", script, argv)`` for a script, a directory or a zip app python can run."""
    if not rest[0]:  # Path("") is the working directory, which python would not run
        raise ConfigError(f"the script name is empty; {_PYTHON_ONLY}")
    if Path(rest[0]).is_dir():
        # python runs a directory by its __main__.py (a zip app is a file, run below)
        if not (Path(rest[0]) / "__main__.py").is_file():
            raise ConfigError(
                f"{rest[0]!r} is a directory without a __main__.py, so python cannot run it; "
                "give the script inside it, or -m package"
            )
        return "path", rest[0], rest
    if not Path(rest[0]).is_file():
        if not rest[0].endswith(".py") and shutil.which(rest[0]) is not None:
            raise ConfigError(_not_python(rest[0]))
        if os.path.exists(rest[0]):  # a FIFO, socket or device: nothing to run as a script
            raise ConfigError(f"{rest[0]!r} is not a regular file; {_PYTHON_ONLY}")
        raise ConfigError(f"no such script: {rest[0]!r}; {_PYTHON_ONLY}")
    if not _looks_like_python(Path(rest[0])):
        raise ConfigError(_not_python(rest[0]))
    return "path", rest[0], rest


_PYTHON_ONLY = (
    "guard runs Python programs only: give `python script.py [args]`, `script.py [args]` "
    "or `-m module [args]` after --"
)
_NOT_PYTHON_SUFFIXES = frozenset({".sh", ".bash", ".zsh", ".ksh", ".fish", ".csh", ".bat", ".cmd"})

_EXECUTABLE_MAGICS = (
    b"\x7fELF",  # Linux
    b"\xcf\xfa\xed\xfe",  # macOS, 64-bit Mach-O
    b"\xce\xfa\xed\xfe",  # 32-bit Mach-O
    b"\xca\xfe\xba\xbe",  # universal Mach-O
)


def _not_python(word: str) -> str:
    return f"{word!r} is not a Python program; {_PYTHON_ONLY}"


def _looks_like_python(path: Path) -> bool:
    """False for files that are clearly something else: shell scripts and binaries."""
    if path.suffix.lower() in _NOT_PYTHON_SUFFIXES:
        return False
    try:
        with path.open("rb") as handle:
            head = handle.read(512)
    except OSError:
        return True  # let running it report the real problem
    if head.startswith(_EXECUTABLE_MAGICS):
        return False  # a native executable; .pyc files and zip apps run fine
    if head.startswith(b"#!"):
        return b"python" in head.split(b"\n", 1)[0]
    return True


def _is_python(word: str) -> bool:
    name = os.path.basename(word)
    return word == sys.executable or (name.startswith("python") and not name.endswith(".py"))


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _program_files(kind: str, target: str) -> list[str]:
    """The files the program runs from, which its report must not overwrite: the script, a
    directory's ``__main__.py``, or the file of ``-m module`` (a package's ``__main__``)."""
    if kind == "path":
        return [str(Path(target) / "__main__.py")] if Path(target).is_dir() else [target]
    try:
        origin = _module_origin(target)
    except Exception:  # a name python cannot look up: running it says why, later
        return []
    return [origin] if origin is not None and os.path.isfile(origin) else []


def _module_origin(name: str) -> str | None:
    """Where ``-m name`` runs from, found without importing it or its packages (an import before
    the guard starts would hide its crossings): a module's file, a package's ``__main__``."""
    parts = name.split(".")
    search: Sequence[str] | None = None
    spec: importlib.machinery.ModuleSpec | None = None
    for i in range(len(parts)):
        spec = _find_spec(".".join(parts[: i + 1]), search)
        if spec is None:
            return None
        search = spec.submodule_search_locations
    if search is not None:  # a package: python runs its __main__
        spec = _find_spec(f"{name}.__main__", search)
    origin = getattr(spec, "origin", None)
    return origin if isinstance(origin, str) else None


def _find_spec(name: str, search: Sequence[str] | None) -> importlib.machinery.ModuleSpec | None:
    loaded = sys.modules.get(name)
    if loaded is not None:
        spec: importlib.machinery.ModuleSpec | None = getattr(loaded, "__spec__", None)
        return spec
    return importlib.machinery.PathFinder.find_spec(name, search)


def run(args: argparse.Namespace) -> int:
    """Run the program under a guard; report; 0 when the program ended well, else 1."""
    options, kind, target, argv = split_command(args.program)
    if args.top is not None and args.top < 0:
        raise ConfigError(f"--top must be >= 0, got {args.top}")
    if args.max_events is not None and args.max_events < 0:
        raise ConfigError(f"--max-events must be >= 0, got {args.max_events}")
    report.check_output(args.output)
    report.check_distinct([args.output], _program_files(kind, target))
    report.require_torch()  # the guard hooks torch: say why it cannot be imported

    from torchplace.sanitizer.recorder import Guard

    guard = Guard(args.mode, allow=args.allow, max_events=args.max_events, threads=True)
    # Fixed before the program runs: it may chdir (a relative -o), replace or close sys.stderr
    # and sys.stdout, fork.
    output = None if args.output in (None, "-") else os.path.abspath(args.output)
    stream, pid = _report_stream(args.output), os.getpid()
    written = False

    def write(code: int) -> None:
        nonlocal written
        if not written and os.getpid() == pid:  # a forked child never writes the report
            written = True
            program = {"argv": argv, "exit_status": code, "violations": guard.violations}
            _write(guard.report, args, program, output, stream)

    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = argv
    # a script's directory goes first on sys.path, as python puts it; runpy puts a directory
    # program (run by its __main__.py) there itself
    script_dir = kind == "path" and not Path(target).is_dir()
    if script_dir:
        sys.path.insert(0, str(Path(target).resolve().parent))
    code = 0
    terminated = False
    already_running = set(threading.enumerate())
    exit_handlers = _ExitHandlers()
    try:
        with (
            guard,
            _report_on_hard_exit(write, pid, lambda status: _outcome(status, guard)),
            options.applied(),
            exit_handlers,
        ):
            try:
                if kind == "module":
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
                elif _is_source(target):
                    _run_script(target)
                else:  # a directory or zip app (by its __main__.py), a .pyc file
                    # absolute, as python puts it on sys.path: the program may chdir
                    runpy.run_path(os.path.abspath(target), run_name="__main__")
            except _Terminated:
                raise  # SIGTERM kills the process on the spot: python waits for no thread
            except BaseException:
                if os.getpid() == pid:
                    _join_program_threads(already_running)
                exit_handlers.run()
                raise
            else:
                if os.getpid() == pid:
                    _join_program_threads(already_running)
                exit_handlers.run()
    except _Terminated as exc:
        code = _exit_code(exc)
        terminated = True
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt as exc:  # python prints its traceback too
        _print_program_error(exc)
        code = 130
    except BaseException as exc:  # the program's own error: show it, as python would
        if kind == "module" and isinstance(exc, ImportError) and _raised_by_runpy(exc):
            # `-m` named nothing runnable: the program never started; say so, as python does
            raise ConfigError(f"cannot run -m {target}: {exc}") from None
        _print_program_error(exc)
        code = 1
    finally:
        sys.argv = saved_argv
        if script_dir and sys.path and sys.path[0] != saved_path0:
            sys.path.pop(0)
    if os.getpid() != pid:
        return code  # a child the program forked, leaving through its code: exit as python would
    write(code)
    if terminated and _program_threads(already_running):
        # SIGTERM's default action ends the process at once; python's exit would instead wait
        # for the threads the program left running, maybe forever: end it as the signal would
        for stream_ in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream_.flush()
        os._exit(code)
    return _outcome(code, guard)


def _outcome(code: int, guard: Any) -> int:
    """Guard's exit status for a program that ended with ``code``: 1 when it failed (its own
    status is in the report) or broke the contract, 0 else; an interrupt or SIGTERM keeps the
    shell's 130 or 143."""
    if code in _STOPPED:
        return code  # interrupted or terminated: the shell's convention, as the top command does
    # --mode raise stopping a thread fails the run too, although the program went on and ended 0
    return report.EXIT_OK if code == 0 and not guard.violations else report.EXIT_FAILED


def _is_source(target: str) -> bool:
    """A script file of Python source, not a directory, a zip app or compiled code."""
    return Path(target).is_file() and not zipfile.is_zipfile(target) and not _is_compiled(target)


def _is_compiled(target: str) -> bool:
    with open(target, "rb") as handle:
        return handle.read(4) == importlib.util.MAGIC_NUMBER


def _run_script(target: str) -> None:
    """Run a source script as python does, unlike :func:`runpy.run_path`: ``__file__`` and the
    traceback's file names are absolute, ``sys.argv[0]`` stays as the command line gave it."""
    path = os.path.abspath(target)
    with open(path, "rb") as handle:  # bytes: compile honours a coding cookie
        code = compile(handle.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
    )
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _join_program_threads(already_running: set[threading.Thread]) -> None:
    """Wait, as python does before it exits, for the non-daemon threads the program started
    and left running (a worker that trains, a server thread): their crossings belong in the
    report, and the program has not ended until they have. Idle ``ThreadPoolExecutor`` workers
    are not waited for: python stops them at exit, and only then."""
    while pending := _program_threads(already_running):
        for thread in pending:
            thread.join()


def _program_threads(already_running: set[threading.Thread]) -> list[threading.Thread]:
    """The non-daemon threads the program started that still run (idle pool workers aside)."""
    return [
        t
        for t in threading.enumerate()
        if t not in already_running
        and t is not threading.current_thread()
        and not t.daemon
        and t.is_alive()
        and getattr(getattr(t, "_target", None), "__module__", "") != "concurrent.futures.thread"
    ]


class _ExitHandlers:
    """The :mod:`atexit` handlers the program registers while it runs, to run inside the guard.

    Python runs them after the program's code ends (and its threads are joined), which here is
    after the guard has ended and written its report: their crossings would be left out. So
    ``atexit.register`` keeps them here instead, and :meth:`run` runs them as python would, last
    registered first, an error in one printed and the next run. Only the program's: this
    process's other handlers (torch's, or a test runner's when guard runs in it) are not run
    early. A handler registered while they run is dropped, as python drops it.
    """

    def __init__(self) -> None:
        self._handlers: list[tuple[Callable[..., object], tuple[Any, ...], dict[str, Any]]] = []
        self._saved = (atexit.register, atexit.unregister)

    def __enter__(self) -> _ExitHandlers:
        atexit.register = self._register  # type: ignore[assignment]
        atexit.unregister = self._unregister
        return self

    def __exit__(self, *exc_info: object) -> None:
        atexit.register, atexit.unregister = self._saved

    def _register(self, func: Callable[..., object], /, *args: Any, **kwargs: Any) -> object:
        self._handlers.append((func, args, kwargs))
        return func  # as atexit.register returns it: it is used as a decorator

    def _unregister(self, func: Callable[..., object], /) -> None:
        self._handlers = [h for h in self._handlers if h[0] != func]
        self._saved[1](func)  # one registered before the program started

    def run(self) -> None:
        handlers, self._handlers = self._handlers, []
        for func, args, kwargs in reversed(handlers):
            try:
                func(*args, **kwargs)
            except _Terminated:
                raise  # SIGTERM ends the process on the spot, exit handlers or not
            except BaseException as exc:  # python prints it and goes on, sys.exit() too
                print(f"Exception ignored in atexit callback: {func!r}", file=sys.stderr)
                tb = exc.__traceback__
                # from the handler's own frame on, as python shows it
                traceback.print_exception(type(exc), exc, tb and tb.tb_next, file=sys.stderr)


class _Terminated(SystemExit):
    """The program was sent SIGTERM (and does not handle it)."""


#: Exit statuses of a program stopped by SIGINT (Ctrl-C) or SIGTERM, and what the report says.
_STOPPED = {130: "", 128 + signal.SIGTERM: "the program was terminated (SIGTERM)\n"}


@contextlib.contextmanager
def _report_on_hard_exit(
    write: Callable[[int], None], pid: int, outcome: Callable[[int], int]
) -> Iterator[None]:
    """Write the report also when the program leaves by ``os._exit`` or is sent SIGTERM.

    ``os._exit`` ends the process on the spot, and SIGTERM's default action kills it: either
    would lose the report. While the program runs, ``os._exit`` writes the report first (in this
    process only: a forked child's ``os._exit``, as multiprocessing makes, writes nothing) and
    exits with guard's status for it (``outcome``: 1 for ``os._exit(4)``, whose 4 is in the
    report), and SIGTERM, unless the program handles it itself, exits through
    ``SystemExit(143)``.
    """
    real_exit = os._exit

    def _exit(status: int) -> NoReturn:
        if os.getpid() != pid:  # a forked child leaves as it asked
            real_exit(status)
        with contextlib.suppress(Exception):
            write(status)
        real_exit(outcome(status))

    def _on_sigterm(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != pid:  # a forked child: die by the signal, as it would have
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise _Terminated(128 + signum)

    previous: Any = None
    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            previous = signal.signal(signal.SIGTERM, _on_sigterm)
    os._exit = _exit
    try:
        yield
    finally:
        os._exit = real_exit
        if previous is not None and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, previous)


def _raised_by_runpy(exc: BaseException) -> bool:
    """True when runpy itself raised ``exc`` (no such module, no ``__main__``), not the program."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return _is_runpy(tb.tb_frame.f_code.co_filename)


def _is_runpy(filename: str) -> bool:
    return filename == runpy.__file__ or filename.startswith("<frozen runpy")


def _print_program_error(exc: BaseException) -> None:
    tb = exc.__traceback__
    # drop the frames of this runner and runpy: the program's traceback starts at its code
    while tb is not None and (
        tb.tb_frame.f_code.co_filename == __file__ or _is_runpy(tb.tb_frame.f_code.co_filename)
    ):
        tb = tb.tb_next
    if isinstance(exc, GuardViolation):
        _cut_at_the_users_line(tb)
    else:
        tb = _without_guard_layers(tb)
    _strip_chained(exc)
    hook = sys.excepthook
    if hook is not sys.__excepthook__:  # the program's own (a logger, a crash reporter)
        try:
            hook(type(exc), exc, tb)
            return
        except Exception:  # a hook that fails: the error is printed as python prints it
            pass
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)


def _strip_chained(exc: BaseException) -> None:
    """The guard's layers out of the tracebacks the error chains to (``raise ... from e``, an
    error while handling another), which python prints above it."""
    seen = {id(exc)}
    chained = exc.__cause__ or exc.__context__
    while chained is not None and id(chained) not in seen:
        seen.add(id(chained))
        chained.__traceback__ = _without_guard_layers(chained.__traceback__)
        chained = chained.__cause__ or chained.__context__


#: the guard's own modules: torch calls their layers for every op, and their wrappers stand in
#: for torch's functions while the program runs
_GUARD_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _without_guard_layers(tb: TracebackType | None) -> TracebackType | None:
    """The traceback without the frames of the guard's layers, through which the program's
    error passed (``__torch_function__``, calling torch for the program's line), as python
    shows it without the guard."""
    head: TracebackType | None = None
    last: TracebackType | None = None
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_GUARD_DIR):
            if last is None:
                head = tb
            else:
                last.tb_next = tb
            last = tb
        tb = tb.tb_next
    if last is not None:
        last.tb_next = None
    return head


def _cut_at_the_users_line(tb: TracebackType | None) -> None:
    """A guard violation is raised from deep inside torch and torchplace: end its traceback at
    the last frame of the program's own code, the line the message names."""
    from torchplace.sanitizer.sites import is_internal

    last_user = None
    while tb is not None:
        if not is_internal(tb.tb_frame.f_code.co_filename):
            last_user = tb
        tb = tb.tb_next
    if last_user is not None:
        last_user.tb_next = None


def _write(
    guarded: GuardReport,
    args: argparse.Namespace,
    program: dict[str, Any],
    output: str | None,
    stream: TextIO,
) -> None:
    """The report on stderr (the program's stdout stays its own) or in ``-o PATH``."""
    if args.format == "json":
        result = {"program": program, **guarded.to_dict(top=args.top)}
        text = report.to_json(report.envelope("guard", result))
    else:
        text = guarded.format(top=args.top)
        status = program["exit_status"]
        if status in _STOPPED:
            text += _STOPPED[status]
        elif status != 0:
            text += f"the program exited with status {status}\n"
        elif program["violations"]:
            count = program["violations"]
            text += (
                f"--mode raise stopped {count} crossing{'' if count == 1 else 's'} that the "
                "program went on without (a thread died of it, or the program caught it); the "
                "program itself exited with status 0\n"
            )
    if output is None and stream.closed:
        stream = _reopened(stream)
    report.write_report(text, output, stream=stream)


def _report_stream(output: str | None) -> TextIO:
    """The stream guard started with that the report goes to (stderr, or stdout for ``-o -``;
    stderr also carries a ``-o PATH`` report's errors), refused before the program runs when
    the report would go to it and it is closed: the report would be lost after the program."""
    name, stream = (
        ("standard output", sys.stdout) if output == "-" else ("standard error", sys.stderr)
    )
    if output in (None, "-") and (stream is None or stream.closed):
        raise ConfigError(
            f"{name} is closed, so the report has nowhere to go; write it with -o PATH"
        )
    return stream


def _reopened(stream: TextIO) -> TextIO:
    """The program closed ``sys.stderr`` (or ``sys.stdout``, for ``-o -``): its descriptor
    usually is still open (Python's standard streams do not close theirs), and the report goes
    there; else ``stream`` as it is (the report then says it has nowhere to go)."""
    fd = 1 if stream is sys.__stdout__ else 2
    try:
        return os.fdopen(os.dup(fd), "w", encoding="utf-8")
    except OSError:
        return stream
