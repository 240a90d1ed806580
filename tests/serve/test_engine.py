from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from torchplace.cli import main as cli_main
from torchplace.errors import (
    ConfigError,
    InputError,
    KernelError,
    NotReadyError,
    OverloadedError,
    PayloadTooLargeError,
)
from torchplace.models import TensorSpec
from torchplace.serve.config import ServeConfig
from torchplace.serve.engine import FULL_INLINE_GIVE_UP, INLINE_PROBATION, Engine, resolve_devices
from torchplace.serve.execution import Transfer
from torchplace.serve.loader import LoadedModel, load_model

from .engine_helpers import Scale, loaded, save_exported

CPU = torch.device("cpu")


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(coro_fn())  # type: ignore[arg-type]


def _expected(engine: Engine, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return engine.loaded.module(torch.from_numpy(x)).numpy()


def test_from_config_builds_without_placing() -> None:
    engine = Engine.from_config(ServeConfig(model="seed-mlp", device="cpu", max_batch_size=8))
    assert (engine.name, engine.version, engine.platform) == ("seed-mlp", "1", "pytorch")
    assert engine.max_batch_size == 8
    assert engine.inputs[0].shape == (-1, 8)
    assert not engine.is_ready()
    assert engine.is_live()
    assert all(r.module is None for r in engine.replicas)


def test_infer_before_start_is_not_ready() -> None:
    async def main() -> None:
        engine = Engine(load_model("seed-mlp"), [CPU])
        with pytest.raises(NotReadyError, match="still loading"):
            await engine.infer({"input": np.zeros((1, 8), np.float32)})

    run(main)


def test_many_concurrent_callers_get_their_own_rows(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        engine = Engine(load_model("seed-mlp"), [CPU], max_batch_size=32, max_delay_ms=1.0)
        with caplog.at_level(logging.INFO, logger="torchplace.serve"):
            await engine.start()
        assert engine.is_ready()
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal((1 + i % 4, 8)).astype(np.float32) for i in range(200)]
        results = await asyncio.gather(*(engine.infer({"input": x}) for x in xs))
        for x, result in zip(xs, results, strict=True):
            assert set(result) == {"output"}
            np.testing.assert_allclose(result["output"], _expected(engine, x), rtol=1e-5, atol=1e-6)
        await engine.stop()
        assert not engine.is_live()
        assert not engine.is_ready()

    run(main)
    records = [
        json.loads(r.getMessage()) for r in caplog.records if "serve.start" in r.getMessage()
    ]
    assert len(records) == 1
    record = records[0]
    assert record["device"] == "cpu"
    assert record["model"] == "seed-mlp"
    assert record["version"] == "1"
    assert record["weight_bytes"] == load_model("seed-mlp").weight_bytes
    assert record["max_batch_size"] == 32
    assert "cpu" in record["visible_devices"]
    assert "memory_after_warmup" in record
    assert record["host_max_rss_bytes"] > 0


def test_requests_are_batched() -> None:
    async def main() -> None:
        engine = Engine(loaded(Scale()), [CPU], max_batch_size=16, max_delay_ms=20.0)
        await engine.start()
        module = engine.replicas[0].module
        assert module is not None
        seen: list[int] = []
        module.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[0]))
        xs = [np.full((1, 4), i, np.float32) for i in range(16)]
        results = await asyncio.gather(*(engine.infer({"input": x}) for x in xs))
        assert seen == [16]  # one forward for sixteen one-row requests
        for x, result in zip(xs, results, strict=True):
            np.testing.assert_array_equal(result["output"], x * 2)
        await engine.stop()

    run(main)


def test_the_next_fill_window_opens_once_the_answers_are_made() -> None:
    """A caller that awaits its result makes its answer one pass of the loop after its batch is
    done (a gRPC handler does): the batcher is told the replica is free after that, so the next
    batch's fill window does not pass while the answers are being made."""

    async def main() -> None:
        engine = Engine(loaded(Scale()), [CPU], max_batch_size=4, max_delay_ms=50.0)
        await engine.start()
        answered: list[float] = []

        async def call() -> None:
            await engine.infer({"input": np.ones((1, 4), np.float32)})
            answered.append(time.perf_counter())

        await asyncio.gather(*(call() for _ in range(4)))
        await asyncio.sleep(0)
        batcher = engine._batcher
        assert batcher is not None
        assert len(answered) == 4
        assert batcher._freed_at >= max(answered)
        await engine.stop()

    run(main)


