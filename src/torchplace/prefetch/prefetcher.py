"""The prefetcher: :class:`DevicePrefetcher` iterates over batches already on the device.

With streams (CUDA, XPU) each pass keeps ``depth`` batches in flight, launched by
:class:`~torchplace.prefetch.copies.BatchCopier`, and hands each one out once the consumer's
stream waits on its copies; without streams it moves each batch when asked (a pass-through).
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar

import torch

import torchplace.prefetch.streams as stream_backend
from torchplace.errors import ConfigError
from torchplace.placement import map_tensors
from torchplace.placement.nested import move_object, tensor_mover
from torchplace.prefetch.copies import BatchCopier, InFlight
from torchplace.prefetch.staging import DEFAULT_PIN_POOL_BYTES, PinFn, PinnedPool
from torchplace.prefetch.stats import PrefetchStats, StatsAccumulator

__all__ = ["MAX_DEPTH", "DevicePrefetcher"]

T = TypeVar("T")

MAX_DEPTH = 64
"""The most batches a :class:`DevicePrefetcher` copies ahead (``depth``)."""


_NONE = object()  # stands for the batch of a source that raised, in a pass's ``fetched``


@dataclass
class _Failed:
    error: BaseException


class _Pass(Iterator[T]):
    """One pass's iterator: the pass's generator, and whether a newer pass ended it.

    A pass ended by a new ``iter()`` of the same prefetcher raises on its next ``next()``
    instead of ending quietly, so that a loop nested in another over the same prefetcher (or
    ``zip(p, p)``) fails loudly rather than cutting the outer epoch short.
    """

    def __init__(self, gen: Generator[T, None, None]) -> None:
        self._gen = gen
        self.superseded = False
        self.finished = False

    def __next__(self) -> T:
        if self.superseded:
            raise ConfigError(
                "DevicePrefetcher: this pass was ended because a new pass over the same "
                "prefetcher started (iter() was called on it again: a nested loop, zip(p, p), "
                "next(iter(p)) inside the loop), and a prefetcher runs one pass at a time. Fix: "
                "finish or leave this loop before starting another pass, or give the other "
                "loop its own DevicePrefetcher"
            )
        try:
            return next(self._gen)
        except BaseException:
            self.finished = True
            raise

    def close(self) -> None:
        self._gen.close()


class DevicePrefetcher(Generic[T]):
    """Iterate over ``iterable`` with each batch already on ``device``, copies overlapping compute.

    Args:
        iterable: any iterable of batches: tensors, or dicts/lists/tuples/namedtuples/
            dataclasses of them (whatever :func:`torchplace.move` handles), e.g. a ``DataLoader``
            with or without ``pin_memory``. Each ``iter()`` of the prefetcher starts a new pass
            and ends the one in progress, whose iterator then raises
            :class:`~torchplace.errors.ConfigError` (one pass at a time); a one-shot iterator (a generator) serves one pass, and ``iter()`` after a pass used
            it up (or it raised) raises :class:`~torchplace.errors.ConfigError`; one left early
            resumes in the next pass at the batch after the last one handed out.
        device: where batches go; resolved with :func:`torchplace.resolve_device`.
        depth: how many batches are copied ahead of the one the consumer holds, 1 to
            :data:`MAX_DEPTH` (64). The host keeps ``depth + 1`` batches referenced; when the host runs ahead of the device,
            the allocator also keeps the memory of batches whose kernels are still queued
            (that is what ``record_stream`` protects), as with any asynchronous loop.
        pin: stage pageable host tensors through pinned buffers, so their copies can overlap.
        non_blocking: issue copies asynchronously on the side stream (only ever from pinned
            memory); False makes every copy blocking.
        pin_pool_bytes: cap on pinned host memory kept for staging; batches larger than what is
            left are copied plainly instead (0 disables staging).
        pin_fn: returns a pinned copy of a host tensor, used to make staging buffers (default:
            allocate them pinned with ``torch.empty(..., pin_memory=True)``); what it returns
            must keep the flat ``uint8`` tensor's dtype and shape, else the pass raises
            :class:`~torchplace.errors.ConfigError` where staging first needs a buffer.
        dtype: convert floating-point tensors to this dtype (on the device, after the copy).

    On CUDA the copies run on a side stream; the consumer's current stream (taken when each batch
    is handed out) waits on an event before using it. Without streams (cpu, meta, mps) batches
    are moved when asked for. Leaving the loop early (``break``, an exception, :meth:`close`,
    or the ``with`` block ending) drops every batch in flight; :meth:`close` also frees the
    staging pool. The prefetcher is not thread-safe. Already-pinned source tensors are read by
    the asynchronous copy after they are fetched, so a source must not rewrite a pinned tensor
    it has handed out (``DataLoader`` never does).
    """

    def __init__(
        self,
        iterable: Iterable[T],
        device: torch.device | str,
        *,
        depth: int = 2,
        pin: bool = True,
        non_blocking: bool = True,
        pin_pool_bytes: int = DEFAULT_PIN_POOL_BYTES,
        pin_fn: PinFn | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if not isinstance(iterable, Iterable):
            raise ConfigError(
                f"DevicePrefetcher needs an iterable of batches, got {type(iterable).__name__}"
            )
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ConfigError(f"depth={depth!r} must be an int >= 1 (batches copied ahead)")
        if depth > MAX_DEPTH:
            raise ConfigError(
                f"depth={depth:,} is more than {MAX_DEPTH} batches copied ahead: each batch in "
                "flight holds its device memory (and, staged, pinned host memory), and a pass "
                "fetches that many before handing out its first; 2 already hides a copy behind "
                "the step, a few more absorb a source whose batch times vary. Fix: give a depth "
                f"from 1 to {MAX_DEPTH} (to keep a whole small data set on the device, move it "
                "there once with torchplace.move and iterate over that)"
            )
        for flag, value in (("pin", pin), ("non_blocking", non_blocking)):
            if not isinstance(value, bool):
                raise ConfigError(
                    f"DevicePrefetcher({flag}={value!r:.40}) must be True or False, not "
                    f"{type(value).__name__} (a string such as 'False' would count as true)"
                )
        if dtype is not None and (
            not isinstance(dtype, torch.dtype) or not dtype.is_floating_point
        ):
            raise ConfigError(
                f"dtype={dtype!r} must be a floating-point torch.dtype (it converts floating "
                "tensors only) or None"
            )
        from torchplace.devices import resolve_device

        self.device = resolve_device(device)
        self.depth = depth
        self.pin = pin
        self.non_blocking = non_blocking
        self.dtype = dtype
        self._iterable = iterable
        self._pool = PinnedPool(pin_pool_bytes, pin_fn)
        self._streams = stream_backend.streams_for(self.device)
        self._side: Any = None
        self._acc = StatsAccumulator()
        self._active: weakref.ref[_Pass[T]] | None = None
        self._spent = False  # a one-shot source iterator that a pass ran to its end, or that raised
        # batches a pass took from a one-shot source ahead of the consumer and never handed out
        # (it was left early): the next pass hands them out first, so that resuming the
        # iterator skips nothing, as it skips nothing without streams
        self._carried: deque[Any] = deque()

    @property
    def mode(self) -> Literal["streams", "pass-through"]:
        """``streams`` when copies run on a side stream, else ``pass-through``."""
        return "streams" if self._streams is not None else "pass-through"

    def __len__(self) -> int:
        """The number of batches of the source (a pass yields as many), when it has a length."""
        try:
            return len(self._iterable)  # type: ignore[arg-type]
        except TypeError:
            if hasattr(type(self._iterable), "__len__"):
                raise  # the source's own __len__ failed: its error says why
        # a TypeError still, so that list(), tqdm and length hints go on without a length
        raise TypeError(
            f"DevicePrefetcher has no len(): its source, a {type(self._iterable).__name__}, has "
            "no length (a generator or an IterableDataset's loader yields an unknown number of "
            "batches); count the batches while iterating, or give the source a __len__"
        ) from None

    def __iter__(self) -> Iterator[T]:
        self._end_pass(superseded=True)
        if self._spent:
            raise ConfigError(
                f"DevicePrefetcher: its source, a {type(self._iterable).__name__}, is a one-shot "
                "iterator that an earlier pass used up, so this pass would yield no batch. Fix: "
                "pass a re-iterable source (a list, a DataLoader, any object whose __iter__ "
                "returns a new iterator), or make a new DevicePrefetcher for each new iterator"
            )
        gen = self._stream_pass() if self._streams is not None else self._plain_pass()
        this = _Pass(gen)
        self._active = weakref.ref(this)
        return this

    def __enter__(self) -> DevicePrefetcher[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close_pass(self) -> None:
        """End the pass in progress, if any, dropping the batches in flight (a one-shot
        source's batches fetched ahead are kept, uncopied, to open the next pass)."""
        self._end_pass(superseded=False)

    def _end_pass(self, *, superseded: bool) -> None:
        active = self._active() if self._active is not None else None
        self._active = None
        if active is not None:
            active.superseded = superseded and not active.finished
            active.close()

    def close(self) -> None:
        """End the pass in progress and free the pinned staging buffers (and the batches a
        one-shot source's pass left early had fetched ahead)."""
        self.close_pass()
        self._carried.clear()
        self._pool.clear()

    def reset_stats(self) -> None:
        """Start counting :meth:`stats` afresh (a pass in progress counts on, from zero)."""
        self._acc.reset()

    def stats(self) -> PrefetchStats:
        """Stage times and pool figures so far; waits for copies still in flight to time them."""
        acc = self._acc
        acc.settle(wait=True)
        pool = self._pool
        return PrefetchStats(
            mode=self.mode,
            device=str(self.device),
            batches=acc.batches,
            source_s=acc.source_s,
            copy_s=acc.copy_s,
            copy_device_s=acc.copy_device_s if self._streams is not None else None,
            consumer_s=acc.consumer_s,
            consumer_device_s=acc.consumer_device_s if self._streams is not None else None,
            staged_batches=acc.staged_batches,
            already_pinned=acc.already_pinned,
            fallback_copies=acc.fallback_copies,
            pool_cap_bytes=pool.cap_bytes,
            pool_bytes=pool.bytes,
            pool_peak_bytes=pool.peak_bytes,
            pool_allocations=pool.allocations,
            pool_reuses=pool.reuses,
        )

    def _move_object(self, obj: Any) -> Any:
        """An object with its own ``to`` (``PackedSequence``, ...) moves itself, blocking, as
        :func:`torchplace.move` moves it (a copy of it, so the source's batch is unchanged)."""
        return move_object(obj, self.device)

    # ---------------------------------------------------------------------------------------
    # Without streams: move when asked
    # ---------------------------------------------------------------------------------------

    def _plain_pass(self) -> Generator[T, None, None]:
        source = self._iterable
        it = iter(source)
        owned = it is not source
        acc = self._acc
        leaf = tensor_mover(self.device, self.non_blocking, self.dtype)
        ready = _ready_check(self.device, self.dtype)
        move_object = self._move_object
        clock = time.perf_counter
        handed = 0.0
        t0 = clock()
        try:
            for batch in it:
                handed = clock()
                acc.source_s += handed - t0
                # the common case, a batch already in place, is only checked, never rebuilt
                try:
                    in_place = ready(batch)
                except RecursionError:  # a cyclic or very deep batch: map_tensors says which
                    in_place = False
                if not in_place:
                    batch = map_tensors(batch, leaf, copy=False, objects=move_object)
                    t1, handed = handed, clock()
                    acc.copy_s += handed - t1
                acc.batches += 1
                yield batch
                t0 = clock()
                acc.consumer_s += t0 - handed
                handed = 0.0
            self._spent = not owned
        except Exception:
            if not handed:  # raised by the source itself (0.0 only while fetching): used up
                self._spent = not owned
            raise
        finally:
            if handed:
                acc.consumer_s += clock() - handed
            if owned:
                _close(it)

    # ---------------------------------------------------------------------------------------
    # With streams: copy ahead on a side stream
    # ---------------------------------------------------------------------------------------

    def _stream_pass(self) -> Generator[T, None, None]:
        streams = self._streams
        assert streams is not None
        source = self._iterable
        it = iter(source)
        owned = it is not source
        if self._side is None:
            self._side = streams.new_stream()  # one side stream for every pass
        queue: deque[InFlight | _Failed] = deque()
        # the source's batches behind ``queue``'s entries, kept for a one-shot source only
        fetched: deque[Any] | None = None if owned else deque()
        carried, self._carried = self._carried, deque()
        fill = self._filler(it, queue, self._side, carried, fetched)
        acc = self._acc
        clock = time.perf_counter
        handed = 0.0
        try:
            fill()
            while queue:
                if fetched is not None:
                    fetched.popleft()  # handed out, or raised at its position: not carried
                batch, consumer = self._receive(queue)
                fill()
                # the consumer's stream time for this batch: from here (after its wait for the
                # copy, and after the next copies were queued) to the request for the next one
                began = streams.new_event()
                began.record(consumer)
                handed = clock()
                yield batch
                del batch
                ended = streams.new_event()
                ended.record(consumer)
                acc.consumed.append((began, ended))
                acc.consumer_s += clock() - handed
                handed = 0.0
        finally:
            if handed:
                acc.consumer_s += clock() - handed
            queue.clear()
            if owned:
                _close(it)
            elif fetched is not None:
                # left early: what was fetched ahead and not handed out opens the next pass,
                # unless the source raised (it is used up, as without streams)
                left = deque((*fetched, *carried))
                if left and not any(b is _NONE for b in left):
                    self._carried = left
                    self._spent = False

    def _filler(
        self,
        it: Iterator[Any],
        queue: deque[InFlight | _Failed],
        side: Any,
        carried: deque[Any],
        fetched: deque[Any] | None,
    ) -> Callable[[], None]:
        """A function that tops ``queue`` up to ``depth`` batches in flight from ``it``.

        Batches ``carried`` over from a pass left early go first. Each batch taken is also
        appended to ``fetched`` (when given), so that a pass left early can carry it over.
        An exception from the source or a copy is queued at its position, to be raised when
        the consumer reaches it; nothing is fetched after it.
        """
        assert self._streams is not None
        acc, clock = self._acc, time.perf_counter
        copier = BatchCopier(
            self.device,
            self.dtype,
            self.pin,
            self.non_blocking,
            self._streams,
            self._pool,
            acc,
            self._move_object,
        )
        done = False

        def fill() -> None:
            nonlocal done
            while not done and len(queue) < self.depth:
                t0 = clock()
                try:
                    batch = carried.popleft() if carried else next(it)
                except StopIteration:
                    done = True
                    self._spent = it is self._iterable
                    return
                except Exception as exc:  # re-raised when the consumer reaches this position
                    queue.append(_Failed(exc))
                    if fetched is not None:
                        fetched.append(_NONE)
                    done = True
                    self._spent = it is self._iterable  # a source that raised is used up
                    return
                if fetched is not None:
                    fetched.append(batch)
                t1 = clock()
                acc.source_s += t1 - t0
                try:
                    queue.append(copier.launch(batch, side))
                except Exception as exc:
                    queue.append(_Failed(exc))
                    done = True
                acc.copy_s += clock() - t1

        return fill

    def _receive(self, queue: deque[InFlight | _Failed]) -> tuple[Any, Any]:
        """The next batch, made safe to use on the consumer's current stream, and that stream."""
        streams, acc = self._streams, self._acc
        assert streams is not None
        item = queue.popleft()
        if isinstance(item, _Failed):
            queue.clear()
            raise item.error
        consumer = streams.current_stream()
        # device-side wait: the consumer's kernels start after the copies, no host sync
        streams.wait(consumer, item.done)
        for t in item.produced:
            # the allocator must not recycle this memory while the consumer's stream may still
            # read it, however long the consumer keeps or frees the batch
            streams.record_stream(t, consumer)
        acc.pending.append((item.start, item.done))
        acc.settle(wait=False)
        acc.batches += 1
        return item.batch, consumer


def _ready_check(device: torch.device, dtype: torch.dtype | None) -> Callable[[Any], bool]:
    """A quick test that a batch needs nothing: every tensor in place, dtype already right.

    Walks only plain dicts, lists and tuples; anything else answers False (the full walk
    decides). This keeps the pass-through's cost per batch to a few hundred nanoseconds.
    """
    kind, index = device.type, device.index
    tensor = torch.Tensor
    atoms = (str, bytes, int, float, bool, type(None))

    def placed(t: torch.Tensor) -> bool:
        if kind == "cpu":
            ok = t.is_cpu
        elif kind == "meta":
            ok = t.is_meta
        else:
            d = t.device
            ok = d.type == kind and (index is None or d.index == index)
        return ok and (dtype is None or t.dtype == dtype or not t.is_floating_point())

    def ready(obj: Any) -> bool:
        cls = type(obj)
        if cls is tensor:
            return placed(obj)
        if cls is dict:
            values: Iterable[Any] = obj.values()
        elif cls is list or cls is tuple:
            values = obj
        else:
            return cls in atoms
        for v in values:
            if type(v) is tensor:
                if not placed(v):
                    return False
            elif not ready(v):
                return False
        return True

    return ready


def _close(it: Iterator[Any]) -> None:
    close = getattr(it, "close", None)
    if callable(close):
        close()
