"""gRPC's standard health checking protocol, ``grpc.health.v1.Health``, on the gRPC port.

What Kubernetes' ``grpc`` probes, ``grpc_health_probe`` and service meshes ask. The service
name is ``""`` or ``inference.GRPCInferenceService`` for the server (``SERVING`` when it is
ready, as ``ServerReady`` says), or a model's name for that model (``SERVING`` when it is
loaded and ready). ``Check`` answers an unknown name with ``NOT_FOUND``; ``Watch`` sends the
status at once and again whenever it changes (``SERVICE_UNKNOWN`` for an unknown name), and
ends once the server drains, so that a watcher does not hold the drain up. No bearer token is
asked for, as for the other health probes. The messages come from gRPC's own ``health.proto``
(:mod:`torchplace.serve.proto`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from torchplace.errors import InputError
from torchplace.serve.grpc_codec import parse_message, status_details
from torchplace.serve.grpc_read import unary_stream_handler, unary_unary_handler
from torchplace.serve.proto import health_pb2 as health

__all__ = ["HEALTH", "NOT_SERVING", "SERVING", "health_handler"]

HEALTH = "grpc.health.v1.Health"
SERVING: int = health.HealthCheckResponse.SERVING
NOT_SERVING: int = health.HealthCheckResponse.NOT_SERVING

#: how often a Watch looks at the status again
WATCH_INTERVAL_S = 0.25


def health_handler(
    status: Callable[[str], int | None],
    draining: Callable[[], bool],
    request_timeout_s: float = 30.0,
) -> grpc.GenericRpcHandler:
    """``Check`` and ``Watch`` over ``status(service)`` (SERVING, NOT_SERVING, or None for a
    name it does not know); ``draining()`` ends the watches; a request message that has not
    arrived within ``request_timeout_s`` ends the call (:mod:`torchplace.serve.grpc_read`)."""

    async def check(data: bytes, context: Any) -> bytes:
        service = await _service(data, context)
        found = status(service)
        if found is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                status_details(
                    f"unknown service {service!r}; ask for '' or "
                    "'inference.GRPCInferenceService' (the server) or a model's name"
                ),
            )
        answer: bytes = health.HealthCheckResponse(status=found).SerializeToString()
        return answer

    async def watch(data: bytes, context: Any) -> AsyncIterator[bytes]:
        service = await _service(data, context)
        last = None
        while True:
            found = status(service)
            now = health.HealthCheckResponse.SERVICE_UNKNOWN if found is None else found
            if now != last:
                yield health.HealthCheckResponse(status=now).SerializeToString()
                last = now
            if draining():
                return
            await asyncio.sleep(WATCH_INTERVAL_S)

    methods: dict[str, grpc.RpcMethodHandler] = {
        "Check": unary_unary_handler(check, request_timeout_s),
        "Watch": unary_stream_handler(watch, request_timeout_s),
    }
    return grpc.method_handlers_generic_handler(HEALTH, methods)


async def _service(data: bytes, context: Any) -> str:
    """The service name a request asks about (INVALID_ARGUMENT when it does not parse)."""
    try:
        name: str = parse_message(health.HealthCheckRequest, data).service
    except InputError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, status_details(str(exc)))
    return name
