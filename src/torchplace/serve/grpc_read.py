"""Reading a gRPC call's request message within a time limit.

grpc.aio reads a unary request message before it calls the handler, and waits for it without
end: a client that opens a call and sends its headers and part of its message, or none, held the
call (a task, the call's state in gRPC core) for as long as it kept the connection open. So every
unary-request RPC is registered here as request-streaming (the client cannot tell: the wire is
the same), and its handler reads the one message itself through ``context.read()``, within the
request timeout; past it the call ends with ``DEADLINE_EXCEEDED`` and a message that says so.
The read is the same single receive that grpc.aio would have made (the request iterator is never
touched, so nothing more runs per call than a timer).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

__all__ = ["read_request", "unary_stream_handler", "unary_unary_handler"]


async def read_request(context: Any, timeout_s: float) -> bytes:
    """The call's one request message, as bytes; ``DEADLINE_EXCEEDED`` when it has not arrived
    within ``timeout_s`` seconds, ``INVALID_ARGUMENT`` when the client sent none."""
    task = asyncio.current_task()
    assert task is not None
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(timeout_s, expire)
    try:
        data = await context.read()
    except asyncio.CancelledError:
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
    if data is grpc.aio.EOF:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            "the call ended without a request message; a unary RPC carries exactly one",
        )
    message: bytes = data
    return message


def unary_unary_handler(
    fn: Callable[[bytes, Any], Awaitable[bytes]], timeout_s: float
) -> grpc.RpcMethodHandler:
    """A unary RPC ``fn(request_bytes, context)`` whose request must arrive within
    ``timeout_s`` seconds (see the module docstring)."""

    async def rpc(requests: Any, context: Any) -> bytes:
        return await fn(await read_request(context, timeout_s), context)

    return grpc.stream_unary_rpc_method_handler(rpc)


def unary_stream_handler(
    fn: Callable[[bytes, Any], AsyncIterator[bytes]], timeout_s: float
) -> grpc.RpcMethodHandler:
    """A server-streaming RPC ``fn(request_bytes, context)`` whose request must arrive within
    ``timeout_s`` seconds."""

    async def rpc(requests: Any, context: Any) -> AsyncIterator[bytes]:
        async for answer in fn(await read_request(context, timeout_s), context):
            yield answer

    return grpc.stream_stream_rpc_method_handler(rpc)
