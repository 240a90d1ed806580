from __future__ import annotations

from torchplace.serve.statistics import InferStatistics


def test_requests_and_batches_are_counted_in_nanoseconds() -> None:
    stats = InferStatistics()
    stats.request(True, 0.002)
    stats.request(True, 0.001)
    stats.request(False, 0.5)
    stats.batch(3, [0.001, 0.002], h2d_s=1e-6, compute_s=0.01, d2h_s=2e-6)
    stats.batch(3, [0.0], h2d_s=0.0, compute_s=0.02, d2h_s=0.0)
    stats.batch(1, [0.004], h2d_s=0.0, compute_s=0.005, d2h_s=0.0)
    doc = stats.snapshot("m", "2")
    inference = doc["inference_stats"]
    assert (doc["name"], doc["version"]) == ("m", "2")
    assert inference["success"] == {"count": 2, "ns": 3_000_000}
    assert inference["fail"] == {"count": 1, "ns": 500_000_000}
    assert inference["queue"] == {"count": 4, "ns": 7_000_000}
    # per request: each request of a batch is charged its batch's compute
    assert inference["compute_infer"] == {"count": 4, "ns": 2 * 10_000_000 + 20_000_000 + 5_000_000}
    assert inference["compute_input"] == {"count": 4, "ns": 2 * 1_000}
    assert (doc["inference_count"], doc["execution_count"]) == (7, 3)
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
            "compute_input": {"count": 2, "ns": 1_000},
            "compute_infer": {"count": 2, "ns": 30_000_000},
            "compute_output": {"count": 2, "ns": 2_000},
        },
    ]
