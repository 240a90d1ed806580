"""Spans per request and per stage: OpenTelemetry and/or a Chrome/Perfetto trace file.

Spans are recorded after the fact, by the replica's worker thread once a batch is done, from
timestamps the hot path takes anyway; when tracing is off nothing is recorded at all.

* **Chrome trace** (``trace_file``): the JSON "Trace Event Format" that ``chrome://tracing`` and
  https://ui.perfetto.dev open. One track per replica with a ``batch`` slice and its ``h2d``,
  ``compute`` and ``d2h`` slices (and, on CUDA, a ``sync`` slice: the host waiting for them); every request as an async ``request`` slice with a nested
  ``queue`` slice. The hot path appends ONE compact record per batch; the JSON events are built
  when the file is written (:meth:`Tracer.close`, at shutdown). At most ``max_events`` events
  are kept; later batches are counted in ``dropped``.
* **Triton's JSON trace** (``trace_file`` with ``trace_format="triton"``): the server's one
  file, every model's requests with Triton's timestamps (and, at its ``TENSORS`` level, their
  tensors), written by :class:`~torchplace.serve.triton_trace.TraceFile`, also every
  ``log_frequency`` traces. Front ends time each request only while it is traced so.
* **OpenTelemetry** (extra ``trace``): used when ``opentelemetry`` is importable *and* the
  application installed an SDK tracer provider (``trace.set_tracer_provider(...)``, or
  ``opentelemetry-instrument``); without a provider there is nowhere to export to, so no span
  objects are built. Each request gives a ``torchplace.infer`` span (attributes: device, rows,
  batch rows, status, ``torchplace.queue_seconds``); each batch a ``torchplace.batch`` span,
  linked to its requests, with ``h2d``, ``compute``, ``d2h`` (and ``sync``) children.

  **Joining the caller's trace.** A request handled while :data:`CALLER` holds a trace
  context (set from :func:`caller_context`: Ray Serve's request span, or a W3C ``traceparent``
  header) gets its ``torchplace.infer`` span as a child of that context, with children of its
  own: ``queue`` (arrival to batch start) and the ``h2d``, ``compute``, ``d2h`` (and ``sync``)
  of the batch it ran in, so the caller's trace shows every stage of its request. The
  tracer provider's sampler decides as for any child span (an unsampled parent records
  nothing).

On CUDA the h2d/compute/d2h durations are device times measured with CUDA events; the slices are
laid out back to back ending when the batch's results reached the host.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from torchplace.serve.triton_trace import (
    Stamps,
    TensorEntry,
    Traced,
    TraceFile,
    tensor_entry,
)

__all__ = ["CALLER", "TRACE_FORMATS", "BatchRecord", "Tracer", "caller_context", "exports_spans"]

#: the trace file formats: Chrome's Trace Event Format, Triton's JSON trace
TRACE_FORMATS: tuple[str, ...] = ("chrome", "triton")


class BatchRecord(NamedTuple):
    """One finished batch as the hot path records it (times are ``perf_counter`` seconds)."""

    replica: str
    device: str
    arrivals: Sequence[float]  # per request
    rows: Sequence[int]  # per request
    statuses: Sequence[int] | None  # per request; None = every request answered 200
    started: float
    finished: float
    h2d: float
    compute: float
    d2h: float
    sync: float = 0.0  # host seconds spent waiting for the device (CUDA); 0 = no wait
    #: per request: the caller's OpenTelemetry context its spans join (None: a root span)
    parents: Sequence[Any] | None = None
    #: per request: its front end's times (:class:`~torchplace.serve.triton_trace.Stamps`),
    #: for Triton's trace format; None: no request has them
    stamps: Sequence[Stamps | None] | None = None
    #: per request, while Triton's TENSORS level is on: its inputs, and its outputs (or error)
    inputs: Sequence[Mapping[str, Any]] | None = None
    outputs: Sequence[Any] | None = None


#: The caller's OpenTelemetry context for the requests submitted in this task (None: none)
CALLER: ContextVar[Any] = ContextVar("torchplace_trace_caller", default=None)


def caller_context(headers: Mapping[str, str] | None = None) -> Any:
    """The OpenTelemetry context a request's spans should join, or None.

    The current context when it holds a valid span (Ray Serve's request span, or any
    instrumentation around the caller), else the W3C trace context of ``headers``
    (``traceparent``, ``tracestate``; names in lower case), else None. None as well without
    ``opentelemetry`` installed.
    """
    found = _propagation()
    if found is None:
        return None
    context, trace, propagator = found
    current = context.get_current()
    if trace.get_current_span(current).get_span_context().is_valid:
        return current
    if headers is None or "traceparent" not in headers:
        return None
    reading = _READING_HEADERS.set(True)
    try:
        carried = propagator.extract(carrier=headers)
    finally:
        _READING_HEADERS.reset(reading)
    return carried if trace.get_current_span(carried).get_span_context().is_valid else None


#: true while a request's trace headers are read (see :class:`_HeaderWarnings`)
_READING_HEADERS: ContextVar[bool] = ContextVar("torchplace_reading_trace_headers", default=False)
#: the loggers OpenTelemetry's W3C propagator warns on about a header it drops
_PROPAGATION_LOGGERS = ("opentelemetry.trace.propagation.tracecontext", "opentelemetry.trace.span")


class _HeaderWarnings(logging.Filter):
    """Drops what OpenTelemetry logs about a request's trace headers while they are read (a
    traceparent or tracestate too long, a tracestate member malformed: the header is dropped,
    and the request joins no trace or keeps no state). Those are the client's headers, not the
    server's state: logged, each such request wrote a line to the server's log, and a client
    could fill it at the rate it sends requests. Outside that read nothing is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _READING_HEADERS.get()


