"""A fourth red-team pass: state that changes under concurrent clients (loads racing each other
for the memory budget) and names that a route carried cut short on their way in.

Each test states what the clients did and what the server must do about it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest

from torchplace.errors import InsufficientMemoryError
from torchplace.serve.app import App, _caller
from torchplace.serve.loader import load_model
from torchplace.serve.memory import MemoryCheck, estimate
from torchplace.serve.running import ServerThread

from .conftest import answer_of, exchange, raw_request, seed_input, test_config
from .repository_helpers import infer_body, write_model

_GOOD = orjson.dumps({"inputs": [seed_input()]})


def _app(server: ServerThread) -> App:
    assert server.app is not None, "the server is not started"
    return server.app


# -- loads racing each other for the memory budget ---------------------------------------------
@pytest.fixture
def slow_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every engine takes a moment longer to start (its replicas placed and warmed), so that
    loads sent together are all between their memory check and their start at once."""
    from torchplace.serve.engine import Engine

    real = Engine.start

    async def start(self: Engine) -> None:
        await asyncio.sleep(0.5)
        await real(self)

    monkeypatch.setattr(Engine, "start", start)


def test_loads_sent_together_cannot_overrun_the_memory_budget(
    tmp_path: Path, slow_start: None
) -> None:
    """Three loads of different models, each fitting the budget alone, only one of them with
    the others: each was checked against what the loaded models reserve, and a load reserved
    its bytes only once its engine had started, so every load checked while the others were
    still starting passed. All three were served, three times what one fits in the budget (on
    a GPU, with its free bytes as the check, the same: the others' replicas not placed yet)."""
    for name in ("a", "b", "c"):
        write_model(tmp_path, name)
    one = estimate(load_model("seed-mlp"), 8)
    budget = one + one // 2
    config = test_config(
        device="cpu", model_repository=tmp_path, model_control_mode="explicit",
        memory_budget=budget,
    )  # fmt: skip
    with ServerThread(config) as server:
        answers: dict[str, tuple[int, bytes]] = {}

        def load(name: str) -> None:
            path = f"/v2/repository/models/{name}/load".encode()
            answers[name] = answer_of(server.port, raw_request(b"{}", path=path))

        threads = [threading.Thread(target=load, args=(name,)) for name in "abc"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        statuses = sorted(status for status, _ in answers.values())
        assert statuses == [200, 409, 409], answers
        refused = [body for status, body in answers.values() if status == 409]
        assert all(b"needs" in body and b"budget" in body for body in refused), refused
        reserved = _app(server).control.memory.reserved
        assert sum(r["cpu"] for r in reserved.values()) <= budget, reserved
        (served,) = _app(server).registry.names()
        status, body = answer_of(
            server.port,
            raw_request(orjson.dumps(infer_body()), path=f"/v2/models/{served}/infer".encode()),
        )
        assert status == 200, body


def test_a_load_still_placing_its_replicas_counts_against_the_device_s_free_bytes() -> None:
    """On a GPU the check is against the device's free bytes, which show a load's replicas only
    once they are placed: until then its reservation is taken off them, and once placed the
    device's own count is trusted again (not the reservation twice)."""
    free = {"cuda:0": 100}
    check = MemoryCheck(probe=lambda device: free.get(device))
    check.reserve("a/1#0", {"cuda:0": 60}, placing=True)
    with pytest.raises(InsufficientMemoryError, match=r"only 0\.0 MiB \(40 bytes\) is free"):
        check.check("b", {"cuda:0": 60}, owner="")
    check.check("b", {"cuda:0": 40}, owner="")  # what is left fits
    check.placed("a/1#0")
    free["cuda:0"] = 40  # the device now holds a's replicas
    with pytest.raises(InsufficientMemoryError):
        check.check("b", {"cuda:0": 60}, owner="")
    check.check("b", {"cuda:0": 40}, owner="")
    check.release("a/1#0")
    assert check.reserved == {}


def test_a_load_that_fails_to_start_gives_its_reservation_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchplace.serve.engine import Engine

    async def broken(self: Engine) -> None:
        raise RuntimeError("test: the dry run failed")

    write_model(tmp_path, "a")
    config = test_config(device="cpu", model_repository=tmp_path, model_control_mode="explicit")
    with ServerThread(config) as server:
        monkeypatch.setattr(Engine, "start", broken)
        status, body = answer_of(
            server.port, raw_request(b"{}", path=b"/v2/repository/models/a/load")
        )
        assert status == 400 or status >= 500, body
        assert _app(server).control.memory.reserved == {}
        assert _app(server).control.memory.placing == set()


# -- names in routes, whole --------------------------------------------------------------------
_LONG = "m" * 230  # a valid directory name (at most 255 bytes), longer than 200 characters


@pytest.fixture(scope="module")
def long_named(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("repository")
    write_model(root, _LONG)
    config = test_config(
        device="cpu", model_repository=root, model_control_mode="explicit",
        allow_client_shm=True,
    )  # fmt: skip
    with ServerThread(config) as thread:
        yield thread


def test_a_model_with_a_long_name_loads_over_rest(long_named: ServerThread) -> None:
    """A model name (or version, region name...) in a route was decoded by the helper that
    quotes values in error messages, which cuts them at 200 characters and adds '...': a load
    of a model named with 230 characters looked for 'mmm...' and answered 404, though gRPC
    loads it."""
    path = f"/v2/repository/models/{_LONG}/load".encode()
    status, body = answer_of(long_named.port, raw_request(b"{}", path=path))
    assert status == 200, body
    assert _LONG in _app(long_named).registry.names()


@pytest.mark.parametrize(
    "route",
    [
        f"/v2/models/{_LONG}/infer/",  # a trailing slash: the slow path
        f"/v2/models/{quote(_LONG[:5])}%6d{_LONG[6:]}/infer",  # percent-encoded
        f"/v2/models/{_LONG}/versions/1/infer/",
    ],
    ids=["trailing-slash", "percent-encoded", "version"],
)
def test_a_long_model_name_is_routed_whole(long_named: ServerThread, route: str) -> None:
    load = f"/v2/repository/models/{_LONG}/load".encode()
    assert answer_of(long_named.port, raw_request(b"{}", path=load))[0] == 200
    status, body = answer_of(long_named.port, raw_request(_GOOD, path=route.encode()))
    assert status == 200, body
    assert orjson.loads(body)["model_name"] == _LONG


def test_a_long_model_name_is_routed_whole_over_v1(long_named: ServerThread) -> None:
    load = f"/v2/repository/models/{_LONG}/load".encode()
    assert answer_of(long_named.port, raw_request(b"{}", path=load))[0] == 200
    body = orjson.dumps({"instances": [[0.5] * 8]})
    status, answer = answer_of(
        long_named.port, raw_request(body, path=f"/v1/models/{_LONG}:predict".encode())
    )
    assert status == 200, answer
    assert len(orjson.loads(answer)["predictions"]) == 1


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_a_region_with_a_long_name_is_registered_under_that_name(
    long_named: ServerThread,
) -> None:
    """It was registered as the name cut at 200 characters plus '...': the requests naming
    it, and its unregister, did not find it."""
    key = f"torchplace-test-{uuid.uuid4().hex}"
    Path("/dev/shm", key).write_bytes(bytes(64))
    region = "r" * 240
    prefix = f"/v2/systemsharedmemory/region/{region}".encode()
    try:
        register = orjson.dumps({"key": f"/{key}", "offset": 0, "byte_size": 64})
        status, answer = answer_of(
            long_named.port, raw_request(register, path=prefix + b"/register")
        )
        assert status == 200, answer
        status, answer = answer_of(
            long_named.port, raw_request(b"", method=b"GET", path=prefix + b"/status")
        )
        assert status == 200, answer
        assert [r["name"] for r in orjson.loads(answer)] == [region]
        status, answer = answer_of(long_named.port, raw_request(b"", path=prefix + b"/unregister"))
        assert status == 200, answer
        status, answer = answer_of(
            long_named.port,
            raw_request(b"", method=b"GET", path=b"/v2/systemsharedmemory/status"),
        )
        assert orjson.loads(answer) == []
    finally:
        _app(long_named).regions.unregister()
        os.unlink(Path("/dev/shm", key))


def test_a_long_tracestate_is_passed_on_whole() -> None:
    """W3C trace context: a tracestate of up to 512 characters is propagated; one over 200
    was cut and ended with '...', an invalid list member, and the caller's state was lost."""
    pytest.importorskip("opentelemetry.trace")
    from opentelemetry import trace

    parent = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    state = b"a=" + b"x" * 220 + b",b=1"
    context: Any = _caller({b"traceparent": parent, b"tracestate": state})
    carried = trace.get_current_span(context).get_span_context().trace_state
    assert carried.get("b") == "1"
    assert carried.get("a") == "x" * 220


# -- model control over REST: a load is not an inference request -------------------------------
def test_a_load_longer_than_the_request_timeout_is_answered_when_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load that takes longer than --request-timeout (a large model warming up) was answered
    503 "request timed out ...; retry later" while it went on and succeeded: the client (as
    tritonclient's load_model, which waits without a timeout) was told it failed, and one that
    retried as told reloaded the model. Over gRPC the same load is answered when done."""
    from torchplace.serve.engine import Engine

    real = Engine.start

    async def slow(self: Engine) -> None:
        await asyncio.sleep(2.5)
        await real(self)

    monkeypatch.setattr(Engine, "start", slow)
    write_model(tmp_path, "a")
    config = test_config(
        device="cpu", model_repository=tmp_path, model_control_mode="explicit",
        request_timeout_s=1.0,
    )  # fmt: skip
    with ServerThread(config) as server:
        status, body = answer_of(
            server.port, raw_request(b"{}", path=b"/v2/repository/models/a/load")
        )
        assert status == 200, body
        status, body = answer_of(server.port, raw_request(_GOOD, path=b"/v2/models/a/infer"))
        assert status == 200, body


def test_a_load_still_going_at_shutdown_is_stopped_not_abandoned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load under way when the server stops (past the drain timeout) was left as a pending
    task when the loop closed: its engine, started, was never stopped (its replica threads and
    memory kept, its trace unflushed) and its reservation never released."""
    from torchplace.serve.engine import Engine

    real = Engine.start
    started: list[Engine] = []

    async def slow(self: Engine) -> None:
        await real(self)
        started.append(self)
        await asyncio.sleep(30)  # the rest of a long warm-up

    monkeypatch.setattr(Engine, "start", slow)
    write_model(tmp_path, "a")
    config = test_config(
        device="cpu", model_repository=tmp_path, model_control_mode="explicit",
        drain_timeout_s=0.5,
    )  # fmt: skip
    server = ServerThread(config).start(timeout=60)
    control = _app(server).control
    loader = threading.Thread(
        target=exchange,
        args=(server.port, raw_request(b"{}", path=b"/v2/repository/models/a/load")),
    )
    loader.start()
    try:
        for _ in range(500):
            if started:
                break
            threading.Event().wait(0.01)
        assert started, "the load did not start its engine"
    finally:
        server.stop()
        loader.join(30)
    assert not started[0].is_live()
    assert control.memory.reserved == {}
