"""The path of one batch on one replica: gather -> one H2D -> forward -> one D2H -> split.

:class:`BatchExecutor` is the part of a :class:`~torchplace.serve.replica.Replica` that runs a
batch (the replica adds placement, readiness and its worker thread): gather the rows of every
request into the staging buffer (one host memcpy per input) -> ONE host-to-device copy per
input, in its host dtype (its wire datatype; float32 for BF16) -> casts on the device: with a
serving dtype, floating inputs to it; without one, BF16 inputs to bfloat16 -> forward under
:func:`torch.inference_mode` -> outputs cast on the device to their declared datatype's host
dtype (float32 for BF16) -> ONE device-to-host copy per output -> numpy rows per request.
On a CUDA replica the copies and the forward run on the replica's own stream and the batch ends
with one synchronisation of that stream (the results are needed on the host anyway).

The model is called positionally with the inputs in their declared order and may return a
tensor, a sequence of tensors (declared output order) or a mapping by output name. Failures are
classified as in :mod:`torchplace.serve.failures`; an out-of-memory batch is split in halves and
retried, down to single rows; a half whose every request is no longer wanted (its client went
away or its deadline passed while the batch ran: see :attr:`BatchExecutor.wanted`) is not run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from torchplace.errors import InputError, ServeError
from torchplace.serve.failures import BatchFailure, HealthTracker, describe, is_oom

if TYPE_CHECKING:
    import torch
    from torch import nn

    from torchplace.models import TensorSpec
    from torchplace.serve.staging import StagingBuffers

__all__ = ["BatchExecutor", "BatchOutcome", "Result", "Transfer"]

Result = dict[str, np.ndarray] | ServeError


class Transfer:
    """How a batch crosses between host and device. Replace it to inject copy failures."""

    def to_device(
        self, host: torch.Tensor, device: torch.device, non_blocking: bool
    ) -> torch.Tensor:
        """Host -> device (a no-op when ``device`` is the CPU)."""
        return host.to(device, non_blocking=non_blocking)

    def to_host(
        self, src: torch.Tensor, out: torch.Tensor | None, non_blocking: bool
    ) -> torch.Tensor:
        """Device -> host, into ``out`` (a staging slice) when given."""
        if out is None:
            return src.to("cpu")
        out.copy_(src, non_blocking=non_blocking)
        return out


#: marks the rows of a batch split after an out-of-memory error that were not run: every
#: request with rows there had gone (compared by identity; no request is told it)
_NOT_WANTED = BatchFailure("oom", "", "not run: no request with rows there is waited for")


@dataclass
class BatchOutcome:
    """What happened to one batch: per-request results and per-stage seconds."""

    results: list[Result] = field(default_factory=list)
    rows: int = 0
    started: float = 0.0  # perf_counter when the worker picked the batch up
    finished: float = 0.0
    h2d_s: float = 0.0
    compute_s: float = 0.0
    d2h_s: float = 0.0
    sync_s: float = 0.0  # host time waiting in the batch's one synchronisation (CUDA)
    oom_splits: int = 0
    #: the model executions that answered rows: (rows, h2d s, forward s, d2h s) each; one
    #: unless an out-of-memory error split the batch, none when it failed
    executions: list[tuple[int, float, float, float]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # the failure kinds met, in order
    left_pool: bool = False


class _Classified(Exception):
    def __init__(self, failure: BatchFailure) -> None:
        super().__init__(failure.detail)
        self.failure = failure


class FailureScope:
    """Turns any exception raised inside into a classified failure of one ``kind``."""

    __slots__ = ("kind", "replica")

    def __init__(self, replica: BatchExecutor, kind: str) -> None:
        self.replica = replica
        self.kind = kind

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, Exception) and not isinstance(exc, _Classified):
            raise self.replica._classify(self.kind, exc) from exc


class BatchExecutor:
    """Runs one batch on a placed model (the worker thread calls it); never raises for request
    failures. Its state is set up by the :class:`~torchplace.serve.replica.Replica` it is part of.
    """

    name: str
    label: str
    device: torch.device
    module: nn.Module | None
    staging: StagingBuffers | None
    transfer: Transfer
    health: HealthTracker
    _input_names: tuple[str, ...]
    _in_casts: tuple[torch.dtype | None, ...]
    _output_specs: tuple[TensorSpec, ...]
    _out_dtypes: dict[str, torch.dtype]
    _cuda: bool
    _stream: Any
    _events: list[Any]
    _as_transfer: FailureScope
    _as_kernel: FailureScope
    #: ``wanted(token, index)``: whether request ``index`` of the batch ``token`` still has
    #: someone waiting for it (read from the worker thread, only after an out-of-memory error)
    wanted: Callable[[Any, int], bool] | None = None

    def run_batch(
        self,
        requests: Sequence[Mapping[str, np.ndarray]],
        rows: Sequence[int],
        *,
        count_health: bool = True,
        token: Any = None,
    ) -> BatchOutcome:
        """Run one batch (the worker thread calls this); never raises for request failures.
        ``token`` is what :attr:`wanted` is asked about the batch's requests (None: all are)."""
        outcome = BatchOutcome(rows=sum(rows), started=time.perf_counter())
        staging = self.staging
        if staging is None or self.module is None:
            raise RuntimeError(f"replica {self.name} was not prepared")
        total = outcome.rows
        try:
            host_in = staging.gather(requests, total)
        except InputError as exc:
            outcome.results = [InputError(str(exc)) for _ in requests]
            outcome.finished = time.perf_counter()
            return outcome
        try:
            with self._on_stream():
                segments = self._run_range(host_in, 0, total, outcome, (token, rows))
        except _Classified as exc:
            failure = exc.failure
            outcome.failures.append(failure.kind)
            outcome.results = [failure.error() for _ in requests]
            outcome.executions.clear()  # halves that ran before the failure answer nothing
            if count_health:
                outcome.left_pool = self.health.failure()
            self._settle()
            outcome.finished = time.perf_counter()
            return outcome
        if outcome.failures:
            self._settle()
        if count_health and any(not isinstance(seg[2], BatchFailure) for seg in segments):
            self.health.success()
        outcome.results = self._split(segments, rows, total, outcome)
        outcome.finished = time.perf_counter()
        return outcome

    def _settle(self) -> None:
        """After a failed attempt: wait for the copies it queued on the replica's stream.

        A successful batch ends with its one synchronisation; a failed one may leave an
        asynchronous H2D out of the pinned staging buffer in flight, and the next batch must
        not refill that buffer under it. A sticky device error makes the wait raise: the
        failure is already counted.
        """
        stream = self._stream
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.synchronize()

    def _on_stream(self) -> contextlib.AbstractContextManager[Any]:
        if self._stream is None:
            return contextlib.nullcontext()
        import torch

        return torch.cuda.stream(self._stream)

    def _run_range(
        self,
        host_in: dict[str, torch.Tensor],
        start: int,
        stop: int,
        outcome: BatchOutcome,
        batch: tuple[Any, Sequence[int]],
    ) -> list[tuple[int, int, dict[str, np.ndarray] | BatchFailure]]:
        part = start > 0 or stop < outcome.rows  # a part split after an out-of-memory error
        if part and not self._still_wanted(batch, start, stop):
            return [(start, stop, _NOT_WANTED)]  # nobody waits for these rows: not run
        try:
            return [(start, stop, self._execute(host_in, start, stop, outcome))]
        except _Classified as exc:
            if exc.failure.kind != "oom":
                raise
            failure = exc.failure
        # Out of the except block: the traceback (and the device tensors its frames hold) is
        # gone, so releasing the cache can really free the failed attempt's memory.
        outcome.failures.append("oom")
        self._release_memory()
        if stop - start == 1:
            return [(start, stop, failure)]
        outcome.oom_splits += 1
        mid = (start + stop) // 2
        return self._run_range(host_in, start, mid, outcome, batch) + self._run_range(
            host_in, mid, stop, outcome, batch
        )

    def _still_wanted(self, batch: tuple[Any, Sequence[int]], start: int, stop: int) -> bool:
        """Whether a request with rows in ``start:stop`` of the batch is still wanted."""
        token, rows = batch
        wanted = self.wanted
        if wanted is None or token is None:
            return True
        offset = 0
        for index, count in enumerate(rows):
            if offset >= stop:
                break
            if offset + count > start and wanted(token, index):
                return True
            offset += count
        return False

    def _classify(self, kind: str, exc: Exception) -> _Classified:
        if is_oom(exc):
            kind = "oom"
        detail = describe(exc)
        return _Classified(BatchFailure(kind, self.label, detail))

    def _execute(
        self, host_in: dict[str, torch.Tensor], start: int, stop: int, outcome: BatchOutcome
    ) -> dict[str, np.ndarray]:
        import torch

        n = stop - start
        device = self.device
        transfer = self.transfer
        pinned = self._cuda
        events = self._events
        perf = time.perf_counter
        t0 = perf()
        if events:
            events[0].record(self._stream)
        staging = self.staging
        assert staging is not None
        async_in = staging.pinned_inputs  # a pageable source would copy synchronously anyway
        with self._as_transfer:
            dev_in = [
                transfer.to_device(host_in[name][start:stop], device, name in async_in)
                for name in self._input_names
            ]
        if events:
            events[1].record(self._stream)
        t1 = perf()
        module = self.module
        assert module is not None
        with self._as_kernel, torch.inference_mode():
            casts = self._in_casts
            if casts:  # on the device: the inputs crossed in their host dtype
                dev_in = [t if c is None else t.to(c) for t, c in zip(dev_in, casts, strict=True)]
            raw = module(*dev_in)
            outs = self._outputs(raw, n)
        if events:
            events[2].record(self._stream)
        t2 = perf()
        arrays: dict[str, np.ndarray] = {}
        with self._as_transfer:
            hosts: list[tuple[str, torch.Tensor, bool]] = []
            for name, tensor in outs:
                out = staging.output(name)
                staged = out is not None
                hosts.append(
                    (
                        name,
                        transfer.to_host(tensor, out[:n] if out is not None else None, pinned),
                        staged,
                    )
                )
            if self._stream is not None:
                events[3].record(self._stream)
        if self._stream is not None:
            # The one sync of the batch: the results are needed on the host now. Device work
            # is asynchronous, so a fault of the forward's kernels (a device-side assert, an
            # illegal address) surfaces here rather than where the kernel was launched.
            waited = perf()
            with self._as_kernel:
                events[3].synchronize()
            outcome.sync_s += perf() - waited
        t3 = perf()
        for name, host, staged in hosts:
            if staged:
                # the staging buffer is reused by the next batch: hand out a private copy
                arrays[name] = staging.output_array(name)[:n].copy()
            else:
                arrays[name] = self._private(host, host_in)
        if events:
            h2d_s = events[0].elapsed_time(events[1]) / 1e3
            compute_s = events[1].elapsed_time(events[2]) / 1e3
            d2h_s = events[2].elapsed_time(events[3]) / 1e3
        else:
            h2d_s, compute_s, d2h_s = t1 - t0, t2 - t1, t3 - t2
        outcome.h2d_s += h2d_s
        outcome.compute_s += compute_s
        outcome.d2h_s += d2h_s
        outcome.executions.append((n, h2d_s, compute_s, d2h_s))
        return arrays

    @staticmethod
    def _private(host: torch.Tensor, host_in: dict[str, torch.Tensor]) -> np.ndarray:
        """A numpy view of a host output, copied if it aliases a reused staging buffer."""
        array: np.ndarray = host.detach().numpy()
        ptr = host.untyped_storage().data_ptr()
        for tensor in host_in.values():
            if tensor.untyped_storage().data_ptr() == ptr:
                copied: np.ndarray = array.copy()
                return copied
        return array

    def _outputs(self, raw: Any, n: int) -> list[tuple[str, torch.Tensor]]:
        import torch

        specs = self._output_specs
        if isinstance(raw, torch.Tensor):
            tensors = [raw]
        elif isinstance(raw, Mapping):
            try:
                tensors = [raw[spec.name] for spec in specs]
            except KeyError as exc:
                raise self._classify(
                    "kernel", KeyError(f"model returned no output named {exc.args[0]!r}")
                ) from None
        elif isinstance(raw, (tuple, list)):
            tensors = list(raw)
        else:
            raise self._classify(
                "kernel", TypeError(f"model returned {type(raw).__name__}, not tensors")
            )
        if len(tensors) != len(specs):
            raise self._classify(
                "kernel",
                ValueError(f"model returned {len(tensors)} outputs, {len(specs)} are declared"),
            )
        result: list[tuple[str, torch.Tensor]] = []
        for spec, tensor in zip(specs, tensors, strict=True):
            if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0 or tensor.shape[0] != n:
                got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor)
                raise self._classify(
                    "kernel",
                    ValueError(f"output {spec.name!r} has shape {got}, expected {n} rows"),
                )
            dtype = self._out_dtypes[spec.name]
            if tensor.dtype != dtype:
                if _truncates(tensor.dtype, dtype):
                    raise self._classify("kernel", _kind_mismatch(spec.name, tensor, dtype))
                tensor = tensor.to(dtype)  # on the device: no crossing
            result.append((spec.name, tensor))
        return result

    def _release_memory(self) -> None:
        if self._cuda:
            import torch

            with torch.cuda.device(self.device):
                torch.cuda.empty_cache()

    def _split(
        self,
        segments: list[tuple[int, int, dict[str, np.ndarray] | BatchFailure]],
        rows: Sequence[int],
        total: int,
        outcome: BatchOutcome,
    ) -> list[Result]:
        results: list[Result] = []
        if len(segments) == 1 and not isinstance(segments[0][2], BatchFailure):
            full = segments[0][2]
            if len(rows) == 1:
                return [full]
            if len(rows) == total:  # one row per request: iterate (n, 1, ...) views
                names = list(full)
                if len(names) == 1:
                    name = names[0]
                    return [{name: view} for view in full[name][:, None]]
                columns = [full[name][:, None] for name in names]
                return [
                    dict(zip(names, views, strict=True)) for views in zip(*columns, strict=True)
                ]
            offset = 0
            for count in rows:
                end = offset + count
                results.append({name: array[offset:end] for name, array in full.items()})
                offset = end
            return results
        # after OOM splits: reassemble rows, failing only requests that own a failed row
        failed = np.zeros(total, dtype=bool)
        skipped = np.zeros(total, dtype=bool)  # not run: their requests were not waited for
        pieces: dict[str, list[np.ndarray]] = {}
        first_failure: BatchFailure | None = None
        shapes: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] = {}
        for start, stop, value in segments:
            if value is _NOT_WANTED:
                skipped[start:stop] = True
            elif isinstance(value, BatchFailure):
                failed[start:stop] = True
                first_failure = first_failure or value
            else:
                for name, array in value.items():
                    shapes[name] = (tuple(array.shape[1:]), array.dtype)
        for name, (row_shape, dtype) in shapes.items():
            full_array = np.zeros((total, *row_shape), dtype=dtype)
            for start, stop, value in segments:
                if not isinstance(value, BatchFailure):
                    full_array[start:stop] = value[name]
            pieces[name] = [full_array]
        offset = 0
        for count in rows:
            end = offset + count
            if failed[offset:end].any():
                assert first_failure is not None
                results.append(first_failure.error())
            elif skipped[offset:end].any():
                results.append({})  # settled already (gone): never read, nor counted a failure
            else:
                results.append({name: arrs[0][offset:end] for name, arrs in pieces.items()})
            offset = end
        return results


