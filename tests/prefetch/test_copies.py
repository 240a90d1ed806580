"""The stream pipeline on fake streams: each tensor's route, staging, the copies on the side
stream, and the consumer's waits and ``record_stream`` calls."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torchplace.prefetch.staging as staging_mod
import torchplace.prefetch.streams as stream_backend
from torchplace.prefetch import PinnedPool

from .fakes import FakeEvent, FakeStream, FakeStreams, drain, layouts, leaves, nested, staged

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
