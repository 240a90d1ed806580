"""Models loaded, reloaded and unloaded while the server serves (a real server, real requests)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from torchplace.serve import reload
from torchplace.serve.memory import MemoryCheck, trim_host_heap
from torchplace.serve.registry import Registry
from torchplace.serve.reload import ModelControl
from torchplace.serve.running import ServerThread

from .conftest import FakeEngine, eventually, test_config
from .engine_helpers import save_exported
from .repository_helpers import call, expected, infer_body, write_model, write_version

BODY = orjson.dumps(infer_body())


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    for name in ("a", "b", "c"):
        write_model(tmp_path, name)
    return tmp_path


@pytest.fixture
def server(repository: Path) -> Iterator[ServerThread]:
    config = test_config(
        device="cpu",
        model_repository=repository,
        model_control_mode="explicit",
        load_models=("*",),
    )  # gRPC on any free port too
    with ServerThread(config) as thread:
        yield thread


@dataclass
class Answer:
    sent: float
    done: float
    status: int
    version: str
    output: np.ndarray | None
    error: str


class Load:
    """Bounded concurrent load: ``per_model`` threads per model, each one request at a time."""

    def __init__(self, port: int, models: tuple[str, ...], per_model: int = 2) -> None:
        self.port = port
        self.stop = threading.Event()
        self.answers: dict[tuple[str, int], list[Answer]] = {}
        self.threads = [
            threading.Thread(target=self._run, args=(m, i), daemon=True)
            for m in models
            for i in range(per_model)
        ]

    def _run(self, model: str, index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        log = self.answers.setdefault((model, index), [])
        deadline = time.monotonic() + 60.0  # bounded in time and count
        while not self.stop.is_set() and time.monotonic() < deadline and len(log) < 5000:
            sent = time.monotonic()
            conn.request("POST", f"/v2/models/{model}/infer", body=BODY,
                         headers={"Content-Type": "application/json"})  # fmt: skip
            response = conn.getresponse()
            doc = orjson.loads(response.read())
            done = time.monotonic()
            if response.status == 200:
                out = np.asarray(doc["outputs"][0]["data"], np.float32).reshape(1, 2)
                log.append(Answer(sent, done, 200, doc["model_version"], out, ""))
            else:
                log.append(Answer(sent, done, response.status, "", None, doc["error"]))
        conn.close()

    def of(self, model: str) -> list[Answer]:
        return sorted(
            (a for (m, _), log in self.answers.items() if m == model for a in log),
            key=lambda a: a.done,
        )

    def wait_for(self, model: str, count: int, version: str = "") -> None:
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            if sum(1 for a in self.of(model) if not version or a.version == version) >= count:
                return
            time.sleep(0.01)
        raise AssertionError(f"{model} did not get {count} answers of version {version!r}")

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def test_three_models_reload_and_unload_under_load(server: ServerThread, repository: Path) -> None:
    port = server.port
    with Load(port, ("a", "b", "c")) as load:
        for model in ("a", "b", "c"):
            load.wait_for(model, 30)
        write_version(repository, "a", 2, scale=2.0)
        status, body = call(port, "POST", "/v2/repository/models/a/load", b"{}")
        assert status == 200, body
        status, body = call(port, "POST", "/v2/repository/models/c/unload", b"{}")
        assert status == 200, body
        load.wait_for("a", 30, version="2")
        load.wait_for("b", len(load.of("b")) + 30)
    a, b, c = load.of("a"), load.of("b"), load.of("c")
    # zero failed requests on the models that stay
    assert all(x.status == 200 for x in a), [x.error for x in a if x.status != 200][:3]
    assert all(x.status == 200 and x.version == "1" for x in b)
    # the reloaded model's answers switch at one point in time: on each connection version 1
    # then version 2, and no request sent after any version 2 answer arrived got version 1
    # (requests admitted before the switch finish on version 1, so across connections a late
    # v1 answer may complete just after the first v2 one: completion order is per connection)
    for log in _per_connection(load, "a"):
        versions = [x.version for x in log]
        assert versions == sorted(versions), versions  # "1"... then "2"...
    old = [x for x in a if x.version == "1"]
    new = [x for x in a if x.version == "2"]
    assert old
    assert new
    assert max(x.sent for x in old) < min(x.done for x in new)
    for x in old:
        np.testing.assert_allclose(x.output, expected(1.0), rtol=1e-5)  # type: ignore[arg-type]
    for x in new:
        np.testing.assert_allclose(x.output, expected(2.0), rtol=1e-5)  # type: ignore[arg-type]
    # the unloaded model: requests answered (drained), then a clear 404, nothing else
    for log in _per_connection(load, "c"):
        statuses = [x.status for x in log]
        assert statuses == sorted(statuses), statuses
        assert set(statuses) <= {200, 404}, statuses
    served = [x for x in c if x.status == 200]
    gone = [x for x in c if x.status == 404]
    assert served
    assert gone
    assert max(x.sent for x in served) < min(x.done for x in gone)
    assert (
        "Request for unknown model: 'c' has no available versions; this server serves 'a', 'b'"
        in gone[-1].error
    )
    switch = len(old)
    first_404 = len(served)
    print(f"a: {switch} answers of v1 then {len(new)} of v2; b: {len(b)}; c: {first_404} then 404")


def _per_connection(load: Load, model: str) -> list[list[Answer]]:
    return [log for (m, _), log in load.answers.items() if m == model]


def test_a_reload_with_bad_weights_leaves_the_old_version_serving(
    server: ServerThread, repository: Path
) -> None:
    port = server.port
    folder = repository / "a" / "2"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    status, body = call(port, "POST", "/v2/repository/models/a/load", b"{}")
    assert status == 400
    assert "model.safetensors" in body["error"]
    status, body = call(port, "POST", "/v2/models/a/infer", BODY)
    assert status == 200
    assert body["model_version"] == "1"
    _, index = call(port, "POST", "/v2/repository/index", b"{}")
    states = {(e["name"], e["version"]): e for e in index}
    assert states[("a", "1")]["state"] == "READY"
    assert states[("a", "2")]["state"] == "UNAVAILABLE"
    assert "model.safetensors" in states[("a", "2")]["reason"]


def test_a_failed_dry_run_leaves_the_old_version_serving(
    server: ServerThread, repository: Path
) -> None:
    config = 'source = "seed-mlp"\noutputs = ["output:FP32:-1,3"]\n'  # the model gives 2
    (repository / "a" / "config.toml").write_text(config)
    write_version(repository, "a", 2, scale=2.0)
    status, body = call(server.port, "POST", "/v2/repository/models/a/load", b"{}")
    assert status == 400, body
    assert "declared [3]" in body["error"]
    status, body = call(server.port, "POST", "/v2/models/a/infer", BODY)
    assert status == 200
    assert body["model_version"] == "1"


def test_load_with_an_inline_config_and_specific_versions(
    server: ServerThread, repository: Path
) -> None:
    write_version(repository, "b", 2, scale=2.0)
    config = orjson.dumps({"max_batch_size": 4, "version_policy": {"all": {}}}).decode()
    body = orjson.dumps({"parameters": {"config": config}})
    status, answer = call(server.port, "POST", "/v2/repository/models/b/load", body)
    assert status == 200, answer
    _, doc = call(server.port, "GET", "/v2/models/b/versions/1/config")
    assert doc["max_batch_size"] == 4
    for version, scale in (("1", 1.0), ("2", 2.0)):
        status, out = call(server.port, "POST", f"/v2/models/b/versions/{version}/infer", BODY)
        assert status == 200
        assert out["model_version"] == version
        got = np.asarray(out["outputs"][0]["data"], np.float32).reshape(1, 2)
        np.testing.assert_allclose(got, expected(scale), rtol=1e-5)
    _, latest = call(server.port, "POST", "/v2/models/b/infer", BODY)
    assert latest["model_version"] == "2"
    for path in ("/v2/models/b", "/v2/models/b/versions/1"):  # every version served
        assert call(server.port, "GET", path)[1]["versions"] == ["1", "2"]
    grpcclient = pytest.importorskip("tritonclient.grpc")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    assert list(client.get_model_metadata("b", "1").versions) == ["1", "2"]
    client.close()


def test_the_config_states_the_model_s_version_policy_and_survives_a_round_trip(
    server: ServerThread, repository: Path
) -> None:
    """A config read back and sent with a load (``load_model(name, config=get_model_config())``)
    keeps the model's policy: it named this one version before, which pinned the model to it."""
    write_version(repository, "b", 2, scale=2.0)
    config = orjson.dumps({"version_policy": {"latest": {"num_versions": 1}}}).decode()
    body = orjson.dumps({"parameters": {"config": config}})
    assert call(server.port, "POST", "/v2/repository/models/b/load", body)[0] == 200
    _, doc = call(server.port, "GET", "/v2/models/b/config")
    assert doc["version_policy"] == {"latest": {"num_versions": 1}}
    grpcclient = pytest.importorskip("tritonclient.grpc")
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    as_json = client.get_model_config("b", as_json=True)["config"]
    assert as_json["version_policy"] == {"latest": {"num_versions": 1}}
    client.close()
    write_version(repository, "b", 3, scale=3.0)  # a newer version appears; the doc goes back
    body = orjson.dumps({"parameters": {"config": orjson.dumps(doc).decode()}})
    assert call(server.port, "POST", "/v2/repository/models/b/load", body)[0] == 200
    assert call(server.port, "POST", "/v2/models/b/infer", BODY)[1]["model_version"] == "3"


