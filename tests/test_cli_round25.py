"""Round 25 of the command-line output convention: defects found and fixed.

* ``torchplace --help > /dev/full`` (any command's ``--help``, ``--version``) exited 0 with
  nothing written: argparse drops the error of its write to standard output.
* docs/cli.md's convention did not say that ``-o PATH/`` (a trailing slash) is a usage error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import IO

import pytest

HELP = [
    ["--help"],
    ["--version"],
    ["doctor", "--help"],
    ["lint", "-h"],
    ["bench", "--help"],
    ["bench", "timing", "--help"],
    ["plan", "--help"],
    ["guard", "--help"],
]


def _torchplace(args: list[str], stdout: int | IO[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchplace", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
@pytest.mark.parametrize("args", HELP, ids=" ".join)
def test_help_that_cannot_be_written_fails(args: list[str]) -> None:
    # was: exit 0, nothing on stderr, the help lost
    with open("/dev/full", "w") as full:
        done = _torchplace(args, full)
    assert done.returncode == 1, done.stderr
    command = " ".join(["torchplace", *args[: len(args) - 1]])
    what = "the version" if args == ["--version"] else "the help"
    assert done.stderr == (
        f"{command}: error: cannot write {what} to standard output (No space left on device)\n"
    )


@pytest.mark.parametrize("args", [["--help"], ["lint", "--help"]], ids=" ".join)
def test_help_into_a_closed_pipe_ends_quietly(args: list[str]) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader went away before the help was written: `| head -0`
    try:
        done = _torchplace(args, write)
    finally:
        os.close(write)
    assert done.returncode == 1
    assert done.stderr == ""  # no traceback, no BrokenPipeError, as for a report


def test_help_still_exits_0() -> None:
    done = _torchplace(["lint", "--help"], subprocess.PIPE)
    assert done.returncode == 0
    assert done.stdout.startswith("usage: torchplace lint")
