"""gRPC's health checking protocol on the gRPC port: Check and Watch, for the server and per
model, with no token asked, NOT_SERVING once the server drains."""

from __future__ import annotations

import asyncio
import http.client
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchplace.errors import ConfigError
from torchplace.serve import grpc_health
from torchplace.serve.grpc_health import HealthNotifier, watch_statuses
from torchplace.serve.running import ServerThread

from .conftest import eventually, test_config
from .repository_helpers import write_model

grpc = pytest.importorskip("grpc")
from torchplace.serve.proto import health_pb2 as health  # noqa: E402

Status = health.HealthCheckResponse


#: a safety poll no test waits for: whatever arrives came from a notification
NEVER_S = 3600.0


def _check(port: int, service: str) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health.HealthCheckRequest.SerializeToString,
            response_deserializer=Status.FromString,
        )
        status: int = call(health.HealthCheckRequest(service=service), timeout=10).status
        return status


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    token = tmp_path_factory.mktemp("auth") / "token"
    token.write_text("s3cret\n")
    thread = ServerThread(test_config(device="cpu", auth_token_file=Path(token))).start(120)
    try:
        yield thread
    finally:
        thread.stop()


@pytest.mark.parametrize("service", ["", "inference.GRPCInferenceService", "seed-mlp"])
def test_check_says_serving_without_a_token(server: ServerThread, service: str) -> None:
    assert _check(server.grpc_port, service) == Status.SERVING


