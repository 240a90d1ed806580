"""torchplace on Ray Serve, for real: a head and two worker nodes on loopback, started once.

Each worker node declares one GPU that is only a label (no CUDA here), and the deployment
overrides the device to the CPU, so the placement, the Ray-assigned GPU ids and the replica
records are real while torch runs on the CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

# Ray is imported only once the fixture has set the cluster's environment (auth mode, token):
# Ray reads it when first imported.
if importlib.util.find_spec("ray") is None:
    pytest.skip(
        "the Ray tests need Ray Serve: pip install torchplace[ray]", allow_module_level=True
    )
tritonhttp = pytest.importorskip("tritonclient.http")

from tests.serve.ray_cluster import (  # noqa: E402
    LOOPBACK,
    free_port,
    get,
    node_started,
    ray_environment,
    replicas,
    wait_for,
)
from tests.serve.ray_models import POISON, faulty_seed_mlp  # noqa: E402
from torchplace.serve.config import ServeConfig  # noqa: E402
from torchplace.serve.onray import RayOptions, deployment  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    # Ray's own deprecation noise (pydantic v1-style fields, asyncio APIs): not ours to fix
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]


#: Serve's tracing on (the proxy reads only these variables), recording only the requests
#: whose caller sampled them
SERVE_TRACING = {
    "RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH": "tests.serve.ray_models:span_exporter",
    "RAY_SERVE_TRACING_SAMPLING_RATIO": "0",
}


class Service:
    def __init__(self, cluster: Any, workers: list[Any], handle: Any, proxy: str) -> None:
        self.cluster = cluster
        self.workers = workers
        self.handle = handle
        self.proxy = proxy
        self.model = handle.describe.remote().result(timeout_s=30)["engine"]["model"]


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    # a short path: Ray's socket paths must stay under the kernel's 107-byte limit
    with (
        tempfile.TemporaryDirectory(prefix="tpray") as raw,
        ray_environment(Path(raw), **SERVE_TRACING),
    ):
        # Ray reads its environment (auth mode, loopback, temp dir) when first imported
        import ray
        from ray import serve
        from ray.cluster_utils import Cluster

        tmp = Path(raw)
        (tmp / "ray").mkdir()
        node = {"node_ip_address": LOOPBACK, "temp_dir": str(tmp / "ray")}
        cluster = node_started(
            lambda: Cluster(
                initialize_head=True,
                head_node_args={**node, "num_cpus": 1, "include_dashboard": False},
            )
        )
        try:
            workers = [
                node_started(
                    lambda: cluster.add_node(
                        **node, num_cpus=1, num_gpus=1, metrics_export_port=free_port()
                    )
                )
                for _ in range(2)
            ]
            ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
            port = free_port()
            serve.start(http_options={"host": LOOPBACK, "port": port, "location": "HeadOnly"})
            config = ServeConfig(
                model="tests.serve.ray_models:faulty_seed_mlp",
                max_batch_size=16,
                max_delay_ms=5.0,
                failure_threshold=1,
            )
            options = RayOptions(
                replicas=2,
                gpus_per_replica=1,
                max_replicas_per_node=1,
                device_override="cpu",
                health_check_period_s=1.0,
                health_check_timeout_s=10.0,
            )
            handle = serve.run(deployment(config, options), name="torchplace", route_prefix="/")
            yield Service(cluster, workers, handle, f"{LOOPBACK}:{port}")
        finally:
            try:
                serve.shutdown()
            finally:
                ray.shutdown()
                cluster.shutdown()


def _tensor(rows: np.ndarray) -> Any:
    tensor = tritonhttp.InferInput("input", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=True)
    return tensor


def _infer(client: Any, rows: np.ndarray, model: str) -> np.ndarray:
    out = client.infer(model, [_tensor(rows)])
    answer: np.ndarray = out.as_numpy("output")
    return answer


def _expected(rows: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return faulty_seed_mlp()(torch.from_numpy(rows)).numpy()


def test_ray_reports_loopback_addresses_only(service: Service) -> None:
    import ray

    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 3
    assert {n["NodeManagerAddress"] for n in nodes} == {LOOPBACK}
    assert service.cluster.address.startswith(LOOPBACK + ":")
    assert ray.util.get_node_ip_address() == LOOPBACK
    for record in replicas(service.handle, 2).values():
        assert record["node_ip"] == LOOPBACK
        assert record["direct_url"].startswith(f"http://{LOOPBACK}:")


def test_replicas_on_two_nodes_with_the_devices_ray_assigned(service: Service) -> None:
    import ray

    found = replicas(service.handle, 2)
    assert len({node for node, _ in found}) == 2  # two distinct nodes
    head = next(n["NodeID"] for n in ray.nodes() if n["Resources"].get("GPU", 0) == 0)
    for record in found.values():
        assert record["node_id"] != head  # the head has no GPU to give
        assert len(record["ray_gpu_ids"]) == 1  # exactly one GPU assigned ...
        assert record["cuda_visible_devices"] == record["ray_gpu_ids"][0]
        assert record["devices"] == ["cpu"]  # ... and the CPU override serves on the CPU
        engine = record["engine"]
        assert engine["devices"] == ["cpu"]
        assert len(engine["replicas"]) == 1  # no multi-device spawning inside Ray
        assert engine["replicas"][0]["ready"] is True  # warm before Serve marked it running


def test_concurrent_oip_requests_batched_on_both_replicas(service: Service) -> None:
    rng = np.random.default_rng(0)
    before = {k: r["served"].get("cpu", {}) for k, r in replicas(service.handle, 2).items()}
    client = tritonhttp.InferenceServerClient(service.proxy, concurrency=32)
    assert client.is_server_ready()
    assert client.is_model_ready(service.model)
    batches = [rng.standard_normal((1, 8), dtype=np.float32) for _ in range(400)]
    # tritonclient.http is gevent-based: concurrency comes from async_infer, not from threads
    pending = [client.async_infer(service.model, [_tensor(rows)]) for rows in batches]
    answers = [request.get_result().as_numpy("output") for request in pending]
    client.close()
    for rows, answer in zip(batches, answers, strict=True):
        np.testing.assert_allclose(answer, _expected(rows), rtol=1e-5, atol=1e-6)
    after = replicas(service.handle, 2)
    assert len(after) == 2
    for key, record in after.items():
        served = record["served"]["cpu"]
        old = before.get(key, {})
        rows = served["rows"] - old.get("rows", 0.0)
        count = served["batches"] - old.get("batches", 0.0)
        assert rows > 0, f"replica {key} answered nothing"
        assert rows > count, f"replica {key} never ran a batch of more than one row"


def _ask_each_replica(service: Service) -> None:
    """One request straight to each replica, its answer checked."""
    rows = np.arange(16, dtype=np.float32).reshape(2, 8)
    for record in replicas(service.handle, 2).values():
        url = record["direct_url"].removeprefix("http://")
        client = tritonhttp.InferenceServerClient(url)
        np.testing.assert_allclose(
            _infer(client, rows, service.model), _expected(rows), rtol=1e-5, atol=1e-6
        )
        client.close()


def test_each_replica_also_answers_directly(service: Service) -> None:
    _ask_each_replica(service)


def test_device_labelled_metrics_reach_rays_metrics_export(service: Service) -> None:
    import ray

    _ask_each_replica(service)  # each has served a batch, whichever tests ran before
    ports = [n["MetricsExportPort"] for n in ray.nodes() if n["Alive"]]
    pattern = re.compile(r'^ray_torchplace_batch_size_count\{[^}]*device="cpu"[^}]*\} (\S+)', re.M)

    def scraped() -> set[str]:
        nodes = set()
        for port in ports:
            status, body = get(f"http://{LOOPBACK}:{port}/metrics")
            text = body.decode()
            if status == 200 and any(float(v) > 0 for v in pattern.findall(text)):
                nodes.update(
                    re.findall(
                        r'^ray_torchplace_batch_size_count\{[^}]*replica="([^"]+)"', text, re.M
                    )
                )
        return nodes if len(nodes) >= 2 else set()

    replicas_seen = wait_for("both replicas' series in Ray's metrics export", scraped, 60)
    assert len(replicas_seen) >= 2


def _spans(trace_id: str) -> list[dict[str, Any]]:
    """The spans of one trace exported so far by the proxy and the replicas."""
    folder = Path(os.environ["TORCHPLACE_TEST_RAY_TMP"]) / "spans"
    found = []
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            span = json.loads(line)
            if span["trace_id"] == trace_id:
                found.append(span)
    return found


def test_stage_spans_join_the_callers_trace_through_serve(service: Service) -> None:
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    client = tritonhttp.InferenceServerClient(service.proxy)
    rows = np.ones((2, 8), dtype=np.float32)
    out = client.infer(
        service.model, [_tensor(rows)], headers={"traceparent": f"00-{trace_id}-{client_span}-01"}
    )
    np.testing.assert_allclose(out.as_numpy("output"), _expected(rows), rtol=1e-5, atol=1e-6)
    client.close()
    stages = {"queue", "h2d", "compute", "d2h"}

    def complete() -> list[dict[str, Any]]:
        """The trace once it holds our spans and every ancestor up to the client's span."""
        spans = _spans(trace_id)
        by_id = {s["span_id"]: s for s in spans}
        (infer,) = [s for s in spans if s["name"] == "torchplace.infer"]
        span, chain = infer, []
        while span["parent_id"] in by_id:
            span = by_id[span["parent_id"]]
            chain.append(span["name"])
        seen = [(s["name"], s["span_id"], s["parent_id"]) for s in spans]
        assert span["parent_id"] == client_span, f"chain {chain} stops; spans so far {seen}"
        # our request span is a child of Serve's span for the replica call, which descends,
        # through Serve's proxy span, from the client's span
        assert chain[0].startswith("replica_handle_request"), chain
        assert any(name.startswith("proxy") for name in chain), chain
        children = {s["name"] for s in spans if s["parent_id"] == infer["span_id"]}
        assert children >= stages, children
        return spans

    spans = wait_for("our spans joined to the caller's trace", complete, 30)
    (infer,) = [s for s in spans if s["name"] == "torchplace.infer"]
    children = [s for s in spans if s["parent_id"] == infer["span_id"]]
    assert sorted(s["name"] for s in children) == sorted(stages)
    for child in children:  # inside the request, in time
        assert infer["start"] <= child["start"] <= child["end"] <= infer["end"]


