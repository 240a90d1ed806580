"""What a linted file's project shows as a whole: whether any of its files pins host memory,
whether any runs models on data.

A ``non_blocking=True`` copy to the device overlaps only when its source is page-locked. When
no file of the project pins anything (no ``pin_memory=True`` loader or factory, no
``.pin_memory()``, no setting that could turn pinning on), every host tensor it copies is
pageable, wherever the copy's source was built. That is only trusted where the project shows
where its batches come from: a data loader built by its top-level scripts or in the top-level
folder of the file. The project is the folder above the file that holds ``.git``,
``pyproject.toml``, ``setup.py`` or ``setup.cfg`` (an installed package's own folder), less the
folders inside it that are projects of their own (a vendored ``apex/``); a file outside any
such folder, or a project too large to read quickly, gives no answer.

Whether the project runs models at all (a backward pass, a trainer, a loop over a data loader,
a model put in evaluation or inference mode, in any of its files) tells a library of models,
whose callers are its users' code, from a project whose own code runs its modules on data.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["pins_anywhere", "project_root", "runs_models"]

_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")
_SUFFIXES = (".py", ".pyi", ".ipynb", ".yaml", ".yml", ".toml", ".cfg", ".ini")
_INSTALLED = frozenset({"site-packages", "dist-packages"})
_SKIPPED = _INSTALLED | {"node_modules", "__pycache__", "venv", "env"}
_MAX_FILES = 5_000
_MAX_BYTES = 64 << 20
_MAX_LEVELS = 12

# Evidence that something may be pinned: `.pin_memory()`, a pinning setting given anything but
# False/None/0 (`pin_memory=True`, `pin_memory=args.pin_mem`, `"pin_memory": true`,
# `pin_memory: ${train.pin}`), CUDA's own registration, a check that expects pinned memory,
# and loaders that pin by themselves (Hugging Face's Trainer by default, FFCV, DALI).
_PINS = re.compile(
    rb"^[^#\n]*(?:\.pin_memory\s*\("
    rb"|pin_mem\w*[\"']?\s*(?:=(?!=)|:)\s*(?!(?:False|None|0)\b)[^\s,)]"
    rb"|cudaHostRegister|cudaHostAlloc|is_pinned\s*\(|TrainingArguments\b|\bffcv\b|nvidia\.dali)",
    re.MULTILINE | re.IGNORECASE,
)
# Code that runs models on data: a backward pass, a trainer (`Trainer(...)`, `.fit(`), a loop
# over a data loader, a model put in evaluation or inference mode.
_RUNS = re.compile(
    rb"^[^#\n]*(?:\.backward\s*\(|\bTrainer\b|\.fit\s*\(|\.eval\s*\(\s*\)|inference_mode"
    rb"|\bfor\b[^\n]*\bin\b[^\n]*loader)",
    re.MULTILINE,
)
# A data loader built: the project's batches come from code it shows.
_LOADS = re.compile(rb"^[^#\n]*\b(?:DataLoader|WebLoader|DataLoader2)\s*\(", re.MULTILINE)


@lru_cache(maxsize=4096)
def project_root(directory: str) -> str | None:
    """The nearest folder at or above ``directory`` that marks a project, or None; for an
    installed package, its own folder under ``site-packages``."""
    for _ in range(_MAX_LEVELS):
        parent = os.path.dirname(directory)
        if os.path.basename(parent) in _INSTALLED:
            return directory
        if any(os.path.exists(os.path.join(directory, marker)) for marker in _MARKERS):
            return directory
        if parent == directory:
            return None
        directory = parent
    return None


def pins_anywhere(path: str) -> bool | None:
    """Whether some file of ``path``'s project may pin host memory: True at the first sign of
    it; False when its files were all read, none pins, and the project's top-level scripts or
    the top-level folder that holds ``path`` build a data loader (the batches it copies come
    from code the project shows); None otherwise: no project, no loader in sight, or a project
    too large to read (more than 5,000 files or 64 MiB of them)."""
    found = _project_of(path)
    if found is None:
        return None
    root, shows = found
    if shows.pins is not False:
        return shows.pins
    return False if {"", _area(os.path.relpath(path, root))} & shows.loads else None


def runs_models(path: str) -> bool | None:
    """Whether ``path``'s project shows code that runs models on data (a backward pass, a
    trainer, a loop over a data loader, an evaluation or inference mode): False when its files
    were all read and none shows it (a library of models its users run), None for no project
    or one too large to read."""
    found = _project_of(path)
    return None if found is None else found[1].runs


def _project_of(path: str) -> tuple[str, _Shows] | None:
    """The root of ``path``'s project and what its files show, or None: a source not on disk
    (stdin, an editor's buffer), or no project."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        return None
    root = project_root(os.path.dirname(path))
    return None if root is None else (root, _scan(root))


def _area(relative: str) -> str:
    """The top-level folder a file of the project is in (``src/<package>`` in the src
    layout), or ``""`` for the project's own top-level files."""
    parts = relative.replace(os.sep, "/").split("/")[:-1]
    return "/".join(parts[:2] if parts[:1] == ["src"] else parts[:1])


@dataclass(frozen=True)
class _Shows:
    """What a project's files show: a sign of pinning, the areas whose files build a data
    loader, a sign of code running models (None: no sign in the files read before the
    project proved too large to read whole)."""

    pins: bool | None
    loads: frozenset[str]
    runs: bool | None


@lru_cache(maxsize=64)
def _scan(root: str) -> _Shows:
    """What the files of ``root`` show, each file read once. The reading stops once a file
    pins and one runs models (the loaders then matter no more)."""
    pins = runs = False
    loads: set[str] = set()
    for full, raw in _files(root):
        if raw is None:  # too large: only the signs found so far count
            return _Shows(pins or None, frozenset(), runs or None)
        pins = pins or _PINS.search(raw) is not None
        runs = runs or _RUNS.search(raw) is not None
        if pins and runs:
            break
        if not pins and _LOADS.search(raw):
            loads.add(_area(os.path.relpath(full, root)))
    return _Shows(pins, frozenset(loads), runs)


def _files(root: str) -> Iterator[tuple[str, bytes | None]]:
    """Each file of the project worth reading and its bytes; ``(path, None)`` last when the
    project holds more than :data:`_MAX_FILES` files or :data:`_MAX_BYTES` bytes of them."""
    files = budget = 0
    for directory, subdirs, names in os.walk(root):
        # not hidden or installed folders, nor a vendored project of its own (`apex/` with
        # its `setup.py`): what it holds is not this project's doing
        subdirs[:] = [
            d
            for d in subdirs
            if not d.startswith(".")
            and d not in _SKIPPED
            and not any(os.path.exists(os.path.join(directory, d, m)) for m in _MARKERS)
        ]
        for name in names:
            if not name.endswith(_SUFFIXES):
                continue
            files += 1
            full = os.path.join(directory, name)
            if not os.path.isfile(full):
                continue  # a FIFO or a device named like a module: never opened
            try:
                with open(full, "rb") as handle:
                    raw = handle.read(_MAX_BYTES - budget + 1)
            except OSError:
                continue
            budget += len(raw)
            if files > _MAX_FILES or budget > _MAX_BYTES:
                yield full, None
                return
            yield full, raw
