"""Loading, reloading and unloading models while the server serves (Triton's model control).

:class:`ModelControl` builds the engines of a :class:`~torchplace.serve.registry.Registry`:

- at start, every ``--model`` and, from ``--model-repository``, every model (modes ``none``
  and ``poll``) or those of ``--load-model`` (mode ``explicit``). A repository model whose
  config or load fails is marked ``UNAVAILABLE`` with the reason; the others load.
- :meth:`ModelControl.load` (``POST /v2/repository/models/{m}/load``): read the model's
  directory (and an inline config), then for each version the policy selects: build the model
  on the host, check memory (:mod:`torchplace.serve.memory`), place and warm every replica with
  its dry run, all while the loaded versions keep serving. Only when every version is ready is
  the set switched (:meth:`Registry.publish`, one step on the loop); the replaced versions are
  drained (requests routed to them finish there) and released. A failed load changes nothing
  that serves: the index shows the reason.
- :meth:`ModelControl.unload`: unpublish, then drain and release.
- mode ``poll``: every ``--repository-poll-secs`` the repository is scanned; a new or changed
  model directory is (re)loaded, a removed one unloaded.

In mode ``none`` load and unload are refused (:class:`~torchplace.errors.ModelControlError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from torchplace.errors import (
    ConfigError,
    ModelControlError,
    ModelLoadError,
    ModelNotFoundError,
    TorchplaceError,
)
from torchplace.serve.memory import MemoryCheck, estimate, trim_host_heap
from torchplace.serve.registry import ModelHandle, Registry
from torchplace.serve.repository import (
    POLL_FAILED,
    RENAMED,
    ModelDir,
    Notices,
    check_inline_batch,
    check_model_name,
    load_failed,
    model_names,
    read_model,
)

if TYPE_CHECKING:
    from torchplace.serve.app import EngineLike
    from torchplace.serve.config import ServeConfig
    from torchplace.serve.loader import LoadedModel

__all__ = ["ModelControl", "model_settings"]

_T = TypeVar("_T")

logger = logging.getLogger("torchplace.serve")
_MODEL_FIELDS = ("name", "weights", "exported", "torchscript", "labels", "inputs", "outputs")
#: ServeConfig fields as a repository's config.toml names them
_SETTING_NAMES = {
    **RENAMED,
    "max_batch_size": "[batching] max_batch_size",
    "max_delay_ms": "[batching] max_delay_ms",
}


def model_settings(config: ServeConfig) -> list[dict[str, Any]]:
    """The settings of each ``--model`` (the first keeps --name, --weights...)."""
    first = {"model": config.model, "models": ()}
    rest = [{"model": m, "models": (), **dict.fromkeys(_MODEL_FIELDS)} for m in config.models]
    return [first, *rest]


class ModelControl:
    """Loads the models of a registry and changes them live (see the module docstring)."""

    def __init__(
        self,
        registry: Registry,
        config: ServeConfig,
        *,
        memory: MemoryCheck | None = None,
        engine: EngineLike | None = None,
    ) -> None:
        self.registry = registry
        self.config = config
        self.mode = config.model_control_mode
        self.root = config.model_repository
        self.memory = memory if memory is not None else MemoryCheck(budget=config.memory_budget)
        self._given = engine
        self._recipes: dict[str, list[dict[str, Any]]] = {}  # --model name -> its settings
        #: model name -> its lock and how many hold or wait for it (dropped at none: the
        #: names come from clients, a table that kept them all would grow without end)
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        #: loads and unloads under way, finished even when their caller goes away
        self._actions: set[asyncio.Task[Any]] = set()
        self._stamps: dict[str, Any] = {}
        #: what reading the repository logged, told once per model directory
        self._notices = Notices()
        self._owners = itertools.count()
        self._poller: asyncio.Task[None] | None = None
        registry.subscribe(self._share_loop)

    # -- start and stop --------------------------------------------------------------------
    async def start(self) -> None:
        """Load the ``--model`` ones (a failure stops the start), then the repository's."""
        if self._given is not None:
            await self._given.start()
            self.registry.publish(self._given.name, [ModelHandle(self._given)])
        elif self.root is None or self.config.models or self.config.model != "seed-mlp":
            for settings in model_settings(self.config):
                await self._start_model(settings)
        if self.root is None:
            return
        for name in self._initial(model_names(self.root, self._notices)):
            with contextlib.suppress(ModelLoadError):
                await self._load(name, None)
        if self.mode == "poll":
            self._poller = asyncio.ensure_future(self._poll())

    async def _start_model(self, settings: dict[str, Any]) -> None:
        handle = await self._build(settings, source="command line")
        if handle.name in self._recipes:
            await handle.retire(0.0)
            raise ConfigError(f"two --model are served as {handle.name!r}; names must differ")
        self._recipes[handle.name] = [settings]
        self.registry.publish(handle.name, [handle])

    def _share_loop(self) -> None:
        """Tell every served version whether others share its event loop."""
        handles = self.registry.handles()
        for handle in handles:
            handle.engine.share_loop(len(handles) > 1)

    def repository_models(self) -> list[str]:
        """The model directories of the repository, as its index lists them (none when there
        is no repository, or it cannot be read now)."""
        if self.root is None:
            return []
        try:
            return model_names(self.root, self._notices)
        except ConfigError:  # gone or unreadable: the index lists what was loaded
            return []

    def _initial(self, names: list[str]) -> list[str]:
        if self.mode != "explicit":
            return names
        if "*" in self.config.load_models:
            return names
        return [n for n in names if n in self.config.load_models]

    async def stop(self, timeout: float) -> None:
        """Stop polling; let the loads and unloads under way finish (within ``timeout``), then
        cancel those still going (a version half built, or a replaced one still waiting for
        its requests, is stopped and its memory released, not left running once the loop is
        gone); drain and stop every loaded version."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._actions:
            _, going = await asyncio.wait(set(self._actions), timeout=timeout)
            for task in going:
                task.cancel()
            if going:
                await asyncio.wait(going, timeout=self.config.drain_timeout_s)
        handles = self.registry.handles()
        await asyncio.gather(*(h.retire(timeout) for h in handles))

    # -- load and unload -------------------------------------------------------------------
    def _allowed(self, what: str) -> None:
        if self.mode != "explicit":
            # Triton's words first (its clients and tests match on them; Triton says them in
            # model control mode none too), then what is true here
            raise ModelControlError(
                "explicit model load / unload is not allowed if polling is enabled: "
                f"{what} is not allowed in model control mode {self.mode!r}; start the server "
                "with --model-repository DIR --model-control-mode explicit"
            )

    async def load(self, name: str, inline: Mapping[str, Any] | None = None) -> None:
        """Load (or reload) ``name``; see the module docstring. Raises ModelLoadError.
        A caller that goes away (a cancelled call) does not stop it halfway."""
        self._allowed("loading a model")
        await self._detached(self._load(name, inline))

    async def unload(self, name: str) -> None:
        """Unpublish ``name``, then drain and release its versions (to the end, even when the
        caller goes away)."""
        self._allowed("unloading a model")
        await self._detached(self._unload(name))

    async def _unload(self, name: str) -> None:
        async with self._lock(name):
            if self.registry.versions(name):  # not loaded: nothing to do, as in Triton
                await self._retire(self.registry.publish(name, []))

    async def _detached(self, action: Awaitable[_T]) -> _T:
        """Run ``action`` to its end in a task of its own: cancelling the caller (a client
        that disconnects, a deadline) must not stop a load or unload halfway, between the
        switch and the release of the replaced versions, which would never stop then."""
        task = asyncio.ensure_future(action)
        self._actions.add(task)
        task.add_done_callback(_finished)
        task.add_done_callback(self._actions.discard)
        return await asyncio.shield(task)

    @contextlib.asynccontextmanager
    async def _lock(self, name: str) -> AsyncIterator[None]:
        """Hold the lock of ``name`` (loads and unloads of one model go one at a time)."""
        lock, users = self._locks.setdefault(name, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[name]

    async def _load(self, name: str, inline: Mapping[str, Any] | None) -> None:
        async with self._lock(name):
            try:
                recipes, policy = self._versions(name, inline)
            except ConfigError as exc:
                if name in self.repository_models():
                    self.registry.mark(name, "", "UNAVAILABLE", str(exc))
                logger.error(
                    "model %r: %s", name, exc
                )  # %r: a name that failed its checks, escaped
                raise ModelLoadError(load_failed(name, exc)) from None
            fresh: list[ModelHandle] = []
            try:
                for settings, where in recipes:
                    self.registry.mark(name, settings.get("model_version", ""), "LOADING")
                    fresh.append(await self._build(settings, source=where, inline=inline))
                for handle in fresh:
                    if policy is not None:
                        handle.set_policy(policy)
            except BaseException as exc:  # whatever failed, the versions built are released
                await self._failed(name, settings, fresh, exc)
                raise self._load_error(exc, name, settings.get("model_version", "")) from None
            await self._retire(self.registry.publish(name, fresh))
            logger.info("model %s: serving versions %s", name, [h.version for h in fresh])

    def _versions(
        self, name: str, inline: Mapping[str, Any] | None
    ) -> tuple[list[tuple[dict[str, Any], str]], dict[str, Any] | None]:
        """The settings of each version to load (and where they come from), and the model's
        version policy as Triton writes it (None for a model named on the command line)."""
        if self.root is not None and name not in self._recipes:
            check_model_name(name)  # before the name becomes a path
        if self.root is not None and ((self.root / name).is_dir() or name not in self._recipes):
            model: ModelDir = read_model(self.root, name, inline, notices=self._notices)
            self._stamps[name] = model.fingerprint()
            recipes = [(model.version_settings(v), model.source) for v in model.versions]
            return recipes, model.policy.triton()
        if name in self._recipes:
            return [(s, "command line") for s in self._recipes[name]], None
        raise ModelNotFoundError(
            f"failed to load {name!r}, {POLL_FAILED}: no model of that name; the repository "
            "holds " + (", ".join(repr(n) for n in self.repository_models()) or "nothing")
        )

    async def _failed(
        self, name: str, settings: Mapping[str, Any], fresh: list[ModelHandle], exc: BaseException
    ) -> None:
        version = str(settings.get("model_version", ""))
        self.registry.mark(name, version, "UNAVAILABLE", str(self._load_error(exc, name, version)))
        logger.error("model %s version %s did not load: %s", name, version, exc)
        await self._retire(fresh)
        for handle in self.registry.versions(name):  # what served before still does
            self.registry.mark(name, handle.version, "READY")

    @staticmethod
    def _load_error(exc: BaseException, name: str, version: object) -> ModelLoadError:
        """The error a load answers when a version fails to build, in Triton's words: ``load
        failed for model 'name': version V is at UNAVAILABLE state: why`` (a setting that does
        not hold: ``failed to load 'name': why``, as for the configuration's other errors)."""
        why = str(exc) if isinstance(exc, TorchplaceError) else f"{type(exc).__name__}: {exc}"
        kind = type(exc) if isinstance(exc, ModelLoadError) else ModelLoadError
        if isinstance(exc, ConfigError):
            return kind(load_failed(name, why))
        return kind(
            f"load failed for model {name!r}: version {version} is at UNAVAILABLE state: {why}"
        )

    async def _retire(self, handles: list[ModelHandle]) -> None:
        """Wait for the requests routed to ``handles`` (up to ``--drain-timeout``), stop their
        engines, release their memory. Cancelled (:meth:`stop` cuts the wait short), they
        are stopped at once all the same: else their engines would run on, unreachable.
        Requests still queued past the timeout are told that their version went (503), not
        that the server is shutting down: it is not, and they can be sent again."""
        timeout = self.config.drain_timeout_s

        def reason(h: ModelHandle) -> str:
            return (
                f"version {h.version!r} of model {h.name!r} was unloaded or replaced before "
                f"this request ran (it waited past --drain-timeout {timeout:g} s); send it "
                "again: the version loaded now, if any, takes it"
            )

        try:
            await asyncio.gather(*(h.retire(timeout, reason(h)) for h in handles))
        except asyncio.CancelledError:
            await asyncio.gather(*(h.retire(0.0, reason(h)) for h in handles))
            raise
        finally:
            for handle in handles:
                self.memory.release(handle.views.get("memory", ""))
        # what their replicas freed goes back to the system, not only to the C heap
        await asyncio.get_running_loop().run_in_executor(None, trim_host_heap)

    # -- building one version --------------------------------------------------------------
    async def _build(
        self,
        settings: Mapping[str, Any],
        *,
        source: str,
        inline: Mapping[str, Any] | None = None,
    ) -> ModelHandle:
        """One version: host model, memory check, engine placed and warmed (dry run). With a
        load's ``inline`` config, its batch is checked first (nothing allocated yet)."""
        from torchplace.serve.loader import load_configured
        from torchplace.serve.startup import full_device, resolve_devices

        config = self._configured(settings, source)
        if inline is not None:
            check_inline_batch(inline, config)
        loop = asyncio.get_running_loop()
        loaded: LoadedModel = await loop.run_in_executor(
            None,
            functools.partial(load_configured, config),
        )
        one = await loop.run_in_executor(
            None, estimate, loaded, config.max_batch_size, config.dtype
        )
        devices = [str(full_device(d)) for d in resolve_devices(config.device, config.devices)]
        needs = {d: one * config.replicas_per_device * devices.count(d) for d in devices}
        owner = f"{loaded.name}/{loaded.version}#{next(self._owners)}"
        self.memory.check(loaded.name, needs, owner="")
        # reserved now, in the same step as the check: loads that start meanwhile count it
        self.memory.reserve(owner, needs, placing=True)
        try:
            handle = await self._started(config, loaded)
        except BaseException:
            self.memory.release(owner)
            raise
        self.memory.placed(owner)
        handle.views["memory"] = owner
        return handle

    async def _started(self, config: ServeConfig, loaded: LoadedModel) -> ModelHandle:
        """The version's engine, started (its replicas placed and warmed), and its handle."""
        from torchplace.serve.engine import Engine

        engine = Engine.from_config(self._traced(config, loaded), loaded=loaded)
        try:
            await engine.start()
            return ModelHandle(engine)  # its documents: a setting may not fit them
        except BaseException:
            await engine.stop()  # else its replicas' threads and memory stay, unused
            raise

    def _configured(self, settings: Mapping[str, Any], source: str) -> ServeConfig:
        """The server's config with a version's settings; an invalid value names its file."""
        try:
            return self.config.with_overrides(settings, source=source)
        except ConfigError as exc:
            message = str(exc).removeprefix("serve config: ")
            for ours, theirs in _SETTING_NAMES.items():
                message = message.replace(f"{ours}=", f"{theirs} = ")
            named = message if message.startswith(source) else f"{source}: {message}"
            raise ConfigError(named) from None

    def _traced(self, config: ServeConfig, loaded: LoadedModel) -> ServeConfig:
        """With several models, each version writes its own Chrome trace file (the served NAME
        and VERSION added, as the loader named them)."""
        path = config.trace_file
        if path is None or (self.root is None and not config.models and not self.config.models):
            return config
        if config.trace_format == "triton":
            return config  # Triton's trace file is the server's: every model writes to it
        stem = f"{path.stem}.{loaded.name}.{loaded.version}"
        return config.with_overrides({"trace_file": path.with_name(stem + path.suffix)})

    # -- poll ------------------------------------------------------------------------------
    async def _poll(self) -> None:
        assert self.root is not None
        while True:
            await asyncio.sleep(self.config.repository_poll_secs)
            try:
                await self.poll_once()
            except TorchplaceError as exc:
                logger.error("polling the model repository: %s", exc)
            except Exception:  # logged, and the next scan runs: else polling stopped unseen
                logger.exception("polling the model repository failed; polling on")

    async def poll_once(self) -> None:
        """One scan: load new or changed models, unload removed ones."""
        assert self.root is not None
        names = model_names(self.root, self._notices)
        for name in [n for n in self._stamps if n not in names]:
            # gone from the repository: back, even unchanged (``mv`` keeps mtimes), it is new
            del self._stamps[name]
        for name in names:
            stamp: Any
            try:
                stamp = read_model(self.root, name, notices=self._notices).fingerprint()
            except ConfigError as exc:
                stamp = str(exc)
            if self._stamps.get(name) != stamp:
                self._stamps[name] = stamp  # a broken model is reported once per change
                with contextlib.suppress(ModelLoadError):
                    await self._load(name, None)
        for name in self.registry.names():
            if name not in names and name not in self._recipes:
                async with self._lock(name):
                    await self._retire(self.registry.publish(name, []))


def _finished(task: asyncio.Task[Any]) -> None:
    """Retrieve a detached action's error (its caller, if still there, has it too)."""
    if not task.cancelled():
        task.exception()
