"""The staging pool: pinned buffers reused only after their copy completed, within the cap; the
layout of a batch inside a buffer."""

from __future__ import annotations

import pytest
import torch

import torchplace.prefetch.staging as staging_mod
from torchplace import ConfigError
from torchplace.prefetch import PinnedPool

from .fakes import FakeEvent, FakeStreams, layouts


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
