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


class _FakeCudaStats:
    """The caching allocator's statistics as a CUDA run would move them: the forward asks for
    136 B in three tensors, which take 1,536 B of blocks (``requested`` False: a torch
    without the requested-bytes statistic)."""

    def __init__(self, requested: bool) -> None:
        self.requested = requested
        self.ran = False

    def memory_stats(self, device: str) -> dict[str, int]:
        if not self.requested:
            return {"allocated_bytes.all.current": 4096}
        peak = 1000 + (136 if self.ran else 0)
        return {"requested_bytes.all.current": 1000, "requested_bytes.all.peak": peak}

    def memory_allocated(self, device: str) -> int:
        return 4096

    def max_memory_allocated(self, device: str) -> int:
        return 4096 + (1536 if self.ran else 0)


@pytest.mark.parametrize(("requested", "judged"), [(True, 136), (False, 1536)])
def test_a_cuda_peak_is_judged_in_requested_bytes_with_the_blocks_beside_it(
    monkeypatch: pytest.MonkeyPatch, requested: bool, judged: int
) -> None:
    """On CUDA the plan's tensor bytes are compared with the bytes the forward asked for, not
    with the allocator's rounded blocks (printed beside them); without that statistic the
    allocated peak stands for both."""
    torch = pytest.importorskip("torch")
    bench = _load("plan_accuracy")
    fake = _FakeCudaStats(requested)

    def forward(x: object) -> object:
        fake.ran = True
        return x

    for name in ("memory_stats", "memory_allocated", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    assert bench.measured_peaks(forward, [torch.zeros(1)], "cuda:0") == (judged, 1536)
