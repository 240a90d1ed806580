"""Traces in Triton's JSON trace format (``--trace-format triton``), as Triton's
``trace_summary.py`` reads them.

The file is the server's, not a model version's: every model's traced requests go to the one
``--trace-file``, as Triton writes ``--trace-config triton,file=FILE``. It is a JSON array in
which each traced request has two entries with the same ``id``: one naming its
``model_name``, ``model_version`` (a number when the version is one) and ``request_id`` (the
client's ``id``, when it gave one), and one listing its ``timestamps``, each a ``name`` and a
time in nanoseconds (``ns``, of the same monotonic clock for every entry):

* the front end's: ``HTTP_RECV_START`` (the request's first bytes read), ``HTTP_RECV_END``
  (read whole), ``HTTP_SEND_START`` and ``HTTP_SEND_END`` (its answer written); over gRPC
  ``GRPC_WAITREAD_START`` (the call opened), ``GRPC_WAITREAD_END`` (its message read),
  ``GRPC_SEND_START`` and ``GRPC_SEND_END``. A request whose client went away before its
  answer has no send times; one served without a front end (in process, on Ray, a gRPC
  stream's requests) has none;
* the server's: ``REQUEST_START`` and ``QUEUE_START`` (queued), ``COMPUTE_START`` (its batch
  began), ``COMPUTE_INPUT_END`` (the batch's inputs on the device), ``COMPUTE_OUTPUT_START``
  (the forward done), ``COMPUTE_END`` (the outputs on the host) and ``REQUEST_END``.

With Triton's ``TENSORS`` level a trace also has an entry per input (``activity``
``TENSOR_QUEUE_INPUT``) and per output (``TENSOR_BACKEND_OUTPUT``): its ``tensor``'s
``name``, ``data`` and ``shape`` as comma-separated text and its ``dtype``, as Triton writes
them (BYTES values as a CSV row). Without ``TIMESTAMPS`` a trace has no ``timestamps``.

A request larger than a batch runs as chunks, each traced as a request of its own (with the
request's front-end times).

``log_frequency`` (Triton's trace setting) ``0`` writes the file when the server stops;
``N`` writes every ``N`` traces to ``FILE.0``, ``FILE.1``, ... as they complete (a trace
completes once its answer is sent), off the event loop, and what is left at the stop to the
next one. As in Triton, a ``trace_count`` that runs out writes the traces held to the next
``FILE.N`` as they complete, and a change of the settings writes the traces of the earlier
ones (to ``FILE`` at the stop with ``log_frequency`` 0, else to the next ``FILE.N``);
``FILE`` is only written when some trace goes there. At most ``max_traces`` traces wait to be
written; later ones are counted in :attr:`TraceFile.dropped`.
"""

from __future__ import annotations

import csv
import io
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np
import orjson

from torchplace.serve.datatypes import HOST_DTYPES

__all__ = ["Stamps", "TensorEntry", "TraceFile", "Traced", "monotonic_to_perf", "tensor_entry"]

_HTTP = ("HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END")
_GRPC = ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END")
_NAMES = {"HTTP": _HTTP, "GRPC": _GRPC}


class Stamps:
    """A front end's times of one request (``perf_counter`` seconds): read from ``recv_start``
    to ``recv_end``; its answer sent from ``send_start`` to ``send_end`` (:meth:`sent`), or
    never (:meth:`abandoned`). The trace that holds it is complete once either is called."""

    __slots__ = ("_file", "done", "protocol", "recv_end", "recv_start", "request_id", "send_end",
                 "send_start")  # fmt: skip

    def __init__(
        self, protocol: str, recv_start: float, recv_end: float, request_id: str | None = None
    ) -> None:
        if protocol not in _NAMES:
            raise ValueError(f"protocol {protocol!r} is not one of {sorted(_NAMES)}")
        self.protocol = protocol
        self.request_id = request_id  # the client's id of the request, if it gave one
        self.recv_start, self.recv_end = recv_start, recv_end
        self.send_start: float | None = None
        self.send_end: float | None = None
        self.done = False
        self._file: TraceFile | None = None  # set when a trace holding it is kept

    def sent(self, start: float, end: float) -> None:
        """The answer was written from ``start`` to ``end``: the trace is complete."""
        self.send_start, self.send_end = start, end
        self._complete()

    def abandoned(self) -> None:
        """No answer was sent (the client went away): the trace is complete without one."""
        self._complete()

    def _complete(self) -> None:
        self.done = True
        if self._file is not None:
            self._file.completed()


