"""The bounded request queue and the dynamic batcher; both live on the asyncio event loop.

Every request carries 1..N rows. A batch is formed when a replica is free and either the queued
rows reach ``max_batch_size`` or the oldest request has waited ``max_delay_s`` (Triton's
"max queue delay"); under load the batch simply takes what accumulated while every replica was
busy. Requests are never split across batches, so a batch holds at most ``max_batch_size``
rows. Dispatch is deferred with ``call_soon`` so that every request that arrives in the same
event-loop iteration joins the same batch. With ``coalesce=False`` (a model with a dynamic
non-batch dimension, whose requests cannot be concatenated) every request is a batch of its own.

The batcher knows nothing about torch: a *worker* is anything with
``submit_batch(batch: list[Pending], rows: int)``, chosen by the ``pick`` callable (the engine picks
the least-loaded ready replica).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from torchplace.errors import ConfigError, OverloadedError, ServeError

__all__ = ["Batcher", "Pending", "Worker"]


class Pending:
    """One queued request: its input rows and the future its caller awaits."""

    __slots__ = ("arrived", "device", "future", "inputs", "rows")

    def __init__(
        self, inputs: Mapping[str, np.ndarray], rows: int, future: asyncio.Future[Any]
    ) -> None:
        self.inputs = inputs
        self.rows = rows
        self.future = future
        self.arrived = time.perf_counter()
        self.device = ""  # the device label of the replica that served it


class Worker(Protocol):
    """Something that runs a batch (a replica seen from the loop)."""

    def submit_batch(self, batch: list[Pending], rows: int) -> None: ...


class Batcher:
    """Bounded FIFO of :class:`Pending` requests and the policy that turns them into batches."""

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        pick: Callable[[], Worker | None],
        max_batch_size: int = 32,
        max_delay_s: float = 0.002,
        max_queue: int = 1024,
        coalesce: bool = True,
    ) -> None:
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_queue < 1:
            raise ConfigError(f"max_queue must be >= 1, got {max_queue}")
        if max_delay_s < 0:
            raise ConfigError(f"max_delay_s must be >= 0, got {max_delay_s}")
        self.loop = loop
        self.pick = pick
        self.max_batch_size = max_batch_size
        self.max_delay_s = max_delay_s
        self.max_queue = max_queue
        self.coalesce = coalesce
        self.queue: deque[Pending] = deque()
        self.queued_rows = 0
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self.queue)

    def submit(self, pending: Pending) -> None:
        """Queue a request (on the loop); raises OverloadedError when the queue is full."""
        if len(self.queue) >= self.max_queue:
            raise OverloadedError(
                f"the queue is full ({self.max_queue} requests waiting); retry shortly"
            )
        self.queue.append(pending)
        self.queued_rows += pending.rows
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self.dispatch)

    def dispatch(self) -> None:
        """Form and hand out as many batches as free workers and the policy allow."""
        self._scheduled = False
        queue = self.queue
        while queue:
            head = queue[0]
            if head.future.done():  # cancelled (timed out) while waiting
                queue.popleft()
                self.queued_rows -= head.rows
                continue
            if self.queued_rows < self.max_batch_size and self.max_delay_s > 0:
                wait = head.arrived + self.max_delay_s - time.perf_counter()
                if wait > 0:
                    if self._timer is None:
                        self._timer = self.loop.call_later(wait, self._on_timer)
                    return
            worker = self.pick()
            if worker is None:
                return  # dispatch() runs again when a worker frees up
            batch, rows = self._take()
            if batch:
                worker.submit_batch(batch, rows)

    def _on_timer(self) -> None:
        self._timer = None
        self.dispatch()

    def _take(self) -> tuple[list[Pending], int]:
        queue = self.queue
        limit = self.max_batch_size
        batch: list[Pending] = []
        rows = 0
        while queue:
            head = queue[0]
            if head.future.done():
                queue.popleft()
                self.queued_rows -= head.rows
                continue
            if rows + head.rows > limit:
                break
            queue.popleft()
            self.queued_rows -= head.rows
            batch.append(head)
            rows += head.rows
            if not self.coalesce:
                break
        return batch, rows

    def fail_all(self, make_error: Callable[[], ServeError]) -> int:
        """Fail every queued request (e.g. no replica left, or drain timed out)."""
        failed = 0
        while self.queue:
            pending = self.queue.popleft()
            if not pending.future.done():
                pending.future.set_exception(make_error())
                failed += 1
        self.queued_rows = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return failed
