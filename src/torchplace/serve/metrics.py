"""Prometheus metrics of one engine, in its own registry.

Every series carries ``model``, ``version`` and ``device`` (the full device, ``cuda:1`` not
``cuda``). Series (base units, ``torchplace_`` prefix):

=====================================================  =========  ==============================
name                                                   type       extra labels
=====================================================  =========  ==============================
``torchplace_requests_total``                          counter    ``status`` (HTTP code)
``torchplace_request_duration_seconds``                histogram
``torchplace_stage_duration_seconds``                  histogram  ``stage``: queue|h2d|compute|d2h
``torchplace_batch_size``                              histogram  (rows per batch)
``torchplace_queue_depth``                             gauge      (requests waiting)
``torchplace_device_memory_allocated_bytes``           gauge      (accelerators only)
``torchplace_device_memory_reserved_bytes``            gauge      (accelerators only)
``torchplace_errors_total``                            counter    ``class``
``torchplace_oom_splits_total``                        counter    (batches split after an OOM)
``torchplace_replica_ready``                           gauge      ``replica``
=====================================================  =========  ==============================

``class`` is one of ``input``, ``overload`` (refused: queue full or over the wait limit),
``not_ready``, ``deadline`` (dropped from the queue when its deadline passed, never run: its
``timeout`` parameter's, the server default's, or ``--request-timeout``'s),
``cancelled`` (dropped from the queue when its client went away, never run), ``oom``,
``transfer``, ``kernel``.
No series has a ``_created`` sample (prometheus-client adds one to every counter and histogram
it owns; these are exposed through a collector that gives none): it would double what a scraper
stores and tell no one anything. The hot path only touches pre-bound children: the histograms
and the counters are plain bucket arrays and integers (one ``bisect`` and one uncontended lock
per observation, one lock per batch for the per-request queue waits; a finished request's
status and duration are two list appends, folded into their counts at scrape time or every
:data:`FOLD_AT` requests), exposed through a prometheus-client collector at scrape time;
gauges that describe state (queue depth, memory, readiness) are read at scrape time too.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

__all__ = [
    "ERROR_CLASSES",
    "STAGES",
    "DeviceMetrics",
    "FastCounter",
    "FastHistogram",
    "ReplicaState",
    "ServeMetrics",
    "merged_text",
]

STAGES = ("queue", "h2d", "compute", "d2h")
ERROR_CLASSES = (
    "input",
    "overload",
    "not_ready",
    "deadline",
    "cancelled",
    "oom",
    "transfer",
    "kernel",
)

_LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


#: finished requests kept before they are folded into the counts (two appends each)
FOLD_AT = 4096


@dataclass(frozen=True)
class ReplicaState:
    """What the scrape-time collector reads about one replica."""

    name: str
    device: str
    ready: bool


class FastHistogram:
    """A Prometheus histogram as a bucket array: cheap enough for every request."""

    __slots__ = ("_lock", "bounds", "counts", "total")

    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = (*sorted(buckets), math.inf)
        self.counts = [0] * len(self.bounds)
        self.total = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        """Record one value (``le`` buckets: the first bound >= value)."""
        index = bisect_left(self.bounds, value)
        with self._lock:
            self.counts[index] += 1
            self.total += value

    def observe_many(self, values: Iterable[float]) -> None:
        """Record several values under one lock."""
        bounds = self.bounds
        with self._lock:
            counts = self.counts
            total = 0.0
            for value in values:
                counts[bisect_left(bounds, value)] += 1
                total += value
            self.total += total

    def snapshot(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative ``(le, count)`` pairs and the sum, as the exposition wants them."""
        with self._lock:
            counts = list(self.counts)
            total = self.total
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, count in zip(self.bounds, counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == math.inf else repr(float(bound)), float(cumulative)))
        return buckets, total


class FastCounter:
    """A monotonic counter: an integer under a lock, exposed at scrape time."""

    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def inc(self, amount: int = 1) -> None:
        """Add ``amount`` (>= 0)."""
        with self._lock:
            self.value += amount


