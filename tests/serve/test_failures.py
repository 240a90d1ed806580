from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import numpy as np
import pytest
import torch

from torchplace.errors import (
    ConfigError,
    DeviceOutOfMemoryError,
    KernelError,
    NotReadyError,
    TransferError,
)
from torchplace.serve.engine import INLINE_PROBATION, Engine
from torchplace.serve.execution import Transfer
from torchplace.serve.failures import BatchFailure, HealthTracker, is_oom
from torchplace.serve.replica import Replica

from .engine_helpers import Faulty, loaded

CPU = torch.device("cpu")


def _rows(n: int, start: float = 0.0) -> np.ndarray:
    return np.arange(start, start + 4 * n, dtype=np.float32).reshape(n, 4)


def _faulty(replica: Replica) -> Faulty:
    assert isinstance(replica.module, Faulty)
    return replica.module


def _error_count(engine: Engine, cls: str, device: str = "cpu") -> float:
    needle = f'torchplace_errors_total{{class="{cls}",device="{device}",model="test-model",version="1"}} '
    for line in engine.metrics_text().decode().splitlines():
        if line.startswith(needle):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class FailingTransfer(Transfer):
    """Host -> device copies raise what a failed CUDA copy raises (a RuntimeError)."""

    def __init__(self) -> None:
        self.fail = False

    def to_device(
        self, host: torch.Tensor, device: torch.device, non_blocking: bool
    ) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().to_device(host, device, non_blocking)


def test_the_oom_type_is_recognised() -> None:
    assert is_oom(torch.OutOfMemoryError("x"))
    assert is_oom(torch.cuda.OutOfMemoryError("x"))
    assert not is_oom(RuntimeError("CUDA error"))
    assert BatchFailure("oom", "cuda:1", "x").error().status == 507
    assert BatchFailure("transfer", "cuda:1", "x").error().status == 500
    assert isinstance(BatchFailure("kernel", "cuda:1", "x").error(), KernelError)


def test_health_tracker_counts_consecutive_failures() -> None:
    health = HealthTracker(2)
    assert not health.failure()
    health.success()
    assert not health.failure()
    assert health.failure()
    assert not health.healthy
    assert not health.failure()  # already out: reported once
    health.success()
    assert health.healthy
    assert health.consecutive == 0


def test_a_failure_threshold_below_one_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="failure_threshold must be >= 1, got 0"):
        Engine(loaded(Faulty()), [CPU], failure_threshold=0)


def test_oom_splits_the_batch_and_every_row_is_answered() -> None:
    replica = Replica(loaded(Faulty()), CPU, max_batch_size=16)
    replica.prepare()
    model = _faulty(replica)
    model.oom_over = 3
    model.rows_seen.clear()
    requests = [{"input": _rows(n, 10.0 * i)} for i, n in enumerate((2, 1, 4, 1))]
    outcome = replica.run_batch(requests, [2, 1, 4, 1])
    for request, result in zip(requests, outcome.results, strict=True):
        assert isinstance(result, dict)
        np.testing.assert_array_equal(result["output"], request["input"] * 2)
    assert model.rows_seen[0] == 8
    assert max(model.rows_seen[1:]) <= 4
    assert outcome.oom_splits >= 1
    assert "oom" in outcome.failures
    assert replica.in_pool
    assert replica.health.consecutive == 0


def test_only_the_request_with_a_row_that_still_ooms_gets_507() -> None:
    replica = Replica(loaded(Faulty()), CPU, max_batch_size=16)
    replica.prepare()
    _faulty(replica).poison = 999.0
    poisoned = _rows(3)
    poisoned[1, 0] = 999.0
    requests = [{"input": _rows(2, 100.0)}, {"input": poisoned}, {"input": _rows(1, 200.0)}]
    outcome = replica.run_batch(requests, [2, 3, 1])
    first, second, third = outcome.results
    assert isinstance(second, DeviceOutOfMemoryError)
    assert second.status == 507
    assert "single row" in str(second)
    assert isinstance(first, dict)
    assert isinstance(third, dict)
    np.testing.assert_array_equal(first["output"], requests[0]["input"] * 2)
    np.testing.assert_array_equal(third["output"], requests[2]["input"] * 2)
    assert replica.in_pool  # OOM does not take a replica out


