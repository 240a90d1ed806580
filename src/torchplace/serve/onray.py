"""``torchplace serve`` on Ray Serve: torchplace's engine and routes in each Ray replica.

Each replica of the deployment runs the whole standalone server of
:mod:`torchplace.serve.running` (placement, staging, the batcher with one H2D and one D2H per
batch, OOM split-and-retry, the Open Inference Protocol routes, codec and errors) on the
devices Ray assigned it, and answers two ways:

* through Ray's proxy: :meth:`TorchplaceReplica.__call__` hands the request to the same
  :class:`~torchplace.serve.app.App` the standalone server runs (no second codec);
* directly: the replica's own HTTP listener on its node's address (``direct_url`` in its
  start-up record and in :meth:`TorchplaceReplica.describe`), for clients and load balancers
  that should not pay for the proxy.

Device rules inside Ray: a replica uses exactly the GPUs of ``ray.get_gpu_ids()`` (Ray sets
``CUDA_VISIBLE_DEVICES`` before the constructor runs, so they are ``cuda:0..n-1`` in the
process); none assigned means the CPU, even on a GPU node; CUDA is not touched at import;
torchplace's own multi-device replicas are off (one engine replica per assigned device, one
copy each, no CPU fallback: Ray replaces a failing replica instead).

Nothing here imports Ray at import time; :func:`build_app` (for ``serve run``) and
:func:`deployment` do, and name the extra to install when it is missing.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchplace.errors import ConfigError
from torchplace.serve.config import ServeConfig

if TYPE_CHECKING:
    from torchplace.models import TensorSpec
    from torchplace.serve.running import ServerThread

__all__ = [
    "RAY_REQUIREMENT",
    "RayOptions",
    "TorchplaceReplica",
    "app_settings",
    "build_app",
    "deployment",
    "replica_devices",
    "require_ray",
]

#: Serve configures this logger in each replica (INFO, into the replica's log file)
logger = logging.getLogger("ray.serve")

RAY_REQUIREMENT = "ray[serve]>=2.60,<3"
#: how often a replica mirrors its engine's device-labelled series into Ray's metrics
MIRROR_INTERVAL_S = 1.0


def require_ray() -> None:
    """Raise :class:`ConfigError` naming the extra when Ray Serve is not installed."""
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
        raise ConfigError(
            "--engine ray needs Ray Serve (not installed); run: pip install 'torchplace[ray]'"
        )


def replica_devices(gpu_ids: Sequence[object], override: str | None = None) -> tuple[str, ...]:
    """The devices of a replica from what Ray assigned it.

    Ray makes the assigned GPUs the only visible ones, so ``n`` ids are ``cuda:0..n-1`` in
    the replica's process; no GPU assigned means ``cpu`` (even on a GPU node, where torch
    would otherwise see every GPU). ``override`` (``"cpu"``) serves on the CPU whatever Ray
    assigned: for clusters whose GPU resource is a label, as in tests.
    """
    if override is not None:
        if override.strip().lower() != "cpu":
            raise ConfigError(
                f"device override {override!r} is not supported; the only override is 'cpu' "
                "(otherwise each replica uses the GPUs Ray assigned it)"
            )
        return ("cpu",)
    if not gpu_ids:
        return ("cpu",)
    return tuple(f"cuda:{i}" for i in range(len(gpu_ids)))


@dataclass(frozen=True, kw_only=True)
class RayOptions:
    """How the deployment is placed on a Ray cluster; validated on construction."""

    #: fixed replica count, or ``"auto"`` (autoscaling from 1 to ``max_replicas``)
    replicas: int | str = 1
    max_replicas: int = 4
    gpus_per_replica: float = 0.0
    cpus_per_replica: float = 1.0
    #: at most this many replicas on one node (None = no limit)
    max_replicas_per_node: int | None = None
    #: None = twice the max batch size (Ray's default of 5 never lets a batch fill)
    max_ongoing_requests: int | None = None
    #: ``"cpu"``: serve on the CPU whatever Ray assigned (a labelled GPU resource, tests)
    device_override: str | None = None
    health_check_period_s: float = 10.0
    health_check_timeout_s: float = 30.0
    name: str = "torchplace"

    def __post_init__(self) -> None:
        auto = self.replicas == "auto"
        if not auto and (
            not isinstance(self.replicas, int)
            or isinstance(self.replicas, bool)
            or self.replicas < 1
        ):
            raise ConfigError(f"--replicas {self.replicas!r} is invalid; give N >= 1 or 'auto'")
        if not isinstance(self.max_replicas, int) or self.max_replicas < 1:
            raise ConfigError(f"max_replicas {self.max_replicas!r} is invalid; give N >= 1")
        for name in ("gpus_per_replica", "cpus_per_replica"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"--{name.replace('_', '-')} {value!r} is invalid; give >= 0")
        if 0 < self.gpus_per_replica < 1:
            raise ConfigError(
                f"--gpus-per-replica {self.gpus_per_replica} is a fraction: Ray only reserves it "
                "logically, so replicas sharing a GPU can run each other out of memory; give a "
                "whole number of GPUs (or 0 for the CPU)"
            )
        if self.gpus_per_replica != int(self.gpus_per_replica):
            raise ConfigError(
                f"--gpus-per-replica {self.gpus_per_replica} is invalid; give a whole number"
            )
        per_node = self.max_replicas_per_node
        if per_node is not None and (not isinstance(per_node, int) or per_node < 1):
            raise ConfigError(f"--max-replicas-per-node {per_node!r} is invalid; give N >= 1")
        for name in ("max_ongoing_requests",):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} {value!r} is invalid; give N >= 1")
        replica_devices((), self.device_override)  # validates the override

    def ongoing(self, config: ServeConfig) -> int:
        """``max_ongoing_requests``: the given one, else at least twice the max batch size."""
        if self.max_ongoing_requests is not None:
            return self.max_ongoing_requests
        return max(2 * config.max_batch_size, 8)

    def deployment_options(self, config: ServeConfig) -> dict[str, Any]:
        """The options of ``serve.deployment(...)``."""
        options: dict[str, Any] = {
            "name": self.name,
            "max_ongoing_requests": self.ongoing(config),
            "ray_actor_options": {
                "num_cpus": self.cpus_per_replica,
                "num_gpus": self.gpus_per_replica,
            },
            "health_check_period_s": self.health_check_period_s,
            "health_check_timeout_s": self.health_check_timeout_s,
            "graceful_shutdown_timeout_s": config.drain_timeout_s,
        }
        if self.replicas == "auto":
            options["autoscaling_config"] = {
                "min_replicas": 1,
                "max_replicas": self.max_replicas,
                "target_ongoing_requests": config.max_batch_size,
            }
        else:
            options["num_replicas"] = self.replicas
        if self.max_replicas_per_node is not None:
            options["max_replicas_per_node"] = self.max_replicas_per_node
        return options


class TorchplaceReplica:
    """One Ray Serve replica: the standalone server on the devices Ray assigned.

    The constructor builds the engine and runs its start-up dry run, so Serve marks the
    replica running only once it is warm. ``check_health`` fails while the engine is not
    ready or once one of its device replicas was taken out by device errors (Serve then
    replaces this replica with a fresh process).
    """

    def __init__(
        self, config: Mapping[str, Any], device_override: str | None = None, *, direct: bool = True
    ) -> None:
        import ray

        from torchplace.serve.running import ServerThread
        from torchplace.serve.tracing import exports_spans

        context = ray.get_runtime_context()
        gpu_ids = ray.get_gpu_ids()
        devices = replica_devices(gpu_ids, device_override)
        if not gpu_ids:
            # no GPU reserved: hide the node's GPUs from this process (Ray >= 2.60 leaves them
            # visible), before anything initialises CUDA
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        self.node_id = context.get_node_id()
        self.node_ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        base = ServeConfig.from_mapping(config, source="ray deployment")
        served = base.with_overrides(
            {
                "devices": list(devices),
                "replicas_per_device": 1,  # Ray makes the copies, not torchplace
                "fallback": None,
                "host": self.node_ip,
                "port": 0,
            },
            source="ray replica",
        )
        self.devices = devices
        self._device_error: str | None = None
        self._server: ServerThread = ServerThread(served).start()
        assert self._server.app is not None
        self.direct_url = f"http://{self.node_ip}:{self._server.port}"
        self.record: dict[str, Any] = {
            "event": "torchplace.serve.ray.replica",
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "pid": os.getpid(),
            "ray_gpu_ids": [str(i) for i in gpu_ids],
            "devices": list(devices),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "direct_url": self.direct_url,
            "engine": getattr(self._server.app.engine, "startup_record", {}),
        }
        logger.info("%s", json.dumps(self.record, sort_keys=True, default=str))
        #: spans are exported (Serve's tracing, or the application, set a tracer provider)
        self._traced = exports_spans()
        self._mirror = _MetricsMirror(self)
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="torchplace-ray-watch", daemon=True).start()

    # -- requests through Ray's proxy -------------------------------------------------------
    async def __call__(self, request: Any) -> Any:
        """A Starlette request from Ray's proxy, answered by the standalone routes."""
        from starlette.responses import Response as StarletteResponse

        from torchplace.serve.http import Request, Response
        from torchplace.serve.tracing import CALLER, caller_context

        body = await request.body()
        # the stage spans join Serve's request span (a client's traceparent header is read,
        # first, by the app); the context var travels with the coroutine to the server's loop
        caller = caller_context() if self._traced else None
        ours = Request(
            method=request.method.encode(),
            path=request.url.path.encode(),
            query=request.url.query.encode(),
            headers={k.lower(): v for k, v in request.headers.raw},
            body=body,
            keep_alive=True,
            received=0.0,
        )
        app = self._server.app
        loop = self._server._loop
        assert app is not None, "the replica's server has not started"
        assert loop is not None, "the replica's server has no event loop"

        async def run() -> Any:
            CALLER.set(caller)
            answer = app.handle(ours)
            return answer if isinstance(answer, Response) else await answer

        response = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), loop))
        headers = {k.decode(): v.decode() for k, v in response.headers}
        return StarletteResponse(
            response.body,
            status_code=response.status,
            headers=headers,
            media_type=response.content_type.decode(),
        )

    # -- health, description, shutdown ------------------------------------------------------
    def check_health(self) -> None:
        """Raise (Serve replaces the replica) when not ready or after a device error."""
        app = self._server.app
        if app is None or not app.ready:
            raise RuntimeError(f"torchplace engine on {list(self.devices)} is not ready")
        if self._device_error is not None:
            raise RuntimeError(self._device_error)

    def describe(self) -> dict[str, Any]:
        """Where this replica runs and what it served (batches, rows) per device."""
        return {**self.record, "served": self._mirror.served()}

    def _watch(self) -> None:
        """Notice a device replica taken out by device errors (sticky: the process may hold a
        broken device context; Serve replaces it) and mirror the metrics into Ray's."""
        ticks = 0
        while not self._stop.wait(0.05):
            app = self._server.app
            engine: Any = app.engine if app is not None else None
            for replica in getattr(engine, "replicas", ()):
                if not replica.health.healthy and self._device_error is None:
                    self._device_error = (
                        f"device replica {replica.name} hit {replica.health.consecutive} device "
                        "errors in a row; this Ray replica asks to be replaced"
                    )
            ticks += 1
            if ticks * 0.05 >= MIRROR_INTERVAL_S:
                ticks = 0
                self._mirror.push()

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
        server = getattr(self, "_server", None)
        if server is not None:
            server.stop(timeout=10.0)


