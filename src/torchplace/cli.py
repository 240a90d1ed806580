"""The ``torchplace`` command.

Each subcommand lives in its own module, which provides ``configure(parser)`` to declare its
arguments and ``run(args) -> int`` to do the work. Only the chosen subcommand's module is
imported, so ``torchplace lint`` never pays for ``import torch``.

A command marked ``report=True`` in :data:`COMMANDS` follows the one output convention of
:mod:`torchplace.report` (``--format``, ``--json``, ``-o/--output``, one JSON envelope, a shipped
schema); the test suite drives every such command and validates its JSON against its schema.

Exit statuses, the same for every command: 0 fine, 1 the check found something or failed
(findings, an unusable device, a failed program), 2 usage or internal error.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, TextIO, cast

from torchplace import __version__
from torchplace.errors import ConfigError, TorchplaceError
from torchplace.report import EXIT_FAILED, EXIT_USAGE

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = ["COMMANDS", "main"]


class _Command(NamedTuple):
    module: str
    summary: str
    report: bool = False  # follows torchplace.report's output convention and ships a schema
    # runs the user's program in this process: logging is left to the program (_configure_logging)
    hosts_program: bool = False


COMMANDS: dict[str, _Command] = {
    "doctor": _Command(
        "torchplace.doctor.cli",
        "check that torch really runs on a device, and what is visible",
        report=True,
    ),
    "serve": _Command(
        "torchplace.serve.cli", "serve a model over the Open Inference Protocol (KServe v2)"
    ),
    "bench": _Command(
        "torchplace.bench.cli",
        "time GPU work honestly: timing, transfers, overlap, model stages",
        report=True,
    ),
    "guard": _Command(
        "torchplace.sanitizer.cli",
        "run a program and report every device crossing and host sync",
        report=True,
        hosts_program=True,
    ),
    "lint": _Command(
        "torchplace.lint.cli",
        "find device-contract pitfalls in Python source and notebooks",
        report=True,
    ),
    "plan": _Command(
        "torchplace.planner.cli",
        "plan a model's placement over devices, with memory and crossings",
        report=True,
    ),
}


class _Parser(argparse.ArgumentParser):
    """An argument parser whose help, usage and version fail when standard output cannot take
    them: argparse itself drops the error (``torchplace --help > /dev/full`` exited 0 with
    nothing written). Its subparsers (``bench``'s) are of this class too."""

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        if not message or file is None or file is not sys.stdout:
            super()._print_message(message, file)  # stderr: nowhere left to say it failed
            return
        stdout = cast("TextIO", file)
        try:
            stdout.write(message)
            stdout.flush()  # a full disk or a closed pipe shows up here, not at exit
        except OSError as exc:
            what = "the help" if message.startswith("usage:") else "the version"
            self.exit(_stdout_failed(self.prog, exc, what))


def _main_parser() -> argparse.ArgumentParser:
    width = max(len(name) for name in COMMANDS)
    listing = "\n".join(f"  {name:<{width}}  {cmd.summary}" for name, cmd in COMMANDS.items())
    reports = ", ".join(name for name, cmd in COMMANDS.items() if cmd.report)
    parser = _Parser(
        prog="torchplace",
        description="Make the PyTorch device contract explicit, checked, measured and observable.",
        epilog=(
            f"commands:\n{listing}\n\n"
            f"Report commands ({reports}) share --format text|json, --json (short for\n"
            "--format json) and -o/--output PATH; their reports go to stdout, guard's to stderr.\n"
            "Exit status: 0 fine, 1 the check found something or failed, 2 usage error.\n\n"
            "Run 'torchplace COMMAND --help' for a command's options."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"torchplace {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)"
    )
    parser.add_argument("command", choices=sorted(COMMANDS), metavar="COMMAND", help="see below")
    return parser


_LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
_LOG_HANDLER = "torchplace.cli"


def _configure_logging(verbose: int, *, hosts_program: bool) -> None:
    """Log at WARNING, INFO (``-v``) or DEBUG (``-vv``).

    A command that runs the user's program in this process leaves the root logger as python
    leaves it: the program's own ``logging.basicConfig`` does nothing once the root logger has a
    handler, and libraries that add their own handler only when it has none (Lightning) would
    print every record twice. Its ``-v`` gives torchplace's own logger a handler instead.
    """
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    if not hosts_program:
        logging.basicConfig(level=level, format=_LOG_FORMAT)
        return
    logger = logging.getLogger("torchplace")
    if verbose and not any(h.get_name() == _LOG_HANDLER for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.set_name(_LOG_HANDLER)
        handler.setFormatter(logging.Formatter(_LOG_FORMAT))
        logger.addHandler(handler)
        logger.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``torchplace`` console script; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    _tolerant_stdout()
    parser = _main_parser()
    # Split at the first word that names a command: what precedes it is ours, the rest its own.
    split = next((i for i, word in enumerate(args) if word in COMMANDS), len(args))
    top = parser.parse_args(args[: split + 1])
    command = COMMANDS[top.command]
    _configure_logging(top.verbose, hosts_program=command.hosts_program)
    module = importlib.import_module(command.module)
    sub = _Parser(
        prog=f"torchplace {top.command}",
        description=(module.__doc__ or command.summary).strip().splitlines()[0],
    )
    configure = cast(Callable[[argparse.ArgumentParser], None], module.configure)
    run = cast(Callable[[argparse.Namespace], int], module.run)
    configure(sub)
    sub_args = _parse(sub, args[split + 1 :])
    _import_from_cwd()
    try:
        code = run(sub_args)
        if sys.stdout is not None and not sys.stdout.closed:
            sys.stdout.flush()  # a closed pipe shows up here, where it can be handled
        return code
    except ConfigError as exc:
        print(f"torchplace {top.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TorchplaceError as exc:
        print(f"torchplace {top.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        if exc.filename is None:  # a failed write to stdout (a full disk, /dev/full, | head)
            return _stdout_failed(
                f"torchplace {top.command}", exc, "the report", "; write it to a file with -o PATH"
            )
        print(
            f"torchplace {top.command}: error: cannot use {exc.filename!r}: "
            f"{exc.strerror or exc}; check the path",
            file=sys.stderr,
        )
        return EXIT_FAILED


def _tolerant_stdout() -> None:
    """Standard output that cannot encode every character (``PYTHONIOENCODING=cp1252``, a
    redirect on Windows) writes what it cannot as ``\\u2713`` escapes, as Python's standard
    error does, instead of stopping a report half-written with ``UnicodeEncodeError``."""
    stream = sys.stdout
    encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    if encoding.startswith("utf") or not hasattr(stream, "reconfigure"):
        return
    with contextlib.suppress(ValueError, OSError):  # a stream that refuses: left as it is
        stream.reconfigure(errors="backslashreplace")


def _parse(parser: argparse.ArgumentParser, words: list[str]) -> argparse.Namespace:
    """Parse a command's words; a path given to ``--json`` gets the fix (``-o PATH --json``)."""
    parsed, extra = parser.parse_known_args(words)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}{_hint(parser, words, extra)}")
    return parsed


def _hint(parser: argparse.ArgumentParser, words: list[str], extra: list[str]) -> str:
    """The fix for a word a command does not take, where a common slip explains it; else ""."""
    word, command = extra[0], parser.prog.removeprefix("torchplace ")
    if re.fullmatch(r"-v+|--verbose", word):
        return f"; -v is torchplace's own option, given before the command: torchplace -v {command}"
    program = any(action.nargs == argparse.REMAINDER for action in parser._actions)
    if word == "-m" and program:  # guard's program: python's own -m comes after --
        return f"; to run a module, give it after --: {parser.prog} -- -m MODULE [ARGS]"
    at = words.index(word)
    if at > 0 and words[at - 1] == "--json" and not word.startswith("-"):
        return f"; --json takes no argument: write the report to a file with -o {word}"
    return ""


def _import_from_cwd() -> None:
    """Let the user's own modules in the current directory be found, as ``python -m`` does.

    ``--model pkg:make`` (serve, bench) and ``guard -- python -m pkg`` import user code; the
    console script's ``sys.path`` starts at its own bin directory instead. Appended, so a file in
    the current directory never shadows an installed package.
    """
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)


def _stdout_failed(prog: str, exc: OSError, what: str, fix: str = "") -> int:
    """The exit status of a write to standard output that failed, said in one line on stderr;
    a reader that went away (``torchplace lint . | head``) is no error to tell, as for other
    tools. Standard output is silenced so that the interpreter's final flush does not fail
    again."""
    _silence_stdout()
    if not isinstance(exc, BrokenPipeError):
        print(
            f"{prog}: error: cannot write {what} to standard output ({exc.strerror or exc}){fix}",
            file=sys.stderr,
        )
    return EXIT_FAILED


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
