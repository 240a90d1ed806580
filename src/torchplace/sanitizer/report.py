"""The guard's report: every recorded event, grouped by source line and kind.

``GuardReport`` answers questions in code (``report.h2d_bytes``, ``report.syncs``, ...), renders a
table (``str(report)``, :meth:`GuardReport.render`) and JSON (:meth:`GuardReport.to_json`). It
does not import torch.
"""

from __future__ import annotations

import io
import json
import posixpath
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchplace.bench.units import format_bytes
from torchplace.errors import ConfigError
from torchplace.sanitizer.events import KINDS, SYNC_KINDS, TRANSFER_KINDS, Event, Site

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["DEFAULT_MAX_EVENTS", "MODES", "GuardReport", "SiteSummary"]


@dataclass(frozen=True)
class SiteSummary:
    """All events of one kind at one source line."""

    site: Site
    kind: str
    count: int
    nbytes: int
    ops: tuple[str, ...]
    directions: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {
            "file": self.site.filename,
            "line": self.site.lineno,
            "function": self.site.function,
            "kind": self.kind,
            "count": self.count,
            "bytes": self.nbytes,
            "ops": list(self.ops),
            "directions": list(self.directions),
        }


@dataclass
class _Group:
    count: int = 0
    nbytes: int = 0
    ops: dict[str, None] = field(default_factory=dict)
    directions: dict[str, None] = field(default_factory=dict)


#: How many events a report keeps one by one; counts and bytes go on beyond it.
DEFAULT_MAX_EVENTS = 100_000

#: The guard's modes: record only, also warn once per new (line, kind), or raise at the op.
MODES = ("record", "warn", "raise")


