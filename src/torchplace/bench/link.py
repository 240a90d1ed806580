"""The theoretical peak of a GPU's PCIe link, read from NVML or from Linux sysfs.

The peak per direction is ``lanes x transfer rate x encoding efficiency / 8`` bytes per second:
8b/10b encoding for PCIe 1.x and 2.x (2.5 and 5 GT/s), 128b/130b for 3.0 to 5.0 (8, 16 and
32 GT/s), and FLIT mode (242 of 256 bytes carry data) for 6.0 (64 GT/s). Protocol overhead
(packet headers, flow control) lowers what a copy can reach, so 80-90 % of this figure is a good
result.

NVML (the ``nvidia-ml-py`` package, imported as ``pynvml``) is asked first, for the fastest link
this device and system support; sysfs (``/sys/bus/pci/devices/<bus id>/current_link_speed`` and
``current_link_width``) is the fallback, read right after the copies while the link is trained
up. Both lookups are injectable, so tests run without either.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "SYSFS_PCI_DEVICES",
    "LinkInfo",
    "lane_bytes_per_second",
    "link_from_nvml",
    "link_from_sysfs",
    "read_link",
]

SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")

_GT_PER_GENERATION = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
_SPEED_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s", re.IGNORECASE)


@dataclass(frozen=True)
class LinkInfo:
    """A PCIe link: transfer rate per lane (GT/s), lane count, peak bytes/s per direction."""

    gigatransfers: float
    width: int
    peak_bytes_per_s: float
    source: str
    generation: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        gen = f"PCIe gen{self.generation}" if self.generation else "PCIe"
        return (
            f"{gen} x{self.width} ({self.gigatransfers:g} GT/s): "
            f"{self.peak_bytes_per_s / 1e9:.1f} GB/s per direction (from {self.source})"
        )


def lane_bytes_per_second(gigatransfers: float) -> float:
    """Payload bytes per second of one lane at ``gigatransfers`` GT/s, after line encoding."""
    if gigatransfers <= 5.0:
        efficiency = 8 / 10
    elif gigatransfers <= 32.0:
        efficiency = 128 / 130
    else:
        efficiency = 242 / 256
    return gigatransfers * 1e9 * efficiency / 8


def _link(gigatransfers: float, width: int, source: str) -> LinkInfo | None:
    if gigatransfers <= 0 or width <= 0:
        return None
    generation = next((g for g, gt in _GT_PER_GENERATION.items() if gt == gigatransfers), None)
    return LinkInfo(
        gigatransfers=gigatransfers,
        width=width,
        peak_bytes_per_s=lane_bytes_per_second(gigatransfers) * width,
        source=source,
        generation=generation,
    )


def _sysfs_name(bus_id: str) -> str:
    """sysfs spells the PCI domain with 4 hex digits (``0000:3b:00.0``), NVML and torchplace's
    inventory with 8 (``00000000:3B:00.0``): accept either."""
    domain, sep, rest = bus_id.lower().partition(":")
    try:
        return f"{int(domain, 16):04x}{sep}{rest}" if sep else bus_id.lower()
    except ValueError:
        return bus_id.lower()


def link_from_sysfs(bus_id: str, *, root: Path = SYSFS_PCI_DEVICES) -> LinkInfo | None:
    """Read ``current_link_speed`` ("32.0 GT/s PCIe") and ``current_link_width`` ("16")."""
    device = root / _sysfs_name(bus_id)
    try:
        speed = (device / "current_link_speed").read_text()
        width = (device / "current_link_width").read_text()
    except OSError:
        return None
    match = _SPEED_RE.match(speed)
    if match is None or not width.strip().isdigit():
        return None
    return _link(float(match.group(1)), int(width.strip()), f"sysfs {device}")


def link_from_nvml(bus_id: str, *, nvml: Any = None) -> LinkInfo | None:
    """Ask NVML for the fastest link generation and width this device and system support."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            return None
    try:
        nvml.nvmlInit()
    except Exception:
        return None
    try:
        # NVML spells the PCI domain with 8 hex digits: 00000000:3B:00.0.
        domain, rest = bus_id.split(":", 1)
        handle = nvml.nvmlDeviceGetHandleByPciBusId(f"{int(domain, 16):08x}:{rest}".upper())
        generation = int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle))
        width = int(nvml.nvmlDeviceGetMaxPcieLinkWidth(handle))
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    gigatransfers = _GT_PER_GENERATION.get(generation)
    if gigatransfers is None:
        return None
    return _link(gigatransfers, width, "NVML")


def read_link(
    bus_id: str | None, *, nvml: Any = None, root: Path = SYSFS_PCI_DEVICES
) -> tuple[LinkInfo | None, str]:
    """The link of the device at PCI ``bus_id`` (``"0000:3b:00.0"``) and a note on where it came
    from, or None and a note that says why it could not be read."""
    if not bus_id:
        return None, "the device's PCI bus id is unknown, so its link cannot be looked up"
    link = link_from_nvml(bus_id, nvml=nvml) or link_from_sysfs(bus_id, root=root)
    if link is None:
        return None, (
            f"link speed of {bus_id} not readable (no NVML: pip install 'torchplace[nvml]'; "
            "no sysfs entry), so no % of peak"
        )
    return link, str(link)
