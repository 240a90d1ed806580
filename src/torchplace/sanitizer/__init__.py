"""The placement guard: see every device crossing and host sync, with the line that caused it.

``with torchplace.guard(mode="record" | "warn" | "raise", allow=...) as report:`` records, on the
current thread, every cross-device copy, host synchronization, ``non_blocking`` copy that cannot
be asynchronous and mixed-device op. ``torchplace guard -- python script.py`` does the same for
a whole program; the pytest plugin (``torchplace_guard`` fixture, ``max_transfers`` /
``max_syncs`` markers) locks a hot path's crossings in a test suite.

Importing this package does not import torch; the names below load on first use.

Modules:

* ``recorder``: :class:`Guard` and :func:`guard`; applies the mode and ``allow`` to each event;
* ``function_mode``: the torch-function mode every call goes through (fast path, API syncs,
  host-data factories);
* ``dispatch_mode``: the torch-dispatch mode around every other call (copies, aten ops);
* ``syncs``: sync detection (host reads, blocking copies, data-dependent sizes, the wrapped
  ``torch.cuda.synchronize`` and friends);
* ``mixed``: mixed-device detection (operands on two devices);
* ``calls``: which torch calls are pure compute, and the names events carry;
* ``sites``: site attribution (the user's line);
* ``events``: :class:`Event`, :class:`Site`, :class:`Operand`, :class:`GuardWarning`;
* ``report``: :class:`GuardReport`, the per-line summary, the table and the JSON;
* ``cli``: ``torchplace guard -- python script.py``;
* ``interpreter``: python's own options on that command line (``-u``, ``-B``, ``-W`` applied,
  the others refused with their environment variable);
* ``pytest_plugin``: the ``torchplace_guard`` fixture and the ``max_transfers`` /
  ``max_syncs`` markers.
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