class TensorEntry(NamedTuple):
    """One tensor of a traced request, as Triton's trace writes it: values and shape as
    comma-separated text."""

    activity: str  # TENSOR_QUEUE_INPUT or TENSOR_BACKEND_OUTPUT
    name: str
    data: str
    shape: str
    dtype: str


def tensor_entry(
    activity: str, name: str, array: np.ndarray[Any, Any], datatype: str | None = None
) -> TensorEntry:
    """``array`` as a trace's tensor; ``datatype``: its declared one (else read from the
    array)."""
    values = array.ravel().tolist()
    if array.dtype.kind == "b":  # as numbers: trace_summary.py reads every value with float()
        values = [int(v) for v in values]
    if array.dtype.kind in "OSU":
        out = io.StringIO()
        csv.writer(out, lineterminator="").writerow(
            v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in values
        )
        data = out.getvalue()
    else:
        data = ",".join(map(str, values))
    shape = ",".join(map(str, array.shape))
    return TensorEntry(activity, name, data, shape, datatype or _datatype(array.dtype))


def _datatype(dtype: np.dtype[Any]) -> str:
    """The OIP datatype of a host array's dtype (the first that maps to it: FP32 before BF16);
    BYTES for anything else (objects, strings)."""
    return next((name for name, host in HOST_DTYPES.items() if host == dtype), "BYTES")


class Traced(NamedTuple):
    """One traced request as its batch saw it (``perf_counter`` seconds)."""

    model: str
    version: str
    arrived: float
    started: float
    input_end: float
    output_start: float
    finished: float
    stamps: Stamps | None
    timestamps: bool = True  # Triton's TIMESTAMPS level: its times are written
    tensors: tuple[TensorEntry, ...] = ()  # its TENSORS level: inputs and outputs


def _complete(trace: Traced) -> bool:
    return trace.stamps is None or trace.stamps.done


class TraceFile:
    """The server's Triton trace file (see the module docstring): one per path, shared by
    every tracer that writes to it (:meth:`open`, :meth:`release`)."""

    _open: ClassVar[dict[Path, TraceFile]] = {}
    _open_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, path: Path, max_traces: int = 100_000) -> None:
        if max_traces < 1:
            raise ValueError(f"max_traces must be at least 1, got {max_traces}")
        self.path = path
        self.max_traces = max_traces
        #: Triton's log_frequency: 0 writes at the stop, N every N traces to PATH.0, PATH.1, ...
        self.log_frequency = 0
        self.dropped = 0
        self._traces: list[tuple[int, Traced]] = []
        self._ready = 0  # how many traces at the head of _traces are complete
        self._flush = 0  # how many at its head go to the next PATH.N once complete
        self._base: list[tuple[int, Traced]] = []  # earlier settings' traces, for PATH
        self._next_id = 1
        self._index = 0  # the next PATH.N
        self._users = 0
        self._lock = threading.Lock()
        self._writer: ThreadPoolExecutor | None = None

    @classmethod
    def open(cls, path: Path | str) -> TraceFile:
        """The trace file at ``path``, shared with the other tracers writing to it."""
        key = Path(path).absolute()
        with cls._open_lock:
            found = cls._open.get(key)
            if found is None:
                found = cls._open[key] = cls(key)
            found._users += 1
            return found

    def release(self) -> None:
        """One tracer is done with the file; the last one writes what is left of it."""
        with self._open_lock:
            self._users -= 1
            if self._users > 0:
                return
            if self._open.get(self.path) is self:
                del self._open[self.path]
        self.close()

    def add(self, traces: Sequence[Traced]) -> None:
        """Keep the traced requests of one batch (any thread), each under a new id."""
        with self._lock:
            room = self.max_traces - len(self._traces) - len(self._base)
            if room < len(traces):
                self.dropped += len(traces) - max(room, 0)
                traces = traces[: max(room, 0)]
            for trace in traces:
                self._traces.append((self._next_id, trace))
                self._next_id += 1
                if trace.stamps is not None:
                    trace.stamps._file = self
        self.completed()

    def spent(self) -> None:
        """A tracer's ``trace_count`` ran out: the traces held go to the next ``PATH.N`` once
        they complete, as Triton writes a count's traces when it is reached."""
        with self._lock:
            self._flush = len(self._traces)
        self.completed()

    def seal(self) -> None:
        """The trace settings changed: the traces held are the earlier settings', written as
        Triton writes them when its settings object goes: to ``PATH`` at the stop
        (``log_frequency`` 0), else to the next ``PATH.N`` once they complete."""
        with self._lock:
            if self.log_frequency:
                self._flush = len(self._traces)
            else:  # what a spent count waits to write stays; the rest is the base file's
                self._base += self._traces[self._flush :]
                del self._traces[self._flush :]
                self._ready = min(self._ready, len(self._traces))
        self.completed()

    def completed(self) -> None:
        """A trace may have completed: write the traces completed in a row at the head
        that a spent count or a settings change asked for, and every ``log_frequency`` of
        them, each group to the next ``PATH.N`` (on a writer thread)."""
        with self._lock:
            traces = self._traces
            while self._ready < len(traces) and _complete(traces[self._ready][1]):
                self._ready += 1
            while True:
                if self._flush and self._ready >= self._flush:
                    count, self._flush = self._flush, 0
                elif 0 < self.log_frequency <= self._ready:
                    count = self.log_frequency
                    self._flush = max(0, self._flush - count)
                else:
                    break
                segment = traces[:count]
                del traces[:count]
                self._ready -= count
                target = self.path.with_name(f"{self.path.name}.{self._index}")
                self._index += 1
                if self._writer is None:
                    self._writer = ThreadPoolExecutor(1, thread_name_prefix="torchplace-trace")
                self._writer.submit(_write, target, segment)

    def close(self) -> None:
        """Write what is held, after the writes already under way: the current traces to
        ``PATH`` (log_frequency 0, with the earlier settings' ones) or to the next ``PATH.N``;
        ``PATH`` only when some trace goes there, as Triton creates it."""
        with self._lock:
            traces, self._traces, self._ready = self._traces, [], 0
            base, self._base = self._base, []
            writer, self._writer = self._writer, None
            index = self._index
        if writer is not None:
            writer.shutdown(wait=True)
        if self.log_frequency == 0:
            base += traces
        elif traces:
            _write(self.path.with_name(f"{self.path.name}.{index}"), traces)
        if base:
            _write(self.path, base)


