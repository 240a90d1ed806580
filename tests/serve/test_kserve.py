"""The KServe contract: the runtime's YAML, its arguments rendered as KServe renders them, and
``torchplace serve`` started with them on a model dir filled with weights."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import save_file

from torchplace.errors import ConfigError
from torchplace.models import build_model
from torchplace.serve.config import ServeConfig
from torchplace.serve.kserve import add_kserve_flags, kserve_config, model_dir_settings

from .conftest import Client, seed_body

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "deploy" / "kserve" / "cluster-serving-runtime.yaml"
ISVC = REPO / "deploy" / "kserve" / "inference-service.yaml"
MULTI = REPO / "deploy" / "kserve" / "multi-model-serving-runtime.yaml"
TRAINED = REPO / "deploy" / "kserve" / "trained-model.yaml"
LOOPBACK = "127.0.0.1"
_JSON = {"Content-Type": "application/json"}  # as KServe's agent sends its calls


def _yaml(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def _runtime() -> dict[str, Any]:
    return _yaml(RUNTIME)


def _render(value: str, name: str, storage_uri: str) -> str:
    """KServe fills the runtime's Go templates from the InferenceService."""
    return value.replace("{{.Name}}", name).replace("{{.StorageUri}}", storage_uri)


def test_runtime_is_a_v1_and_v2_cluster_serving_runtime_with_http_probes() -> None:
    runtime = _runtime()
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    assert runtime["kind"] == "ClusterServingRuntime"
    spec = runtime["spec"]
    assert spec["protocolVersions"] == ["v1", "v2"]
    assert spec["annotations"]["prometheus.kserve.io/port"] == "8080"
    assert spec["annotations"]["prometheus.kserve.io/path"] == "/metrics"
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"
    assert container["ports"][0]["containerPort"] == 8080
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    for probe in ("livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["path"] == "/v2/health/live"
    assert "--model_name={{.Name}}" in container["args"]
    assert "--model_dir=/mnt/models" in container["args"]
    assert "--http_port=8080" in container["args"]


def test_yaml_matches_the_kserve_sdk_models() -> None:
    """Validated against the ``kserve`` SDK's models when it is installed, else against the
    CRD fields checked by hand above."""
    models = pytest.importorskip("kserve.models", reason="the kserve SDK is not installed")
    spec = _runtime()["spec"]
    runtime = models.V1alpha1ServingRuntimeSpec(**_snake(spec))
    assert runtime.protocol_versions == ["v1", "v2"]
    isvc = yaml.safe_load(ISVC.read_text())
    predictor = models.V1beta1PredictorSpec(
        model=models.V1beta1ModelSpec(**_snake(isvc["spec"]["predictor"]["model"]))
    )
    assert predictor.model.runtime == _runtime()["metadata"]["name"]


def _snake(data: dict[str, Any]) -> dict[str, Any]:
    return {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): v for k, v in data.items()}


def test_inference_service_uses_the_runtime() -> None:
    isvc = yaml.safe_load(ISVC.read_text())
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    assert isvc["kind"] == "InferenceService"
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == _runtime()["metadata"]["name"]
    assert model["protocolVersion"] == "v2"
    formats = {f["name"] for f in _runtime()["spec"]["supportedModelFormats"]}
    assert model["modelFormat"]["name"] in formats


def _model_dir(tmp_path: Path) -> Path:
    """What KServe's storage initializer leaves in /mnt/models for seed-mlp weights."""
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    module = build_model("seed-mlp")
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(2.0)  # weights that differ from the embedded ones
    save_file(
        {k: v.contiguous() for k, v in module.state_dict().items()}, model_dir / "model.safetensors"
    )
    (model_dir / "torchplace.toml").write_text('model = "seed-mlp"\nmax_batch_size = 8\n')
    return model_dir


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    parser.add_argument("--port", type=int)
    add_kserve_flags(parser.add_argument_group("kserve"))
    return parser.parse_args(argv)


def test_model_dir_settings_find_the_weights_and_config(tmp_path: Path) -> None:
    model_dir = _model_dir(tmp_path)
    settings = model_dir_settings(model_dir)
    assert settings == {
        "model": "seed-mlp",
        "max_batch_size": 8,
        "weights": str(model_dir / "model.safetensors"),
    }
    config = kserve_config(
        _parse([f"--model_dir={model_dir}"]), ServeConfig(), env={"PORT": "9123"}
    )
    assert config.weights == model_dir / "model.safetensors"
    assert config.port == 9123  # PORT from the environment without --http_port
    config = kserve_config(_parse(["--http_port=8081"]), ServeConfig(), env={"PORT": "9123"})
    assert config.port == 8081


