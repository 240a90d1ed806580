"""One output convention for every report command (doctor, guard, bench, lint, plan, ...).

Every report command takes the same three options, added by :func:`add_output_options`:

* ``--format text|json`` (a command may add more, as lint adds ``sarif`` and ``github``), with
  ``--json`` as the short form of ``--format json``; ``--json`` never takes an argument.
* ``-o/--output PATH``: write the report there instead of the command's stream. The stream is
  stdout, except for ``guard``, which reports on stderr so the program's own stdout stays clean.

and the same exit statuses: :data:`EXIT_OK` (0) fine, :data:`EXIT_FAILED` (1) the check found
something or failed, :data:`EXIT_USAGE` (2) usage or internal error.

A JSON report is one envelope (:func:`envelope`): ``schema`` (``torchplace.COMMAND/vN``),
``command``, ``torchplace`` and ``torch`` versions, ``device``, then the command's ``result``.
Each command's JSON Schema ships in ``torchplace/schemas/COMMAND.vN.json``
(:func:`schema_path`); a breaking change to a report takes a new version name.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import stat
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from torchplace import __version__
from torchplace.errors import ConfigError, TorchplaceError

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "FORMATS",
    "SCHEMA_VERSION",
    "STDOUT",
    "add_output_options",
    "check_distinct",
    "check_output",
    "check_stdout",
    "envelope",
    "load_schema",
    "model_source",
    "open_report",
    "require_torch",
    "schema_id",
    "schema_path",
    "to_json",
    "torch_version",
    "write_report",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
FORMATS: tuple[str, ...] = ("text", "json")
SCHEMA_VERSION = "v1"
STDOUT = "-"
"""The ``-o`` value that means standard output."""
_SCHEMAS = Path(__file__).parent / "schemas"


def add_output_options(
    parser: argparse.ArgumentParser,
    *,
    formats: Sequence[str] = FORMATS,
    stream: str = "stdout",
) -> None:
    """Add ``--format``, ``--json`` and ``-o/--output`` to a report command's parser."""
    group = parser.add_argument_group("output (the same for every report command)")
    group.add_argument(
        "--format",
        choices=list(formats),
        default="text",
        help=f"report format: {', '.join(formats)} (default: text)",
    )
    group.add_argument(
        "--json",
        dest="format",
        action="store_const",
        const="json",
        help="short for --format json",
    )
    group.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help=f"write the report to PATH instead of {stream} ('-': standard output)",
    )


def torch_version() -> str | None:
    """The torch version, read without importing torch when the command has not done so."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return str(torch.__version__)
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def schema_id(command: str, version: str = SCHEMA_VERSION) -> str:
    """The ``schema`` value of a command's report, e.g. ``torchplace.doctor/v1``."""
    return f"torchplace.{command}/{version}"


def envelope(
    command: str,
    result: Mapping[str, Any] | Sequence[Any],
    *,
    device: str | None = None,
    version: str = SCHEMA_VERSION,
) -> dict[str, Any]:
    """Wrap a command's result in the one JSON envelope every report shares."""
    return {
        "schema": schema_id(command, version),
        "command": command,
        "torchplace": __version__,
        "torch": torch_version(),
        "device": device,
        "result": result,
    }


def to_json(document: Mapping[str, Any]) -> str:
    """Serialise a report: indented, keys in insertion order, anything else as ``str``."""
    return json.dumps(document, indent=2, default=str) + "\n"


#: the narrowest $COLUMNS a text report is drawn at; below it (0 in some CI shells) rich draws
#: nothing at all, or one character per line
MIN_COLUMNS = 40


def console_width(width: int | None = None) -> int | None:
    """The ``width`` to give a rich Console for a text report: ``width`` as the command chose it
    (None: the terminal's, or $COLUMNS), unless $COLUMNS is set to what is no usable width
    (``0``, ``-5``, ``abc``, under :data:`MIN_COLUMNS`): then 120, as for a file."""
    columns = os.environ.get("COLUMNS")
    if columns is None:
        return width
    try:
        usable = int(columns) >= MIN_COLUMNS
    except ValueError:
        usable = False
    return width if usable else (width or 120)


