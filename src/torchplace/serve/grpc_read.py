"""Reading a gRPC call's request message within a time limit, and a bound on the calls that
wait on their clients.

A transport reads a unary request message before it calls the handler, and waits for it without
end (grpc.aio did, and so does :mod:`torchplace.serve.grpc_wire` for a unary handler): a client
that opens a call and sends its headers and part of its message, or none, would hold the call
(a task and its state) for as long as it kept the connection open. So every unary-request RPC
is registered here as request-streaming (the client cannot tell: the wire is the same), and its
handler reads the one message itself through ``context.read()``, within the request timeout;
past it the call ends with ``DEADLINE_EXCEEDED`` and a message that says so. The read is the
same single receive the transport would have made (the request iterator is never touched, so
nothing more runs per call than a timer); then the transport is told the call reads no more
(``stop_reading``), so that what a client sends after its one message is dropped, not held for
a handler that will never read it (a health ``Watch`` stays open for as long as the client
likes).

Calls that wait on their client (a unary call whose message has not come, an open stream with
nothing to compute, a health ``Watch``, a reflection stream between requests) cost the server
tens of KB each, and one connection can open any number of them: :class:`OpenCalls` counts
them, and past :data:`MAX_OPEN_CALLS` ends the quietest with ``RESOURCE_EXHAUSTED`` (as the HTTP
server closes its quietest connections past its connection limit), or refuses the new call when
none of them is idle.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

__all__ = [
    "MAX_OPEN_CALLS",
    "Held",
    "OpenCalls",
    "read_next",
    "read_request",
    "unary_stream_handler",
    "unary_unary_handler",
]

#: gRPC calls open at once that wait on their clients, past which the quietest are ended
MAX_OPEN_CALLS = 4096


class Held:
    """One call counted by :class:`OpenCalls`: the task that runs it, when it last waited on its
    client (None while it computes or sends), and why it was ended, once it is."""

    __slots__ = ("quiet_since", "reason", "task")

    def __init__(self, task: asyncio.Task[Any], quiet_since: Callable[[], float | None]) -> None:
        self.task = task
        self.quiet_since = quiet_since
        self.reason: str | None = None

    async def abort(self, context: Any) -> NoReturn:
        """End the call with ``RESOURCE_EXHAUSTED`` and the reason it was shed (unless it was
        ending already: its status is not sent twice)."""
        if context.done():
            raise asyncio.CancelledError
        uncancel = getattr(self.task, "uncancel", None)  # Python 3.11+ (a no-op if not cancelled)
        if uncancel is not None:
            uncancel()
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self.reason or "")
        raise AssertionError("not reached: abort raises")


class OpenCalls:
    """The gRPC calls open now that may wait on their clients; past :attr:`limit`, the quietest
    eighth are ended, least recently active first (each told why, ``RESOURCE_EXHAUSTED``), and
    a new call finds none to end only when every one is busy: it is then refused."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = MAX_OPEN_CALLS if limit is None else limit
        self._held: set[Held] = set()

    def __len__(self) -> int:
        return len(self._held)

    def enter(self, quiet_since: Callable[[], float | None], refusable: bool = True) -> Held:
        """Count the current task's call; its :attr:`Held.reason` is set when it is refused
        (the caller then ends it with :meth:`Held.abort`). A call that is not ``refusable``
        (a unary call waiting for its message: quiet itself, the next call over the limit ends
        it if it still waits) is always let in, so that streams that are all busy do not stop
        unary calls."""
        task = asyncio.current_task()
        assert task is not None
        held = Held(task, quiet_since)
        self._held.add(held)
        over = len(self._held) > self.limit
        # calls ended to make room leave once their status is sent; never more than twice the
        # limit are held, however slowly they go
        crowded = (not self._shed(held) or len(self._held) > 2 * self.limit) if over else False
        if crowded and refusable:
            held.reason = (
                f"too many gRPC calls open: {len(self._held) - 1}, the most is {self.limit}, "
                "and none of them is idle; retry shortly (and close streams and calls you no "
                "longer use)"
            )
        return held

    def leave(self, held: Held) -> None:
        self._held.discard(held)

    def _shed(self, newcomer: Held) -> bool:
        """End the quietest calls (not ``newcomer``); whether room is being made."""
        live = [held for held in self._held if held.reason is None]  # not ending already
        if len(live) <= self.limit:
            return True  # the calls ended a moment ago have not left yet
        quiet = sorted(
            (since, id(held), held)
            for held in live
            if held is not newcomer and (since := held.quiet_since()) is not None
        )
        count = max(1, len(live) - self.limit, len(live) // 8)
        for _, _, held in quiet[:count]:
            held.reason = (
                f"closed to make room: the server holds at most {self.limit} gRPC calls that "
                "wait on their clients (streams with nothing to compute, calls whose request "
                "message has not come), and this one had waited longest; open a new call when "
                "there is a request to send"
            )
            held.task.cancel()
        return bool(quiet)


async def read_request(context: Any, timeout_s: float, calls: OpenCalls | None = None) -> bytes:
    """The call's one request message, as bytes; ``DEADLINE_EXCEEDED`` when it has not arrived
    within ``timeout_s`` seconds, ``INVALID_ARGUMENT`` when the client sent none,
    ``RESOURCE_EXHAUSTED`` when ``calls`` ends it to make room while it waits."""
    data = await read_next(context, timeout_s, calls)
    stop_reading = getattr(context, "stop_reading", None)  # grpc_wire's calls
    if stop_reading is not None:  # the one message is in: what more comes is dropped, not held
        stop_reading()
    if data is None:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            "the call ended without a request message; a unary RPC carries exactly one",
        )
        raise AssertionError("not reached: abort raises")
    return data


