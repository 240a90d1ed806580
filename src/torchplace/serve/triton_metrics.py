"""Triton's Prometheus series (``nv_inference_*``), read from each model version's statistics.

Dashboards, alerts and autoscalers written for Triton (its Grafana dashboards, a KEDA or HPA
rule on ``nv_inference_queue_duration_us`` or ``nv_inference_pending_request_count``, Model
Analyzer) query these names. ``/metrics`` gives them after torchplace's own series, as Triton
writes them: the same names, types, help texts and units (counters without ``_total``, times
in cumulative microseconds), labelled ``model`` and ``version``. They come from the numbers of
Triton's statistics extension (:class:`~torchplace.serve.statistics.InferStatistics`) and the
queue, read at scrape time: nothing is added to the request path.

=============================================  ==========================================
``nv_inference_request_success``               requests answered
``nv_inference_request_failure{reason}``        queued requests that failed, by Triton's
                                                reason: ``REJECTED``, ``CANCELED``,
                                                ``BACKEND``, ``OTHER``
``nv_inference_count``                          rows of the requests answered
``nv_inference_exec_count``                     model executions (batches)
``nv_inference_request_duration_us``            answered requests, arrival to answer
``nv_inference_queue_duration_us``              their time queued
``nv_inference_compute_input_duration_us``      their batches' host to device copies
``nv_inference_compute_infer_duration_us``      their batches' forwards
``nv_inference_compute_output_duration_us``     their batches' device to host copies
``nv_inference_pending_request_count``          requests waiting for a replica (a gauge)
=============================================  ==========================================

A model on a GPU is not split by ``gpu_uuid`` as in Triton: sum over that label in queries
meant for both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["family", "triton_text"]

#: (name, Triton's help, the value from a version's statistics document)
_COUNTERS: tuple[tuple[str, str, Callable[[dict[str, Any]], int]], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     lambda doc: doc["inference_stats"]["success"]["count"]),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     lambda doc: doc["inference_count"]),
    ("nv_inference_exec_count",
     "Number of model executions performed (does not include cached requests)",
     lambda doc: doc["execution_count"]),
    ("nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds (includes cached requests)",
     lambda doc: doc["inference_stats"]["success"]["ns"] // 1000),
    ("nv_inference_queue_duration_us",
     "Cumulative inference queuing duration in microseconds (includes cached requests)",
     lambda doc: doc["inference_stats"]["queue"]["ns"] // 1000),
    ("nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)",
     lambda doc: doc["inference_stats"]["compute_input"]["ns"] // 1000),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds (does not include cached "
     "requests)",
     lambda doc: doc["inference_stats"]["compute_infer"]["ns"] // 1000),
    ("nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds (does not include cached "
     "requests)",
     lambda doc: doc["inference_stats"]["compute_output"]["ns"] // 1000),
)  # fmt: skip
_FAILURE = ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes")
_PENDING = (
    "nv_inference_pending_request_count",
    "Instantaneous number of pending requests awaiting execution per-model.",
)


def triton_text(engines: Iterable[Any]) -> bytes:
    """The ``nv_inference_*`` families of the engines that keep statistics, in Prometheus'
    text format (every sample of a family together, under one HELP and TYPE)."""
    versions = []
    for engine in engines:
        statistics = getattr(engine, "statistics", None)
        if statistics is None:
            continue
        labels = f'model="{_escaped(engine.name)}",version="{_escaped(engine.version)}"'
        depth = getattr(engine, "queue_depth", None)
        versions.append(
            (
                labels,
                statistics.snapshot(engine.name, engine.version),
                statistics.failures(),
                depth() if callable(depth) else 0,
            )
        )
    if not versions:
        return b""
    name, help_text, value = _COUNTERS[0]
    lines = [family(name, help_text, "counter", [(v[0], value(v[1])) for v in versions])]
    failures = [
        (f'{labels},reason="{reason}"', count)
        for labels, _, reasons, _ in versions
        for reason, count in reasons.items()
    ]
    lines.append(family(*_FAILURE, "counter", failures))
    for name, help_text, value in _COUNTERS[1:]:
        lines.append(family(name, help_text, "counter", [(v[0], value(v[1])) for v in versions]))
    lines.append(family(*_PENDING, "gauge", [(v[0], v[3]) for v in versions]))
    return "".join(lines).encode()


def family(name: str, help_text: str, kind: str, samples: Iterable[tuple[str, float | int]]) -> str:
    """One family in Prometheus' text format: its HELP and TYPE, then each sample (its labels
    written inside the braces; none, a sample without braces)."""
    lines = [f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"]
    lines += [f"{name}{{{labels}}} {v}\n" if labels else f"{name} {v}\n" for labels, v in samples]
    return "".join(lines)


def _escaped(value: str) -> str:
    """A label value as the text format writes it (backslash, quote and newline escaped)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
