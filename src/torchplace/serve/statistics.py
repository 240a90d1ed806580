"""Triton's statistics extension for one model version: counts and cumulative nanoseconds.

What :class:`InferStatistics` keeps, as ``GET /v2/models/{m}/stats`` and the gRPC
``ModelStatistics`` report it (Triton's spelling and accounting, times in nanoseconds; see
Triton core's ``InferenceStatsAggregator``):

=====================  ============================================================
``success``             requests answered: arrival to answer (a request split into chunks
                        counts once)
``fail``                requests that were queued and then failed: dropped at their deadline,
                        cancelled, or failed by the model, arrival to failure. A request refused
                        before it was queued (invalid, queue full, not ready) is in no statistic
``queue``               per successful request: arrival to the start of its (first) batch
``compute_input``       per successful request: its batch's host -> device copy (a request
                        split into chunks: the sum over its chunks' batches)
``compute_infer``       per successful request: its batch's forward (likewise)
``compute_output``      per successful request: its batch's device -> host copy (likewise)
``batch_stats``         per batch size: model executions and their three compute times
``inference_count``     rows of the successful requests
``execution_count``     model executions that answered at least one row (a batch split after
                        an out-of-memory error counts each half that ran)
``last_inference``      when the last counted execution finished, milliseconds since the epoch
=====================  ============================================================

Each failed request is also counted under Triton's failure reason (:data:`FAILURE_REASONS`,
the ``reason`` label of its ``nv_inference_request_failure``): ``REJECTED`` (dropped at its
deadline, or over the queue's wait limit), ``CANCELED`` (its client went away), ``BACKEND``
(the model's batch failed: kernel, transfer, out of memory) or ``OTHER``.

So ``queue``, ``compute_*`` and ``success`` always have the same count, as perf_analyzer
expects. The replica pool reports executions once per batch (on a replica's worker thread) and
stamps each request of the batch with the batch's times (one shared tuple); the engine
reports each request once when it settles. Each takes one short lock. Nothing here depends on
Prometheus metrics being on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

__all__ = ["FAILURE_REASONS", "BatchTiming", "InferStatistics", "Timed", "batch_timing"]

_NS = 1_000_000_000
#: Triton's reasons a queued request failed (its metrics' ``reason`` label)
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

#: a batch's (start on the replica in seconds, h2d ns, forward ns, d2h ns), shared by every
#: request in it (see :func:`batch_timing`)
BatchTiming = tuple[float, int, int, int]


def batch_timing(started: float, h2d_s: float, infer_s: float, d2h_s: float) -> BatchTiming:
    """A batch's times as its requests are stamped with them (converted once per batch)."""
    return started, int(h2d_s * _NS), int(infer_s * _NS), int(d2h_s * _NS)


class Timed(Protocol):
    """A queued request (or chunk) as the statistics read it."""

    arrived: float
    rows: int
    timing: BatchTiming | None


