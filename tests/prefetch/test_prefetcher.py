"""DevicePrefetcher: argument checks, the pass-through on CPU, behaviour shared by both modes (on
fake streams), and the real CUDA pipeline (``@pytest.mark.cuda``, run by scripts/gpu-check)."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from torchplace import ConfigError, DevicePrefetcher

from .fakes import Frozen, Pair, Source, drain, leaves, nested

# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"depth": 0}, "depth=0"),
        ({"depth": True}, "depth=True"),
        ({"pin_pool_bytes": -1}, "pin_pool_bytes=-1"),
        ({"dtype": torch.int64}, "dtype=torch.int64"),
        ({"pin_fn": 3}, "pin_fn=3"),
        ({"pin": "False"}, "pin='False'"),
        ({"non_blocking": "False"}, "non_blocking='False'"),
        ({"non_blocking": None}, "non_blocking=None"),
    ],
)
def test_bad_arguments_name_the_value(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        DevicePrefetcher([], "cpu", **kwargs)


def test_not_an_iterable() -> None:
    with pytest.raises(ConfigError, match="iterable"):
        DevicePrefetcher(42, "cpu")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# pass-through (no streams)
# --------------------------------------------------------------------------------------------


def test_cpu_is_a_pass_through_that_yields_batches_as_they_are() -> None:
    source = [nested(i) for i in range(6)]
    p = DevicePrefetcher(source, "cpu")
    assert p.mode == "pass-through"
    out = list(p)
    assert len(out) == 6
    for i, (got, want) in enumerate(zip(out, source, strict=True)):
        assert got is want, f"batch {i} was rebuilt although it was already on the cpu"
    assert p.stats().batches == 6
    assert p.stats().copy_device_s is None


def test_pass_through_converts_floating_dtype_only() -> None:
    source = [nested(i) for i in range(3)]
    out = list(DevicePrefetcher(source, "cpu", dtype=torch.float64))
    for i, batch in enumerate(out):
        assert batch["x"].dtype == torch.float64
        assert torch.equal(batch["x"], source[i]["x"].double())
        assert batch["label"].dtype == torch.int64
        assert batch["label"] is source[i]["label"]
        assert isinstance(batch["pair"], Pair)
        assert isinstance(batch["frozen"], Frozen)
        assert batch["frozen"].tag == f"t{i}"
        assert batch["frozen"].x.dtype == torch.float64
        assert batch["index"] == i


def test_pass_through_moves_nested_batches_to_another_device() -> None:
    source = [nested(i) for i in range(4)]
    out = list(DevicePrefetcher(source, "meta"))
    for i, batch in enumerate(out):
        assert all(t.device.type == "meta" for t in leaves(batch))
        assert batch["x"].shape == (i + 1, 4)
        assert batch["index"] == i
        assert batch["list"][1][1] == "s"
    assert all(t.device.type == "cpu" for t in leaves(source))  # the source is untouched


def test_pass_through_plain_tensor_batches_and_values() -> None:
    source = [torch.arange(5) * i for i in range(10)]
    got = list(DevicePrefetcher(iter(source), "cpu"))
    assert [int(t.sum()) for t in got] == [10 * i for i in range(10)]


def test_len_follows_the_source() -> None:
    assert len(DevicePrefetcher([1, 2, 3], "cpu")) == 3
    loader = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4)
    assert len(DevicePrefetcher(loader, "cpu")) == 3


def test_len_of_a_source_without_length_says_so_and_iteration_still_works() -> None:
    prefetcher = DevicePrefetcher((torch.ones(1) for _ in range(2)), "cpu")
    with pytest.raises(
        TypeError, match=r"DevicePrefetcher has no len\(\): its source, a generator"
    ):
        len(prefetcher)
    assert len(list(prefetcher)) == 2  # list() asks for a length hint, and goes on without


# --------------------------------------------------------------------------------------------
# behaviour shared by both modes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_order_is_preserved(make: Any, depth: int) -> None:
    source = Source(12)
    out = [b["i"] for b in make(source, depth=depth)]
    assert out == list(range(12))
    assert source.closed == 1


def test_nested_structures_keep_their_types(make: Any) -> None:
    out = list(make([nested(i) for i in range(4)]))
    for i, batch in enumerate(out):
        assert isinstance(batch["pair"], Pair)
        assert isinstance(batch["frozen"], Frozen)
        assert isinstance(batch["list"][1], tuple)
        assert batch["frozen"].tag == f"t{i}"
        assert batch["x"].shape == (i + 1, 4)
        assert batch["list"][0].shape == (i + 1,)
        assert all(t.device.type == "meta" for t in leaves(batch))


@pytest.mark.parametrize("fail_at", [0, 3, 5])
def test_source_exceptions_surface_at_their_position(make: Any, fail_at: int) -> None:
    source = Source(8, fail_at=fail_at)
    got: list[int] = []
    with pytest.raises(KeyError, match=f"bad sample {fail_at}"):
        drain(make(source, depth=3), lambda b: got.append(b["i"]))
    assert got == list(range(fail_at))


def test_iteration_ends_after_an_exception(make: Any) -> None:
    it = iter(make(Source(4, fail_at=1)))
    assert next(it)["i"] == 0
    with pytest.raises(KeyError):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_early_break_releases_batches_in_flight_and_the_source(make: Any) -> None:
    source = Source(50)
    p = make(source, depth=4)
    for batch in p:
        if batch["i"] == 2:
            break
    del batch
    assert source.pulled <= 3 + 4  # never more than depth ahead
    p.close_pass()
    gc.collect()
    assert source.closed == 1
    alive = [r().i for r in source.sentinels if r() is not None]
    assert alive == [], f"batches still referenced after the loop ended: {alive}"


def test_context_manager_closes_the_pass(make: Any) -> None:
    source = Source(20)
    with make(source) as p:
        it = iter(p)
        next(it)
    assert source.closed == 1
    with pytest.raises(StopIteration):
        next(it)


def test_a_user_iterator_is_not_closed_on_early_break(make: Any) -> None:
    gen = iter(Source(10))
    for batch in make(gen, depth=1):
        if batch["i"] == 1:
            break
    # the caller owns the iterator it passed: it can continue from where the prefetch stopped
    assert next(gen)["i"] >= 2


def test_new_pass_per_iter_and_stats_accumulate(make: Any) -> None:
    source = Source(5)
    p = make(source)
    assert [b["i"] for b in p] == list(range(5))
    assert [b["i"] for b in p] == list(range(5))
    assert p.stats().batches == 10
    p.reset_stats()
    assert p.stats().batches == 0
    assert p.stats().bottleneck == "none"


def test_stats_measure_the_slow_source_and_consumer(make: Any) -> None:
    def slow_source() -> Iterator[torch.Tensor]:
        for i in range(4):
            time.sleep(0.02)
            yield torch.full((4,), float(i))

    p = make(slow_source())
    for _ in p:
        pass
    s = p.stats()
    assert s.batches == 4
    assert s.source_s >= 4 * 0.02  # lower bounds only: sleep never returns early
    assert s.bottleneck == "source"

    p = make([torch.ones(4)] * 4)
    for _ in p:
        time.sleep(0.02)
    s = p.stats()
    assert s.consumer_s >= 4 * 0.02
    assert s.bottleneck == "consumer"
    assert s.to_dict()["bottleneck"] == "consumer"
    assert "bottleneck: consumer" in str(s)


def test_dataloader_source(make: Any) -> None:
    ds = TensorDataset(torch.arange(40.0).reshape(20, 2), torch.arange(20))
    loader = DataLoader(ds, batch_size=6)
    out = list(make(loader, dtype=torch.float16))
    assert [tuple(b[0].shape) for b in out] == [(6, 2), (6, 2), (6, 2), (2, 2)]
    assert out[0][0].dtype == torch.float16
    assert out[0][1].dtype == torch.int64


def test_pass_through_has_no_device_times() -> None:
    s = DevicePrefetcher([torch.ones(2)], "cpu")
    list(s)
    assert s.stats().consumer_device_s is None
    assert s.stats().copy_device_s is None


# --------------------------------------------------------------------------------------------
# real CUDA
# --------------------------------------------------------------------------------------------


def _cuda() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.cuda
@pytest.mark.parametrize("pinned_source", [False, True], ids=["staged", "already-pinned"])
def test_cuda_values_survive_a_consumer_that_mutates_and_frees(pinned_source: bool) -> None:
    device = _cuda()
    n, size = 16, 4 << 20  # 16 MiB float32 per batch
    source = [{"x": torch.full((size,), float(i)), "i": torch.tensor(i)} for i in range(n)]
    if pinned_source:
        source = [{k: v.pin_memory() for k, v in b.items()} for b in source]
    w = torch.randn(4096, 4096, device=device)
    checks = []
    p = DevicePrefetcher(source, device, depth=3, pin_pool_bytes=256 << 20)
    assert p.mode == "streams"
    for batch in p:
        # milliseconds of work per batch: the consumer's stream lags far behind the host, so
        # the reads below are still queued when the host frees the batch and asks for the next.
        # Without record_stream the allocator would hand this memory to a later copy on the
        # side stream, which would overwrite it before these reads run.
        for _ in range(4):
            w = torch.tanh(w @ w)
        x = batch["x"]
        checks.append(torch.stack([x.min(), x.max(), batch["i"].float()]))
        x.mul_(-1.0)  # mutate the batch in place
        del batch, x
        junk = torch.empty(size, device=device).fill_(-7.0)  # invite the allocator to reuse
        del junk
    torch.cuda.synchronize(device)
    got = torch.stack(checks).cpu()
    want = torch.tensor([[i, i, i] for i in range(n)], dtype=torch.float32)
    assert torch.equal(got, want)
    s = p.stats()
    if pinned_source:
        assert s.already_pinned == 2 * n
        assert s.staged_batches == 0
    else:
        assert s.staged_batches == n
    assert s.fallback_copies == 0
    assert s.pool_peak_bytes <= 256 << 20
    assert s.copy_device_s is not None
    assert s.copy_device_s > 0
    assert s.consumer_device_s is not None
    assert s.consumer_device_s > 0


@pytest.mark.cuda
def test_cuda_no_use_before_copy_on_a_non_default_stream() -> None:
    device = _cuda()
    # Already-pinned batches: launching a copy costs the host microseconds, so each batch is
    # handed out while its 128 MiB copy (milliseconds) is still running. A consumer that did
    # not wait on the copy's event would read a partly written tensor.
    n, size = 6, 32 << 20
    source = [torch.full((size,), float(i + 1)).pin_memory() for i in range(n)]
    stream = torch.cuda.Stream(device=device)
    sums = []
    with torch.cuda.stream(stream):
        for x in DevicePrefetcher(source, device, depth=2):
            sums.append(x.sum(dtype=torch.float64))  # reads at once, on the consumer's stream
    torch.cuda.synchronize(device)
    assert [float(s) for s in sums] == [float((i + 1) * size) for i in range(n)]


@pytest.mark.cuda
def test_cuda_staged_batches_are_right_when_read_at_once() -> None:
    device = _cuda()
    n, size = 8, 16 << 20  # 64 MiB per batch, staged through the pinned pool
    source = [torch.full((size,), float(i + 1)) for i in range(n)]
    sums = [
        x.sum(dtype=torch.float64)
        for x in DevicePrefetcher(source, device, depth=2, pin_pool_bytes=512 << 20)
    ]
    torch.cuda.synchronize(device)
    assert [float(s) for s in sums] == [float((i + 1) * size) for i in range(n)]


@pytest.mark.cuda
def test_cuda_staged_batches_keep_their_memory_format_and_values() -> None:
    device = _cuda()
    g = torch.Generator().manual_seed(0)
    source = [
        {
            "img": torch.randn(4, 3, 8, 8, generator=g).to(memory_format=torch.channels_last),
            "t": torch.randn(6, 4, generator=g).t(),
            "s": torch.randn(6, 4, generator=g)[:, ::2],
        }
        for _ in range(4)
    ]
    p = DevicePrefetcher(source, device)
    out = [{k: (v.stride(), v.cpu()) for k, v in b.items()} for b in p]
    for got, want in zip(out, source, strict=True):
        for k, (stride, values) in got.items():
            assert stride == want[k].to(torch.float64).stride(), k  # as ``to`` would lay it out
            assert torch.equal(values, want[k]), k
    assert p.stats().staged_batches == 4


@pytest.mark.cuda
def test_cuda_over_cap_and_dtype() -> None:
    device = _cuda()
    source = [{"x": torch.full((1 << 20,), float(i)), "y": torch.arange(3) + i} for i in range(5)]
    p = DevicePrefetcher(source, device, pin_pool_bytes=0, dtype=torch.float16)
    out = [(b["x"].float().mean().item(), b["y"].tolist(), b["x"].dtype) for b in p]
    assert out == [(float(i), [i, i + 1, i + 2], torch.float16) for i in range(5)]
    assert p.stats().fallback_copies == 10


@pytest.mark.cuda
def test_cuda_batches_already_on_the_device_are_converted_after_their_producer() -> None:
    device = _cuda()
    w = torch.randn(2048, 2048, device=device)

    def source() -> Iterator[torch.Tensor]:
        for i in range(6):
            x = torch.empty(1 << 20, device=device)
            for _ in range(3):
                torch.tanh(w @ w)  # the producer's stream is busy before it fills x ...
            x.fill_(float(i))  # ... so the side stream must wait for this write
            yield x  # and the source drops x at once

    got = [b.float().mean().item() for b in DevicePrefetcher(source(), device, dtype=torch.float16)]
    assert got == [float(i) for i in range(6)]


@pytest.mark.cuda
def test_cuda_dataloader_with_pin_memory_is_not_pinned_twice() -> None:
    device = _cuda()
    ds = TensorDataset(torch.arange(4096.0).reshape(256, 16), torch.arange(256))
    loader = DataLoader(ds, batch_size=32, pin_memory=True)
    p = DevicePrefetcher(loader, device)
    total = torch.zeros((), device=device)
    labels = []
    for x, y in p:
        assert x.device == device
        total += x.sum()
        labels.append(y)
    assert float(total) == float(torch.arange(4096.0).sum())
    assert torch.equal(torch.cat(labels).cpu(), torch.arange(256))
    s = p.stats()
    assert s.already_pinned == 16
    assert s.pool_allocations == 0


@pytest.mark.cuda
def test_cuda_early_break_frees_device_memory() -> None:
    device = _cuda()
    source = [torch.ones(4 << 20) for _ in range(10)]
    torch.cuda.synchronize(device)
    gc.collect()
    before = torch.cuda.memory_allocated(device)
    p = DevicePrefetcher(source, device, depth=3, pin_pool_bytes=128 << 20)
    it = iter(p)
    next(it)
    x = next(it)  # stop early, holding one batch, with depth more in flight
    del x, it
    p.close()
    gc.collect()
    torch.cuda.synchronize(device)
    assert torch.cuda.memory_allocated(device) == before


# --------------------------------------------------------------------------------------------
# awkward sources and batches
# --------------------------------------------------------------------------------------------


def test_a_one_shot_iterator_used_up_by_a_pass_is_refused_on_the_next(make: Any) -> None:
    p = make(torch.full((2,), float(i)) for i in range(3))
    assert len(list(p)) == 3
    with pytest.raises(ConfigError, match=r"generator, is a one-shot iterator.*re-iterable"):
        iter(p)
    # a re-iterable source serves every pass, and an iterator left early can go on
    assert [len(list(make([torch.zeros(1)] * 2))) for _ in range(2)] == [2, 2]


def test_an_iterator_left_early_can_be_resumed_in_a_new_pass(make: Any) -> None:
    p = make(iter(Source(4)), depth=1)
    next(iter(p))
    assert [b["i"] for b in p] != []  # not refused: the iterator was not used up


def test_deques_in_a_batch_are_moved(make: Any) -> None:
    import collections

    (batch,) = list(make([{"window": collections.deque([torch.zeros(2)], maxlen=3)}]))
    assert batch["window"].maxlen == 3
    assert batch["window"][0].device.type == "meta"


def test_a_batch_that_contains_itself_is_a_config_error_at_its_position(make: Any) -> None:
    cyclic: list[Any] = [torch.zeros(2)]
    cyclic.append(cyclic)
    it = iter(make([[torch.ones(1)], cyclic]))
    assert next(it)[0].device.type == "meta"  # the batch before it is handed out
    with pytest.raises(ConfigError, match="contains itself"):
        next(it)


def test_a_meta_batch_to_the_cpu_says_it_has_no_data() -> None:
    from torchplace import PlacementError

    with pytest.raises(PlacementError, match=r"meta tensor .* no data"):
        list(DevicePrefetcher([{"x": torch.empty(2, device="meta")}], "cpu"))


def test_a_meta_tensor_on_the_stream_route_says_it_has_no_data() -> None:
    from torchplace import PlacementError
    from torchplace.prefetch import PinnedPool
    from torchplace.prefetch.copies import BatchCopier
    from torchplace.prefetch.stats import StatsAccumulator

    from .fakes import FakeStreams

    streams = FakeStreams()
    copier = BatchCopier(
        torch.device("cuda", 0),
        None,
        True,
        True,
        streams,
        PinnedPool(0),
        StatsAccumulator(),
        lambda o: o,
    )
    with pytest.raises(PlacementError, match=r"meta tensor \(float32 \(2,\)\) to cuda:0"):
        copier.launch({"x": torch.empty(2, device="meta")}, streams.new_stream())
