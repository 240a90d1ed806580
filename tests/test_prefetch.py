"""DevicePrefetcher: pass-through on CPU, the stream pipeline with fake streams, the pinned pool.

The stream pipeline runs on CPU-only machines through ``FakeStreams`` (the few stream and event
operations the prefetcher uses, recorded in a log) aimed at the ``meta`` device, with a fake
pinning function; real CUDA behaviour is covered by the ``@pytest.mark.cuda`` tests at the end.
"""

from __future__ import annotations

import contextlib
import gc
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import torchplace.prefetch.staging as staging_mod
import torchplace.prefetch.streams as stream_backend
from torchplace import ConfigError, DevicePrefetcher
from torchplace.placement import map_tensors
from torchplace.prefetch import PinnedPool, PrefetchStats

# --------------------------------------------------------------------------------------------
# fakes
# --------------------------------------------------------------------------------------------


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"FakeStream({self.name})"


class FakeEvent:
    def __init__(self, owner: FakeStreams) -> None:
        self.owner = owner
        self.recorded_on: FakeStream | None = None
        self.completed = False

    def record(self, stream: Any = None) -> None:
        self.recorded_on = stream
        self.completed = self.owner.auto_complete
        self.owner.log.append(("record", self, stream))

    def query(self) -> bool:
        return self.completed

    def synchronize(self) -> None:
        # work on one stream completes in order: the events recorded before this one on its
        # stream have completed too
        for entry in self.owner.log:
            if entry[0] == "record" and entry[2] is self.recorded_on:
                entry[1].completed = True
            if entry[1] is self:
                break
        self.completed = True
        self.owner.syncs += 1

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.completed, "elapsed_time before the start event completed"
        assert end.completed, "elapsed_time before the end event completed"
        name = end.recorded_on.name if end.recorded_on is not None else ""
        return self.owner.elapsed_ms.get(name, 2.0)  # milliseconds


class FakeStreams:
    """Records what the prefetcher asks of the streams; events complete at once unless told."""

    def __init__(self, auto_complete: bool = True) -> None:
        self.auto_complete = auto_complete
        self.consumer = FakeStream("consumer")
        self.current = self.consumer
        self.log: list[tuple[Any, ...]] = []
        self.pinned: set[int] = set()
        self.pin_calls = 0
        self.syncs = 0
        self.elapsed_ms: dict[str, float] = {}  # per stream name of the end event; default 2 ms

    def new_stream(self) -> FakeStream:
        return FakeStream("side")

    @contextlib.contextmanager
    def use(self, stream: FakeStream) -> Iterator[FakeStream]:
        prev, self.current = self.current, stream
        try:
            yield stream
        finally:
            self.current = prev

    def current_stream(self) -> FakeStream:
        return self.current

    def new_event(self) -> FakeEvent:
        return FakeEvent(self)

    def wait(self, stream: FakeStream, event: FakeEvent) -> None:
        self.log.append(("wait", stream, event))

    def wait_stream(self, stream: FakeStream, other: FakeStream) -> None:
        self.log.append(("wait_stream", stream, other))

    def record_stream(self, t: torch.Tensor, stream: FakeStream) -> None:
        self.log.append(("record_stream", t, stream))

    def is_pinned(self, t: torch.Tensor) -> bool:
        return t.untyped_storage().data_ptr() in self.pinned

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        self.pin_calls += 1
        out = t.clone()
        self.pinned.add(out.untyped_storage().data_ptr())
        return out


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeStreams:
    streams = FakeStreams()
    monkeypatch.setattr(stream_backend, "streams_for", lambda device: streams)
    return streams


def staged(fake: FakeStreams, source: Any, **kw: Any) -> DevicePrefetcher[Any]:
    """A stream-mode prefetcher to the meta device, pinning through the fake."""
    return DevicePrefetcher(source, "meta", pin_fn=fake.pin, **kw)


class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


@dataclass(frozen=True)
class Frozen:
    x: torch.Tensor
    tag: str


