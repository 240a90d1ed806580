"""The bounded request queue and the dynamic batcher; both live on the asyncio event loop.

Every queued request carries 1..N rows (the engine splits a larger request into chunks of at
most ``max_batch_size`` rows first). A batch is formed when a replica is free and either the
queued rows reach ``max_batch_size`` or the batch's fill window has closed: ``max_delay_s``
(Triton's "max queue delay") from the later of the oldest request's arrival and the moment a
replica last became free (:meth:`Batcher.freed`). Rows that waited behind busy replicas thus
still get up to ``max_delay_s`` to be joined by more, instead of leaving as a small batch the
instant a replica frees: when a batch costs about as much at 16 rows as at 32 (a model whose
weights' memory traffic dominates), a closed loop of clients would otherwise settle into
alternating half batches at nearly half the throughput.

Queued requests are never split across batches, so a batch holds at most ``max_batch_size``
rows. There is one FIFO per priority level (``queue_limits``, highest level first, each with its
own limit); a batch takes from the highest levels first. A request whose future is already done
(its client went away, or its deadline passed) is never handed out: :meth:`Batcher.discard`
removes it at once. Dispatch is deferred with ``call_soon`` so that every request that arrives
in the same event-loop iteration joins the same batch. With ``same_shape=True`` (a model with a
dynamic non-batch dimension: only requests whose rows have the same shape can be concatenated)
a batch holds the requests of the head's :attr:`Pending.key` (their row shapes) that follow it
in the queue, and ends at the first request of another shape, as Triton's dynamic batcher does
without ragged batching; that batch can grow no more, so it leaves without waiting out its fill
window.

The batcher knows nothing about torch: a *worker* is anything with
``submit_batch(batch: list[Pending], rows: int, alone: bool)``, chosen by the ``pick`` callable
(the engine picks the least-loaded ready replica); ``alone`` says that the batch is full, that
no other request waits behind it and that no other model shares the loop (:attr:`Batcher.solo`):
the engine's sole CPU replica may then run it on the loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from torchplace.errors import ConfigError, OverloadedError, ServeError
from torchplace.serve.statistics import BatchTiming
from torchplace.serve.ticket import Ticket

__all__ = ["Batcher", "Pending", "Worker"]


class Pending:
    """One queued request: its input rows, its priority level and the future its caller awaits."""

    __slots__ = (
        "arrived",
        "caller",
        "device",
        "future",
        "inputs",
        "key",
        "level",
        "rows",
        "stamps",
        "taken",
        "timing",
    )

    def __init__(
        self,
        inputs: Mapping[str, np.ndarray],
        rows: int,
        future: Ticket[Any],
        *,
        level: int = 0,
        caller: Any = None,
        arrived: float | None = None,
        key: object = None,
        stamps: Any = None,
    ) -> None:
        self.inputs = inputs
        self.rows = rows
        self.future = future
        self.level = level  # the queue index: 0 is served first
        self.arrived = time.perf_counter() if arrived is None else arrived
        self.device = ""  # the device label of the replica that served it
        self.taken = False  # handed to a replica: it will run
        self.caller = caller  # the caller's trace context its spans join (tracing.CALLER)
        self.stamps = stamps  # its front end's times, for Triton's trace format (or None)
        #: what a request must share with the others of its batch (see ``same_shape``)
        self.key = key
        #: its batch's times once it ran
        self.timing: BatchTiming | None = None


class Worker(Protocol):
    """Something that runs a batch (a replica seen from the loop)."""

    def submit_batch(self, batch: list[Pending], rows: int, alone: bool) -> None: ...


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
        queue_limits: Sequence[int] | None = None,
        same_shape: bool = False,
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
        self.same_shape = same_shape
        self.limits = tuple(queue_limits) if queue_limits else (max_queue,)
        if any(limit < 1 for limit in self.limits):
            raise ConfigError(f"queue_limits must all be >= 1, got {list(self.limits)}")
        self.levels: list[deque[Pending]] = [deque() for _ in self.limits]
        self.queued = 0
        self.queued_rows = 0
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._freed_at = 0.0  # when a worker last became free
        #: whether the event loop serves this batcher's model alone: only then is a batch
        #: ``alone`` (see the module docstring)
        self.solo = True

    def __len__(self) -> int:
        return self.queued

    def submit(self, pending: Pending) -> None:
        """Queue a request (on the loop); raises OverloadedError when its level is full."""
        queue = self.levels[pending.level]
        limit = self.limits[pending.level]
        if len(queue) >= limit:
            where = f" at priority {pending.level + 1}" if len(self.limits) > 1 else ""
            raise OverloadedError(
                f"Exceeds maximum queue size: the queue is full ({limit} requests "
                f"waiting{where}); retry shortly"
            )
        queue.append(pending)
        self.queued += 1
        self.queued_rows += pending.rows
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self.dispatch)

    def discard(self, pending: Pending) -> bool:
        """Remove a queued request (its client went away or its deadline passed); False if
        it is no longer queued."""
        queue = self.levels[pending.level]
        try:
            queue.remove(pending)
        except ValueError:
            return False
        self.queued -= 1
        self.queued_rows -= pending.rows
        return True

    def freed(self) -> None:
        """A worker is free again: form batches, each with a fresh fill window."""
        self._freed_at = time.perf_counter()
        self.dispatch()

    def _head(self) -> Pending | None:
        """The first live request, highest level first (done ones are dropped on the way)."""
        for queue in self.levels:
            while queue:
                head = queue[0]
                if not head.future.done():
                    return head
                queue.popleft()
                self.queued -= 1
                self.queued_rows -= head.rows
        return None

    def dispatch(self) -> None:
        """Form and hand out as many batches as free workers and the policy allow."""
        self._scheduled = False
        while True:
            head = self._head()
            if head is None:
                return
            if (
                self.queued_rows < self.max_batch_size
                and self.max_delay_s > 0
                and not (self.same_shape and self._shape_cut(head))
            ):
                opened = max(head.arrived, self._freed_at)
                wait = opened + self.max_delay_s - time.perf_counter()
                if wait > 0:
                    if self._timer is None:
                        self._timer = self.loop.call_later(wait, self._on_timer)
                    return
            worker = self.pick()
            if worker is None:
                return  # dispatch() runs again when a worker frees up
            batch, rows = self._take()
            if batch:
                alone = self.solo and not self.queued and rows >= self.max_batch_size
                worker.submit_batch(batch, rows, alone)

    def _on_timer(self) -> None:
        self._timer = None
        self.dispatch()

    def _shape_cut(self, head: Pending) -> bool:
        """A live request of another :attr:`Pending.key` than ``head``'s waits behind it: the
        head's batch ends there and can grow no more."""
        for queue in self.levels:
            for pending in queue:
                if pending.key != head.key and not pending.future.done():
                    return True
        return False

    def _take(self) -> tuple[list[Pending], int]:
        """Up to ``max_batch_size`` rows, highest level first, in order within a level (with
        ``same_shape``, up to the first request of another key than the first's)."""
        limit = self.max_batch_size
        batch: list[Pending] = []
        rows = 0
        while True:
            head = self._head()
            if head is None or rows + head.rows > limit:
                break
            if batch and self.same_shape and head.key != batch[0].key:
                break
            self.levels[head.level].popleft()
            self.queued -= 1
            self.queued_rows -= head.rows
            head.taken = True
            batch.append(head)
            rows += head.rows
        return batch, rows

    def fail_all(self, make_error: Callable[[], ServeError]) -> int:
        """Fail every queued request (e.g. no replica left, or drain timed out)."""
        failed = 0
        for queue in self.levels:
            while queue:
                pending = queue.popleft()
                if not pending.future.done():
                    pending.future.set_exception(make_error())
                    failed += 1
        self.queued = 0
        self.queued_rows = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return failed
