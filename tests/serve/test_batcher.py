from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from torchplace.errors import ConfigError, NotReadyError, OverloadedError
from torchplace.serve.batcher import Batcher, Pending


class FakeWorker:
    """Records batches; answers them when told to (or at once with ``auto``)."""

    def __init__(self, auto: bool = False) -> None:
        self.batches: list[list[Pending]] = []
        self.alone: list[bool] = []  # per batch: full, nothing behind it, the loop its own
        self.busy = False
        self.auto = auto

    def submit_batch(self, batch: list[Pending], rows: int, alone: bool) -> None:
        assert rows == sum(p.rows for p in batch)
        self.batches.append(batch)
        self.alone.append(alone)
        self.busy = True
        if self.auto:
            asyncio.get_running_loop().call_soon(self.finish)

    def finish(self) -> None:
        for pending in self.batches[-1]:
            if not pending.future.done():
                pending.future.set_result(pending.rows)
        self.busy = False


def _pending(loop: asyncio.AbstractEventLoop, rows: int = 1) -> Pending:
    return Pending({"input": np.zeros((rows, 2), np.float32)}, rows, loop.create_future())


def _queued(batcher: Batcher, loop: asyncio.AbstractEventLoop, count: int) -> list[Pending]:
    """``count`` one-row requests, submitted in order."""
    items = [_pending(loop) for _ in range(count)]
    for item in items:
        batcher.submit(item)
    return items


def _batcher(loop: asyncio.AbstractEventLoop, worker: FakeWorker, **kwargs: Any) -> Batcher:
    def pick() -> FakeWorker | None:
        return None if worker.busy else worker

    return Batcher(loop=loop, pick=pick, **kwargs)


def test_requests_of_one_loop_iteration_share_a_batch() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        worker = FakeWorker()
        batcher = _batcher(loop, worker, max_batch_size=8, max_delay_s=0.0)
        for _ in range(5):
            batcher.submit(_pending(loop))
        assert worker.batches == []  # dispatch is deferred to the next iteration
        await asyncio.sleep(0)
        assert [len(b) for b in worker.batches] == [5]

    asyncio.run(main())


def test_a_batch_never_exceeds_max_batch_size_rows_and_keeps_order() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        worker = FakeWorker()
        batcher = _batcher(loop, worker, max_batch_size=8, max_delay_s=0.0)
        sizes = [3, 4, 2, 8, 1, 1]
        items = [_pending(loop, n) for n in sizes]
        for item in items:
            batcher.submit(item)
        await asyncio.sleep(0)
        seen: list[Pending] = []
        while worker.busy:
            seen += worker.batches[-1]
            assert sum(p.rows for p in worker.batches[-1]) <= 8
            worker.finish()
            batcher.dispatch()
        assert [[p.rows for p in b] for b in worker.batches] == [[3, 4], [2], [8], [1, 1]]
        assert seen == items

    asyncio.run(main())


def test_a_batch_is_alone_when_full_with_nothing_behind_it_and_the_loop_is_the_model_s() -> None:
    """``alone`` (the batch may then run on the loop): a full batch, nothing queued behind it,
    and no other model sharing the loop (``solo``)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        worker = FakeWorker()
        batcher = _batcher(loop, worker, max_batch_size=4, max_delay_s=0.0)
        _queued(batcher, loop, 11)  # 4 with 7 behind, 4 with 3 behind, the last 3
        await asyncio.sleep(0)
        for _ in range(2):
            worker.finish()
            batcher.dispatch()
        _queued(batcher, loop, 4)
        worker.finish()
        await asyncio.sleep(0)
        batcher.solo = False  # another model now serves on this loop
        _queued(batcher, loop, 4)
        worker.finish()
        await asyncio.sleep(0)
        assert [len(b) for b in worker.batches] == [4, 4, 3, 4, 4]
        assert worker.alone == [False, False, False, True, False]

    asyncio.run(main())


def test_a_partial_batch_waits_for_the_delay_then_goes() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        worker = FakeWorker(auto=True)
        batcher = _batcher(loop, worker, max_batch_size=8, max_delay_s=0.05)
        future = _pending(loop)
        batcher.submit(future)
        await asyncio.sleep(0.01)
        assert worker.batches == []  # still waiting for more rows
        assert await asyncio.wait_for(future.future, 2.0) == 1
        assert len(worker.batches) == 1

    asyncio.run(main())


def test_a_full_batch_does_not_wait_for_the_delay() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        worker = FakeWorker()
        batcher = _batcher(loop, worker, max_batch_size=4, max_delay_s=60.0)
        for _ in range(4):
            batcher.submit(_pending(loop))
        await asyncio.sleep(0)
        assert [len(b) for b in worker.batches] == [4]

    asyncio.run(main())


def _shaped(loop: asyncio.AbstractEventLoop, width: int, rows: int = 1) -> Pending:
    """A request of a model with a dynamic dimension: its key is its rows' shape."""
    x = np.zeros((rows, width), np.float32)
    return Pending({"input": x}, rows, loop.create_future(), key=(x.shape[1:],))


