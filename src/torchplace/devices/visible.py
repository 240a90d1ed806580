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
    return None if value is None else _read(value).ids


@dataclass(frozen=True)
class _Reading:
    ids: list[str]
    stopped_at: str | None = None  # the entry reading stopped at ("" for an empty one)
    ignored: tuple[str, ...] = ()  # the entries never read, blanks left out
    repeated: str | None = None  # the id named twice, which hides every GPU


def _read(value: str) -> _Reading:
    out: list[str] = []
    entries = value.split(",")
    for at, raw in enumerate(entries):
        entry = raw.strip()
        if entry.startswith(("GPU-", "MIG-")):
            token = entry
        else:
            digits = re.match(r"^\+?([0-9]+)", entry)  # ASCII digits only, as strtoul reads
            if digits is None:
                rest = tuple(e.strip() for e in entries[at:] if e.strip())
                return _Reading(out, entry, rest)
            token = digits.group(1).lstrip("0") or "0"  # no int(): it refuses 5000 digits
        if token in out:
            return _Reading([], repeated=token)
        out.append(token)
    return _Reading(out)


@dataclass(frozen=True)
class VisibleDevices:
    """The visibility variable in force: its name, raw value and parsed physical ids.

    ``stopped_at`` is the entry where the runtime stopped reading the list (``""`` for an empty
    entry, None when it read to the end) and ``ignored`` the entries it never read, so that
    ``"0,5,1"`` can be told apart from ``"0"``.
    """

    variable: str
    value: str | None
    physical_ids: tuple[str, ...] | None
    stopped_at: str | None = None
    ignored: tuple[str, ...] = ()

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

    def why_hidden(self) -> str | None:
        """Why the value hides every GPU, in words; None when it does not."""
        if not self.hides_all or self.value is None:
            return None
        repeated = _read(self.value).repeated
        first = self.value.split(",", 1)[0].strip()
        if not first:
            return "it is empty" if not self.value.strip() else "its first entry is empty"
        if repeated is not None:
            return f"it names GPU {repeated} twice, and a repeated entry hides every GPU"
        if re.fullmatch(r"-[0-9]+", first):
            return f"{first} hides every GPU (a negative entry ends the list)"
        if first == "NoDevFiles":
            return "'NoDevFiles' is set by a job scheduler (Slurm) that gave this job no GPU"
        if first.lower() in ("all", "none", "void"):
            return (
                f"{first!r} is NVIDIA_VISIBLE_DEVICES syntax, read by the container runtime; "
                f"{self.variable} takes GPU indices or UUIDs"
            )
        return f"its first entry {first!r} is not a GPU index or UUID"


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
    if value is None:
        return VisibleDevices(name, None, None)
    reading = _read(value)
    return VisibleDevices(name, value, tuple(reading.ids), reading.stopped_at, reading.ignored)
