"""The replica pool: which replica takes the next batch, and what happens when one finishes.

:class:`ReplicaPool` owns the replicas of one engine and their *lanes* (a replica as the batcher
sees it: a worker with a busy flag and the rows it has served). It picks the least-loaded free
replica for each batch (a free primary first, the one that has served the fewest rows; the CPU
fallback only while no primary is healthy), records each finished batch's metrics and trace
span on the worker thread, and resolves the batch's futures on the event loop with a single
``loop.call_soon_threadsafe``. It tells the engine when the set of serving replicas changed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from torchplace.errors import (
    DeviceOutOfMemoryError,
    InputError,
    KernelError,
    ServeError,
    TransferError,
)
from torchplace.serve.batcher import Pending
from torchplace.serve.execution import BatchOutcome
from torchplace.serve.metrics import DeviceMetrics, ReplicaState
from torchplace.serve.replica import Replica
from torchplace.serve.statistics import InferStatistics, batch_timing
from torchplace.serve.tracing import BatchRecord, Tracer

__all__ = ["Lane", "ReplicaPool"]

logger = logging.getLogger("torchplace.serve")

ERROR_CLASS: dict[type[ServeError], str] = {
    DeviceOutOfMemoryError: "oom",
    TransferError: "transfer",
    KernelError: "kernel",
    InputError: "input",
}


class Lane:
    """A replica as the batcher sees it (a worker with a busy flag), on the event loop."""

    __slots__ = ("busy", "replica", "rows_served")

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.busy = False
        self.rows_served = 0

    def submit_batch(self, batch: list[Pending], rows: int, alone: bool) -> None:
        self.busy = True
        label = self.replica.label
        for pending in batch:
            pending.device = label
        self.replica.dispatch(batch, [p.inputs for p in batch], [p.rows for p in batch], alone)


class ReplicaPool:
    """The replicas of one model version, their lanes and the batch callbacks."""

    def __init__(
        self,
        replicas: Sequence[Replica],
        *,
        model: str,
        version: str,
        device_metrics: dict[str, DeviceMetrics],
        tracer: Tracer,
        metrics: bool = True,
        statistics: InferStatistics | None = None,
    ) -> None:
        self.replicas = list(replicas)
        self.statistics = statistics
        self.model = model
        self.version = version
        self.tracer = tracer
        self.metrics_enabled = metrics
        self._device_metrics = device_metrics
        self.lanes = [Lane(r) for r in self.replicas]
        self._primary = [lane for lane in self.lanes if not lane.replica.fallback]
        self._fallback = [lane for lane in self.lanes if lane.replica.fallback]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: Callable[[], None] = lambda: None
        self._freed: Callable[[], None] = lambda: None
        self._timed: Callable[[float], None] = lambda seconds: None

    def start(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        on_change: Callable[[], None],
        on_free: Callable[[], None],
        on_batch: Callable[[float], None] | None = None,
    ) -> None:
        """Start every worker; on the loop, ``on_change`` runs when a replica left or came
        back, ``on_free`` when a lane is free again, ``on_batch`` with each batch's seconds."""
        self._loop = loop
        self._changed = on_change
        self._freed = on_free
        if on_batch is not None:
            self._timed = on_batch
        for replica in self.replicas:
            replica.wanted = _still_waited_for
            replica.start_worker(self._on_batch_done, self._on_recovered)

    # ------------------------------------------------------------------ state
    @property
    def serving(self) -> bool:
        """Some replica takes traffic."""
        return any(r.in_pool for r in self.replicas)

    @property
    def busy(self) -> bool:
        """Some replica is running a batch."""
        return any(lane.busy for lane in self.lanes)

    @property
    def serving_count(self) -> int:
        """Replicas that take traffic now (the primaries, or the fallback without them)."""
        primaries = sum(1 for lane in self._primary if lane.replica.in_pool)
        return primaries or sum(1 for lane in self._fallback if lane.replica.in_pool)

    def is_ready(self) -> bool:
        """A replica is ready (weights checked on its device now)."""
        return any(r.is_ready() for r in self.replicas)

    def states(self) -> list[ReplicaState]:
        """What the scrape-time collector reads about each replica."""
        return [ReplicaState(r.name, r.label, r.is_ready()) for r in self.replicas]

    def pick(self) -> Lane | None:
        """The free primary that has served the fewest rows; the fallback only without any
        healthy primary; None when every candidate is busy."""
        best: Lane | None = None
        any_healthy = False
        for lane in self._primary:
            if lane.replica.in_pool:
                any_healthy = True
                if not lane.busy and (best is None or lane.rows_served < best.rows_served):
                    best = lane
        if best is not None or any_healthy:
            return best
        for lane in self._fallback:
            if lane.replica.in_pool and not lane.busy:
                return lane
        return None

    async def close(self) -> None:
        """Stop every worker after its current batch (off the loop)."""
        loop = asyncio.get_running_loop()
        for replica in self.replicas:
            await loop.run_in_executor(None, replica.close)
        await asyncio.sleep(0)  # answer anything a worker finished meanwhile
        for lane in self.lanes:
            lane.busy = False

    # ------------------------------------------------------------------ worker callbacks
    def _on_batch_done(self, replica: Replica, token: Any, outcome: BatchOutcome) -> None:
        """Worker thread: record metrics and spans, then hand the results to the loop. A batch
        run on the loop is answered first and recorded after (its clients' next requests are
        on their way meanwhile: the loop is the only thread at work)."""
        batch: list[Pending] = token
        if self.statistics is not None:
            # each request is counted when it settles (engine), with its batch's times; the
            # executions that answered rows are counted here, once per batch
            timing = batch_timing(outcome.started, outcome.h2d_s, outcome.compute_s, outcome.d2h_s)
            for pending in batch:
                pending.timing = timing
            if outcome.executions:
                self.statistics.executions(outcome.executions)
        loop = self._loop
        if replica.on_loop and loop is not None:
            loop.call_soon(self._finish, replica, batch, outcome)
            loop.call_soon(self._record, replica, batch, outcome)
            return
        self._record(replica, batch, outcome)
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._finish, replica, batch, outcome)

    def _record(self, replica: Replica, batch: list[Pending], outcome: BatchOutcome) -> None:
        """A batch's metrics, error counts, failure log and spans."""
        bound = self._device_metrics[replica.label]
        arrivals: list[float] | None = None
        if self.metrics_enabled or self.tracer.enabled:
            arrivals = [pending.arrived for pending in batch]
        if self.metrics_enabled:
            assert arrivals is not None
            bound.queue.observe_many([outcome.started - arrived for arrived in arrivals])
            bound.batch_size.observe(outcome.rows)
            bound.h2d.observe(outcome.h2d_s)
            bound.compute.observe(outcome.compute_s)
            bound.d2h.observe(outcome.d2h_s)
        if outcome.oom_splits:
            bound.oom_splits.inc(outcome.oom_splits)
        failed = [r for r in outcome.results if isinstance(r, ServeError)]
        for error in failed:
            cls = ERROR_CLASS.get(type(error))
            if cls is not None and cls != "input":
                bound.errors[cls].inc()
        if failed:
            self._log_failure(replica, outcome, failed[0])
        if self.tracer.enabled:
            assert arrivals is not None
            self._trace(replica, batch, outcome, arrivals, bool(failed))

    def _trace(
        self,
        replica: Replica,
        batch: list[Pending],
        outcome: BatchOutcome,
        arrivals: list[float],
        failed: bool,
    ) -> None:
        statuses = (
            [r.status if isinstance(r, ServeError) else 200 for r in outcome.results]
            if failed
            else None
        )
        parents = [pending.caller for pending in batch]
        stamps = [pending.stamps for pending in batch]
        self.tracer.batch(
            BatchRecord(
                replica=replica.name,
                device=replica.label,
                arrivals=arrivals,
                rows=[pending.rows for pending in batch],
                statuses=statuses,
                started=outcome.started,
                finished=outcome.finished,
                h2d=outcome.h2d_s,
                compute=outcome.compute_s,
                d2h=outcome.d2h_s,
                sync=outcome.sync_s,
                parents=parents if any(p is not None for p in parents) else None,
                stamps=stamps if any(s is not None for s in stamps) else None,
                inputs=[pending.inputs for pending in batch] if self.tracer.tensors else None,
                outputs=outcome.results if self.tracer.tensors else None,
            )
        )

    def _finish(self, replica: Replica, batch: list[Pending], outcome: BatchOutcome) -> None:
        """Event loop: resolve the futures of a finished batch and free its lane. The batcher
        is told after the loop has run what the results woke (a gRPC handler encodes and
        writes its answer in the task an awaited result resumes, one pass later): the next
        batch's fill window opens once the answers are out, not while they are being made."""
        for pending, result in zip(batch, outcome.results, strict=False):
            future = pending.future
            if future.done():
                continue
            if isinstance(result, ServeError):
                future.set_exception(result)
            else:
                future.set_result(result)
        lane = self.lanes[replica.index]
        lane.busy = False
        lane.rows_served += outcome.rows
        self._timed(outcome.finished - outcome.started)
        if outcome.left_pool:
            self._changed()
        asyncio.get_running_loop().call_soon(self._freed)

    def _on_recovered(self, replica: Replica) -> None:
        """Worker thread: a background dry run brought the replica back."""
        self._log("torchplace.serve.replica_recovered", replica)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._after_recovery)

    def _after_recovery(self) -> None:
        self._changed()
        self._freed()

    def _log_failure(self, replica: Replica, outcome: BatchOutcome, error: ServeError) -> None:
        self._log(
            "torchplace.serve.batch_failed",
            replica,
            **{
                "class": ERROR_CLASS.get(type(error), "other"),
                "status": error.status,
                "rows": outcome.rows,
                "oom_splits": outcome.oom_splits,
                "error": str(error),
                "consecutive_failures": replica.health.consecutive,
                "left_pool": outcome.left_pool,
            },
        )

    def _log(self, event: str, replica: Replica, **fields: object) -> None:
        record = {
            "event": event,
            "replica": replica.name,
            "device": replica.label,
            "model": self.model,
            "version": self.version,
            **fields,
        }
        logger.warning("%s", json.dumps(record))


def _still_waited_for(batch: list[Pending], index: int) -> bool:
    """Whether request ``index`` of a running batch is still waited for (its client has not
    gone, its deadline has not passed): asked from the worker thread, only after an
    out-of-memory error, before a half of the batch is run again. A ticket's state is one
    attribute read; a request that goes away just after is computed, as in any batch."""
    return not batch[index].future.done()
