"""benchmarks/guard_overhead.py runs and reports sane fields (no timing is asserted)."""

from __future__ import annotations

import time
from types import ModuleType

import torch

from tests.scripts import load_benchmark


def _load() -> ModuleType:
    return load_benchmark("guard_overhead")


def test_run_model_compares_bare_and_guarded_forwards() -> None:
    bench = _load()
    result = bench.run_model(
        "seed-mlp", torch.device("cpu"), 5, time.perf_counter() + 5, inference=False
    )
    assert result.rounds == 5
    assert result.bare_us > 0
    assert result.guard_us > 0
    assert result.ratio > 0
    assert result.events_in_forward == 0  # a CPU forward crosses nothing
    assert result.target == 1.5
    assert result.counts_for_target