@functools.cache
def _propagation() -> tuple[Any, Any, Any] | None:
    """OpenTelemetry's context and trace modules and a W3C propagator, imported once (this
    runs per request that carries a ``traceparent``); None without ``opentelemetry``."""
    try:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    quiet = _HeaderWarnings()
    for name in _PROPAGATION_LOGGERS:
        logging.getLogger(name).addFilter(quiet)
    return context, trace, TraceContextTextMapPropagator()


def _otel_tracer() -> Any:
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return trace.get_tracer("torchplace.serve")


def exports_spans() -> bool:
    """Whether this process exports OpenTelemetry spans (an SDK tracer provider is set)."""
    return _otel_tracer() is not None


class Tracer:
    """Records request and stage spans for one engine."""

    def __init__(
        self,
        *,
        model: str,
        version: str,
        trace_file: Path | str | None = None,
        otel: bool | None = None,
        max_events: int = 500_000,
        trace_format: str = "chrome",
        datatypes: Mapping[str, str] | None = None,
    ) -> None:
        if trace_format not in TRACE_FORMATS:
            raise ValueError(f"trace_format {trace_format!r} is not one of {TRACE_FORMATS}")
        self.model = model
        self.version = version
        self.trace_file = Path(trace_file) if trace_file is not None else None
        self.max_events = max_events
        #: the server's Triton trace file, shared with the other models' tracers
        self._file = (
            TraceFile.open(self.trace_file)
            if trace_format == "triton" and self.trace_file is not None
            else None
        )
        #: whether it writes Triton's format: front ends give each request's times
        #: (:class:`Stamps`) while it is enabled; ``log_frequency`` and ``TENSORS`` apply
        self.triton_format = self._file is not None
        #: the declared datatype of each input and output, by name (tensors in a trace)
        self.datatypes = dict(datatypes or {})
        #: Triton's trace levels: the times of each request, its tensors (Triton's format)
        self.timestamps = True
        self.tensors = False
        self._otel = _otel_tracer() if otel is not False else None
        if otel and self._otel is None:
            from opentelemetry import trace

            self._otel = trace.get_tracer("torchplace.serve")
        self._records: list[BatchRecord] = []
        self._budget = max_events
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self._epoch_offset_ns = time.time_ns() - time.perf_counter_ns()
        #: whether spans have somewhere to go (a trace file, an OpenTelemetry SDK)
        self.can_record = self._otel is not None or self.trace_file is not None
        #: whether batches are recorded now (the pool reads it per batch)
        self.enabled = self.can_record
        #: Triton's trace settings (see configure): one request in ``rate``, ``count`` more
        self.rate = 1
        self.count = -1
        self._seen = 0
        self.dropped = 0

    @property
    def exports_spans(self) -> bool:
        """Whether spans go to OpenTelemetry."""
        return self._otel is not None

    def configure(
        self,
        *,
        on: bool,
        rate: int = 1,
        count: int = -1,
        log_frequency: int = 0,
        tensors: bool = False,
    ) -> None:
        """Triton's trace settings (:mod:`torchplace.serve.trace_settings`; on the loop):
        record the times (``on``) and the tensors (``tensors``, in Triton's format) of the
        batches that hold one request in ``rate``, ``count`` more requests (-1: no limit),
        where :attr:`can_record`; a Triton trace file is written every ``log_frequency``
        traces (0: when the server stops)."""
        self.rate, self.count = rate, count
        self.timestamps = on
        self.tensors = tensors and self._file is not None
        self.enabled = self.can_record and (on or self.tensors) and count != 0
        if self._file is not None:
            self._file.log_frequency = log_frequency

    def seal(self) -> None:
        """The trace settings changed (Triton's trace extension): a Triton trace file writes
        the traces of the earlier ones apart (see :meth:`TraceFile.seal`)."""
        if self._file is not None:
            self._file.seal()

    def batch(self, record: BatchRecord) -> None:
        """Record one finished batch and the requests it answered (worker thread), when it
        holds one request in :attr:`rate` and :attr:`count` is not spent."""
        if self.rate > 1 or self.count >= 0:
            requests = len(record.arrivals)
            seen, self._seen = self._seen, self._seen + requests
            if (seen + requests) // self.rate == seen // self.rate:
                return  # no request of this batch is one in rate
            if self.count >= 0:
                self.count = max(0, self.count - requests)
                if not self.count:
                    self.enabled = False
        if self._file is not None:
            self._file.add(self._traced(record))
            if not self.count:
                self._file.spent()
        elif self.trace_file is not None:
            cost = 4 + 4 * len(record.arrivals)
            with self._lock:
                if cost > self._budget:
                    self.dropped += 1
                else:
                    self._budget -= cost
                    self._records.append(record)
        if self._otel is not None:
            self._spans(record)

    def _traced(self, record: BatchRecord) -> list[Traced]:
        """The batch's requests as Triton's trace format records them."""
        _, (_, input_end, _), (_, output_start, _), *_ = _stage_bounds(record)
        stamps = record.stamps or [None] * len(record.arrivals)
        return [
            Traced(self.model, self.version, arrived, record.started, input_end, output_start,
                   record.finished, stamps[i], self.timestamps, self._tensors(record, i))
            for i, arrived in enumerate(record.arrivals)
        ]  # fmt: skip

    def _tensors(self, record: BatchRecord, i: int) -> tuple[TensorEntry, ...]:
        """The request's inputs and outputs as Triton's trace writes them (as text now: the
        arrays may be the batch's buffers, used again by the next one)."""
        found: list[TensorEntry] = []
        for activity, tensors in (
            ("TENSOR_QUEUE_INPUT", record.inputs),
            ("TENSOR_BACKEND_OUTPUT", record.outputs),
        ):
            arrays = tensors[i] if tensors is not None else None
            if isinstance(arrays, Mapping):  # not a failed request's error
                found += (tensor_entry(activity, name, array, self.datatypes.get(name))
                          for name, array in arrays.items())  # fmt: skip
        return tuple(found)

    # ------------------------------------------------------------------ Chrome trace
    def events(self) -> list[dict[str, Any]]:
        """The Chrome trace events of every recorded batch."""
        return list(self._iter_events())

    def _iter_events(self) -> Iterator[dict[str, Any]]:
        with self._lock:
            records = list(self._records)
        t0 = self._t0

        def us(t: float) -> float:
            return round((t - t0) * 1e6, 3)

        yield {
            "ph": "M",
            "pid": 1,
            "name": "process_name",
            "args": {"name": f"torchplace serve {self.model} v{self.version}"},
        }
        tracks: dict[str, int] = {}
        ident = 0
        for rec in records:
            tid = tracks.get(rec.replica)
            if tid is None:
                tid = tracks[rec.replica] = len(tracks) + 1
                yield {
                    "ph": "M",
                    "pid": 1,
                    "tid": tid,
                    "name": "thread_name",
                    "args": {"name": f"replica {rec.replica}"},
                }
            total_rows = sum(rec.rows)
            start, end = us(rec.started), us(rec.finished)
            yield {
                "ph": "X",
                "pid": 1,
                "tid": tid,
                "name": "batch",
                "ts": start,
                "dur": max(end - start, 0.0),
                "args": {"rows": total_rows, "device": rec.device},
            }
            for name, lo, hi in _stage_bounds(rec):
                yield {
                    "ph": "X",
                    "pid": 1,
                    "tid": tid,
                    "name": name,
                    "ts": us(lo),
                    "dur": max(us(hi) - us(lo), 0.0),
                }
            for i, arrived in enumerate(rec.arrivals):
                ident += 1
                status = 200 if rec.statuses is None else rec.statuses[i]
                args = {"rows": rec.rows[i], "status": status, "device": rec.device}
                yield from _request_events(ident, us(arrived), start, end, args)

    def write(self, path: Path | str | None = None) -> Path | None:
        """Write the Chrome trace JSON (to ``trace_file`` unless ``path`` is given); None in
        Triton's format, whose file is the server's (written as its tracers close)."""
        target = Path(path) if path is not None else self.trace_file
        if target is None or self._file is not None:
            return None
        other = {"model": self.model, "version": self.version, "dropped_batches": self.dropped}
        # streamed event by event: only the compact per-batch records are held in memory
        with target.open("wb") as out:
            out.write(b'{"displayTimeUnit":"ms","otherData":')
            out.write(orjson.dumps(other))
            out.write(b',"traceEvents":[\n')
            separator = b""
            for event in self._iter_events():
                out.write(separator)
                out.write(orjson.dumps(event))
                separator = b",\n"
            out.write(b"\n]}\n")
        return target

    def close(self) -> None:
        """Flush: write the trace file if one was asked for (Triton's: once its last tracer
        closes)."""
        if self._file is not None:
            file, self._file = self._file, None
            file.release()
            return
        self.write()

    # ------------------------------------------------------------------ OpenTelemetry
    def _ns(self, t: float) -> int:
        return int(t * 1e9) + self._epoch_offset_ns

    def _spans(self, rec: BatchRecord) -> None:
        from opentelemetry import trace

        tracer: Any = self._otel
        ns = self._ns
        total_rows = sum(rec.rows)
        links = []
        stages = _stage_bounds(rec)
        for i, arrived in enumerate(rec.arrivals):
            status = 200 if rec.statuses is None else rec.statuses[i]
            parent = rec.parents[i] if rec.parents is not None else None
            span = tracer.start_span(
                "torchplace.infer",
                context=parent,
                start_time=ns(arrived),
                attributes={
                    "torchplace.model": self.model,
                    "torchplace.version": self.version,
                    "torchplace.device": rec.device,
                    "torchplace.rows": rec.rows[i],
                    "torchplace.batch_rows": total_rows,
                    "torchplace.queue_seconds": rec.started - arrived,
                    "http.response.status_code": status,
                },
            )
            if status >= 500:
                span.set_status(trace.Status(trace.StatusCode.ERROR))
            if parent is not None and span.is_recording():
                own = trace.set_span_in_context(span)
                self._children(own, (("queue", arrived, rec.started), *stages), rec.device)
            span.end(end_time=ns(rec.finished))
            links.append(trace.Link(span.get_span_context()))
        batch = tracer.start_span(
            "torchplace.batch",
            start_time=ns(rec.started),
            links=links,
            attributes={
                "torchplace.device": rec.device,
                "torchplace.replica": rec.replica,
                "torchplace.batch_rows": total_rows,
            },
        )
        self._children(trace.set_span_in_context(batch), stages, rec.device)
        batch.end(end_time=ns(rec.finished))

    def _children(
        self, context: Any, stages: Sequence[tuple[str, float, float]], device: str
    ) -> None:
        """One span per stage, children of the span in ``context``."""
        tracer: Any = self._otel
        attributes = {"torchplace.device": device}
        for name, lo, hi in stages:
            child = tracer.start_span(
                name, context=context, start_time=self._ns(lo), attributes=attributes
            )
            child.end(end_time=self._ns(hi))


