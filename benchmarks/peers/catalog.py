"""The peers: what each installs, which script serves the model, how it batches, what it is sent.

Every peer runs in its own venv (:mod:`peers.venvs`) with the repository's torch pin; its server
script in ``apps/`` is written against the peer's own documented API and imports the embedded
models from the repository's ``src`` (``PYTHONPATH``). ``batching`` is the configuration printed
before the run; it states what each script sets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .venvs import VenvSpec

APPS = Path(__file__).resolve().parent / "apps"


@dataclass(frozen=True)
class Peer:
    """One peer server.

    ``body`` is the request format: ``"oip"`` (Open Inference Protocol v2 JSON, the same body
    torchplace gets) or ``"bentoml"`` (BentoML's own ``{"x": [[...]]}``). ``path`` is formatted
    with the model's name. ``fallback_modules``: a peer that may also run in the benchmark's own
    interpreter when these are installed there and its venv is not built. ``perf_analyzer``: the
    peer serves Triton's model configuration extension over HTTP and gRPC, so perf_analyzer
    measures it over both (its script takes the gRPC port from ``PEER_GRPC_PORT``);
    ``grpc_skip``: why a peer that serves gRPC is not measured over it.
    """

    name: str
    venv: VenvSpec
    script: str
    batching: str
    path: str = "/v2/models/{model}/infer"
    body: str = "oip"
    fallback_modules: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    perf_analyzer: bool = False
    grpc_skip: str = ""

    @property
    def script_path(self) -> Path:
        return APPS / self.script


#: why KServe and MLServer, which serve gRPC, are not measured over it
NO_MODEL_CONFIG = (
    "it serves the Open Inference Protocol over gRPC but not Triton's model configuration "
    "extension (REST /config, gRPC ModelConfig), which perf_analyzer reads before it sends a "
    "request ('failed to get model config')"
)

PEERS: tuple[Peer, ...] = (
    Peer(
        "Triton",
        VenvSpec("triton", ("nvidia-pytriton",), ("pytriton.triton",)),
        "triton_peer.py",
        "tritonserver via nvidia-pytriton, OIP v2 JSON over HTTP; dynamic batcher "
        "max_batch_size 32, max_queue_delay_microseconds 2000; 1 model instance",
        perf_analyzer=True,
    ),
    Peer(
        "KServe",
        VenvSpec("kserve", ("kserve",), ("kserve",)),
        "kserve_peer.py",
        "kserve.ModelServer (uvicorn), OIP v2 JSON; 1 worker, no batching (KServe's batcher "
        "is a Kubernetes sidecar, not part of the model server); latency and access logs off",
        grpc_skip=NO_MODEL_CONFIG,
    ),
    Peer(
        "MLServer",
        VenvSpec("mlserver", ("mlserver==1.7.1", "uvloop<0.22"), ("mlserver",)),
        "mlserver_peer.py",
        "mlserver start, custom MLModel runtime, OIP v2 JSON; adaptive batching "
        "max_batch_size 32, max_batch_time 0.002 s; parallel_workers 1 (default)",
        grpc_skip=NO_MODEL_CONFIG,
    ),
    Peer(
        "Ray Serve",
        VenvSpec("ray", ("ray[serve]",), ("ray.serve",)),
        "ray_peer.py",
        "one-node local Ray on 127.0.0.1, Serve HTTP proxy; @serve.batch max_batch_size 32, "
        "batch_wait_timeout_s 0.002; max_ongoing_requests 64; 1 replica",
    ),
    Peer(
        "BentoML",
        VenvSpec("bentoml", ("bentoml",), ("bentoml",)),
        "bentoml_peer.py",
        "bentoml serve, @bentoml.api(batchable=True) adaptive batching max_batch_size 32 "
        "(no delay setting; max_latency_ms 60000 is a deadline, not a delay); 1 worker; "
        "BentoML's own JSON {'x': [[...]]}",
        path="/predict",
        body="bentoml",
    ),
    Peer(
        "LitServe",
        VenvSpec("litserve", ("litserve",), ("litserve",)),
        "litserve_peer.py",
        "LitServer, OIP v2 JSON decoded by our LitAPI; max_batch_size 32, batch_timeout "
        "0.002 s; 1 worker",
        fallback_modules=("litserve",),
    ),
    Peer(
        "FastAPI+uvicorn",
        VenvSpec(
            "fastapi", ("fastapi", "uvicorn[standard]", "numpy"), ("fastapi", "uvicorn", "numpy")
        ),
        "fastapi_peer.py",
        "the article's Predictor behind FastAPI on uvicorn (uvloop, httptools), OIP v2 JSON; "
        "1 worker, no batching",
        fallback_modules=("fastapi", "uvicorn"),
    ),
)


def request_body(kind: str, row: list[float]) -> bytes:
    """One row as a request body of format ``kind`` (see :class:`Peer`)."""
    if kind == "oip":
        doc: object = {
            "id": "1",  # KServe answers a v2 request without an id with a 500
            "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, len(row)], "data": row}],
        }
    elif kind == "bentoml":
        doc = {"x": [row]}
    else:
        raise ValueError(f"unknown body format {kind!r}: give 'oip' or 'bentoml'")
    return json.dumps(doc, separators=(",", ":")).encode()