class _MetricsMirror:
    """Mirrors the engine's device-labelled Prometheus series into ``ray.util.metrics`` gauges
    (tagged with the node and replica), so Ray's metrics export carries every replica's
    series rather than whichever replica a scrape through the proxy reaches."""

    _PREFIX = "torchplace_"

    def __init__(self, owner: TorchplaceReplica) -> None:
        self._owner = owner
        self._gauges: dict[str, Any] = {}
        self._replica_tag = f"{owner.node_id[:12]}-{os.getpid()}"

    def _samples(self) -> list[tuple[str, dict[str, str], float]]:
        app = self._owner._server.app
        engine: Any = app.engine if app is not None else None
        registry = getattr(getattr(engine, "metrics", None), "registry", None)
        if registry is None:
            return []
        found = []
        for family in registry.collect():
            for sample in family.samples:
                if sample.name.startswith(self._PREFIX) and "device" in sample.labels:
                    found.append((sample.name, dict(sample.labels), float(sample.value)))
        return found

    def push(self) -> None:
        """Set one gauge per sample (Ray exports them as ``ray_<name>``)."""
        from ray.util.metrics import Gauge

        for name, labels, value in self._samples():
            keys = (*sorted(labels), "node", "replica")
            key = name + "|" + ",".join(keys)
            gauge = self._gauges.get(key)
            if gauge is None:
                gauge = Gauge(name, description=f"torchplace {name}", tag_keys=keys)
                self._gauges[key] = gauge
            tags = {**labels, "node": self._owner.node_ip, "replica": self._replica_tag}
            gauge.set(value, tags=tags)

    def served(self) -> dict[str, dict[str, float]]:
        """Per device: batches and rows served (from the batch-size histogram)."""
        out: dict[str, dict[str, float]] = {}
        for name, labels, value in self._samples():
            device = labels["device"]
            if name == "torchplace_batch_size_count":
                out.setdefault(device, {})["batches"] = value
            elif name == "torchplace_batch_size_sum":
                out.setdefault(device, {})["rows"] = value
        return out


