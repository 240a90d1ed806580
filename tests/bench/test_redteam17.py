"""Round 17 of the new-user red team on ``torchplace bench``: an ``-o`` path that only the write
itself would refuse (``/proc/version`` as root) is refused before the benchmark runs."""

from __future__ import annotations

import os
import socket
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchplace import report
from torchplace.cli import main
from torchplace.errors import ConfigError

BENCH = ["bench", "model", "--device", "cpu", "--model", "seed-mlp", "--batch-sizes", "1"]
linux = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.exists("/proc/self/mountinfo"),
    reason="kernel file systems, as Linux mounts them",
)


@linux
@pytest.mark.parametrize("path", ["/proc/version", "/proc/self/status", "/sys/torchplace.json"])
def test_a_file_on_a_kernel_file_system_is_refused_before_any_work(
    path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # was (as root): the whole benchmark ran, then "cannot use '/proc/version': Input/output
    # error", exit 1
    start = time.monotonic()
    assert main([*BENCH, "--min-time", "2", "-o", path]) == 2
    assert time.monotonic() - start < 2  # refused, not measured first
    err = capsys.readouterr().err
    assert f"-o {path!r} is on " in err
    assert "a kernel file system" in err


@linux
def test_the_check_is_shared_by_every_flag_and_command() -> None:
    with pytest.raises(ConfigError, match=r"--plot '/proc/version' is on 'proc'"):
        report.check_output("/proc/version", flag="--plot")


@pytest.fixture
def unix_socket() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(dir="/tmp"))  # a socket's path is short (108 bytes)
    path = folder / "s"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        yield path
    finally:
        server.close()
        path.unlink(missing_ok=True)
        folder.rmdir()


@pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no unix sockets")
def test_a_socket_is_refused_before_any_work(
    unix_socket: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # was: the benchmark ran, then the write failed (exit 1)
    assert main([*BENCH, "--min-time", "0.01", "-o", str(unix_socket)]) == 2
    assert "is a socket" in capsys.readouterr().err


def _a_block_device() -> str | None:
    try:
        entries = list(os.scandir("/dev"))
    except OSError:
        return None
    for entry in entries:
        try:
            if stat.S_ISBLK(entry.stat().st_mode):
                return entry.path
        except OSError:
            continue
    return None


def test_a_block_device_is_refused_not_overwritten() -> None:
    device = _a_block_device()
    if device is None:
        pytest.skip("no block device here")
    with pytest.raises(ConfigError, match="is a block device"):
        report.check_output(device)


@pytest.mark.parametrize("path", [os.devnull, "-"])
def test_streams_and_devices_are_still_written(path: str) -> None:
    report.check_output(path)  # nothing raised