def test_input_errors_name_the_problem() -> None:
    async def main() -> None:
        engine = Engine(load_model("seed-mlp"), [CPU], max_batch_size=4, max_request_rows=6)
        await engine.start()
        with pytest.raises(InputError, match="missing"):
            await engine.infer({"other": np.zeros((1, 8), np.float32)})
        with pytest.raises(PayloadTooLargeError, match=r"at most 6 rows \(--max-request-rows\)"):
            await engine.infer({"input": np.zeros((7, 8), np.float32)})
        with pytest.raises(InputError, match="at least one row"):
            await engine.infer({"input": np.zeros((0, 8), np.float32)})
        with pytest.raises(InputError, match="batch dimension"):
            await engine.infer({"input": np.zeros((), np.float32)})
        assert engine.is_ready()
        await engine.stop()

    run(main)


def test_full_queue_is_overloaded_and_counted() -> None:
    async def main() -> None:
        engine = Engine(
            load_model("seed-mlp"), [CPU], max_batch_size=1, max_queue=2, max_delay_ms=0.0
        )
        await engine.start()
        x = np.zeros((1, 8), np.float32)
        tasks = [asyncio.ensure_future(engine.infer({"input": x})) for _ in range(2)]
        await asyncio.sleep(0)  # both queued, nothing dispatched yet
        with pytest.raises(OverloadedError):
            await engine.infer({"input": x})
        await asyncio.gather(*tasks)
        text = engine.metrics_text().decode()
        assert (
            'torchplace_errors_total{class="overload",device="cpu",model="seed-mlp",version="1"} 1.0'
            in text
        )
        await engine.stop()

    run(main)


def test_replicas_share_the_load_and_stay_on_their_device() -> None:
    async def main() -> None:
        engine = Engine(
            loaded(Scale()), [CPU], replicas_per_device=2, max_batch_size=4, max_delay_ms=0.0
        )
        await engine.start()
        assert len(engine.replicas) == 2
        modules = [r.module for r in engine.replicas]
        assert modules[0] is not modules[1]  # one model copy per replica
        devices_seen: list[list[torch.device]] = [[], []]
        for i, module in enumerate(modules):
            assert module is not None
            module.register_forward_hook(
                lambda m, args, out, i=i: devices_seen[i].append(args[0].device)
            )
        xs = [np.full((2, 4), i, np.float32) for i in range(64)]
        results = await asyncio.gather(*(engine.infer({"input": x}) for x in xs))
        for x, result in zip(xs, results, strict=True):
            np.testing.assert_array_equal(result["output"], x * 2)
        assert devices_seen[0]
        assert devices_seen[1]
        assert all(d == CPU for seen in devices_seen for d in seen)
        lanes = engine.pool.lanes
        assert sum(lane.rows_served for lane in lanes) == 128
        await engine.stop()

    run(main)


def test_drain_finishes_queued_work_then_refuses() -> None:
    async def main() -> None:
        engine = Engine(loaded(Scale()), [CPU], max_batch_size=2, max_delay_ms=0.0)
        await engine.start()
        xs = [np.full((1, 4), i, np.float32) for i in range(10)]
        tasks = [asyncio.ensure_future(engine.infer({"input": x})) for x in xs]
        await asyncio.sleep(0)
        await engine.drain(5.0)
        assert not engine.is_ready()
        for x, task in zip(xs, tasks, strict=True):
            np.testing.assert_array_equal(task.result()["output"], x * 2)
        with pytest.raises(NotReadyError, match="shutting down"):
            await engine.infer({"input": xs[0]})
        await engine.stop()

    run(main)


def test_observe_request_labels_the_serving_device() -> None:
    async def main() -> None:
        engine = Engine(load_model("seed-mlp"), [CPU])
        await engine.start()
        await engine.infer({"input": np.zeros((1, 8), np.float32)})
        engine.observe_request(200, 0.003)
        engine.observe_request(400, 0.001)
        text = engine.metrics_text().decode()
        assert (
            'torchplace_requests_total{device="cpu",model="seed-mlp",status="200",version="1"} 1.0'
            in text
        )
        assert (
            'torchplace_errors_total{class="input",device="cpu",model="seed-mlp",version="1"} 1.0'
            in text
        )
        await engine.stop()

    run(main)


