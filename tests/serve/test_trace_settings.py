"""Triton's trace extension: ``/v2[/models/{m}]/trace/setting`` and gRPC ``TraceSetting``
(:mod:`torchplace.serve.trace_settings`), over the server's tracing."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from torchplace.errors import InputError, UnsupportedSettingError
from torchplace.serve.running import ServerThread
from torchplace.serve.trace_settings import SETTINGS, TraceSettings, from_json
from torchplace.serve.tracing import BatchRecord, Tracer

from .conftest import test_config


def _record(requests: int) -> BatchRecord:
    return BatchRecord("cpu#0", "cpu", [0.0] * requests, [1] * requests, None, 0.0, 1.0,
                       0.1, 0.5, 0.1)  # fmt: skip


def _tracer(tmp_path: Path, name: str = "m") -> Tracer:
    return Tracer(model=name, version="1", trace_file=tmp_path / f"{name}.json", otel=False)


def test_one_request_in_rate_is_recorded_until_the_count_is_spent(tmp_path: Path) -> None:
    tracer = _tracer(tmp_path)
    tracer.configure(on=True, rate=4, count=6)
    for _ in range(12):  # one request per batch: requests 4, 8 and 12 are one in 4
        if tracer.enabled:
            tracer.batch(_record(1))
    assert len(tracer._records) == 3
    assert tracer.count == 3
    tracer.batch(_record(5))  # holds request 16: recorded whole, and the count is spent
    assert (len(tracer._records), tracer.count, tracer.enabled) == (4, 0, False)


def test_off_records_nothing_and_a_tracer_without_a_sink_stays_off(tmp_path: Path) -> None:
    tracer = _tracer(tmp_path)
    tracer.configure(on=False)
    assert not tracer.enabled
    bare = Tracer(model="m", version="1", otel=False)
    bare.configure(on=True)
    assert not bare.can_record
    assert not bare.enabled


def test_model_settings_override_the_server_s_and_null_clears_them(tmp_path: Path) -> None:
    a, b = _tracer(tmp_path, "a"), _tracer(tmp_path, "b")
    found = {"a": [a], "b": [b]}
    settings = TraceSettings()
    got = settings.update({"trace_rate": ["10"]}, found)
    assert got["trace_rate"] == "10"
    assert (a.rate, b.rate) == (10, 10)
    got = settings.update({"trace_level": ["OFF"], "trace_rate": ["2"]}, found, "a")
    assert (got["trace_level"], got["trace_rate"]) == (["OFF"], "2")
    assert (a.enabled, a.rate, b.enabled, b.rate) == (False, 2, True, 10)
    assert settings.document(found, "b")["trace_level"] == ["TIMESTAMPS"]  # b follows the server
    settings.update({"trace_level": None, "trace_rate": None}, found, "a")
    assert (a.enabled, a.rate) == (True, 10)
    settings.update({"trace_rate": None}, found)  # the server's back to its start-up value
    assert (a.rate, b.rate) == (1, 1)


def test_a_model_loaded_later_gets_its_settings_and_the_others_keep_their_count(
    tmp_path: Path,
) -> None:
    a = _tracer(tmp_path, "a")
    settings = TraceSettings()
    settings.update({"trace_count": ["2"]}, {"a": [a]})
    a.batch(_record(1))
    assert a.count == 1
    reloaded = _tracer(tmp_path, "a")
    settings.adopt({"a": [a, reloaded]})
    assert (a.count, reloaded.count) == (1, 2)


@pytest.mark.parametrize(
    ("changes", "error", "words"),
    [
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, InputError,
         "Expect only one trace level 'OFF' is specified"),
        ({"trace_level": ["TENSORS"]}, InputError,
         "TENSORS records tensor data in Triton's trace file, which this server does not write"),
        ({"trace_level": ["SOMETIMES"]}, InputError, "unknown trace level 'SOMETIMES'"),
        ({"trace_rate": ["x"]}, InputError, "Unable to parse 'trace_rate', got: x"),
        ({"trace_rate": ["0"]}, InputError, "Expecting value >= 1"),
        ({"trace_count": ["-2"]}, InputError, "Unable to parse 'trace_count'. Expecting value >= -1"),
        ({"log_frequency": ["100"]}, InputError,
         "this server writes a Chrome trace, when it stops; send 0, or start it with "
         "--trace-format triton"),
        ({"log_frequency": ["-1"]}, InputError,
         "Unable to parse 'log_frequency'. Expecting value >= 0"),
        ({"trace_rate": ["1", "2"]}, InputError, "'trace_rate' takes one value, got 2"),
        ({"trace_file": ["x.json"]}, UnsupportedSettingError,
         "trace file location can not be updated through network protocol"),
        ({"trace_mode": ["opentelemetry"]}, UnsupportedSettingError, "trace mode can not be"),
        ({"trace_levels": ["OFF"]}, InputError, "unknown trace setting 'trace_levels'"),
    ],
)  # fmt: skip
def test_a_bad_setting_changes_nothing(
    tmp_path: Path, changes: dict[str, Any], error: type[Exception], words: str
) -> None:
    tracer = _tracer(tmp_path)
    settings = TraceSettings()
    with pytest.raises(error, match=words.replace("(", r"\(").replace("'", "'")):
        settings.update({"trace_rate": ["7"], **changes}, {"m": [tracer]})
    assert tracer.rate == 1
    assert settings.document({"m": [tracer]})["trace_rate"] == "1"


def test_rest_values_are_read_as_triton_s_strings() -> None:
    assert from_json({"trace_rate": "5", "trace_count": 3, "trace_level": None}) == {
        "trace_rate": ["5"], "trace_count": ["3"], "trace_level": None
    }  # fmt: skip
    with pytest.raises(InputError, match="'trace_level' must be an array of strings"):
        from_json({"trace_level": "TIMESTAMPS"})


# -- over the wire ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerThread, Path]]:
    pytest.importorskip("grpc")
    trace = tmp_path_factory.mktemp("trace") / "trace.json"
    config = test_config(model="seed-mlp", device="cpu", trace_file=trace, max_delay_ms=0.0)
    thread = ServerThread(config).start(timeout=120)
    yield thread, trace
    thread.stop()


def _call(port: int, method: str, path: str, body: object = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=None if body is None else orjson.dumps(body))
        response = conn.getresponse()
        raw = response.read()
        return response.status, orjson.loads(raw) if raw else None
    finally:
        conn.close()


def test_rest_and_grpc_read_and_change_the_settings_as_triton_s_clients_do(
    traced: tuple[ServerThread, Path],
) -> None:
    thread, trace = traced
    status, got = _call(thread.port, "GET", "/v2/trace/setting")
    assert status == 200
    assert list(got) == list(SETTINGS)
    assert got["trace_file"] == str(trace)
    assert (got["trace_level"], got["trace_rate"], got["trace_mode"]) == (
        ["TIMESTAMPS"], "1", "triton"
    )  # fmt: skip
    status, got = _call(thread.port, "POST", "/v2/models/seed-mlp/trace/setting",
                        {"trace_rate": "3", "trace_count": "2"})  # fmt: skip
    assert status == 200
    assert (got["trace_rate"], got["trace_count"]) == ("3", "2")
    status, error = _call(thread.port, "POST", "/v2/trace/setting", {"trace_file": "x.json"})
    assert status == 501
    assert "trace file location" in error["error"]
    status, _ = _call(thread.port, "GET", "/v2/models/nope/trace/setting")
    assert status == 404
    grpc_client = pytest.importorskip("tritonclient.grpc")
    client = grpc_client.InferenceServerClient(f"127.0.0.1:{thread.grpc_port}")
    try:
        answer = client.get_trace_settings(model_name="seed-mlp", as_json=True)
        assert answer["settings"]["trace_rate"] == {"value": ["3"]}
        server = client.get_trace_settings(as_json=True)["settings"]
        assert server["trace_rate"] == {"value": ["1"]}  # the model's own, not the server's
    finally:
        client.close()


def test_the_trace_file_holds_one_request_in_rate_up_to_the_count(
    traced: tuple[ServerThread, Path],
) -> None:
    """Rate 3 and count 2 (set in the test above, or here): 9 requests one at a time, the
    3rd and 6th recorded; the file, written at shutdown, holds those two."""
    thread, trace = traced
    _call(thread.port, "POST", "/v2/models/seed-mlp/trace/setting",
          {"trace_rate": "3", "trace_count": "2"})  # fmt: skip
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}
    for _ in range(9):
        assert _call(thread.port, "POST", "/v2/models/seed-mlp/infer", body)[0] == 200
    _, got = _call(thread.port, "GET", "/v2/models/seed-mlp/trace/setting")
    assert got["trace_count"] == "0"
    thread.stop()
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    requests = [e for e in events if e.get("name") == "request" and e.get("ph") == "b"]
    assert len(requests) == 2


def test_the_server_names_its_trace_file_and_a_model_its_own(tmp_path: Path) -> None:
    """With several models each version writes its own file beside --trace-file."""
    a, b = _tracer(tmp_path, "a"), _tracer(tmp_path, "b")
    settings = TraceSettings(tmp_path / "trace.json")
    assert settings.document({"a": [a], "b": [b]})["trace_file"] == str(tmp_path / "trace.json")
    assert settings.document({"a": [a], "b": [b]}, "b")["trace_file"] == str(tmp_path / "b.json")
