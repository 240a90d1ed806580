"""The smoke tests on the CPU (honestly labelled), on meta (skipped) and on a real GPU."""

from __future__ import annotations

import pytest
import torch

import torchplace.doctor.smoke as smoke
from torchplace.devices import FakeProbe
from torchplace.doctor import collect, matmul_check, pinned_memory_check, round_trip_check


def test_smoke_on_cpu() -> None:
    cpu = torch.device("cpu")
    rt = round_trip_check(cpu)
    assert rt.status == "pass"
    assert "cpu check" in rt.detail
    assert "equal" in rt.detail
    mm, error = matmul_check(cpu, tf32=False)
    assert mm.status == "pass"
    assert "cpu check" in mm.detail
    assert error is not None
    assert 0 <= error < 1e-4
    assert pinned_memory_check(cpu).status == "skip"


def test_smoke_on_meta_is_skipped() -> None:
    meta = torch.device("meta")
    assert round_trip_check(meta).status == "skip"
    assert matmul_check(meta)[0].status == "skip"
    report = collect("meta", probe=FakeProbe(), toolkit=lambda: None)
    assert report["verdict"]["usable"]
    assert report["verdict"]["device"] == "meta"


def test_matmul_error_over_the_limit_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smoke, "_MATMUL_TOL", 0.0)
    mm, error = matmul_check(torch.device("cpu"), tf32=False)
    assert error is not None
    assert error > 0
    assert mm.status == "fail"
    assert mm.fix is not None


def test_tf32_loosens_the_limit() -> None:
    mm, _ = matmul_check(torch.device("cpu"), tf32=True)
    assert "TF32 allowed" in mm.detail
    assert "limit 1e-02" in mm.detail


def test_round_trip_mismatch_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "equal", lambda a, b: False)
    rt = round_trip_check(torch.device("cpu"))
    assert rt.status == "fail"
    assert "DIFFERS" in rt.detail
    assert rt.fix


@pytest.mark.cuda
def test_cuda_smoke_tests() -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    pinned = pinned_memory_check(device)
    assert pinned.status == "pass"
    rt = round_trip_check(device)
    assert rt.status == "pass", rt.detail
    assert "pinned, non_blocking" in rt.detail
    assert "equal" in rt.detail
    mm, error = matmul_check(device)
    assert mm.status == "pass", mm.detail
    assert error is not None
    assert error < 1e-2