def _stage_bounds(rec: BatchRecord) -> tuple[tuple[str, float, float], ...]:
    start = max(rec.started, rec.finished - (rec.h2d + rec.compute + rec.d2h))
    h2d_end = start + rec.h2d
    compute_end = h2d_end + rec.compute
    d2h_end = compute_end + rec.d2h
    stages = (
        ("h2d", start, h2d_end),
        ("compute", h2d_end, compute_end),
        ("d2h", compute_end, d2h_end),
    )
    if rec.sync <= 0:
        return stages
    # the host's wait for the device ends when the device's last stage (the D2H) does
    return (*stages, ("sync", max(rec.started, d2h_end - rec.sync), d2h_end))


def _request_events(
    ident: int, begin: float, start: float, end: float, args: dict[str, Any]
) -> Iterator[dict[str, Any]]:
    """One request as async events: ``request`` from arrival to answer, ``queue`` inside it
    until its batch started."""
    base = {"cat": "request", "id": ident, "pid": 1}
    yield {"ph": "b", **base, "name": "request", "ts": begin, "args": args}
    yield {"ph": "b", **base, "name": "queue", "ts": begin}
    yield {"ph": "e", **base, "name": "queue", "ts": start}
    yield {"ph": "e", **base, "name": "request", "ts": end}
