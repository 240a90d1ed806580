"""Stand-ins for the prefetcher's tests: fake streams and events that log what the prefetcher asks
of them (aimed at the ``meta`` device, with a fake pinning function), and sources and batches."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from torchplace import DevicePrefetcher
from torchplace.placement import map_tensors

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
# sources
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
