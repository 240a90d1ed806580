"""Reading the files around the one being linted (its siblings, the modules it imports, its
project's files): only regular files, and only up to a size, so that a named pipe, a device
(``/dev/zero``) or a huge generated file next to the code never blocks or floods the run."""

from __future__ import annotations

import os
import stat

__all__ = ["MAX_NEIGHBOUR_BYTES", "read_neighbour"]

#: the largest file read for what it tells about another (a module of 4 MiB is generated code)
MAX_NEIGHBOUR_BYTES = 4 << 20


def read_neighbour(path: str, limit: int = MAX_NEIGHBOUR_BYTES) -> bytes | None:
    """The bytes of the regular file at ``path``, at most ``limit`` of them (a longer file is
    None, as one that cannot be read); a FIFO, a device or a directory is None unopened."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError:
        return None
    return data if len(data) <= limit else None
