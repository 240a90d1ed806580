"""The CUDA-only sweeps driven on the CPU through stand-ins for pinning, streams and events.

These check the bookkeeping (every case, every stream ordering call, every result field), not
the numbers; the real thing runs in the ``cuda`` tests.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from torchplace import report
from torchplace.bench import overlap as overlap_module
from torchplace.bench import transfer as transfer_module
from torchplace.bench.link import LinkInfo
from torchplace.bench.timer import Timer


def assert_schema_accepts(benchmark: str, figures: dict[str, Any]) -> None:
    """The figures, in the report ``bench --json`` would write, match the shipped schema."""
    jsonschema = pytest.importorskip("jsonschema")
    result = {
        "benchmark": benchmark,
        "threads": 1,
        "skipped": False,
        "reason": None,
        "figures": figures,
        "plot": None,
        "warnings": [],
    }
    document = report.envelope("bench", result, device="cuda:0")
    jsonschema.Draft202012Validator(report.load_schema("bench")).validate(document)


def test_transfer_sweep_times_every_case(monkeypatch: pytest.MonkeyPatch) -> None:
    pinned_sizes: list[int] = []

    def fake_pinned(size: int) -> torch.Tensor:
        pinned_sizes.append(size)
        return torch.empty(size, dtype=torch.uint8)

    monkeypatch.setattr(transfer_module, "_pinned", fake_pinned)
    link = LinkInfo(16.0, 16, 31.5e9, "test", 4)
    seen: list[str] = []
    timer = Timer(device="cpu", warmup=0, repeats=3, spread_warning=None)
    result = transfer_module._sweep(timer, (1024, 4096), seen.append, lambda d: (link, str(link)))
    assert pinned_sizes == [1024, 4096]
    assert len(result.cases) == 16
    assert len(seen) == 16
    assert seen[0] == "1 KiB H2D pageable non_blocking=False"
    assert set(result.pinned_alloc_s) == {1024, 4096}
    assert all(v >= 0 for v in result.pageable_alloc_s.values())
    for case in result.cases:
        assert case.measurement.count == 3
        assert case.link_peak_bytes_per_s == link.peak_bytes_per_s
        assert case.percent_of_peak is not None
    assert result.link == link
    assert result.to_dict()["link"]["generation"] == 4
    assert_schema_accepts("transfer", result.to_dict())


def test_transfer_times_a_real_pinning_not_a_cached_block(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch's host allocator caches freed pinned blocks by size: a pinned allocation of a size
    # freed earlier in the process would be timed as a cache hit. The sweep empties that cache
    # right before each timed pinned allocation.
    log: list[str] = []

    def fake_pinned(size: int) -> torch.Tensor:
        log.append(f"pin {size}")
        return torch.empty(size, dtype=torch.uint8)

    monkeypatch.setattr(transfer_module, "_pinned", fake_pinned)
    monkeypatch.setattr(torch._C, "_host_emptyCache", lambda: log.append("empty"), raising=False)
    timer = Timer(device="cpu", warmup=0, repeats=1, spread_warning=None)
    transfer_module._sweep(timer, (1024, 4096), None, lambda d: (None, "no link"))
    assert log == ["empty", "pin 1024", "empty", "pin 4096"]


def test_transfer_without_a_pinned_cache_hook_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch._C, "_host_emptyCache", raising=False)
    transfer_module._drop_cached_pinned_blocks()  # a build without the hook: nothing to drop


class FakeEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        self.at: int | None = None

    def record(self, stream: Any = None) -> None:
        self.at = time.perf_counter_ns()

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None
        assert end.at is not None
        return (end.at - self.at) / 1e6


class FakeStream:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(f"{self.name} waits {other.name}")

    def wait_event(self, event: FakeEvent) -> None:
        assert event.at is not None, "waiting on an event never recorded"
        self.log.append(f"{self.name} waits event")


@pytest.fixture
def fake_streams(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    log: list[str] = []
    main, side = FakeStream(log, "main"), FakeStream(log, "side")

    @contextlib.contextmanager
    def on_stream(stream: FakeStream) -> Iterator[None]:
        log.append(f"on {stream.name}")
        yield

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: side)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "stream", on_stream)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    return log


def test_overlap_pipeline_orders_its_streams(fake_streams: list[str]) -> None:
    steps: list[str] = []
    result = overlap_module._run(
        torch.device("cpu"),
        rows=64,
        batch_bytes=64 * 1024 * 4,
        batches=4,
        compute_ms=None,
        repeats=2,
        progress=steps.append,
    )
    assert steps == ["calibrating", "repeat 1/2", "repeat 2/2"]
    assert result.copy_s > 0
    assert result.compute_s > 0
    assert result.overlapped_s > 0
    assert 0.0 <= result.hidden <= 1.0
    assert result.matmuls_per_batch >= 1
    assert result.best_possible == pytest.approx(3 / 4)
    # the DevicePrefetcher run (a pass-through on this CPU stand-in) is timed and reported too
    assert result.prefetcher_s is not None
    assert result.prefetcher_s > 0
    assert result.prefetcher_hidden is not None
    assert 0.0 <= result.prefetcher_hidden <= 1.0
    assert result.to_dict()["prefetcher_hidden_fraction"] == result.prefetcher_hidden
    assert_schema_accepts("overlap", result.to_dict())
    # In the pipeline the compute stream waits for each batch's copy, and from the third batch
    # on the side stream waits until the buffer it overwrites has been consumed.
    # Three pipeline runs (one warm-up, two repeats) of four batches.
    assert fake_streams.count("main waits event") == 3 * 4
    assert fake_streams.count("side waits event") == 3 * (4 - 2)


def test_overlap_accepts_a_compute_target(fake_streams: list[str]) -> None:
    result = overlap_module._run(
        torch.device("cpu"),
        rows=64,
        batch_bytes=64 * 1024 * 4,
        batches=2,
        compute_ms=5.0,
        repeats=1,
        progress=None,
    )
    assert result.matmuls_per_batch >= 1
    assert result.to_dict()["batches"] == 2


def test_overlap_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="batches"):
        overlap_module.run_overlap(torch.device("cuda", 0), batches=1)
    with pytest.raises(ValueError, match="compute_ms"):
        overlap_module.run_overlap(torch.device("cuda", 0), compute_ms=0.0)
