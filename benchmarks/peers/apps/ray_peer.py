"""The model on Ray Serve: one deployment behind Serve's HTTP proxy, on a one-node local Ray.

Batching as Ray Serve documents it: ``@serve.batch(max_batch_size=32,
batch_wait_timeout_s=0.002)``, with ``max_ongoing_requests`` 64 so that a replica can hold more
than one batch of requests (its default, 5, keeps batches from ever filling). One replica.

Ray stays on loopback: the node's IP address is given as 127.0.0.1, the proxy binds
127.0.0.1, the dashboard is off, usage reporting is off, each replica's gRPC server is moved
to 127.0.0.1, and Ray's temporary folder (sockets, logs, session files) is a fresh one, removed
at the end. Ray's token auth (on by default for a new local cluster in Ray 2.60) stays on, with
``RAY_AUTH_MODE=token`` given explicitly and the token in that folder, not in ``~/.ray``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from _common import HOST, Args, build, exit_on_sigterm, parse_args

CONFIG = {
    "max_batch_size": 32,
    "batch_wait_timeout_s": 0.002,
    "max_ongoing_requests": 64,
    "num_replicas": 1,
}


def replica_grpc_on_loopback() -> None:
    """Ray Serve 2.60 binds each replica's inter-deployment gRPC server to ``[::]:0`` (every
    interface) after the user's constructor ran; run in that constructor, this makes it bind
    127.0.0.1 instead."""
    from ray.serve._private import replica

    original = replica.add_port_to_grpc_server

    def on_loopback(server: object, address: str) -> object:
        return original(server, address.replace("[::]", HOST))

    replica.add_port_to_grpc_server = on_loopback


def deployment(args: Args) -> object:
    import torch
    from ray import serve
    from starlette.requests import Request

    @serve.deployment(
        num_replicas=CONFIG["num_replicas"],
        max_ongoing_requests=CONFIG["max_ongoing_requests"],
        ray_actor_options={"num_cpus": 0},
    )
    class TorchMLP:
        def __init__(self) -> None:
            replica_grpc_on_loopback()
            self.net = build(args)

        @serve.batch(
            max_batch_size=CONFIG["max_batch_size"],
            batch_wait_timeout_s=CONFIG["batch_wait_timeout_s"],
        )
        async def infer(self, xs: list[torch.Tensor]) -> list[list[list[float]]]:
            with torch.inference_mode():
                y = self.net(torch.cat(xs).to(args.device)).cpu()
            return [part.tolist() for part in y.split([len(x) for x in xs])]

        async def __call__(self, request: Request) -> dict[str, object]:
            tensor = (await request.json())["inputs"][0]
            x = torch.tensor(tensor["data"], dtype=torch.float32).reshape(tensor["shape"])
            rows = await self.infer(x)
            return {
                "model_name": args.model,
                "outputs": [
                    {
                        "name": "output",
                        "datatype": "FP32",
                        "shape": [len(rows), len(rows[0])],
                        "data": [v for row in rows for v in row],
                    }
                ],
            }

    return TorchMLP.bind()


def main() -> None:
    args = parse_args()
    # short: Ray's unix socket paths live under it and must stay under ~107 characters
    temp = tempfile.mkdtemp(prefix="r", dir=args.workdir.parent)
    # Ray 2.60 turns token auth on for a new local cluster and writes the token under ~/.ray:
    # the same mode, set explicitly, with the token in the temporary folder instead
    token = Path(temp) / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    os.environ.update(
        RAY_USAGE_STATS_ENABLED="0",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(token),
    )
    import ray
    from ray import serve

    exit_on_sigterm()
    ray.init(
        _node_ip_address=HOST,
        include_dashboard=False,
        _temp_dir=temp,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        serve.start(http_options={"host": HOST, "port": args.port})
        serve.run(
            deployment(args),
            name=args.model,
            route_prefix=f"/v2/models/{args.model}/infer",
        )
        while True:
            time.sleep(3600)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