class GuardReport:
    """Events recorded by one :func:`torchplace.guard` block, in the order they happened.

    Counts (``h2d``, ``d2h``, ``d2d``, :meth:`count`) and byte totals (``h2d_bytes``, ...,
    :meth:`nbytes`) are integers over everything recorded. ``events``, ``transfers``, ``syncs``,
    ``pageable_non_blocking``, ``mixed_device_ops`` and :meth:`filter` return
    :class:`~torchplace.sanitizer.events.Event` objects; a report keeps the first ``max_events`` of
    them (``dropped`` says how many more were only counted), so a long program cannot exhaust
    memory.
    """

    def __init__(self, mode: str = "record", *, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        if not isinstance(max_events, int) or isinstance(max_events, bool) or max_events < 0:
            raise ConfigError(f"max_events must be an integer >= 0, got {max_events!r}")
        if not isinstance(mode, str) or mode not in MODES:
            raise ConfigError(f"report mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.max_events = max_events
        self.dropped = 0
        self._events: list[Event] = []
        self._groups: dict[tuple[Site, str], _Group] = {}
        self._counts: dict[str, int] = dict.fromkeys(KINDS, 0)
        self._bytes: dict[str, int] = dict.fromkeys(KINDS, 0)
        self._lock = threading.Lock()

    # -- recording -------------------------------------------------------------------------
    def add(self, event: Event) -> None:
        """Record one event (the guard calls this; tests and tools may too)."""
        if not isinstance(event, Event):
            raise ConfigError(f"a report records Event objects, got {event!r}")
        if event.kind not in self._counts:
            raise ConfigError(f"unknown event kind {event.kind!r}; use one of {', '.join(KINDS)}")
        with self._lock:  # a guard watching threads records from several at once
            self._add(event)

    def _add(self, event: Event) -> None:
        self._counts[event.kind] += 1
        self._bytes[event.kind] += event.nbytes
        group = self._groups.get((event.site, event.kind))
        if group is None:
            group = self._groups[(event.site, event.kind)] = _Group()
        group.count += 1
        group.nbytes += event.nbytes
        group.ops[event.op] = None
        if event.src is not None:
            group.directions[f"{event.src}->{event.dst}"] = None
        if len(self._events) < self.max_events:
            self._events.append(event)
        else:
            self.dropped += 1

    # -- questions -------------------------------------------------------------------------
    @property
    def events(self) -> list[Event]:
        """Every kept event, in order."""
        return list(self._events)

    def filter(
        self, kind: str | None = None, *, site: str | None = None, op: str | None = None
    ) -> list[Event]:
        """Kept events of one ``kind`` (or ``"transfer"``), at a ``site`` (``"file.py"``,
        ``"file.py:12"``, ``"file.py:12:function"``), and/or whose ``op`` contains the text."""
        _check_kind(kind)
        for name, value in (("site", site), ("op", op)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"filter's {name} must be a string or None, got {value!r}")
        if site is not None:  # a location that can match nothing is a typo, as for allow=
            check_site_pattern(site, "filter's site")
        out = []
        for event in self._events:
            if kind == "transfer" and event.kind not in TRANSFER_KINDS:
                continue
            if kind not in (None, "transfer") and event.kind != kind:
                continue
            if site is not None and not _site_matches(event.site, site):
                continue
            if op is not None and op not in event.op:
                continue
            out.append(event)
        return out

    def count(self, kind: str) -> int:
        """How many events of ``kind`` (or ``"transfer"``) were recorded."""
        _check_kind(kind, required=True)
        kinds = TRANSFER_KINDS if kind == "transfer" else (kind,)
        return sum(self._counts[k] for k in kinds)

    def nbytes(self, kind: str) -> int:
        """Total bytes moved by events of ``kind`` (or ``"transfer"``)."""
        _check_kind(kind, required=True)
        kinds = TRANSFER_KINDS if kind == "transfer" else (kind,)
        return sum(self._bytes[k] for k in kinds)

    @property
    def transfers(self) -> list[Event]:
        """Cross-device copies (H2D, D2H and D2D)."""
        return [e for e in self._events if e.kind in TRANSFER_KINDS]

    @property
    def syncs(self) -> list[Event]:
        """Host synchronizations."""
        return [e for e in self._events if e.kind in SYNC_KINDS]

    @property
    def pageable_non_blocking(self) -> list[Event]:
        """``non_blocking`` copies that cannot be asynchronous (pageable host memory)."""
        return self.filter("pageable_non_blocking")

    @property
    def mixed_device_ops(self) -> list[Event]:
        """Ops whose operands sit on different devices."""
        return self.filter("mixed_device")

    @property
    def h2d(self) -> int:
        """Number of host-to-device copies."""
        return self.count("h2d")

    @property
    def d2h(self) -> int:
        """Number of device-to-host copies."""
        return self.count("d2h")

    @property
    def d2d(self) -> int:
        """Number of device-to-device copies."""
        return self.count("d2d")

    @property
    def h2d_bytes(self) -> int:
        """Bytes copied host to device."""
        return self.nbytes("h2d")

    @property
    def d2h_bytes(self) -> int:
        """Bytes copied device to host."""
        return self.nbytes("d2h")

    @property
    def d2d_bytes(self) -> int:
        """Bytes copied device to device."""
        return self.nbytes("d2d")

    def __len__(self) -> int:
        """How many events were recorded (kept or only counted)."""
        return sum(self._counts.values())

    def __iter__(self) -> Iterator[Event]:
        return iter(list(self._events))

    def __bool__(self) -> bool:
        return True

    # -- grouping --------------------------------------------------------------------------
    def by_site(self) -> list[SiteSummary]:
        """One row per (line, kind), most frequent first (then most bytes, then first seen)."""
        rows = [
            SiteSummary(
                site=site,
                kind=kind,
                count=group.count,
                nbytes=group.nbytes,
                ops=tuple(group.ops),
                directions=tuple(group.directions),
            )
            for (site, kind), group in self._groups.items()
        ]
        order = {key: i for i, key in enumerate(self._groups)}
        rows.sort(key=lambda r: (-r.count, -r.nbytes, order[(r.site, r.kind)]))
        return rows

    def top(self, n: int) -> list[SiteSummary]:
        """The ``n`` busiest (line, kind) rows."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ConfigError(f"top must be an integer >= 0, got {n!r}")
        return self.by_site()[:n]

    def totals(self) -> dict[str, dict[str, int]]:
        """``{kind: {"count": ..., "bytes": ...}}`` for every kind."""
        return {kind: {"count": self.count(kind), "bytes": self.nbytes(kind)} for kind in KINDS}

    # -- output ----------------------------------------------------------------------------
    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        """A JSON-ready mapping: totals, per-line rows (``top`` busiest if given) and events."""
        rows = self.by_site() if top is None else self.top(top)
        return {
            "mode": self.mode,
            "events_recorded": len(self),
            "events_dropped": self.dropped,
            "totals": self.totals(),
            "sites": [row.to_dict() for row in rows],
            "events": [event.to_dict() for event in self._events],
        }

    def to_json(self, top: int | None = None, indent: int | None = 2) -> str:
        """:meth:`to_dict` as a JSON string."""
        return json.dumps(self.to_dict(top), indent=indent)

    def render(self, top: int | None = None) -> Table:
        """A rich table of the (line, kind) rows, busiest first."""
        from rich.table import Table

        rows = self.by_site() if top is None else self.top(top)
        summary = ", ".join(f"{kind} {self.count(kind)}" for kind in KINDS if self.count(kind))
        total = len(self)
        caption = (
            f"{total} event{'' if total == 1 else 's'} ({summary}); "
            f"H2D {format_bytes(self.h2d_bytes)}, D2H {format_bytes(self.d2h_bytes)}, "
            f"D2D {format_bytes(self.d2d_bytes)}"
            if total
            else "0 events: no device crossing or host sync was recorded"
        )
        table = Table(title="torchplace guard: device crossings and host syncs", caption=caption)
        table.add_column("file", overflow="fold")
        table.add_column("line", justify="right")
        table.add_column("function")
        table.add_column("kind")
        table.add_column("count", justify="right")
        table.add_column("bytes", justify="right")
        table.add_column("ops / direction")
        for row in rows:
            what = ", ".join(row.ops)
            if row.directions:
                what += " " + ", ".join(row.directions)
            table.add_row(
                row.site.short.rsplit(":", 1)[0],
                str(row.site.lineno),
                row.site.function,
                row.kind,
                str(row.count),
                format_bytes(row.nbytes) if row.nbytes else "",
                what,
            )
        return table

    def format(self, top: int | None = None, width: int = 120) -> str:
        """The table as plain text."""
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise ConfigError(f"width must be a number of columns >= 1, got {width!r}")
        from rich.console import Console

        # drawn into a buffer: never to sys.stdout, which the guarded program may have closed
        console = Console(
            file=io.StringIO(),
            width=width,
            record=True,
            color_system=None,
            force_terminal=False,
        )
        with console.capture() as capture:
            console.print(self.render(top))
        return capture.get()

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return (
            f"GuardReport(mode={self.mode!r}, events={len(self)}, h2d={self.h2d}, "
            f"d2h={self.d2h}, d2d={self.d2d}, syncs={self.count('sync')}, "
            f"mixed_device={self.count('mixed_device')})"
        )


def _check_kind(kind: str | None, *, required: bool = False) -> None:
    if (kind is not None or required) and kind not in KINDS and kind != "transfer":
        raise ConfigError(f"unknown event kind {kind!r}; use one of {', '.join(KINDS)}, transfer")


def _split_site(pattern: str) -> tuple[str, int | None, str | None]:
    """``(path, line, function)`` of ``file.py``, ``file.py:12`` or ``file.py:12:function``."""
    path, line, function = pattern, None, None
    parts = pattern.rsplit(":", 2)
    # ASCII digits only: str.isdigit() takes '²', which int() refuses
    if len(parts) == 3 and _DIGITS.fullmatch(parts[1]):
        path, line, function = parts[0], int(parts[1]), parts[2]
    elif len(parts) >= 2 and _DIGITS.fullmatch(parts[-1]):
        path, line = pattern.rsplit(":", 1)[0], int(parts[-1])
    return path, line, function


_DIGITS = re.compile(r"[0-9]+")


def check_site_pattern(pattern: str, what: str = "site") -> None:
    """Refuse a location that can match nothing: ``train.py:``, ``:42``, ``train.py:step``."""
    path, line, function = _split_site(pattern)
    # a colon left in the path is a typo (a drive letter, ``C:/...`` or ``C:\\...``, excepted)
    if not path or function == "" or re.search(r":(?![\\/])", path):
        raise ConfigError(
            f"{what} {pattern!r} is not a source location; write 'file.py', 'file.py:LINE' "
            "or 'file.py:LINE:FUNCTION', e.g. 'train.py:42'"
        )
    if line == 0:
        raise ConfigError(
            f"{what} {pattern!r} names line 0, which no code is on: line numbers start at 1 "
            "(as tracebacks and editors count them); write 'file.py' for the whole file or "
            "'file.py:LINE' with LINE >= 1, e.g. 'train.py:42'"
        )


def _site_matches(site: Site, pattern: str) -> bool:
    """``file.py``, ``dir/file.py``, ``file.py:12`` or ``file.py:12:function`` (path suffix)."""
    path, line, function = _split_site(pattern)
    if line is not None and site.lineno != line:
        return False
    if function is not None and site.function != function:
        return False
    name = site.filename.replace("\\", "/")
    # ``./train.py:42`` (as a shell completes it), ``src//train.py``: the file's own path
    path = posixpath.normpath(path.replace("\\", "/"))
    return name == path or name.endswith("/" + path)
