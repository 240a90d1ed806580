"""The generated gRPC modules are what scripts/gen-grpc-proto makes from the .proto files."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen-grpc-proto"
PROTO = ROOT / "src" / "torchplace" / "serve" / "proto"


def _pinned_tools() -> str:
    for line in SCRIPT.read_text().splitlines():
        if line.startswith("GRPCIO_TOOLS = "):
            return line.split('"')[1]
    raise AssertionError("scripts/gen-grpc-proto names no GRPCIO_TOOLS version")


def test_generated_modules_are_reproducible(tmp_path: Path) -> None:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools is not installed (the test extra has it)")
    pinned, installed = _pinned_tools(), importlib.metadata.version("grpcio-tools")
    if installed != pinned:
        pytest.skip(f"grpcio-tools {installed} is installed; the modules were made with {pinned}")
    subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], check=True, capture_output=True)
    for name in (
        "grpc_service_pb2.py",
        "model_config_pb2.py",
        "health_pb2.py",
        "reflection_pb2.py",
    ):
        assert (tmp_path / name).read_text() == (PROTO / name).read_text(), (
            f"{name} differs from what scripts/gen-grpc-proto makes; run it and commit the result"
        )


def test_the_messages_live_in_torchplaces_own_pool() -> None:
    pytest.importorskip("google.protobuf")
    from google.protobuf import descriptor_pool

    from torchplace.serve.proto import _pool, grpc_service_pb2

    assert grpc_service_pb2.DESCRIPTOR.pool is _pool.POOL
    assert _pool.POOL is not descriptor_pool.Default()
    methods = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name
    assert {"ModelInfer", "ModelConfig", "ModelStatistics", "RepositoryModelLoad"} <= set(methods)
