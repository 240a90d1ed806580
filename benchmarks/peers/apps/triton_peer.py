"""The model on Triton Inference Server through PyTriton (which bundles tritonserver).

Dynamic batching as Triton documents it: ``max_batch_size`` 32 and a 2 ms
``max_queue_delay_microseconds``; one model instance; HTTP (JSON OIP v2), gRPC and metrics all
on 127.0.0.1 (gRPC on ``$PEER_GRPC_PORT`` when set). The inference function gets whole
batches as numpy arrays (``@batch``). PyTriton restricts some endpoints to a generated token;
the statistics extension is left open, since perf_analyzer reads it (read-only counts).
"""

from __future__ import annotations

import os
import sysconfig

import numpy as np
from _common import HOST, build, exit_on_sigterm, free_port, parse_args, widths

CONFIG = {"max_batch_size": 32, "max_queue_delay_microseconds": 2000, "instances": 1}


def main() -> None:
    args = parse_args()
    # Triton's Python stub must load this interpreter's libpython, not the system's.
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    os.environ["LD_LIBRARY_PATH"] = ":".join(
        p for p in (libdir, os.environ.get("LD_LIBRARY_PATH", "")) if p
    )
    os.environ["PYTRITON_HOME"] = str(args.workdir / "home")
    import torch
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    model = build(args)
    width_in, width_out = widths(args.model)

    @batch
    def infer(input: np.ndarray) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            x = torch.from_numpy(input).to(args.device)
            return {"output": model(x).cpu().numpy()}

    config = TritonConfig(
        http_address=HOST,
        http_port=args.port,
        grpc_address=HOST,
        grpc_port=int(os.environ.get("PEER_GRPC_PORT") or 0) or free_port(),
        metrics_address=HOST,
        metrics_port=free_port(),
        log_verbose=0,
    )
    exit_on_sigterm()
    with Triton(
        config=config, workspace=str(args.workdir / "workspace"), **_statistics_open()
    ) as triton:
        triton.bind(
            model_name=args.model,
            infer_func=infer,
            inputs=[Tensor(name="input", dtype=np.float32, shape=(width_in,))],
            outputs=[Tensor(name="output", dtype=np.float32, shape=(width_out,))],
            config=ModelConfig(
                max_batch_size=CONFIG["max_batch_size"],
                batcher=DynamicBatcher(
                    max_queue_delay_microseconds=CONFIG["max_queue_delay_microseconds"]
                ),
            ),
            strict=False,
        )
        triton.serve()


def _statistics_open() -> dict[str, object]:
    """PyTriton's default restricted endpoints less ``statistics`` (none before PyTriton
    restricted any)."""
    try:
        from pytriton.triton import DEFAULT_PROTECTED_ENDPOINTS, TritonSecurityConfig
    except ImportError:
        return {}
    kept = [e for e in DEFAULT_PROTECTED_ENDPOINTS if e != "statistics"]
    return {"security_config": TritonSecurityConfig(restricted_endpoints=kept)}


if __name__ == "__main__":
    main()
