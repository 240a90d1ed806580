"""Answers cached once per key, when the analyses that compute them ask each other in a cycle.

A function's flow asks what its callers hand it, a caller's flow asks what the function
returns, and so on: a question asked again while it is being answered reads as a stand-in (no
device, not per batch). An answer built on such a stand-in is provisional. It is cached while
the question it read is open, so the cycle is walked once, and dropped when that question (the
cycle's head) is answered, so a later question computes it again from the head's answer (up
to a few times per question). Else the verdicts would depend on which line the linter happened
to look at first.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

__all__ = ["answer"]

V = TypeVar("V")
_Cache = dict[Any, Any]

# The questions being answered, outermost first; for each, the lowest position among the open
# questions it read a stand-in of (its own position when none), and the provisional answers
# to drop when it is answered.
_open: list[tuple[int, Hashable]] = []
_lowest: list[int] = []
_provisional: list[list[tuple[_Cache, Hashable, object]]] = []
_position: dict[tuple[int, Hashable], int] = {}
# How often each answer was dropped: one that keeps landing inside cycles is kept after a few
# tries (its answer may then depend on the order, as any answer did before), so that a file
# with many cycles is not answered again and again.
_dropped: dict[tuple[int, Hashable], int] = {}
_RETRIES = 1
_MAX_DROPPED = 100_000


def answer(
    cache: _Cache,
    key: Hashable,
    compute: Callable[[], V],
    stand_in: Callable[[], V],
    stored: Callable[[V], object] = lambda value: value,
) -> V:
    """``compute()``, cached as ``cache[key] = stored(value)``; ``stand_in()`` when ``key`` is
    being answered already (a cycle)."""
    token = (id(cache), key)
    at = _position.get(token)
    if at is not None:
        _lowest[-1] = min(_lowest[-1], at)
        return stand_in()
    at = _position[token] = len(_open)
    _open.append(token)
    _lowest.append(at)
    _provisional.append([])
    try:
        value = compute()
    finally:
        _open.pop()
        del _position[token]
        lowest = _lowest.pop()
        drops = _provisional.pop()
    entry = cache[key] = stored(value)
    if lowest < at:  # read a stand-in of an open question: provisional until it is answered
        _lowest[-1] = min(_lowest[-1], lowest)
        if _dropped.get(token, 0) < _RETRIES:
            _provisional[lowest].append((cache, key, entry))
        _provisional[lowest].extend(drops)
    else:
        for other, other_key, other_entry in drops:
            if other.get(other_key) is other_entry:
                del other[other_key]
                dropped = (id(other), other_key)
                _dropped[dropped] = _dropped.get(dropped, 0) + 1
        if len(_dropped) > _MAX_DROPPED:
            _dropped.clear()  # counts of files long done (their caches' ids may be reused)
    return value