class DeviceMetrics:
    """Every series bound to one device: what the hot path updates."""

    def __init__(self, parent: ServeMetrics, device: str) -> None:
        self.device = device
        self.queue = FastHistogram(_LATENCY_BUCKETS)
        self.h2d = FastHistogram(_LATENCY_BUCKETS)
        self.compute = FastHistogram(_LATENCY_BUCKETS)
        self.d2h = FastHistogram(_LATENCY_BUCKETS)
        self.batch_size = FastHistogram(parent.batch_buckets)
        self.duration = FastHistogram(_LATENCY_BUCKETS)
        self.errors = {cls: FastCounter() for cls in ERROR_CLASSES}
        self.oom_splits = FastCounter()
        self.by_status: Counter[int] = Counter()  # guarded by the duration histogram's lock
        # finished requests not yet counted (see request); appended on the event loop only
        self._statuses: list[int] = []
        self._seconds: list[float] = []

    def request(self, status: int, seconds: float) -> None:
        """Count one finished request: two appends, folded into ``by_status`` and the
        duration histogram by :meth:`requests` (a scrape) or once :data:`FOLD_AT` wait, where
        a bucket search under a lock per request cost about three times as much. Called on the
        event loop, as :meth:`requests` is."""
        self._statuses.append(status)
        self._seconds.append(seconds)
        if len(self._seconds) >= FOLD_AT:
            self._fold()

    def requests(self) -> tuple[list[tuple[int, int]], list[tuple[str, float]], float]:
        """The finished requests so far: ``(status, count)`` pairs, then the duration
        histogram's cumulative buckets and sum."""
        self._fold()
        with self.duration._lock:
            by_status = sorted(self.by_status.items())
        buckets, total = self.duration.snapshot()
        return by_status, buckets, total

    def _fold(self) -> None:
        statuses, seconds = self._statuses, self._seconds
        if not seconds:
            return
        self._statuses, self._seconds = [], []
        self.duration.observe_many(seconds)
        with self.duration._lock:
            self.by_status.update(statuses)

    def stages(self) -> tuple[tuple[str, FastHistogram], ...]:
        """The stage histograms by stage name."""
        return (
            ("queue", self.queue),
            ("h2d", self.h2d),
            ("compute", self.compute),
            ("d2h", self.d2h),
        )


class ServeMetrics:
    """The registry of one engine and its series."""

    def __init__(
        self,
        model: str,
        version: str,
        *,
        max_batch_size: int = 32,
        queue_depth: Callable[[], int] | None = None,
        queue_device: str = "",
        replicas: Callable[[], Sequence[ReplicaState]] | None = None,
        memory: Callable[[str], tuple[int, int] | None] | None = None,
        devices: Iterable[str] = (),
    ) -> None:
        self.model = model
        self.version = version
        self.registry = CollectorRegistry(auto_describe=True)
        self.batch_buckets = tuple(
            float(b)
            for b in sorted({2**i for i in range(max_batch_size.bit_length())} | {max_batch_size})
        )
        self._devices: dict[str, DeviceMetrics] = {}
        for device in devices:
            self.device(device)
        self.registry.register(_StateCollector(self, queue_depth, queue_device, replicas, memory))

    def device(self, device: str) -> DeviceMetrics:
        """The pre-bound children of ``device`` (created on first use)."""
        bound = self._devices.get(device)
        if bound is None:
            bound = self._devices[device] = DeviceMetrics(self, device)
        return bound

    def bound(self) -> list[DeviceMetrics]:
        """Every device's children."""
        return list(self._devices.values())

    def text(self) -> bytes:
        """The Prometheus text exposition of every series."""
        return generate_latest(self.registry)


