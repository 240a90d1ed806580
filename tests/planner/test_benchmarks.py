"""The two plan benchmarks run and report what they claim (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts import load_benchmark


def _load(name: str) -> ModuleType:
    return load_benchmark(name)


def test_plan_vs_accelerate_reports_fewer_bytes_for_torchplace(tmp_path: Path) -> None:
    bench = _load("plan_vs_accelerate")
    out = tmp_path / "out.json"
    assert bench.main(["--quick", "--no-verify", "--json", str(out)]) == 0
    cases = json.loads(out.read_text())["cases"]
    for case in cases:
        assert 0 < case["torchplace"]["device_bytes"] < case["accelerate"]["device_bytes"]
        assert case["accelerate"]["recopies_bytes"] > 0  # the hooks' re-copies are counted


def test_the_cpu_allocator_peak_of_seed_mlp_is_the_hand_worked_one() -> None:
    pytest.importorskip("torch")
    bench = _load("plan_accuracy")
    from torchplace.models import build_model

    model = build_model("seed-mlp")
    import torch

    # two (4, 16) float32 hidden tensors alive at once, as worked out in test_trace.py
    assert bench.measured_peak(model, [torch.randn(4, 8)], "cpu") == 2 * 4 * 16 * 4