def test_same_shape_batches_hold_the_head_s_shape_and_end_at_the_first_other() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        worker = FakeWorker()
        batcher = _batcher(loop, worker, max_batch_size=8, max_delay_s=60.0, same_shape=True)
        items = [_shaped(loop, w) for w in (3, 3, 5, 5, 5, 3)]
        for item in items:
            batcher.submit(item)
        # each batch is cut by a request of another shape behind it: none waits out the
        # window (60 s); the last one, alone, waits for its window
        for _ in range(3):
            await asyncio.sleep(0)
            if worker.busy:
                worker.finish()
                batcher.freed()
        widths = [[p.inputs["input"].shape[1] for p in b] for b in worker.batches]
        assert widths == [[3, 3], [5, 5, 5]]
        assert all(i.future.done() for i in items[:5])
        assert not items[5].future.done()  # alone at the head: it waits for its window
        assert batcher.queued == 1

    asyncio.run(main())


def test_same_shape_requests_fill_a_batch_as_fixed_shape_ones_do() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        worker = FakeWorker()
        batcher = _batcher(loop, worker, max_batch_size=4, max_delay_s=60.0, same_shape=True)
        for _ in range(6):
            batcher.submit(_shaped(loop, 7))
        await asyncio.sleep(0)
        assert [len(b) for b in worker.batches] == [4]  # full: the other two wait behind it

    asyncio.run(main())


def test_a_freed_worker_gives_a_partial_batch_a_fresh_fill_window() -> None:
    """Rows that waited out the delay behind a busy worker still wait for more rows once it
    frees up (at most the delay again), instead of leaving at once as a small batch."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        worker = FakeWorker()
        worker.busy = True
        batcher = _batcher(loop, worker, max_batch_size=4, max_delay_s=0.05)
        early = _queued(batcher, loop, 2)
        await asyncio.sleep(0.08)  # past the delay, behind the busy worker
        worker.busy = False
        batcher.freed()
        assert worker.batches == []  # a fresh window opened when the worker freed up
        late = _queued(batcher, loop, 2)
        await asyncio.sleep(0)
        assert worker.batches == [early + late]  # full: it goes without waiting out the window

        worker.finish()
        lone = _pending(loop)
        batcher.submit(lone)
        batcher.freed()
        assert len(worker.batches) == 1
        for _ in range(200):  # the window closes: a partial batch goes
            await asyncio.sleep(0.01)
            if len(worker.batches) == 2:
                break
        assert worker.batches[-1] == [lone]

    asyncio.run(main())


def test_queue_is_bounded() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        worker = FakeWorker()
        worker.busy = True
        batcher = _batcher(loop, worker, max_batch_size=4, max_queue=3, max_delay_s=0.0)
        for _ in range(3):
            batcher.submit(_pending(loop))
        with pytest.raises(OverloadedError, match="queue is full"):
            batcher.submit(_pending(loop))
        assert len(batcher) == 3

    asyncio.run(main())


def test_cancelled_requests_are_skipped() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        worker = FakeWorker()
        batcher = _batcher(loop, worker, max_batch_size=4, max_delay_s=0.0)
        items = _queued(batcher, loop, 3)
        items[1].future.cancel()
        await asyncio.sleep(0)
        assert worker.batches[0] == [items[0], items[2]]

    asyncio.run(main())


def test_fail_all_answers_every_waiting_request() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        worker = FakeWorker()
        worker.busy = True
        batcher = _batcher(loop, worker, max_batch_size=4, max_delay_s=0.0)
        items = _queued(batcher, loop, 3)
        assert batcher.fail_all(lambda: NotReadyError("gone")) == 3
        for item in items:
            with pytest.raises(NotReadyError):
                item.future.result()
        assert len(batcher) == 0
        assert batcher.queued_rows == 0

    asyncio.run(main())


def test_bad_settings_are_rejected() -> None:
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ConfigError, match="max_batch_size"):
            Batcher(loop=loop, pick=lambda: None, max_batch_size=0)
        with pytest.raises(ConfigError, match="max_queue"):
            Batcher(loop=loop, pick=lambda: None, max_queue=0)
    finally:
        loop.close()
