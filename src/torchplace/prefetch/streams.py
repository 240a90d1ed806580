"""Streams: the few stream and event operations the prefetcher needs, behind one small interface.

:func:`streams_for` gives the real ones for a CUDA or XPU device (None for a device without
streams: cpu, meta, mps); tests substitute fakes that log each operation.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import torch

__all__ = ["Event", "Streams", "streams_for"]


class Event(Protocol):
    """A device event (``torch.cuda.Event`` with timing)."""

    def record(self, stream: Any = ...) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end_event: Any) -> float: ...


class Streams(Protocol):
    """Stream operations on one device (CUDA and XPU share this API)."""

    def new_stream(self) -> Any: ...
    def use(self, stream: Any) -> contextlib.AbstractContextManager[Any]: ...
    def current_stream(self) -> Any: ...
    def new_event(self) -> Event: ...
    def wait(self, stream: Any, event: Event) -> None: ...
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

    def new_event(self) -> Event:
        return self._b.Event(enable_timing=True)  # type: ignore[no-any-return]

    def wait(self, stream: Any, event: Event) -> None:
        stream.wait_event(event)

    def wait_stream(self, stream: Any, other: Any) -> None:
        stream.wait_stream(other)

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        t.record_stream(stream)

    def is_pinned(self, t: torch.Tensor) -> bool:
        return bool(t.is_pinned())


def streams_for(device: torch.device) -> Streams | None:
    """The stream backend for ``device``, or None for a device without streams (cpu, meta, mps)."""
    if device.type not in ("cuda", "xpu"):
        return None
    backend = getattr(torch, device.type, None)
    if backend is None or not hasattr(backend, "Stream") or not backend.is_available():
        return None
    return _TorchStreams(backend, device)
