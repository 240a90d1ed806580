"""benchmarks/guard_overhead.py runs and reports sane fields (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "guard_overhead.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("guard_overhead", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


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
