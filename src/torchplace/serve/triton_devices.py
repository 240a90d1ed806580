"""Triton's GPU and CPU gauges (``nv_gpu_*``, ``nv_cpu_*``), read at scrape time.

Next to the ``nv_inference_*`` series (:mod:`torchplace.serve.triton_metrics`), ``/metrics``
gives what Triton's dashboards plot beside them, in Triton's names and help texts:

===============================  =========================================================
``nv_gpu_memory_total_bytes``    each GPU a model is served on, by ``gpu_uuid`` (Triton's
``nv_gpu_memory_used_bytes``     ``GPU-...``): the device's memory, every process's use
                                 (``torch.cuda.mem_get_info``, as ``nvidia-smi`` counts)
``nv_gpu_utilization``           the share of the last sample period a kernel ran, 0 to 1,
``nv_gpu_power_usage``           and the power drawn in watts: through NVML, with the
                                 ``nvidia-ml-py`` package installed (else left out)
``nv_cpu_utilization``           the host's CPUs busy since the last scrape, 0 to 1
``nv_cpu_memory_total_bytes``    the host's memory, and what is in use (total less
``nv_cpu_memory_used_bytes``     available), from ``/proc`` (Linux; else left out)
===============================  =========================================================
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from torchplace.serve.triton_metrics import family

__all__ = ["CpuUsage", "GpuReading", "devices_text", "gpu_reading"]


@dataclass(frozen=True)
class GpuReading:
    """One GPU as the gauges show it (None: not known here)."""

    uuid: str
    total_bytes: int
    used_bytes: int
    utilization: float | None = None
    power_watts: float | None = None


def gpu_reading(device: str) -> GpuReading | None:
    """The reading of a CUDA device (``cuda:1``); None for any other device."""
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    index = torch.device(device).index or 0
    free, total = torch.cuda.mem_get_info(index)
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    utilization = power = None
    with contextlib.suppress(Exception):  # NVML (nvidia-ml-py) missing, or not answering
        utilization = torch.cuda.utilization(index) / 100
        power = torch.cuda.power_draw(index) / 1000
    return GpuReading(
        uuid=uuid if uuid.startswith("GPU-") else f"GPU-{uuid}",
        total_bytes=int(total),
        used_bytes=int(total - free),
        utilization=utilization,
        power_watts=power,
    )


class CpuUsage:
    """The host's CPU utilization between two readings of ``/proc/stat`` (Triton's count:
    user, nice, system, irq, softirq and steal are busy; idle and iowait are not)."""

    def __init__(self, stat: Path = Path("/proc/stat")) -> None:
        self._stat = stat
        self._last = self._read()

    def utilization(self) -> float | None:
        """The share of CPU time busy since the last call (or since this was made)."""
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None:
            return None
        busy, idle = (max(0, a - b) for a, b in zip(now, last, strict=True))
        return busy / (busy + idle) if busy + idle else 0.0

    def _read(self) -> tuple[int, int] | None:
        try:
            line = self._stat.read_text().split("\n", 1)[0].split()
        except OSError:
            return None
        if len(line) < 9 or line[0] != "cpu":
            return None
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, line[1:9])
        return user + nice + system + irq + softirq + steal, idle + iowait


def cpu_memory(meminfo: Path = Path("/proc/meminfo")) -> tuple[int, int] | None:
    """The host's (total, used) memory in bytes, used being total less available."""
    found: dict[str, int] = {}
    try:
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("MemTotal", "MemAvailable"):
                found[name] = int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if len(found) < 2:
        return None
    total = found["MemTotal"]
    return total, max(0, total - found["MemAvailable"])


#: (name, Triton's help, the value of a reading; None: not known, left out)
_GPU_GAUGES: tuple[tuple[str, str, Callable[[GpuReading], float | int | None]], ...] = (
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", lambda r: r.utilization),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", lambda r: r.total_bytes),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", lambda r: r.used_bytes),
    ("nv_gpu_power_usage", "GPU power usage in watts", lambda r: r.power_watts),
)


def devices_text(
    devices: Iterable[str],
    cpu: CpuUsage | None,
    *,
    probe: Callable[[str], GpuReading | None] = gpu_reading,
    meminfo: Path = Path("/proc/meminfo"),
) -> bytes:
    """The ``nv_gpu_*`` gauges of the GPUs among ``devices`` (each once) and the
    ``nv_cpu_*`` ones (``cpu``: the usage kept between scrapes), in Prometheus' text format."""
    readings = {r.uuid: r for r in (probe(d) for d in sorted(set(devices))) if r is not None}
    gpus = sorted(readings.values(), key=lambda r: r.uuid)
    lines: list[str] = []
    for name, help_text, value in _GPU_GAUGES:
        samples = [(f'gpu_uuid="{r.uuid}"', value(r)) for r in gpus if value(r) is not None]
        _gauge(lines, name, help_text, samples)
    if cpu is not None:
        _gauge(lines, "nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]",
               [("", cpu.utilization())])  # fmt: skip
    memory = cpu_memory(meminfo)
    if memory is not None:
        _gauge(lines, "nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes",
               [("", memory[0])])  # fmt: skip
        _gauge(lines, "nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes",
               [("", memory[1])])  # fmt: skip
    return "".join(lines).encode()


def _gauge(
    lines: list[str], name: str, help_text: str, samples: list[tuple[str, float | int | None]]
) -> None:
    """The gauge's family, of its known samples (none known: left out)."""
    known = [(labels, value) for labels, value in samples if value is not None]
    if known:
        lines.append(family(name, help_text, "gauge", known))
