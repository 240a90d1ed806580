from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from torchplace.serve.engine import Engine
from torchplace.serve.loader import load_model
from torchplace.serve.metrics import ReplicaState, ServeMetrics


def _samples(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def test_every_series_carries_model_version_and_full_device() -> None:
    metrics = ServeMetrics(
        "wide-mlp",
        "3",
        queue_depth=lambda: 5,
        queue_device="cuda:0,cuda:1",
        replicas=lambda: [
            ReplicaState("cuda:1#0", "cuda:1", True),
            ReplicaState("cuda:0#1", "cuda:0", False),
        ],
        memory=lambda device: (100, 200) if device == "cuda:1" else None,
    )
    bound = metrics.device("cuda:1")
    bound.request(200, 0.004)
    bound.request(503, 0.001)
    bound.queue.observe(0.0001)
    for stage in (bound.h2d, bound.compute, bound.d2h):
        stage.observe(0.001)
    bound.batch_size.observe(32)
    bound.errors["kernel"].inc()
    samples = _samples(metrics.text())
    expected = {
        "torchplace_requests_total",
        "torchplace_request_duration_seconds_bucket",
        "torchplace_stage_duration_seconds_bucket",
        "torchplace_batch_size_bucket",
        "torchplace_queue_depth",
        "torchplace_device_memory_allocated_bytes",
        "torchplace_device_memory_reserved_bytes",
        "torchplace_errors_total",
        "torchplace_replica_ready",
    }
    assert expected <= set(samples)
    for name, rows in samples.items():
        for labels, _ in rows:
            assert labels["model"] == "wide-mlp", name
            assert labels["version"] == "3", name
            assert labels["device"] in ("cuda:1", "cuda:0", "cuda:0,cuda:1"), name
    stages = {labels["stage"] for labels, _ in samples["torchplace_stage_duration_seconds_count"]}
    assert stages == {"queue", "h2d", "compute", "d2h"}
    statuses = {labels["status"]: v for labels, v in samples["torchplace_requests_total"]}
    assert statuses == {"200": 1.0, "503": 1.0}
    assert samples["torchplace_device_memory_allocated_bytes"] == [
        ({"model": "wide-mlp", "version": "3", "device": "cuda:1"}, 100.0)
    ]
    assert samples["torchplace_queue_depth"][0][1] == 5.0
    ready = {labels["replica"]: v for labels, v in samples["torchplace_replica_ready"]}
    assert ready == {"cuda:1#0": 1.0, "cuda:0#1": 0.0}


def test_each_engine_has_its_own_registry() -> None:
    a = ServeMetrics("m", "1")
    b = ServeMetrics("m", "1")
    a.device("cpu").request(200, 0.1)
    assert b'status="200"' in a.text()
    assert b'status="200"' not in b.text()


def test_engine_metrics_after_traffic() -> None:
    async def main() -> bytes:
        engine = Engine(
            load_model("seed-mlp"), [torch.device("cpu")], replicas_per_device=2, max_delay_ms=0.0
        )
        assert engine.metrics_text()  # valid before start too
        await engine.start()
        xs = [np.zeros((2, 8), np.float32) for _ in range(20)]
        await asyncio.gather(*(engine.infer({"input": x}) for x in xs))
        text = engine.metrics_text()
        await engine.stop()
        return text

    samples = _samples(asyncio.run(main()))
    rows = sum(v for labels, v in samples["torchplace_batch_size_sum"])
    assert rows == 40.0
    queue = [
        v
        for labels, v in samples["torchplace_stage_duration_seconds_count"]
        if labels["stage"] == "queue"
    ]
    assert sum(queue) == 20.0
    ready = [v for labels, v in samples["torchplace_replica_ready"]]
    assert len(ready) == 2


@pytest.mark.parametrize("size", [1, 32, 48])
def test_batch_size_buckets_cover_the_maximum(size: int) -> None:
    metrics = ServeMetrics("m", "1", max_batch_size=size)
    metrics.device("cpu").batch_size.observe(size)
    text = metrics.text().decode()
    assert f'le="{float(size)}"' in text


def test_metrics_off_skips_the_per_batch_series() -> None:
    async def main() -> bytes:
        engine = Engine(load_model("seed-mlp"), [torch.device("cpu")], metrics=False)
        await engine.start()
        await engine.infer({"input": np.zeros((2, 8), np.float32)})
        text = engine.metrics_text()
        await engine.stop()
        return text

    samples = _samples(asyncio.run(main()))
    assert sum(v for _, v in samples["torchplace_batch_size_count"]) == 0.0
    assert [v for _, v in samples["torchplace_replica_ready"]] == [1.0]


def test_metrics_endpoint_has_no_created_series() -> None:
    from torchplace.serve.running import ServerThread

    from .conftest import Client, seed_body, test_config

    with ServerThread(test_config(device="cpu")) as thread:
        client = Client("127.0.0.1", thread.port)
        status, _, _ = client.post("/v2/models/seed-mlp/infer", seed_body(np.ones((1, 8), "f4")))
        assert status == 200
        client.post("/v2/models/seed-mlp/infer", b"{")  # an input error: the counter moves
        status, _, text = client.get("/metrics")
    assert status == 200
    lines = text.decode().splitlines()
    assert any(line.startswith("torchplace_requests_total{") for line in lines)
    assert any(
        line.startswith("torchplace_errors_total{")
        and 'class="input"' in line
        and not line.endswith(" 0.0")
        for line in lines
    )
    assert [line for line in lines if "_created" in line] == []


def test_requests_counted_across_folds_and_scrapes_are_exact() -> None:
    """A finished request is appended and folded later (every FOLD_AT, or at a scrape): the
    counts and buckets equal a request-by-request count, whatever the scrapes between."""
    from torchplace.serve.metrics import FOLD_AT

    metrics = ServeMetrics("seed-mlp", "1")
    bound = metrics.device("cpu")
    rng = np.random.default_rng(0)
    seconds = rng.exponential(0.01, FOLD_AT * 2 + 17).tolist()
    statuses = [200 if i % 7 else 503 for i in range(len(seconds))]
    for i, (status, took) in enumerate(zip(statuses, seconds, strict=True)):
        bound.request(status, took)
        if i == 1000:
            assert _samples(metrics.text())["torchplace_requests_total"]  # a scrape mid-way
    samples = _samples(metrics.text())
    by_status = {labels["status"]: v for labels, v in samples["torchplace_requests_total"]}
    assert by_status == {"200": statuses.count(200), "503": statuses.count(503)}
    ((_, count),) = samples["torchplace_request_duration_seconds_count"]
    ((_, total),) = samples["torchplace_request_duration_seconds_sum"]
    assert count == len(seconds)
    assert total == pytest.approx(sum(seconds))
    for labels, cumulative in samples["torchplace_request_duration_seconds_bucket"]:
        assert cumulative == sum(1 for s in seconds if s <= float(labels["le"]))
