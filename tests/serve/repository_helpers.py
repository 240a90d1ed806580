"""Model repositories built on disk for the tests: seed-mlp versions with scaled weights, and
Triton model directories (a config.pbtxt and a TorchScript ``1/model.pt``)."""

from __future__ import annotations

import http.client
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch
from safetensors.torch import save_file
from torch import nn

from torchplace.models import build_model
from torchplace.serve.config import ServeConfig

from .conftest import test_config

X = np.linspace(-1.0, 1.0, 8, dtype=np.float32).reshape(1, 8)
CONFIG = 'source = "seed-mlp"\n[batching]\nmax_batch_size = 8\nmax_delay_ms = 1.0\n'


def write_version(root: Path, name: str, version: int, scale: float) -> Path:
    """``root/name/version/model.safetensors``: seed-mlp's weights times ``scale``."""
    folder = root / name / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: t * scale for k, t in build_model("seed-mlp").state_dict().items()}
    save_file(state, folder / "model.safetensors")
    return folder


def write_model(
    root: Path, name: str, scale: float = 1.0, config: str = CONFIG, weights: bool = True
) -> Path:
    """A model directory with its config and version 1 (without weights: the source's own)."""
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    (root / name / "config.toml").write_text(config)
    if weights:
        write_version(root, name, 1, scale)
    return root / name


def explicit_repository(root: Path) -> ServeConfig:
    """Models ``a`` and ``b`` written under ``root``, served in explicit model control with
    both loaded at start (the repository API's load and unload act on them)."""
    for name in ("a", "b"):
        write_model(root, name)
    return test_config(
        device="cpu", model_repository=root, model_control_mode="explicit", load_models=("*",)
    )


def expected(scale: float, x: np.ndarray = X) -> np.ndarray:
    """What seed-mlp with weights times ``scale`` answers for ``x``."""
    model = build_model("seed-mlp")
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.mul_(scale)
        out: np.ndarray = model(torch.from_numpy(x)).numpy()
    return out


def infer_body(x: np.ndarray = X) -> dict[str, object]:
    return {
        "inputs": [
            {
                "name": "input",
                "datatype": "FP32",
                "shape": list(x.shape),
                "data": x.ravel().tolist(),
            }
        ]
    }


def call(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
    """One request to the server on ``port``: its status and JSON body (None when empty)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        return response.status, orjson.loads(raw) if raw else None
    finally:
        conn.close()


def scripted(module: nn.Module, folder: Path, filename: str = "model.pt") -> nn.Module:
    """``module`` scripted and saved as ``folder/filename`` (Triton's layout); the loaded
    archive, as the server loads it."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(module.eval()), str(folder / filename))
    loaded: nn.Module = torch.jit.load(str(folder / filename))  # type: ignore[no-untyped-call]
    return loaded


def triton_model(root: Path, name: str, pbtxt: str, module: nn.Module | None = None) -> None:
    """``root/name``: its config.pbtxt and, given a ``module``, ``1/model.pt`` scripted."""
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(pbtxt)
    if module is not None:
        scripted(module, root / name / "1")