def _truncates(got: torch.dtype, declared: torch.dtype) -> bool:
    """Whether casting a model's output of dtype ``got`` to its ``declared`` one would answer
    other values than the model's: floats declared as integers (cut to whole numbers), either
    declared as booleans, booleans declared otherwise, and integers declared as an integer type
    that does not hold all of them (int64 as INT32, int32 as UINT32: wrapped around). A cast
    between floating precisions (a bfloat16 model answering FP32) or to a wider integer type
    (int32 as INT64) keeps every value."""
    import torch

    if (got == torch.bool) != (declared == torch.bool):
        return True
    if got.is_floating_point:
        return not declared.is_floating_point
    if declared.is_floating_point or got == torch.bool:
        return False
    have, hold = torch.iinfo(got), torch.iinfo(declared)
    return have.min < hold.min or have.max > hold.max


def _kind_mismatch(name: str, tensor: torch.Tensor, declared: torch.dtype) -> TypeError:
    """The output's dtype against its declaration, in Triton's words (Triton refuses any
    mismatch; this server casts where no value changes, see :func:`_truncates`)."""
    from torchplace.serve.datatypes import oip_datatype

    def triton(dtype: torch.dtype) -> str:
        return oip_datatype(dtype) or str(dtype).removeprefix("torch.").upper()

    return TypeError(
        f"configuration expects datatype TYPE_{triton(declared)} for output {name!r}, model "
        f"provides TYPE_{triton(tensor.dtype)}; declare the output's datatype as the model "
        "returns it (data_type in config.pbtxt, --output or outputs in config.toml)"
    )