def nested(i: int) -> dict[str, Any]:
    return {
        "x": torch.full((i + 1, 4), float(i)),
        "label": torch.tensor(i),
        "pair": Pair(torch.ones(2) * i, torch.arange(3)),
        "list": [torch.zeros(i + 1), (torch.ones(1), "s")],
        "frozen": Frozen(torch.full((2,), float(i)), tag=f"t{i}"),
        "index": i,
    }


def drain(p: Any, consume: Any) -> None:
    for batch in p:
        consume(batch)


def leaves(obj: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    map_tensors(obj, lambda t: out.append(t) or t, copy=False)
    return out


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


# --------------------------------------------------------------------------------------------
# behaviour shared by both modes
# --------------------------------------------------------------------------------------------


class Source:
    """A re-iterable source whose iterators count what they hand out and whether they closed."""

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n = n
        self.fail_at = fail_at
        self.pulled = 0
        self.closed = 0
        self.sentinels: list[weakref.ref[Any]] = []

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            for i in range(self.n):
                if i == self.fail_at:
                    raise KeyError(f"bad sample {i}")
                self.pulled += 1
                sentinel = Sentinel(i)
                self.sentinels.append(weakref.ref(sentinel))
                yield {"x": torch.full((3,), float(i)), "i": i, "s": sentinel}
        finally:
            self.closed += 1


class Sentinel:
    def __init__(self, i: int) -> None:
        self.i = i


@pytest.fixture(params=["pass-through", "streams"])
def make(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    if request.param == "streams":
        streams = FakeStreams()
        monkeypatch.setattr(stream_backend, "streams_for", lambda device: streams)

        def build(source: Any, **kw: Any) -> DevicePrefetcher[Any]:
            p: DevicePrefetcher[Any] = DevicePrefetcher(source, "meta", pin_fn=streams.pin, **kw)
            assert p.mode == "streams"
            return p

        return build

    def plain(source: Any, **kw: Any) -> DevicePrefetcher[Any]:
        p: DevicePrefetcher[Any] = DevicePrefetcher(source, "meta", **kw)
        assert p.mode == "pass-through"
        return p

    return plain


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


# --------------------------------------------------------------------------------------------
# the stream pipeline (fake streams)
# --------------------------------------------------------------------------------------------


def test_consumer_waits_and_records_every_tensor_it_gets(fake: FakeStreams) -> None:
    p = staged(fake, [nested(i) for i in range(5)], depth=2)
    assert p.mode == "streams"
    for batch in p:
        handed = leaves(batch)
        # the hand-over: wait on this batch's event, then record_stream of each produced tensor
        # on the consumer's stream (copies of later batches are queued after that)
        handover = [e for e in fake.log if e[0] in ("wait", "record_stream")]
        tail = handover[-1 - len(handed) :]
        assert tail[0][0] == "wait"
        assert tail[0][1] is fake.consumer
        event = tail[0][2]
        assert event.recorded_on is not None
        assert event.recorded_on.name == "side"
        recorded = {id(entry[1]) for entry in tail[1:]}
        assert all(entry[0] == "record_stream" and entry[2] is fake.consumer for entry in tail[1:])
        assert recorded == {id(t) for t in handed}


def test_record_stream_follows_the_consumers_current_stream(fake: FakeStreams) -> None:
    other = FakeStream("other")
    p = staged(fake, [torch.ones(3) for _ in range(3)])
    it = iter(p)
    next(it)
    fake.current = other
    batch = next(it)
    records = [e for e in fake.log if e[0] == "record_stream" and e[1] is batch]
    assert [e[2] for e in records] == [other]
    assert any(e[0] == "wait" and e[1] is other for e in fake.log)


def test_consumer_stream_time_is_measured_between_hand_out_and_next_request(
    fake: FakeStreams,
) -> None:
    # a GPU-bound consumer that never waits for its kernels takes little host time; the
    # consumer's stream time (events around each batch on it) is what shows it is the bottleneck
    fake.elapsed_ms = {"side": 0.5, "consumer": 5000.0, "other": 5000.0}  # 5 s a batch
    other = FakeStream("other")
    p = staged(fake, [torch.ones(4) for _ in range(4)], depth=2)
    for i, _ in enumerate(p):
        # the span starts on the consumer's stream after its wait for this batch's copy and
        # after the next copies were queued: it is the last thing before the hand-out
        kind, _, stream = fake.log[-1]
        assert (kind, stream) == ("record", fake.current)
        last_wait = max(k for k, e in enumerate(fake.log) if e[0] == "wait")
        assert fake.log[last_wait][1] is fake.current
        queued = any(e[0] == "record" and e[2].name == "side" for e in fake.log[last_wait:])
        assert queued == (i + 2 < 4)  # batch i + depth, while the source has one
        if i == 1:
            fake.current = other  # this span still ends on the stream it began on
    spans = {
        name: [e for e in fake.log if e[0] == "record" and e[2].name == name]
        for name in ("consumer", "other")
    }
    assert len(spans["consumer"]) == 2 * 2  # batches 0 and 1, start and end
    assert len(spans["other"]) == 2 * 2  # batches 2 and 3
    s = p.stats()
    assert s.consumer_device_s is not None
    assert s.consumer_device_s == pytest.approx(4 * 5.0)
    assert s.copy_device_s == pytest.approx(4 * 0.5 / 1e3)
    assert s.consumer_s < s.consumer_device_s  # the host hardly waited for the consumer
    assert s.bottleneck == "consumer"
    assert "consumer" in str(s)
    assert "(device 20000.0 ms)" in str(s)
    assert s.to_dict()["consumer_device_s"] == s.consumer_device_s


def test_consumer_spans_are_timed_only_once_complete(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeStreams(auto_complete=False)
    monkeypatch.setattr(stream_backend, "streams_for", lambda device: fake)
    p = staged(fake, [torch.ones(4) for _ in range(3)])
    assert len(list(p)) == 3  # nothing completes by itself: no elapsed_time is asked early
    s = p.stats()  # ... until stats() waits for the spans
    assert s.consumer_device_s == pytest.approx(3 * 2.0 / 1e3)
    assert s.copy_device_s == pytest.approx(3 * 2.0 / 1e3)
    p.reset_stats()
    assert p.stats().consumer_device_s == 0.0


def test_pass_through_has_no_device_times() -> None:
    s = DevicePrefetcher([torch.ones(2)], "cpu")
    list(s)
    assert s.stats().consumer_device_s is None
    assert s.stats().copy_device_s is None


def test_host_batches_are_staged_through_the_pool(fake: FakeStreams) -> None:
    source = [nested(i % 3) for i in range(30)]
    p = staged(fake, source, depth=2, pin_pool_bytes=1 << 20)
    n = sum(1 for _ in p)
    s = p.stats()
    assert n == 30
    assert s.staged_batches == 30
    assert s.fallback_copies == 0
    # steady state allocates nothing: a handful of buffers serve every batch
    assert s.pool_allocations <= 3
    assert s.pool_reuses == 30 - s.pool_allocations
    assert fake.pin_calls == s.pool_allocations
    assert s.pool_peak_bytes <= 1 << 20
    assert s.copy_device_s == pytest.approx(30 * 2.0 / 1e3)
    # no staging buffer is ever handed out
    for batch in p:
        for t in leaves(batch):
            assert not fake.is_pinned(t)


def test_over_the_cap_batches_are_copied_plainly(fake: FakeStreams) -> None:
    big = [{"x": torch.ones(64, 1024)} for _ in range(4)]  # 256 KiB each
    p = staged(fake, big, pin_pool_bytes=128 << 10)
    out = list(p)
    s = p.stats()
    assert len(out) == 4
    assert s.fallback_copies == 4
    assert s.staged_batches == 0
    assert s.pool_allocations == 0
    assert fake.pin_calls == 0
    assert s.pool_bytes == 0


def test_zero_cap_disables_staging(fake: FakeStreams) -> None:
    p = staged(fake, [torch.ones(8)] * 3, pin_pool_bytes=0)
    assert len(list(p)) == 3
    assert p.stats().fallback_copies == 3
    assert fake.pin_calls == 0


def test_already_pinned_batches_are_not_pinned_twice(fake: FakeStreams) -> None:
    # what DataLoader(pin_memory=True) yields: tensors that are already pinned
    source = [
        {"x": fake.pin(torch.full((4,), float(i))), "y": fake.pin(torch.tensor(i))}
        for i in range(6)
    ]
    fake.pin_calls = 0
    p = staged(fake, source)
    assert [b["x"].shape for b in p] == [torch.Size([4])] * 6
    s = p.stats()
    assert s.already_pinned == 12
    assert s.staged_batches == 0
    assert s.pool_allocations == 0
    assert fake.pin_calls == 0


def test_pin_false_copies_without_staging(fake: FakeStreams) -> None:
    p = staged(fake, [torch.ones(8)] * 3, pin=False)
    assert len(list(p)) == 3
    assert fake.pin_calls == 0
    assert p.stats().staged_batches == 0


def layouts() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "contiguous": torch.randn(3, 5, generator=g),
        "channels_last": torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last),
        "transposed": torch.randn(4, 6, generator=g).t(),
        "permuted": torch.randn(2, 3, 4, generator=g).permute(2, 0, 1),
        "strided_slice": torch.randn(4, 6, generator=g)[:, ::2],
        "expanded": torch.randn(4, 1, generator=g).expand(4, 5),
        "scalar": torch.tensor(7, dtype=torch.int64),
        "half": torch.randn(3, 3, generator=g).half().t(),
    }


@pytest.mark.parametrize("name", list(layouts()))
def test_a_staging_view_holds_the_values_in_the_layout_to_would_give(name: str) -> None:
    t = layouts()[name]
    buf = torch.full((4096,), 0xAB, dtype=torch.uint8)
    off = 128
    n = t.numel() * t.element_size()
    view = staging_mod.staging_view(buf, off, t)
    view.copy_(t)
    assert torch.equal(view, t)
    assert view.stride() == t.to(torch.float64).stride()  # what a copy by ``to`` would keep
    assert view.untyped_storage().data_ptr() == buf.data_ptr()
    # it writes inside its slot only
    assert bool((buf[:off] == 0xAB).all())
    assert bool((buf[off + n :] == 0xAB).all())


def test_staging_keeps_the_memory_format_of_a_batch(fake: FakeStreams) -> None:
    source = [layouts() for _ in range(3)]
    p = staged(fake, source)
    out = list(p)
    assert p.stats().staged_batches == 3
    assert p.stats().fallback_copies == 0
    for batch, original in zip(out, source, strict=True):
        for name, t in batch.items():
            assert t.device.type == "meta"
            assert t.stride() == original[name].to("meta").stride(), name


def test_tensor_subclasses_are_copied_by_their_own_to_not_staged(fake: FakeStreams) -> None:
    class Tagged(torch.Tensor):
        pass

    source = [{"img": torch.ones(2, 3).as_subclass(Tagged), "x": torch.ones(3)} for _ in range(2)]
    p = staged(fake, source)
    out = list(p)
    assert all(type(b["img"]) is Tagged for b in out)  # staging would give a plain tensor
    assert all(type(b["x"]) is torch.Tensor for b in out)
    assert p.stats().staged_batches == 2  # the plain tensor still goes through the pool


def test_a_failed_staging_copy_gives_its_buffer_back(
    fake: FakeStreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = staging_mod.staging_view
    calls = 0

    def flaky(buf: torch.Tensor, off: int, t: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("staging failed")
        return real(buf, off, t)

    monkeypatch.setattr(staging_mod, "staging_view", flaky)
    p = staged(fake, [torch.ones(64) for _ in range(4)], depth=1)
    got: list[Any] = []
    with pytest.raises(RuntimeError, match="staging failed"):
        drain(p, got.append)
    assert len(got) == 1
    p._iterable = [torch.ones(64) for _ in range(5)]
    assert len(list(p)) == 5
    s = p.stats()
    # one buffer, given back after the failure and reused by every later batch
    assert s.pool_allocations == 1
    assert s.pool_bytes == s.pool_peak_bytes == 64 << 10


def test_tensors_already_on_a_device_wait_for_the_consumer_stream(fake: FakeStreams) -> None:
    source = [{"x": torch.ones(2, device="meta")} for _ in range(2)]
    out = list(staged(fake, source))
    assert out[0]["x"] is source[0]["x"]  # nothing to copy
    assert any(e[0] == "wait_stream" and e[2] is fake.consumer for e in fake.log)


def test_a_tensor_that_requires_grad_keeps_its_autograd_link(fake: FakeStreams) -> None:
    w = torch.ones(4, requires_grad=True)
    p = staged(fake, [{"w": w, "x": torch.ones(4)}])
    out = list(p)
    assert out[0]["w"].requires_grad
    assert out[0]["w"].grad_fn is not None  # a copy of w, as w.to(device) gives
    assert not out[0]["x"].requires_grad
    assert p.stats().fallback_copies == 0  # w is copied directly, x is still staged
    assert p.stats().staged_batches == 1


def test_a_device_tensor_read_on_the_side_stream_is_recorded_on_it(fake: FakeStreams) -> None:
    # converting a tensor already on the device reads it on the side stream, after the consumer
    # stream's work (wait_stream); the source may drop it at once, so it is record_stream-ed on
    # the side stream too, or the allocator could give its memory to the consumer meanwhile
    x = torch.ones(2, device="meta")
    p = staged(fake, [{"x": x}], dtype=torch.float16)
    out = list(p)
    assert out[0]["x"].dtype == torch.float16
    on_side = [e for e in fake.log if e[0] == "record_stream" and e[1] is x]
    assert [e[2].name for e in on_side] == ["side"]
    kinds = [e[0] for e in fake.log]
    assert kinds.index("wait_stream") < kinds.index("record_stream")


def test_close_frees_the_pool(fake: FakeStreams) -> None:
    p = staged(fake, [torch.ones(16)] * 4)
    list(p)
    assert p.stats().pool_bytes > 0
    p.close()
    assert p.stats().pool_bytes == 0


def test_pool_kept_across_epochs(fake: FakeStreams) -> None:
    p = staged(fake, [torch.ones(256)] * 8)
    list(p)
    first = p.stats().pool_allocations
    list(p)
    assert p.stats().pool_allocations == first


def test_copy_failure_surfaces_at_its_position(
    fake: FakeStreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Boom:
        def to(self, device: Any) -> Any:
            raise RuntimeError("copy failed")

    source: list[Any] = [torch.ones(2), torch.ones(2), {"b": Boom()}, torch.ones(2)]
    got: list[Any] = []
    with pytest.raises(RuntimeError, match="copy failed"):
        drain(staged(fake, source), got.append)
    assert len(got) == 2


def test_objects_with_their_own_to_move_on_the_consumer_stream(fake: FakeStreams) -> None:
    streams_seen: list[FakeStream] = []

    class Packed:
        def to(self, device: Any) -> Packed:
            streams_seen.append(fake.current)
            return self

    out = list(staged(fake, [{"p": Packed(), "x": torch.ones(2)} for _ in range(3)]))
    assert len(out) == 3
    assert streams_seen == [fake.consumer] * 3


def test_a_failed_copy_gives_its_staging_buffer_back(fake: FakeStreams) -> None:
    class Boom:
        def to(self, device: Any) -> Any:
            raise RuntimeError("copy failed")

    p = staged(fake, [{"x": torch.ones(64), "b": Boom()}], depth=1)
    with pytest.raises(RuntimeError, match="copy failed"):
        list(p)
    assert p.stats().pool_allocations == 1
    p._iterable = [{"x": torch.ones(64)} for _ in range(3)]
    assert len(list(p)) == 3
    assert p.stats().pool_allocations == 1  # the buffer came back and was reused


def test_a_staging_buffer_is_rewritten_only_after_its_copy_completed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Events complete only when the host waits on them: every reuse of a staging buffer must
    # come after the event of the copy out of it, never while that copy could still read it.
    fake = FakeStreams(auto_complete=False)
    monkeypatch.setattr(stream_backend, "streams_for", lambda device: fake)
    released: dict[int, FakeEvent | None] = {}
    real_acquire, real_release = PinnedPool.acquire, PinnedPool.release

    def acquire(self: PinnedPool, nbytes: int) -> torch.Tensor | None:
        buf = real_acquire(self, nbytes)
        if buf is not None:
            event = released.pop(buf.data_ptr(), None)
            assert event is None or event.completed, "staging buffer reused during its copy"
        return buf

    def release(self: PinnedPool, buf: torch.Tensor, event: Any) -> None:
        assert event is not None
        assert event.recorded_on is not None
        assert event.recorded_on.name == "side"
        released[buf.data_ptr()] = event
        real_release(self, buf, event)

    monkeypatch.setattr(PinnedPool, "acquire", acquire)
    monkeypatch.setattr(PinnedPool, "release", release)
    granule = 64 << 10
    source = [torch.full((granule // 4,), float(i)) for i in range(8)]  # one granule each
    p = staged(fake, source, depth=1, pin_pool_bytes=3 * granule)
    assert len(list(p)) == 8
    s = p.stats()
    assert s.staged_batches == 8
    assert s.pool_allocations == 3  # the cap holds three buffers ...
    assert s.pool_reuses == 5  # ... and the other five batches wait for one of them
    assert s.pool_peak_bytes == 3 * granule
    assert fake.syncs >= 5


def busy_buffer(fake: FakeStreams, pool: PinnedPool) -> tuple[torch.Tensor, FakeEvent]:
    """A buffer handed back to ``pool`` while the (fake) copy out of it is still running."""
    buf = pool.acquire(1000)
    assert buf is not None
    event = fake.new_event()
    event.record()
    pool.release(buf, event)
    return buf, event


def test_clear_waits_for_copies_still_reading_a_buffer() -> None:
    fake = FakeStreams(auto_complete=False)
    pool = PinnedPool(1 << 20, fake.pin)
    _, event = busy_buffer(fake, pool)
    pool.clear()
    assert event.completed
    assert pool.bytes == 0


# --------------------------------------------------------------------------------------------
# the pinned pool itself
# --------------------------------------------------------------------------------------------


def test_pool_reuses_a_buffer_only_after_its_copy_completed() -> None:
    fake = FakeStreams(auto_complete=False)
    pool = PinnedPool(1 << 20, fake.pin)
    a, ev = busy_buffer(fake, pool)
    b = pool.acquire(1000)
    assert b is not None
    assert b.data_ptr() != a.data_ptr(), "a buffer was reused while a copy still read it"
    ev.completed = True
    c = pool.acquire(1000)
    assert c is not None
    assert c.data_ptr() == a.data_ptr()
    assert pool.allocations == 2
    assert pool.reuses == 1


def test_pool_never_exceeds_its_cap_and_waits_for_the_oldest_copy() -> None:
    fake = FakeStreams(auto_complete=False)
    granule = 64 << 10
    pool = PinnedPool(2 * granule, fake.pin)
    bufs = [pool.acquire(granule), pool.acquire(granule)]
    assert all(b is not None for b in bufs)
    events = []
    for b in bufs:
        ev = fake.new_event()
        ev.record()
        events.append(ev)
        pool.release(b, ev)  # type: ignore[arg-type]
    # full, both busy: the pool waits for the oldest copy instead of pinning more
    c = pool.acquire(granule)
    assert c is not None
    assert c.data_ptr() == bufs[0].data_ptr()  # type: ignore[union-attr]
    assert events[0].completed
    assert not events[1].completed
    assert pool.bytes == pool.peak_bytes == 2 * granule
    assert fake.pin_calls == 2
    # bigger than the cap: no buffer
    assert pool.acquire(3 * granule) is None


def test_pool_drops_small_free_buffers_to_fit_a_larger_one() -> None:
    fake = FakeStreams()
    granule = 64 << 10
    pool = PinnedPool(3 * granule, fake.pin)
    small = [pool.acquire(granule) for _ in range(3)]
    for b in small:
        pool.release(b, None)  # type: ignore[arg-type]
    big = pool.acquire(2 * granule)
    assert big is not None
    assert big.numel() >= 2 * granule
    assert pool.bytes <= 3 * granule


def test_pool_counts_what_the_host_allocator_really_pins() -> None:
    # torch's host allocator rounds a pinned request up to a power of two: the pool makes its
    # buffers that size and counts them so, or the cap would bound only half the real memory
    fake = FakeStreams()
    pool = PinnedPool(1 << 20, fake.pin)
    buf = pool.acquire(300 << 10)  # 300 KiB -> 512 KiB pinned
    assert buf is not None
    assert buf.numel() == 512 << 10
    assert pool.bytes == 512 << 10
    small = pool.acquire(100)  # the smallest buffer is 64 KiB
    assert small is not None
    assert small.numel() == 64 << 10
    pool.release(buf, None)
    again = pool.acquire(400 << 10)  # the spare room serves a larger batch later
    assert again is not None
    assert again.data_ptr() == buf.data_ptr()
    # 600 KiB fits a 1 MiB cap as asked, but would pin 1 MiB next to what is held: refused
    assert pool.acquire(600 << 10) is None
    assert pool.bytes <= pool.cap_bytes


def test_pool_rejects_bad_caps() -> None:
    with pytest.raises(ConfigError, match="pin_pool_bytes"):
        PinnedPool(-5)
    with pytest.raises(ConfigError, match="pin_pool_bytes"):
        PinnedPool(1.5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# the verdict
# --------------------------------------------------------------------------------------------


def _stats(**kw: Any) -> PrefetchStats:
    base: dict[str, Any] = {
        "mode": "streams",
        "device": "cuda:0",
        "batches": 10,
        "source_s": 0.0,
        "copy_s": 0.0,
        "copy_device_s": 0.0,
        "consumer_s": 0.0,
        "consumer_device_s": 0.0,
        "staged_batches": 0,
        "already_pinned": 0,
        "fallback_copies": 0,
        "pool_cap_bytes": 0,
        "pool_bytes": 0,
        "pool_peak_bytes": 0,
        "pool_allocations": 0,
        "pool_reuses": 0,
    }
    base.update(kw)
    return PrefetchStats(**base)


@pytest.mark.parametrize(
    ("kw", "verdict"),
    [
        ({"source_s": 3.0, "copy_s": 1.0, "consumer_s": 2.0}, "source"),
        ({"source_s": 1.0, "copy_s": 0.1, "copy_device_s": 5.0, "consumer_s": 2.0}, "copy"),
        ({"source_s": 1.0, "copy_s": 0.5, "consumer_s": 2.0}, "consumer"),
        # a GPU-bound consumer that never waits for its kernels: little host time, much device
        ({"source_s": 0.2, "copy_s": 0.5, "consumer_s": 0.1, "consumer_device_s": 3.0}, "consumer"),
        (
            {"source_s": 0.2, "copy_device_s": 4.0, "consumer_s": 0.1, "consumer_device_s": 3.0},
            "copy",
        ),
        ({"batches": 0}, "none"),
    ],
)
def test_bottleneck_verdict(kw: dict[str, Any], verdict: str) -> None:
    assert _stats(**kw).bottleneck == verdict


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