def check_output(output: str | Path | None, *, flag: str = "-o") -> None:
    """Refuse an output path (``-o``, or another ``flag``) that cannot be written, before the
    command does its work."""
    if output is None or str(output) == STDOUT:
        return
    fix = f"give {flag} a file in an existing, writable directory"
    if str(output) == "":
        raise ConfigError(f"{flag} '' is empty; {fix}")
    given = str(output)
    if given.endswith(tuple(sep for sep in (os.sep, os.altsep) if sep)) and not os.path.isdir(
        given
    ):
        # Path() drops the final '/', which would write the file 'out' for 'out/'
        raise ConfigError(f"{flag} {given!r} ends in {given[-1]!r}, so it names a directory; {fix}")
    try:
        _check_writable(Path(output), flag, fix)
    except OSError as exc:  # a name too long, a component that is not a directory, ...
        raise ConfigError(f"{flag} {str(output)!r}: {exc.strerror or exc}; {fix}") from None


def check_stdout(output: str | Path | None) -> None:
    """Refuse, before the command does its work, a report bound for standard output (no ``-o``,
    or ``-o -``) when it is closed (``>&-``): the work would be done and its report lost."""
    if output is not None and str(output) != STDOUT:
        return
    if sys.stdout is None or sys.stdout.closed:
        raise ConfigError(
            "standard output is closed, so the report has nowhere to go; write it with -o PATH"
        )


def _check_writable(path: Path, flag: str, fix: str) -> None:
    given = str(path)
    if path.is_dir():
        raise ConfigError(f"{flag} {given!r} is a directory; {fix}")
    if path.exists() and not path.is_file():
        _check_special(path, given, flag, fix)
        return  # a pipe, a terminal, /dev/stdout (a link to one): the write itself will say
    if path.is_symlink():  # written through: where the link leads must be writable
        try:
            path = path.resolve(strict=False)
        except RuntimeError:  # a loop of links (Python < 3.13; later ones raise OSError)
            raise ConfigError(f"{flag} {given!r} is a loop of symbolic links; {fix}") from None
        if path.is_symlink():  # still a link: resolve stopped at a loop
            raise ConfigError(f"{flag} {given!r} is a loop of symbolic links; {fix}")
    parent = path.parent
    if not parent.is_dir():
        raise ConfigError(
            f"{flag} {given!r}: directory {str(parent)!r} does not exist; create it or {fix}"
        )
    pathconf = getattr(os, "pathconf", None)  # POSIX only
    longest = pathconf(parent, "PC_NAME_MAX") if pathconf is not None else 255
    if len(os.fsencode(path.name)) > longest:
        raise ConfigError(f"{flag} {given!r}: the file name is too long; {fix}")
    _check_file_system(path, given, flag, fix)
    if path.exists():
        if not os.access(path, os.W_OK):
            raise ConfigError(f"{flag} {given!r} is not writable; fix its permissions or {fix}")
    elif not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{flag} {given!r}: directory {str(parent)!r} is not writable; "
            f"fix its permissions or {fix}"
        )
    _try_writing(path)


