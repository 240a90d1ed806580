"""One virtual environment per peer server, outside the repository, built with pip.

Each venv gets the repository's torch pin (``constraints/ci.txt``: the CPU wheel) and the peer's
own packages, so that no peer's dependencies can change another's or torchplace's. A venv counts
as built once its stamp file records the exact requirements it was built with; a changed
requirement rebuilds it. A failed build raises :class:`SetupError` with the end of pip's output,
which the benchmark prints as the peer's SKIP reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: where the venvs live unless ``--venvs`` or ``$TORCHPLACE_BENCH_VENVS`` says otherwise
DEFAULT_ROOT = Path.home() / ".cache" / "torchplace-bench" / "venvs"
ROOT_ENV = "TORCHPLACE_BENCH_VENVS"
STAMP = ".torchplace-bench-stamp"


class SetupError(RuntimeError):
    """A peer's venv could not be built; the message is the reason to print."""


@dataclass(frozen=True)
class VenvSpec:
    """What one peer's venv holds: ``requirements`` (pip specifiers, torch comes from the
    constraints file) and ``imports``, the modules that prove the install worked."""

    name: str
    requirements: tuple[str, ...]
    imports: tuple[str, ...]

    def key(self) -> str:
        """The stamp: what the venv was built with."""
        return "\n".join(("torch", *self.requirements, "imports: " + ",".join(self.imports)))


def default_root() -> Path:
    configured = os.environ.get(ROOT_ENV)
    return Path(configured).expanduser() if configured else DEFAULT_ROOT


def python_of(root: Path, spec: VenvSpec) -> Path:
    return root / spec.name / "bin" / "python"


def is_built(root: Path, spec: VenvSpec) -> bool:
    stamp = root / spec.name / STAMP
    return python_of(root, spec).exists() and stamp.exists() and stamp.read_text() == spec.key()


def _tail(text: str, lines: int = 6) -> str:
    errors = [line for line in text.splitlines() if "error" in line.lower()]
    picked = errors[-lines:] if errors else text.splitlines()[-lines:]
    return " | ".join(line.strip() for line in picked if line.strip())[-900:]


def build(root: Path, spec: VenvSpec, constraints: Path, *, timeout: float) -> Path:
    """Create ``spec``'s venv under ``root``, or install into the one there (pip keeps what
    already fits); its python, or :class:`SetupError`."""
    where = root / spec.name
    where.parent.mkdir(parents=True, exist_ok=True)
    (where / STAMP).unlink(missing_ok=True)
    python = python_of(root, spec)
    steps = (
        [sys.executable, "-m", "venv", str(where)] if not python.exists() else None,
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-c",
            str(constraints),
            "torch",
            *spec.requirements,
        ],
        [str(python), "-c", "; ".join(f"import {name}" for name in spec.imports)],
    )
    for argv in steps:
        if argv is None:
            continue
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise SetupError(f"{' '.join(argv[2:5])} took over {timeout:.0f} s") from None
        if done.returncode != 0:
            what = "pip install" if "pip" in argv else argv[-1][:80]
            raise SetupError(f"{what} failed: {_tail(done.stdout + done.stderr)}")
    (where / STAMP).write_text(spec.key())
    return python
