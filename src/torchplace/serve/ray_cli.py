"""``torchplace serve --engine ray``: the same server, deployed on a Ray cluster.

:func:`add_ray_flags` declares the flags; :func:`run_on_ray` connects to the cluster
(``--address auto`` or ``HOST:PORT``), starts Ray Serve's proxy on ``--host``/``--port``,
deploys :mod:`torchplace.serve.onray`'s replicas, prints each replica's node, devices and
direct address, and on SIGTERM/SIGINT deletes the application and exits 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from typing import Any

from torchplace.errors import ConfigError
from torchplace.serve.config import ServeConfig

__all__ = ["add_ray_flags", "check_ray_flags", "ray_options", "run_on_ray"]

_PROXY_LOCATIONS = ("EveryNode", "HeadOnly")
_DESCRIBE_TRIES = 200  # handle calls made to meet every replica once (bounded)


def add_ray_flags(ray: argparse._ArgumentGroup) -> None:
    """``--engine`` and the Ray placement flags."""
    ray.add_argument(
        "--engine",
        choices=["local", "ray"],
        help="local: this process serves (default); ray: deploy on a Ray cluster with Ray Serve "
        "(needs torchplace[ray])",
    )
    ray.add_argument(
        "--address",
        metavar="auto|HOST:PORT",
        help="the Ray cluster to join (--engine ray; default auto: the cluster this machine "
        "runs or RAY_ADDRESS)",
    )
    ray.add_argument(
        "--replicas",
        metavar="N|auto",
        help="Ray replicas (--engine ray; default 1; auto: autoscale from 1 to 4)",
    )
    ray.add_argument(
        "--gpus-per-replica",
        type=float,
        metavar="G",
        help="whole GPUs each replica reserves; 0 serves on the CPU even on a GPU node "
        "(--engine ray; default 0)",
    )
    ray.add_argument(
        "--max-replicas-per-node",
        type=int,
        metavar="K",
        help="at most K replicas on one node (--engine ray; default no limit)",
    )
    ray.add_argument(
        "--ray-device-override",
        choices=["cpu"],
        help="serve on the CPU whatever Ray assigned (a GPU resource that is only a label)",
    )
    ray.add_argument(
        "--ray-proxy",
        choices=_PROXY_LOCATIONS,
        help="where Ray Serve runs its HTTP proxy on --host/--port (default EveryNode)",
    )


#: the flags that only --engine ray reads, by their argparse destination
_RAY_ONLY = (
    "address",
    "replicas",
    "gpus_per_replica",
    "max_replicas_per_node",
    "ray_device_override",
    "ray_proxy",
)


def check_ray_flags(args: argparse.Namespace) -> None:
    """Refuse a Ray placement flag given without ``--engine ray``: it would be ignored, and
    ``--replicas 4`` would silently serve with one replica."""
    if getattr(args, "engine", None) == "ray":
        return
    given = [name for name in _RAY_ONLY if getattr(args, name, None) is not None]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ConfigError(
            f"{flags} only applies with --engine ray (a Ray Serve deployment); add --engine "
            "ray, or for more replicas in this process use --replicas-per-device N or "
            "--devices LIST"
        )


def ray_options(args: argparse.Namespace) -> Any:
    """The :class:`~torchplace.serve.onray.RayOptions` of the command line."""
    from torchplace.serve.onray import RayOptions

    raw = getattr(args, "replicas", "1")
    replicas: int | str = "auto" if str(raw).strip().lower() == "auto" else _int(raw, "replicas")
    return RayOptions(
        replicas=replicas,
        gpus_per_replica=getattr(args, "gpus_per_replica", 0.0),
        max_replicas_per_node=getattr(args, "max_replicas_per_node", None),
        device_override=getattr(args, "ray_device_override", None),
    )


def _int(raw: object, flag: str) -> int:
    try:
        return int(str(raw))
    except ValueError:
        raise ConfigError(f"--{flag} {raw!r} is not a number; give N >= 1 or 'auto'") from None


def run_on_ray(args: argparse.Namespace, config: ServeConfig) -> int:
    """Deploy on the cluster at ``--address`` and serve until SIGTERM/SIGINT; returns 0."""
    from torchplace.serve.onray import deployment, require_ray

    require_ray()
    options = ray_options(args)
    import ray
    from ray import serve

    address = getattr(args, "address", "auto")
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"cannot join the Ray cluster at --address {address!r}: {exc}; start one with "
            "'ray start --head' or give its HOST:PORT"
        ) from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(
            http_options={
                "host": config.host,
                "port": config.port,
                "location": getattr(args, "ray_proxy", "EveryNode"),
            }
        )
        handle = serve.run(
            deployment(config, options), name=options.name, route_prefix="/", blocking=False
        )
        for record in _replicas(handle, options):
            print(json.dumps(record, sort_keys=True, default=str), flush=True)
        print(
            f"serving on Ray: http://{config.host}:{config.port} (proxy); ready",
            file=sys.stderr,
            flush=True,
        )
        stop.wait()
        serve.delete(options.name)
    finally:
        ray.shutdown()
    return 0


def _replicas(handle: Any, options: Any) -> list[dict[str, Any]]:
    """One record per replica met through the handle (node, devices, direct address)."""
    want = options.replicas if isinstance(options.replicas, int) else 1
    seen: dict[tuple[str, int], dict[str, Any]] = {}
    for _ in range(_DESCRIBE_TRIES):
        record = handle.describe.remote().result(timeout_s=60)
        record.pop("engine", None)
        seen[(record["node_id"], record["pid"])] = record
        if len(seen) >= want:
            break
    return list(seen.values())