def test_model_control_as_triton_s_examples_call_it(server: ServerThread) -> None:
    """What simple_http_model_control.py and Triton's lifecycle tests send."""
    port = server.port
    load = "/v2/repository/models/{}/load"
    config = {"parameters": {"config": '{"max_batch_size":"16"}'}}  # an int64 as a string
    assert call(port, "POST", load.format("a"), orjson.dumps(config))[0] == 200
    assert call(port, "GET", "/v2/models/a/config")[1]["max_batch_size"] == 16
    for name in ("c", "c", "never-loaded"):  # unloading what is not loaded changes nothing
        assert call(port, "POST", f"/v2/repository/models/{name}/unload", b"")[0] == 200
    files = {"parameters": {"config": "{}", "file:1/model.safetensors": "YQ=="}}
    bad = {"parameters": {"config": '{"dynamic_batching": 5}'}}
    for name, body, message in (
        ("a", files, "model files sent with a load request are not supported"),
        ("a", bad, "dynamic_batching must be an object"),
    ):
        status, answer = call(port, "POST", load.format(name), orjson.dumps(body))
        assert status == 400, answer
        assert message in answer["error"]
    status, answer = call(port, "POST", "/v2/repository/index", b'{"ready": "yes"}')
    assert status == 400
    assert "Invalid value for 'ready'" in answer["error"]
    status, answer = call(port, "POST", "/v2/repository/index", b'{"ready": [[true]]}')
    assert (status, answer["error"]) == (
        400,
        "Invalid value for 'ready': expected a boolean, got [[true]]",  # as sent, not Python's
    )
    assert call(port, "GET", "/v2/models")[1] == {"models": ["a", "b"]}


