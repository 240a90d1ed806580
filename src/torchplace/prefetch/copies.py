"""One batch's copies on the side stream: :class:`BatchCopier` stages a batch and queues them.

Each tensor of a batch gets a route (:data:`Route`): already on the device (``here``), on
another device, already pinned, staged through the pinned pool, or copied blocking (empty,
sparse, nested or autograd-linked tensors, tensor subclasses, or when the pool is full). The
copies then run on the side stream between two events; the consumer's stream waits on the
second before it uses the batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from torchplace.placement import map_tensors
from torchplace.placement.nested import no_data_error
from torchplace.prefetch import staging
from torchplace.prefetch.staging import PinnedPool
from torchplace.prefetch.stats import StatsAccumulator
from torchplace.prefetch.streams import Event, Streams

__all__ = ["BatchCopier", "InFlight", "Route"]

_log = logging.getLogger("torchplace.prefetch")

#: How one tensor of a batch reaches the device.
Route = Literal["here", "device", "pinned", "stage", "blocking"]


@dataclass
class InFlight:
    """A batch whose copies are queued: the batch as the consumer will see it, the events
    around its copies, and every tensor the copies produced (to ``record_stream``)."""

    batch: Any
    start: Event
    done: Event
    produced: list[torch.Tensor]


@dataclass
class _Plan:
    routes: dict[int, Route] = field(default_factory=dict)
    staged: list[torch.Tensor] = field(default_factory=list)
    views: dict[int, torch.Tensor] = field(default_factory=dict)
    resident: bool = False  # some tensor is already on a device


@dataclass
class BatchCopier:
    """The prefetcher's settings for one device, applied to one batch at a time."""

    device: torch.device
    dtype: torch.dtype | None
    pin: bool
    non_blocking: bool
    streams: Streams
    pool: PinnedPool
    acc: StatsAccumulator
    move_object: Callable[[Any], Any]

    def launch(self, batch: Any, side: Any) -> InFlight:
        """Stage ``batch`` and queue its copies on ``side``; returns the in-flight record."""
        plan = self._plan(batch)
        buf = self._stage(plan) if plan.staged else None
        return self._issue(batch, plan, side, buf)

    def _plan(self, batch: Any) -> _Plan:
        plan = _Plan()

        def classify(t: torch.Tensor) -> torch.Tensor:
            if id(t) not in plan.routes:
                route = plan.routes[id(t)] = self._route(t)
                plan.resident |= route in ("here", "device")
                if route == "stage":
                    plan.staged.append(t)
            return t

        map_tensors(batch, classify, copy=False, objects=_keep)
        return plan

    def _route(self, t: torch.Tensor) -> Route:
        d, kind, index = t.device, self.device.type, self.device.index
        if d.type == kind and (index is None or d.index == index):
            return "here"
        if d.type == "meta":
            raise no_data_error(t, self.device)
        if d.type != "cpu":
            return "device"
        if t.numel() == 0 or t.layout != torch.strided or t.is_nested or t.requires_grad:
            # a copy through a staging buffer would drop the autograd link of such a tensor
            return "blocking"
        if self.streams.is_pinned(t):
            self.acc.already_pinned += 1
            return "pinned"
        if self.pin and self.non_blocking and type(t) is torch.Tensor and not t.is_quantized:
            # (a subclass, e.g. a torchvision tv_tensor, would come out of a staging buffer as
            # a plain tensor, without its type or metadata; ``to`` keeps them)
            return "stage"
        return "blocking"

    def _stage(self, plan: _Plan) -> torch.Tensor | None:
        """Copy the staged tensors into one pinned buffer; None (copy blocking) when full."""
        offsets, total = staging.staging_layout(plan.staged)
        buf = self.pool.acquire(total)
        if buf is None:
            for t in plan.staged:
                plan.routes[id(t)] = "blocking"
            self.acc.fallback_copies += len(plan.staged)
            _log.debug(
                "prefetch: batch of %d bytes does not fit the %d-byte pinned pool; "
                "copying it blocking from pageable memory",
                total,
                self.pool.cap_bytes,
            )
            return None
        try:
            with torch.no_grad():
                for t, off in zip(plan.staged, offsets, strict=True):
                    plan.views[id(t)] = view = staging.staging_view(buf, off, t)
                    view.copy_(t)  # host memcpy into pinned memory
        except BaseException:
            self.pool.release(buf, None)  # no copy reads it yet
            raise
        self.acc.staged_batches += 1
        return buf

    def _issue(self, batch: Any, plan: _Plan, side: Any, buf: torch.Tensor | None) -> InFlight:
        """Queue the copies on ``side`` between two events; the buffer goes back to the pool."""
        streams = self.streams
        produced: list[torch.Tensor] = []
        transfer = self._transfer(plan, side, produced)
        start, done = streams.new_event(), streams.new_event()
        consumer = streams.current_stream()

        def move_object(obj: Any) -> Any:
            # an object with its own ``to`` allocates where it likes and its tensors cannot be
            # record_stream-ed reliably: move it on the consumer's stream, in order with its use
            with streams.use(consumer):
                return self.move_object(obj)

        recorded = False
        try:
            with streams.use(side):
                if plan.resident:
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
                self.pool.release(buf, done)
        return InFlight(out, start, done, produced)

    def _transfer(
        self, plan: _Plan, side: Any, produced: list[torch.Tensor]
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The per-tensor copy, by route; every new tensor is added to ``produced``."""
        device, dtype, non_blocking, streams = (
            self.device,
            self.dtype,
            self.non_blocking,
            self.streams,
        )

        def transfer(t: torch.Tensor) -> torch.Tensor:
            how = plan.routes[id(t)]
            convert = dtype is not None and t.dtype != dtype and t.is_floating_point()
            if how == "here":
                if not convert:
                    return t
                # read on the side stream: the source may free it at once, and the allocator
                # must not hand its memory to the consumer's stream before this read has run
                streams.record_stream(t, side)
                out = t.to(dtype)
            else:
                src = plan.views.get(id(t), t)
                nb = non_blocking and how in ("stage", "pinned", "device")
                # copy=True: a staging view is never handed out, even when the copy is a no-op
                out = src.to(device, non_blocking=nb, copy=how == "stage")
                if convert:
                    out = out.to(dtype)
            if out is not t:
                produced.append(out)
            return out

        return transfer


def _keep(obj: Any) -> Any:
    return obj
