"""Feed the device: :class:`DevicePrefetcher` and its pool of pinned staging buffers.

While the device computes on batch *n*, the prefetcher has already queued the copies of batches
*n+1 ... n+depth* on a side stream, from pinned host memory, so the transfer hides behind the
compute (the article's figure 2). How it stays correct:

- the consumer's stream waits on an event recorded after each batch's copies (a device-side
  wait, no host sync), so no kernel reads a batch before it has arrived;
- every tensor handed to the consumer is ``record_stream``-ed on the consumer's stream, so the
  caching allocator does not reuse its memory for the next copy while the consumer's kernels
  still read it, whether the consumer frees the batch at once or keeps references;
- host batches are staged through a bounded :class:`PinnedPool` of reusable pinned buffers; a
  buffer is handed out again only once the event of the copy out of it has completed. Over the
  cap the prefetcher degrades to a plain (blocking) copy instead of pinning more host memory;
- tensors that arrive already pinned (``DataLoader(pin_memory=True)``) are copied directly, not
  pinned twice.

On the CPU, or on a device without streams, the prefetcher is a plain pass-through with the same
API: each batch goes through the same move rules as :func:`torchplace.move`, and a batch that
is already in place is yielded as it is.

:meth:`DevicePrefetcher.stats` says where the time went: waiting for the source (CPU-bound),
for the copy (transfer-bound), or in the consumer (compute-bound).
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from types import TracebackType
from typing import Any, Generic, Literal, Protocol, TypeVar

import torch

from torchplace.errors import ConfigError
from torchplace.placement import _tensor_mover, map_tensors

__all__ = ["DEFAULT_PIN_POOL_BYTES", "DevicePrefetcher", "PinnedPool", "PrefetchStats"]

_log = logging.getLogger(__name__)

T = TypeVar("T")
PinFn = Callable[[torch.Tensor], torch.Tensor]
Bottleneck = Literal["source", "copy", "consumer", "none"]

DEFAULT_PIN_POOL_BYTES = 64 << 20
"""Default cap on the pinned host memory one prefetcher keeps for staging (64 MiB)."""

_ALIGN = 64  # byte alignment of each tensor inside a staging buffer
_GRANULE = 64 << 10  # the smallest staging buffer


def _footprint(nbytes: int) -> int:
    """The pinned bytes a staging buffer for ``nbytes`` really takes.

    torch's host allocator rounds every pinned request up to a power of two, so a buffer is made
    that large (the extra room serves later, larger batches) and counted at that size: the cap
    bounds the memory really pinned, not the memory asked for.
    """
    return max(_GRANULE, 1 << max(0, nbytes - 1).bit_length())


# --------------------------------------------------------------------------------------------
# Streams: the few operations the prefetcher needs, behind one small interface
# --------------------------------------------------------------------------------------------


class _Event(Protocol):
    def record(self, stream: Any = ...) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end_event: Any) -> float: ...


class _Streams(Protocol):
    """Stream operations on one device (CUDA and XPU share this API)."""

    def new_stream(self) -> Any: ...
    def use(self, stream: Any) -> contextlib.AbstractContextManager[Any]: ...
    def current_stream(self) -> Any: ...
    def new_event(self) -> _Event: ...
    def wait(self, stream: Any, event: _Event) -> None: ...
    def wait_stream(self, stream: Any, other: Any) -> None: ...
    def record_stream(self, t: torch.Tensor, stream: Any) -> None: ...
    def is_pinned(self, t: torch.Tensor) -> bool: ...


class _TorchStreams:
    """``torch.cuda`` (or ``torch.xpu``) streams and events on one device."""

    def __init__(self, backend: Any, device: torch.device) -> None:
        self._b = backend
        self._device = device

    def new_stream(self) -> Any:
        return self._b.Stream(device=self._device)

    def use(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        return self._b.stream(stream)  # type: ignore[no-any-return]

    def current_stream(self) -> Any:
        return self._b.current_stream(self._device)

    def new_event(self) -> _Event:
        return self._b.Event(enable_timing=True)  # type: ignore[no-any-return]

    def wait(self, stream: Any, event: _Event) -> None:
        stream.wait_event(event)

    def wait_stream(self, stream: Any, other: Any) -> None:
        stream.wait_stream(other)

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        t.record_stream(stream)

    def is_pinned(self, t: torch.Tensor) -> bool:
        return bool(t.is_pinned())


def _streams_for(device: torch.device) -> _Streams | None:
    """The stream backend for ``device``, or None for a device without streams (cpu, meta, mps)."""
    if device.type not in ("cuda", "xpu"):
        return None
    backend = getattr(torch, device.type, None)
    if backend is None or not hasattr(backend, "Stream") or not backend.is_available():
        return None
    return _TorchStreams(backend, device)


# --------------------------------------------------------------------------------------------
# The pinned staging pool
# --------------------------------------------------------------------------------------------


class PinnedPool:
    """A bounded set of reusable pinned host buffers (flat ``uint8`` tensors).

    :meth:`acquire` hands out a buffer of at least ``nbytes``: a free one if one fits, else a
    new one while the pool stays under ``cap_bytes`` (free buffers too small are dropped to make
    room), else the oldest busy one that fits once its copy has completed, else None: the caller
    then copies without staging. New buffers are a power of two in size (at least 64 KiB), as
    torch's host allocator pins that much anyway, and count against the cap at that size.
    :meth:`release` gives a buffer back together with the event that marks the end of the copy
    out of it; the buffer is not handed out again before that event has completed. ``pin_fn``
    returns a pinned copy of a host tensor; by default buffers are allocated pinned
    (``torch.empty(..., pin_memory=True)``). Tests inject a fake one to run the pool on CPU-only
    machines.
    """

    def __init__(self, cap_bytes: int = DEFAULT_PIN_POOL_BYTES, pin_fn: PinFn | None = None):
        if isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int) or cap_bytes < 0:
            raise ConfigError(
                f"pin_pool_bytes={cap_bytes!r} must be an int >= 0 (bytes of pinned host memory "
                "kept for staging; 0 disables staging)"
            )
        if pin_fn is not None and not callable(pin_fn):
            raise ConfigError(f"pin_fn={pin_fn!r} must be a callable Tensor -> pinned Tensor")
        self.cap_bytes = cap_bytes
        self._pin: PinFn | None = pin_fn
        self._free: list[torch.Tensor] = []
        self._busy: deque[tuple[torch.Tensor, _Event | None]] = deque()
        self.bytes = 0
        self.peak_bytes = 0
        self.allocations = 0
        self.reuses = 0

    def _reclaim(self) -> None:
        while self._busy:
            buf, event = self._busy[0]
            if event is not None and not event.query():
                break  # copies complete in order on one stream: later ones are busy too
            self._busy.popleft()
            self._free.append(buf)

    def acquire(self, nbytes: int) -> torch.Tensor | None:
        """A pinned buffer of at least ``nbytes``, or None when the cap does not allow one."""
        self._reclaim()
        fitting = [b for b in self._free if b.numel() >= nbytes]
        if fitting:
            buf = min(fitting, key=lambda b: b.numel())
            self._free.remove(buf)
            self.reuses += 1
            return buf
        size = _footprint(nbytes)
        if size <= self.cap_bytes:
            # drop free buffers (all too small) until the new one fits under the cap
            self._free.sort(key=lambda b: b.numel())
            while self._free and self.bytes + size > self.cap_bytes:
                self.bytes -= self._free.pop(0).numel()
            if self.bytes + size <= self.cap_bytes:
                if self._pin is None:
                    buf = torch.empty(size, dtype=torch.uint8, pin_memory=True)
                else:
                    buf = self._pin(torch.empty(size, dtype=torch.uint8))
                self.bytes += buf.numel()
                self.peak_bytes = max(self.peak_bytes, self.bytes)
                self.allocations += 1
                return buf
        for i, (buf, event) in enumerate(self._busy):
            if buf.numel() >= nbytes:
                if event is not None:
                    event.synchronize()  # host waits for that earlier copy, then reuses
                del self._busy[i]
                self.reuses += 1
                return buf
        return None

    def release(self, buf: torch.Tensor, event: _Event | None) -> None:
        """Give ``buf`` back; it is reused only after ``event`` (None: at once) has completed."""
        self._busy.append((buf, event))

    def clear(self) -> None:
        """Drop every buffer, once the copies still reading one have finished.

        torch's host allocator would keep its own pinned blocks alive for those copies anyway,
        but memory from a custom ``pin_fn`` may not be protected that way, so this waits.
        """
        for _, event in self._busy:
            if event is not None:
                event.synchronize()
        self._free.clear()
        self._busy.clear()
        self.bytes = 0


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefetchStats:
    """Where the time went, cumulated over every pass since construction or :meth:`reset`.

    ``source_s``: host time waiting for the source to produce batches (CPU-bound work).
    ``copy_s``: host time spent staging and issuing copies (including blocking fallbacks and
    waits for a staging buffer); ``copy_device_s``: device time of the copies, from events
    (None without streams). ``consumer_s``: host time between handing out a batch and being asked
    for the next one; asynchronous device work shows up there only where the consumer waits for
    it (``.item()``, ``.cpu()``, a full allocator). ``consumer_device_s``: time the consumer's
    stream spent on the batches, from events recorded on it at each hand-out (after its wait for
    the copy) and at the next request, so the device work of a consumer that never waits for it
    is seen too (None without streams).
    """

    mode: Literal["streams", "pass-through"]
    device: str
    batches: int
    source_s: float
    copy_s: float
    copy_device_s: float | None
    consumer_s: float
    consumer_device_s: float | None
    staged_batches: int
    already_pinned: int
    fallback_copies: int
    pool_cap_bytes: int
    pool_bytes: int
    pool_peak_bytes: int
    pool_allocations: int
    pool_reuses: int

    @property
    def bottleneck(self) -> Bottleneck:
        """The stage that took the most time: ``source``, ``copy`` or ``consumer``.

        A stage with a device time counts the larger of its host and device times.
        """
        if self.batches == 0:
            return "none"
        stages: dict[Bottleneck, float] = {
            "source": self.source_s,
            "copy": max(self.copy_s, self.copy_device_s or 0.0),
            "consumer": max(self.consumer_s, self.consumer_device_s or 0.0),
        }
        return max(stages, key=lambda k: stages[k])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"bottleneck": self.bottleneck}

    def __str__(self) -> str:
        def dev(s: float | None) -> str:
            return "" if s is None else f" (device {s * 1e3:.1f} ms)"

        return (
            f"{self.batches} batches to {self.device} ({self.mode}): "
            f"source {self.source_s * 1e3:.1f} ms, "
            f"copy {self.copy_s * 1e3:.1f} ms{dev(self.copy_device_s)}, "
            f"consumer {self.consumer_s * 1e3:.1f} ms{dev(self.consumer_device_s)}; "
            f"bottleneck: {self.bottleneck}"
        )


@dataclass(slots=True)
class _Acc:
    batches: int = 0
    source_s: float = 0.0
    copy_s: float = 0.0
    copy_device_s: float = 0.0
    consumer_s: float = 0.0
    consumer_device_s: float = 0.0
    staged_batches: int = 0
    already_pinned: int = 0
    fallback_copies: int = 0
    pending: deque[tuple[_Event, _Event]] = field(default_factory=deque)  # copies
    consumed: deque[tuple[_Event, _Event]] = field(default_factory=deque)  # consumer's stream

    def reset(self) -> None:
        fresh = _Acc()
        for f in fields(self):
            setattr(self, f.name, getattr(fresh, f.name))

    def settle(self, wait: bool) -> None:
        """Add the device time of finished copies and consumer spans (waiting, when ``wait``)."""
        self.copy_device_s += _drain(self.pending, wait)
        self.consumer_device_s += _drain(self.consumed, wait)


def _drain(spans: deque[tuple[_Event, _Event]], wait: bool) -> float:
    """Seconds between the event pairs that have completed, oldest first; removes them.

    ``elapsed_time`` is only valid once both events have completed: the end event is waited
    for (``wait``) or queried, and the start event, recorded before it on the same stream, has
    completed by then.
    """
    total = 0.0
    while spans:
        start, end = spans[0]
        if wait:
            end.synchronize()
        elif not end.query():
            break
        spans.popleft()
        total += start.elapsed_time(end) / 1e3  # milliseconds
    return total


# --------------------------------------------------------------------------------------------
# The prefetcher
# --------------------------------------------------------------------------------------------


@dataclass
class _InFlight:
    batch: Any
    start: _Event
    done: _Event
    produced: list[torch.Tensor]


@dataclass
class _Failed:
    error: BaseException


class DevicePrefetcher(Generic[T]):
    """Iterate over ``iterable`` with each batch already on ``device``, copies overlapping compute.

    Args:
        iterable: any iterable of batches: tensors, or dicts/lists/tuples/namedtuples/
            dataclasses of them (whatever :func:`torchplace.move` handles), e.g. a ``DataLoader``
            with or without ``pin_memory``. Each ``iter()`` of the prefetcher starts a new pass.
        device: where batches go; resolved with :func:`torchplace.resolve_device`.
        depth: how many batches are copied ahead of the one the consumer holds (>= 1). The
            host keeps ``depth + 1`` batches referenced; when the host runs ahead of the device,
            the allocator also keeps the memory of batches whose kernels are still queued
            (that is what ``record_stream`` protects), as with any asynchronous loop.
        pin: stage pageable host tensors through pinned buffers, so their copies can overlap.
        non_blocking: issue copies asynchronously on the side stream (only ever from pinned
            memory); False makes every copy blocking.
        pin_pool_bytes: cap on pinned host memory kept for staging; batches larger than what is
            left are copied plainly instead (0 disables staging).
        pin_fn: returns a pinned copy of a host tensor, used to make staging buffers (default:
            allocate them pinned with ``torch.empty(..., pin_memory=True)``).
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
        self.pin = bool(pin)
        self.non_blocking = bool(non_blocking)
        self.dtype = dtype
        self._iterable = iterable
        self._pool = PinnedPool(pin_pool_bytes, pin_fn)
        self._streams = _streams_for(self.device)
        self._side: Any = None
        self._acc = _Acc()
        self._active: weakref.ref[Generator[T, None, None]] | None = None

    @property
    def mode(self) -> Literal["streams", "pass-through"]:
        """``streams`` when copies run on a side stream, else ``pass-through``."""
        return "streams" if self._streams is not None else "pass-through"

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[T]:
        self.close_pass()
        gen = self._stream_pass() if self._streams is not None else self._plain_pass()
        self._active = weakref.ref(gen)
        return gen

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
        """End the pass in progress, if any, dropping the batches in flight."""
        gen = self._active() if self._active is not None else None
        self._active = None
        if gen is not None:
            gen.close()

    def close(self) -> None:
        """End the pass in progress and free the pinned staging buffers."""
        self.close_pass()
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
        """An object with its own ``to`` (``PackedSequence``, ...) moves itself, blocking."""
        return obj.to(self.device)

    # ---------------------------------------------------------------------------------------
    # Without streams: move when asked
    # ---------------------------------------------------------------------------------------

    def _plain_pass(self) -> Generator[T, None, None]:
        source = self._iterable
        it = iter(source)
        owned = it is not source
        acc = self._acc
        leaf = _tensor_mover(self.device, self.non_blocking, self.dtype)
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
                if not ready(batch):
                    batch = map_tensors(batch, leaf, copy=False, objects=move_object)
                    t1, handed = handed, clock()
                    acc.copy_s += handed - t1
                acc.batches += 1
                yield batch
                t0 = clock()
                acc.consumer_s += t0 - handed
                handed = 0.0
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
        side = self._side
        queue: deque[_InFlight | _Failed] = deque()
        acc = self._acc
        clock = time.perf_counter
        done = False
        handed = 0.0

        def fill() -> None:
            nonlocal done
            while not done and len(queue) < self.depth:
                t0 = clock()
                try:
                    batch = next(it)
                except StopIteration:
                    done = True
                    return
                except Exception as exc:  # re-raised when the consumer reaches this position
                    queue.append(_Failed(exc))
                    done = True
                    return
                t1 = clock()
                acc.source_s += t1 - t0
                try:
                    queue.append(self._launch(batch, side))
                except Exception as exc:
                    queue.append(_Failed(exc))
                    done = True
                acc.copy_s += clock() - t1

        try:
            fill()
            while queue:
                item = queue.popleft()
                if isinstance(item, _Failed):
                    queue.clear()
                    raise item.error
                consumer = streams.current_stream()
                # device-side wait: the consumer's kernels start after the copies, no host sync
                streams.wait(consumer, item.done)
                for t in item.produced:
                    # the allocator must not recycle this memory while the consumer's stream
                    # may still read it, however long the consumer keeps or frees the batch
                    streams.record_stream(t, consumer)
                acc.pending.append((item.start, item.done))
                acc.settle(wait=False)
                acc.batches += 1
                batch = item.batch
                del item
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

    def _launch(self, batch: Any, side: Any) -> _InFlight:
        """Stage ``batch`` and queue its copies on ``side``; returns the in-flight record."""
        streams = self._streams
        assert streams is not None
        device, dtype, acc = self.device, self.dtype, self._acc
        kind, index = device.type, device.index
        plan: dict[int, str] = {}
        staged: list[torch.Tensor] = []
        resident = False

        def classify(t: torch.Tensor) -> torch.Tensor:
            nonlocal resident
            if id(t) in plan:
                return t
            d = t.device
            if d.type == kind and (index is None or d.index == index):
                plan[id(t)] = "here"
                resident = True
            elif d.type != "cpu":
                plan[id(t)] = "device"
                resident = True
            elif t.numel() == 0 or t.layout != torch.strided or t.is_nested or t.requires_grad:
                # a copy through a staging buffer would drop the autograd link of such a tensor
                plan[id(t)] = "blocking"
            elif streams.is_pinned(t):
                plan[id(t)] = "pinned"
                acc.already_pinned += 1
            elif self.pin and self.non_blocking and type(t) is torch.Tensor and not t.is_quantized:
                # (a subclass, e.g. a torchvision tv_tensor, would come out of a staging buffer
                # as a plain tensor, without its type or metadata; ``to`` keeps them)
                plan[id(t)] = "stage"
                staged.append(t)
            else:
                plan[id(t)] = "blocking"
            return t

        map_tensors(batch, classify, copy=False, objects=_keep)

        views: dict[int, torch.Tensor] = {}
        buf: torch.Tensor | None = None
        if staged:
            offsets, total = [], 0
            for t in staged:
                offsets.append(total)
                total += -(-(t.numel() * t.element_size()) // _ALIGN) * _ALIGN
            buf = self._pool.acquire(total)
            if buf is None:
                for t in staged:
                    plan[id(t)] = "blocking"
                acc.fallback_copies += len(staged)
                _log.debug(
                    "prefetch: batch of %d bytes does not fit the %d-byte pinned pool; "
                    "copying it blocking from pageable memory",
                    total,
                    self._pool.cap_bytes,
                )
            else:
                try:
                    with torch.no_grad():
                        for t, off in zip(staged, offsets, strict=True):
                            views[id(t)] = view = _staging_view(buf, off, t)
                            view.copy_(t)  # host memcpy into pinned memory
                except BaseException:
                    self._pool.release(buf, None)  # no copy reads it yet
                    raise
                acc.staged_batches += 1

        produced: list[torch.Tensor] = []
        non_blocking = self.non_blocking

        def transfer(t: torch.Tensor) -> torch.Tensor:
            how = plan[id(t)]
            convert = dtype is not None and t.dtype != dtype and t.is_floating_point()
            if how == "here":
                if not convert:
                    return t
                # read on the side stream: the source may free it at once, and the allocator
                # must not hand its memory to the consumer's stream before this read has run
                streams.record_stream(t, side)
                out = t.to(dtype)
            else:
                src = views.get(id(t), t)
                nb = non_blocking and how in ("stage", "pinned", "device")
                # copy=True: a staging view is never handed out, even when the copy is a no-op
                out = src.to(device, non_blocking=nb, copy=how == "stage")
                if convert:
                    out = out.to(dtype)
            if out is not t:
                produced.append(out)
            return out

        start, done = streams.new_event(), streams.new_event()
        consumer = streams.current_stream()

        def move_object(obj: Any) -> Any:
            # an object with its own ``to`` allocates where it likes and its tensors cannot be
            # record_stream-ed reliably: move it on the consumer's stream, in order with its use
            with streams.use(consumer):
                return self._move_object(obj)

        recorded = False
        try:
            with streams.use(side):
                if resident:
                    # tensors already on a device were made on the consumer's stream: read
                    # them only after it has finished writing them
                    streams.wait_stream(side, consumer)
                start.record(side)
                out = map_tensors(batch, transfer, copy=False, objects=move_object)
                done.record(side)
                recorded = True
        finally:
            if buf is not None:
                if not recorded:
                    # a copy failed: the buffer is free once the copies already issued are done
                    done.record(side)
                self._pool.release(buf, done)
        return _InFlight(out, start, done, produced)


def _staging_view(buf: torch.Tensor, offset: int, t: torch.Tensor) -> torch.Tensor:
    """The part of the flat ``uint8`` buffer at ``offset`` seen as a tensor laid out as ``t``'s copy.

    A contiguous ``t`` gets a contiguous view. Otherwise the view takes the strides that
    ``t.to(device)`` would give its copy (the same for a dense layout such as channels_last or a
    transpose, contiguous for a strided slice), so staging does not change the memory format of
    a batch: the device copy of a dense view keeps its strides.
    """
    flat = buf[offset : offset + t.numel() * t.element_size()].view(t.dtype)
    if t.is_contiguous():
        return flat.view(t.shape)
    return flat.as_strided(t.shape, torch.empty_like(t, device="meta").stride())


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


def _keep(obj: Any) -> Any:
    return obj


def _close(it: Iterator[Any]) -> None:
    close = getattr(it, "close", None)
    if callable(close):
        close()
