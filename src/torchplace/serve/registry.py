"""The live set of models and versions a server answers for, switched atomically.

A :class:`ModelHandle` is one loaded model version: its engine, its protocol documents (built
once) and how many requests hold it. The :class:`Registry` maps a model name to its loaded
versions; :meth:`Registry.publish` replaces a model's versions in one step on the event loop,
so a request resolves either the old set or the new one, never a mix. A request takes its
handle with :meth:`ModelHandle.enter` when it is routed and gives it back with
:meth:`ModelHandle.leave` when answered; :meth:`ModelHandle.retire` waits for those (then for
the engine's queue) before the engine stops, so a switch loses no request.

The registry also keeps the repository index (Triton's ``name``/``version``/``state``/``reason``):
``READY`` for what is published, ``LOADING``, ``UNAVAILABLE`` with the reason of a failed load
or an unload.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from torchplace.errors import ModelNotFoundError
from torchplace.serve import protocol
from torchplace.serve.triton import model_config

if TYPE_CHECKING:
    from torchplace.models import TensorSpec
    from torchplace.serve.app import EngineLike

__all__ = ["ModelHandle", "Registry"]


class ModelHandle:
    """One loaded model version (see the module docstring)."""

    def __init__(self, engine: EngineLike) -> None:
        self.engine = engine
        self.name = engine.name
        self.version = engine.version
        #: Triton's max_batch_size 0: clients send and receive the tensors as the model takes
        #: them; the protocol side adds the engine's first dimension (one request) and takes it
        #: off again (see :func:`one_request` and :func:`its_answer`)
        self.unbatched = bool(getattr(engine, "unbatched", False))
        self.inputs = _on_the_wire(engine.inputs, self.unbatched)
        self.outputs = _on_the_wire(engine.outputs, self.unbatched)
        #: rows a request may hold; unbatched, the first dimension is the model's own, which
        #: the body's byte limit bounds
        self.max_request_rows = _UNBOUNDED if self.unbatched else engine.max_request_rows
        #: the model's published versions, this one among them (what its metadata lists)
        self.versions: list[str] = []
        self.metadata = b""
        self.set_versions([self.version])
        #: Triton's ModelConfig document of this version, and as JSON bytes
        self.config_doc = model_config(engine)
        self.config = orjson.dumps(self.config_doc)
        #: requests routed to this version and not answered yet
        self.active = 0
        #: per-protocol views of this version (the gRPC side keeps its messages here)
        self.views: dict[str, Any] = {}

    def one_request(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A decoded request's arrays as the engine takes them: as they are, or (unbatched)
        each with a first dimension of one."""
        if not self.unbatched:
            return arrays
        return {name: array[np.newaxis] for name, array in arrays.items()}

    def its_answer(self, results: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The engine's results as the client gets them: as they are, or (unbatched) without
        the engine's first dimension."""
        if not self.unbatched:
            return results
        return {name: array[0] for name, array in results.items()}

    def set_versions(self, versions: Sequence[str]) -> None:
        """The versions of the model published next to this one (its metadata names them)."""
        self.versions = list(versions)
        self.metadata = protocol.model_metadata(
            name=self.name, versions=self.versions, platform=self.engine.platform,
            inputs=self.inputs, outputs=self.outputs,
        )  # fmt: skip

    def set_policy(self, policy: dict[str, Any]) -> None:
        """The model's version policy, as its repository states it (Triton's JSON), in the
        config document instead of this version alone: a config read back and sent with a
        load keeps the policy the model has."""
        self.config_doc = {**self.config_doc, "version_policy": policy}
        self.config = orjson.dumps(self.config_doc)

    def enter(self) -> ModelHandle:
        self.active += 1
        return self

    def leave(self) -> None:
        self.active -= 1

    async def retire(self, timeout: float, reason: str | None = None) -> None:
        """Wait (up to ``timeout`` s) for the requests routed here, drain the engine, stop;
        requests still queued then are told ``reason`` (see :meth:`Engine.drain
        <torchplace.serve.engine.Engine.drain>`)."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while self.active > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        await self.engine.drain(max(0.0, deadline - time.monotonic()), reason)
        await self.engine.stop()


def _version_key(version: str) -> tuple[int, int | str]:
    return (1, int(version)) if version.isascii() and version.isdigit() else (0, version)


class Registry:
    """Model name -> its loaded versions, plus the repository index (see the module docstring)."""

    def __init__(self) -> None:
        self._models: dict[str, dict[str, ModelHandle]] = {}
        self._states: dict[tuple[str, str], tuple[str, str]] = {}
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the loop) after every change of the published set."""
        self._listeners.append(listener)

    def names(self) -> list[str]:
        return list(self._models)

    def versions(self, name: str) -> list[ModelHandle]:
        """The loaded versions of ``name``, oldest first (empty when none)."""
        return list(self._models.get(name, {}).values())

    def handles(self) -> list[ModelHandle]:
        return [h for versions in self._models.values() for h in versions.values()]

    def get(self, name: str, version: str = "") -> ModelHandle:
        """``name`` at ``version`` ('' = its latest loaded); ModelNotFoundError else."""
        versions = self._models.get(name)
        if not versions:
            known = ", ".join(repr(n) for n in self._models) or "none"
            # Triton's words: a model it knows (unloaded, or its load failed) has no versions
            why = "has no available versions" if self._known(name) else "is not found"
            raise ModelNotFoundError(
                f"Request for unknown model: {name!r} {why}; this server serves {known}"
            )
        if not version:
            return next(reversed(versions.values()))  # kept in version order by publish
        handle = versions.get(version)
        if handle is None:
            # a version unloaded or still loading is Triton's "not at ready state"
            why = "is not at ready state" if (name, version) in self._states else "is not found"
            raise ModelNotFoundError(
                f"Request for unknown model: {name!r} version {version} {why}; "
                "available: " + ", ".join(repr(v) for v in versions)
            )
        return handle

    def _known(self, name: str) -> bool:
        """Whether ``name`` was loaded, or its load tried, since the server started."""
        return any(known == name for known, _ in self._states)

    def publish(self, name: str, handles: Sequence[ModelHandle]) -> list[ModelHandle]:
        """Make ``handles`` the versions of ``name`` in one step; returns the replaced ones."""
        old = self._models.get(name, {})
        if handles:
            ordered = sorted(handles, key=lambda h: _version_key(h.version))
            self._models[name] = {h.version: h for h in ordered}
            for handle in ordered:
                handle.set_versions([h.version for h in ordered])
        else:
            self._models.pop(name, None)
        kept = {h.version for h in handles}
        # a failed load's entry without a version (its config did not read) is history once
        # the model's versions change: the index lists what they are now
        self._states.pop((name, ""), None)
        for version in old:
            if version not in kept:
                self._states[(name, version)] = ("UNAVAILABLE", "unloaded")
        for handle in handles:
            self._states[(name, handle.version)] = ("READY", "")
        for listener in self._listeners:
            listener()
        return [h for h in old.values() if all(h is not n for n in handles)]

    def mark(self, name: str, version: str, state: str, reason: str = "") -> None:
        """Record a state of the index (LOADING, UNAVAILABLE with its reason)."""
        self._states[(name, version)] = (state, reason)

    def index(self, ready_only: bool = False, known: Sequence[str] = ()) -> list[dict[str, str]]:
        """Triton's repository index: one entry per model version (and per known model)."""
        entries: list[dict[str, str]] = []
        seen = set()
        for (name, version), (state, reason) in sorted(self._states.items()):
            seen.add(name)
            if ready_only and state != "READY":
                continue
            # "reason" is in every entry, empty if none: the extension's schema does not mark it
            # optional, and MLServer's client requires it (Triton's own leaves an empty one out)
            entries.append({"name": name, "version": version, "state": state, "reason": reason})
        if not ready_only:
            entries.extend({"name": n} for n in known if n not in seen)
        return sorted(entries, key=lambda e: (e["name"], e.get("version", "")))


_UNBOUNDED = 2**62


def _on_the_wire(specs: Sequence[TensorSpec], unbatched: bool) -> tuple[TensorSpec, ...]:
    """The declarations as clients see them: the engine's, or (unbatched) without the first
    dimension the engine batches along, which is the request itself."""
    if not unbatched:
        return tuple(specs)
    return tuple(dataclasses.replace(spec, shape=spec.shape[1:]) for spec in specs)
