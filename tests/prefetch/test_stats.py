"""The statistics' verdict: which stage is the bottleneck."""

from __future__ import annotations

from typing import Any

import pytest

from torchplace.prefetch import PrefetchStats

# --------------------------------------------------------------------------------------------
# the verdict
# --------------------------------------------------------------------------------------------


def _stats(**kw: Any) -> PrefetchStats:
    base: dict[str, Any] = {
        "mode": "streams",
        "device": "cuda:0",
        "batches": 10,
        "source_s": 0.0,
        "copy_s": 0.0,
        "copy_device_s": 0.0,
        "consumer_s": 0.0,
        "consumer_device_s": 0.0,
        "staged_batches": 0,
        "already_pinned": 0,
        "fallback_copies": 0,
        "pool_cap_bytes": 0,
        "pool_bytes": 0,
        "pool_peak_bytes": 0,
        "pool_allocations": 0,
        "pool_reuses": 0,
    }
    base.update(kw)
    return PrefetchStats(**base)


@pytest.mark.parametrize(
    ("kw", "verdict"),
    [
        ({"source_s": 3.0, "copy_s": 1.0, "consumer_s": 2.0}, "source"),
        ({"source_s": 1.0, "copy_s": 0.1, "copy_device_s": 5.0, "consumer_s": 2.0}, "copy"),
        ({"source_s": 1.0, "copy_s": 0.5, "consumer_s": 2.0}, "consumer"),
        # a GPU-bound consumer that never waits for its kernels: little host time, much device
        ({"source_s": 0.2, "copy_s": 0.5, "consumer_s": 0.1, "consumer_device_s": 3.0}, "consumer"),
        (
            {"source_s": 0.2, "copy_device_s": 4.0, "consumer_s": 0.1, "consumer_device_s": 3.0},
            "copy",
        ),
        ({"batches": 0}, "none"),
    ],
)
def test_bottleneck_verdict(kw: dict[str, Any], verdict: str) -> None:
    assert _stats(**kw).bottleneck == verdict