def test_an_unknown_service_is_not_found_and_garbage_invalid(server: ServerThread) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _check(server.grpc_port, "resnet50")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown service 'resnet50'" in caught.value.details()
    address = f"127.0.0.1:{server.grpc_port}"
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as caught:
        channel.unary_unary("/grpc.health.v1.Health/Check")(b"\xff\xff", timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_watch_follows_the_drain_and_then_ends() -> None:
    thread = ServerThread(test_config(device="cpu", drain_grace_s=1.0)).start(timeout=120)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{thread.grpc_port}") as channel:
            watch = channel.unary_stream(
                "/grpc.health.v1.Health/Watch",
                request_serializer=health.HealthCheckRequest.SerializeToString,
                response_deserializer=Status.FromString,
            )
            model = watch(health.HealthCheckRequest(service="seed-mlp"), timeout=30)
            unknown = watch(health.HealthCheckRequest(service="nope"), timeout=30)
            assert next(model).status == Status.SERVING
            assert next(unknown).status == Status.SERVICE_UNKNOWN
            stopper = threading.Thread(target=thread.stop)
            stopper.start()
            assert next(model).status == Status.NOT_SERVING
            assert list(model) == []  # the stream ended, so the drain need not wait for it
            stopper.join(30)
            assert not stopper.is_alive()
    finally:
        thread.stop()


class _Watchers:
    """``count`` watches of ``service`` over a status table, each in a task that queues what
    it is sent; ``calls`` counts the status reads."""

    def __init__(self, notifier: HealthNotifier, count: int, service: str = "m") -> None:
        self.table: dict[str, int] = {service: Status.SERVING}
        self.draining = False
        self.calls = 0
        self.sent: list[asyncio.Queue[int]] = [asyncio.Queue() for _ in range(count)]
        self.tasks = [
            asyncio.ensure_future(self._run(service, notifier, sent)) for sent in self.sent
        ]

    def status(self, service: str) -> int | None:
        self.calls += 1
        return self.table.get(service)

    async def _run(self, service: str, notifier: HealthNotifier, sent: asyncio.Queue[int]) -> None:
        async for now in watch_statuses(service, self.status, lambda: self.draining, notifier):
            sent.put_nowait(now)

    async def next(self) -> list[int]:
        """What each watch sends next (within 10 s: far less than the poll)."""
        return [await asyncio.wait_for(sent.get(), 10) for sent in self.sent]


def test_a_change_reaches_the_watch_at_once_not_at_the_next_poll() -> None:
    async def scenario() -> list[list[int]]:
        notifier = HealthNotifier(interval_s=NEVER_S)
        watchers = _Watchers(notifier, 1)
        seen = [await watchers.next()]
        watchers.table["m"] = Status.NOT_SERVING
        notifier.notify()
        seen.append(await watchers.next())
        del watchers.table["m"]  # unloaded
        notifier.notify()
        seen.append(await watchers.next())
        watchers.tasks[0].cancel()  # the client went away
        await asyncio.gather(*watchers.tasks, return_exceptions=True)
        assert notifier.watchers == 0
        return seen

    assert asyncio.run(scenario()) == [
        [Status.SERVING],
        [Status.NOT_SERVING],
        [Status.SERVICE_UNKNOWN],
    ]


def test_many_watches_share_one_timer_and_wake_once_per_change() -> None:
    async def scenario() -> None:
        probed = [True]
        notifier = HealthNotifier(probe=lambda: probed[0], interval_s=0.01)
        watchers = _Watchers(notifier, 100)
        assert await watchers.next() == [Status.SERVING] * 100
        assert watchers.calls == 100  # one read each
        await eventually(lambda: notifier.ticks >= 5)
        assert notifier.ticks >= 5
        # ticks with nothing changed woke no watch; the notifier added no task of its own
        assert watchers.calls == 100
        assert len(asyncio.all_tasks()) == 1 + 100
        # a change nobody told of (a replica lost): the next tick wakes each watch once
        probed[0] = False
        watchers.table["m"] = Status.NOT_SERVING
        assert await watchers.next() == [Status.NOT_SERVING] * 100
        assert watchers.calls == 200
        for task in watchers.tasks:
            task.cancel()
        await asyncio.gather(*watchers.tasks, return_exceptions=True)
        ticks = notifier.ticks
        await asyncio.sleep(0.05)
        assert notifier.ticks == ticks  # no watch open: the timer stopped

    asyncio.run(scenario())


def test_the_drain_ends_every_watch_with_its_last_status() -> None:
    async def scenario() -> None:
        notifier = HealthNotifier(interval_s=NEVER_S)
        watchers = _Watchers(notifier, 20)
        await watchers.next()
        watchers.draining = True
        watchers.table["m"] = Status.NOT_SERVING
        notifier.notify()
        assert await watchers.next() == [Status.NOT_SERVING] * 20
        await asyncio.wait_for(asyncio.gather(*watchers.tasks), 10)  # ended, not cancelled
        assert notifier.watchers == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("interval", [0, -1.0, float("nan")])
def test_a_notifier_refuses_an_interval_that_is_not_positive(interval: float) -> None:
    with pytest.raises(ConfigError, match=f"interval_s={interval!r}; give a number of seconds"):
        HealthNotifier(interval_s=interval)


def _post(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path, body=b"{}", headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_watch_sees_a_load_and_an_unload_without_waiting_for_a_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grpc_health, "PROBE_INTERVAL_S", NEVER_S)
    write_model(tmp_path, "a")
    config = test_config(device="cpu", model_repository=tmp_path, model_control_mode="explicit")
    with (
        ServerThread(config) as thread,
        grpc.insecure_channel(f"127.0.0.1:{thread.grpc_port}") as channel,
    ):
        watch = channel.unary_stream(
            "/grpc.health.v1.Health/Watch",
            request_serializer=health.HealthCheckRequest.SerializeToString,
            response_deserializer=Status.FromString,
        )
        # the deadline, far below the poll, fails the test if a change waited for one
        model = watch(health.HealthCheckRequest(service="a"), timeout=60)
        assert next(model).status == Status.SERVICE_UNKNOWN
        assert _post(thread.port, "/v2/repository/models/a/load") == 200
        assert next(model).status == Status.SERVING
        assert _post(thread.port, "/v2/repository/models/a/unload") == 200
        assert next(model).status == Status.SERVICE_UNKNOWN
        model.cancel()
