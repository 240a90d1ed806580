"""A request's result on the event loop, settled once, its callbacks run at once.

:class:`Ticket` is the part of :class:`asyncio.Future` the request path uses (``done``,
``cancelled``, ``result``, ``exception``, ``set_result``, ``set_exception``, ``cancel``,
``add_done_callback``), without its cost: settling a future schedules each of its callbacks as
a separate event-loop callback, and a request's answer passes three of them (the engine's, the
app's, the connection's) before its bytes are written. A ticket runs its callbacks in the call
that settles it, in the order they were added, each one's exception logged and contained as
the loop would. It is awaitable (a task awaiting it that is cancelled cancels it), so that
``await engine.infer(...)`` and ``asyncio.wait_for`` take it as they take a future.

Tickets belong to the event loop's thread, as futures do; they are not thread-safe.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

__all__ = ["TIMED_OUT", "Ticket"]

logger = logging.getLogger("torchplace.serve")

T = TypeVar("T")

_PENDING, _RESULT, _ERROR, _CANCELLED = range(4)

#: the message a request is cancelled with when the server's request timeout ends it (the
#: client is still there): its queued work is then counted as a deadline drop, not a cancel
TIMED_OUT = "request timed out"


class Ticket(Generic[T]):
    """One settle-once result whose callbacks run synchronously (see the module docstring)."""

    __slots__ = ("_callbacks", "_state", "_value")

    def __init__(self) -> None:
        self._state = _PENDING
        self._value: Any = None
        self._callbacks: list[Callable[[Ticket[T]], object]] = []

    def done(self) -> bool:
        """Settled: a result, an exception or cancelled."""
        return self._state != _PENDING

    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def result(self) -> T:
        """The result; raises the exception it was settled with, or
        :class:`asyncio.CancelledError`, or :class:`asyncio.InvalidStateError` before then."""
        state = self._state
        if state == _RESULT:
            result: T = self._value
            return result
        if state == _ERROR:
            raise self._value
        if state == _CANCELLED:
            raise asyncio.CancelledError()
        raise asyncio.InvalidStateError("the ticket is not settled yet")

    def exception(self) -> BaseException | None:
        """The exception it was settled with (None after a result); raises as :meth:`result`
        when cancelled or not settled."""
        state = self._state
        if state == _RESULT:
            return None
        if state == _ERROR:
            exc: BaseException = self._value
            return exc
        if state == _CANCELLED:
            raise asyncio.CancelledError()
        raise asyncio.InvalidStateError("the ticket is not settled yet")

    def set_result(self, value: T) -> None:
        self._settle(_RESULT, value)

    def set_exception(self, exc: BaseException) -> None:
        self._settle(_ERROR, exc)

    def cancel(self, msg: object = None) -> bool:
        """Cancel it unless settled; True when this call did. ``msg`` says why, as
        :meth:`asyncio.Future.cancel`'s does (:meth:`cancel_message` gives it back)."""
        if self._state != _PENDING:
            return False
        self._settle(_CANCELLED, msg)
        return True

    def cancel_message(self) -> object:
        """What it was cancelled with (None when it was not, or without a message)."""
        return self._value if self._state == _CANCELLED else None

    def add_done_callback(self, fn: Callable[[Ticket[T]], object]) -> None:
        """Call ``fn(ticket)`` when it is settled (now, when it already is)."""
        if self._state == _PENDING:
            self._callbacks.append(fn)
        else:
            _call(fn, self)

    def _settle(self, state: int, value: Any) -> None:
        if self._state != _PENDING:
            raise asyncio.InvalidStateError(f"the ticket is already settled: {self!r}")
        self._state, self._value = state, value
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            _call(fn, self)

    def __await__(self) -> Generator[Any, None, T]:
        if self._state == _PENDING:
            waiter = asyncio.get_running_loop().create_future()
            self._callbacks.append(functools.partial(_wake, waiter))
            try:
                yield from waiter.__await__()
            except asyncio.CancelledError as exc:
                # the awaiting task was cancelled: so is the work, for the same reason
                self.cancel(exc.args[0] if exc.args else None)
                raise
        return self.result()

    def __repr__(self) -> str:
        state = ("pending", "result", "exception", "cancelled")[self._state]
        return f"<Ticket {state}>"


def _wake(waiter: asyncio.Future[None], _: Ticket[Any]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _call(fn: Callable[[Ticket[Any]], object], ticket: Ticket[Any]) -> None:
    """Run one callback; what it raises is logged, as the event loop logs a callback's error,
    and does not stop the callbacks after it."""
    try:
        fn(ticket)
    except Exception:
        logger.exception("a callback of %r failed: %r", ticket, fn)
