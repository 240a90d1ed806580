"""The model on LitServe, with its dynamic batching: ``max_batch_size`` 32 and a 2 ms
``batch_timeout``, one worker on the device, OIP v2 JSON in and out (decoded by our ``LitAPI``).
"""

# No ``from __future__ import annotations``: LitServe builds its FastAPI route from
# decode_request's annotation, and a string annotation makes the body a query parameter (422).
from typing import Any

import litserve as ls
import torch
from _common import HOST, build, oip_response, parse_args

CONFIG = {"max_batch_size": 32, "batch_timeout": 0.002, "workers_per_device": 1}
ARGS = parse_args()


class TorchMLP(ls.LitAPI):
    def setup(self, device: str) -> None:
        self.device = device
        self.net = build(ARGS).to(device)

    def decode_request(self, request: dict[str, Any]) -> torch.Tensor:
        tensor = request["inputs"][0]
        return torch.tensor(tensor["data"], dtype=torch.float32).reshape(tensor["shape"])

    def batch(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(inputs)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.net(x.to(self.device)).cpu()

    def unbatch(self, output: torch.Tensor) -> list[torch.Tensor]:
        return list(output.split(1))

    def encode_response(self, output: torch.Tensor) -> dict[str, Any]:
        return oip_response(ARGS.model, output.tolist())


if __name__ == "__main__":
    api = TorchMLP(
        max_batch_size=CONFIG["max_batch_size"],
        batch_timeout=CONFIG["batch_timeout"],
        api_path=f"/v2/models/{ARGS.model}/infer",
    )
    accelerator = "cuda" if ARGS.device.startswith("cuda") else "cpu"
    server = ls.LitServer(
        api,
        accelerator=accelerator,
        devices=1,
        workers_per_device=CONFIG["workers_per_device"],
    )
    server.run(host=HOST, port=ARGS.port, generate_client_file=False, log_level="warning")