def test_kernel_and_transfer_failures_are_500s_counted_apart() -> None:
    async def main() -> None:
        transfer = FailingTransfer()
        engine = Engine(
            loaded(Faulty()), [CPU], max_delay_ms=0.0, failure_threshold=5, transfer=transfer
        )
        await engine.start()
        model = _faulty(engine.replicas[0])
        model.kernel_failures = 1
        with pytest.raises(KernelError, match="forward pass failed on cpu") as kernel:
            await engine.infer({"input": _rows(1)})
        assert kernel.value.status == 500
        transfer.fail = True
        with pytest.raises(TransferError, match="copy failed on cpu") as copy:
            await engine.infer({"input": _rows(1)})
        assert copy.value.status == 500
        transfer.fail = False
        result = await engine.infer({"input": _rows(1)})
        np.testing.assert_array_equal(result["output"], _rows(1) * 2)
        assert _error_count(engine, "kernel") == 1.0
        assert _error_count(engine, "transfer") == 1.0
        assert engine.statistics.failures()["BACKEND"] == 2  # Triton's reason for both
        assert engine.is_ready()
        await engine.stop()

    asyncio.run(main())


def test_oom_507_is_counted_in_metrics() -> None:
    async def main() -> None:
        engine = Engine(loaded(Faulty()), [CPU], max_delay_ms=0.0)
        await engine.start()
        _faulty(engine.replicas[0]).oom_over = 0  # even one row does not fit
        with pytest.raises(DeviceOutOfMemoryError):
            await engine.infer({"input": _rows(2)})
        assert _error_count(engine, "oom") == 1.0
        assert engine.is_ready()
        await engine.stop()

    asyncio.run(main())


async def _wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("inline", [False, True])
def test_consecutive_failures_remove_the_replica_and_a_dry_run_brings_it_back(
    inline: bool,
) -> None:
    """Also for a replica whose batches run on the event loop: its worker thread, idle until
    then, runs the background dry runs."""

    async def main() -> None:
        engine = Engine(
            loaded(Faulty()),
            [CPU],
            max_delay_ms=0.0,
            failure_threshold=3,
            recovery_interval_s=0.02,
            inline_batch_ms=1000.0 if inline else 0.0,
        )
        await engine.start()
        for _ in range(INLINE_PROBATION if inline else 0):  # cheap on its worker thread first
            await engine.infer({"input": _rows(1)})
        model = _faulty(engine.replicas[0])
        assert model.calls  # the dry runs at least
        result = await engine.infer({"input": _rows(1)})
        np.testing.assert_array_equal(result["output"], _rows(1) * 2)
        assert engine.replicas[0].inline is inline
        model.always_fail = True
        for _ in range(3):
            with pytest.raises(KernelError):
                await engine.infer({"input": _rows(1)})
        assert not engine.is_ready()
        assert (
            'torchplace_replica_ready{device="cpu",model="test-model",replica="cpu#0",version="1"} 0.0'
            in engine.metrics_text().decode()
        )
        with pytest.raises(NotReadyError, match="no healthy replica"):
            await engine.infer({"input": _rows(1)})
        calls = model.calls
        await _wait_for(lambda: model.calls > calls + 1)  # background dry runs keep probing
        assert not engine.is_ready()
        model.always_fail = False
        await _wait_for(engine.is_ready)
        result = await engine.infer({"input": _rows(2)})
        np.testing.assert_array_equal(result["output"], _rows(2) * 2)
        await engine.stop()

    asyncio.run(main())


def test_queued_requests_fail_cleanly_when_the_last_replica_leaves() -> None:
    async def main() -> None:
        engine = Engine(
            loaded(Faulty()),
            [CPU],
            max_batch_size=1,
            max_delay_ms=0.0,
            failure_threshold=1,
            recovery_interval_s=10.0,
        )
        await engine.start()
        _faulty(engine.replicas[0]).always_fail = True
        tasks = [asyncio.ensure_future(engine.infer({"input": _rows(1)})) for _ in range(4)]
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5.0)
        assert isinstance(done[0], KernelError)
        assert all(isinstance(e, NotReadyError) for e in done[1:])
        await engine.stop()

    asyncio.run(main())