class _StateCollector(Collector):
    def __init__(
        self,
        parent: ServeMetrics,
        queue_depth: Callable[[], int] | None,
        queue_device: str,
        replicas: Callable[[], Sequence[ReplicaState]] | None,
        memory: Callable[[str], tuple[int, int] | None] | None,
    ) -> None:
        self._parent = parent
        self._queue_depth = queue_depth
        self._queue_device = queue_device
        self._replicas = replicas
        self._memory = memory

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._hot_series()
        yield from self._state_series()

    def _hot_series(self) -> Iterator[Metric]:
        model, version = self._parent.model, self._parent.version
        labels = ["model", "version", "device"]
        requests = CounterMetricFamily(
            "torchplace_requests",
            "Requests answered, by HTTP status code.",
            labels=[*labels, "status"],
        )
        duration = HistogramMetricFamily(
            "torchplace_request_duration_seconds",
            "Time from request decode to answer, in seconds.",
            labels=labels,
        )
        stages = HistogramMetricFamily(
            "torchplace_stage_duration_seconds",
            "Time per stage: queue (per request); h2d, compute, d2h (per batch; CUDA events on "
            "CUDA).",
            labels=[*labels, "stage"],
        )
        batch = HistogramMetricFamily(
            "torchplace_batch_size", "Rows per batch run on a replica.", labels=labels
        )
        splits = CounterMetricFamily(
            "torchplace_oom_splits",
            "Batches split in halves and retried after a device out-of-memory error.",
            labels=labels,
        )
        errors = CounterMetricFamily(
            "torchplace_errors",
            "Failed requests by error class (" + ", ".join(ERROR_CLASSES) + ").",
            labels=[*labels, "class"],
        )
        for bound in self._parent.bound():
            key = [model, version, bound.device]
            by_status, buckets, total = bound.requests()
            for status, count in by_status:
                requests.add_metric([*key, str(status)], float(count))
            duration.add_metric(key, buckets, total)
            for name, histogram in bound.stages():
                buckets, total = histogram.snapshot()
                stages.add_metric([*key, name], buckets, total)
            buckets, total = bound.batch_size.snapshot()
            batch.add_metric(key, buckets, total)
            for cls, counter in bound.errors.items():
                errors.add_metric([*key, cls], float(counter.value))
            splits.add_metric(key, float(bound.oom_splits.value))
        yield requests
        yield duration
        yield stages
        yield batch
        yield errors
        yield splits

    def _state_series(self) -> Iterator[Metric]:
        model, version = self._parent.model, self._parent.version
        labels = ["model", "version", "device"]
        depth = GaugeMetricFamily(
            "torchplace_queue_depth", "Requests waiting for a replica.", labels=labels
        )
        if self._queue_depth is not None:
            depth.add_metric([model, version, self._queue_device], float(self._queue_depth()))
        yield depth
        ready = GaugeMetricFamily(
            "torchplace_replica_ready",
            "1 when the replica takes traffic (weights on device, dry run passed, healthy).",
            labels=[*labels, "replica"],
        )
        allocated = GaugeMetricFamily(
            "torchplace_device_memory_allocated_bytes",
            "Device memory held by tensors (torch caching allocator).",
            labels=labels,
        )
        reserved = GaugeMetricFamily(
            "torchplace_device_memory_reserved_bytes",
            "Device memory reserved by the torch caching allocator.",
            labels=labels,
        )
        states = list(self._replicas()) if self._replicas is not None else []
        seen: set[str] = set()
        for state in states:
            ready.add_metric([model, version, state.device, state.name], float(state.ready))
            if state.device in seen or self._memory is None:
                continue
            seen.add(state.device)
            memory = self._memory(state.device)
            if memory is not None:
                allocated.add_metric([model, version, state.device], float(memory[0]))
                reserved.add_metric([model, version, state.device], float(memory[1]))
        yield ready
        yield allocated
        yield reserved


class _Merged:
    """The series of several engines' registries as one exposition: each family once, with
    the samples of every model version (they differ by their ``model``/``version`` labels)."""

    def __init__(self, registries: Sequence[CollectorRegistry]) -> None:
        self.registries = registries

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for registry in self.registries:
            for family in registry.collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                merged.samples.extend(family.samples)
        yield from families.values()


def merged_text(engines: Iterable[object]) -> bytes:
    """The Prometheus text of several engines (those without a registry are left out)."""
    registries = [
        registry
        for registry in (getattr(getattr(e, "metrics", None), "registry", None) for e in engines)
        if isinstance(registry, CollectorRegistry)
    ]
    return generate_latest(_Merged(registries))
