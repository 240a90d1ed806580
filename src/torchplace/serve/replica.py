"""One copy of the model on one device: placement, readiness, and its worker thread.

Start-up (:meth:`Replica.prepare`, once): copy the host model, ``eval()``, move it to the
device with one ``.to(device, dtype)`` (``dtype``, the serving precision, casts the floating
parameters and buffers; None keeps the model's own), check from the parameters themselves that
every weight is there, allocate the staging buffers (pinned when the device is CUDA) and run a
dry run at the largest batch size through the very path requests take. Readiness = weights
verified on the device + dry run passed + healthy.

A batch runs through :class:`~torchplace.serve.execution.BatchExecutor` (the replica is one).
The worker thread owns the replica's device work: batches arrive one at a time from the event
loop, and after a replica-removing failure the same thread runs the background dry runs that
bring it back. A batch cheaper than handing it over (:attr:`Replica.inline`, decided by the
engine from :attr:`Replica.full_batch_s`) runs on the event loop itself, :meth:`Replica.run_now`:
a worker thread takes the GIL back after every torch op, and for a small CPU model those
hand-overs cost more than the batch. The dry run's rows are zeros, and a forward's time may
depend on the data (post-processing that has nothing to do on zeros), so such a replica first
runs its real batches on its worker thread, timed (:meth:`Replica.plan_inline`), and moves to
the loop after a run of cheap ones; a batch far slower than the dry run keeps it on its worker
thread for good. An inline batch that takes far longer than that later moves the batches after
it back to the worker thread.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from torchplace.errors import ConfigError, ServeError
from torchplace.serve.datatypes import host_numpy_dtype, host_torch_dtype, torch_dtype
from torchplace.serve.execution import BatchExecutor, BatchOutcome, FailureScope, Transfer
from torchplace.serve.failures import BatchFailure, HealthTracker
from torchplace.serve.loader import set_eval
from torchplace.serve.staging import StagingBuffers
from torchplace.serve.startup import full_device

if TYPE_CHECKING:
    import torch

    from torchplace.serve.loader import LoadedModel

__all__ = ["BatchOutcome", "Replica", "Transfer"]

logger = logging.getLogger("torchplace.serve")

_Job = tuple[Any, Sequence[Mapping[str, np.ndarray]], Sequence[int]]
_RECOVER: _Job = (None, (), ())  # the worker's cue to bring an inline replica back
_TIMED_DRY_RUN_S = 0.05  # a first dry run under this is timed three times more, warm
#: a worker batch on probation counts as cheap when it took at most this many times the
#: inline limit of CPU time (handing the GIL over and back costs the worker CPU too)
_PROBATION_SLACK = 4.0


class Replica(BatchExecutor):
    """One model copy on one device. Thread-safety: device work happens on its worker only."""

    def __init__(
        self,
        loaded: LoadedModel,
        device: torch.device,
        *,
        index: int = 0,
        max_batch_size: int = 32,
        failure_threshold: int = 3,
        fallback: bool = False,
        transfer: Transfer | None = None,
        recovery_interval_s: float = 0.25,
        dtype: torch.dtype | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if dtype is not None and not getattr(dtype, "is_floating_point", False):
            raise ConfigError(
                f"replica dtype={dtype!r} is not a floating torch dtype; give torch.float32, "
                "torch.float16 or torch.bfloat16, or None for the model's own dtypes"
            )
        self.loaded = loaded
        self.device = device = full_device(device)  # `cuda` -> `cuda:N`, as tensors report it
        self.label = str(device)
        self.index = index
        self.name = f"{self.label}#{index}"
        self.max_batch_size = max_batch_size
        self.fallback = fallback
        self.transfer = transfer or Transfer()
        self.health = HealthTracker(failure_threshold)
        self.recovery_interval_s = recovery_interval_s
        self.module = None
        self.staging = None
        self.dry_run_passed = False
        self.dtype = dtype
        self._input_names = tuple(spec.name for spec in loaded.inputs)
        # the dtype each input is cast to on the device, after its one copy (None: none). An
        # input crosses in its host dtype and reaches the model in the serving dtype when one
        # is set (floating inputs), else in its declared datatype (BF16: crossed as float32,
        # cast to bfloat16). Empty when nothing is cast: the hot path only tests this tuple.
        casts: list[torch.dtype | None] = []
        for spec in loaded.inputs:
            want = torch_dtype(spec.datatype)
            if dtype is not None and want.is_floating_point:
                want = dtype
            casts.append(want if want != host_torch_dtype(spec.datatype) else None)
        self._in_casts = tuple(casts) if any(c is not None for c in casts) else ()
        self._output_specs = loaded.outputs
        self._out_dtypes = {}
        self._cuda = device.type == "cuda"
        self._stream = None
        self._events = []
        #: seconds a full batch took in the warm start-up dry run (``prepare(time_batch=True)``)
        self.full_batch_s: float | None = None
        #: batches run on the calling thread (the event loop), see :meth:`run_now`
        self.inline = False
        #: an inline batch slower than this (s) sends later batches to the worker thread
        self.inline_limit_s = float("inf")
        #: a full batch that no other request waits behind runs on the calling thread (the
        #: event loop), see :meth:`dispatch`; one slower than :attr:`full_inline_limit_s`
        #: (s) sends every later batch to the worker thread
        self.full_inline = False
        self.full_inline_limit_s = float("inf")
        #: a batch is running on the calling thread (the event loop) now
        self.on_loop = False
        #: cheap worker batches in a row still needed before :attr:`inline` (0: none planned)
        self.probation = 0
        self._probation_batches = 0
        self._cheap_s = 0.0
        self._promote = False  # set by the worker, applied on the loop by :meth:`dispatch`
        self.planned_full = False  # the probation leads to full_inline, not inline
        self._inbox: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._as_transfer = FailureScope(self, "transfer")
        self._as_kernel = FailureScope(self, "kernel")

    # ------------------------------------------------------------------ start-up
    def prepare(self, time_batch: bool = False) -> None:
        """Place the model, allocate staging buffers and pass the dry run; raises if it fails.
        ``time_batch``: measure :attr:`full_batch_s` too (on the CPU, when the first dry run
        was cheap), for the engine to decide :attr:`inline`."""
        import torch

        # the host dtype of each output (float32 for BF16): the forward's result is cast to it
        # on the device, before its one copy to the host
        self._out_dtypes = {
            spec.name: host_torch_dtype(spec.datatype) for spec in self._output_specs
        }
        rebuild = self.loaded.rebuild
        module = rebuild(self.device) if rebuild is not None else copy.deepcopy(self.loaded.module)
        module = set_eval(module)
        # one .to: placement and, with a serving dtype, the cast of the floating tensors
        module = (
            module.to(self.device) if self.dtype is None else module.to(self.device, self.dtype)
        )
        self.module = module
        if not self.weights_on_device():
            raise ConfigError(
                f"replica {self.name}: some parameters are not on {self.label} after .to(); "
                "the model may pin tensors to a device in its own code"
            )
        if self._cuda:
            # the weights were copied on the default stream; the replica works on its own
            torch.cuda.synchronize(self.device)
            with torch.cuda.device(self.device):
                self._stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
                self._events = [
                    torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                    for _ in range(4)
                ]
        self.staging = StagingBuffers(self.loaded.inputs, self.max_batch_size, pin=self._cuda)
        began = time.perf_counter()
        shapes = self.dry_run(self.max_batch_size)
        cheap = time.perf_counter() - began < _TIMED_DRY_RUN_S
        if time_batch and cheap and not self._cuda:
            self.full_batch_s = min(self._timed_dry_run() for _ in range(3))  # warm by then
        if self._cuda:
            fixed = {
                spec.name: (self._out_dtypes[spec.name], shapes[spec.name])
                for spec in self._output_specs
                if all(dim >= 0 for dim in spec.shape[1:])
            }
            self.staging.prepare_outputs(fixed)
            self.dry_run(self.max_batch_size)  # once more through the pinned output path

    def _timed_dry_run(self) -> float:
        began = time.perf_counter()
        self.dry_run(self.max_batch_size)
        return time.perf_counter() - began

    def weights_on_device(self) -> bool:
        """Every parameter and buffer is on this replica's device (read from the tensors)."""
        module = self.module
        if module is None:
            return False
        device = self.device
        return all(tensor.device == device for tensor in (*module.parameters(), *module.buffers()))

    def weight_dtypes(self) -> list[str]:
        """The dtypes of the placed module's parameters and buffers (read from the tensors)."""
        module = self.module
        if module is None:
            return []
        found = {
            str(t.dtype).removeprefix("torch.") for t in (*module.parameters(), *module.buffers())
        }
        return sorted(found)

    def dry_run(self, rows: int) -> dict[str, tuple[int, ...]]:
        """Run ``rows`` rows of zeros through the request path; returns output row shapes."""
        request = {
            spec.name: np.zeros(
                (rows, *self.loaded.dry_row(spec)), dtype=host_numpy_dtype(spec.datatype)
            )
            for spec in self.loaded.inputs
        }
        outcome = self.run_batch([request], [rows], count_health=False)
        result = outcome.results[0]
        if isinstance(result, ServeError):
            self.dry_run_passed = False
            raise result
        shapes: dict[str, tuple[int, ...]] = {}
        for spec in self._output_specs:
            array = result[spec.name]
            row_shape = tuple(array.shape[1:])
            declared = spec.shape[1:]
            if len(row_shape) != len(declared) or any(
                d >= 0 and d != got for d, got in zip(declared, row_shape, strict=False)
            ):
                self.dry_run_passed = False
                raise ConfigError(
                    f"output {spec.name!r} of {self.loaded.name!r} has rows of shape "
                    f"{list(row_shape)} but is declared {list(declared)}; fix --output"
                )
            shapes[spec.name] = row_shape
        self.dry_run_passed = True
        return shapes

    @property
    def in_pool(self) -> bool:
        """Takes traffic: placed, dry run passed, healthy and not closed."""
        return self.dry_run_passed and self.health.healthy and not self._closed

    def is_ready(self) -> bool:
        """In the pool and the weights are verified on the device right now."""
        return self.in_pool and self.weights_on_device()

    # ------------------------------------------------------------------ a batch

    # ------------------------------------------------------------------ the worker
    def start_worker(
        self,
        on_done: Callable[[Replica, Any, BatchOutcome], None],
        on_recovered: Callable[[Replica], None],
    ) -> None:
        """Start the worker thread; ``on_done`` runs on that thread after every batch."""
        if self._thread is not None:
            return
        self._on_done = on_done
        self._on_recovered = on_recovered
        thread = threading.Thread(
            target=self._work, name=f"torchplace-replica-{self.name}", daemon=True
        )
        try:
            thread.start()
        except RuntimeError as exc:  # the process's thread limit
            raise ServeError(
                f"cannot start the worker thread of replica {self.label} ({exc}); serve fewer "
                "replicas, or raise the limit on threads (ulimit -u, the container's pids limit)"
            ) from None
        self._thread = thread

    def plan_inline(self, limit_s: float, batches: int, *, full: bool = False) -> None:
        """Run batches on the event loop once ``batches`` real batches in a row took at most
        :data:`_PROBATION_SLACK` times ``limit_s`` of CPU time each on the worker thread (a
        dearer one starts the count again); one over :attr:`inline_limit_s` of wall time ends
        the probation, on the worker thread for good. With ``full``, what the probation leads
        to is :attr:`full_inline` instead, and a batch counts as cheap when it took at most
        ``limit_s`` of wall time (a forward that waits holds the loop as long), the end for
        good over :attr:`full_inline_limit_s`."""
        if batches < 1:
            raise ConfigError(f"plan_inline needs batches >= 1, got {batches}")
        self.planned_full = full
        self._cheap_s = limit_s if full else _PROBATION_SLACK * limit_s
        self._probation_batches = self.probation = batches

    def dispatch(
        self,
        token: Any,
        requests: Sequence[Mapping[str, np.ndarray]],
        rows: Sequence[int],
        alone: bool = False,
    ) -> None:
        """Run a batch where it runs now (called on the event loop, the replica idle):
        :meth:`run_now` when inline, or when ``alone`` (the batcher's: a full batch that no
        other request waits behind, on a loop that serves no other model) and
        :attr:`full_inline`, else :meth:`submit`.

        A full batch with nothing behind it is what a closed loop of at most a batch of
        clients sends: until it is answered the loop has nothing to read or decode, so a
        worker thread would only add its hand-overs (waking it, its GIL round trips, waking
        the loop with the results) to every batch."""
        if self._promote:  # the worker's last batch ended the probation; it is idle now
            self._promote = False
            if self.planned_full:
                self.full_inline = True
            else:
                self.inline = True
        if self.inline or (alone and self.full_inline):
            self.run_now(token, requests, rows)
        else:
            self.submit(token, requests, rows)

    def submit(
        self, token: Any, requests: Sequence[Mapping[str, np.ndarray]], rows: Sequence[int]
    ) -> None:
        """Hand a batch to the worker thread (called on the event loop)."""
        self._inbox.put((token, requests, rows))

    def run_now(
        self, token: Any, requests: Sequence[Mapping[str, np.ndarray]], rows: Sequence[int]
    ) -> None:
        """Run a batch on the calling thread (the event loop: an inline replica's batch, or a
        :attr:`full_inline` one's full batch) and report it as the worker does; a failure that
        takes the replica out of the pool starts the worker's background recovery. A batch far
        slower than the dry run promised (over :attr:`inline_limit_s`, or
        :attr:`full_inline_limit_s`: a forward whose time depends on the data) sends the
        batches after it to the worker thread, so that the event loop is not held again."""
        limit, what = (
            (self.inline_limit_s, "batch")
            if self.inline
            else (self.full_inline_limit_s, "full batch")
        )
        started = time.perf_counter()
        self.on_loop = True
        try:
            self._on_done(self, token, self._run_safely(token, requests, rows))
        finally:
            self.on_loop = False
        took = time.perf_counter() - started
        if not self.health.healthy:
            self._inbox.put(_RECOVER)
        if took > limit:
            self.inline = self.full_inline = False
            logger.warning(
                "replica %s: a %s took %.1f ms on the event loop, over %.1f ms; its batches now "
                "run on its worker thread", self.label, what, took * 1e3, limit * 1e3
            )  # fmt: skip

    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker after the batch it is running (blocking; call off the loop), then
        let go of the device copy of the model and the staging buffers. On an accelerator the
        allocator's cached blocks go back to the driver too, so that the device's free memory
        (what the check before a load reads) counts what an unloaded model held, as Triton
        empties the cache when it unloads a model. A worker still running a batch after
        ``timeout`` keeps them."""
        self._closed = True
        thread = self._thread
        if thread is not None:
            self._inbox.put(None)
            thread.join(timeout)
            if thread.is_alive():
                return
            self._thread = None
        self.module = None
        self.staging = None
        self._stream = None
        self._events = []
        self._release_memory()

    def _work(self) -> None:
        while True:
            job = self._inbox.get()
            if job is None:
                return
            if job is not _RECOVER:
                token, requests, rows = job
                if self.probation:  # timed only while on probation
                    started, cpu = time.perf_counter(), time.thread_time()
                    outcome = self._run_safely(token, requests, rows)
                    self._on_probation(time.perf_counter() - started, time.thread_time() - cpu)
                else:
                    outcome = self._run_safely(token, requests, rows)
                self._on_done(self, token, outcome)
            if not self.health.healthy and not self._recover():
                return

    def _on_probation(self, took: float, cpu: float) -> None:
        """Count a worker batch of :meth:`plan_inline`'s probation (on the worker thread):
        ``took`` seconds of wall time (a forward that waits, sleeps or is slow on real rows
        over the give-up limit ends it), ``cpu`` of the thread's CPU time, which waiting for
        the GIL on a busy machine does not inflate (cheap or not; the wall time for a
        :attr:`full_inline` plan)."""
        give_up = self.full_inline_limit_s if self.planned_full else self.inline_limit_s
        if took > give_up:
            self.probation = 0
            logger.warning(
                "replica %s: a batch took %.1f ms, over %.1f ms; its batches stay on its worker "
                "thread instead of the event loop", self.label, took * 1e3, give_up * 1e3,
            )  # fmt: skip
        elif (took if self.planned_full else cpu) > self._cheap_s:
            self.probation = self._probation_batches
        else:
            self.probation -= 1
            self._promote = self.probation == 0

    def _run_safely(
        self, token: Any, requests: Sequence[Mapping[str, np.ndarray]], rows: Sequence[int]
    ) -> BatchOutcome:
        try:
            return self.run_batch(requests, rows, token=token)
        except Exception as exc:  # a bug, not a request failure: fail the batch loudly
            failure = BatchFailure("kernel", self.label, f"{type(exc).__name__}: {exc}")
            outcome = BatchOutcome(rows=sum(rows), results=[failure.error() for _ in rows])
            outcome.failures.append("kernel")
            return outcome

    def _recover(self) -> bool:
        """Background dry runs until one passes; False when the replica was closed meanwhile."""
        delay = self.recovery_interval_s
        while True:
            with contextlib.suppress(queue.Empty):
                if self._inbox.get(timeout=delay) is None:
                    return False
            if self._closed:
                return False
            if self._probe():
                self.health.success()
                self._on_recovered(self)
                return True
            delay = min(delay * 2, 5.0)

    def _probe(self) -> bool:
        try:
            self.dry_run(1)
        except Exception:
            return False
        return self.weights_on_device()
