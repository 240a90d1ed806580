"""Reading the files around the one linted: a named pipe, a device or a huge file beside the
code never blocks or floods the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchplace.lint.sources import read_neighbour

_TRAIN = (
    "import torch\n\ndef f(m, loader):\n    for x in loader:\n        print(m(x.cuda()).item())\n"
)


def test_read_neighbour_reads_regular_files_up_to_a_size(tmp_path: Path) -> None:
    small, big = tmp_path / "a.py", tmp_path / "b.py"
    small.write_bytes(b"x = 1\n")
    big.write_bytes(b"#" * 100)
    assert read_neighbour(str(small)) == b"x = 1\n"
    assert read_neighbour(str(big), limit=99) is None
    assert read_neighbour(str(big), limit=100) == b"#" * 100
    assert read_neighbour(str(tmp_path)) is None  # a folder
    assert read_neighbour(str(tmp_path / "missing.py")) is None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_named_pipe_is_never_opened(tmp_path: Path) -> None:
    pipe = tmp_path / "stream.py"
    os.mkfifo(pipe)
    assert read_neighbour(str(pipe)) is None  # opening it would block until a writer came


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_lint_finishes_beside_a_pipe_and_a_device(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(_TRAIN)
    os.mkfifo(tmp_path / "logpipe")  # a script without a suffix is sniffed for a shebang
    os.mkfifo(tmp_path / "stream.py")
    if os.path.exists("/dev/zero"):
        (tmp_path / "zeros.py").symlink_to("/dev/zero")
    for target in ("train.py", "."):
        done = subprocess.run(
            [sys.executable, "-m", "torchplace.cli", "lint", "--format", "json", target],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,  # a guard against a hang, not a timing: the old reader blocked forever
        )
        assert done.returncode == 1, done.stderr
        assert '"TPL201"' in done.stdout
        assert "internal error" not in done.stderr
