"""Triton's Prometheus series (``nv_inference_*``) in ``/metrics``
(:mod:`torchplace.serve.triton_metrics`)."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from torchplace.serve.running import ServerThread
from torchplace.serve.triton_metrics import triton_text

from .conftest import test_config
from .repository_helpers import call


def _families(text: bytes) -> dict[str, Any]:
    """Every family of the exposition (which must parse whole), by name."""
    return {family.name: family for family in text_string_to_metric_families(text.decode())}


def _metrics(port: int) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 200
        return response.read()
    finally:
        conn.close()


def _values(family: Any) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    config = test_config(model="seed-mlp", models=("wide-mlp",), device="cpu", grpc_port=0)
    with ServerThread(config) as thread:
        yield thread


def _infer(port: int, model: str, width: int, rows: int, **parameters: Any) -> int:
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [rows, width],
                        "data": [0.5] * (rows * width)}]}  # fmt: skip
    if parameters:
        body["parameters"] = parameters
    status, _ = call(port, "POST", f"/v2/models/{model}/infer", orjson.dumps(body))
    return status


def test_the_series_are_triton_s_and_equal_the_statistics_extension(server: ServerThread) -> None:
    for rows in (1, 3, 2):
        assert _infer(server.port, "seed-mlp", 8, rows) == 200
    assert _infer(server.port, "wide-mlp", 512, 1) == 200
    raw = _metrics(server.port)
    families = _families(raw)  # the whole text parses: one HELP and TYPE per family
    assert raw.count(b"# TYPE nv_inference_request_success counter") == 1
    assert b"\nnv_inference_request_success{" in raw  # Triton's name: no _total
    _, stats = call(server.port, "GET", "/v2/models/seed-mlp/stats")
    doc = stats["model_stats"][0]
    seed = (("model", "seed-mlp"), ("version", "1"))
    success = _values(families["nv_inference_request_success"])
    assert success[seed] == doc["inference_stats"]["success"]["count"] == 3
    assert _values(families["nv_inference_count"])[seed] == doc["inference_count"] == 6
    assert _values(families["nv_inference_exec_count"])[seed] == doc["execution_count"]
    for name, key in (("request", "success"), ("queue", "queue"),
                      ("compute_input", "compute_input"), ("compute_infer", "compute_infer"),
                      ("compute_output", "compute_output")):  # fmt: skip
        got = _values(families[f"nv_inference_{name}_duration_us"])[seed]
        assert got == doc["inference_stats"][key]["ns"] // 1000, name
    wide = (("model", "wide-mlp"), ("version", "1"))
    assert success[wide] == 1  # both models in one family
    pending = _values(families["nv_inference_pending_request_count"])
    assert pending[seed] == 0
    assert families["nv_inference_pending_request_count"].type == "gauge"


def test_a_failure_is_counted_under_its_reason(server: ServerThread) -> None:
    def failures() -> dict[str, float]:
        family = _families(_metrics(server.port))["nv_inference_request_failure"]
        return {
            s.labels["reason"]: s.value for s in family.samples if s.labels["model"] == "wide-mlp"
        }

    before = failures()
    assert set(before) == {"REJECTED", "CANCELED", "BACKEND", "OTHER"}  # present from the start
    assert _infer(server.port, "wide-mlp", 512, 1, timeout=1) == 504  # 1 us: past at once
    after = failures()
    assert after["REJECTED"] == before["REJECTED"] + 1
    assert after["OTHER"] == before["OTHER"]


def test_label_values_are_escaped_and_engines_without_statistics_left_out() -> None:
    class Stats:
        def snapshot(self, name: str, version: str) -> dict[str, Any]:
            zero = {"count": 0, "ns": 0}
            keys = ("success", "queue", "compute_input", "compute_infer", "compute_output")
            return {"inference_stats": dict.fromkeys(keys, zero), "inference_count": 0,
                    "execution_count": 0}  # fmt: skip

        def failures(self) -> dict[str, int]:
            return {"OTHER": 2}

    class Engine:
        name, version, statistics = 'a"b\\c\nd', "7", Stats()

    class Bare:
        name, version = "x", "1"

    text = triton_text([Engine(), Bare()])
    assert b'model="a\\"b\\\\c\\nd",version="7",reason="OTHER"} 2\n' in text
    assert b'model="x"' not in text
    assert _families(text)["nv_inference_pending_request_count"].samples[0].value == 0
    assert triton_text([Bare()]) == b""
