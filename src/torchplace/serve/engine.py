"""The serving engine: routing and lifecycle of one model version.

This is the whole interface the HTTP side uses::

    engine = Engine.from_config(config)     # builds the model on the host; nothing placed yet
    await engine.start()                    # place, warm up, dry run every replica; start workers
    outputs = await engine.infer({"input": rows})
    submitted = engine.submit({"input": rows})  # the same without a task: submitted.future
    engine.observe_request(200, seconds, submitted.device)  # every answered request
    await engine.drain(timeout)             # readiness false, finish queued + in-flight work
    await engine.stop()

The engine validates a request's arrays, queues it in the :class:`~torchplace.serve.batcher.Batcher`
and starts, drains and stops everything. Threads: the asyncio event loop owns the queue and the
batcher; each replica has ONE worker thread that runs its batches (torch releases the GIL inside
kernels, so CPU replicas compute in parallel). Which replica takes a batch, and what happens
when it finishes, is the :class:`~torchplace.serve.pool.ReplicaPool`'s; start-up details
(devices, threads, the start-up record) are :mod:`torchplace.serve.startup`'s. A replica only
ever sees tensors on its own device.

``torch.set_num_threads``: when every serving replica is on the CPU the engine sets the
intra-op thread count to ``(cpu_count - 1) // cpu_replicas`` (at least 1) at start-up: one core
stays with the event loop and CPU replicas do not oversubscribe the rest; ``torch_threads``
(``--torch-threads``) overrides it. This is process-wide, as torch's setting is.

``dtype`` (``--dtype``: ``float32``, ``float16``, ``bfloat16``) is the serving precision: each
replica's module is placed with one ``.to(device, dtype)`` (floating parameters and buffers are
cast), floating inputs still cross host -> device once in their wire datatype and are cast on
the device, and outputs are cast back to their declared datatype on the device before their
one copy to the host. Without it nothing is cast, but for BF16 tensors: their host form is
float32 (numpy has no bfloat16), so a BF16 input crosses as float32 and is cast to bfloat16 on
the device, and a BF16 output is cast to float32 on the device before its copy (the codec rounds
it to bfloat16 on the wire). With ``dtype`` set, every floating input (BF16 included) reaches
the model in that dtype: the serving dtype wins over the declared one.

``inline_batch_ms`` (``--inline-batch-ms``; 1.0 in ``torchplace serve``, 0 = off when an engine
is built directly): a sole CPU replica whose full batch took at most that long in its warm dry
run runs its batches on the event loop, not on its worker thread, once its first
:data:`INLINE_PROBATION` real batches in a row were cheap on the worker thread too (the dry
run's zeros may be cheaper than real rows). A worker thread releases the GIL inside every torch
op and waits for it again after each; for a model that small the hand-overs cost more than the
batch. The loop is blocked for the batch (at most about that long), and several replicas (which
compute in parallel) always keep their threads.

``inline_full_batch_ms`` (``--inline-full-batch-ms``; 50 in ``torchplace serve``, 0 = off when
an engine is built directly): a sole CPU replica dearer than that, whose full batch still took
at most this long, runs a *full* batch on the event loop when no other request waits behind it
(a closed loop of at most a batch of clients: until it is answered the loop has nothing to
read) and no other model serves on the loop (:meth:`Engine.share_loop`: it would hold up their
requests), and every other batch on its worker thread; as with ``inline_batch_ms``, once its first
:data:`INLINE_PROBATION` real batches in a row took at most that long on the worker thread
(wall time: a forward that waits would hold the loop as long). One batch over
:data:`FULL_INLINE_GIVE_UP` times this, there or on the loop, sends all of them to the worker
thread for good.

``metrics=False`` (``--no-metrics``) skips the per-batch histogram updates (the error counters
and the scrape-time gauges stay); tracing costs nothing unless a trace file or an OpenTelemetry
provider is configured.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from torchplace.errors import (
    ConfigError,
    DeviceOutOfMemoryError,
    InputError,
    KernelError,
    NotReadyError,
    OverloadedError,
    PayloadTooLargeError,
    ServeError,
    TransferError,
)
from torchplace.serve.admission import DeadlineExceededError, QueuePolicy, WaitEstimate
from torchplace.serve.batcher import Batcher, Pending
from torchplace.serve.datatypes import host_numpy_dtype, serving_dtype
from torchplace.serve.execution import Transfer
from torchplace.serve.loader import LoadedModel, load_configured
from torchplace.serve.metrics import ServeMetrics
from torchplace.serve.pool import ReplicaPool
from torchplace.serve.replica import Replica
from torchplace.serve.startup import (
    device_memory,
    full_device,
    resolve_devices,
    startup_error,
    startup_record,
    thread_count,
)
from torchplace.serve.statistics import InferStatistics
from torchplace.serve.ticket import TIMED_OUT, Ticket
from torchplace.serve.tracing import CALLER, Tracer
from torchplace.serve.triton_trace import Stamps

if TYPE_CHECKING:
    import torch

    from torchplace.models import TensorSpec
    from torchplace.serve.config import ServeConfig

__all__ = ["Engine", "Submitted", "resolve_devices"]

_SHUTTING_DOWN = "the server is shutting down; retry on another instance"

logger = logging.getLogger("torchplace.serve")

_SERVED_BY: contextvars.ContextVar[str] = contextvars.ContextVar("torchplace_served_by", default="")
#: Triton's failure reason of a queued request that failed with the error (else "OTHER")
_FAILURE_REASON: dict[type[BaseException], str] = {
    DeadlineExceededError: "REJECTED",
    OverloadedError: "REJECTED",
    KernelError: "BACKEND",
    TransferError: "BACKEND",
    DeviceOutOfMemoryError: "BACKEND",
}


class Submitted:
    """A request queued by :meth:`Engine.submit`: ``future`` resolves to its outputs."""

    __slots__ = ("future", "pendings")

    def __init__(self, future: Ticket[dict[str, np.ndarray]], pendings: Sequence[Pending]) -> None:
        self.future = future
        self.pendings = pendings

    @property
    def device(self) -> str:
        """The device label of the replica that ran it (its first chunk); "" before."""
        return self.pendings[0].device


def _joined(pendings: Sequence[Pending]) -> Ticket[dict[str, np.ndarray]]:
    """One ticket for the chunks of a request: their outputs in order, or the first error."""
    joined: Ticket[dict[str, np.ndarray]] = Ticket()
    left = [len(pendings)]

    def chunk_done(chunk: Ticket[dict[str, np.ndarray]]) -> None:
        if joined.done():
            return
        if chunk.cancelled():
            joined.cancel(chunk.cancel_message())
            return
        error = chunk.exception()
        if error is not None:
            joined.set_exception(error)
            return
        left[0] -= 1
        if left[0] == 0:
            results = [p.future.result() for p in pendings]
            joined.set_result(
                {name: np.concatenate([r[name] for r in results]) for name in results[0]}
            )

    for pending in pendings:
        pending.future.add_done_callback(chunk_done)
    return joined


def _input_checks(
    inputs: Sequence[TensorSpec],
) -> tuple[tuple[str, tuple[int, ...], np.dtype[Any]], ...]:
    """(name, row shape, host dtype) of each declared input: what a request is checked for."""
    return tuple((spec.name, spec.shape[1:], host_numpy_dtype(spec.datatype)) for spec in inputs)


def _check_arguments(
    devices: Sequence[torch.device],
    replicas_per_device: int,
    max_batch_size: int,
    max_request_rows: int,
    fallback: str | None,
) -> None:
    if not devices:
        raise ConfigError("an engine needs at least one device, got none")
    for name, value in (
        ("replicas_per_device", replicas_per_device),
        ("max_batch_size", max_batch_size),
        ("max_request_rows", max_request_rows),
    ):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if fallback not in (None, "cpu"):
        raise ConfigError(f"fallback must be 'cpu' or None, got {fallback!r}")


#: an inline batch this many times slower than ``inline_batch_ms`` moves its replica's batches
#: to the worker thread (see :meth:`Replica.run_now <torchplace.serve.replica.Replica.run_now>`)
INLINE_GIVE_UP = 50
#: a full batch on the loop this many times slower than ``inline_full_batch_ms`` moves its
#: replica's batches to the worker thread for good
FULL_INLINE_GIVE_UP = 3
#: real batches in a row an inline replica first runs cheaply on its worker thread, timed
#: (see :meth:`Replica.plan_inline <torchplace.serve.replica.Replica.plan_inline>`)
INLINE_PROBATION = 8


class Engine:
    """Serves one model version from one or more replicas. See the module docstring."""

    platform = "pytorch"

    def __init__(
        self,
        loaded: LoadedModel,
        devices: Sequence[torch.device],
        *,
        replicas_per_device: int = 1,
        max_batch_size: int = 32,
        max_delay_ms: float = 2.0,
        max_queue: int = 1024,
        max_request_rows: int = 4096,
        queue: QueuePolicy | None = None,
        failure_threshold: int = 3,
        fallback: str | None = None,
        trace_file: Path | str | None = None,
        torch_threads: int | None = None,
        transfer: Transfer | None = None,
        recovery_interval_s: float = 0.25,
        otel: bool | None = None,
        metrics: bool = True,
        dtype: str | None = None,
        inline_batch_ms: float = 0.0,
        inline_full_batch_ms: float = 0.0,
        trace_format: str = "chrome",
    ) -> None:
        _check_arguments(devices, replicas_per_device, max_batch_size, max_request_rows, fallback)
        for name, value in (
            ("inline_batch_ms", inline_batch_ms),
            ("inline_full_batch_ms", inline_full_batch_ms),
        ):
            if not value >= 0:
                raise ConfigError(f"{name} must be >= 0 (0: off), got {value}")
        devices = [full_device(d) for d in devices]
        #: the serving precision (``float32``/``float16``/``bfloat16``); None = the model's own
        self.dtype = serving_dtype(dtype) if dtype is not None else None
        self.loaded = loaded
        self.name = loaded.name
        self.version = loaded.version
        self.inputs: tuple[TensorSpec, ...] = loaded.inputs
        self.outputs: tuple[TensorSpec, ...] = loaded.outputs
        self.labels: Mapping[str, tuple[str, ...]] = loaded.labels
        #: Triton's max_batch_size 0: one request per model call, its tensors as sent (the
        #: declarations hold a first dimension of 1 that the protocol side adds and takes off)
        self.unbatched = loaded.unbatched
        self.max_batch_size = 1 if self.unbatched else max_batch_size
        self.max_delay_ms = 0.0 if self.unbatched else max_delay_ms
        self.max_request_rows = max_request_rows
        self.policy = queue if queue is not None else QueuePolicy(max_queue=max_queue)
        self.max_queue = self.policy.max_queue
        self.torch_threads = torch_threads
        self.metrics_enabled = metrics
        self.inline_batch_ms = inline_batch_ms
        self.inline_full_batch_ms = inline_full_batch_ms
        self.replicas = self._plan(
            devices,
            replicas_per_device=replicas_per_device,
            fallback=fallback,
            failure_threshold=failure_threshold,
            transfer=transfer,
            recovery_interval_s=recovery_interval_s,
        )
        self.devices = [str(d) for d in devices]
        self.default_label = self.devices[0]
        self._input_names = tuple(spec.name for spec in self.inputs)
        self._input_checks = _input_checks(self.inputs)
        #: a dynamic non-batch dimension: only requests of the same row shapes share a batch
        self._same_shape = any(dim < 0 for spec in self.inputs for dim in spec.shape[1:])
        self._observe(trace_file=trace_file, otel=otel, trace_format=trace_format)
        self.startup_record: dict[str, Any] = {}
        self._estimate = WaitEstimate()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batcher: Batcher | None = None
        #: another model serves on this event loop (see :meth:`share_loop`)
        self.loop_shared = False
        self._accepting = False
        #: what a request refused or dropped by a drain is told (see :meth:`drain`)
        self._closing = _SHUTTING_DOWN
        self._serving = False
        self._started = False
        self._stopped = False

    def _observe(
        self, *, trace_file: Path | str | None, otel: bool | None, trace_format: str
    ) -> None:
        """The metrics, tracer and statistics of this model version, and its replica pool."""
        self.metrics = ServeMetrics(
            self.name,
            self.version,
            max_batch_size=self.max_batch_size,
            queue_depth=self.queue_depth,
            queue_device=",".join(self.devices),
            replicas=lambda: self.pool.states(),
            memory=device_memory,
            devices={r.label for r in self.replicas},
        )
        self._device_metrics = {r.label: self.metrics.device(r.label) for r in self.replicas}
        self.tracer = Tracer(
            model=self.name,
            version=self.version,
            trace_file=trace_file,
            otel=otel,
            trace_format=trace_format,
            datatypes={spec.name: spec.datatype for spec in (*self.inputs, *self.outputs)},
        )
        #: Triton's statistics extension (counts and ns), kept whether metrics are on or not
        self.statistics = InferStatistics()
        self.pool = ReplicaPool(
            self.replicas,
            model=self.name,
            version=self.version,
            device_metrics=self._device_metrics,
            tracer=self.tracer,
            metrics=self.metrics_enabled,
            statistics=self.statistics,
        )

    def _plan(
        self,
        devices: Sequence[torch.device],
        *,
        replicas_per_device: int,
        fallback: str | None,
        failure_threshold: int,
        transfer: Transfer | None,
        recovery_interval_s: float,
    ) -> list[Replica]:
        """The replicas: ``replicas_per_device`` on each device, then the CPU fallback if any."""
        import torch

        replica_dtype = getattr(torch, self.dtype) if self.dtype is not None else None
        plan = [(device, False) for device in devices for _ in range(replicas_per_device)]
        if fallback == "cpu":
            plan.append((torch.device("cpu"), True))
        return [
            Replica(
                self.loaded,
                device,
                index=index,
                max_batch_size=self.max_batch_size,
                failure_threshold=failure_threshold,
                fallback=is_fallback,
                transfer=None if is_fallback else transfer,
                recovery_interval_s=recovery_interval_s,
                dtype=replica_dtype,
            )
            for index, (device, is_fallback) in enumerate(plan)
        ]

    @classmethod
    def from_config(cls, config: ServeConfig, loaded: LoadedModel | None = None) -> Engine:
        """Build the model on the host (unless ``loaded`` is given) and plan the replicas;
        nothing is placed yet."""
        if loaded is None:
            loaded = load_configured(config)
        devices = resolve_devices(config.device, config.devices)
        return cls(
            loaded,
            devices,
            replicas_per_device=config.replicas_per_device,
            max_batch_size=config.max_batch_size,
            max_delay_ms=config.max_delay_ms,
            max_request_rows=config.max_request_rows,
            queue=QueuePolicy(
                max_queue=config.max_queue,
                priority_levels=config.priority_levels,
                default_priority=config.default_priority,
                queue_limits=config.priority_queue_limits,
                default_timeout_s=config.default_timeout_ms / 1000 or None,
                max_queue_wait_s=config.max_queue_wait_ms / 1000 or None,
            ),
            failure_threshold=config.failure_threshold,
            fallback=config.fallback,
            trace_file=config.trace_file,
            trace_format=config.trace_format,
            torch_threads=config.torch_threads,
            metrics=config.metrics,
            dtype=config.dtype,
            inline_batch_ms=config.inline_batch_ms,
            inline_full_batch_ms=config.inline_full_batch_ms,
        )

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Place and warm up every replica (off the loop), start the workers, log the record."""
        if self._started:
            return
        import torch

        loop = asyncio.get_running_loop()
        self._loop = loop
        began = time.perf_counter()
        threads = thread_count(self)
        if threads is not None:
            torch.set_num_threads(threads)
        # only a sole replica may run inline: time its batch, and nobody else's
        time_batch = len(self.replicas) == 1 and (
            self.inline_batch_ms > 0 or self.inline_full_batch_ms > 0
        )
        for replica in self.replicas:
            try:
                await loop.run_in_executor(None, functools.partial(replica.prepare, time_batch))
            except KernelError as exc:
                if "CUDA error" in str(exc):
                    raise  # a device fault, not the declarations
                raise startup_error(self, exc, replica) from exc
        self._choose_inline()
        self._batcher = Batcher(
            loop=loop,
            pick=self.pool.pick,
            max_batch_size=self.max_batch_size,
            max_delay_s=self.max_delay_ms / 1000.0,
            queue_limits=self.policy.limits,
            same_shape=self._same_shape,
        )
        self._batcher.solo = not self.loop_shared
        self.pool.start(
            loop,
            on_change=self._refresh_serving,
            on_free=self._batcher.freed,
            on_batch=self._estimate.record,
        )
        self._started = True
        self._accepting = True
        self._refresh_serving()
        self.startup_record = startup_record(self, time.perf_counter() - began, threads)
        logger.info("%s", json.dumps(self.startup_record, sort_keys=True))

    def _choose_inline(self) -> None:
        """A sole CPU replica whose full batch took at most ``inline_batch_ms`` in its dry
        run runs its batches on the event loop, one within ``inline_full_batch_ms`` its full
        batches that no other request waits behind (see :mod:`torchplace.serve.replica`);
        only such a replica's batch was timed."""
        limit = self.inline_batch_ms / 1000
        full = self.inline_full_batch_ms / 1000
        for replica in self.replicas:
            took = replica.full_batch_s
            replica.inline_limit_s = INLINE_GIVE_UP * limit
            if took is not None and took <= limit:
                replica.plan_inline(limit, INLINE_PROBATION)
            elif took is not None and took <= full:
                replica.full_inline_limit_s = FULL_INLINE_GIVE_UP * full
                replica.plan_inline(full, INLINE_PROBATION, full=True)

    def share_loop(self, shared: bool) -> None:
        """Whether other models serve on this event loop: a full batch of this one then
        never runs on the loop (``inline_full_batch_ms``), where it would hold up theirs."""
        self.loop_shared = shared
        if self._batcher is not None:
            self._batcher.solo = not shared

    def is_live(self) -> bool:
        """The process answers (until :meth:`stop`)."""
        return not self._stopped

    def is_ready(self) -> bool:
        """Taking work and at least one replica ready (weights checked on its device now)."""
        return self._accepting and self._serving and self.pool.is_ready()

    async def drain(self, timeout: float, reason: str | None = None) -> None:
        """Stop taking work; wait up to ``timeout`` s for queued and in-flight requests. Those
        still queued then fail with :class:`NotReadyError` (503) saying ``reason`` (default:
        the server is shutting down; a model version unloaded or replaced says so instead)."""
        self._accepting = False
        if reason is not None:
            self._closing = reason
        loop = self._loop
        if loop is None or self._batcher is None:
            return
        deadline = loop.time() + max(timeout, 0.0)
        while (len(self._batcher) or self.pool.busy) and loop.time() < deadline:
            await asyncio.sleep(0.002)
        # the last batch's futures may have resolved in this very loop iteration: let their
        # requests take their answers before draining is reported done
        await asyncio.sleep(0)
        closing = self._closing
        failed = self._batcher.fail_all(lambda: NotReadyError(closing))
        if failed:
            self._device_metrics[self.default_label].errors["not_ready"].inc(failed)

    async def stop(self) -> None:
        """Drain with no grace, stop the workers and flush the trace file."""
        if self._stopped:
            return
        await self.drain(0.0)
        await self.pool.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.tracer.close)  # JSON built off the loop
        self._stopped = True
        self._serving = False

    # ------------------------------------------------------------------ the request path
    async def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        timeout_s: float | None = None,
        priority: int | None = None,
        stamps: Stamps | None = None,
    ) -> dict[str, np.ndarray]:
        """Run the rows of one request (see :meth:`submit`), in the caller's trace
        (:data:`~torchplace.serve.tracing.CALLER`); cancelling the call withdraws them."""
        submitted = self.submit(
            inputs, timeout_s=timeout_s, priority=priority, caller=CALLER.get(), stamps=stamps
        )
        try:
            return await submitted.future
        finally:
            _SERVED_BY.set(submitted.device)

    def submit(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        timeout_s: float | None = None,
        priority: int | None = None,
        caller: Any = None,
        rows: int | None = None,
        stamps: Stamps | None = None,
    ) -> Submitted:
        """Queue the rows of one request (on the event loop); its future resolves to every
        declared output with as many rows. What is wrong with the request raises here.

        More rows than ``max_batch_size`` are queued as chunks of at most that many (they may
        run on different replicas) and answered as one, rows in order. ``timeout_s`` (else the
        server default) bounds the time the request may stay queued; ``priority`` picks its
        level (1 is served first; 0 or None: the default); ``caller`` is the trace its spans
        join, ``stamps`` its front end's times (Triton's trace format). Cancelling the future
        withdraws what is still queued (counted, never run). Every queued request is counted
        in :attr:`statistics` when it settles. ``rows`` says the caller already checked ``inputs`` against the declared inputs and the row limit (the
        REST route passes what its codec checked), and how many rows they hold.
        """
        began = time.perf_counter()
        # refused before it was queued (invalid, full queue, not ready): as in Triton, no
        # statistic counts it (its status is in the metrics)
        pendings = self._queue(inputs, priority, caller, rows, began, stamps)
        loop = self._loop
        assert loop is not None
        timeout = self.policy.timeout(timeout_s)
        timer = loop.call_later(timeout, self._expire, pendings) if timeout else None
        future = pendings[0].future if len(pendings) == 1 else _joined(pendings)
        future.add_done_callback(functools.partial(self._settled, pendings, timer, began))
        return Submitted(future, pendings)

    def _queue(
        self,
        inputs: Mapping[str, np.ndarray],
        priority: int | None,
        caller: Any,
        rows: int | None,
        began: float,
        stamps: Stamps | None = None,
    ) -> Sequence[Pending]:
        """The request checked, admitted and queued as one :class:`Pending` per chunk."""
        if not (self._accepting and self._serving):
            raise self._count(self._not_ready())
        if rows is None:
            rows = self._rows(inputs)
        level = self.policy.level(priority)
        batcher = self._batcher
        assert batcher is not None
        self._admit(batcher, rows)
        key = self._shape_key(inputs) if self._same_shape else None
        if rows <= self.max_batch_size:  # one chunk: the common case
            pending = Pending(
                inputs, rows, Ticket(), level=level, caller=caller, arrived=began, key=key,
                stamps=stamps,
            )  # fmt: skip
            try:
                batcher.submit(pending)
            except OverloadedError as exc:
                raise self._count(exc) from None
            return (pending,)
        self._check_chunks(rows, level)
        pendings = [
            Pending(
                chunk,
                n,
                Ticket(),
                level=level,
                caller=caller,
                arrived=began,
                key=key,
                stamps=stamps,
            )
            for chunk, n in self._chunks(inputs, rows)
        ]
        for index, pending in enumerate(pendings):
            try:
                batcher.submit(pending)
            except OverloadedError as exc:
                self._withdraw(pendings[:index])
                raise self._count(exc) from None
        return pendings

    def _shape_key(self, inputs: Mapping[str, np.ndarray]) -> tuple[tuple[int, ...], ...]:
        """The row shapes of a request's inputs: what the requests of one batch share when an
        input has a dynamic non-batch dimension."""
        return tuple(inputs[name].shape[1:] for name in self._input_names)

    def _settled(
        self,
        pendings: Sequence[Pending],
        timer: asyncio.TimerHandle | None,
        began: float,
        future: Ticket[dict[str, np.ndarray]],
    ) -> None:
        """A request's future is done: its deadline timer goes, and when it did not succeed
        its chunks still queued are withdrawn (a cancelled one's are counted: as a deadline
        drop when the server's request timeout cancelled it, else as the client's cancel)."""
        if timer is not None:
            timer.cancel()
        reason = "OTHER"
        if future.cancelled():
            ok = False
            timed_out = future.cancel_message() == TIMED_OUT
            reason = "REJECTED" if timed_out else "CANCELED"
            if self._withdraw(pendings):  # its queued work never runs
                self._count_drop("deadline" if timed_out else "cancelled")
        else:
            error = future.exception()
            ok = error is None
            if error is not None:
                self._withdraw(pendings)
                reason = _FAILURE_REASON.get(type(error), "OTHER")
        self.statistics.request(ok, time.perf_counter() - began, pendings, reason)

    def _check_chunks(self, rows: int, level: int) -> None:
        """Refuse (413) a request whose chunks could never all wait in its level's queue,
        however empty: each chunk counts against the queue limit as a request does."""
        limit = self.policy.limits[level]
        if -(-rows // self.max_batch_size) > limit:
            raise PayloadTooLargeError(
                f"a request of {rows} rows runs as chunks of {self.max_batch_size} rows "
                f"(--max-batch-size), more than the {limit} its priority level's queue holds "
                f"(--max-queue); send at most {limit * self.max_batch_size} rows at once"
            )

    def _chunks(
        self, inputs: Mapping[str, np.ndarray], rows: int
    ) -> list[tuple[Mapping[str, np.ndarray], int]]:
        """The request as chunks of at most ``max_batch_size`` rows (views, no copy)."""
        size = self.max_batch_size
        return [
            ({name: array[start : start + size] for name, array in inputs.items()},
             min(size, rows - start))
            for start in range(0, rows, size)
        ]  # fmt: skip

    def _admit(self, batcher: Batcher, rows: int) -> None:
        """Refuse at once (503 + Retry-After) when the queued work would take too long; one
        full batch per serving replica may always wait, so that no replica idles between
        batches however slow a batch is."""
        limit = self.policy.max_queue_wait_s
        if limit is None:
            return
        queued = batcher.queued_rows
        if queued < self.max_batch_size:  # the common case, decided without the pool
            return
        replicas = self.pool.serving_count
        if queued < self.max_batch_size * max(replicas, 1):
            return
        wait = self._estimate.wait(queued, self.max_batch_size, replicas)
        if wait > limit:
            raise self._count(
                OverloadedError(
                    f"over capacity: the queued work takes about {wait * 1000:.0f} ms, over "
                    f"the {limit * 1000:g} ms limit (--max-queue-wait-ms); retry shortly"
                )
            )

    def _withdraw(self, pendings: Sequence[Pending]) -> int:
        """Remove the still-queued chunks of a request (never computed) and settle the
        futures of the others; returns how many were removed."""
        batcher = self._batcher
        removed = 0
        for pending in pendings:
            if not pending.taken and batcher is not None and batcher.discard(pending):
                removed += 1
            future = pending.future
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()  # retrieved: no "never retrieved" warning
        return removed

    def _expire(self, pendings: Sequence[Pending]) -> None:
        """The deadline passed: the chunks still queued are removed and answered 504."""
        queued = [p for p in pendings if not p.taken and not p.future.done()]
        if not queued:
            return
        batcher = self._batcher
        for pending in queued:
            if batcher is not None:
                batcher.discard(pending)
        self._count_drop("deadline")
        # a split request may have had chunks run already: say which part was not
        whole = len(queued) == len(pendings)
        what = "it was" if whole else f"{len(queued)} of its {len(pendings)} chunks were"
        for pending in queued:
            if pending.future.done():  # a chunk's error already withdrew the request's others
                continue
            pending.future.set_exception(
                DeadlineExceededError(
                    "Request timeout expired: the request's deadline passed while it was "
                    f"queued; {what} not run (give it a later deadline: the 'timeout' "
                    "parameter or Inference-Timeout-Us header, in microseconds, or the gRPC "
                    "call's deadline; or retry)"
                )
            )

    def _count_drop(self, cls: str) -> None:
        self._device_metrics[self.default_label].errors[cls].inc()

    def _rows(self, inputs: Mapping[str, np.ndarray]) -> int:
        """Rows of the request; every input checked against its declaration (cheap)."""
        if len(inputs) != len(self._input_names):
            names = list(self._input_names)
            missing = [n for n in names if n not in inputs]
            extra = [n for n in inputs if n not in names]
            raise InputError(
                f"inputs {sorted(inputs)} do not match the declared inputs {names}"
                f" (missing {missing}, unexpected {extra})"
            )
        rows = -1
        for name, row_shape, dtype in self._input_checks:
            array = inputs.get(name)
            if array is None:
                raise InputError(
                    f"input {name!r} is missing; declared inputs: {list(self._input_names)}"
                )
            shape = array.shape
            if not shape:
                raise InputError(f"input {name!r} has no batch dimension; send shape [rows, ...]")
            if shape[1:] != row_shape:
                self._check_row_shape(name, shape, row_shape)
            if array.dtype != dtype and not np.can_cast(array.dtype, dtype, "same_kind"):
                raise InputError(f"input {name!r} has dtype {array.dtype}, expected {dtype}")
            if rows < 0:
                rows = shape[0]
            elif shape[0] != rows:
                raise InputError(
                    f"input {name!r} has {shape[0]} rows but {self._input_names[0]!r} has "
                    f"{rows}; every input needs the same batch size"
                )
        if rows < 1:
            raise InputError(f"a request must carry at least one row, got {rows}")
        if rows > self.max_request_rows:
            raise PayloadTooLargeError(
                f"a request may carry at most {self.max_request_rows} rows "
                f"(--max-request-rows), got {rows}; split it"
            )
        return rows

    @staticmethod
    def _check_row_shape(name: str, shape: tuple[int, ...], row_shape: tuple[int, ...]) -> None:
        got = shape[1:]
        if len(got) != len(row_shape) or any(
            want >= 0 and want != dim for want, dim in zip(row_shape, got, strict=True)
        ):
            raise InputError(
                f"input {name!r} has shape {list(shape)}, expected {[-1, *row_shape]} "
                "(-1 = any number of rows)"
            )

    def _not_ready(self) -> NotReadyError:
        if not self._started:
            return NotReadyError("the model is still loading; retry shortly")
        if not self._accepting:
            return NotReadyError(self._closing)
        return NotReadyError(
            f"no healthy replica of {self.name!r} (devices {self.devices}); retry shortly"
        )

    def _count(self, exc: ServeError) -> ServeError:
        cls = "overload" if isinstance(exc, OverloadedError) else "not_ready"
        self._device_metrics[self.default_label].errors[cls].inc()
        return exc

    def _refresh_serving(self) -> None:
        self._serving = self.pool.serving
        if not self._serving and self._batcher is not None:
            failed = self._batcher.fail_all(self._not_ready)
            if failed:
                self._device_metrics[self.default_label].errors["not_ready"].inc(failed)

    # ------------------------------------------------------------------ observability
    def observe_request(self, status: int, seconds: float, device: str | None = None) -> None:
        """Count one answered request (called by the HTTP side), under the ``device`` that
        served it (else the one that ran the current task's last request)."""
        bound = self._device_metrics.get(device or _SERVED_BY.get() or self.default_label)
        if bound is None:
            bound = self._device_metrics[self.default_label]
        bound.request(status, seconds)
        if status in (400, 413):
            bound.errors["input"].inc()

    def served_by(self) -> str:
        """The device that ran the current task's last request (else the first device)."""
        return _SERVED_BY.get() or self.default_label

    def metrics_text(self) -> bytes:
        """Prometheus text exposition of this engine's registry."""
        return self.metrics.text()

    def queue_depth(self) -> int:
        """The requests (chunks) queued, waiting for a replica."""
        return len(self._batcher) if self._batcher is not None else 0
