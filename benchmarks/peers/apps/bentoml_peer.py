"""The model as a BentoML service, started by ``bentoml serve``.

Adaptive batching as BentoML documents it: ``@bentoml.api(batchable=True, max_batch_size=32,
max_latency_ms=...)``. BentoML has no batching-delay setting: its dispatcher decides how long to
wait from the latencies it observes, and ``max_latency_ms`` is a deadline after which a queued
request is rejected with 503 (at 5 ms nearly every request is), so it is set far above any
answer's time. One worker. BentoML's own JSON: ``{"x": [[...]]}`` in, a nested list out.
This script writes the service module into the scratch folder, then runs BentoML's own CLI.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from _common import HOST, parse_args

CONFIG = {"max_batch_size": 32, "max_latency_ms": 60_000, "workers": 1}

SERVICE = f"""
import os

import bentoml
import numpy as np
import torch

from torchplace.models import build_model


@bentoml.service(workers={CONFIG["workers"]}, traffic={{"timeout": 60}})
class TorchMLP:
    def __init__(self) -> None:
        threads = int(os.environ["TPB_THREADS"])
        if threads > 0:
            torch.set_num_threads(threads)
        self.device = torch.device(os.environ["TPB_DEVICE"])
        self.net = build_model(os.environ["TPB_MODEL"]).eval().to(self.device)

    @bentoml.api(
        batchable=True,
        max_batch_size={CONFIG["max_batch_size"]},
        max_latency_ms={CONFIG["max_latency_ms"]},
    )
    def predict(self, x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            xt = torch.from_numpy(x.astype(np.float32, copy=False)).to(self.device)
            return self.net(xt).cpu().numpy()
"""


def main() -> None:
    args = parse_args()
    (args.workdir / "torch_service.py").write_text(SERVICE)
    os.environ.update(
        TPB_MODEL=args.model,
        TPB_DEVICE=args.device,
        TPB_THREADS=str(args.threads),
        BENTOML_HOME=str(args.workdir / "home"),
        BENTOML_DO_NOT_TRACK="True",
    )
    bentoml = Path(sys.executable).with_name("bentoml")
    argv = [str(bentoml), "serve", "torch_service:TorchMLP", "--host", HOST]
    argv += ["--port", str(args.port), "--working-dir", str(args.workdir)]
    os.execv(str(bentoml), argv)


if __name__ == "__main__":
    main()
