"""The article's ``Predictor`` (model placed once, one forward per request under
``inference_mode``) behind FastAPI on uvicorn (uvloop + httptools), one worker, no batching.
"""

from __future__ import annotations

from typing import Any

import torch
import uvicorn
from _common import HOST, build, oip_response, parse_args
from fastapi import FastAPI

CONFIG = {"batching": "none", "workers": 1}
ARGS = parse_args()


class Predictor:  # the article's section 5.3, with the device injected
    def __init__(self, model: torch.nn.Module, device: str) -> None:
        self.device = torch.device(device)
        self.model = model.eval().to(self.device)

    def predict(self, features: list[float]) -> Any:
        x = torch.as_tensor(features, dtype=torch.float32)
        x = x.to(self.device)
        with torch.inference_mode():
            y = self.model(x)
        return y.cpu().numpy()


predictor = Predictor(build(ARGS), ARGS.device)
app = FastAPI()


@app.post(f"/v2/models/{ARGS.model}/infer")
async def infer(body: dict[str, Any]) -> dict[str, Any]:
    tensor = body["inputs"][0]
    y = predictor.predict(tensor["data"]).reshape(tensor["shape"][0], -1)
    return oip_response(ARGS.model, y.tolist())


if __name__ == "__main__":
    uvicorn.run(app, host=HOST, port=ARGS.port, log_level="warning", access_log=False)