@pytest.mark.parametrize(
    "device",
    [CPU, pytest.param(torch.device("cuda", 0), marks=pytest.mark.cuda)],
    ids=["cpu", "cuda"],
)
def test_fallback_cpu_replica_takes_traffic_while_no_primary_is_healthy(
    device: torch.device,
) -> None:
    label = str(device)

    async def main() -> None:
        engine = Engine(
            loaded(Faulty()),
            [device],
            replicas_per_device=2,
            max_delay_ms=0.0,
            failure_threshold=1,
            fallback="cpu",
            recovery_interval_s=0.02,
        )
        await engine.start()
        primaries = [r for r in engine.replicas if not r.fallback]
        (fallback,) = [r for r in engine.replicas if r.fallback]
        assert [r.label for r in primaries] == [label, label]
        assert fallback.label == "cpu"
        pinned = device.type == "cuda"
        assert all(r.staging is not None and r.staging.is_pinned() == pinned for r in primaries)
        fallback_model = _faulty(fallback)
        served_before = fallback_model.calls
        # healthy primaries: the fallback stays idle
        xs = [_rows(1, i) for i in range(16)]
        results = await asyncio.gather(*(engine.infer({"input": x}) for x in xs))
        for x, result in zip(xs, results, strict=True):
            np.testing.assert_array_equal(result["output"], x * 2)
        assert fallback_model.calls == served_before
        for replica in primaries:
            _faulty(replica).always_fail = True
        for _ in range(2):
            with pytest.raises(KernelError, match=f"failed on {label}"):
                await engine.infer({"input": _rows(1)})
        assert not any(r.in_pool for r in primaries)
        assert engine.is_ready()  # the fallback keeps the model ready
        result = await engine.infer({"input": _rows(3)})
        np.testing.assert_array_equal(result["output"], _rows(3) * 2)
        assert fallback_model.calls == served_before + 1
        assert _error_count(engine, "kernel", label) == 2.0
        assert (
            f'torchplace_replica_ready{{device="{label}",model="test-model",'
            f'replica="{label}#0",version="1"}} 0.0'
        ) in engine.metrics_text().decode()
        for replica in primaries:
            _faulty(replica).always_fail = False
        await _wait_for(lambda: all(r.in_pool for r in primaries))
        calls = fallback_model.calls
        await asyncio.gather(*(engine.infer({"input": _rows(1)}) for _ in range(8)))
        assert fallback_model.calls == calls  # back on the primaries
        await engine.stop()

    asyncio.run(main())


class _GreedyPerRow(torch.nn.Module):
    """Allocates ``per_row`` bytes of device memory per row: two rows do not fit, one does."""

    def __init__(self, per_row: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((4,), 2.0))
        self.per_row = per_row
        self.single_row_fails = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0] * (1000 if self.single_row_fails else 1)
        scratch = torch.empty(rows * self.per_row, dtype=torch.uint8, device=x.device)
        del scratch
        return x * self.weight


@pytest.mark.cuda
def test_real_cuda_oom_is_split_then_507_for_a_row_that_cannot_fit() -> None:
    device = torch.device("cuda", 0)
    # memory cached by earlier tests would let two rows fit after the allocator frees it
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    model = _GreedyPerRow(int(free * 0.6))
    try:
        replica = Replica(loaded(model), device, max_batch_size=4)
        replica.prepare()  # the dry run itself only passes by splitting down to single rows
        requests = [{"input": _rows(1, 10.0 * i)} for i in range(4)]
        outcome = replica.run_batch(requests, [1, 1, 1, 1])
        assert outcome.oom_splits >= 1
        assert "oom" in outcome.failures
        for request, result in zip(requests, outcome.results, strict=True):
            assert isinstance(result, dict), result
            np.testing.assert_array_equal(result["output"], request["input"] * 2)
        assert isinstance(replica.module, _GreedyPerRow)
        replica.module.single_row_fails = True
        (result,) = replica.run_batch([{"input": _rows(1)}], [1]).results
        assert isinstance(result, DeviceOutOfMemoryError)
        assert result.status == 507
        assert "cuda:0" in str(result)
        assert replica.in_pool
        # the cache was emptied: the single-row scratch block is no longer held
        assert torch.cuda.memory_reserved(device) < model.per_row
    finally:
        # leave no scratch block cached, and no 60% peak, to the tests after this one
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


@pytest.mark.cuda
def test_replicas_on_every_gpu_answer_from_their_own_device() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")

    async def main() -> None:
        devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
        engine = Engine(loaded(Faulty()), devices, max_delay_ms=0.0)
        await engine.start()
        seen: list[tuple[torch.device, torch.device]] = []  # (replica device, input device)
        for replica in engine.replicas:
            assert replica.module is not None
            replica.module.register_forward_hook(
                lambda m, args, out, d=replica.device: seen.append((d, args[0].device))
            )
        xs = [_rows(2, i) for i in range(64)]
        results = await asyncio.gather(*(engine.infer({"input": x}) for x in xs))
        for x, result in zip(xs, results, strict=True):
            np.testing.assert_array_equal(result["output"], x * 2)
        assert all(home == got for home, got in seen), seen  # nothing crossed devices
        assert len({home for home, _ in seen}) >= 2  # and more than one GPU served
        await engine.stop()

    asyncio.run(main())


