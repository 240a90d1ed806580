from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch

import torchplace
from torchplace.errors import ConfigError, InputError, KernelError, ServeError
from torchplace.models import TensorSpec
from torchplace.serve.loader import load_model
from torchplace.serve.replica import Replica

from .engine_helpers import CopyCounter, Scale, TwoInTwoOut, loaded


def _rows(n: int, width: int = 4, start: float = 0.0) -> np.ndarray:
    return (np.arange(n * width, dtype=np.float32).reshape(n, width) + start).astype(np.float32)


def test_prepare_places_a_private_copy_and_passes_the_dry_run() -> None:
    model = loaded(Scale())
    replica = Replica(model, torch.device("cpu"), max_batch_size=8)
    assert not replica.is_ready()
    replica.prepare()
    assert replica.is_ready()
    assert replica.module is not model.module
    assert replica.staging is not None
    assert replica.staging.max_rows == 8
    assert not replica.staging.is_pinned()  # pinned only for CUDA


def test_a_device_without_an_index_is_named_as_it_resolves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Replica(loaded, torch.device("cuda"))``: the parameters report ``cuda:N``, so the
    replica holds the full device (its readiness check compares the two), as the engine's do."""
    import torchplace.devices

    asked: list[torch.device] = []

    def resolve(device: torch.device) -> torch.device:
        asked.append(device)
        return torch.device("cuda", 1)

    monkeypatch.setattr(torchplace.devices, "resolve_device", resolve)
    replica = Replica(loaded(Scale()), torch.device("cuda"), max_batch_size=4)
    assert asked == [torch.device("cuda")]
    assert (replica.device, replica.label, replica.name) == (torch.device("cuda:1"), "cuda:1",
                                                             "cuda:1#0")  # fmt: skip
    assert Replica(loaded(Scale()), torch.device("cpu")).device == torch.device("cpu")
    assert len(asked) == 1  # a device with an index, or the CPU, is taken as it is


def test_readiness_is_read_from_the_parameters() -> None:
    replica = Replica(loaded(Scale()), torch.device("cpu"), max_batch_size=4)
    replica.prepare()
    assert replica.module is not None
    replica.module.weight = torch.nn.Parameter(torch.ones(4, device="meta"))
    assert not replica.weights_on_device()
    assert not replica.is_ready()


def test_run_batch_splits_rows_back_per_request() -> None:
    replica = Replica(loaded(Scale()), torch.device("cpu"), max_batch_size=16)
    replica.prepare()
    requests = [{"input": _rows(n, start=10.0 * i)} for i, n in enumerate((1, 3, 2, 5))]
    outcome = replica.run_batch(requests, [1, 3, 2, 5])
    assert outcome.rows == 11
    for request, result in zip(requests, outcome.results, strict=True):
        assert isinstance(result, dict)
        np.testing.assert_array_equal(result["output"], request["input"] * 2)


