"""Room for a benchmark's tensors: refuse sizes that cannot fit before allocating them.

A benchmark asked for more memory than the machine has would otherwise fail deep inside torch
with an allocator traceback, or worse, push the host into swap or the out-of-memory killer.
:func:`require_memory` compares what a run will allocate with what is free (``MemAvailable``
and the cgroup limit on the host, ``torch.cuda.mem_get_info`` on a CUDA device) and says which
flag to change.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from torchplace.bench.units import format_bytes
from torchplace.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["available_bytes", "host_available_bytes", "require_memory"]


def host_available_bytes() -> int | None:
    """Host memory that can be allocated now: ``MemAvailable``, capped by a cgroup limit."""
    found: list[int] = []
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            found.append(max(0, int(limit) - used))
    if not found:
        with contextlib.suppress(AttributeError, OSError, ValueError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return min(found) if found else None


def available_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` (the host for ``cpu``); None where it cannot be read."""
    if device.type == "cpu":
        return host_available_bytes()
    if device.type == "cuda":
        from torchplace.serve.memory import cuda_free_bytes

        with contextlib.suppress(RuntimeError, AssertionError):
            return cuda_free_bytes(str(device))
    return None


def require_memory(device: torch.device, nbytes: int, what: str, fix: str) -> None:
    """Refuse, naming ``what`` and the ``fix``, when ``nbytes`` cannot fit on ``device``."""
    free = available_bytes(device)
    if free is not None and nbytes > free:
        where = "the host" if device.type == "cpu" else str(device)
        raise ConfigError(
            f"{what} needs {format_bytes(nbytes)} on {where}, which has "
            f"{format_bytes(free)} free; {fix}"
        )