def test_trace_file_is_written_on_stop(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"

    async def main() -> None:
        engine = Engine(load_model("seed-mlp"), [CPU], trace_file=path)
        await engine.start()
        await asyncio.gather(
            *(engine.infer({"input": np.zeros((1, 8), np.float32)}) for _ in range(5))
        )
        await engine.stop()

    run(main)
    document = json.loads(path.read_text())
    names = {e["name"] for e in document["traceEvents"]}
    assert {"batch", "h2d", "compute", "d2h", "request", "queue"} <= names
    assert sum(1 for e in document["traceEvents"] if e["name"] == "request" and e["ph"] == "b") == 5


def test_exported_program_serves_through_the_engine(tmp_path: Path) -> None:
    host = load_model("seed-mlp").module
    path = save_exported(tmp_path / "seed.pt2", host, torch.zeros(4, 8))

    async def main() -> None:
        engine = Engine.from_config(ServeConfig(model="seed-mlp", exported=path, device="cpu"))
        await engine.start()
        x = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)
        result = await engine.infer({"input": x})
        with torch.inference_mode():
            expected = host(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(result["output"], expected, rtol=1e-5, atol=1e-6)
        await engine.stop()

    run(main)


def _start_fails(engine: Engine) -> ConfigError:
    async def main() -> ConfigError:
        try:
            with pytest.raises(ConfigError) as exc:
                await engine.start()
            assert not engine.is_ready()
            return exc.value
        finally:
            await engine.stop()

    result: ConfigError = run(main)
    return result


def test_declared_inputs_that_do_not_fit_the_model_fail_start_up_as_config_error() -> None:
    wrong = (TensorSpec("input", "FP32", (-1, 9)),)
    engine = Engine.from_config(
        ServeConfig(model="seed-mlp", inputs=wrong, device="cpu", max_batch_size=32)
    )
    message = str(_start_fails(engine))
    assert "start-up dry run" in message
    assert "input:FP32:-1,9" in message  # the declared name, datatype and shape
    assert "--max-batch-size 32" in message
    assert "mat1 and mat2 shapes cannot be multiplied" in message  # the model's own error
    assert "--input NAME:DTYPE:DIMS" in message  # the fix


@pytest.mark.parametrize("batch_max", [None, 16])
def test_exported_program_with_a_small_batch_fails_start_up_as_config_error(
    batch_max: int | None, tmp_path: Path
) -> None:
    host = load_model("seed-mlp").module
    path = save_exported(
        tmp_path / "small.pt2", host, torch.zeros(4, 8), batch_max=batch_max, batch_min=None
    )
    engine = Engine.from_config(
        ServeConfig(model="seed-mlp", exported=path, device="cpu", max_batch_size=32)
    )
    message = str(_start_fails(engine))
    assert "input:FP32:-1,8" in message
    assert "--max-batch-size 32" in message
    assert "dynamic batch dimension whose max >= --max-batch-size" in message


def test_serve_command_exits_2_on_inputs_that_do_not_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["serve", "--device", "cpu", "--port", "0", "--input", "input:FP32:-1,9"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "input:FP32:-1,9" in err
    assert "KernelError" not in err


class _FailsOnNegatives(torch.nn.Module):
    """Passes the start-up dry run (zeros), fails on a request with a negative value."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x < 0).any()):
            raise RuntimeError("negative input")
        return x * 2


def test_a_forward_failure_after_start_up_stays_a_kernel_error() -> None:
    async def main() -> None:
        engine = Engine(loaded(_FailsOnNegatives()), [CPU], max_batch_size=4)
        await engine.start()
        try:
            with pytest.raises(KernelError, match="negative input"):
                await engine.infer({"input": -np.ones((1, 4), np.float32)})
        finally:
            await engine.stop()

    run(main)


def test_resolve_devices() -> None:
    assert resolve_devices("cpu") == [CPU]
    assert resolve_devices("cpu", ("cpu", "cpu")) == [CPU]
    assert resolve_devices("cpu", ("meta", "cpu")) == [torch.device("meta"), CPU]
    if not torch.cuda.is_available():
        assert resolve_devices("auto", ("all",)) == [CPU]


@pytest.mark.cuda
def test_cuda_engine_answers_and_logs_the_full_device(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        engine = Engine(load_model("wide-mlp"), [torch.device("cuda", 0)], max_batch_size=32)
        with caplog.at_level(logging.INFO, logger="torchplace.serve"):
            await engine.start()
        rng = np.random.default_rng(0)
        xs = [rng.standard_normal((1, 512)).astype(np.float32) for _ in range(64)]
        results = await asyncio.gather(*(engine.infer({"input": x}) for x in xs))
        for x, result in zip(xs, results, strict=True):
            np.testing.assert_allclose(result["output"], _expected(engine, x), rtol=1e-3, atol=1e-4)
        text = engine.metrics_text().decode()
        assert 'device="cuda:0"' in text
        assert "torchplace_device_memory_allocated_bytes{" in text
        await engine.stop()

    run(main)
    record = next(
        json.loads(r.getMessage()) for r in caplog.records if "serve.start" in r.getMessage()
    )
    assert record["device"] == "cuda:0"
    assert record["memory_after_warmup"]["cuda:0"]["allocated_bytes"] > 0
    assert record["replicas"][0]["pinned_staging"] is True


@pytest.mark.cuda
def test_all_devices_means_every_visible_gpu() -> None:
    gpus = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    assert resolve_devices("auto", ("all",)) == gpus
    engine = Engine(
        load_model("seed-mlp"), resolve_devices("auto", ("all",)), replicas_per_device=2
    )
    assert engine.devices == [str(gpu) for gpu in gpus]
    assert [r.label for r in engine.replicas] == [str(gpu) for gpu in gpus for _ in range(2)]


@pytest.mark.cuda
def test_a_bare_cuda_device_gets_its_index() -> None:
    engine = Engine(load_model("seed-mlp"), [torch.device("cuda")])
    full = f"cuda:{torch.cuda.current_device()}"
    assert engine.devices == [full]
    assert [r.label for r in engine.replicas] == [full]


def test_a_bad_request_does_not_poison_its_batch() -> None:
    async def main() -> None:
        engine = Engine(loaded(Scale()), [CPU], max_batch_size=8, max_delay_ms=5.0)
        await engine.start()
        good = np.ones((2, 4), np.float32)
        results = await asyncio.gather(
            engine.infer({"input": good}),
            engine.infer({"input": np.ones((2, 5), np.float32)}),
            engine.infer({"input": np.array([["a"] * 4], dtype=object)}),
            engine.infer({"input": good.astype(np.float64)}),
            return_exceptions=True,
        )
        np.testing.assert_array_equal(results[0]["output"], good * 2)
        assert isinstance(results[1], InputError)
        assert "expected [-1, 4]" in str(results[1])
        assert isinstance(results[2], InputError)
        assert "dtype object" in str(results[2])
        np.testing.assert_array_equal(results[3]["output"], good * 2)  # cast on gather
        await engine.stop()

    run(main)


def test_a_timed_out_request_is_dropped_from_the_queue() -> None:
    gate = threading.Event()  # shared by every copy of the model (not deep-copied)
    gate.set()

    class Slow(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[float] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            gate.wait(5.0)
            self.rows += x[:, 0].tolist()
            return x

    async def main() -> None:
        engine = Engine(loaded(Slow()), [CPU], max_batch_size=1, max_delay_ms=0.0)
        await engine.start()
        module = engine.replicas[0].module
        assert isinstance(module, Slow)
        module.rows.clear()
        gate.clear()
        first = asyncio.ensure_future(engine.infer({"input": np.full((1, 4), 1.0, np.float32)}))
        await asyncio.sleep(0.01)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(engine.infer({"input": np.full((1, 4), 2.0, np.float32)}), 0.01)
        gate.set()
        third = await engine.infer({"input": np.full((1, 4), 3.0, np.float32)})
        assert (await first)["output"][0, 0] == 1.0
        assert third["output"][0, 0] == 3.0
        assert module.rows == [1.0, 3.0]  # the abandoned request never ran
        await engine.stop()

    run(main)


class _RowSum(torch.nn.Module):
    """Each row's sum, of rows of any width (a dynamic non-batch dimension)."""

    def __init__(self) -> None:
        super().__init__()
        self.widths: list[list[int]] = []  # per forward: its rows' width, its row count

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.widths.append([x.shape[1], x.shape[0]])
        return x.sum(dim=1, keepdim=True)


def _row_sum() -> LoadedModel:
    return loaded(
        _RowSum(),
        inputs=(TensorSpec("input", "FP32", (-1, -1)),),
        outputs=(TensorSpec("output", "FP32", (-1, 1)),),
    )


def test_dynamic_row_shapes_of_different_widths_are_each_answered() -> None:
    async def main() -> None:
        engine = Engine(_row_sum(), [CPU], max_batch_size=8, max_delay_ms=5.0)
        await engine.start()
        xs = [np.ones((2, width), np.float32) for width in (3, 5, 7)]
        results = await asyncio.gather(*(engine.infer({"input": x}) for x in xs))
        for x, result in zip(xs, results, strict=True):
            np.testing.assert_array_equal(result["output"], x.sum(axis=1, keepdims=True))
        await engine.stop()

    run(main)


def test_dynamic_row_shapes_share_a_batch_when_their_shapes_are_equal() -> None:
    async def main() -> None:
        engine = Engine(_row_sum(), [CPU], max_batch_size=8, max_delay_ms=50.0)
        await engine.start()
        module = engine.replicas[0].module
        assert isinstance(module, _RowSum)
        module.widths.clear()
        widths = (3, 3, 3, 5, 5, 3)
        xs = [np.full((1, w), i + 1.0, np.float32) for i, w in enumerate(widths)]
        results = await asyncio.gather(*(engine.infer({"input": x}) for x in xs))
        for x, result in zip(xs, results, strict=True):
            np.testing.assert_array_equal(result["output"], x.sum(axis=1, keepdims=True))
        # queue order kept: a batch ends at the first request of another shape
        assert module.widths == [[3, 3], [5, 2], [3, 1]]
        await engine.stop()

    run(main)


def test_through_the_engine_each_batch_crosses_once_each_way() -> None:
    class Counting(Transfer):
        def __init__(self) -> None:
            self.h2d = 0
            self.d2h = 0

        def to_device(
            self, host: torch.Tensor, device: torch.device, non_blocking: bool
        ) -> torch.Tensor:
            self.h2d += 1
            return super().to_device(host, device, non_blocking)

        def to_host(
            self, src: torch.Tensor, out: torch.Tensor | None, non_blocking: bool
        ) -> torch.Tensor:
            self.d2h += 1
            return super().to_host(src, out, non_blocking)

    async def main() -> None:
        counting = Counting()
        engine = Engine(
            loaded(Scale()), [CPU], max_batch_size=8, max_delay_ms=1.0, transfer=counting
        )
        await engine.start()
        module = engine.replicas[0].module
        assert module is not None
        batches: list[int] = []
        module.register_forward_hook(lambda m, args, out: batches.append(args[0].shape[0]))
        counting.h2d = counting.d2h = 0
        xs = [np.full((1 + i % 3, 4), i, np.float32) for i in range(40)]
        results = await asyncio.gather(*(engine.infer({"input": x}) for x in xs))
        for x, result in zip(xs, results, strict=True):
            np.testing.assert_array_equal(result["output"], x * 2)
        assert sum(batches) == sum(x.shape[0] for x in xs)
        assert len(batches) < len(xs)  # requests were coalesced
        assert counting.h2d == len(batches)
        assert counting.d2h == len(batches)
        await engine.stop()

    run(main)


def test_from_config_plans_replicas_and_fallback() -> None:
    config = ServeConfig(
        model="seed-mlp",
        devices=("cpu",),
        replicas_per_device=3,
        fallback="cpu",
        failure_threshold=2,
    )
    engine = Engine.from_config(config)
    assert [r.name for r in engine.replicas] == ["cpu#0", "cpu#1", "cpu#2", "cpu#3"]
    assert [r.fallback for r in engine.replicas] == [False, False, False, True]
    assert all(r.health.threshold == 2 for r in engine.replicas)
    assert engine.devices == ["cpu"]


class _Where(Scale):
    """Scale that records the thread each forward runs on."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.spin_s = 0.0  # CPU time to burn in each forward
        self.threads: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.threads.append(threading.get_ident())
        if self.delay_s:
            threading.Event().wait(self.delay_s)
        if self.spin_s:
            until = time.thread_time() + self.spin_s
            while time.thread_time() < until:
                pass
        return super().forward(x)


@pytest.mark.parametrize(("inline_ms", "on_loop"), [(1000.0, True), (0.0, False)])
def test_a_cheap_cpu_batch_runs_on_the_event_loop_only_when_allowed(
    inline_ms: float, on_loop: bool
) -> None:
    async def main() -> None:
        engine = Engine(loaded(_Where()), [CPU], inline_batch_ms=inline_ms)
        await engine.start()
        replica = engine.replicas[0]
        record = engine.startup_record["replicas"][0]
        if on_loop:
            assert replica.full_batch_s is not None
            assert replica.full_batch_s > 0
            assert record["full_batch_ms"] > 0
        else:  # never inline: no start-up time spent timing its batch
            assert replica.full_batch_s is None
            assert record["full_batch_ms"] is None
        assert record["inline"] is on_loop
        assert not replica.inline  # first its probation on the worker thread
        assert replica.probation == (INLINE_PROBATION if on_loop else 0)
        model = replica.module
        assert isinstance(model, _Where)
        rows = np.arange(8, dtype=np.float32).reshape(2, 4)
        for _ in range(INLINE_PROBATION + 1):
            result = await engine.infer({"input": rows})
            np.testing.assert_array_equal(result["output"], rows * 2)
        loop_thread = threading.get_ident()
        assert loop_thread not in model.threads[-INLINE_PROBATION - 1 : -1]
        assert (model.threads[-1] == loop_thread) is on_loop
        assert replica.inline is on_loop
        await engine.stop()

    asyncio.run(main())


async def _rows_at_once(engine: Engine, count: int) -> None:
    """``count`` one-row requests submitted in one loop iteration (one batch when they fit)."""
    rows = [np.full((1, 4), i, np.float32) for i in range(count)]
    results = await asyncio.gather(*(engine.infer({"input": r}) for r in rows))
    for row, result in zip(rows, results, strict=True):
        np.testing.assert_array_equal(result["output"], row * 2)


def test_a_full_batch_no_request_waits_behind_runs_on_the_event_loop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A replica too dear for --inline-batch-ms but within --inline-full-batch-ms: after its
    probation on the worker thread, a full batch with nothing queued behind it runs on the
    loop; a partial one, or one with requests waiting behind it, on the worker thread; a full
    batch far over the limit ends it."""

    async def main() -> None:
        engine = Engine(
            loaded(_Where(delay_s=0.003)),
            [CPU],
            max_batch_size=4,
            inline_batch_ms=1.0,
            inline_full_batch_ms=1000.0,
            max_delay_ms=0.0,
        )
        await engine.start()
        replica = engine.replicas[0]
        model = replica.module
        assert isinstance(model, _Where)
        assert not replica.inline
        assert not replica.full_inline
        assert replica.probation == INLINE_PROBATION
        record = engine.startup_record["replicas"][0]
        assert (record["inline"], record["inline_full"]) == (False, True)
        loop_thread = threading.get_ident()
        for _ in range(INLINE_PROBATION):
            await _rows_at_once(engine, 4)
            assert model.threads[-1] != loop_thread
        await _rows_at_once(engine, 4)  # full, nothing behind it
        assert replica.full_inline
        assert model.threads[-1] == loop_thread
        await _rows_at_once(engine, 3)  # not full
        assert model.threads[-1] != loop_thread
        await _rows_at_once(engine, 6)  # full, but two rows wait behind it
        assert model.threads[-2:] == [model.threads[-2]] * 2
        assert model.threads[-2] != loop_thread
        replica.full_inline_limit_s = FULL_INLINE_GIVE_UP * 0.01  # as if the limit were 10 ms
        model.delay_s = 0.05  # over it
        with caplog.at_level(logging.WARNING, logger="torchplace.serve"):
            await _rows_at_once(engine, 4)
        assert model.threads[-1] == loop_thread  # held once...
        assert not replica.full_inline
        assert "a full batch took" in caplog.text
        model.delay_s = 0.0
        await _rows_at_once(engine, 4)
        assert model.threads[-1] != loop_thread  # ...and never again
        await engine.stop()

    asyncio.run(main())


def test_a_forward_that_waits_on_real_rows_never_runs_full_batches_on_the_loop() -> None:
    """The probation counts wall time: a forward cheap on the dry run's zeros that waits on
    real rows (over the limit, not the give-up) restarts it; past the give-up it ends it."""

    async def main() -> None:
        engine = Engine(
            loaded(_Where()), [CPU], max_batch_size=2, inline_batch_ms=0.0,
            inline_full_batch_ms=5.0, max_delay_ms=0.0,
        )  # fmt: skip
        await engine.start()
        replica = engine.replicas[0]
        model = replica.module
        assert isinstance(model, _Where)
        assert replica.probation == INLINE_PROBATION
        model.delay_s = 0.008  # over 5 ms, under the give-up's 15 ms
        for _ in range(INLINE_PROBATION + 2):
            await _rows_at_once(engine, 2)
        assert replica.probation == INLINE_PROBATION
        assert not replica.full_inline
        model.delay_s = 0.03  # over the give-up
        await _rows_at_once(engine, 2)
        assert replica.probation == 0
        assert not replica.full_inline
        model.delay_s = 0.0
        for _ in range(INLINE_PROBATION + 2):
            await _rows_at_once(engine, 2)
        assert not replica.full_inline
        assert threading.get_ident() not in model.threads
        await engine.stop()

    asyncio.run(main())


def test_full_batches_stay_on_the_worker_thread_when_not_allowed() -> None:
    async def main() -> None:
        for kwargs in ({"inline_full_batch_ms": 0.0}, {"inline_full_batch_ms": 1.0}):
            engine = Engine(loaded(_Where(delay_s=0.003)), [CPU], max_batch_size=2, **kwargs)
            await engine.start()
            replica = engine.replicas[0]
            assert not replica.full_inline
            model = replica.module
            assert isinstance(model, _Where)
            await _rows_at_once(engine, 2)
            assert model.threads[-1] != threading.get_ident()
            await engine.stop()
        with pytest.raises(ConfigError, match="inline_full_batch_ms must be >= 0"):
            Engine(loaded(Scale()), [CPU], inline_full_batch_ms=-1.0)

    asyncio.run(main())


def test_batches_stay_on_worker_threads_when_slow_or_shared() -> None:
    """Over the limit, or with several replicas (which compute in parallel), no replica is
    inline."""

    async def main() -> None:
        slow = Engine(loaded(_Where(delay_s=0.01)), [CPU], inline_batch_ms=1.0)
        shared = Engine(loaded(_Where()), [CPU], replicas_per_device=2, inline_batch_ms=1000.0)
        for engine in (slow, shared):
            await engine.start()
            assert not any(r.inline for r in engine.replicas)
        assert all(r.full_batch_s is None for r in shared.replicas)  # not even timed
        for engine in (slow, shared):
            result = await engine.infer({"input": np.ones((1, 4), np.float32)})
            np.testing.assert_array_equal(result["output"], np.full((1, 4), 2.0, np.float32))
            await engine.stop()
        assert slow.replicas[0].full_batch_s is not None
        assert slow.replicas[0].full_batch_s >= 0.01

    asyncio.run(main())


def test_submit_queues_without_a_task_and_names_the_device_that_served() -> None:
    async def main() -> None:
        engine = Engine(loaded(Scale()), [CPU], max_batch_size=2)
        await engine.start()
        rows = np.arange(20, dtype=np.float32).reshape(5, 4)  # 3 chunks
        submitted = engine.submit({"input": rows})
        assert submitted.device == ""  # not run yet
        np.testing.assert_array_equal((await submitted.future)["output"], rows * 2)
        assert submitted.device == "cpu"
        engine.observe_request(200, 0.001, submitted.device)
        assert 'status="200"' in engine.metrics_text().decode()
        assert engine.statistics.inference_count == 5
        with pytest.raises(InputError):
            engine.submit({"input": np.zeros((1, 3), np.float32)})  # raised, not queued
        await engine.stop()

    asyncio.run(main())


class _SlowOnData(_Where):
    """_Where that is slow on inputs that are not zeros (the dry runs send zeros) once it has
    run ``fast`` of them."""

    def __init__(self, fast: int = 0) -> None:
        super().__init__()
        self.fast = fast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.delay_s = 0.0
        if bool(x.any()):
            self.delay_s = 0.3 if self.fast <= 0 else 0.0
            self.fast -= 1
        return super().forward(x)


def test_a_model_slow_on_real_rows_never_runs_on_the_event_loop() -> None:
    """Fast in the dry run (zeros), slow on the first real batch: that batch runs on the
    worker thread (the probation), and so do the batches after it; the loop is never held."""

    async def main() -> None:
        engine = Engine(loaded(_SlowOnData()), [CPU], inline_batch_ms=5.0)
        await engine.start()
        replica = engine.replicas[0]
        assert engine.startup_record["replicas"][0]["inline"]  # planned, on probation
        model = replica.module
        assert isinstance(model, _SlowOnData)
        ones = np.ones((1, 4), np.float32)
        loop_thread = threading.get_ident()
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        result = await engine.infer({"input": ones})  # 0.3 s on the worker
        assert ticks >= 5  # the loop ran meanwhile
        ticker.cancel()
        np.testing.assert_array_equal(result["output"], ones * 2)
        assert replica.probation == 0
        model.delay_s, model.fast = 0.0, 100  # cheap from now on: still the worker
        for _ in range(INLINE_PROBATION + 1):
            await engine.infer({"input": ones})
        assert not replica.inline
        assert loop_thread not in model.threads[1:]  # nothing but the dry runs on the loop
        await engine.stop()

    asyncio.run(main())


def test_a_dear_probation_batch_starts_the_count_again() -> None:
    """A batch over the cheap bound of CPU time but under the give-up one of wall time
    restarts the probation; one that only waits (no CPU: a busy machine, the GIL) does not."""

    async def main() -> None:
        engine = Engine(loaded(_Where()), [CPU], inline_batch_ms=5.0)
        await engine.start()
        replica = engine.replicas[0]
        model = replica.module
        assert isinstance(model, _Where)
        ones = np.ones((1, 4), np.float32)
        for _ in range(INLINE_PROBATION - 1):
            await engine.infer({"input": ones})
        assert replica.probation == 1
        model.spin_s = 0.05  # CPU time over 4 x 5 ms, wall time under 50 x 5 ms
        await engine.infer({"input": ones})
        assert replica.probation == INLINE_PROBATION
        model.spin_s, model.delay_s = 0.0, 0.05  # waiting only: still cheap
        for _ in range(INLINE_PROBATION - 1):
            await engine.infer({"input": ones})
        assert replica.probation == 1
        model.delay_s = 0.0
        for _ in range(INLINE_PROBATION + 1):
            await engine.infer({"input": ones})
        assert replica.inline
        assert model.threads[-1] == threading.get_ident()
        await engine.stop()

    asyncio.run(main())


def test_an_inline_batch_far_slower_than_its_dry_run_moves_to_the_worker() -> None:
    """A forward whose time depends on the data: cheap through the probation (so inline),
    slow on a later batch; after that batch the replica's batches run on its worker thread."""

    async def main() -> None:
        engine = Engine(loaded(_SlowOnData(fast=INLINE_PROBATION + 1)), [CPU], inline_batch_ms=5.0)
        await engine.start()
        replica = engine.replicas[0]
        model = replica.module
        assert isinstance(model, _SlowOnData)
        ones = np.ones((1, 4), np.float32)
        for _ in range(INLINE_PROBATION + 1):
            await engine.infer({"input": ones})
        assert replica.inline
        for _ in range(2):
            result = await engine.infer({"input": ones})
            np.testing.assert_array_equal(result["output"], ones * 2)
        assert not replica.inline
        loop_thread = threading.get_ident()
        assert model.threads[-3] == loop_thread  # a cheap inline batch
        assert model.threads[-2] == loop_thread  # the slow batch ran on the loop
        assert model.threads[-1] != loop_thread  # the next one on the worker
        await engine.stop()

    asyncio.run(main())