def test_results_do_not_alias_the_staging_buffer() -> None:
    class Identity(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    replica = Replica(loaded(Identity()), torch.device("cpu"), max_batch_size=4)
    replica.prepare()
    first = replica.run_batch([{"input": _rows(2)}], [2]).results[0]
    replica.run_batch([{"input": _rows(2, start=100.0)}], [2])
    assert isinstance(first, dict)
    np.testing.assert_array_equal(first["output"], _rows(2))


def test_one_h2d_and_one_d2h_per_batch_counted_on_a_second_device() -> None:
    # The replica runs on `meta` (a real second device for the dispatcher); the counter sees
    # every aten copy that crosses devices, whatever code path issued it.
    with CopyCounter() as counter:
        replica = Replica(loaded(Scale()), torch.device("meta"), max_batch_size=32)
        replica.prepare()
        assert replica.weights_on_device()
        for sizes in ((1,), (3, 1, 4), tuple([1] * 32), (16, 16)):
            counter.crossings.clear()
            requests = [{"input": _rows(n)} for n in sizes]
            outcome = replica.run_batch(requests, list(sizes))
            assert all(isinstance(r, dict) for r in outcome.results)
            assert counter.h2d() == 1, (sizes, counter.crossings)
            assert counter.d2h() == 1, (sizes, counter.crossings)
            assert len(counter.crossings) == 2


def test_one_copy_per_declared_tensor_with_two_inputs_and_outputs() -> None:
    model = loaded(
        TwoInTwoOut(),
        inputs=(TensorSpec("a", "FP32", (-1, 3)), TensorSpec("b", "FP32", (-1, 3))),
        outputs=(TensorSpec("sum", "FP32", (-1, 3)), TensorSpec("prod", "FP32", (-1, 1))),
    )
    with CopyCounter() as counter:
        replica = Replica(model, torch.device("meta"), max_batch_size=8)
        replica.prepare()
        counter.crossings.clear()
        requests = [{"a": _rows(2, 3), "b": _rows(2, 3)}, {"a": _rows(3, 3), "b": _rows(3, 3)}]
        replica.run_batch(requests, [2, 3])
    assert counter.h2d() == 2
    assert counter.d2h() == 2


def test_two_inputs_two_outputs_values_on_cpu() -> None:
    model = loaded(
        TwoInTwoOut(),
        inputs=(TensorSpec("a", "FP32", (-1, 3)), TensorSpec("b", "FP32", (-1, 3))),
        outputs=(TensorSpec("sum", "FP32", (-1, 3)), TensorSpec("prod", "FP32", (-1, 1))),
    )
    replica = Replica(model, torch.device("cpu"), max_batch_size=8)
    replica.prepare()
    a, b = _rows(2, 3), _rows(2, 3, start=1.0)
    (result,) = replica.run_batch([{"a": a, "b": b}], [2]).results
    assert isinstance(result, dict)
    np.testing.assert_allclose(result["sum"], a + b)
    np.testing.assert_allclose(result["prod"], (a * b).sum(axis=1, keepdims=True))


def test_declared_output_shape_is_checked_by_the_dry_run() -> None:
    model = loaded(Scale(), outputs=(TensorSpec("output", "FP32", (-1, 5)),))
    replica = Replica(model, torch.device("cpu"), max_batch_size=4)
    with pytest.raises(ConfigError, match=r"output 'output'.*\[4\].*\[-?5\]"):
        replica.prepare()
    assert not replica.is_ready()


def test_output_dtype_follows_the_declaration() -> None:
    model = loaded(Scale(), outputs=(TensorSpec("output", "FP64", (-1, 4)),))
    replica = Replica(model, torch.device("cpu"), max_batch_size=4)
    replica.prepare()
    (result,) = replica.run_batch([{"input": _rows(1)}], [1]).results
    assert isinstance(result, dict)
    assert result["output"].dtype == np.float64


def test_a_wrong_output_count_is_a_kernel_error() -> None:
    class Pair(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, x

    replica = Replica(loaded(Pair()), torch.device("cpu"), max_batch_size=4)
    with pytest.raises(KernelError, match="2 outputs, 1 are declared"):
        replica.prepare()


def test_rows_of_the_wrong_width_are_an_input_error() -> None:
    replica = Replica(loaded(Scale()), torch.device("cpu"), max_batch_size=4)
    replica.prepare()
    (result,) = replica.run_batch([{"input": np.zeros((2, 5), np.float32)}], [2]).results
    assert isinstance(result, InputError)
    assert "input 'input'" in str(result)


def test_embedded_models_match_the_host_model() -> None:
    for name, width in (("seed-mlp", 8), ("wide-mlp", 512)):
        model = load_model(name)
        replica = Replica(model, torch.device("cpu"), max_batch_size=4)
        replica.prepare()
        x = np.random.default_rng(1).standard_normal((3, width)).astype(np.float32)
        (result,) = replica.run_batch([{"input": x}], [3]).results
        with torch.inference_mode():
            expected = model.module(torch.from_numpy(x)).numpy()
        assert isinstance(result, dict)
        np.testing.assert_allclose(result["output"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
def test_cuda_replica_pins_staging_and_copies_once_each_way() -> None:
    device = torch.device("cuda", 0)
    replica = Replica(load_model("seed-mlp"), device, max_batch_size=32)
    replica.prepare()
    assert replica.is_ready()
    assert replica.staging is not None
    assert replica.staging.is_pinned()
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    with CopyCounter() as counter:
        outcome = replica.run_batch([{"input": x[:2]}, {"input": x[2:]}], [2, 3])
    assert counter.h2d() == 1, counter.crossings
    assert counter.d2h() == 1, counter.crossings
    with torch.inference_mode():
        expected = load_model("seed-mlp").module(torch.from_numpy(x)).numpy()
    got = np.concatenate([r["output"] for r in outcome.results if isinstance(r, dict)])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert outcome.h2d_s >= 0
    assert outcome.compute_s > 0
    # the guard sees the same: one pinned (asynchronous) copy each way and ONE host sync, the
    # wait on the batch's last event; no pageable non_blocking copy
    with torchplace.guard() as report:
        (result,) = replica.run_batch([{"input": x}], [5]).results
    assert isinstance(result, dict)
    np.testing.assert_allclose(result["output"], expected, rtol=1e-4, atol=1e-5)
    assert (report.h2d, report.d2h) == (1, 1), report.events
    assert report.h2d_bytes == x.nbytes
    assert [e.op for e in report.syncs] == ["torch.cuda.Event.synchronize"], report.events
    assert report.pageable_non_blocking == []
    assert report.mixed_device_ops == []


def test_staged_outputs_are_copied_out_before_the_buffer_is_reused() -> None:
    """The CUDA output path (D2H into a reused host buffer), exercised on the CPU."""
    replica = Replica(loaded(Scale()), torch.device("cpu"), max_batch_size=4)
    replica.prepare()
    assert replica.staging is not None
    replica.staging.prepare_outputs({"output": (torch.float32, (4,))})
    with CopyCounter() as counter:
        first = replica.run_batch([{"input": _rows(1)}, {"input": _rows(2, start=4.0)}], [1, 2])
    assert counter.crossings == []  # on the CPU the copy into the buffer is host to host
    second = replica.run_batch([{"input": _rows(3, start=100.0)}], [3])
    a, b = first.results
    (c,) = second.results
    assert isinstance(a, dict)
    assert isinstance(b, dict)
    assert isinstance(c, dict)
    np.testing.assert_array_equal(a["output"], _rows(1) * 2)
    np.testing.assert_array_equal(b["output"], _rows(2, start=4.0) * 2)
    np.testing.assert_array_equal(c["output"], _rows(3, start=100.0) * 2)
    buffer = replica.staging.output_array("output")
    assert not np.shares_memory(c["output"], buffer)


@pytest.mark.cuda
def test_a_cuda_batch_runs_on_the_replica_stream_from_any_thread() -> None:
    """The worker thread starts on the default device (0): a replica on the last GPU (cuda:1
    and up when there are several) must still run every op on its device and its stream, and
    leave the calling thread's device and streams as they were."""
    device = torch.device("cuda", torch.cuda.device_count() - 1)
    replica = Replica(loaded(Scale()), device, max_batch_size=8)
    replica.prepare()
    assert replica.module is not None
    assert replica.weights_on_device()
    seen: list[tuple[torch.device, Any, int]] = []
    replica.module.register_forward_hook(
        lambda module, args, out: seen.append(
            (args[0].device, torch.cuda.current_stream(args[0].device), torch.cuda.current_device())
        )
    )
    found: dict[str, Any] = {}

    def work() -> None:
        found["before"] = (torch.cuda.current_device(), torch.cuda.current_stream(device))
        found["outcome"] = replica.run_batch([{"input": _rows(2)}, {"input": _rows(1)}], [2, 1])
        found["after"] = (torch.cuda.current_device(), torch.cuda.current_stream(device))

    worker = threading.Thread(target=work)
    worker.start()
    worker.join(60)
    first, second = found["outcome"].results
    assert isinstance(first, dict)
    assert isinstance(second, dict)
    np.testing.assert_array_equal(first["output"], _rows(2) * 2)
    np.testing.assert_array_equal(second["output"], _rows(1) * 2)
    ((input_device, stream, current),) = seen
    assert input_device == device
    assert stream == replica._stream
    assert stream != torch.cuda.default_stream(device)
    assert current == device.index  # the stream context made the replica's GPU current
    assert found["after"] == found["before"]


@pytest.mark.cuda
def test_a_replica_on_the_second_gpu_places_and_counts_memory_there() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    device = torch.device("cuda", 1)
    before = torch.cuda.memory_allocated(0)
    replica = Replica(load_model("wide-mlp"), device, max_batch_size=32)
    replica.prepare()
    assert replica.is_ready()
    assert replica._stream is not None
    assert replica._stream.device == device
    assert torch.cuda.memory_allocated(1) >= replica.loaded.weight_bytes
    assert torch.cuda.memory_allocated(0) == before  # nothing of it landed on cuda:0
    x = np.random.default_rng(2).standard_normal((4, 512)).astype(np.float32)
    (result,) = replica.run_batch([{"input": x}], [4]).results
    with torch.inference_mode():
        expected = replica.loaded.module(torch.from_numpy(x)).numpy()
    assert isinstance(result, dict)
    np.testing.assert_allclose(result["output"], expected, rtol=1e-3, atol=1e-4)


def test_a_worker_thread_that_cannot_start_is_a_clear_error_and_not_taken_as_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replica = Replica(loaded(Scale()), torch.device("cpu"), max_batch_size=4)

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(ServeError, match=r"cannot start the worker thread.*serve fewer replicas"):
        replica.start_worker(lambda *args: None, lambda replica: None)
    monkeypatch.undo()
    replica.start_worker(lambda *args: None, lambda replica: None)  # not taken as started
    replica.close()


def test_closing_lets_go_of_the_device_copy_and_empties_an_accelerator_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After close the placed module and its staging are gone (an unloaded model's weights
    are freed), and on an accelerator the allocator's cache is emptied on the replica's own
    device, so the device's free memory counts them before the next load is checked."""
    replica = Replica(loaded(Scale()), torch.device("cpu"), max_batch_size=4)
    replica.prepare()
    replica.start_worker(lambda *args: None, lambda replica: None)
    emptied: list[object] = []
    current: list[object] = []

    class OnDevice:
        def __init__(self, device: object) -> None:
            self.device = device

        def __enter__(self) -> None:
            current.append(self.device)

        def __exit__(self, *exc: object) -> None:
            current.pop()

    monkeypatch.setattr(torch.cuda, "device", OnDevice)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(list(current)))
    replica._cuda = True  # as a CUDA replica would release it
    replica.close()
    assert replica.module is None
    assert replica.staging is None
    assert not replica.is_ready()
    assert emptied == [[torch.device("cpu")]]


def test_a_worker_still_in_a_batch_after_the_timeout_keeps_its_model() -> None:
    release = threading.Event()

    class Slow(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            release.wait(5.0)
            return x

    replica = Replica(loaded(Slow()), torch.device("cpu"), max_batch_size=4)
    release.set()
    replica.prepare()
    release.clear()
    finished = threading.Event()
    replica.start_worker(lambda *args: finished.set(), lambda replica: None)
    replica.submit(None, [{"input": _rows(1)}], [1])
    replica.close(timeout=0.05)
    assert replica.module is not None  # the batch still runs on it
    release.set()
    assert finished.wait(5.0)