def test_model_dir_with_no_or_several_model_files_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"exactly one model file.*found: none"):
        model_dir_settings(empty)
    (empty / "a.pt2").write_bytes(b"")
    (empty / "b.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"found: a\.pt2, b\.safetensors"):
        model_dir_settings(empty)
    with pytest.raises(ConfigError, match="does not exist"):
        model_dir_settings(tmp_path / "missing")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.slow
def test_torchplace_serve_started_as_kserve_starts_it(tmp_path: Path) -> None:
    free_port = _free_port()
    tritonhttp = pytest.importorskip("tritonclient.http")
    model_dir = _model_dir(tmp_path)
    name = "my-isvc"
    (container,) = _runtime()["spec"]["containers"]
    args = [_render(a, name, "gs://bucket/seed-mlp") for a in container["args"]]
    args = [a.replace("/mnt/models", str(model_dir)) for a in args]
    # loopback only here; in the pod KServe binds 0.0.0.0 (the runtime's --host)
    args = [f"--host={LOOPBACK}" if a.startswith("--host=") else a for a in args]
    args = [f"--http_port={free_port}" if a.startswith("--http_port=") else a for a in args]
    env = {
        **os.environ,
        **{e["name"]: _render(e["value"], name, "gs://bucket/seed-mlp") for e in container["env"]},
    }
    proc = _start(args, env)
    base = f"http://{LOOPBACK}:{free_port}"
    try:
        _wait_ready(proc, base + container["readinessProbe"]["httpGet"]["path"])
        assert _get(base + container["livenessProbe"]["httpGet"]["path"]) == 200
        assert _get(base + container["startupProbe"]["httpGet"]["path"]) == 200
        assert _get(base + "/metrics") == 200
        client = tritonhttp.InferenceServerClient(f"{LOOPBACK}:{free_port}")
        assert client.is_model_ready(name)
        rows = np.linspace(-1, 1, 40, dtype=np.float32).reshape(5, 8)
        tensor = tritonhttp.InferInput("input", [5, 8], "FP32")
        tensor.set_data_from_numpy(rows)
        answer = client.infer(name, [tensor]).as_numpy("output")
        client.close()
        module = build_model("seed-mlp")
        from safetensors.torch import load_file

        module.load_state_dict(load_file(model_dir / "model.safetensors"))
        with torch.no_grad():
            expected = module(torch.from_numpy(rows)).numpy()
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-6)
    finally:
        _stop(proc)


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``torchplace ARGS`` in a session of its own, as the container's entry point runs it."""
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "torchplace"), *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _wait_ready(proc: subprocess.Popen[bytes], url: str) -> None:
    """Until the readiness probe answers 200 (60 s at most); the server's log if it exits."""
    deadline = time.monotonic() + 60
    ready = 0
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            ready = _get(url)
        except OSError:
            ready = 0
        if ready == 200:
            break
        time.sleep(0.2)
    assert ready == 200, (
        proc.stderr.read().decode() if proc.poll() is not None and proc.stderr else "not ready"
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to its process group; it must drain and exit 0."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 0
    if proc.stderr is not None:
        proc.stderr.close()


def test_multi_model_runtime_serves_a_repository_under_explicit_control() -> None:
    runtime = _yaml(MULTI)
    assert runtime["kind"] == "ClusterServingRuntime"
    spec = runtime["spec"]
    assert spec["multiModel"] is True
    assert spec["protocolVersions"] == ["v1", "v2"]
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"
    assert "--model-repository=/mnt/models" in container["args"]
    assert "--model-control-mode=explicit" in container["args"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    isvc, trained = yaml.safe_load_all(TRAINED.read_text())
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert "storageUri" not in model  # its models come as TrainedModels
    assert trained["kind"] == "TrainedModel"
    assert trained["spec"]["inferenceService"] == isvc["metadata"]["name"]
    formats = {f["name"] for f in spec["supportedModelFormats"]}
    assert trained["spec"]["model"]["framework"] in formats
    assert model["modelFormat"]["name"] in formats


def test_multi_model_yaml_matches_the_kserve_sdk_models() -> None:
    models = pytest.importorskip("kserve.models", reason="the kserve SDK is not installed")
    runtime = models.V1alpha1ServingRuntimeSpec(**_snake(_yaml(MULTI)["spec"]))
    assert runtime.multi_model is True
    _, trained = yaml.safe_load_all(TRAINED.read_text())
    spec = models.V1alpha1TrainedModelSpec(
        inference_service=trained["spec"]["inferenceService"],
        model=models.V1alpha1ModelSpec(**_snake(trained["spec"]["model"])),
    )
    assert spec.model.framework == "torchplace"


@pytest.mark.slow
def test_the_multi_model_runtime_takes_the_agents_load_and_unload(tmp_path: Path) -> None:
    """Started with the runtime's arguments on an empty /mnt/models, the server is ready; then
    as KServe's agent does: a model downloaded into /mnt/models/NAME and loaded, answered,
    its folder deleted and unloaded."""
    import shutil

    from .engine_helpers import save_exported

    port = _free_port()
    (container,) = _yaml(MULTI)["spec"]["containers"]
    args = [a.replace("/mnt/models", str(tmp_path)) for a in container["args"]]
    args = [f"--host={LOOPBACK}" if a.startswith("--host=") else a for a in args]
    args = [f"--port={port}" if a.startswith("--port=") else a for a in args]
    proc = _start([*args, "--grpc-port=0"])  # the pod's gRPC port could be taken here
    base = f"http://{LOOPBACK}:{port}"
    try:
        _wait_ready(proc, base + container["readinessProbe"]["httpGet"]["path"])
        folder = tmp_path / "seed-mlp"
        folder.mkdir()
        module = build_model("seed-mlp")
        save_exported(folder / "model.pt2", module, torch.zeros(2, 8))
        client = Client(LOOPBACK, port)
        assert client.post("/v2/repository/models/seed-mlp/load", b"{}", headers=_JSON)[0] == 200
        rows = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
        status, _, answer = client.post("/v2/models/seed-mlp/infer", seed_body(rows))
        assert status == 200
        with torch.no_grad():
            want = module(torch.from_numpy(rows)).numpy()
        got = np.asarray(json.loads(answer)["outputs"][0]["data"], np.float32)
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)
        shutil.rmtree(folder)
        assert client.post("/v2/repository/models/seed-mlp/unload", b"{}", headers=_JSON)[0] == 200
        assert client.post("/v2/models/seed-mlp/infer", seed_body(rows))[0] == 404
    finally:
        _stop(proc)