def deployment(
    config: ServeConfig | Mapping[str, Any] | None = None, options: RayOptions | None = None
) -> Any:
    """The bound Ray Serve application: ``serve.run(deployment(config, options))``."""
    require_ray()
    from ray import serve

    if config is None:
        config = ServeConfig()
    if isinstance(config, Mapping):
        config = ServeConfig.from_mapping(config, source="ray deployment")
    options = options or RayOptions()
    data = _plain(config)
    replica = serve.deployment(**options.deployment_options(config))(TorchplaceReplica)
    return replica.bind(data, options.device_override)


def _plain_spec(spec: TensorSpec) -> dict[str, Any]:
    """A declaration as the table a config file gives (its reshape and labels file kept)."""
    table: dict[str, Any] = {
        "name": spec.name,
        "datatype": spec.datatype,
        "shape": list(spec.shape),
    }
    if spec.reshape is not None:
        table["reshape"] = list(spec.reshape)
    if spec.label_filename is not None:
        table["label_filename"] = spec.label_filename
    return table


def _plain(config: ServeConfig) -> dict[str, Any]:
    """The config as plain values that travel to each replica (Ray pickles them)."""
    data: dict[str, Any] = {}
    for name in ServeConfig.field_names():
        value = getattr(config, name)
        if value is None:
            continue
        if name in ("inputs", "outputs"):
            value = [_plain_spec(s) for s in value]
        elif isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, os.PathLike):
            value = os.fspath(value)
        data[name] = value
    return data


