"""The model on MLServer, as a custom runtime (``MLModel``) started by ``mlserver start``.

Adaptive batching as MLServer documents it, in ``model-settings.json``: ``max_batch_size`` 32
and ``max_batch_time`` 0.002 s. One inference worker process (``parallel_workers`` 1, the
default). HTTP (OIP v2 JSON), gRPC and metrics all on 127.0.0.1. This script writes the
settings into the scratch folder, then runs MLServer's own CLI on it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from _common import HOST, free_port, parse_args

CONFIG = {"max_batch_size": 32, "max_batch_time": 0.002, "parallel_workers": 1}

RUNTIME = """
import numpy as np
import torch
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

from torchplace.models import build_model


class TorchMLP(MLModel):
    async def load(self) -> bool:
        extra = self.settings.parameters.extra
        if extra["threads"] > 0:
            torch.set_num_threads(extra["threads"])
        self.device = torch.device(extra["device"])
        self.net = build_model(extra["model"]).eval().to(self.device)
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        with torch.inference_mode():
            y = self.net(torch.from_numpy(x).to(self.device)).cpu().numpy()
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[NumpyCodec.encode_output(name="output", payload=y)],
        )
"""


def main() -> None:
    args = parse_args()
    folder = args.workdir / "models"
    if folder.exists():
        shutil.rmtree(folder)
    model_dir = folder / args.model
    model_dir.mkdir(parents=True)
    (model_dir / "torch_runtime.py").write_text(RUNTIME)
    settings = {
        "host": HOST,
        "http_port": args.port,
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "parallel_workers": CONFIG["parallel_workers"],
        "debug": False,
    }
    model_settings = {
        "name": args.model,
        "implementation": "torch_runtime.TorchMLP",
        "max_batch_size": CONFIG["max_batch_size"],
        "max_batch_time": CONFIG["max_batch_time"],
        "parameters": {
            "extra": {"model": args.model, "device": args.device, "threads": args.threads}
        },
    }
    (folder / "settings.json").write_text(json.dumps(settings))
    (model_dir / "model-settings.json").write_text(json.dumps(model_settings))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(model_dir), os.environ.get("PYTHONPATH", "")) if p
    )
    mlserver = Path(sys.executable).with_name("mlserver")
    os.execv(str(mlserver), [str(mlserver), "start", str(folder)])


if __name__ == "__main__":
    main()
