"""Fixtures: ``fake`` (the stream pipeline on fake streams) and ``make`` (a prefetcher in either mode)."""

from __future__ import annotations

from typing import Any

import pytest

import torchplace.prefetch.streams as stream_backend
from torchplace import DevicePrefetcher

from .fakes import FakeStreams


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeStreams:
    streams = FakeStreams()
    monkeypatch.setattr(stream_backend, "streams_for", lambda device: streams)
    return streams


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
