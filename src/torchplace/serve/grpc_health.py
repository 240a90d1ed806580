"""gRPC's standard health checking protocol, ``grpc.health.v1.Health``, on the gRPC port.

What Kubernetes' ``grpc`` probes, ``grpc_health_probe`` and service meshes ask. The service
name is ``""`` or ``inference.GRPCInferenceService`` for the server (``SERVING`` when it is
ready, as ``ServerReady`` says), or a model's name for that model (``SERVING`` when it is
loaded and ready). ``Check`` answers an unknown name with ``NOT_FOUND``; ``Watch`` sends the
status at once and again whenever it changes (``SERVICE_UNKNOWN`` for an unknown name), and
ends once the server drains, so that a watcher does not hold the drain up. No bearer token is
asked for, as for the other health probes. The messages come from gRPC's own ``health.proto``
(:mod:`torchplace.serve.proto`).

The watches do not poll each on a timer of its own: they wait on one :class:`HealthNotifier`,
which the server tells when a status may have changed (a model published or unpublished,
the server started or draining), and then read their status again: one wake-up per change,
however many watch. What nobody tells (an engine whose replicas fail or come back) the
notifier looks at itself, with one timer for all the watches, every
:data:`PROBE_INTERVAL_S` while any is open, and wakes them only when it changed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable, Iterator
from typing import Any

import grpc

from torchplace.errors import ConfigError, InputError
from torchplace.serve.grpc_codec import parse_message, status_details
from torchplace.serve.grpc_read import OpenCalls, unary_stream_handler, unary_unary_handler
from torchplace.serve.proto import health_pb2 as health

__all__ = ["HEALTH", "NOT_SERVING", "SERVING", "HealthNotifier", "health_handler", "watch_statuses"]

HEALTH = "grpc.health.v1.Health"
SERVING: int = health.HealthCheckResponse.SERVING
NOT_SERVING: int = health.HealthCheckResponse.NOT_SERVING

#: how often, while a Watch is open, what no one signals (``probe``) is looked at again
PROBE_INTERVAL_S = 1.0


class HealthNotifier:
    """Wakes every open Watch when a status may have changed (see the module docstring).

    ``notify()`` after any change the server knows of; ``probe()`` (optional) returns a value
    that differs once a status changed unannounced: it is read every ``interval_s`` seconds
    (:data:`PROBE_INTERVAL_S` by default), on one timer armed only while a Watch is open.
    Without a probe every such tick wakes the watches (a plain poll). Use on the event loop.
    """

    def __init__(
        self,
        *,
        probe: Callable[[], Hashable] | None = None,
        interval_s: float | None = None,
    ) -> None:
        interval = PROBE_INTERVAL_S if interval_s is None else interval_s
        if not interval > 0:
            raise ConfigError(
                f"health notifier interval_s={interval!r}; give a number of seconds above 0"
            )
        self.interval_s = float(interval)
        self._probe = probe
        self._seen: Hashable = None
        self._event: asyncio.Event | None = None
        self._timer: asyncio.TimerHandle | None = None
        #: Watch streams open now
        self.watchers = 0
        #: timer ticks (each reads the probe once, for all the watches)
        self.ticks = 0

    def notify(self) -> None:
        """A status may have changed: wake every watch once."""
        if self._probe is not None and self.watchers:
            self._seen = self._probe()  # this change is told: the next tick need not tell it
        if self._event is not None:
            self._event.set()
            self._event = None

    def next_change(self) -> asyncio.Event:
        """The event the next :meth:`notify` sets (take it before reading a status: a change
        in between is not missed)."""
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Count one open watch; the timer runs while any is open."""
        self.watchers += 1
        if self._timer is None:
            self._seen = self._probe() if self._probe is not None else None
            self._arm()
        try:
            yield
        finally:
            self.watchers -= 1
            if not self.watchers and self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.interval_s, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self.ticks += 1
        try:
            if self._probe is None or self._probe() != self._seen:
                self.notify()
        finally:
            if self.watchers:
                self._arm()


async def watch_statuses(
    service: str,
    status: Callable[[str], int | None],
    draining: Callable[[], bool],
    notifier: HealthNotifier,
) -> AsyncGenerator[int, None]:
    """The status of ``service`` now, then each change (woken by ``notifier``); ends once
    ``draining()``, after sending the status it drains with."""
    with notifier.watching():
        last = None
        while True:
            change = notifier.next_change()
            found = status(service)
            now = health.HealthCheckResponse.SERVICE_UNKNOWN if found is None else found
            if now != last:
                yield now
                last = now
            if draining():
                return
            await change.wait()


def health_handler(
    status: Callable[[str], int | None],
    draining: Callable[[], bool],
    changes: HealthNotifier,
    request_timeout_s: float = 30.0,
    calls: OpenCalls | None = None,
) -> grpc.GenericRpcHandler:
    """``Check`` and ``Watch`` over ``status(service)`` (SERVING, NOT_SERVING, or None for a
    name it does not know); ``draining()`` ends the watches, which wait on ``changes`` for a
    change; a request message that has not arrived within ``request_timeout_s`` ends the call
    (:mod:`torchplace.serve.grpc_read`); the calls are counted in ``calls``."""

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
        # closed with the call, not when collected: the notifier counts the open watches
        async with contextlib.aclosing(watch_statuses(service, status, draining, changes)) as it:
            async for now in it:
                yield health.HealthCheckResponse(status=now).SerializeToString()

    methods: dict[str, grpc.RpcMethodHandler] = {
        "Check": unary_unary_handler(check, request_timeout_s, calls),
        "Watch": unary_stream_handler(watch, request_timeout_s, calls),
    }
    return grpc.method_handlers_generic_handler(HEALTH, methods)


async def _service(data: bytes, context: Any) -> str:
    """The service name a request asks about (INVALID_ARGUMENT when it does not parse)."""
    try:
        name: str = parse_message(health.HealthCheckRequest, data).service
    except InputError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, status_details(str(exc)))
    return name
