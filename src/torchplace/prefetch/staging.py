"""The staging pool: a bounded :class:`PinnedPool` of reusable pinned host buffers, and how a
batch's host tensors are laid out in one (:func:`staging_layout`, :func:`staging_view`).

Pageable host tensors are copied into a pinned buffer first, so that their copies to the device
can be asynchronous; a buffer is handed out again only once the event of the copy out of it has
completed. Over the cap the caller degrades to a plain (blocking) copy instead of pinning more.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import torch

from torchplace.errors import ConfigError
from torchplace.prefetch.streams import Event

__all__ = ["DEFAULT_PIN_POOL_BYTES", "PinFn", "PinnedPool", "staging_layout", "staging_view"]

PinFn = Callable[[torch.Tensor], torch.Tensor]

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


def staging_layout(tensors: Sequence[torch.Tensor]) -> tuple[list[int], int]:
    """The byte offset of each tensor in one staging buffer, and the bytes the buffer needs."""
    offsets, total = [], 0
    for t in tensors:
        offsets.append(total)
        total += -(-(t.numel() * t.element_size()) // _ALIGN) * _ALIGN
    return offsets, total


def staging_view(buf: torch.Tensor, offset: int, t: torch.Tensor) -> torch.Tensor:
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


def _checked_pin(pin: PinFn, size: int) -> torch.Tensor:
    """``pin`` applied to a new flat ``uint8`` host tensor of ``size`` bytes, or a ConfigError
    when what it returns is not such a tensor (staging would fail or misread it later)."""
    out = pin(torch.empty(size, dtype=torch.uint8))
    if (
        not isinstance(out, torch.Tensor)
        or out.dtype != torch.uint8
        or out.dim() != 1
        or out.numel() < size
        or out.device.type != "cpu"
    ):
        got = (
            f"a {out.dtype} tensor of shape {tuple(out.shape)} on {out.device}"
            if isinstance(out, torch.Tensor)
            else type(out).__name__
        )
        raise ConfigError(
            f"pin_fn returned {got} for a flat uint8 host tensor of {size} bytes; it must return "
            "a pinned copy of the tensor it is given (same dtype and shape, on the host), such "
            "as t.pin_memory()"
        )
    return out


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
        self._busy: deque[tuple[torch.Tensor, Event | None]] = deque()
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
                    buf = _checked_pin(self._pin, size)
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

    def release(self, buf: torch.Tensor, event: Event | None) -> None:
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
