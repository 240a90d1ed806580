"""Triton's statistics extension for one model version: counts and cumulative nanoseconds.

What :class:`InferStatistics` keeps, as ``GET /v2/models/{m}/stats`` and the gRPC
``ModelStatistics`` report it (Triton's spelling, times in nanoseconds):

=====================  ============================================================
``success`` / ``fail``  requests answered / failed by the engine, and their time in it
``queue``               per request (a chunk of a large request counts as one): arrival
                        to the start of its batch
``compute_input``       per request: its batch's host -> device copy
``compute_infer``       per request: its batch's forward
``compute_output``      per request: its batch's device -> host copy
``batch_stats``         per batch size: executions and the three compute times
``inference_count``     rows answered (Triton counts each row of a batch as an inference)
``execution_count``     batches run
``last_inference``      when the last batch finished, milliseconds since the epoch
=====================  ============================================================

The engine reports requests, the replica pool reports batches (on a replica's worker thread):
both take one short lock. Nothing here depends on Prometheus metrics being on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

__all__ = ["InferStatistics"]

_NS = 1_000_000_000


class InferStatistics:
    """Counts and cumulative nanoseconds of one model version (thread-safe)."""

    __slots__ = (
        "_batches",
        "_counts",
        "_lock",
        "_times",
        "execution_count",
        "inference_count",
        "last_inference_ms",
    )

    _KEYS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self._KEYS, 0)
        self._times = dict.fromkeys(self._KEYS, 0)
        #: batch size -> [executions, compute_input ns, compute_infer ns, compute_output ns]
        self._batches: dict[int, list[int]] = {}
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0

    def request(self, ok: bool, seconds: float) -> None:
        """One request the engine answered (``ok``) or failed, after ``seconds`` in it."""
        key = "success" if ok else "fail"
        with self._lock:
            self._counts[key] += 1
            self._times[key] += int(seconds * _NS)

    def batch(
        self, rows: int, waits: Iterable[float], h2d_s: float, compute_s: float, d2h_s: float
    ) -> None:
        """One batch of ``rows`` rows, with the queue wait of each request in it."""
        stages = (int(h2d_s * _NS), int(compute_s * _NS), int(d2h_s * _NS))
        waited = [int(w * _NS) for w in waits]
        n = len(waited)
        now_ms = int(time.time() * 1000)
        with self._lock:
            counts, times = self._counts, self._times
            counts["queue"] += n
            times["queue"] += sum(waited)
            for key, ns in zip(("compute_input", "compute_infer", "compute_output"), stages):  # noqa: B905
                counts[key] += n
                times[key] += ns * n
            entry = self._batches.get(rows)
            if entry is None:
                entry = self._batches[rows] = [0, 0, 0, 0]
            entry[0] += 1
            entry[1] += stages[0]
            entry[2] += stages[1]
            entry[3] += stages[2]
            self.inference_count += rows
            self.execution_count += 1
            self.last_inference_ms = now_ms

    def snapshot(self, name: str, version: str) -> dict[str, Any]:
        """The ``model_stats`` entry of this version, as Triton's JSON spells it."""
        with self._lock:
            counts, times = dict(self._counts), dict(self._times)
            batches = {size: list(entry) for size, entry in self._batches.items()}
            inferences, executions = self.inference_count, self.execution_count
            last = self.last_inference_ms

        def stat(count: int, ns: int) -> dict[str, int]:
            return {"count": count, "ns": ns}

        inference_stats = {key: stat(counts[key], times[key]) for key in self._KEYS}
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
