"""The placement guard: see every device crossing and host sync, with the line that caused it.

``with torchplace.guard(mode="record" | "warn" | "raise", allow=...) as report:`` records, on the
current thread, every cross-device copy, host synchronization, ``non_blocking`` copy that cannot
be asynchronous and mixed-device op. ``torchplace guard -- python script.py`` does the same for
a whole program; the pytest plugin (``torchplace_guard`` fixture, ``max_transfers`` /
``max_syncs`` markers) locks a hot path's crossings in a test suite.

Importing this package does not import torch; the names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchplace.sanitizer.events import Event, GuardWarning, Operand, Site
    from torchplace.sanitizer.recorder import Guard, guard
    from torchplace.sanitizer.report import GuardReport, SiteSummary

__all__ = [
    "Event",
    "Guard",
    "GuardReport",
    "GuardWarning",
    "Operand",
    "Site",
    "SiteSummary",
    "guard",
]

_EXPORTS: dict[str, str] = {
    "Event": "torchplace.sanitizer.events",
    "GuardWarning": "torchplace.sanitizer.events",
    "Operand": "torchplace.sanitizer.events",
    "Site": "torchplace.sanitizer.events",
    "Guard": "torchplace.sanitizer.recorder",
    "guard": "torchplace.sanitizer.recorder",
    "GuardReport": "torchplace.sanitizer.report",
    "SiteSummary": "torchplace.sanitizer.report",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'torchplace.sanitizer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
