"""torchplace on Ray Serve against an idiomatic Ray Serve deployment, a no-op deployment
(Ray's own ceiling through its proxy) and torchplace standalone: one run, one client, one load.

    python benchmarks/serve_on_ray.py [--seconds 5] [--connections 64]

For each model (seed-mlp, wide-mlp) the same closed-loop client (keep-alive HTTP/1.1
connections, one-row OIP JSON requests) drives, one after the other:

* ``torchplace on Ray (proxy)``: :mod:`torchplace.serve.onray` behind Ray's HTTP proxy;
* ``torchplace on Ray (direct)``: the same replica's own listener (no proxy on the path);
* ``idiomatic Ray Serve``: the model in a deployment with ``@serve.batch``
  (max_batch_size 32, 2 ms, ``max_ongoing_requests`` 64), JSON in and out;
* ``no-op Ray Serve``: a deployment that answers at once, behind the same proxy;
* ``torchplace standalone``: ``torchplace serve`` in its own process.

It prints req/s, p50, p99 (a table of every line, the no-op ceiling next to what it caps), the
ratios, and PASS/FAIL lines for each target on each path (proxy, direct): torchplace on Ray
>= 3x the idiomatic deployment on both models, >= 70% of the no-op ceiling on seed-mlp, and
the direct path above that ceiling. Exit status 0 when each target is met on at least one
path; a miss on the proxied path is printed all the same, with the ceiling when the proxy
itself caps it.
Everything runs on 127.0.0.1 (a one-node Ray cluster with token auth, temp dir and token in a
temporary folder); everything started is stopped at the end. Needs ``torchplace[ray]``.

``--quick`` (used by ``make bench ARGS=--quick``) measures seed-mlp only, one second per line
(``--seconds``, ``--models``), and prints the speed targets as INFO lines: runs that short cannot
resolve them. Its checks are that every torchplace line (on Ray via the proxy, direct, and
standalone) answered requests and none failed; the exit status is 1 when one did not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from peers.procs import free_port, stop_group  # benchmarks/ is this script's folder

LOOPBACK = "127.0.0.1"
MODELS = ("seed-mlp", "wide-mlp")
MAX_REQUESTS_PER_CONNECTION = 1_000_000  # bounds every client loop
SECONDS = 5.0  # measured per line
QUICK_SECONDS = 1.0  # measured per line under --quick
QUICK_MODELS = ("seed-mlp",)  # the model of every target
QUICK_NOTE = "--quick runs are too short to judge speed"


# ---------------------------------------------------------------------- the client
@dataclass
class Result:
    name: str
    seconds: float = 0.0
    ok: int = 0
    failed: int = 0
    latencies: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def p(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


#: torchplace standalone: REST only (gRPC off), warnings only
_QUIET = ("--log-level", "warning")


def payload(model: str, path: str, port: int) -> bytes:
    from torchplace.models import embedded_model

    width = embedded_model(model).inputs[0].shape[1]
    body = orjson.dumps(
        {
            "inputs": [
                {"name": "input", "datatype": "FP32", "shape": [1, width], "data": [0.25] * width}
            ]
        }
    )
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {LOOPBACK}:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes
) -> bool:
    writer.write(data)
    head = await reader.readuntil(b"\r\n\r\n")
    lower = head.lower()
    length = re.search(rb"content-length: *(\d+)", lower)
    if length is not None:
        await reader.readexactly(int(length.group(1)))
    else:  # chunked (Ray's proxy may answer so)
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return head[9:12] == b"200"


async def closed_loop(
    name: str, targets: list[tuple[int, bytes]], connections: int, seconds: float
) -> Result:
    """``connections`` keep-alive connections spread over ``targets``, each sending its next
    request when the last is answered, for ``seconds`` after a one-second warm-up."""
    result = Result(name)
    start = time.perf_counter() + 1.0
    end = start + seconds

    async def worker(index: int) -> None:
        port, data = targets[index % len(targets)]
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        try:
            for _ in range(MAX_REQUESTS_PER_CONNECTION):
                began = time.perf_counter()
                if began >= end:
                    return
                try:
                    ok = await asyncio.wait_for(_exchange(reader, writer, data), 30)
                except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
                    result.failed += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection(LOOPBACK, port)
                    continue
                if began < start:
                    continue
                if ok:
                    result.ok += 1
                    result.latencies.append(time.perf_counter() - began)
                else:
                    result.failed += 1
        finally:
            writer.close()

    await asyncio.gather(*(worker(i) for i in range(connections)))
    result.seconds = seconds
    return result


def drive(name: str, targets: list[tuple[int, bytes]], args: argparse.Namespace) -> Result:
    result = asyncio.run(closed_loop(name, targets, args.connections, args.seconds))
    print(
        f"  {name:<28} {result.rate:9.1f} req/s  p50 {result.p(0.5) * 1e3:7.2f} ms  "
        f"p99 {result.p(0.99) * 1e3:7.2f} ms  failed {result.failed}",
        flush=True,
    )
    return result


# ---------------------------------------------------------------------- the peers on Ray
def idiomatic_deployment(model: str) -> Any:
    """What the Ray Serve docs show: the model in a deployment, ``@serve.batch`` on lists."""
    from ray import serve

    @serve.deployment(max_ongoing_requests=64, ray_actor_options={"num_cpus": 1})
    class Idiomatic:
        def __init__(self, name: str) -> None:
            import torch

            from torchplace.models import build_model

            torch.set_num_threads(1)
            self.name = name
            self.model = build_model(name)

        @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.002)
        async def predict(self, rows: list[Any]) -> list[Any]:
            import torch

            with torch.inference_mode():
                out = self.model(torch.as_tensor(rows, dtype=torch.float32))
            return out.tolist()  # type: ignore[no-any-return]

        async def __call__(self, request: Any) -> dict[str, Any]:
            body = await request.json()
            row = body["inputs"][0]["data"]
            out = await self.predict(row)
            return {
                "model_name": self.name,
                "outputs": [
                    {"name": "output", "datatype": "FP32", "shape": [1, len(out)], "data": out}
                ],
            }

    return Idiomatic.bind(model)


def noop_deployment() -> Any:
    from ray import serve

    @serve.deployment(max_ongoing_requests=64, ray_actor_options={"num_cpus": 1})
    class NoOp:
        async def __call__(self, request: Any) -> dict[str, Any]:
            await request.body()
            return {"outputs": []}

    return NoOp.bind()


# ---------------------------------------------------------------------- standalone
def wait_ready(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://{LOOPBACK}:{port}/v2/health/ready", timeout=2) as r,
        ):
            if r.status == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing ready on port {port} within {timeout} s")


@contextlib.contextmanager
def standalone(model: str) -> Any:
    port = free_port()
    exe = str(Path(sys.executable).parent / "torchplace")
    proc = subprocess.Popen(
        [exe, "serve", "--model", model, "--port", str(port), "--grpc-port", "0", *_QUIET],
        start_new_session=True,
    )
    try:
        wait_ready(port)
        yield port
    finally:
        stop_group(proc, grace=30)


# ---------------------------------------------------------------------- the run
def bench_model(
    model: str, proxy: int, noop: Result | None, args: argparse.Namespace
) -> dict[str, Result]:
    from ray import serve

    from torchplace.serve.config import ServeConfig
    from torchplace.serve.onray import RayOptions, deployment

    path = f"/v2/models/{model}/infer"
    results: dict[str, Result] = {}
    handle = serve.run(
        deployment(ServeConfig(model=model), RayOptions(replicas=1)), name="bench", route_prefix="/"
    )
    record = handle.describe.remote().result(timeout_s=60)
    direct = int(record["direct_url"].rsplit(":", 1)[1])
    results["tp_proxy"] = drive(
        "torchplace on Ray (proxy)", [(proxy, payload(model, path, proxy))], args
    )
    results["tp_direct"] = drive(
        "torchplace on Ray (direct)", [(direct, payload(model, path, direct))], args
    )
    serve.delete("bench")
    serve.run(idiomatic_deployment(model), name="bench", route_prefix="/")
    results["idiomatic"] = drive(
        "idiomatic Ray Serve", [(proxy, payload(model, path, proxy))], args
    )
    serve.delete("bench")
    if noop is None:
        serve.run(noop_deployment(), name="bench", route_prefix="/")
        noop = drive("no-op Ray Serve (ceiling)", [(proxy, payload(model, path, proxy))], args)
        serve.delete("bench")
    results["noop"] = noop
    with standalone(model) as port:
        results["standalone"] = drive(
            "torchplace standalone", [(port, payload(model, path, port))], args
        )
    return results


ROWS = (
    ("tp_proxy", "torchplace on Ray (proxy)"),
    ("tp_direct", "torchplace on Ray (direct)"),
    ("idiomatic", "idiomatic Ray Serve"),
    ("noop", "no-op Ray Serve (ceiling)"),
    ("standalone", "torchplace standalone"),
)


def table(all_results: dict[str, dict[str, Result]]) -> None:
    """Every line of the run side by side (the no-op ceiling next to what it caps)."""
    models = list(all_results)
    print("\n| req/s (p50 / p99 ms) | " + " | ".join(models) + " |")
    print("|---|" + "---|" * len(models))
    for key, label in ROWS:
        cells = [
            f"{r[key].rate:,.0f} ({r[key].p(0.5) * 1e3:.1f} / {r[key].p(0.99) * 1e3:.1f})"
            for r in all_results.values()
        ]
        print(f"| {label} | " + " | ".join(cells) + " |")


def verdict(ok: bool, text: str, quick: bool = False) -> bool:
    """One target's line: PASS/FAIL, or INFO under --quick (then always "met")."""
    if quick:
        print(f"  INFO {text}: {'met' if ok else 'missed'} ({QUICK_NOTE})")
        return True
    print(f"  {'PASS' if ok else 'FAIL'} {text}")
    return ok


