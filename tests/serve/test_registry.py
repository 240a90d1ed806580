"""The registry: lookups by name and version, atomic publishing, the repository index."""

from __future__ import annotations

import pytest

from torchplace.errors import ModelNotFoundError
from torchplace.serve.registry import ModelHandle, Registry

from .conftest import FakeEngine


def _handle(version: str) -> ModelHandle:
    return ModelHandle(FakeEngine(version=version))


def test_lookup_by_name_and_version() -> None:
    registry = Registry()
    calls: list[int] = []
    registry.subscribe(lambda: calls.append(1))
    v1, v2, v10 = _handle("1"), _handle("2"), _handle("10")
    registry.publish("seed-mlp", [v10, v1, v2])
    assert calls == [1]
    assert registry.get("seed-mlp") is v10  # the latest, numerically
    assert registry.get("seed-mlp", "2") is v2
    assert [h.version for h in registry.versions("seed-mlp")] == ["1", "2", "10"]
    with pytest.raises(ModelNotFoundError, match="'seed-mlp' version 3 is not found"):
        registry.get("seed-mlp", "3")
    with pytest.raises(
        ModelNotFoundError, match="unknown model: 'x' is not found; this server serves 'seed"
    ):
        registry.get("x")


def test_publish_replaces_and_the_index_tells_what_happened() -> None:
    registry = Registry()
    v1, v2 = _handle("1"), _handle("2")
    registry.publish("seed-mlp", [v1])
    registry.mark("seed-mlp", "3", "UNAVAILABLE", "bad weights")
    assert registry.publish("seed-mlp", [v2]) == [v1]
    assert registry.index() == [
        {"name": "seed-mlp", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
        {"name": "seed-mlp", "version": "2", "state": "READY", "reason": ""},
        {"name": "seed-mlp", "version": "3", "state": "UNAVAILABLE", "reason": "bad weights"},
    ]
    assert registry.index(ready_only=True) == [
        {"name": "seed-mlp", "version": "2", "state": "READY", "reason": ""}
    ]
    assert registry.index(known=["other"])[0] == {"name": "other"}  # sorted by name
    assert registry.publish("seed-mlp", []) == [v2]
    assert registry.names() == []


def test_handles_count_the_requests_they_hold() -> None:
    handle = _handle("1")
    assert handle.enter() is handle
    assert handle.active == 1
    handle.leave()
    assert handle.active == 0
