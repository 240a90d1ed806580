"""The statistics extension counts what Triton counts, the way perf_analyzer reads it.

Sources read (Triton's own accounting, not only its prose):

- triton-inference-server/core ``src/infer_stats.cc``: ``UpdateSuccess`` adds one request to
  ``success``, ``queue`` and the three ``compute_*`` (each request of a batch is charged its
  batch's compute times) and its batch size to ``inference_count``; ``UpdateFailure`` adds to
  ``fail`` only (no queue, no compute, no inference); ``UpdateInferBatchStats`` adds one
  execution to ``execution_count`` and ``batch_stats`` and moves ``last_inference`` (ms).
- core ``src/infer_request.cc`` (``RespondIfError``, ``ReportStatistics``),
  ``src/dynamic_batch_scheduler.cc`` (a request whose queue timeout passes fails as REJECTED, a
  cancelled one as CANCELED) and ``src/tritonserver.cc`` / ``src/server.cc``
  (``PrepareForInference`` validates before ``InferAsync`` starts the request's clock; a refused
  enqueue, queue full, returns its error with no statistic).
- triton-inference-server/common ``protobuf/grpc_service.proto`` (``InferStatistics``,
  ``InferBatchStatistics``, ``ModelStatistics``) and server ``docs/protocol/
  extension_statistics.md`` and ``docs/user_guide/metrics.md`` (inference count = rows of the
  successful requests, execution count = successful executions).
- perf_analyzer ``src/inference_profiler.cc`` (``ReportServerSideStats``): average request
  latency is ``success.ns / success.count``, queue and compute averages use their own counts,
  the compute counts must be equal, overhead = latency - queue - compute (clamped at 0).

A request torchplace splits into chunks (more rows than ``--max-batch-size``) is one request:
its queue time runs from its arrival to the start of its first chunk's batch, its compute times
sum over its chunks' batches; each of those batches is an execution.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch

from torchplace.errors import (
    DeadlineExceededError,
    DeviceOutOfMemoryError,
    InputError,
    KernelError,
    PayloadTooLargeError,
)
from torchplace.serve.admission import QueuePolicy
from torchplace.serve.engine import Engine
from torchplace.serve.replica import Replica
from torchplace.serve.running import ServerThread

from .conftest import test_config
from .engine_helpers import Faulty, Scale, loaded
from .repository_helpers import call, infer_body, write_model, write_version

CPU = torch.device("cpu")
STAGES = ("queue", "compute_input", "compute_infer", "compute_output")
BODY = orjson.dumps(infer_body())


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(coro_fn())  # type: ignore[arg-type]


def _rows(n: int, start: float = 0.0) -> np.ndarray:
    return np.arange(start, start + 4 * n, dtype=np.float32).reshape(n, 4)


def _doc(engine: Engine) -> dict[str, Any]:
    doc: dict[str, Any] = engine.statistics.snapshot(engine.name, engine.version)
    return doc


def _counts(doc: dict[str, Any]) -> dict[str, int]:
    return {key: stat["count"] for key, stat in doc["inference_stats"].items()}


def _batches(doc: dict[str, Any]) -> dict[int, int]:
    return {b["batch_size"]: b["compute_infer"]["count"] for b in doc["batch_stats"]}


def _consistent(doc: dict[str, Any]) -> None:
    """What perf_analyzer relies on: one count for success, queue and compute, and a request's
    queue and compute inside its time in the server."""
    stats = doc["inference_stats"]
    assert {stats[key]["count"] for key in STAGES} == {stats["success"]["count"]}
    parts = sum(stats[key]["ns"] for key in STAGES)
    assert parts <= stats["success"]["ns"]
    assert sum(size * n for size, n in _batches(doc).items()) >= doc["inference_count"]
    assert sum(_batches(doc).values()) == doc["execution_count"]


def test_requests_batched_together_each_count_once_with_their_batch_compute() -> None:
    async def main() -> None:
        engine = Engine(
            loaded(Scale()), [CPU], max_batch_size=8, max_delay_ms=50.0,
            queue=QueuePolicy(priority_levels=2),
        )  # fmt: skip
        await engine.start()
        calls = [
            engine.infer({"input": _rows(1)}, priority=1),
            engine.infer({"input": _rows(2)}, priority=2),
            engine.infer({"input": _rows(3)}),
        ]
        await asyncio.gather(*calls)
        doc = _doc(engine)
        assert _counts(doc)["success"] == 3
        assert _counts(doc)["fail"] == 0
        assert doc["inference_count"] == 6  # rows, every priority level alike
        assert doc["execution_count"] == 1
        assert _batches(doc) == {6: 1}
        stats = doc["inference_stats"]
        batch = doc["batch_stats"][0]["compute_infer"]["ns"]
        assert stats["compute_infer"]["ns"] == 3 * batch  # each request is charged its batch
        assert doc["last_inference"] > 0
        _consistent(doc)
        await engine.stop()

    run(main)


def test_a_request_split_into_chunks_is_one_request_and_each_chunk_an_execution() -> None:
    async def main() -> None:
        engine = Engine(loaded(Scale()), [CPU], max_batch_size=2, max_delay_ms=0.0)
        await engine.start()
        out = await engine.infer({"input": _rows(5)})  # chunks of 2, 2 and 1 rows
        np.testing.assert_array_equal(out["output"], _rows(5) * 2)
        doc = _doc(engine)
        assert _counts(doc)["success"] == 1
        assert doc["inference_count"] == 5
        assert doc["execution_count"] == 3
        assert _batches(doc) == {1: 1, 2: 2}
        stats = doc["inference_stats"]
        summed = sum(b["compute_infer"]["ns"] for b in doc["batch_stats"])
        assert stats["compute_infer"] == {"count": 1, "ns": summed}
        _consistent(doc)  # queue count 1, not one per chunk
        await engine.stop()

    run(main)


def test_a_request_refused_before_it_is_queued_is_in_no_statistic() -> None:
    async def main() -> None:
        engine = Engine(loaded(Scale()), [CPU], max_batch_size=2, max_queue=1, max_delay_ms=0.0)
        await engine.start()
        with pytest.raises(InputError):
            engine.submit({"input": np.zeros((1, 3), np.float32)})
        with pytest.raises(PayloadTooLargeError):
            engine.submit({"input": _rows(5)})  # 3 chunks never fit a queue of 1
        doc = _doc(engine)
        assert set(_counts(doc).values()) == {0}
        assert (doc["inference_count"], doc["execution_count"], doc["last_inference"]) == (0, 0, 0)
        await engine.stop()

    run(main)


def test_deadline_drops_and_cancels_are_failures_with_no_queue_or_compute() -> None:
    gate = threading.Event()
    gate.set()

    class Gated(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            gate.wait(5.0)
            return x

    async def main() -> None:
        engine = Engine(loaded(Gated()), [CPU], max_batch_size=1, max_delay_ms=0.0)
        await engine.start()
        gate.clear()
        first = asyncio.ensure_future(engine.infer({"input": _rows(1)}))
        await asyncio.sleep(0.01)  # running, holding the only replica
        with pytest.raises(DeadlineExceededError):
            await engine.infer({"input": _rows(1)}, timeout_s=0.01)
        with pytest.raises(asyncio.TimeoutError):  # the client gives up: cancelled
            await asyncio.wait_for(engine.infer({"input": _rows(1)}), 0.01)
        gate.set()
        await first
        doc = _doc(engine)
        counts = _counts(doc)
        assert counts["fail"] == 2
        assert counts["success"] == 1
        assert doc["inference_stats"]["fail"]["ns"] >= 2 * 5_000_000
        assert doc["inference_count"] == 1
        assert doc["execution_count"] == 1
        _consistent(doc)
        await engine.stop()

    run(main)


def test_a_failed_batch_is_a_failure_and_no_execution() -> None:
    async def main() -> None:
        engine = Engine(loaded(Faulty()), [CPU], max_delay_ms=0.0, failure_threshold=5)
        await engine.start()
        module = engine.replicas[0].module
        assert isinstance(module, Faulty)
        module.kernel_failures = 1
        with pytest.raises(KernelError):
            await engine.infer({"input": _rows(2)})
        doc = _doc(engine)
        assert _counts(doc)["fail"] == 1
        assert (doc["inference_count"], doc["execution_count"], doc["last_inference"]) == (0, 0, 0)
        _consistent(doc)
        await engine.stop()

    run(main)


def test_an_out_of_memory_split_counts_each_half_that_ran() -> None:
    replica = Replica(loaded(Faulty()), CPU, max_batch_size=16)
    replica.prepare()
    module = replica.module
    assert isinstance(module, Faulty)
    module.oom_over = 3
    outcome = replica.run_batch([{"input": _rows(n)} for n in (2, 1, 4, 1)], [2, 1, 4, 1])
    assert [rows for rows, *_ in outcome.executions] == [2, 2, 2, 2]
    module.oom_over = None
    module.kernel_failures = 1
    failed = replica.run_batch([{"input": _rows(2)}], [2])
    assert failed.executions == []

    async def main() -> None:
        engine = Engine(loaded(Faulty()), [CPU], max_batch_size=16, max_delay_ms=0.0)
        await engine.start()
        faulty = engine.replicas[0].module
        assert isinstance(faulty, Faulty)
        faulty.oom_over = 3
        await engine.infer({"input": _rows(8)})
        faulty.oom_over = None
        faulty.poison = 999.0
        poisoned = _rows(2)
        poisoned[1, 0] = 999.0
        with pytest.raises(DeviceOutOfMemoryError):  # its healthy row ran, then it failed
            await engine.infer({"input": poisoned})
        doc = _doc(engine)
        assert _counts(doc)["success"] == 1
        assert _counts(doc)["fail"] == 1
        assert doc["inference_count"] == 8
        assert _batches(doc) == {1: 1, 2: 4}
        _consistent(doc)
        await engine.stop()

    run(main)


def test_each_version_keeps_its_own_statistics_and_a_reload_starts_them_afresh(
    tmp_path: Path,
) -> None:
    """Triton reports one entry per loaded version; a reloaded model is a new model whose
    statistics start at zero."""
    write_model(tmp_path, "b")
    write_version(tmp_path, "b", 2, scale=2.0)
    config = test_config(
        device="cpu", model_repository=tmp_path, model_control_mode="explicit", load_models=("b",)
    )
    policy = orjson.dumps({"version_policy": {"all": {}}}).decode()
    with ServerThread(config) as server:
        load = orjson.dumps({"parameters": {"config": policy}})
        assert call(server.port, "POST", "/v2/repository/models/b/load", load)[0] == 200
        for version, times in (("1", 2), ("2", 1)):
            for _ in range(times):
                path = f"/v2/models/b/versions/{version}/infer"
                assert call(server.port, "POST", path, BODY)[0] == 200
        _, doc = call(server.port, "GET", "/v2/models/b/stats")
        success = {
            s["version"]: s["inference_stats"]["success"]["count"] for s in doc["model_stats"]
        }
        assert success == {"1": 2, "2": 1}
        for entry in doc["model_stats"]:
            _consistent(entry)
        _, one = call(server.port, "GET", "/v2/models/b/versions/2/stats")
        assert [s["version"] for s in one["model_stats"]] == ["2"]
        assert call(server.port, "POST", "/v2/repository/models/b/load", load)[0] == 200
        _, fresh = call(server.port, "GET", "/v2/models/b/stats")
        assert {s["inference_stats"]["success"]["count"] for s in fresh["model_stats"]} == {0}
