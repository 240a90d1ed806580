from __future__ import annotations

from types import SimpleNamespace

from torchplace.serve.statistics import InferStatistics, batch_timing


def _part(rows: int, arrived: float, timing: tuple[float, float, float, float] | None) -> object:
    """A queued request as the pool leaves it: stamped with its batch's times (in seconds
    here), converted once per batch as the pool converts them."""
    return SimpleNamespace(
        rows=rows, arrived=arrived, timing=None if timing is None else batch_timing(*timing)
    )


def test_requests_and_batches_are_counted_in_nanoseconds() -> None:
    stats = InferStatistics()
    first = (10.003, 1e-6, 0.01, 2e-6)  # one batch of 3 rows: two requests
    stats.request(True, 0.002, [_part(1, 10.002, first)])
    stats.request(True, 0.001, [_part(2, 10.001, first)])
    stats.request(False, 0.5, [_part(5, 9.0, None)])
    stats.request(True, 0.03, [_part(1, 20.0, (20.004, 0.0, 0.005, 0.0))])
    stats.executions([(3, 1e-6, 0.01, 2e-6)])
    stats.executions([(1, 0.0, 0.005, 0.0)])
    doc = stats.snapshot("m", "2")
    inference = doc["inference_stats"]
    assert (doc["name"], doc["version"]) == ("m", "2")
    assert inference["success"] == {"count": 3, "ns": 33_000_000}
    assert inference["fail"] == {"count": 1, "ns": 500_000_000}
    assert inference["queue"]["count"] == 3
    assert abs(inference["queue"]["ns"] - 7_000_000) < 10
    # per request: each request of a batch is charged its batch's compute
    assert inference["compute_infer"] == {"count": 3, "ns": 2 * 10_000_000 + 5_000_000}
    assert inference["compute_input"] == {"count": 3, "ns": 2 * 1_000}
    assert (doc["inference_count"], doc["execution_count"]) == (4, 2)
    assert doc["last_inference"] > 0
    assert doc["batch_stats"] == [
        {
            "batch_size": 1,
            "compute_input": {"count": 1, "ns": 0},
            "compute_infer": {"count": 1, "ns": 5_000_000},
            "compute_output": {"count": 1, "ns": 0},
        },
        {
            "batch_size": 3,
            "compute_input": {"count": 1, "ns": 1_000},
            "compute_infer": {"count": 1, "ns": 10_000_000},
            "compute_output": {"count": 1, "ns": 2_000},
        },
    ]


def test_a_request_in_one_chunk_counts_as_the_sum_over_its_chunks() -> None:
    """A request in one chunk is read without the loop over chunks; it counts as the same
    request with a second chunk that adds nothing (no rows, never ran, arrived later)."""
    cases = [
        (True, 0.004, _part(3, 10.0, (10.0025, 2e-6, 0.001, 3e-6))),
        (True, 0.002, _part(1, 10.0, None)),  # answered without running
        (True, 0.001, _part(2, 10.5, (10.4, 0.0, 0.001, 0.0))),  # a clock step: queue >= 0
        (False, 0.3, _part(1, 10.0, (10.1, 0.0, 0.002, 0.0))),
    ]
    alone, paired = InferStatistics(), InferStatistics()
    for ok, seconds, part in cases:
        alone.request(ok, seconds, [part])
        paired.request(ok, seconds, [part, _part(0, part.arrived + 1.0, None)])  # type: ignore[attr-defined]
    assert alone.snapshot("m", "1") == paired.snapshot("m", "1")
    counted = alone.snapshot("m", "1")["inference_stats"]
    assert counted["success"]["count"] == 3
    assert counted["queue"]["count"] == 2
    assert abs(counted["queue"]["ns"] - 2_500_000) <= 1  # the clock step counts 0
    assert counted["fail"]["count"] == 1
