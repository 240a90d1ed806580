from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from torchplace.serve import tracing
from torchplace.serve.engine import Engine
from torchplace.serve.loader import load_model
from torchplace.serve.tracing import BatchRecord, Tracer, caller_context


def _record(now: float, **changes: Any) -> BatchRecord:
    """A batch of one one-row request on the CPU that finished at ``now``, as ``changes``
    say otherwise."""
    record = BatchRecord(
        replica="cpu#0",
        device="cpu",
        arrivals=[now - 0.003],
        rows=[1],
        statuses=None,
        started=now - 0.001,
        finished=now,
        h2d=0.0001,
        compute=0.0005,
        d2h=0.0002,
    )
    return record._replace(**changes)


def _batch(tracer: Tracer, requests: int = 2) -> None:
    now = time.perf_counter()
    tracer.batch(
        _record(
            now,
            replica="cuda:1#0",
            device="cuda:1",
            arrivals=[now - 0.003] * (requests - 1) + [now - 0.002],
            rows=[1] * (requests - 1) + [2],
            statuses=[200] * (requests - 1) + [507],
        )
    )


def test_disabled_by_default_records_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_otel_tracer", lambda: None)
    tracer = Tracer(model="m", version="1")
    assert not tracer.enabled
    _batch(tracer)  # the engine never calls it when disabled; if it does, nothing is kept
    assert [e for e in tracer.events() if e["ph"] != "M"] == []
    assert tracer.write() is None


