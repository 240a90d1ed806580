"""The devices a plan places onto: an assumed set from a small table, or the real inventory.

``--assume 2xH200``, ``4xA100-80GB`` or ``2x80GiB --link pcie5`` picks from :data:`ASSUMED`
and :data:`LINKS`. Their figures are typical *measured* ones (memory as the driver reports it,
bandwidth from copy tests, matmul rate from dense fp16 GEMMs), not datasheet peaks, and every
report prints them as assumed. ``torchplace bench transfer`` measures the real figures of a
machine. ``--devices all|cuda:0,cuda:1`` takes the real inventory instead
(:func:`torchplace.devices.device_inventory`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from torchplace.errors import ConfigError

if TYPE_CHECKING:
    from torchplace.devices import DeviceProbe

__all__ = [
    "ASSUMED",
    "LINKS",
    "DeviceSpec",
    "GpuModel",
    "Link",
    "assume_devices",
    "human",
    "inventory_devices",
    "parse_size",
]

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class GpuModel:
    """Typical measured figures of one accelerator model."""

    name: str
    memory: int  # bytes, as the driver reports them (below the marketing size)
    mem_gbps: float  # device-memory bandwidth a copy kernel reaches, GB/s
    tflops: float  # dense fp16/bf16 GEMM rate cuBLAS reaches, TFLOP/s
    link: str  # the usual link between two of them
    host_link: str  # the link to the host


@dataclass(frozen=True)
class Link:
    """A device-to-device or host-to-device link and its measured one-way bandwidth."""

    name: str
    gbps: float
    note: str


#: Typical measured figures (driver-reported memory; copy and GEMM rates as benchmarks reach
#: them, about 80% of the datasheet). Assumed, and printed as such.
ASSUMED: dict[str, GpuModel] = {
    m.name.lower(): m
    for m in (
        GpuModel("H200", 143771 * MiB, 4000.0, 700.0, "nvlink4", "pcie5"),
        GpuModel("H100-80GB", 81559 * MiB, 2900.0, 650.0, "nvlink4", "pcie5"),
        GpuModel("A100-80GB", 81920 * MiB, 1650.0, 250.0, "nvlink3", "pcie4"),
        GpuModel("A100-40GB", 40960 * MiB, 1250.0, 250.0, "nvlink3", "pcie4"),
        GpuModel("L4", 23034 * MiB, 240.0, 90.0, "pcie4", "pcie4"),
        GpuModel("RTX4090", 24564 * MiB, 900.0, 150.0, "pcie4", "pcie4"),
    )
}

#: One-way bandwidth reached by peer-to-peer / pinned host copies.
LINKS: dict[str, Link] = {
    link.name: link
    for link in (
        Link("nvlink4", 370.0, "NVLink 4 (H100/H200), p2p copy"),
        Link("nvlink3", 240.0, "NVLink 3 (A100), p2p copy"),
        Link("pcie5", 52.0, "PCIe 5.0 x16, pinned copy"),
        Link("pcie4", 25.0, "PCIe 4.0 x16, pinned copy"),
        Link("pcie3", 12.0, "PCIe 3.0 x16, pinned copy"),
        Link("host", 0.0, "same memory: no copy"),
    )
}
#: The most devices one plan takes (the planner's work grows with every device).
MAX_DEVICES = 1024
#: When only a memory size is assumed (``2x80GiB``): the rates of a mid-range part.
_GENERIC = GpuModel("generic", 0, 1500.0, 200.0, "pcie4", "pcie4")
_ASSUME_RE = re.compile(r"^(?P<count>\d+)x(?P<what>.+)$", re.IGNORECASE)
_SIZE_RE = re.compile(r"^(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]i?B|B)?$", re.IGNORECASE)


@dataclass(frozen=True)
class DeviceSpec:
    """One device of a plan: name, model, memory, rates and the link to its neighbours."""

    device: str  # "cuda:0", ...
    model: str
    memory: int
    mem_gbps: float
    tflops: float
    link: Link
    host_link: Link
    assumed: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "model": self.model,
            "memory": self.memory,
            "mem_gbps": self.mem_gbps,
            "tflops": self.tflops,
            "link": self.link.name,
            "link_gbps": self.link.gbps,
            "host_link": self.host_link.name,
            "host_link_gbps": self.host_link.gbps,
            "assumed": self.assumed,
        }


def human(n: float) -> str:
    """Bytes for a reader: ``512 B``, ``4.00 KiB``, ``1.50 MiB``, ``13.48 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:,.0f} B" if unit == "B" else f"{value:,.2f} {unit}"
        value /= 1024
    raise AssertionError  # pragma: no cover


