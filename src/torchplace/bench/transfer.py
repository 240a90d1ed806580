"""Host/device copy bandwidth: H2D and D2H, pageable and pinned, ``non_blocking`` off and on.

The article's exercise 5. For every size, host memory is allocated twice: once pageable (plain
``torch.empty``, pages touched before timing) and once pinned (``pin_memory=True``), and the
pinned allocation is timed on its own, since page-locking costs far more than a copy of the same
size and is paid once. Each copy is then timed with :class:`~torchplace.bench.timer.Timer`
(CUDA events around every copy, the first copy reported apart), in both directions and with
``non_blocking`` off and on. Rates are decimal GB/s; where the PCIe link can be read (NVML or
sysfs) each rate is also given as a percentage of the link's theoretical peak.

CUDA only: on the CPU there is no host/device link to cross.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchplace.bench.link import LinkInfo, read_link
from torchplace.bench.memory import require_memory
from torchplace.bench.timer import Measurement, Timer
from torchplace.bench.units import format_bytes
from torchplace.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_SIZES",
    "DIRECTIONS",
    "MEMORY_KINDS",
    "TransferCase",
    "TransferResult",
    "cuda_bus_id",
    "run_transfer",
    "transfer_cases",
]

DEFAULT_SIZES: tuple[int, ...] = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20)
"""4 KiB, 64 KiB, 1 MiB, 16 MiB and 256 MiB."""

DIRECTIONS = ("H2D", "D2H")
MEMORY_KINDS = ("pageable", "pinned")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TransferCase:
    """One timed copy: its size, direction, host memory kind and ``non_blocking`` flag."""

    size_bytes: int
    direction: str
    memory: str
    non_blocking: bool
    measurement: Measurement
    link_peak_bytes_per_s: float | None = None

    @property
    def bytes_per_s(self) -> float:
        """Bandwidth at the median copy time."""
        return self.size_bytes / self.measurement.median_s

    @property
    def percent_of_peak(self) -> float | None:
        if not self.link_peak_bytes_per_s:
            return None
        return 100.0 * self.bytes_per_s / self.link_peak_bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "size_bytes": self.size_bytes,
            "direction": self.direction,
            "memory": self.memory,
            "non_blocking": self.non_blocking,
            "gb_per_s": self.bytes_per_s / 1e9,
            "percent_of_peak": self.percent_of_peak,
            "first_copy_s": self.measurement.cold_s,
            "timing": self.measurement.to_dict(),
        }


@dataclass(frozen=True)
class TransferResult:
    """Every copy timed, the cost of allocating pinned memory per size, and the link."""

    device: str
    cases: tuple[TransferCase, ...]
    pinned_alloc_s: dict[int, float] = field(default_factory=dict)
    pageable_alloc_s: dict[int, float] = field(default_factory=dict)
    link: LinkInfo | None = None
    link_note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "link": None if self.link is None else self.link.to_dict(),
            "link_note": self.link_note,
            "allocation": [
                {
                    "size_bytes": size,
                    "pinned_s": self.pinned_alloc_s[size],
                    "pageable_s": self.pageable_alloc_s.get(size),
                }
                for size in sorted(self.pinned_alloc_s)
            ],
            "cases": [case.to_dict() for case in self.cases],
        }


def transfer_cases() -> list[tuple[str, str, bool]]:
    """(direction, memory, non_blocking) for every case timed per size."""
    return [
        (direction, memory, non_blocking)
        for direction in DIRECTIONS
        for memory in MEMORY_KINDS
        for non_blocking in (False, True)
    ]


def cuda_bus_id(device: torch.device) -> str | None:
    """The PCI address (``00000000:3b:00.0``) of a CUDA device, when torch exposes it."""
    from torchplace.devices import default_probe

    return default_probe().properties(device.index or 0).pci_bus_id


def _timed(fn: Callable[[], Any], clock: Callable[[], int]) -> tuple[Any, float]:
    start = clock()
    value = fn()
    return value, (clock() - start) * 1e-9


def run_transfer(
    device: torch.device,
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    min_time: float = 0.05,
    warmup: int = 2,
    progress: Progress | None = None,
    link_reader: Callable[[torch.device], tuple[LinkInfo | None, str]] | None = None,
) -> TransferResult:
    """Time every copy case for every size on a CUDA ``device``."""
    if device.type != "cuda":
        raise ConfigError(
            f"transfer needs a CUDA device, got {device}; run it with --device cuda:N"
        )
    if not sizes or any(size < 1 for size in sizes):
        raise ConfigError(f"sizes must be positive byte counts, got {list(sizes)!r}")
    _require_room(device, max(sizes))
    timer = Timer(device=device, warmup=warmup, min_time=min_time, min_repeats=5, max_repeats=1000)
    return _sweep(timer, sizes, progress, link_reader or _read_cuda_link)


def _require_room(device: torch.device, size: int) -> None:
    """Refuse a size whose buffers cannot fit: pageable and pinned on the host, one on ``device``."""
    import torch

    what, fix = f"a {format_bytes(size)} copy", "give smaller --sizes"
    require_memory(torch.device("cpu"), 2 * size, f"{what} (pageable and pinned)", fix)
    require_memory(device, size, what, fix)


def _sweep(
    timer: Timer,
    sizes: Sequence[int],
    progress: Progress | None,
    link_reader: Callable[[torch.device], tuple[LinkInfo | None, str]],
) -> TransferResult:
    """The sweep itself, for any timer (tests drive it on the CPU with stand-in pinning)."""
    import time

    import torch

    device = timer.device
    clock = time.perf_counter_ns
    cases: list[TransferCase] = []
    pinned_alloc: dict[int, float] = {}
    pageable_alloc: dict[int, float] = {}
    # Create the CUDA context and the caching allocator before any timed allocation.
    torch.empty(1, device=device)
    timer.synchronize()
    # a size given twice (4K,4096) is timed once: the allocation figures are one per size
    for size in dict.fromkeys(sizes):
        pageable, pageable_alloc[size] = _timed(functools.partial(_pageable, size), clock)
        _drop_cached_pinned_blocks()
        pinned, pinned_alloc[size] = _timed(functools.partial(_pinned, size), clock)
        pinned.fill_(1)
        on_device = torch.empty(size, dtype=torch.uint8, device=device)
        host = {"pageable": pageable, "pinned": pinned}
        for direction, memory, non_blocking in transfer_cases():
            if progress is not None:
                progress(f"{format_bytes(size)} {direction} {memory} non_blocking={non_blocking}")
            if direction == "H2D":
                src, dst = host[memory], on_device
            else:
                src, dst = on_device, host[memory]
            measurement = timer.measure(
                lambda src=src, dst=dst, nb=non_blocking: dst.copy_(src, non_blocking=nb),
                label=f"{direction} {memory} non_blocking={non_blocking}",
            )
            cases.append(TransferCase(size, direction, memory, non_blocking, measurement))
        del pageable, pinned, on_device, host
    link, note = link_reader(device)
    if link is not None:
        cases = [
            TransferCase(
                c.size_bytes,
                c.direction,
                c.memory,
                c.non_blocking,
                c.measurement,
                link.peak_bytes_per_s,
            )
            for c in cases
        ]
    return TransferResult(
        device=str(device),
        cases=tuple(cases),
        pinned_alloc_s=pinned_alloc,
        pageable_alloc_s=pageable_alloc,
        link=link,
        link_note=note,
    )


def _pageable(size: int) -> torch.Tensor:
    import torch

    return torch.empty(size, dtype=torch.uint8).fill_(1)


def _pinned(size: int) -> torch.Tensor:
    import torch

    return torch.empty(size, dtype=torch.uint8, pin_memory=True)


def _drop_cached_pinned_blocks() -> None:
    """Free the pinned blocks torch's host allocator keeps for reuse, so that the next pinned
    allocation is timed as a real one (page-locking), not as a cache hit.

    A pinned tensor freed earlier in the process (a previous sweep, a ``DataLoader`` with
    ``pin_memory``, a prefetcher's staging pool) leaves its block cached by size, and an
    allocation of the same size would then cost microseconds. Only free blocks are released.
    Torch builds without the hook (CPU-only ones) have no pinned cache to drop.
    """
    import torch

    empty_cache = getattr(torch._C, "_host_emptyCache", None)
    if callable(empty_cache):
        empty_cache()


def _read_cuda_link(device: torch.device) -> tuple[LinkInfo | None, str]:
    return read_link(cuda_bus_id(device))
