"""pytest plugin of torchplace: lock a hot path's device crossings in a test suite.

Registered through the ``pytest11`` entry point, so it is active wherever torchplace is
installed. It imports neither torch nor the guard until a test asks for it.

* ``@pytest.mark.max_transfers(h2d=1, d2h=1, d2d=None, total=None, h2d_bytes=None,
  d2h_bytes=None)`` fails the test when its call phase copies more than that across devices.
* ``@pytest.mark.max_syncs(0)`` fails it on more host synchronizations than that. Every sync
  the guard records counts, blocking copies between the host and a device in either direction
  included (``x.to(device)`` is one H2D transfer and one sync); a ``non_blocking=True`` copy to
  a device is not a sync.
* The ``torchplace_guard`` fixture is the :class:`~torchplace.sanitizer.report.GuardReport` of the
  test's call phase, to assert on directly.

Both markers and the fixture guard the test's own thread during the call phase only (not
fixtures' set-up or tear-down); a failure message carries the report table.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from torchplace.sanitizer.recorder import Guard
    from torchplace.sanitizer.report import GuardReport

__all__ = [
    "pytest_configure",
    "pytest_runtest_call",
    "torchplace_guard",
]

_GUARD_ATTR = "_torchplace_guard"
_TRANSFER_LIMITS = ("h2d", "d2h", "d2d", "total", "h2d_bytes", "d2h_bytes", "d2d_bytes")


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers (so ``--strict-markers`` suites accept them)."""
    config.addinivalue_line(
        "markers",
        "max_transfers(h2d=None, d2h=None, d2d=None, total=None, h2d_bytes=None, "
        "d2h_bytes=None, d2d_bytes=None): fail when the test copies more across devices "
        "(torchplace guard)",
    )
    config.addinivalue_line(
        "markers",
        "max_syncs(n=0): fail when the test synchronizes the host with a device more than n "
        "times, blocking host<->device copies included (torchplace guard)",
    )


def _guard_for(item: pytest.Item) -> Guard:
    guard: Guard | None = getattr(item, _GUARD_ATTR, None)
    if guard is None:
        from torchplace.sanitizer.recorder import Guard

        guard = Guard("record")
        setattr(item, _GUARD_ATTR, guard)
    return guard


@pytest.fixture
def torchplace_guard(request: pytest.FixtureRequest) -> GuardReport:
    """The report of this test's call phase (filled while the test body runs)."""
    return _guard_for(request.node).report


def _limits(item: pytest.Item) -> tuple[dict[str, int], int | None]:
    transfers: dict[str, int] = {}
    marker = item.get_closest_marker("max_transfers")
    if marker is not None:
        if marker.args:
            raise pytest.UsageError(
                f"{item.nodeid}: max_transfers takes keywords only, e.g. "
                "max_transfers(h2d=1, d2h=1)"
            )
        for key, value in marker.kwargs.items():
            if key not in _TRANSFER_LIMITS:
                raise pytest.UsageError(
                    f"{item.nodeid}: unknown max_transfers limit {key!r}; use "
                    f"{', '.join(_TRANSFER_LIMITS)}"
                )
            if value is not None:
                transfers[key] = _non_negative(item, f"max_transfers({key}=...)", value)
    syncs: int | None = None
    marker = item.get_closest_marker("max_syncs")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("n", 0)
        syncs = _non_negative(item, "max_syncs(...)", value)
    return transfers, syncs


def _non_negative(item: pytest.Item, what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise pytest.UsageError(f"{item.nodeid}: {what} must be an int >= 0, got {value!r}")
    return value


def _violations(report: GuardReport, transfers: dict[str, int], syncs: int | None) -> list[str]:
    measured = {
        "h2d": report.h2d,
        "d2h": report.d2h,
        "d2d": report.d2d,
        "total": report.count("transfer"),
        "h2d_bytes": report.h2d_bytes,
        "d2h_bytes": report.d2h_bytes,
        "d2d_bytes": report.d2d_bytes,
    }
    problems = [
        f"{key}: {measured[key]} > max {limit}"
        for key, limit in transfers.items()
        if measured[key] > limit
    ]
    if syncs is not None and report.count("sync") > syncs:
        problems.append(f"syncs: {report.count('sync')} > max {syncs}")
    return problems


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """Run the test body under a guard when it has a marker or asks for the fixture."""
    transfers, syncs = _limits(item)
    wanted = transfers or syncs is not None or hasattr(item, _GUARD_ATTR)
    if not wanted:
        return (yield)
    guard = _guard_for(item)
    with guard:
        result = yield
    problems = _violations(guard.report, transfers, syncs)
    if problems:
        pytest.fail(
            "torchplace guard: device crossing limits exceeded: "
            + "; ".join(problems)
            + "\n"
            + guard.report.format(),
            pytrace=False,
        )
    return result
