"""Traces in Triton's JSON trace format (:mod:`torchplace.serve.triton_trace`): the server's
one file, ``log_frequency`` segments, and the front ends' times, read as Triton's
``trace_summary.py`` reads them."""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.errors import ConfigError, InputError
from torchplace.serve.running import ServerThread
from torchplace.serve.trace_settings import TraceSettings
from torchplace.serve.tracing import BatchRecord, Tracer
from torchplace.serve.triton_trace import Stamps, Traced, TraceFile

from .conftest import test_config

#: the spans trace_summary.py adds up: each end must not come before its start
SPANS = (
    ("REQUEST_START", "REQUEST_END"),
    ("QUEUE_START", "COMPUTE_START"),
    ("COMPUTE_START", "COMPUTE_END"),
    ("COMPUTE_START", "COMPUTE_INPUT_END"),
    ("COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START"),
    ("COMPUTE_OUTPUT_START", "COMPUTE_END"),
    ("HTTP_RECV_START", "HTTP_RECV_END"),
    ("HTTP_SEND_START", "HTTP_SEND_END"),
    ("HTTP_RECV_START", "HTTP_SEND_END"),
    ("GRPC_WAITREAD_END", "GRPC_SEND_END"),
    ("GRPC_SEND_START", "GRPC_SEND_END"),
)
CORE = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]  # fmt: skip
HTTP = ["HTTP_RECV_START", "HTTP_RECV_END", *CORE, "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *CORE, "GRPC_SEND_START", "GRPC_SEND_END"]


def traces(path: Path) -> dict[int, dict[str, Any]]:
    """A Triton trace file's traces by id (entries of one id merged, as trace_summary.py
    merges them), each span it adds up checked for order."""
    merged: dict[int, dict[str, Any]] = {}
    for entry in json.loads(path.read_text()):
        trace = merged.setdefault(entry["id"], {"timestamps": []})
        trace["timestamps"] += entry.pop("timestamps", [])
        trace.update(entry)
    for trace in merged.values():
        times = {t["name"]: t["ns"] for t in trace["timestamps"]}
        for start, end in SPANS:
            if start in times and end in times:
                assert times[start] <= times[end], (start, end, trace)
        trace["names"] = [t["name"] for t in trace["timestamps"]]
    return merged


def _traced(stamps: Stamps | None = None, model: str = "m") -> Traced:
    return Traced(model, "1", 1.0, 2.0, 2.1, 2.5, 2.6, stamps)


def _stamps() -> Stamps:
    return Stamps("HTTP", 0.5, 0.9)


# -- the file --------------------------------------------------------------------------------
def test_every_n_complete_traces_go_to_the_next_numbered_file(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    file = TraceFile(path)
    file.log_frequency = 2
    first, second, third = _stamps(), _stamps(), _stamps()
    file.add([_traced(first), _traced(second)])
    file.add([_traced(third)])
    second.sent(3.0, 3.1)
    assert not list(tmp_path.iterdir())  # the first trace's answer is not sent yet
    first.abandoned()  # its client went away: complete, without send times
    file.close()  # waits for the segment's write, then writes what is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json.0", "trace.json.1"]
    zero = traces(tmp_path / "trace.json.0")
    assert sorted(zero) == [1, 2]
    assert zero[1]["names"] == HTTP[:-2]
    assert zero[2]["names"] == HTTP
    assert (zero[2]["model_name"], zero[2]["model_version"]) == ("m", 1)
    assert sorted(traces(tmp_path / "trace.json.1")) == [3]  # left at the stop, not complete


def test_log_frequency_0_writes_every_trace_to_the_file_at_the_stop(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    file = TraceFile(path)
    file.add([_traced(), _traced(_stamps())])
    assert not path.exists()
    file.close()
    got = traces(path)
    assert [got[1]["names"], got[2]["names"]] == [CORE, HTTP[:2] + CORE]
    empty = TraceFile(tmp_path / "none.json")
    empty.close()
    assert not (tmp_path / "none.json").exists()  # as Triton: no trace, no file


def test_a_spent_count_writes_its_traces_apart_from_the_earlier_settings(
    tmp_path: Path,
) -> None:
    """Triton's L0_trace: 10 requests traced, then ``trace_count`` 5 and 10 more requests:
    the 5 counted ones go to FILE.0 as soon as the count is spent, the 10 earlier ones to
    FILE at the stop."""
    path = tmp_path / "trace.json"
    tracer = Tracer(model="m", version="1", trace_file=path, otel=False, trace_format="triton")
    settings = TraceSettings()
    record = BatchRecord("cpu#0", "cpu", [1.0], [1], None, 2.0, 3.0, 0.1, 0.5, 0.2)
    for _ in range(10):
        tracer.batch(record)
    settings.update({"trace_count": ["5"]}, {"m": [tracer]})
    for _ in range(10):
        if tracer.enabled:
            tracer.batch(record)
    assert tracer.count == 0
    assert tracer._file is not None
    tracer._file.close()  # waits for the write under way
    assert sorted(traces(tmp_path / "trace.json.0")) == [11, 12, 13, 14, 15]
    assert sorted(traces(path)) == list(range(1, 11))


def test_past_max_traces_traces_are_dropped_and_counted(tmp_path: Path) -> None:
    file = TraceFile(tmp_path / "trace.json", max_traces=3)
    file.add([_traced() for _ in range(2)])
    file.add([_traced() for _ in range(2)])
    assert file.dropped == 1
    file.close()
    assert sorted(traces(tmp_path / "trace.json")) == [1, 2, 3]
    with pytest.raises(ValueError, match="max_traces must be at least 1"):
        TraceFile(tmp_path / "x.json", max_traces=0)


def test_tracers_share_the_server_s_file_the_last_to_close_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    a = Tracer(model="a", version="1", trace_file=path, otel=False, trace_format="triton")
    b = Tracer(model="b", version="2", trace_file=path, otel=False, trace_format="triton")
    record = BatchRecord("cpu#0", "cpu", [1.0, 1.5], [1, 3], None, 2.0, 3.0, 0.1, 0.5, 0.2)
    a.batch(record)
    b.batch(record._replace(arrivals=[1.0]))
    assert a.write() is None  # the file is the server's, not the tracer's
    a.close()
    assert not path.exists()
    b.close()
    got = traces(path)
    assert [(t["model_name"], t["model_version"]) for t in got.values()] == [
        ("a", 1), ("a", 1), ("b", 2)
    ]  # fmt: skip
    times = {t["name"]: t["ns"] for t in got[1]["timestamps"]}
    assert times["COMPUTE_START"] == 2_000_000_000
    assert times["COMPUTE_END"] == times["REQUEST_END"] == 3_000_000_000
    with pytest.raises(ValueError, match="trace_format 'perfetto'"):
        Tracer(model="a", version="1", trace_format="perfetto")


def test_log_frequency_above_0_needs_the_triton_format(tmp_path: Path) -> None:
    chrome = Tracer(model="m", version="1", trace_file=tmp_path / "c.json", otel=False)
    triton = Tracer(model="m", version="1", trace_file=tmp_path / "t.json", otel=False,
                    trace_format="triton")  # fmt: skip
    settings = TraceSettings()
    with pytest.raises(InputError, match="--trace-format triton"):
        settings.update({"log_frequency": ["5"]}, {"m": [chrome]})
    got = settings.update({"log_frequency": ["5"]}, {"m": [triton]})
    assert got["log_frequency"] == "5"
    assert triton._file is not None
    assert triton._file.log_frequency == 5
    triton.close()
    with pytest.raises(ConfigError, match="trace_format"):
        test_config(model="seed-mlp", trace_format="perfetto")
    with pytest.raises(ValueError, match="protocol 'SMTP'"):
        Stamps("SMTP", 0.0, 0.0)


def test_the_tensors_level_writes_each_request_s_inputs_and_outputs(tmp_path: Path) -> None:
    """As Triton's TENSORS level: values and shape as comma-separated text, the declared
    datatype, BYTES as a CSV row; a failed request's outputs are left out; without
    TIMESTAMPS no times."""
    path = tmp_path / "trace.json"
    tracer = Tracer(model="m", version="1", trace_file=path, otel=False, trace_format="triton",
                    datatypes={"x": "BF16"})  # fmt: skip
    settings = TraceSettings()
    got = settings.update({"trace_level": ["TENSORS", "TIMESTAMPS"]}, {"m": [tracer]})
    assert got["trace_level"] == ["TIMESTAMPS", "TENSORS"]  # Triton's order
    inputs = [{"x": np.array([[0.5, -1.0]], np.float32)},
              {"x": np.array([[2.0, 3.0]], np.float32)}]  # fmt: skip
    outputs = [{"y": np.array([[b"a,b", b'say "hi"']], object)}, RuntimeError("kernel")]
    record = BatchRecord("cpu#0", "cpu", [1.0, 1.0], [1, 1], [200, 500], 2.0, 3.0, 0.1, 0.5,
                         0.2, inputs=inputs, outputs=outputs)  # fmt: skip
    tracer.batch(record)
    settings.update({"trace_level": ["TENSORS"]}, {"m": [tracer]})
    tracer.batch(record._replace(arrivals=[1.0], rows=[1], statuses=None, inputs=[{
        "z": np.array([[True, False]])}], outputs=[{}]))  # fmt: skip
    tracer.close()
    entries = json.loads(path.read_text())
    tensors = [(e["id"], e["activity"], e["tensor"]) for e in entries if "tensor" in e]
    assert tensors == [
        (1, "TENSOR_QUEUE_INPUT", {"name": "x", "data": "0.5,-1.0", "shape": "1,2", "dtype": "BF16"}),
        (1, "TENSOR_BACKEND_OUTPUT",
         {"name": "y", "data": '"a,b","say ""hi"""', "shape": "1,2", "dtype": "BYTES"}),
        (2, "TENSOR_QUEUE_INPUT", {"name": "x", "data": "2.0,3.0", "shape": "1,2", "dtype": "BF16"}),
        (3, "TENSOR_QUEUE_INPUT",
         {"name": "z", "data": "1,0", "shape": "1,2", "dtype": "BOOL"}),
    ]  # fmt: skip
    assert [e["id"] for e in entries if "timestamps" in e] == [1, 2]


# -- over the wire ---------------------------------------------------------------------------
def _post(port: int, path: str, body: object) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", path, body=orjson.dumps(body))
        response = conn.getresponse()
        return response.status, orjson.loads(response.read())
    finally:
        conn.close()


def test_a_server_traces_rest_and_grpc_requests_as_triton_does(tmp_path: Path) -> None:
    """Two models, one file: log_frequency 2 writes trace.json.0 and .1 as requests are
    answered, the last one at the stop; REST and gRPC requests carry their front end's
    times and the client's id."""
    grpc_client = pytest.importorskip("tritonclient.grpc")
    path = tmp_path / "trace.json"
    config = test_config(model="seed-mlp", models=("wide-mlp",), device="cpu", trace_file=path,
                         trace_format="triton", max_delay_ms=0.0)  # fmt: skip
    thread = ServerThread(config).start(timeout=120)
    try:
        status, got = _post(thread.port, "/v2/trace/setting", {"log_frequency": "2"})
        assert (status, got["log_frequency"], got["trace_file"]) == (200, "2", str(path))
        for model, width in (("seed-mlp", 8), ("seed-mlp", 8), ("wide-mlp", 512)):
            body = {"id": "rest-1", "inputs": [
                {"name": "input", "datatype": "FP32", "shape": [1, width], "data": [0.5] * width}
            ]}  # fmt: skip
            assert _post(thread.port, f"/v2/models/{model}/infer", body)[0] == 200
        client = grpc_client.InferenceServerClient(f"127.0.0.1:{thread.grpc_port}")
        try:
            tensor = grpc_client.InferInput("input", [1, 8], "FP32")
            tensor.set_data_from_numpy(np.full((1, 8), 0.5, np.float32))
            client.infer("seed-mlp", [tensor], request_id="grpc-1")
        finally:
            client.close()
        segment = path.parent / "trace.json.0"  # written off the loop, while serving
        for _ in range(100):
            if segment.exists():
                break
            time.sleep(0.05)
        assert segment.exists()
    finally:
        thread.stop()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json.0", "trace.json.1"]
    got = {**traces(tmp_path / "trace.json.0"), **traces(tmp_path / "trace.json.1")}
    assert [t["model_name"] for t in got.values()] == ["seed-mlp", "seed-mlp", "wide-mlp",
                                                       "seed-mlp"]  # fmt: skip
    assert [t["request_id"] for t in got.values()] == ["rest-1"] * 3 + ["grpc-1"]
    assert [t["names"] for t in got.values()] == [HTTP, HTTP, HTTP, GRPC]