def answered(all_results: dict[str, dict[str, Result]]) -> bool:
    """--quick's checks: every torchplace line answered requests and none failed."""
    passed = True
    for model, r in all_results.items():
        for key in ("tp_proxy", "tp_direct", "standalone"):
            label = dict(ROWS)[key]
            ok = r[key].ok > 0 and r[key].failed == 0
            print(
                f"  {'PASS' if ok else 'FAIL'} {model}: {label} answered every request "
                f"({r[key].ok} answered, failed {r[key].failed})"
            )
            passed &= ok
    return passed


def report(all_results: dict[str, dict[str, Result]], quick: bool = False) -> int:
    """Ratios and one PASS/FAIL line per target and path. The exit status is 0 when every
    target is met on at least one path (the direct path is the design's answer to the proxy's
    cap); every path's misses are printed all the same. Under ``quick`` the targets are INFO
    lines and the exit status is that of :func:`answered`'s checks."""
    table(all_results)
    nan = float("nan")
    print("\nratios")
    for model, r in all_results.items():
        idiomatic, noop = r["idiomatic"].rate or nan, r["noop"].rate or nan
        for key, label in (("tp_proxy", "via proxy"), ("tp_direct", "direct")):
            print(
                f"  {model} torchplace on Ray ({label}): {r[key].rate / idiomatic:5.2f}x "
                f"idiomatic, {r[key].rate / noop:5.2f}x the no-op ceiling, "
                f"{r[key].rate / (r['standalone'].rate or nan):5.2f}x standalone"
            )
        print(f"  {model} no-op ceiling: {noop / idiomatic:5.2f}x idiomatic")
    print("\ntargets")
    met, missed = True, []
    for model, r in all_results.items():
        idiomatic, noop = r["idiomatic"].rate, r["noop"].rate
        proxy = verdict(
            r["tp_proxy"].rate >= 3 * idiomatic,
            f"{model}: torchplace on Ray (via proxy) >= 3x idiomatic",
            quick,
        )
        if not proxy and noop < 3 * idiomatic:
            print(
                f"       Ray's proxy caps that path: a no-op deployment behind it answers "
                f"{noop:,.0f} req/s, {noop / (idiomatic or nan):.2f}x idiomatic"
            )
        direct = verdict(
            r["tp_direct"].rate >= 3 * idiomatic,
            f"{model}: torchplace on Ray (direct) >= 3x idiomatic",
            quick,
        )
        missed += [f"{model} 3x via proxy"] * (not proxy) + [f"{model} 3x direct"] * (not direct)
        met &= proxy or direct
    r = all_results.get("seed-mlp")
    if r is not None:
        noop = r["noop"].rate
        oks = []
        for key, label in (("tp_proxy", "via proxy"), ("tp_direct", "direct")):
            ok = verdict(
                r[key].rate >= 0.7 * noop,
                f"seed-mlp: torchplace on Ray ({label}) >= 70% of the no-op ceiling",
                quick,
            )
            missed += [f"seed-mlp 70% {label}"] * (not ok)
            oks.append(ok)
        met &= any(oks)
        ok = verdict(
            r["tp_direct"].rate > noop,
            "seed-mlp: the direct path beats the no-op ceiling (no proxy on it)",
            quick,
        )
        missed += ["seed-mlp direct above the ceiling"] * (not ok)
        met &= ok  # a target of the direct path alone
    if quick:
        print("\nchecks")
        return 0 if answered(all_results) else 1
    print(
        f"\n{'each target met on at least one path' if met else 'a target missed on every path'}"
        + (f"; missed: {', '.join(missed)}" if missed else "")
    )
    return 0 if met else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help=f"measured seconds per run (default {SECONDS:g}; --quick {QUICK_SECONDS:g})",
    )
    parser.add_argument("--connections", type=int, default=64, help="client connections")
    parser.add_argument(
        "--models",
        default=None,
        help=f"comma-separated models (default {','.join(MODELS)}; --quick {','.join(QUICK_MODELS)})",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short run: seed-mlp, one second per line, the speed targets INFO lines",
    )
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = QUICK_SECONDS if args.quick else SECONDS
    if args.models is None:
        args.models = ",".join(QUICK_MODELS if args.quick else MODELS)
    if args.seconds <= 0:
        parser.error(f"--seconds {args.seconds:g}: give a run length above 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if importlib.util.find_spec("ray") is None:
        print("SKIP serve_on_ray: Ray Serve is not installed (pip install 'torchplace[ray]')")
        return 0
    with tempfile.TemporaryDirectory(prefix="tpbench") as tmp:
        token = Path(tmp) / "auth_token"
        token.write_text(secrets.token_hex(16))
        os.environ.update(
            {
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # keeps the one-node cluster on loopback
                "RAY_TMPDIR": tmp,
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": str(token),
                "RAY_USAGE_STATS_ENABLED": "0",
            }
        )
        import ray
        from ray import serve

        ray.init(
            num_cpus=2,
            include_dashboard=False,
            _node_ip_address=LOOPBACK,
            _temp_dir=str(Path(tmp) / "ray"),
            logging_level="ERROR",
            log_to_driver=False,
        )
        try:
            proxy = free_port()
            serve.start(http_options={"host": LOOPBACK, "port": proxy})
            print(
                f"one run: {args.seconds:g} s per line, {args.connections} connections, 1-row requests"
            )
            results: dict[str, dict[str, Result]] = {}
            noop: Result | None = None
            for model in args.models.split(","):
                print(f"\n{model}")
                results[model] = bench_model(model, proxy, noop, args)
                noop = results[model]["noop"]
        finally:
            with contextlib.suppress(Exception):
                serve.shutdown()
            ray.shutdown()
    return report(results, args.quick)


if __name__ == "__main__":
    sys.exit(main())
