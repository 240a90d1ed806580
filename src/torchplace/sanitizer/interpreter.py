"""Python's own options on a guarded command line: ``torchplace guard -- python -u train.py``.

Guard runs the program in its own process, so an option that decides how python starts cannot
reach it. The common ones that can be applied to a running interpreter are: ``-u`` (unbuffered
standard output and error), ``-B`` (no ``.pyc`` files written) and ``-W arg`` (a warnings filter,
also in ``sys.warnoptions``), applied while the program runs and undone after. Every other option
is refused with its environment variable (``-O``: ``PYTHONOPTIMIZE=1``, ``-X dev``:
``PYTHONDEVMODE=1``) or, where it has none, with ``python OPTION -m torchplace guard``, which
runs guard, and so the program, under it.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from torchplace.errors import ConfigError

__all__ = ["InterpreterOptions", "split_options"]


@dataclass(frozen=True)
class InterpreterOptions:
    """The options guard applies to the program: ``-u``, ``-B`` and each ``-W arg``."""

    unbuffered: bool = False
    no_bytecode: bool = False
    warnings: tuple[str, ...] = ()

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Apply the options while the program runs; put everything back after."""
        with _warning_filters(self.warnings), _no_bytecode(self.no_bytecode):
            if not self.unbuffered:
                yield
                return
            with _unbuffered_stdio():
                yield


#: what python's options that guard cannot apply become: their environment variable
_VARIABLES = {
    "d": "PYTHONDEBUG=1",
    "i": "PYTHONINSPECT=1",
    "s": "PYTHONNOUSERSITE=1",
    "v": "PYTHONVERBOSE=1",
    "P": "PYTHONSAFEPATH=1",
}
_X_VARIABLES = {
    "dev": "PYTHONDEVMODE=1",
    "utf8": "PYTHONUTF8=1",
    "faulthandler": "PYTHONFAULTHANDLER=1",
    "importtime": "PYTHONPROFILEIMPORTTIME=1",
    "tracemalloc": "PYTHONTRACEMALLOC=1",
    "pycache_prefix": "PYTHONPYCACHEPREFIX",
    "warn_default_encoding": "PYTHONWARNDEFAULTENCODING=1",
    "int_max_str_digits": "PYTHONINTMAXSTRDIGITS",
    "no_debug_ranges": "PYTHONNODEBUGRANGES=1",
}
#: options that take an argument, joined (``-Wignore``) or as the next word
_WITH_ARGUMENT = frozenset("cmWX")


def split_options(words: Sequence[str]) -> tuple[InterpreterOptions, list[str]]:
    """Python's options at the head of ``words`` (after ``python``), and the rest: the script
    and its arguments, or ``-m`` and the module's. Raises ConfigError for one guard cannot
    apply, naming what does the same."""
    rest = list(words)
    found = _Found()
    while rest and rest[0].startswith("-") and rest[0] != "-":
        word = rest.pop(0)
        if word == "--":  # python's end of options: the script comes next
            break
        if word.startswith("--"):
            raise ConfigError(_refusal(word, None))
        module = _read_cluster(word, rest, found)
        if module is not None:
            return found.options(), ["-m", *module, *rest]
    return found.options(), rest


@dataclass
class _Found:
    """The options read so far."""

    unbuffered: bool = False
    no_bytecode: bool = False
    filters: list[str] = field(default_factory=list)

    def options(self) -> InterpreterOptions:
        return InterpreterOptions(self.unbuffered, self.no_bytecode, tuple(self.filters))


def _read_cluster(word: str, rest: list[str], found: _Found) -> list[str] | None:
    """Read one word of short options (``-u``, ``-uB``, ``-Wignore``, ``-W ignore``, taking the
    next word from ``rest``) into ``found``; for ``-m``, the module's name (``[]`` for none)."""
    for at, letter in enumerate(word[1:], start=1):
        if letter in _WITH_ARGUMENT:
            value = word[at + 1 :] or (rest.pop(0) if rest else "")
            if letter == "m":
                return [value] if value else []
            if letter != "W" or not value:
                raise ConfigError(_refusal(f"-{letter}", value))
            _check_filter(value)
            found.filters.append(value)
            return None
        if letter == "u":
            found.unbuffered = True
        elif letter == "B":
            found.no_bytecode = True
        elif letter == "O":  # -O or -OO: one option, its level the count
            level = len(word[at:]) - len(word[at:].lstrip("O"))
            raise ConfigError(_refusal("-" + "O" * level, None))
        else:
            raise ConfigError(_refusal(f"-{letter}", None))
    return None