class InferStatistics:
    """Counts and cumulative nanoseconds of one model version (thread-safe)."""

    __slots__ = (
        "_batches",
        "_fail",
        "_failures",
        "_lock",
        "_stages",
        "_stamped",
        "_success",
        "execution_count",
        "inference_count",
        "last_inference_ms",
    )

    #: the stages every stamped request adds its times to, in the order of _stages
    _STAGES = ("queue", "compute_input", "compute_infer", "compute_output")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._success = [0, 0]  # requests answered, their ns
        self._fail = [0, 0]  # requests failed after they were queued, their ns
        self._stamped = 0  # successful requests with batch times: the count of every stage
        self._stages = [0, 0, 0, 0]  # ns of each of _STAGES
        self._failures = dict.fromkeys(FAILURE_REASONS, 0)
        #: batch size -> [executions, compute_input ns, compute_infer ns, compute_output ns]
        self._batches: dict[int, list[int]] = {}
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0

    def request(
        self, ok: bool, seconds: float, parts: Sequence[Timed] = (), reason: str = "OTHER"
    ) -> None:
        """One queued request settled: answered (``ok``) or failed (for ``reason``, one of
        :data:`FAILURE_REASONS`), ``seconds`` after it arrived; ``parts`` are its queued chunks
        (one unless it was split), stamped with the times of the batches they ran in. A failed
        request counts in ``fail`` (and its reason) only."""
        if not ok:
            with self._lock:
                self._fail[0] += 1
                self._fail[1] += int(seconds * _NS)
                self._failures[reason] += 1
            return
        if len(parts) == 1:  # the common case, read without the loop
            part = parts[0]
            rows, timing = part.rows, part.timing
            queue_ns = 0 if timing is None else int((timing[0] - part.arrived) * _NS)
        else:
            rows, queue_ns, timing = _summed(parts)
        with self._lock:
            success = self._success
            success[0] += 1
            success[1] += int(seconds * _NS)
            self.inference_count += rows
            if timing is not None:
                self._stamped += 1
                stages = self._stages
                stages[0] += max(queue_ns, 0)
                stages[1] += timing[1]
                stages[2] += timing[2]
                stages[3] += timing[3]

    def executions(self, runs: Iterable[tuple[int, float, float, float]]) -> None:
        """Model executions that answered rows: (rows, h2d s, forward s, d2h s) each."""
        now_ms = int(time.time() * 1000)
        with self._lock:
            counted = False
            for rows, h2d, infer, d2h in runs:
                counted = True
                entry = self._batches.get(rows)
                if entry is None:
                    entry = self._batches[rows] = [0, 0, 0, 0]
                entry[0] += 1
                entry[1] += int(h2d * _NS)
                entry[2] += int(infer * _NS)
                entry[3] += int(d2h * _NS)
                self.execution_count += 1
            if counted and now_ms > self.last_inference_ms:
                self.last_inference_ms = now_ms

    def failures(self) -> dict[str, int]:
        """The failed requests by reason (:data:`FAILURE_REASONS`, every one present)."""
        with self._lock:
            return dict(self._failures)

    def snapshot(self, name: str, version: str) -> dict[str, Any]:
        """The ``model_stats`` entry of this version, as Triton's JSON spells it."""

        def stat(count: int, ns: int) -> dict[str, int]:
            return {"count": count, "ns": ns}

        with self._lock:
            inference_stats = {"success": stat(*self._success), "fail": stat(*self._fail)}
            for key, ns in zip(self._STAGES, self._stages, strict=True):
                inference_stats[key] = stat(self._stamped, ns)
            batches = {size: list(entry) for size, entry in self._batches.items()}
            inferences, executions = self.inference_count, self.execution_count
            last = self.last_inference_ms
        inference_stats["cache_hit"] = stat(0, 0)
        inference_stats["cache_miss"] = stat(0, 0)
        return {
            "name": name,
            "version": version,
            "last_inference": last,
            "inference_count": inferences,
            "execution_count": executions,
            "inference_stats": inference_stats,
            "response_stats": {},  # per response of a decoupled model: none here
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": stat(entry[0], entry[1]),
                    "compute_infer": stat(entry[0], entry[2]),
                    "compute_output": stat(entry[0], entry[3]),
                }
                for size, entry in sorted(batches.items())
            ],
            "memory_usage": [],
        }


def _summed(parts: Sequence[Timed]) -> tuple[int, int, BatchTiming | None]:
    """The rows of a request's chunks, the nanoseconds from its earliest arrival to its first
    batch's start, and the batch times of its chunks summed (the start: the first); None for
    the times when no chunk ran."""
    rows = 0
    arrived = first = float("inf")
    h2d_ns = infer_ns = d2h_ns = 0
    for part in parts:
        rows += part.rows
        arrived = min(arrived, part.arrived)
        if part.timing is not None:
            started, h2d, infer, d2h = part.timing
            first = min(first, started)
            h2d_ns += h2d
            infer_ns += infer
            d2h_ns += d2h
    if first == float("inf"):
        return rows, 0, None
    return rows, int((first - arrived) * _NS), (first, h2d_ns, infer_ns, d2h_ns)
