# NOTE (ENGINE -> HTTP): the three NEEDS at the top of app.py are done: ``config.metrics`` is
# honoured (False skips the per-batch histograms), CPU torch threads default to
# max(1, (cores - 1) // cpu_replicas), and --trace-file keeps one compact record per batch
# (no per-request dicts) and streams the JSON at shutdown, off the event loop.
"""The serving engine: replicas on their devices, the dynamic batcher, failures, metrics, traces.

This is the whole interface the HTTP side uses::

    engine = Engine.from_config(config)     # builds the model on the host; nothing placed yet
    await engine.start()                    # place, warm up, dry run every replica; start workers
    outputs = await engine.infer({"input": rows})
    engine.observe_request(200, seconds)    # the HTTP side reports every request it answered
    await engine.drain(timeout)             # readiness false, finish queued + in-flight work
    await engine.stop()

Threads: the asyncio event loop owns the queue and the batcher; each replica has ONE worker
thread that runs its batches (torch releases the GIL inside kernels, so CPU replicas compute in
parallel). A finished batch resolves all of its futures with a single
``loop.call_soon_threadsafe``. Requests go to the least-loaded ready replica (a free one, the one
that has served the fewest rows first); a replica only ever sees tensors on its own device.

``torch.set_num_threads``: when every serving replica is on the CPU the engine sets the
intra-op thread count to ``(cpu_count - 1) // cpu_replicas`` (at least 1) at start-up: one core
stays with the event loop and CPU replicas do not oversubscribe the rest; ``torch_threads``
(``--torch-threads``) overrides it.
This is process-wide, as torch's setting is.

``dtype`` (``--dtype``: ``float32``, ``float16``, ``bfloat16``) is the serving precision: each
replica's module is placed with one ``.to(device, dtype)`` (floating parameters and buffers are
cast), floating inputs still cross host -> device once in their wire datatype and are cast on
the device, and outputs are cast back to their declared datatype on the device before their
one copy to the host. Without it nothing is cast, but for BF16 tensors: their host form is
float32 (numpy has no bfloat16), so a BF16 input crosses as float32 and is cast to bfloat16 on
the device, and a BF16 output is cast to float32 on the device before its copy (the codec rounds
it to bfloat16 on the wire). With ``dtype`` set, every floating input (BF16 included) reaches
the model in that dtype: the serving dtype wins over the declared one.

``metrics=False`` (``--no-metrics``) skips the per-batch histogram updates (the error counters
and the scrape-time gauges stay); tracing costs nothing unless a trace file or an OpenTelemetry
provider is configured.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import resource
import sys
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
    ServeError,
    TransferError,
)
from torchplace.serve.batcher import Batcher, Pending
from torchplace.serve.datatypes import host_numpy_dtype, serving_dtype
from torchplace.serve.loader import LoadedModel, load_model, weight_bytes
from torchplace.serve.metrics import ReplicaState, ServeMetrics
from torchplace.serve.replica import BatchOutcome, Replica, Transfer
from torchplace.serve.tracing import BatchRecord, Tracer

if TYPE_CHECKING:
    import torch

    from torchplace.models import TensorSpec
    from torchplace.serve.config import ServeConfig

__all__ = ["Engine", "resolve_devices"]

logger = logging.getLogger("torchplace.serve")

_SERVED_BY: contextvars.ContextVar[str] = contextvars.ContextVar("torchplace_served_by", default="")

_ERROR_CLASS: dict[type[ServeError], str] = {
    DeviceOutOfMemoryError: "oom",
    TransferError: "transfer",
    KernelError: "kernel",
    InputError: "input",
}


def resolve_devices(
    device: str = "auto", devices: Sequence[str] | None = None
) -> list[torch.device]:
    """The devices to place replicas on: ``devices`` (``"all"`` = every visible GPU) or ``device``."""
    import torch

    from torchplace.devices import resolve_device

    specs = list(devices) if devices else [device]
    resolved: list[torch.device] = []
    for spec in specs:
        if str(spec).strip().lower() == "all":
            if torch.cuda.is_available() and torch.cuda.device_count() > 0:
                found = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
            else:
                found = [resolve_device("auto")]
        else:
            found = [resolve_device(spec)]
        for dev in found:
            if dev not in resolved:
                resolved.append(dev)
    return resolved


class _Lane:
    """A replica as the batcher sees it (a worker with a busy flag), on the event loop."""

    __slots__ = ("busy", "replica", "rows_served")

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.busy = False
        self.rows_served = 0

    def submit_batch(self, batch: list[Pending], rows: int) -> None:
        self.busy = True
        label = self.replica.label
        for pending in batch:
            pending.device = label
        self.replica.submit(batch, [p.inputs for p in batch], [p.rows for p in batch])


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
        failure_threshold: int = 3,
        fallback: str | None = None,
        trace_file: Path | str | None = None,
        torch_threads: int | None = None,
        transfer: Transfer | None = None,
        recovery_interval_s: float = 0.25,
        otel: bool | None = None,
        metrics: bool = True,
        dtype: str | None = None,
    ) -> None:
        import torch

        if not devices:
            raise ConfigError("an engine needs at least one device, got none")
        if replicas_per_device < 1:
            raise ConfigError(f"replicas_per_device must be >= 1, got {replicas_per_device}")
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if fallback not in (None, "cpu"):
            raise ConfigError(f"fallback must be 'cpu' or None, got {fallback!r}")
        devices = [_full_device(d) for d in devices]
        #: the serving precision (``float32``/``float16``/``bfloat16``); None = the model's own
        self.dtype = serving_dtype(dtype) if dtype is not None else None
        replica_dtype = getattr(torch, self.dtype) if self.dtype is not None else None
        self.loaded = loaded
        self.name = loaded.name
        self.version = loaded.version
        self.inputs: tuple[TensorSpec, ...] = loaded.inputs
        self.outputs: tuple[TensorSpec, ...] = loaded.outputs
        self.max_batch_size = max_batch_size
        self.max_delay_ms = max_delay_ms
        self.max_queue = max_queue
        self.torch_threads = torch_threads
        self.metrics_enabled = metrics
        # (device, is the CPU fallback): the primaries, then the fallback, if any
        plan = [(device, False) for device in devices for _ in range(replicas_per_device)]
        if fallback == "cpu":
            plan.append((torch.device("cpu"), True))
        self.replicas: list[Replica] = [
            Replica(
                loaded,
                device,
                index=index,
                max_batch_size=max_batch_size,
                failure_threshold=failure_threshold,
                fallback=is_fallback,
                transfer=None if is_fallback else transfer,
                recovery_interval_s=recovery_interval_s,
                dtype=replica_dtype,
            )
            for index, (device, is_fallback) in enumerate(plan)
        ]
        self.devices = [str(d) for d in devices]
        self._default_label = self.devices[0]
        self._input_names = tuple(spec.name for spec in self.inputs)
        self._input_checks = tuple(
            (spec.name, spec.shape[1:], host_numpy_dtype(spec.datatype)) for spec in self.inputs
        )
        self._coalesce = all(dim > 0 for spec in self.inputs for dim in spec.shape[1:])
        self.metrics = ServeMetrics(
            self.name,
            self.version,
            max_batch_size=max_batch_size,
            queue_depth=self._queue_depth,
            queue_device=",".join(self.devices),
            replicas=self._replica_states,
            memory=_device_memory,
            devices={r.label for r in self.replicas},
        )
        self._device_metrics = {r.label: self.metrics.device(r.label) for r in self.replicas}
        self.tracer = Tracer(
            model=self.name, version=self.version, trace_file=trace_file, otel=otel
        )
        self.startup_record: dict[str, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batcher: Batcher | None = None
        self._lanes: list[_Lane] = []
        self._primary: list[_Lane] = []
        self._fallback: list[_Lane] = []
        self._accepting = False
        self._serving = False
        self._started = False
        self._stopped = False

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, config: ServeConfig) -> Engine:
        """Build the model on the host and plan the replicas; nothing is placed yet."""
        loaded = load_model(
            config.model,
            version=config.model_version,
            weights=config.weights,
            exported=config.exported,
            inputs=config.inputs,
            outputs=config.outputs,
        )
        devices = resolve_devices(config.device, config.devices)
        return cls(
            loaded,
            devices,
            replicas_per_device=config.replicas_per_device,
            max_batch_size=config.max_batch_size,
            max_delay_ms=config.max_delay_ms,
            max_queue=config.max_queue,
            failure_threshold=config.failure_threshold,
            fallback=config.fallback,
            trace_file=config.trace_file,
            torch_threads=config.torch_threads,
            metrics=config.metrics,
            dtype=config.dtype,
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
        threads = self._thread_count()
        if threads is not None:
            torch.set_num_threads(threads)
        for replica in self.replicas:
            try:
                await loop.run_in_executor(None, replica.prepare)
            except KernelError as exc:
                if "CUDA error" in str(exc):
                    raise  # a device fault, not the declarations
                raise self._startup_error(exc, replica) from exc
        self._batcher = Batcher(
            loop=loop,
            pick=self._pick,
            max_batch_size=self.max_batch_size,
            max_delay_s=self.max_delay_ms / 1000.0,
            max_queue=self.max_queue,
            coalesce=self._coalesce,
        )
        self._lanes = [_Lane(r) for r in self.replicas]
        self._primary = [lane for lane in self._lanes if not lane.replica.fallback]
        self._fallback = [lane for lane in self._lanes if lane.replica.fallback]
        for replica in self.replicas:
            replica.start_worker(self._on_batch_done, self._on_recovered)
        self._started = True
        self._accepting = True
        self._refresh_serving()
        self.startup_record = self._startup_record(time.perf_counter() - began, threads)
        logger.info("%s", json.dumps(self.startup_record, sort_keys=True))

    def _startup_error(self, exc: KernelError, replica: Replica) -> ConfigError:
        """The start-up dry run (zeros of the declared shapes, before any request) failed in
        the forward pass: the declarations (or the serving dtype) do not fit the model, a
        configuration error."""
        declared = ", ".join(
            f"{spec.name}:{spec.datatype}:{','.join(str(dim) for dim in spec.shape)}"
            for spec in self.loaded.inputs
        )
        if self.dtype is not None:
            return ConfigError(
                f"the start-up dry run of model {self.loaded.name!r} with --dtype {self.dtype} "
                f"on {replica.label} failed: {exc}; the model (or an op it uses) may not support "
                f"{self.dtype} on {replica.device.type}: serve it without --dtype (its own "
                "dtypes) or with another --dtype, or make its own tensors follow the inputs' "
                "dtype (x.new_*/torch.*_like rather than fixed-dtype temporaries); if it fails "
                f"without --dtype too, check the declared inputs {declared} (name:datatype:shape)"
            )
        bf16 = [spec.name for spec in self.loaded.inputs if spec.datatype == "BF16"]
        if bf16:
            return ConfigError(
                f"the start-up dry run of model {self.loaded.name!r} failed with the declared "
                f"inputs {declared} (name:datatype:shape) at --max-batch-size "
                f"{self.max_batch_size}: {exc}; the BF16 inputs {bf16} reach the model as "
                "torch.bfloat16, so its weights must be bfloat16 too: serve it with --dtype "
                "bf16, or declare the inputs FP32; if that is not it, check the declared shapes"
            )
        return ConfigError(
            f"the start-up dry run of model {self.loaded.name!r} failed with the declared "
            f"inputs {declared} (name:datatype:shape) at --max-batch-size {self.max_batch_size}: "
            f"{exc}; declare the input shape the model takes with --input NAME:DTYPE:DIMS "
            "(-1 first, for the batch; its outputs with --output), or, for a .pt2, export it "
            "with a dynamic batch dimension whose max >= --max-batch-size "
            "(torch.export.Dim('batch', max=N) in dynamic_shapes)"
        )

    def _thread_count(self) -> int | None:
        if self.torch_threads is not None:
            return self.torch_threads
        primaries = [r for r in self.replicas if not r.fallback]
        if primaries and all(r.device.type == "cpu" for r in primaries):
            # keep one core for the event loop (HTTP parsing, batching), share the rest
            return max(1, ((os.cpu_count() or 1) - 1) // len(primaries))
        return None

    def is_live(self) -> bool:
        """The process answers (until :meth:`stop`)."""
        return not self._stopped

    def is_ready(self) -> bool:
        """Taking work and at least one replica ready (weights checked on its device now)."""
        if not (self._accepting and self._serving):
            return False
        primaries = [r for r in self.replicas if not r.fallback]
        if any(r.is_ready() for r in primaries):
            return True
        return any(r.is_ready() for r in self.replicas if r.fallback)

    async def drain(self, timeout: float) -> None:
        """Stop taking work; wait up to ``timeout`` s for queued and in-flight requests."""
        self._accepting = False
        loop = self._loop
        if loop is None or self._batcher is None:
            return
        deadline = loop.time() + max(timeout, 0.0)
        while (len(self._batcher) or any(lane.busy for lane in self._lanes)) and (
            loop.time() < deadline
        ):
            await asyncio.sleep(0.002)
        failed = self._batcher.fail_all(
            lambda: NotReadyError("the server is shutting down; retry on another instance")
        )
        if failed:
            self._device_metrics[self._default_label].errors["not_ready"].inc(failed)

    async def stop(self) -> None:
        """Drain with no grace, stop the workers and flush the trace file."""
        if self._stopped:
            return
        await self.drain(0.0)
        loop = asyncio.get_running_loop()
        for replica in self.replicas:
            await loop.run_in_executor(None, replica.close)
        # answer anything a worker finished meanwhile
        await asyncio.sleep(0)
        for lane in self._lanes:
            lane.busy = False
        await loop.run_in_executor(None, self.tracer.close)  # JSON built off the loop
        self._stopped = True
        self._serving = False

    # ------------------------------------------------------------------ the request path
    async def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the rows of one request; every declared output comes back with as many rows."""
        if not (self._accepting and self._serving):
            raise self._count(self._not_ready())
        rows = self._rows(inputs)
        batcher = self._batcher
        assert batcher is not None
        assert self._loop is not None
        pending = Pending(inputs, rows, self._loop.create_future())
        try:
            batcher.submit(pending)
        except OverloadedError as exc:
            raise self._count(exc) from None
        try:
            result: dict[str, np.ndarray] = await pending.future
        finally:
            _SERVED_BY.set(pending.device)
        return result

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
        if rows < 1 or rows > self.max_batch_size:
            raise InputError(
                f"a request must carry 1..{self.max_batch_size} rows (max batch size), got {rows}"
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
            return NotReadyError("the server is shutting down; retry on another instance")
        return NotReadyError(
            f"no healthy replica of {self.name!r} (devices {self.devices}); retry shortly"
        )

    def _count(self, exc: ServeError) -> ServeError:
        cls = "overload" if isinstance(exc, OverloadedError) else "not_ready"
        self._device_metrics[self._default_label].errors[cls].inc()
        return exc

    def _pick(self) -> _Lane | None:
        best: _Lane | None = None
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

    def _refresh_serving(self) -> None:
        self._serving = any(r.in_pool for r in self.replicas)
        if not self._serving and self._batcher is not None:
            failed = self._batcher.fail_all(self._not_ready)
            if failed:
                self._device_metrics[self._default_label].errors["not_ready"].inc(failed)

    # ------------------------------------------------------------------ worker callbacks
    def _on_batch_done(self, replica: Replica, token: Any, outcome: BatchOutcome) -> None:
        """Worker thread: record metrics and spans, then hand the results to the loop."""
        batch: list[Pending] = token
        bound = self._device_metrics[replica.label]
        started = outcome.started
        tracer = self.tracer
        arrivals: list[float] | None = None
        if self.metrics_enabled or tracer.enabled:
            arrivals = [pending.arrived for pending in batch]
        if self.metrics_enabled:
            assert arrivals is not None
            bound.queue.observe_many([started - arrived for arrived in arrivals])
            bound.batch_size.observe(outcome.rows)
            bound.h2d.observe(outcome.h2d_s)
            bound.compute.observe(outcome.compute_s)
            bound.d2h.observe(outcome.d2h_s)
        failed = [r for r in outcome.results if isinstance(r, ServeError)]
        for error in failed:
            cls = _ERROR_CLASS.get(type(error))
            if cls is not None and cls != "input":
                bound.errors[cls].inc()
        if failed:
            self._log_failure(replica, outcome, failed[0])
        if tracer.enabled:
            assert arrivals is not None
            statuses = (
                [r.status if isinstance(r, ServeError) else 200 for r in outcome.results]
                if failed
                else None
            )
            tracer.batch(
                BatchRecord(
                    replica=replica.name,
                    device=replica.label,
                    arrivals=arrivals,
                    rows=[pending.rows for pending in batch],
                    statuses=statuses,
                    started=started,
                    finished=outcome.finished,
                    h2d=outcome.h2d_s,
                    compute=outcome.compute_s,
                    d2h=outcome.d2h_s,
                    sync=outcome.sync_s,
                )
            )
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._finish, replica, batch, outcome)

    def _finish(self, replica: Replica, batch: list[Pending], outcome: BatchOutcome) -> None:
        """Event loop: resolve the futures of a finished batch and dispatch the next one."""
        for pending, result in zip(batch, outcome.results, strict=False):
            future = pending.future
            if future.done():
                continue
            if isinstance(result, ServeError):
                future.set_exception(result)
            else:
                future.set_result(result)
        lane = self._lanes[replica.index]
        lane.busy = False
        lane.rows_served += outcome.rows
        if outcome.left_pool:
            self._refresh_serving()
        if self._batcher is not None:
            self._batcher.dispatch()

    def _on_recovered(self, replica: Replica) -> None:
        """Worker thread: a background dry run brought the replica back."""
        logger.warning(
            "%s",
            json.dumps(
                {
                    "event": "torchplace.serve.replica_recovered",
                    "replica": replica.name,
                    "device": replica.label,
                    "model": self.name,
                    "version": self.version,
                }
            ),
        )
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._after_recovery)

    def _after_recovery(self) -> None:
        self._refresh_serving()
        if self._batcher is not None:
            self._batcher.dispatch()

    def _log_failure(self, replica: Replica, outcome: BatchOutcome, error: ServeError) -> None:
        record = {
            "event": "torchplace.serve.batch_failed",
            "replica": replica.name,
            "device": replica.label,
            "model": self.name,
            "version": self.version,
            "class": _ERROR_CLASS.get(type(error), "other"),
            "status": error.status,
            "rows": outcome.rows,
            "oom_splits": outcome.oom_splits,
            "error": str(error),
            "consecutive_failures": replica.health.consecutive,
            "left_pool": outcome.left_pool,
        }
        logger.warning("%s", json.dumps(record))

    # ------------------------------------------------------------------ observability
    def observe_request(self, status: int, seconds: float) -> None:
        """Count one answered request (called by the HTTP side, in the request's task)."""
        bound = self._device_metrics.get(_SERVED_BY.get() or self._default_label)
        if bound is None:
            bound = self._device_metrics[self._default_label]
        bound.request(status, seconds)
        if status in (400, 413):
            bound.errors["input"].inc()

    def metrics_text(self) -> bytes:
        """Prometheus text exposition of this engine's registry."""
        return self.metrics.text()

    def _queue_depth(self) -> int:
        return len(self._batcher) if self._batcher is not None else 0

    def _replica_states(self) -> list[ReplicaState]:
        return [ReplicaState(r.name, r.label, r.is_ready()) for r in self.replicas]

    def _startup_record(self, seconds: float, threads: int | None) -> dict[str, Any]:
        import torch

        visible = ["cpu"]
        if torch.cuda.is_available():
            visible += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        memory: dict[str, dict[str, int]] = {}
        for label in {r.label for r in self.replicas}:
            found = _device_memory(label)
            if found is not None:
                memory[label] = {"allocated_bytes": found[0], "reserved_bytes": found[1]}
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rss_bytes = rss if sys.platform == "darwin" else rss * 1024
        staging = sum(r.staging.nbytes for r in self.replicas if r.staging is not None)
        return {
            "event": "torchplace.serve.start",
            "model": self.name,
            "version": self.version,
            "source": self.loaded.source,
            "device": self._default_label,
            "devices": self.devices,
            "dtype": self.dtype,
            "replicas": [
                {
                    "name": r.name,
                    "device": r.label,
                    "fallback": r.fallback,
                    "ready": r.is_ready(),
                    "pinned_staging": bool(r.staging and r.staging.is_pinned()),
                    "weight_dtypes": r.weight_dtypes(),
                    "weight_bytes": weight_bytes(r.module) if r.module is not None else 0,
                }
                for r in self.replicas
            ],
            "visible_devices": visible,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "weight_bytes": self.loaded.weight_bytes,
            "max_batch_size": self.max_batch_size,
            "max_delay_ms": self.max_delay_ms,
            "max_queue": self.max_queue,
            "staging_bytes": staging,
            "memory_after_warmup": memory,
            "host_max_rss_bytes": rss_bytes,
            "torch_threads": threads if threads is not None else torch.get_num_threads(),
            "torch_version": torch.__version__,
            "startup_seconds": round(seconds, 4),
        }


def _full_device(device: torch.device) -> torch.device:
    """``cuda`` -> ``cuda:N`` (the current device): labels, placement checks and memory gauges
    all need the index."""
    index: int | None = device.index  # None for a bare "cuda" (torch's stubs say int)
    if index is not None or device.type in ("cpu", "meta"):
        return device
    from torchplace.devices import resolve_device

    return resolve_device(device)


def _device_memory(label: str) -> tuple[int, int] | None:
    """(allocated, reserved) bytes of an accelerator; None for the CPU and friends."""
    if not label.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.memory_allocated(label), torch.cuda.memory_reserved(label)
