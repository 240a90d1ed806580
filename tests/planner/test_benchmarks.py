"""The two plan benchmarks run and report what they claim (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


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