def test_chrome_trace_has_batch_stages_and_requests(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    tracer = Tracer(model="m", version="1", trace_file=path, otel=False)
    assert tracer.enabled
    _batch(tracer, requests=3)
    tracer.close()
    document = json.loads(path.read_text())
    events = document["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in slices] == ["batch", "h2d", "compute", "d2h"]
    batch = slices[0]
    assert batch["args"] == {"rows": 4, "device": "cuda:1"}
    for stage in slices[1:]:
        assert batch["ts"] <= stage["ts"]
        assert stage["ts"] + stage["dur"] <= batch["ts"] + batch["dur"] + 1
    begins = [e for e in events if e["ph"] == "b" and e["name"] == "request"]
    ends = [e for e in events if e["ph"] == "e" and e["name"] == "request"]
    assert len(begins) == len(ends) == 3
    assert begins[-1]["args"]["status"] == 507
    assert {e["id"] for e in begins} == {e["id"] for e in ends}
    names = [e for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
    assert [e["args"]["name"] for e in names] == ["replica cuda:1#0"]


def test_event_buffer_is_bounded(tmp_path: Path) -> None:
    tracer = Tracer(
        model="m", version="1", trace_file=tmp_path / "t.json", otel=False, max_events=20
    )
    for _ in range(10):
        _batch(tracer)
    assert len(tracer.events()) <= 20
    assert tracer.dropped > 0


def test_opentelemetry_spans_per_request_and_stage() -> None:
    # OpenTelemetry is an extra (torchplace[trace]): only these tests need it
    tracer, exporter = _memory_tracer()
    from opentelemetry import trace

    _batch(tracer, requests=2)
    spans = exporter.get_finished_spans()
    requests = [s for s in spans if s.name == "torchplace.infer"]
    assert len(requests) == 2
    for span in requests:
        assert span.attributes is not None
        assert span.attributes["torchplace.device"] == "cuda:1"
        assert span.attributes["torchplace.queue_seconds"] > 0
        assert span.start_time is not None
        assert span.end_time is not None
        assert span.start_time < span.end_time
    assert requests[0].status.status_code == trace.StatusCode.UNSET
    assert requests[1].status.status_code == trace.StatusCode.ERROR
    (batch,) = [s for s in spans if s.name == "torchplace.batch"]
    assert {link.context.span_id for link in batch.links} == {s.context.span_id for s in requests}
    stages = [
        s for s in spans if s.parent is not None and s.parent.span_id == batch.context.span_id
    ]
    assert [s.name for s in stages] == ["h2d", "compute", "d2h"]


def test_opentelemetry_is_used_only_with_a_real_provider() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):
        assert tracing._otel_tracer() is None
        assert not Tracer(model="m", version="1").enabled
    else:  # some code in this process installed an SDK provider
        assert tracing._otel_tracer() is not None


def test_a_host_wait_for_the_device_is_a_sync_slice_ending_with_the_d2h() -> None:
    tracer = Tracer(model="m", version="1", trace_file=Path("unused.json"), otel=False)
    now = time.perf_counter()
    tracer.batch(
        _record(now, replica="cuda:0#0", device="cuda:0", started=now - 0.002, sync=0.0006)
    )
    slices = {e["name"]: e for e in tracer.events() if e["ph"] == "X"}
    assert list(slices) == ["batch", "h2d", "compute", "d2h", "sync"]
    d2h, sync = slices["d2h"], slices["sync"]
    assert sync["ts"] + sync["dur"] == pytest.approx(d2h["ts"] + d2h["dur"], abs=0.01)
    assert sync["dur"] == pytest.approx(600.0, abs=0.01)  # microseconds


def _memory_tracer() -> tuple[Tracer, Any]:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = Tracer(model="m", version="1", otel=False)
    tracer._otel = provider.get_tracer("test")
    tracer.enabled = True
    return tracer, exporter


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def _caller(flags: str = "01") -> Any:
    context = caller_context({"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-{flags}"})
    assert context is not None
    return context


def test_caller_context_from_a_traceparent_header() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry import trace

    span = trace.get_current_span(_caller()).get_span_context()
    assert (f"{span.trace_id:032x}", f"{span.span_id:016x}") == (TRACE_ID, CLIENT_SPAN)
    assert span.is_remote
    assert caller_context(None) is None
    assert caller_context({"content-type": "application/json"}) is None
    assert caller_context({"traceparent": "not-a-trace-context"}) is None


def test_caller_context_from_the_headers_ray_serve_hands_a_replica() -> None:
    pytest.importorskip("opentelemetry.sdk")
    datastructures = pytest.importorskip("starlette.datastructures")
    from opentelemetry import trace

    raw = [(b"traceparent", f"00-{TRACE_ID}-{CLIENT_SPAN}-01".encode())]
    context = caller_context(datastructures.Headers(raw=raw))
    span = trace.get_current_span(context).get_span_context()
    assert f"{span.span_id:016x}" == CLIENT_SPAN


def test_caller_context_prefers_the_current_span_over_the_header() -> None:
    tracer, _ = _memory_tracer()
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry import trace

    with tracer._otel.start_as_current_span("serve.replica") as current:
        context = caller_context({"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
        assert trace.get_current_span(context) is current


def test_request_spans_join_their_callers_trace_with_their_stages() -> None:
    tracer, exporter = _memory_tracer()
    now = time.perf_counter()
    tracer.batch(
        _record(now, arrivals=[now - 0.003, now - 0.002], rows=[1, 1], parents=[_caller(), None])
    )
    spans = exporter.get_finished_spans()
    joined, alone = [s for s in spans if s.name == "torchplace.infer"]
    assert joined.parent is not None
    assert f"{joined.parent.span_id:016x}" == CLIENT_SPAN
    assert f"{joined.context.trace_id:032x}" == TRACE_ID
    stages = [
        s for s in spans if s.parent is not None and s.parent.span_id == joined.context.span_id
    ]
    assert [s.name for s in stages] == ["queue", "h2d", "compute", "d2h"]
    assert {s.context.trace_id for s in stages} == {joined.context.trace_id}
    for stage in stages:
        assert joined.start_time <= stage.start_time <= stage.end_time <= joined.end_time
    assert alone.parent is None  # no caller: a root span, its stages under the batch span
    assert not [
        s for s in spans if s.parent is not None and s.parent.span_id == alone.context.span_id
    ]


def test_an_unsampled_caller_records_no_request_spans() -> None:
    tracer, exporter = _memory_tracer()
    now = time.perf_counter()
    tracer.batch(_record(now, arrivals=[now - 0.002], parents=[_caller(flags="00")]))
    assert [s.name for s in exporter.get_finished_spans() if s.name != "torchplace.batch"] == [
        "h2d",
        "compute",
        "d2h",
    ]


def test_the_engine_carries_the_callers_context_to_the_request_spans() -> None:
    tracer, exporter = _memory_tracer()

    async def main() -> None:
        engine = Engine(load_model("seed-mlp"), [torch.device("cpu")], otel=False)
        engine.tracer._otel, engine.tracer.enabled = tracer._otel, True
        await engine.start()

        async def traced() -> None:
            tracing.CALLER.set(_caller())
            await engine.infer({"input": np.zeros((1, 8), np.float32)})

        await asyncio.gather(traced(), engine.infer({"input": np.ones((1, 8), np.float32)}))
        await engine.stop()

    asyncio.run(main())
    requests = [s for s in exporter.get_finished_spans() if s.name == "torchplace.infer"]
    parents = sorted(f"{s.parent.span_id:016x}" if s.parent else "" for s in requests)
    assert parents == ["", CLIENT_SPAN]


def test_a_traceparent_header_joins_the_request_spans_to_the_callers_trace() -> None:
    """Straight over HTTP (no Ray, no instrumentation around the server): a request that
    carries a W3C traceparent gets its spans in that trace; one without starts its own."""
    import urllib.request

    from torchplace.serve.config import ServeConfig
    from torchplace.serve.running import ServerThread

    tracer, exporter = _memory_tracer()
    engine = Engine(load_model("seed-mlp"), [torch.device("cpu")], otel=False)
    engine.tracer._otel, engine.tracer.enabled = tracer._otel, True
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}

    def post(url: str, headers: dict[str, str]) -> int:
        data = json.dumps(body).encode()
        headers = {"content-type": "application/json", **headers}
        with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=30) as r:
            return int(r.status)

    with ServerThread(ServeConfig(port=0, grpc_port=0), engine=engine) as server:
        url = f"{server.url}/v2/models/seed-mlp/infer"
        assert post(url, {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}) == 200
        assert post(url, {}) == 200
    requests = [s for s in exporter.get_finished_spans() if s.name == "torchplace.infer"]
    assert len(requests) == 2
    joined = [s for s in requests if s.parent is not None]
    assert len(joined) == 1
    assert f"{joined[0].context.trace_id:032x}" == TRACE_ID
    assert f"{joined[0].parent.span_id:016x}" == CLIENT_SPAN