def build_app(args: Mapping[str, Any]) -> Any:
    """The application builder of ``serve run torchplace.serve.onray:build_app key=value ...``.

    Keys are :class:`ServeConfig` settings (``model``, ``max_batch_size``, ...) and
    :class:`RayOptions` fields (``replicas``, ``gpus_per_replica``, ...); a Serve config file
    gives them under ``args:``.
    """
    return deployment(*app_settings(args))


def app_settings(args: Mapping[str, Any]) -> tuple[ServeConfig, RayOptions]:
    """The settings and placement options of :func:`build_app`'s arguments."""
    option_names = set(RayOptions.__dataclass_fields__)
    given = {str(k).replace("-", "_"): v for k, v in args.items()}
    raw_options = {k: v for k, v in given.items() if k in option_names}
    options = RayOptions(**{k: _typed(RayOptions(), k, v) for k, v in raw_options.items()})
    settings = {k: v for k, v in given.items() if k not in option_names}
    config = ServeConfig.from_mapping(
        {k: _typed(ServeConfig(), k, v) for k, v in settings.items()}, source="serve run args"
    )
    return config, options


_NUMERIC_WHEN_UNSET = frozenset(
    {"torch_threads", "default_priority", "max_replicas_per_node", "max_ongoing_requests"}
)


def _typed(defaults: object, name: str, value: Any) -> Any:
    """``serve run key=value`` gives strings: convert to the type of the setting's default."""
    if not isinstance(value, str):
        return value
    default = getattr(defaults, name, None)
    try:
        if isinstance(default, bool):
            return value.strip().lower() in ("1", "true", "yes", "on")
        if isinstance(default, int) or name in _NUMERIC_WHEN_UNSET:
            return value if value == "auto" else int(value)
        if isinstance(default, float):
            return float(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a number; give e.g. {name}=2") from None
    return value
