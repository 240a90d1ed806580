"""Running a server: :func:`serve` until SIGTERM/SIGINT, then drain; :class:`ServerThread`
runs one in a background thread (tests, notebooks, benchmarks)::

    with ServerThread(ServeConfig(port=0)) as server:
        print(server.url)
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
import logging
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from torchplace.errors import ConfigError
from torchplace.serve.app import App, EngineLike, load_token
from torchplace.serve.http import raise_fd_limit

if TYPE_CHECKING:
    from torchplace.serve.config import ServeConfig
    from torchplace.serve.grpc_server import GrpcServer
    from torchplace.serve.reload import ModelControl

__all__ = ["ServerThread", "grpc_port", "new_event_loop", "serve"]

#: Triton's gRPC port, the default of ``--grpc-port`` with the grpc extra installed
GRPC_PORT = 8001

logger = logging.getLogger("torchplace.serve")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed, else asyncio's default."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is part of the serve extra
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def grpc_port(config: ServeConfig) -> int | None:
    """The port to serve gRPC on (0: any free one), or None for no gRPC.

    ``grpc_port`` unset: 8001 with the grpc extra installed (any free port when ``port`` is
    0), else none. Set to a port without the extra: :class:`ConfigError` naming the extra.
    """
    installed = all(
        importlib.util.find_spec(m) is not None for m in ("grpc", "google.protobuf", "hpack")
    )
    if config.grpc_port == 0:
        return None
    if config.grpc_port is None:
        if not installed:
            return None
        return 0 if config.port == 0 else GRPC_PORT
    if not installed:
        raise ConfigError(
            f"--grpc-port {config.grpc_port} needs the grpc extra (grpcio, protobuf and hpack are "
            "not all installed); run: pip install 'torchplace[grpc]', or give --grpc-port 0"
        )
    return config.grpc_port


def _grpc_server(app: App, config: ServeConfig) -> GrpcServer:
    from torchplace.serve.grpc_server import GrpcServer

    token = load_token(config.auth_token_file) if config.auth_token_file else None
    return GrpcServer(
        app.control,
        config,
        token=token,
        regions=app.regions,
        log_settings=app.log_settings,
        trace_settings=app.trace_settings,
    )


def _control(config: ServeConfig, engine: EngineLike | None) -> ModelControl:
    """The models to serve: ``engine`` as given, else every --model and the repository's."""
    from torchplace.serve.registry import Registry
    from torchplace.serve.reload import ModelControl

    return ModelControl(Registry(), config, engine=engine)


def _described(engine: EngineLike) -> str:
    dtype = f" ({engine.dtype})" if engine.dtype is not None else ""
    return f"{engine.name} version {engine.version}{dtype}"


async def serve(
    config: ServeConfig,
    *,
    engine: EngineLike | None = None,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[App], None] | None = None,
    handle_signals: bool = True,
    freeze_gc: bool = False,
) -> int:
    """Serve until ``stop`` is set or SIGTERM/SIGINT arrives, then drain; returns 0.

    ``freeze_gc`` (what ``torchplace serve`` does) moves everything alive after start-up (torch
    and the model: hundreds of thousands of objects) out of the cyclic garbage collector's
    reach with :func:`gc.freeze`, so full collections stay short and do not show up as p99
    latency spikes.
    """
    grpc_at = grpc_port(config)  # a missing extra is refused before the model loads
    raise_fd_limit()  # connections, not the soft limit's 1,024 open files, bound what is served
    app = App(_control(config, engine), config)
    grpc = _grpc_server(app, config) if grpc_at is not None else None
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    if handle_signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
                installed.append(sig)
    try:
        try:
            await app.start()
        except BaseException:
            await app.server.close()
            await app.control.stop(0.0)
            raise
        if grpc is not None:
            assert grpc_at is not None
            try:
                await grpc.start(config.host, grpc_at)
            except BaseException:
                await app.server.close()
                await app.control.stop(0.0)
                raise
            app.grpc_port = grpc.port
        logger.info(
            "serving %s on http://%s:%d%s",
            ", ".join(_described(h.engine) for h in app.registry.handles()) or "no model yet",
            config.host,
            app.port,
            f" and grpc://{config.host}:{grpc.port}" if grpc is not None else "",
        )
        if freeze_gc:
            gc.collect()
            gc.freeze()
        if on_ready is not None:
            on_ready(app)
        await stop.wait()
        logger.info(
            "draining: %.1f s of grace, then up to %.1f s in all",
            config.drain_grace_s,
            config.drain_timeout_s,
        )
        drains = [app.shutdown(config.drain_timeout_s, config.drain_grace_s)]
        if grpc is not None:
            drains.append(grpc.shutdown(config.drain_timeout_s, config.drain_grace_s))
        await asyncio.gather(*drains)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
    return 0


class ServerThread:
    """Run :func:`serve` in a background thread; ``with ServerThread(cfg) as s: s.url``."""

    def __init__(self, config: ServeConfig, engine: EngineLike | None = None) -> None:
        self.config = config
        self.engine = engine
        self.app: App | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        """The bound port."""
        assert self.app is not None, "start() first"
        return self.app.port

    @property
    def grpc_port(self) -> int | None:
        """The bound gRPC port (None: no gRPC)."""
        assert self.app is not None, "start() first"
        return self.app.grpc_port

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.config.host}:{self.port}"

    def start(self, timeout: float = 120.0) -> ServerThread:
        """Start and wait until the server listens and the engine has started."""
        self._thread = threading.Thread(target=self._main, name="torchplace-serve", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"server did not start within {timeout} s")
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        loop = new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()

        def ready(app: App) -> None:
            self.app = app
            self._ready.set()

        await serve(
            self.config, engine=self.engine, stop=self._stop, on_ready=ready, handle_signals=False
        )

    def stop(self, timeout: float = 30.0) -> None:
        """Drain and stop; waits for the thread."""
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