def _write(path: Path, traces: Sequence[tuple[int, Traced]]) -> None:
    """The traces as Triton's JSON array, one entry a line."""
    with path.open("wb") as out:
        out.write(b"[")
        separator = b"\n"
        for ident, trace in traces:
            for entry in _entries(ident, trace):
                out.write(separator)
                out.write(orjson.dumps(entry))
                separator = b",\n"
        out.write(b"\n]\n")


def _entries(ident: int, trace: Traced) -> Iterator[dict[str, object]]:
    head: dict[str, object] = {
        "id": ident,
        "model_name": trace.model,
        "model_version": int(trace.version) if trace.version.isdigit() else trace.version,
    }
    if trace.stamps is not None and trace.stamps.request_id:
        head["request_id"] = trace.stamps.request_id
    yield head
    if trace.timestamps:
        yield {"id": ident, "timestamps": [{"name": n, "ns": t} for n, t in _timestamps(trace)]}
    for tensor in trace.tensors:
        yield {"id": ident, "activity": tensor.activity, "tensor": {
            "name": tensor.name, "data": tensor.data, "shape": tensor.shape,
            "dtype": tensor.dtype}}  # fmt: skip


def _timestamps(trace: Traced) -> list[tuple[str, int]]:
    """The trace's named times in nanoseconds, in the order they happened."""

    def ns(t: float) -> int:
        return int(t * 1e9)

    stamps = trace.stamps
    front: list[tuple[str, float | None]] = []
    back: list[tuple[str, float | None]] = []
    if stamps is not None:
        names = _NAMES[stamps.protocol]
        front = [(names[0], stamps.recv_start), (names[1], stamps.recv_end)]
        back = [(names[2], stamps.send_start), (names[3], stamps.send_end)]
    core: list[tuple[str, float | None]] = [
        ("REQUEST_START", trace.arrived),
        ("QUEUE_START", trace.arrived),
        ("COMPUTE_START", trace.started),
        ("COMPUTE_INPUT_END", trace.input_end),
        ("COMPUTE_OUTPUT_START", trace.output_start),
        ("COMPUTE_END", trace.finished),
        ("REQUEST_END", trace.finished),
    ]
    return [(name, ns(t)) for name, t in (*front, *core, *back) if t is not None]


def monotonic_to_perf(t: float) -> float:
    """A ``time.monotonic`` reading on the ``perf_counter`` clock the traces use."""
    return t - time.monotonic() + time.perf_counter()