def _check_special(path: Path, given: str, flag: str, fix: str) -> None:
    """Refuse a file that is no file to write a report to and is not a stream: a socket, which
    cannot be opened, or a block device (a disk), which the report would overwrite."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    if stat.S_ISSOCK(mode):
        raise ConfigError(f"{flag} {given!r} is a socket, which cannot be written as a file; {fix}")
    if stat.S_ISBLK(mode):
        raise ConfigError(
            f"{flag} {given!r} is a block device (a disk or partition), which the report "
            f"would overwrite; {fix}"
        )


#: kernel file systems, whose files are the kernel's settings and reports, not storage: a
#: write is a command to the kernel (a setting in /sys or /proc/sys) or fails only once the
#: work is done (/proc/version, hugetlbfs)
_KERNEL_FILE_SYSTEMS = frozenset(
    {
        "autofs",
        "binfmt_misc",
        "bpf",
        "cgroup",
        "cgroup2",
        "configfs",
        "debugfs",
        "efivarfs",
        "fusectl",
        "hugetlbfs",
        "mqueue",
        "nsfs",
        "proc",
        "pstore",
        "rpc_pipefs",
        "securityfs",
        "selinuxfs",
        "sysfs",
        "tracefs",
    }
)


def _check_file_system(path: Path, given: str, flag: str, fix: str) -> None:
    """Refuse a regular file (or a new one) on a kernel file system: root may open
    ``/proc/version`` for writing, and the write fails after the work is done."""
    kind = _file_system(path)
    if kind in _KERNEL_FILE_SYSTEMS:
        raise ConfigError(
            f"{flag} {given!r} is on {kind!r}, a kernel file system whose files are the "
            f"kernel's settings and reports, not storage, so it cannot take a report; {fix}"
        )


def _file_system(path: str | Path) -> str | None:
    """The type of the file system ``path`` is (or would be created) on, as Linux's
    ``/proc/self/mountinfo`` names it (``ext4``, ``proc``, ``tmpfs``); None elsewhere."""
    try:
        table = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    target = os.path.realpath(path)
    best, kind = "", None
    for line in table.splitlines():
        head, separator, tail = line.partition(" - ")
        fields, types = head.split(), tail.split()
        if not separator or len(fields) < 5 or not types:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        # the longest mount point holding the path; of equal ones, the last (mounted over)
        if _holds(point, target) and len(point) >= len(best):
            best, kind = point, types[0]
    return kind


def _holds(point: str, target: str) -> bool:
    return point == "/" or target == point or target.startswith(point.rstrip("/") + "/")


def _try_writing(path: Path) -> None:
    """Open ``path`` for writing as the command will, changing nothing: ``os.access`` says yes
    to root for any file, also where no file can be written (``/proc``, ``/sys``). An existing
    regular file is opened to append and closed; a new one is created and removed. Other files
    (a pipe, a terminal) are left to the write itself. Raises OSError when it cannot be done."""
    if path.exists():
        if path.is_file():
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:  # made meanwhile by another process: it can be opened
        return
    path.unlink()


def require_torch() -> None:
    """Import torch, or say why it cannot be (exit 1, no traceback): a broken install, or an
    environment variable torch reads on import (``TORCH_LOGS=bogus``) making ``import torch``
    itself fail. For the commands that need torch, before they import it."""
    try:
        import torch  # noqa: F401
    except Exception as exc:
        text = " ".join(str(exc).split())
        first = text.split(". ", 1)[0].rstrip(".")  # its first sentence: torch's can be long
        why = f"{type(exc).__name__}: {first[:300]}".rstrip(": ")
        suspects = sorted(
            f"{name}={value}"
            for name, value in os.environ.items()
            if name.startswith(("TORCH_", "PYTORCH_"))
        )
        if suspects:
            fix = (
                "check the environment variables torch reads on import, or unset them: "
                + ", ".join(suspects)
            )
        else:
            fix = "reinstall torch (pip install --force-reinstall torch) in this environment"
        raise TorchplaceError(f"torch cannot be imported ({why}). Fix: {fix}") from None


def check_distinct(outputs: Iterable[str | Path | None], inputs: Iterable[str | Path] = ()) -> None:
    """Refuse two outputs that name one file (one would overwrite the other), or an output that
    names one of the command's ``inputs`` (the report would overwrite what it reports on)."""
    seen: dict[Path, str] = {}
    for output in outputs:
        if output is None or str(output) in ("", STDOUT):
            continue
        key = Path(output).resolve()
        if key in seen:
            raise ConfigError(
                f"{seen[key]!r} and {str(output)!r} name the same file, and one would overwrite "
                "the other; give each its own path"
            )
        seen[key] = str(output)
    for given in inputs:
        key = Path(given).resolve()
        if key in seen:
            raise ConfigError(
                f"{seen[key]!r} is also an input of this command ({str(given)!r}): the report "
                "would overwrite it; give the output another path"
            )


