"""``CUDA_VISIBLE_DEVICES`` (on ROCm, ``ROCR_VISIBLE_DEVICES`` then ``HIP_VISIBLE_DEVICES``):
which physical GPUs this process sees, and in which logical order.

:func:`parse_visible_devices` reads a value the way the CUDA runtime does; :func:`visible_devices`
gives the mapping in force as a :class:`VisibleDevices`.

On a ROCm build the ROCr runtime applies ``ROCR_VISIBLE_DEVICES`` first (indices or UUIDs of
physical GPUs), and HIP then reads ``HIP_VISIBLE_DEVICES`` (or, when that is unset or empty,
``CUDA_VISIBLE_DEVICES``) as indices into the GPUs ROCr left visible: ``ROCR_VISIBLE_DEVICES=2,3``
with ``HIP_VISIBLE_DEVICES=1`` is physical GPU 3. A CUDA build does not read
``ROCR_VISIBLE_DEVICES``.

HIP reads its variable by rules of its own (:func:`parse_hip_visible_devices`): it skips a repeated
entry where CUDA hides every GPU, and takes only plain decimal indices (``1gpu`` ends the list
where CUDA reads 1). Like CUDA, it reads a set but empty variable as hiding every GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torchplace.devices.probe import DeviceProbe, checked_probe

__all__ = [
    "ROCR_VARIABLE",
    "VisibleDevices",
    "parse_hip_visible_devices",
    "parse_rocr_visible_devices",
    "parse_visible_devices",
    "rocr_visible_devices",
    "visibility_variable",
    "visible_devices",
]

ROCR_VARIABLE = "ROCR_VISIBLE_DEVICES"


def parse_visible_devices(value: str | None) -> list[str] | None:
    """Parse a ``CUDA_VISIBLE_DEVICES`` value the way the CUDA runtime reads it.

    Returns None when the variable is unset (every device visible), else the list of physical
    ids in logical order: integers (``"2,0"`` -> ``["2", "0"]``), GPU UUIDs or MIG ids (kept as
    written). Like CUDA, parsing stops at the first entry that is not valid (``"0,-1,2"`` ->
    ``["0"]``), a leading number is read like ``strtoul`` (``"1gpu"`` -> ``"1"``), and a repeated
    entry hides everything. ``""`` and ``"-1"`` give ``[]``: every GPU hidden. (A ROCm build
    reads it by HIP's rules instead: :func:`parse_hip_visible_devices`.)
    """
    return None if value is None else _read(value).ids


@dataclass(frozen=True)
class _Reading:
    ids: list[str]
    stopped_at: str | None = None  # the entry reading stopped at ("" for an empty one)
    ignored: tuple[str, ...] = ()  # the entries never read, blanks left out
    repeated: str | None = None  # the id named twice, which hides every GPU


def _rest(entries: list[str], at: int) -> tuple[str, ...]:
    return tuple(e.strip() for e in entries[at:] if e.strip())


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
                return _Reading(out, entry, _rest(entries, at))
            token = digits.group(1).lstrip("0") or "0"  # no int(): it refuses 5000 digits
        if token in out:
            return _Reading([], repeated=token)
        out.append(token)
    return _Reading(out)


def parse_hip_visible_devices(value: str | None) -> list[str] | None:
    """Parse ``HIP_VISIBLE_DEVICES`` (or ``CUDA_VISIBLE_DEVICES`` on a ROCm build) as HIP reads it.

    Returns None when unset (every GPU visible), else the ids in logical order: indices written as
    plain decimal numbers (``"1"``; HIP refuses ``"01"``, ``"+1"``, ``" 1"`` and ``"1gpu"``), and
    entries holding ``GPU-``, a GPU's UUID or a part of one (ROCm 6.2 and later), kept as written.
    Unlike CUDA, a repeated entry is skipped (``"1,1,0"`` -> ``["1", "0"]``). Reading stops at
    the first entry that is neither (``"0,-1,2"`` -> ``["0"]``), and ``""`` gives ``[]``: HIP
    reads an empty value as ``" "``, which hides every GPU.
    """
    return None if value is None else _read_hip(value).ids


def _read_hip(value: str) -> _Reading:
    """As HIP (clr ``rocdevice.cpp``) reads it: entries are not trimmed, an index must equal
    ``to_string(atoi(entry))``, a repeat is skipped, and an empty entry after a last comma is not
    read (HIP stops when no text is left)."""
    out: list[str] = []
    entries = (value or " ").split(",")  # clr's flags map an empty variable to " "
    for at, entry in enumerate(entries):
        if at and at == len(entries) - 1 and not entry:
            break
        if "GPU-" not in entry and not re.fullmatch(r"0|[1-9][0-9]*", entry):
            return _Reading(out, entry, _rest(entries, at))
        if entry not in out:
            out.append(entry)
    return _Reading(out)


def parse_rocr_visible_devices(value: str | None) -> list[str] | None:
    """Parse a ``ROCR_VISIBLE_DEVICES`` value the way the ROCr runtime reads it.

    Returns None when unset (every GPU visible), else the physical ids in logical order: indices
    as ``strtol`` reads the whole entry in base 0 (``"0x2"`` -> ``"2"``, ``"010"`` -> ``"8"``,
    ``"1gpu"`` is no index) and UUID prefixes in upper case (``"gpu-3b2c"`` -> ``"GPU-3B2C"``).
    Reading stops at the first entry that is neither, or that repeats one (``"0,0,1"`` ->
    ``["0"]``); ``""`` gives ``[]``: no GPU at all.
    """
    return None if value is None else _read_rocr(value).ids


def _rocr_token(entry: str) -> str | None:
    """One ``ROCR_VISIBLE_DEVICES`` entry (upper case, trimmed) as ROCr reads it, or None.

    A UUID (``GPU-`` and up to 16 hex digits: a prefix of one GPU's UUID), or an index that is
    the whole entry as ``strtol`` reads it in base 0 (``0x2`` is 2, ``010`` is 8).
    """
    if re.fullmatch(r"GPU-[0-9A-F]{1,16}", entry):
        return entry
    number = re.fullmatch(r"([+-]?)(?:0X([0-9A-F]+)|(0[0-7]*)|([1-9][0-9]*))", entry)
    if number is None:
        return None
    sign, hexa, octal, decimal = number.groups()
    if decimal is not None:  # no int(): it refuses 5000 digits
        return None if sign == "-" else decimal
    index = int(hexa, 16) if hexa is not None else int(octal, 8)
    return None if sign == "-" and index else str(index)


def _read_rocr(value: str) -> _Reading:
    """``ROCR_VISIBLE_DEVICES`` as ROCr reads it: the first entry that is not an index or UUID,
    or that names a GPU already listed, ends the list; ``""`` shows no GPU at all."""
    out: list[str] = []
    entries = value.split(",")
    for at, raw in enumerate(entries):
        token = _rocr_token(raw.strip().upper())
        if token is None or token in out:
            return _Reading(out, raw.strip(), _rest(entries, at))
        out.append(token)
    return _Reading(out)


@dataclass(frozen=True)
class VisibleDevices:
    """The visibility variable in force: its name, raw value and parsed physical ids.

    ``stopped_at`` is the entry where the runtime stopped reading the list (``""`` for an empty
    entry, None when it read to the end) and ``ignored`` the entries it never read, so that
    ``"0,5,1"`` can be told apart from ``"0"``.

    On ROCm, ``rocr`` is the ``ROCR_VISIBLE_DEVICES`` reading applied before ``variable``
    (``HIP_VISIBLE_DEVICES`` or ``CUDA_VISIBLE_DEVICES``), whose indices count the GPUs it left
    visible; ``physical_ids`` are then the physical GPUs both give. When ``ROCR_VISIBLE_DEVICES``
    is the only one set, or hides every GPU, ``variable`` is ``ROCR_VISIBLE_DEVICES`` itself.
    ``hip`` is True when ``variable`` was read by HIP's rules (a ROCm build), not CUDA's.
    """

    variable: str
    value: str | None
    physical_ids: tuple[str, ...] | None
    stopped_at: str | None = None
    ignored: tuple[str, ...] = ()
    rocr: VisibleDevices | None = None
    hip: bool = False

    @property
    def hides_all(self) -> bool:
        return self.physical_ids is not None and not self.physical_ids

    @property
    def applied(self) -> tuple[str, ...]:
        """The variables applied, in the order the runtime applies them (none when unset)."""
        own = () if self.value is None else (self.variable,)
        return (self.rocr.variable, *own) if self.rocr is not None else own

    def physical_id(self, logical: int) -> str:
        """Physical id of logical device ``logical`` (the entry itself, or the index if unset)."""
        if self.physical_ids is None or logical >= len(self.physical_ids):
            return str(logical)
        return self.physical_ids[logical]

    def describe(self) -> str:
        """``CUDA_VISIBLE_DEVICES='1,0'``, ``CUDA_VISIBLE_DEVICES unset``, or on ROCm
        ``ROCR_VISIBLE_DEVICES='2,3', then HIP_VISIBLE_DEVICES='1'``."""
        own = (
            f"{self.variable}={self.value!r}"
            if self.value is not None
            else f"{self.variable} unset"
        )
        return own if self.rocr is None else f"{self.rocr.describe()}, then {own}"

    def why_hidden(self) -> str | None:
        """Why the value hides every GPU, in words; None when it does not."""
        if not self.hides_all or self.value is None:
            return None
        beyond = self._beyond_rocr()
        if beyond is not None:
            return beyond
        first = self.value.split(",", 1)[0]
        if not first.strip():
            return "it is empty" if not self.value.strip() else "its first entry is empty"
        first = first if self.hip else first.strip()  # HIP does not trim: ' 1' is not an index
        cuda = not self.hip and self.variable != ROCR_VARIABLE
        repeated = _read(self.value).repeated if cuda else None
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
        return f"its first entry {first!r} is not a GPU index or UUID{self._hip_form()}"

    def _hip_form(self) -> str:
        """What HIP takes as an entry, for a message about one it refused; "" under CUDA."""
        if not self.hip:
            return ""
        return " as HIP reads them (a plain decimal index such as '1', or a GPU- UUID)"

    def _beyond_rocr(self) -> str | None:
        """Why ``stopped_at`` ended the list when it is an index past what ROCr left visible."""
        if self.rocr is None or not re.fullmatch(r"[0-9]+", self.stopped_at or ""):
            return None
        count = len(self.rocr.physical_ids or ())
        return (
            f"{self.variable} entry {self.stopped_at!r} is beyond the {count} GPU(s) "
            f"{self.rocr.describe()} leaves visible ({self.variable} counts those from 0, "
            "not the physical GPUs)"
        )

    def why_stopped(self) -> str | None:
        """Why the runtime stopped reading ``variable`` before its end, in words; None if not."""
        if self.stopped_at is None:
            return None
        after = self.ignored if self.stopped_at == "" else self.ignored[1:]
        unread = f" ({', '.join(map(repr, after))} {'is' if len(after) == 1 else 'are'} never read)"
        return self._stop_reason() + (unread if after else "")

    def _stop_reason(self) -> str:
        entry = self.stopped_at or ""
        beyond = self._beyond_rocr()
        if beyond is not None:
            return f"{beyond}, and it ends the list"
        if not entry:
            return "an empty entry ends the list"
        if re.fullmatch(r"-[0-9]+", entry):
            return f"{entry!r} ends the list"
        if self.variable == ROCR_VARIABLE and _rocr_token(entry.upper()) is not None:
            return f"{entry!r} names a GPU already listed, which ROCr reads as the end of the list"
        return f"{entry!r} is not a GPU index or UUID{self._hip_form()}, and it ends the list"

    def notes(self) -> tuple[str, ...]:
        """Each variable the runtime read only in part, with why: ``VAR='value': reason``."""
        layers = (self,) if self.rocr is None else (self.rocr, self)
        return tuple(
            f"{layer.variable}={layer.value!r}: {why}"
            for layer in layers
            if (why := layer.why_stopped()) is not None
        )


def visibility_variable(probe: DeviceProbe) -> str:
    """The HIP-level variable in force: ``HIP_VISIBLE_DEVICES`` on ROCm when set, else
    ``CUDA_...``. (On ROCm, :func:`rocr_visible_devices` is applied before it.)"""
    if probe.hip_build() is not None and probe.env("HIP_VISIBLE_DEVICES") is not None:
        return "HIP_VISIBLE_DEVICES"
    return "CUDA_VISIBLE_DEVICES"


def rocr_visible_devices(probe: DeviceProbe) -> str | None:
    """``ROCR_VISIBLE_DEVICES`` on a ROCm build; None when unset or on any other build."""
    return probe.env(ROCR_VARIABLE) if probe.hip_build() is not None else None


def visible_devices(*, probe: DeviceProbe | None = None) -> VisibleDevices:
    """The visibility mapping in force: ``CUDA_VISIBLE_DEVICES``, or on ROCm
    ``ROCR_VISIBLE_DEVICES`` then ``HIP_VISIBLE_DEVICES`` (or ``CUDA_VISIBLE_DEVICES``)."""
    probe = checked_probe(probe)
    name = visibility_variable(probe)
    value = probe.env(name)
    rocr_value = rocr_visible_devices(probe)
    hip = probe.hip_build() is not None
    own = None if value is None else (_read_hip if hip else _read)(value)
    if rocr_value is None:
        if own is None:
            return VisibleDevices(name, None, None, hip=hip)
        return VisibleDevices(name, value, tuple(own.ids), own.stopped_at, own.ignored, hip=hip)
    rocr_reading = _read_rocr(rocr_value)
    rocr = VisibleDevices(
        ROCR_VARIABLE,
        rocr_value,
        tuple(rocr_reading.ids),
        rocr_reading.stopped_at,
        rocr_reading.ignored,
    )
    if own is None or rocr.hides_all:  # with no GPU left, the HIP-level variable picks none
        return rocr
    return _compose(rocr, name, value or "", own)


def _compose(rocr: VisibleDevices, name: str, value: str, own: _Reading) -> VisibleDevices:
    """``name`` read as indices into the GPUs ``rocr`` left visible (UUIDs name GPUs as is)."""
    visible = rocr.physical_ids or ()
    out: list[str] = []
    for at, entry in enumerate(own.ids):
        if entry.isdigit():
            index = int(entry) if len(entry) < 19 else len(visible)  # no int() of 5000 digits
            if index >= len(visible):  # HIP reads nothing from an index it has no GPU for
                unread = (*own.ids[at:], *own.ignored)
                return VisibleDevices(name, value, tuple(out), entry, unread, rocr, hip=True)
            entry = visible[index]
        out.append(entry)
    return VisibleDevices(name, value, tuple(out), own.stopped_at, own.ignored, rocr, hip=True)
