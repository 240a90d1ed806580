"""Triton's model configuration and statistics documents, from a real engine's settings."""

from __future__ import annotations

import orjson
import pytest
import torch

from torchplace.serve.admission import QueuePolicy
from torchplace.serve.engine import Engine
from torchplace.serve.loader import load_model
from torchplace.serve.triton import model_config, model_statistics

from .conftest import FakeEngine


def _engine() -> Engine:
    return Engine(
        load_model("seed-mlp", version="3"),
        [torch.device("cpu")],
        replicas_per_device=2,
        max_batch_size=16,
        max_delay_ms=1.5,
        queue=QueuePolicy(max_queue=100, priority_levels=2, queue_limits=(10, 100)),
        dtype="bfloat16",
    )


def test_config_reads_the_batcher_the_queue_and_the_replicas() -> None:
    doc = model_config(_engine())
    assert doc["max_batch_size"] == 16
    assert doc["version_policy"] == {"specific": {"versions": [3]}}
    assert doc["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [8]}]
    assert doc["output"] == [{"name": "output", "data_type": "TYPE_FP32", "dims": [2]}]
    batching = doc["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 1500
    assert (batching["priority_levels"], batching["default_priority_level"]) == (2, 2)
    assert batching["priority_queue_policy"]["1"]["max_queue_size"] == 10
    assert batching["default_queue_policy"]["max_queue_size"] == 100
    assert doc["instance_group"] == [
        {"name": "seed-mlp_cpu", "kind": "KIND_CPU", "count": 2, "gpus": []}
    ]
    assert doc["parameters"] == {"dtype": {"string_value": "bfloat16"}}


def test_the_config_is_a_valid_model_config_message() -> None:
    pytest.importorskip("google.protobuf")
    from google.protobuf import json_format

    from torchplace.serve.proto import model_config_pb2

    message = json_format.ParseDict(model_config(_engine()), model_config_pb2.ModelConfig())
    assert message.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert message.input[0].data_type == model_config_pb2.TYPE_FP32


def test_a_cpu_fallback_is_a_passive_group_that_loads_back_as_the_server_s() -> None:
    """The fallback takes requests only when the GPU replicas fail: listed as an ordinary
    KIND_CPU group, its config sent back to ``load_model`` put replicas on the CPU too."""
    from types import SimpleNamespace

    from torchplace.serve.repository import triton_settings

    gpu, cpu = torch.device("cuda", 1), torch.device("cpu")
    replicas = [SimpleNamespace(device=d, fallback=f) for d, f in ((gpu, 0), (gpu, 0), (cpu, 1))]
    engine = FakeEngine()
    engine.replicas = replicas  # type: ignore[attr-defined]
    groups = model_config(engine)["instance_group"]
    assert groups == [
        {"name": "seed-mlp_cuda_1", "kind": "KIND_GPU", "count": 2, "gpus": [1]},
        {"name": "seed-mlp_fallback", "kind": "KIND_CPU", "count": 1, "gpus": [], "passive": True},
    ]
    settings = triton_settings(orjson.dumps({"instance_group": groups}).decode())
    assert settings == {"replicas": 2, "devices": ["cuda:1"]}


def test_statistics_of_an_engine_that_keeps_none_are_zeros() -> None:
    doc = model_statistics([FakeEngine()])
    entry = doc["model_stats"][0]
    assert (entry["name"], entry["version"]) == ("seed-mlp", "1")
    assert entry["inference_stats"]["success"] == {"count": 0, "ns": 0}
    assert entry["batch_stats"] == []