def test_a_real_failing_device_to_host_copy_is_a_transfer_error() -> None:
    class OutputOnMeta(torch.nn.Module):
        """Its output lives where no data can be copied back from: torch's own copy raises."""

        def __init__(self) -> None:
            super().__init__()
            self.broken = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * 2
            return y.to("meta") if self.broken else y

    replica = Replica(loaded(OutputOnMeta()), CPU, max_batch_size=4, failure_threshold=2)
    replica.prepare()
    assert isinstance(replica.module, OutputOnMeta)
    replica.module.broken = True
    outcome = replica.run_batch([{"input": _rows(1)}, {"input": _rows(2)}], [1, 2])
    assert outcome.failures == ["transfer"]
    for result in outcome.results:
        assert isinstance(result, TransferError)
        assert "Cannot copy out of meta tensor" in str(result)
    assert replica.in_pool
    replica.run_batch([{"input": _rows(1)}], [1])
    assert not replica.in_pool  # two transfer failures in a row


class _FakeStream:
    """Stands in for a replica's CUDA stream on the CPU: counts the waits on it."""

    def __init__(self) -> None:
        self.waits = 0

    def synchronize(self) -> None:
        self.waits += 1


class _FakeEvent:
    """A CUDA timing event stand-in; ``fault`` makes the wait raise what a kernel fault raises."""

    clock = 0.0

    def __init__(self) -> None:
        self.at = 0.0
        self.fault = False

    def record(self, stream: object) -> None:
        _FakeEvent.clock += 0.001
        self.at = _FakeEvent.clock

    def synchronize(self) -> None:
        if self.fault:
            raise RuntimeError("CUDA error: device-side assert triggered")

    def elapsed_time(self, end: _FakeEvent) -> float:
        return (end.at - self.at) * 1e3  # milliseconds, as torch.cuda.Event answers


def _with_fake_stream(replica: Replica) -> tuple[_FakeStream, list[_FakeEvent]]:
    """Run ``replica`` through its CUDA code path (events, one wait per batch) on the CPU."""
    stream, events = _FakeStream(), [_FakeEvent() for _ in range(4)]
    replica._stream = stream
    replica._events = events
    replica._on_stream = lambda: contextlib.nullcontext()  # type: ignore[method-assign]
    return stream, events


def test_stage_times_come_from_the_events_on_the_stream_path() -> None:
    replica = Replica(loaded(Faulty()), CPU, max_batch_size=4)
    replica.prepare()
    stream, _ = _with_fake_stream(replica)
    outcome = replica.run_batch([{"input": _rows(2)}], [2])
    result = outcome.results[0]
    assert isinstance(result, dict)
    np.testing.assert_array_equal(result["output"], _rows(2) * 2)
    # each stage is the distance between two consecutive events (1 ms apart here)
    assert (outcome.h2d_s, outcome.compute_s, outcome.d2h_s) == pytest.approx((1e-3,) * 3)
    assert stream.waits == 0  # a good batch waits on its last event only


def test_a_fault_surfacing_at_the_batch_sync_is_a_kernel_failure_and_the_stream_settles() -> None:
    replica = Replica(loaded(Faulty()), CPU, max_batch_size=4)
    replica.prepare()
    stream, events = _with_fake_stream(replica)
    events[3].fault = True
    outcome = replica.run_batch([{"input": _rows(1)}, {"input": _rows(2)}], [1, 2])
    assert outcome.failures == ["kernel"]
    assert all(isinstance(r, KernelError) for r in outcome.results)
    assert "device-side assert" in str(outcome.results[0])
    # the copies the failed batch queued are waited for before the staging buffer is refilled
    assert stream.waits == 1
    events[3].fault = False
    (result,) = replica.run_batch([{"input": _rows(1)}], [1]).results
    assert isinstance(result, dict)
    assert stream.waits == 1


def test_an_oom_empties_the_allocator_cache_on_the_replica_device_before_each_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CUDA memory release of the OOM path, run on the CPU with torch.cuda faked."""
    replica = Replica(loaded(Faulty()), CPU, max_batch_size=8)
    replica.prepare()
    _with_fake_stream(replica)
    replica._cuda = True  # take the CUDA branch of the release
    model = _faulty(replica)
    model.oom_over = 2
    model.rows_seen.clear()
    log: list[object] = []

    class FakeDeviceContext:
        def __init__(self, device: torch.device) -> None:
            self.device = device

        def __enter__(self) -> None:
            log.append(("enter", self.device))

        def __exit__(self, *exc: object) -> None:
            log.append("exit")

    monkeypatch.setattr(torch.cuda, "device", FakeDeviceContext)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append(list(model.rows_seen)))
    outcome = replica.run_batch([{"input": _rows(1, 10.0 * i)} for i in range(4)], [1] * 4)
    assert all(isinstance(result, dict) for result in outcome.results)
    assert model.rows_seen == [4, 2, 2]
    # once, after the 4-row attempt failed and before either half ran, on the replica's device
    assert log == [("enter", CPU), [4], "exit"]
