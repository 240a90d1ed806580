"""What every peer script shares; runs inside the peer's venv, next to the script.

Every script is called as ``SCRIPT MODEL PORT DEVICE THREADS WORKDIR``: the embedded model's
name, the HTTP port on 127.0.0.1, the torch device, the torch intra-op thread count (0: torch's
own default, what the peer's users get) and a private scratch folder for the peer's files.
"""

from __future__ import annotations

import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Args:
    model: str
    port: int
    device: str
    threads: int
    workdir: Path


def parse_args() -> Args:
    name, port, device, threads, workdir = sys.argv[1:6]
    Path(workdir).mkdir(parents=True, exist_ok=True)
    return Args(name, int(port), device, int(threads), Path(workdir))


def build(args: Args) -> Any:
    """The embedded model on ``args.device``, in eval mode, with the thread count applied."""
    import torch

    from torchplace.models import build_model

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    return build_model(args.model).eval().to(args.device)


def widths(model: str) -> tuple[int, int]:
    """(input features, output features) of an embedded model."""
    from torchplace.models import embedded_model

    spec = embedded_model(model)
    return spec.inputs[0].shape[1], spec.outputs[0].shape[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def oip_response(model: str, rows: list[list[float]]) -> dict[str, Any]:
    """An Open Inference Protocol v2 response with one FP32 output."""
    return {
        "model_name": model,
        "outputs": [
            {
                "name": "output",
                "datatype": "FP32",
                "shape": [len(rows), len(rows[0]) if rows else 0],
                "data": [v for row in rows for v in row],
            }
        ],
    }


def exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so ``finally`` blocks and context managers run."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
