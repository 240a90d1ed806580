"""``CUDA_VISIBLE_DEVICES`` (on ROCm, ``HIP_VISIBLE_DEVICES``): which physical GPUs this process
sees, and in which logical order.

:func:`parse_visible_devices` reads a value the way the CUDA runtime does; :func:`visible_devices`
gives the mapping in force as a :class:`VisibleDevices`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torchplace.devices.probe import DeviceProbe, default_probe

__all__ = ["VisibleDevices", "parse_visible_devices", "visibility_variable", "visible_devices"]


def parse_visible_devices(value: str | None) -> list[str] | None:
    """Parse a ``CUDA_VISIBLE_DEVICES`` value the way the CUDA runtime reads it.

    Returns None when the variable is unset (every device visible), else the list of physical
    ids in logical order: integers (``"2,0"`` -> ``["2", "0"]``), GPU UUIDs or MIG ids (kept as
    written). Like CUDA, parsing stops at the first entry that is not valid (``"0,-1,2"`` ->
    ``["0"]``), a leading number is read like ``strtoul`` (``"1gpu"`` -> ``"1"``), and a repeated
    entry hides everything. ``""`` and ``"-1"`` give ``[]``: every GPU hidden.
    """
    if value is None:
        return None
    out: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry.startswith(("GPU-", "MIG-")):
            token = entry
        else:
            digits = re.match(r"^\+?([0-9]+)", entry)  # ASCII digits only, as strtoul reads
            if digits is None:
                break
            token = str(int(digits.group(1)))
        if token in out:
            return []
        out.append(token)
    return out


@dataclass(frozen=True)
class VisibleDevices:
    """The visibility variable in force: its name, raw value and parsed physical ids."""

    variable: str
    value: str | None
    physical_ids: tuple[str, ...] | None

    @property
    def hides_all(self) -> bool:
        return self.physical_ids is not None and not self.physical_ids

    def physical_id(self, logical: int) -> str:
        """Physical id of logical device ``logical`` (the entry itself, or the index if unset)."""
        if self.physical_ids is None or logical >= len(self.physical_ids):
            return str(logical)
        return self.physical_ids[logical]

    def describe(self) -> str:
        """``CUDA_VISIBLE_DEVICES='1,0'``, or ``CUDA_VISIBLE_DEVICES unset``."""
        return (
            f"{self.variable}={self.value!r}"
            if self.value is not None
            else f"{self.variable} unset"
        )


def visibility_variable(probe: DeviceProbe) -> str:
    """The variable in force: ``HIP_VISIBLE_DEVICES`` on ROCm when set, else ``CUDA_...``."""
    if probe.hip_build() is not None and probe.env("HIP_VISIBLE_DEVICES") is not None:
        return "HIP_VISIBLE_DEVICES"
    return "CUDA_VISIBLE_DEVICES"


def visible_devices(*, probe: DeviceProbe | None = None) -> VisibleDevices:
    """The ``CUDA_VISIBLE_DEVICES`` (or, on ROCm, ``HIP_VISIBLE_DEVICES``) mapping in force."""
    probe = probe or default_probe()
    name = visibility_variable(probe)
    value = probe.env(name)
    parsed = parse_visible_devices(value)
    return VisibleDevices(name, value, None if parsed is None else tuple(parsed))
