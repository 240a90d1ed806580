"""The model on the KServe model server (``kserve.ModelServer``), as a custom ``kserve.Model``.

The Python model server has no dynamic batching (KServe batches in a sidecar of its
Kubernetes deployment), so each request is one forward. One uvicorn worker, gRPC off, and the
per-request access and timing logs off. OIP v2 JSON: ``predict`` gets an ``InferRequest``
and answers an ``InferResponse``. KServe binds its HTTP server to 0.0.0.0 whatever it is told;
this script makes it bind 127.0.0.1 (see :func:`loopback_only`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from _common import HOST, build, parse_args

CONFIG = {"workers": 1, "enable_grpc": False, "enable_latency_logging": False}


def loopback_only() -> None:
    """KServe's REST server hands uvicorn host 0.0.0.0: make uvicorn's Config bind 127.0.0.1."""
    import uvicorn

    original = uvicorn.Config.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["host"] = HOST
        original(self, *args, **kwargs)

    uvicorn.Config.__init__ = init  # type: ignore[method-assign]


def main() -> None:
    args = parse_args()
    loopback_only()
    from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

    class TorchMLP(Model):
        def __init__(self) -> None:
            super().__init__(args.model)
            self.net = build(args)
            self.ready = True

        def predict(
            self,
            payload: InferRequest,
            headers: dict[str, str] | None = None,
            response_headers: dict[str, str] | None = None,
        ) -> InferResponse:
            x = torch.from_numpy(payload.inputs[0].as_numpy())
            with torch.inference_mode():
                y = self.net(x.to(args.device)).cpu().numpy()
            output = InferOutput(name="output", shape=list(y.shape), datatype="FP32")
            output.set_data_from_numpy(y, binary_data=False)
            return InferResponse(
                response_id=payload.id, model_name=self.name, infer_outputs=[output]
            )

    server = ModelServer(
        http_port=args.port,
        workers=CONFIG["workers"],
        enable_grpc=CONFIG["enable_grpc"],
        enable_latency_logging=CONFIG["enable_latency_logging"],
    )
    # KServe configured its loggers in the constructor: an access line and two timing lines
    # per request are on
    for name in ("uvicorn.access", "kserve.trace"):
        logging.getLogger(name).setLevel(logging.WARNING)
    server.start([TorchMLP()])


if __name__ == "__main__":
    main()