async def read_next(context: Any, timeout_s: float, calls: OpenCalls | None = None) -> bytes | None:
    """The call's next request message, as bytes, or None once the client has sent its last;
    ``DEADLINE_EXCEEDED`` when none has come within ``timeout_s`` seconds,
    ``RESOURCE_EXHAUSTED`` when ``calls`` ends the call to make room while it waits."""
    ready = getattr(context, "read_nowait", None)  # grpc_wire's calls: the message is there
    if ready is not None and (data := ready()) is not None:
        arrived: bytes = data
        return arrived
    task = asyncio.current_task()
    assert task is not None
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    loop = asyncio.get_running_loop()
    started = loop.time()
    held = calls.enter(lambda: started, refusable=False) if calls is not None else None
    timer = loop.call_later(timeout_s, expire)
    try:
        if held is not None and held.reason is not None:
            await held.abort(context)
        data = await context.read()
    except asyncio.CancelledError:
        if held is not None and held.reason is not None:
            await held.abort(context)
        if not expired:
            raise  # the client went away, or the server is stopping
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+
        if uncancel is not None:
            uncancel()
        await context.abort(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"request message not received within {timeout_s:g} s (--request-timeout); send "
            "the whole message once the call starts",
        )
        raise  # not reached: abort raises
    finally:
        timer.cancel()
        if calls is not None and held is not None:
            calls.leave(held)
    if data is grpc.aio.EOF:
        return None
    message: bytes = data
    return message


def unary_unary_handler(
    fn: Callable[[bytes, Any], Awaitable[bytes]],
    timeout_s: float,
    calls: OpenCalls | None = None,
) -> grpc.RpcMethodHandler:
    """A unary RPC ``fn(request_bytes, context)`` whose request must arrive within
    ``timeout_s`` seconds (see the module docstring), counted in ``calls`` meanwhile."""

    async def rpc(requests: Any, context: Any) -> bytes:
        return await fn(await read_request(context, timeout_s, calls), context)

    return grpc.stream_unary_rpc_method_handler(rpc)


def unary_stream_handler(
    fn: Callable[[bytes, Any], AsyncIterator[bytes]],
    timeout_s: float,
    calls: OpenCalls | None = None,
) -> grpc.RpcMethodHandler:
    """A server-streaming RPC ``fn(request_bytes, context)`` whose request must arrive within
    ``timeout_s`` seconds, counted in ``calls`` (always quiet: it waits on the server) for as
    long as it is open."""

    async def rpc(requests: Any, context: Any) -> AsyncIterator[bytes]:
        data = await read_request(context, timeout_s, calls)
        if calls is None:
            async for answer in fn(data, context):
                yield answer
            return
        started = asyncio.get_running_loop().time()
        held = calls.enter(lambda: started)
        try:
            if held.reason is not None:
                await held.abort(context)
            async for answer in fn(data, context):
                yield answer
        except asyncio.CancelledError:
            if held.reason is None:
                raise
            await held.abort(context)
        finally:
            calls.leave(held)

    return grpc.stream_stream_rpc_method_handler(rpc)