def test_replica_failing_its_health_check_is_replaced(service: Service) -> None:
    before = replicas(service.handle, 2)
    client = tritonhttp.InferenceServerClient(service.proxy)
    poison = np.full((1, 8), POISON, dtype=np.float32)
    with pytest.raises(tritonhttp.InferenceServerException, match="CUDA error"):
        _infer(client, poison, service.model)

    def replaced() -> dict[tuple[str, int], dict[str, Any]] | None:
        now = replicas(service.handle, 2, tries=40)
        fresh = set(now) - set(before)
        return now if len(now) == 2 and fresh else None

    now = wait_for("a fresh replica replacing the failed one", replaced, 90, every=1.0)
    assert len(set(now) - set(before)) == 1  # the healthy one stayed
    rows = np.ones((3, 8), dtype=np.float32)
    np.testing.assert_allclose(
        _infer(client, rows, service.model), _expected(rows), rtol=1e-5, atol=1e-6
    )
    client.close()


def test_service_keeps_answering_after_remove_node(service: Service) -> None:
    found = replicas(service.handle, 2)
    victim_id = next(iter(found))[0]
    victim = next(w for w in service.workers if w.node_id == victim_id)
    service.cluster.remove_node(victim)
    client = tritonhttp.InferenceServerClient(service.proxy)
    rows = np.ones((2, 8), dtype=np.float32)
    streak = 0
    deadline = time.monotonic() + 60
    while streak < 20 and time.monotonic() < deadline:
        try:
            answer = _infer(client, rows, service.model)
        except tritonhttp.InferenceServerException:
            streak = 0
            time.sleep(0.2)
            continue
        np.testing.assert_allclose(answer, _expected(rows), rtol=1e-5, atol=1e-6)
        streak += 1
    client.close()
    assert streak >= 20, "the service did not answer 20 requests in a row after remove_node"
    left = replicas(service.handle, 1)
    assert all(node != victim_id for node, _ in left)