def parse_size(text: str) -> int:
    """``80GiB``, ``512MiB``, ``1.5GB``, ``1024`` -> bytes; a clear error otherwise."""
    match = _SIZE_RE.match(text.strip())
    if match is None:
        raise ConfigError(f"cannot read the size {text!r}; write e.g. 80GiB, 512MiB or 1.5GB")
    unit = (match["unit"] or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}.get(unit)
    if scale is None:
        scale = 1 << (10 * ("KMGT".index(unit[0]) + 1))
    return int(float(match["num"]) * scale)


def _link(name: str | None, default: str) -> Link:
    key = (name or default).lower()
    if key not in LINKS:
        known = ", ".join(LINKS)
        raise ConfigError(f"unknown link {name!r}; choose one of: {known}")
    return LINKS[key]


def assume_devices(spec: str, *, link: str | None = None) -> list[DeviceSpec]:
    """``2xH200`` / ``4xA100-80GB`` / ``2x80GiB`` -> that many assumed devices ``cuda:0..``."""
    match = _ASSUME_RE.match(spec.strip())
    if match is None or int(match["count"]) < 1:
        raise ConfigError(
            f"cannot read --assume {spec!r}; write COUNTxMODEL or COUNTxSIZE, "
            f"e.g. 2xH200, 4xA100-80GB, 2x80GiB"
        )
    count, what = int(match["count"]), match["what"]
    if count > MAX_DEVICES:
        raise ConfigError(
            f"--assume {spec!r}: {count} devices is more than the {MAX_DEVICES} a plan takes; "
            "plan one node or pipeline group, e.g. 8xH200"
        )
    model = ASSUMED.get(what.lower())
    if model is None:
        try:
            model = replace(_GENERIC, name=what, memory=parse_size(what))
        except ConfigError:
            known = ", ".join(m.name for m in ASSUMED.values())
            raise ConfigError(
                f"unknown device model {what!r} in --assume {spec!r}; choose one of: {known}, "
                "or give a size such as 80GiB"
            ) from None
        if model.memory < 1:
            raise ConfigError(
                f"--assume {spec!r}: a device of {what} holds nothing; give its memory, "
                "e.g. 2x80GiB"
            )
    chosen = _link(link, model.link)
    # a size alone names no part: its host link is the PCIe generation asked for, if one was
    host = chosen if what.lower() not in ASSUMED and chosen.name.startswith("pcie") else None
    return [
        DeviceSpec(
            f"cuda:{i}",
            model.name,
            model.memory,
            model.mem_gbps,
            model.tflops,
            chosen,
            host or _link(None, model.host_link),
            True,
        )
        for i in range(count)
    ]


#: the refusal of ``--devices cpu``: the CPU is no device a plan places a model on
_CPU_REFUSED = (
    "--devices names {name!r}, the CPU, but --devices takes this machine's accelerators only "
    "('all', or a list such as cuda:0,cuda:1), the devices a plan places the model on. On a "
    "machine without one, leave --devices out and plan for assumed devices (--assume 2xH200, "
    "the default, or a size such as --assume 1x24GiB); --verify then runs the plan on the CPU, "
    "as logical devices"
)


def inventory_devices(
    which: str, *, link: str | None = None, probe: DeviceProbe | None = None
) -> list[DeviceSpec]:
    """The real devices: ``all`` or a comma list (``cuda:0,cuda:1``); rates from the table."""
    from torchplace.devices import device_inventory

    found = {info.device: info for info in device_inventory(probe=probe)}
    every = which.strip().lower() == "all"
    given = [w.strip() for w in which.split(",")]
    if not every and not all(given):
        raise ConfigError(
            f"--devices {which!r} has an empty entry; give 'all' or a comma-separated list "
            "without empty entries, like cuda:0,cuda:1"
        )
    # a bare index means cuda:N, as --device N does for the other commands
    names = list(found) if every else [f"cuda:{w}" if w.isdigit() else w for w in given]
    if not names:
        raise ConfigError(
            "--devices found no accelerator on this machine; plan for assumed devices instead, "
            "e.g. --assume 2xH200"
        )
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(
            f"--devices {which!r} names {', '.join(twice)} more than once; a plan puts work on "
            "distinct devices: name each once (to plan for several devices of one kind, use "
            "--assume, e.g. --assume 2xH200)"
        )
    out = []
    for name in names:
        info = found.get(name)
        if info is None and name.partition(":")[0].lower() == "cpu":
            raise ConfigError(_CPU_REFUSED.format(name=name))
        if info is None:
            raise ConfigError(
                f"--devices names {name!r}, which is not visible here (visible: "
                f"{', '.join(found) or 'none'}); use --assume to plan for other hardware"
            )
        model = next((m for m in ASSUMED.values() if m.name.lower() in info.name.lower()), _GENERIC)
        memory = info.total_memory or model.memory
        out.append(
            DeviceSpec(
                info.device,
                info.name,
                memory,
                model.mem_gbps,
                model.tflops,
                _link(link, model.link),
                _link(None, model.host_link),
                False,
            )
        )
    return out