def model_source(spec: object) -> list[str]:
    """The file that defines a ``--model module:callable`` (which a report must not overwrite);
    [] for an embedded model, or a module that cannot be found (loading it says why, later)."""
    import contextlib
    import importlib.util

    module_name = spec.partition(":")[0] if isinstance(spec, str) and ":" in spec else ""
    if not module_name:
        return []
    try:  # a parent package is imported to find a submodule: its prints go to stderr
        with contextlib.redirect_stdout(sys.stderr):
            found = importlib.util.find_spec(module_name)
    except (Exception, SystemExit):
        return []
    origin = getattr(found, "origin", None)
    return [origin] if isinstance(origin, str) and os.path.isfile(origin) else []


@contextmanager
def open_report(output: str | Path | None, *, stream: TextIO | None = None) -> Iterator[TextIO]:
    """The stream to write a report to: the file ``output`` when given, else ``stream`` (stdout).

    For reports drawn piece by piece (rich tables); :func:`write_report` writes a finished text.
    ``output`` ``"-"`` is standard output, as most command-line tools read it.
    """
    if output is not None and str(output) == STDOUT:
        output, stream = None, None
    if output is not None:
        try:
            with _replacing(Path(output)) as file:
                yield file
        except OSError as exc:
            if exc.filename is None:  # a failed write or close (a full disk): name the file
                exc.filename = str(output)
            raise
        return
    target = sys.stdout if stream is None else stream
    if target is None or target.closed:
        name = "standard output" if stream is None else "the report's stream"
        raise ConfigError(
            f"{name} is closed, so the report has nowhere to go; write it with -o PATH"
        )
    yield target
    target.flush()


#: how a report file writes what UTF-8 cannot encode: a file name that is not UTF-8 (python
#: holds its bytes as surrogates, ``\udcff``) is written as that escape, as error messages show
#: it, and the file stays valid UTF-8 for the programs that read it (SARIF, JSON, annotations)
_ERRORS = "backslashreplace"


@contextmanager
def _replacing(path: Path) -> Iterator[TextIO]:
    """Write ``path`` whole or not at all: into a new file beside it, which replaces it once
    the report is complete, so a report that fails half-way (a full disk, an interrupt, an
    error while drawing) leaves the previous file as it was. A symbolic link (``/dev/stdout``
    too), a path that is not a regular file (a pipe), or one whose directory takes no new file
    is written in place, as before."""
    fd, temp = -1, path.with_name(f".torchplace-{os.urandom(6).hex()}.tmp")
    if not path.is_symlink() and (not path.exists() or path.is_file()):
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError:  # a read-only directory holding a writable file, ...
            fd = -1
    if fd < 0:
        with path.open("w", encoding="utf-8", errors=_ERRORS) as file:
            yield file
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors=_ERRORS) as file:
            yield file
        if path.exists():
            os.chmod(temp, path.stat().st_mode & 0o7777)  # the old file's permissions
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def write_report(text: str, output: str | Path | None, *, stream: TextIO | None = None) -> None:
    """Write a rendered report to ``output`` when given, else to ``stream`` (stdout)."""
    with open_report(output, stream=stream) as target:
        try:
            target.write(text)
        except UnicodeEncodeError:  # a non-UTF-8 file name (surrogates) on a strict stream
            encoding = getattr(target, "encoding", None) or "utf-8"
            target.write(text.encode(encoding, "backslashreplace").decode(encoding))


def schema_path(command: str, version: str = SCHEMA_VERSION) -> Path:
    """Where the JSON Schema of a command's report ships inside the package."""
    return _SCHEMAS / f"{command}.{version}.json"


def load_schema(command: str, version: str = SCHEMA_VERSION) -> dict[str, Any]:
    """The JSON Schema of a command's report, as shipped."""
    schema: dict[str, Any] = json.loads(schema_path(command, version).read_text(encoding="utf-8"))
    return schema