def _refusal(option: str, value: str | None) -> str:
    """Why guard does not take ``option`` (with ``value``), and what does the same."""
    given = option if value is None else f"{option} {value}".rstrip()
    head = f"unsupported interpreter option {given!r}"
    if option.startswith("--"):
        return f"{head}; give a script path or -m module"
    if option == "-c":
        return f"{head}: guard runs a script or -m module; write the code to a file and give it"
    if option in ("-W", "-X", "-m") and not value:
        return f"{head}: {option} needs an argument (-W ignore, -X dev, -m module)"
    variable = _variable(option, value)
    under = f"python {given} -m torchplace guard -- SCRIPT"
    if variable is None:
        return (
            f"{head}: guard runs the program in its own python, which has started already; run "
            f"guard under python with it: {under} (guard applies -u, -B and -W itself)"
        )
    return (
        f"{head}: guard runs the program in its own python, which has started already; set "
        f"{variable} instead ({variable} torchplace guard -- python SCRIPT), or run guard "
        f"under python with it: {under}"
    )


def _variable(option: str, value: str | None) -> str | None:
    """The environment variable that does what ``option`` does, with its value; else None."""
    if option.startswith("-O"):
        return f"PYTHONOPTIMIZE={len(option) - 1}"
    if option == "-X" and value:
        name, equals, setting = value.partition("=")
        variable = _X_VARIABLES.get(name)
        if variable is None:
            return None
        if "=" not in variable:  # a variable that takes the option's own value
            return f"{variable}={setting or 'VALUE'}"
        return f"{variable.partition('=')[0]}={setting}" if equals else variable
    return _VARIABLES.get(option.lstrip("-"))


def _check_filter(value: str) -> None:
    """Refuse a ``-W`` filter python would ignore, before the program runs."""
    with warnings.catch_warnings():
        _add_filter(value)


def _add_filter(value: str) -> None:
    setoption = getattr(warnings, "_setoption")  # what python does with each -W  # noqa: B009
    try:
        setoption(value)
    except Exception as exc:  # warnings._OptionError, or a category that cannot be imported
        raise ConfigError(
            f"interpreter option '-W {value}': {exc}; write -W action[:message[:category"
            "[:module[:lineno]]]], e.g. -W ignore::DeprecationWarning"
        ) from None


@contextlib.contextmanager
def _warning_filters(filters: Sequence[str]) -> Iterator[None]:
    """Each ``-W`` filter in force, after those of ``PYTHONWARNINGS``, as python orders them."""
    if not filters:
        yield
        return
    saved = sys.warnoptions[:]
    with warnings.catch_warnings():
        for value in filters:
            _add_filter(value)
        sys.warnoptions.extend(filters)  # read by subprocess's flags for a child python
        try:
            yield
        finally:
            sys.warnoptions[:] = saved


@contextlib.contextmanager
def _no_bytecode(on: bool) -> Iterator[None]:
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = saved or on
    try:
        yield
    finally:
        sys.dont_write_bytecode = saved


@contextlib.contextmanager
def _unbuffered_stdio() -> Iterator[None]:
    """Standard output and error written through to their descriptors at each write, as
    ``python -u`` makes them."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _unbuffered(sys.stdout), _unbuffered(sys.stderr)
    made = sys.stdout, sys.stderr
    try:
        yield
    finally:
        for stream in made:
            with contextlib.suppress(Exception):
                stream.flush()
        if sys.stdout is made[0]:
            sys.stdout = saved[0]
        if sys.stderr is made[1]:
            sys.stderr = saved[1]


def _unbuffered(stream: TextIO) -> TextIO:
    """``stream`` over its descriptor with no buffer (as python builds it for ``-u``); the
    stream itself where it has no descriptor (a test's capture, a closed stream)."""
    try:
        stream.flush()
        fd = stream.fileno()
        raw = io.FileIO(fd, "w", closefd=False)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return stream
    return io.TextIOWrapper(
        raw,
        encoding=stream.encoding,
        errors=stream.errors,
        newline=None if os.name == "nt" else "\n",
        line_buffering=bool(stream.line_buffering),
        write_through=True,
    )
