"""The gRPC series: calls are counted exactly across folds and scrapes."""

from __future__ import annotations

import math

import pytest

grpc = pytest.importorskip("grpc")

from torchplace.serve import grpc_server  # noqa: E402
from torchplace.serve.metrics import FOLD_AT  # noqa: E402


class _Engine:
    name, version = "m", "1"

    def __init__(self) -> None:
        self.device = "cpu"

    def served_by(self) -> str:
        return self.device


def _samples(metrics: grpc_server._GrpcMetrics) -> dict[tuple[str, tuple[str, ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value  # type: ignore[misc]
        for family in metrics.collect()
        for sample in family.samples
    }


def test_calls_are_counted_exactly_across_folds_and_scrapes() -> None:
    engine = _Engine()
    metrics = grpc_server._GrpcMetrics(engine)
    ok, bad = grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT
    for i in range(FOLD_AT + 10):  # one fold on the way, the rest at the scrape
        metrics.observe(ok if i % 3 else bad, 0.0003)
    engine.device = "cuda:0"
    metrics.observe(ok, 2.0)
    first = _samples(metrics)
    engine.device = "cpu"
    metrics.observe(ok, 0.0003)  # after a scrape: counted at the next
    second = _samples(metrics)

    def count(samples: dict, device: str, code: str) -> float:  # type: ignore[type-arg]
        labels = (("code", code), ("device", device), ("model", "m"), ("version", "1"))
        return samples[("torchplace_grpc_requests_total", labels)]

    calls = FOLD_AT + 10
    assert count(first, "cpu", "INVALID_ARGUMENT") == math.ceil(calls / 3)
    assert count(first, "cpu", "OK") == calls - math.ceil(calls / 3)
    assert count(first, "cuda:0", "OK") == 1
    assert count(second, "cpu", "OK") == calls - math.ceil(calls / 3) + 1
    cpu = (("device", "cpu"), ("model", "m"), ("version", "1"))
    assert second[("torchplace_grpc_request_duration_seconds_count", cpu)] == calls + 1
    assert second[("torchplace_grpc_request_duration_seconds_sum", cpu)] == pytest.approx(
        0.0003 * (calls + 1)
    )
    le = (("device", "cpu"), ("le", "0.0005"), ("model", "m"), ("version", "1"))
    assert second[("torchplace_grpc_request_duration_seconds_bucket", le)] == calls + 1
    gpu_le = (("device", "cuda:0"), ("le", "1.0"), ("model", "m"), ("version", "1"))
    assert second[("torchplace_grpc_request_duration_seconds_bucket", gpu_le)] == 0