def test_the_engines_know_when_other_models_share_their_loop(server: ServerThread) -> None:
    """A full batch runs on the event loop only where one model serves (it would hold up the
    others' requests): every engine is told as models come and go."""
    assert server.app is not None
    registry = server.app.registry

    def shared() -> dict[str, bool]:
        return {h.name: h.engine.loop_shared for h in registry.handles()}  # type: ignore[attr-defined]

    assert shared() == {"a": True, "b": True, "c": True}
    for name in ("b", "c"):
        assert call(server.port, "POST", f"/v2/repository/models/{name}/unload", b"")[0] == 200
    assert shared() == {"a": False}
    assert call(server.port, "POST", "/v2/repository/models/b/load", b"")[0] == 200
    assert shared() == {"a": True, "b": True}


def test_an_unload_hands_the_freed_host_memory_back(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """glibc kept what a retired version's replicas freed in its arenas: the server's resident
    size stayed at its loaded size after an unload. The heap is trimmed once the version's
    engines have stopped."""
    trims: list[int] = []
    monkeypatch.setattr(reload, "trim_host_heap", lambda: trims.append(len(trims)) or True)
    assert call(server.port, "POST", "/v2/repository/models/c/unload", b"")[0] == 200
    assert trims == [0]


def test_the_host_heap_is_trimmed_where_glibc_can() -> None:
    import platform

    trimmed = trim_host_heap()
    assert trimmed is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")


def test_metrics_and_statistics_cover_every_model(server: ServerThread) -> None:
    for model in ("a", "b", "c"):
        assert call(server.port, "POST", f"/v2/models/{model}/infer", BODY)[0] == 200
    _, stats = call(server.port, "GET", "/v2/models/stats")
    assert sorted(s["name"] for s in stats["model_stats"]) == ["a", "b", "c"]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = families["torchplace_requests"]
    models = {s.labels["model"] for s in requests.samples if s.labels.get("status") == "200"}
    assert models == {"a", "b", "c"}
    assert text.count("# TYPE torchplace_requests_total counter") <= 1


def test_unknown_model_lists_the_known_ones(server: ServerThread) -> None:
    status, body = call(server.port, "POST", "/v2/models/zz/infer", BODY)
    assert status == 404
    assert (
        body["error"]
        == "Request for unknown model: 'zz' is not found; this server serves 'a', 'b', 'c'"
    )
    status, body = call(server.port, "GET", "/v2/models/a/versions/9/ready")
    assert status == 404
    assert "available: '1'" in body["error"]


def test_server_metadata_lists_the_repository_extension(server: ServerThread) -> None:
    _, meta = call(server.port, "GET", "/v2")
    assert "model_repository" in meta["extensions"]


def test_kserve_agent_calls_as_it_sends_them(tmp_path: Path) -> None:
    """KServe's model puller (pkg/agent/puller.go) downloads a model into MODEL_DIR/NAME, then
    POSTs '{}' as application/json to /v2/repository/models/NAME/load; to remove one it
    deletes the directory first, then POSTs '{}' to .../unload. Both must answer 200."""
    import shutil

    import torch

    from torchplace.models import build_model

    config = test_config(
        device="cpu", model_repository=tmp_path, model_control_mode="explicit", grpc_port=0
    )
    with ServerThread(config) as thread:
        port = thread.port
        folder = tmp_path / "iris"  # what the puller downloaded: one exported program
        folder.mkdir()
        save_exported(folder / "model.pt2", build_model("seed-mlp"), torch.zeros(2, 8))
        status, body = call(port, "POST", "/v2/repository/models/iris/load", b"{}")
        assert status == 200, body
        status, out = call(port, "POST", "/v2/models/iris/infer", BODY)
        assert status == 200
        got = np.asarray(out["outputs"][0]["data"], np.float32).reshape(1, 2)
        np.testing.assert_allclose(got, expected(1.0), rtol=1e-5)
        shutil.rmtree(folder)
        status, body = call(port, "POST", "/v2/repository/models/iris/unload", b"{}")
        assert status == 200, body
        status, body = call(port, "POST", "/v2/models/iris/infer", BODY)
        assert status == 404


def test_load_and_unload_are_refused_in_mode_none(repository: Path) -> None:
    config = test_config(device="cpu", model_repository=repository, grpc_port=0)
    with ServerThread(config) as thread:
        _, index = call(thread.port, "POST", "/v2/repository/index", b"")
        assert [(e["name"], e["state"]) for e in index] == [
            ("a", "READY"), ("b", "READY"), ("c", "READY")
        ]  # fmt: skip
        for action in ("load", "unload"):
            status, body = call(thread.port, "POST", f"/v2/repository/models/a/{action}")
            assert status == 403
            assert "not allowed in model control mode 'none'" in body["error"]
            assert body["error"].startswith(  # Triton's words, which it says in mode none too
                "explicit model load / unload is not allowed if polling is enabled"
            )
            assert "--model-control-mode explicit" in body["error"]


def test_poll_mode_loads_new_models_and_unloads_removed_ones(repository: Path) -> None:
    import shutil

    config = test_config(
        device="cpu",
        model_repository=repository,
        model_control_mode="poll",
        repository_poll_secs=0.1,
        grpc_port=0,
    )

    def wait(path: str, want: int) -> None:
        deadline = time.monotonic() + 30
        while call(thread.port, "POST", path, BODY)[0] != want:
            assert time.monotonic() < deadline, f"{path} never answered {want}"
            time.sleep(0.05)

    with ServerThread(config) as thread:
        write_model(repository, "d", scale=3.0)
        wait("/v2/models/d/infer", 200)
        write_version(repository, "d", 2, scale=2.0)
        wait("/v2/models/d/versions/2/infer", 200)
        shutil.rmtree(repository / "b")
        wait("/v2/models/b/infer", 404)
        status, body = call(thread.port, "POST", "/v2/repository/models/a/load", b"{}")
        assert status == 403  # Triton: no explicit load while polling, in its words
        assert "explicit model load / unload is not allowed if polling is enabled" in body["error"]


ROW_SUM_PBTXT = """platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.[a-z_]+` is deprecated")
def test_poll_mode_reloads_an_edited_config_pbtxt_and_keeps_serving_through_a_bad_edit(
    tmp_path: Path,
) -> None:
    """In mode poll an edit of a Triton model's config.pbtxt is picked up (its fingerprint
    holds the file's mtime and size): a valid edit reloads the model with it; an edit that
    does not parse is a failed load, which changes nothing that serves (Triton keeps the loaded
    model too): the old version answers, the index shows the reason beside it, and the next
    valid edit loads."""
    import torch

    from .variable_model import RowSum

    (tmp_path / "m" / "1").mkdir(parents=True)
    torch.jit.save(torch.jit.script(RowSum()), str(tmp_path / "m" / "1" / "model.pt"))
    pbtxt = tmp_path / "m" / "config.pbtxt"
    pbtxt.write_text(ROW_SUM_PBTXT)
    config = test_config(device="cpu", model_repository=tmp_path, model_control_mode="poll",
                         repository_poll_secs=0.1, grpc_port=0)  # fmt: skip

    def infer(thread: ServerThread, length: int) -> tuple[int, Any]:
        x = np.arange(2 * length, dtype=np.float32).reshape(2, length)
        entry = {"name": "INPUT__0", "datatype": "FP32", "shape": [2, length],
                 "data": x.ravel().tolist()}  # fmt: skip
        body = orjson.dumps({"inputs": [entry]})
        return call(thread.port, "POST", "/v2/models/m/infer", body)

    def index(thread: ServerThread) -> list[dict[str, str]]:
        entries: list[dict[str, str]] = call(thread.port, "POST", "/v2/repository/index", b"{}")[1]
        return entries

    def dims(thread: ServerThread) -> list[int]:
        return list(call(thread.port, "GET", "/v2/models/m/config")[1]["input"][0]["dims"])

    def until(condition: Any, what: str) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    with ServerThread(config) as thread:
        assert dims(thread) == [4]
        assert infer(thread, 4)[0] == 200
        assert infer(thread, 6)[0] == 400  # dims [4]
        # a bad edit: the load fails, version 1 serves on and the index says why
        pbtxt.write_text(ROW_SUM_PBTXT.replace("max_batch_size", "max_batch_sise"))
        until(lambda: any(e["state"] == "UNAVAILABLE" for e in index(thread)), "no failed load")
        failed = [e for e in index(thread) if e["state"] == "UNAVAILABLE"]
        assert "config.pbtxt: line 2" in failed[0]["reason"]
        assert "max_batch_sise" in failed[0]["reason"]
        assert {"name": "m", "version": "1", "state": "READY", "reason": ""} in index(thread)
        status, answer = infer(thread, 4)
        assert status == 200, answer
        assert dims(thread) == [4]
        # a valid edit is loaded: a variable dimension now, and the failure is forgotten
        pbtxt.write_text(ROW_SUM_PBTXT.replace("dims: [ 4 ]", "dims: [ -1 ]"))
        until(lambda: dims(thread) == [-1], "the edited config.pbtxt was not loaded")
        assert index(thread) == [{"name": "m", "version": "1", "state": "READY", "reason": ""}]
        status, answer = infer(thread, 6)
        assert status == 200, answer
        assert answer["outputs"][0]["data"] == [15.0, 51.0]  # each row of 0..11 summed


def test_one_bad_model_config_does_not_stop_the_others(repository: Path) -> None:
    (repository / "b" / "config.toml").write_text('source = "seed-mlp"\nreplica = 2\n')
    config = test_config(device="cpu", model_repository=repository, grpc_port=0)
    with ServerThread(config) as thread:
        assert call(thread.port, "POST", "/v2/models/a/infer", BODY)[0] == 200
        assert call(thread.port, "POST", "/v2/models/c/infer", BODY)[0] == 200
        _, index = call(thread.port, "POST", "/v2/repository/index", b"{}")
        bad = [e for e in index if e["name"] == "b"]
        assert bad[0]["state"] == "UNAVAILABLE"
        reason = bad[0]["reason"]
        assert str(repository / "b" / "config.toml") in reason
        assert "'replica' is not a setting" in reason
        assert "replicas" in reason


def test_repository_twins_over_grpc(server: ServerThread, repository: Path) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {(m["name"], m["version"], m["state"]) for m in index} == {
        ("a", "1", "READY"), ("b", "1", "READY"), ("c", "1", "READY")
    }  # fmt: skip
    write_version(repository, "a", 2, scale=2.0)
    client.load_model("a")
    x = grpcclient.InferInput("input", [1, 8], "FP32")
    x.set_data_from_numpy(np.linspace(-1.0, 1.0, 8, dtype=np.float32).reshape(1, 8))
    result = client.infer("a", [x])
    assert result.get_response().model_version == "2"
    np.testing.assert_allclose(result.as_numpy("output"), expected(2.0), rtol=1e-5)
    assert client.get_model_metadata("a").versions == ["2"]
    client.load_model("b", config=orjson.dumps({"max_batch_size": 2}).decode())
    assert client.get_model_config("b", as_json=True)["config"]["max_batch_size"] == 2
    assert (
        "model 'c' version '1'"
        in call(server.port, "GET", "/v2/openapi.json")[1]["info"]["description"]
    )
    client.unload_model("c")
    assert not client.is_model_ready("c")  # not loaded: not ready, not an error
    described = call(server.port, "GET", "/v2/openapi.json")[1]["info"]["description"]
    assert "model 'c'" not in described  # the document follows the served set
    assert "model 'a' version '2'" in described
    with pytest.raises(InferenceServerException) as caught:
        client.infer("c", [x])
    assert "StatusCode.NOT_FOUND" in str(caught.value.status())
    client.unload_model("c")  # again: nothing to do, no error
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("b", config='{"version_policy": {"specific": {"versions": ["x"]}}}')
    assert "StatusCode.INVALID_ARGUMENT" in str(caught.value.status())
    with pytest.raises(InferenceServerException, match="failed to load"):
        client.load_model(f"../{repository.name}/a")  # refused, and not listed afterwards
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("nope")
    assert "StatusCode.INVALID_ARGUMENT" in str(caught.value.status())
    assert "model 'nope' is not in the repository" in caught.value.message()
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {m["name"] for m in index} == {"a", "b", "c"}
    ready = {(m["name"], m["version"]) for m in index if m["state"] == "READY"}
    assert ready == {("a", "2"), ("b", "1")}
    assert {"name": "c", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in index


def test_repeated_model_flags_serve_several_models_on_one_device() -> None:
    config = test_config(device="cpu", model="seed-mlp", models=("wide-mlp",), grpc_port=0)
    with ServerThread(config) as thread:
        status, out = call(thread.port, "POST", "/v2/models/seed-mlp/infer", BODY)
        assert status == 200
        assert out["model_name"] == "seed-mlp"
        wide = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 512],
                            "data": [0.1] * 512}]}  # fmt: skip
        status, out = call(thread.port, "POST", "/v2/models/wide-mlp/infer", orjson.dumps(wide))
        assert status == 200
        assert out["outputs"][0]["shape"] == [1, 512]
        described = call(thread.port, "GET", "/v2/openapi.json")[1]["info"]["description"]
        assert "model 'seed-mlp' version '1', model 'wide-mlp' version '1'" in described
        assert thread.app is not None
        devices = {str(r.device) for h in thread.app.registry.handles() for r in h.engine.replicas}  # type: ignore[attr-defined]
        assert devices == {"cpu"}


def test_several_models_write_a_trace_file_each(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    config = test_config(
        device="cpu", model="seed-mlp", models=("wide-mlp",), grpc_port=0, trace_file=trace
    )
    with ServerThread(config) as thread:
        assert call(thread.port, "POST", "/v2/models/seed-mlp/infer", BODY)[0] == 200
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "trace.seed-mlp.1.json",
        "trace.wide-mlp.1.json",
    ]
    events = orjson.loads((tmp_path / "trace.seed-mlp.1.json").read_bytes())
    assert events


def test_an_invalid_value_names_the_file_and_the_field(
    server: ServerThread, repository: Path
) -> None:
    (repository / "a" / "config.toml").write_text('source = "seed-mlp"\nreplicas = 0\n')
    status, body = call(server.port, "POST", "/v2/repository/models/a/load", b"{}")
    assert status == 400
    assert body["error"] == (
        f"failed to load 'a': {repository / 'a' / 'config.toml'}: replicas = 0 is invalid; "
        "give an integer >= 1"
    )
    assert call(server.port, "POST", "/v2/models/a/infer", BODY)[0] == 200


@pytest.mark.parametrize("answered", [False, True])
def test_stop_ends_a_retire_and_releases_the_old_version(tmp_path: Path, answered: bool) -> None:
    """An unload waits for a request when the server stops: answered within stop's timeout,
    the unload finishes; never answered, stop() cuts the wait short. Either way the old
    version's engine is stopped, its memory released, and no task is left pending (asyncio
    would say "Task was destroyed but it is pending!")."""
    config = test_config(
        model_repository=tmp_path, model_control_mode="explicit", drain_timeout_s=3600.0
    )

    async def scenario() -> tuple[FakeEngine, MemoryCheck, set[asyncio.Task[Any]]]:
        engine = FakeEngine()
        control = ModelControl(Registry(), config, engine=engine)
        await control.start()
        handle = control.registry.get("seed-mlp")
        handle.views["memory"] = "seed-mlp/1#0"
        control.memory.reserve("seed-mlp/1#0", {"cpu": 1024})
        handle.enter()  # a request that is never answered
        unload = asyncio.ensure_future(control.unload("seed-mlp"))
        await eventually(lambda: not control.registry.names())
        assert not unload.done()  # the retire waits for the request
        if answered:
            asyncio.get_running_loop().call_later(0.01, handle.leave)
        await asyncio.wait_for(control.stop(5.0 if answered else 0.0), 10)
        assert unload.done()
        assert unload.cancelled() is not answered  # an unload cut short says so to its caller
        with contextlib.suppress(asyncio.CancelledError):
            await unload
        left = asyncio.all_tasks() - {asyncio.current_task()}
        return engine, control.memory, left

    engine, memory, left = asyncio.run(scenario())
    assert engine.stopped
    assert memory.reserved == {}
    assert left == set()
