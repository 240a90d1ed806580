#!/usr/bin/env python
"""Where the time of one request goes in torchplace serve, stage by stage.

Each stage of the request path is timed on its own, in process, as the median of many runs
(one row per request, the way a latency-bound client sends): decode (the OIP JSON body into
arrays), validate (the engine's check of the arrays against the declarations), gather (rows
into the staging buffer), H2D, compute, D2H (one batch through the replica), split (the
batch's rows back to the requests), encode (the response body). Two end-to-end figures frame
them: ``engine.infer`` on an event loop (adds the queue, the batcher's dispatch and the
worker-thread hand-off; with the default ``--max-delay-ms`` a lone request also waits that
long for company, so it is measured with 0 as well) and a keep-alive HTTP round trip to a running server (adds HTTP
parsing, routing and the socket). A last row is the server's CPU time per request under load,
without the kernel's share: 32 in-memory keep-alive connections of the real app, each sending
its next request once its answer is written (a closed loop, as under ``wrk``). Prints one table
per model; nothing is asserted.

    python benchmarks/serve_profile.py                   # seed-mlp and wide-mlp on the CPU
    python benchmarks/serve_profile.py --device cuda:0
    python benchmarks/serve_profile.py --quick          # 200 runs per stage: a few seconds
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from torchplace.serve import protocol
from torchplace.serve.app import App
from torchplace.serve.config import ServeConfig
from torchplace.serve.engine import Engine
from torchplace.serve.registry import Registry
from torchplace.serve.reload import ModelControl
from torchplace.serve.running import ServerThread, new_event_loop
from torchplace.serve.startup import thread_count

REPEAT = 2000  # timed runs per stage
QUICK_REPEAT = 200  # under --quick


def median_us(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``fn`` in microseconds (after a warm-up)."""
    for _ in range(max(10, repeat // 10)):
        fn()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def profile(model: str, device: str, repeat: int) -> list[tuple[str, float]]:
    config = ServeConfig(model=model, device=device, port=0, drain_grace_s=0.0)
    engine = Engine.from_config(config)
    spec = engine.inputs[0]
    width = spec.shape[1]
    x = np.full((1, width), 0.25, np.float32)
    body = orjson.dumps(
        {"inputs": [{"name": spec.name, "datatype": "FP32", "shape": [1, width],
                     "data": x.ravel().tolist()}]}
    )  # fmt: skip
    rows: list[tuple[str, float]] = []

    def decode() -> protocol.InferRequest:
        return protocol.decode_infer_request(
            body, inputs=engine.inputs, outputs=engine.outputs, max_rows=4096
        )

    rows.append(("decode", median_us(decode, repeat)))
    decoded = decode()
    rows.append(("validate", median_us(lambda: engine._rows(decoded.inputs), repeat)))
    threads = thread_count(engine)  # the torch threads the server itself would run with
    if threads is not None:
        torch.set_num_threads(threads)
    replica = engine.replicas[0]
    replica.prepare()
    staging = replica.staging
    assert staging is not None
    rows.append(("gather", median_us(lambda: staging.gather([decoded.inputs], 1), repeat)))
    outcomes = [replica.run_batch([decoded.inputs], [1]) for _ in range(repeat)]
    for stage in ("h2d_s", "compute_s", "d2h_s"):
        value = statistics.median(getattr(o, stage) for o in outcomes) * 1e6
        rows.append((stage[:-2].upper() if stage != "compute_s" else "compute", value))
    # what a batch spends outside its timed stages (gather included), batch by batch
    rest = statistics.median(
        o.finished - o.started - o.h2d_s - o.compute_s - o.d2h_s for o in outcomes
    )
    gather = next(v for name, v in rows if name == "gather")
    rows.append(("split (+ batch bookkeeping)", max(0.0, rest * 1e6 - gather)))
    result = outcomes[0].results[0]
    assert isinstance(result, dict)

    def encode() -> object:
        return protocol.encode_infer_response(
            model_name=engine.name,
            model_version=engine.version,
            request=decoded,
            results=result,
            outputs=engine.outputs,
        )

    rows.append(("encode", median_us(encode, repeat)))
    rows.append(("sum of the stages", sum(v for _, v in rows)))
    rows.append(("engine.infer on a loop", _engine_round_trip(config, decoded, repeat)))
    no_wait = ServeConfig(model=model, device=device, port=0, drain_grace_s=0.0, max_delay_ms=0.0)
    rows.append(("  the same, --max-delay-ms 0", _engine_round_trip(no_wait, decoded, repeat)))
    rows.append(("HTTP round trip (keep-alive)", _http_round_trip(config, body, model, repeat)))
    rows.append(("CPU per request, 32 clients", _loop_cpu(config, body, model, repeat)))
    return rows


def _engine_round_trip(config: ServeConfig, decoded: protocol.InferRequest, repeat: int) -> float:
    async def main() -> float:
        engine = Engine.from_config(config)
        await engine.start()
        times = []
        for _ in range(repeat):
            began = time.perf_counter()
            await engine.infer(decoded.inputs)
            times.append(time.perf_counter() - began)
        await engine.stop()
        return statistics.median(times[repeat // 10 :]) * 1e6

    return asyncio.run(main())


def _http_round_trip(config: ServeConfig, body: bytes, model: str, repeat: int) -> float:
    with ServerThread(config) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        path = f"/v2/models/{model}/infer"

        def call() -> None:
            conn.request("POST", path, body=body, headers={"content-type": "application/json"})
            conn.getresponse().read()

        try:
            return median_us(call, repeat)
        finally:
            conn.close()


class _Transport:
    """The transport of an in-process connection: what is written is counted, not sent; an
    answer other than a 200 is kept, for the measurement to refuse."""

    def __init__(self, answered: Callable[[], None], refused: list[bytes]) -> None:
        self.answered = answered
        self.refused = refused

    def write(self, data: bytes) -> None:
        if not data.startswith(b"HTTP/1.1 200 "):
            self.refused.append(data)
        self.answered()

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def is_closing(self) -> bool:
        return False

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


def _loop_cpu(
    config: ServeConfig, body: bytes, model: str, repeat: int, clients: int = 32
) -> float:
    """CPU time per request of the whole server (loop and replica threads), in process: the real
    app on ``clients`` keep-alive connections whose transports are in memory, each sending its
    next request when its answer is written (a closed loop, as under ``wrk``, without the
    sockets). What the request path costs, apart from the kernel's reads and writes."""
    raw = (
        b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
        b"\r\nContent-Length: %d\r\n\r\n%s" % (model.encode(), len(body), body)
    )

    async def main() -> float:
        app = App(ModelControl(Registry(), config), config)
        await app.start()
        loop = asyncio.get_running_loop()
        left = [0]
        done: list[asyncio.Future[None]] = []
        refused: list[bytes] = []

        def answered() -> None:
            left[0] -= 1
            if not left[0]:
                done[0].set_result(None)

        connections = []
        for _ in range(clients):
            connection = app.server.connection()
            connection.connection_made(_Transport(answered, refused))  # type: ignore[arg-type]
            connections.append(connection)

        async def round_trip() -> None:
            left[0] = clients
            done[:] = [loop.create_future()]
            for connection in connections:
                connection.data_received(raw)
            await done[0]

        rounds = max(repeat // 10, 20)
        for _ in range(rounds // 5):  # warm-up: the replica's probation, the caches
            await round_trip()
        began = time.process_time()
        for _ in range(rounds):
            await round_trip()
        spent = time.process_time() - began
        await app.shutdown(1.0)
        if refused:  # the cost of answering errors is not the request path's
            raise RuntimeError(f"{len(refused)} requests were not answered 200: {refused[0]!r}")
        return spent / (rounds * clients) * 1e6

    loop = new_event_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default="seed-mlp,wide-mlp")
    parser.add_argument(
        "--repeat",
        type=int,
        default=None,
        help=f"timed runs per stage (default {REPEAT}; --quick {QUICK_REPEAT})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a short run: {QUICK_REPEAT} runs per stage (a few seconds per model)",
    )
    args = parser.parse_args(argv)
    if args.repeat is None:
        args.repeat = QUICK_REPEAT if args.quick else REPEAT
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: give at least 1 run per stage")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for model in args.models.split(","):
        print(f"\n{model} on {args.device}, 1 row per request, median microseconds")
        print(f"| {'stage':<30} | {'us':>9} |")
        print(f"| {'-' * 30} | {'-' * 9}:|")
        rows = profile(model, args.device, args.repeat)
        for name, value in rows:
            print(f"| {name:<30} | {value:9.1f} |")
        summary = ", ".join(f"{name.strip()} {value:.0f}" for name, value in rows)
        print(f"INFO {model} on {args.device}, median us per 1-row request: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
