#!/usr/bin/env python
"""torchplace serve against the servers people deploy, and against the two limits, under wrk.

One run, same machine, same models (seed-mlp, wide-mlp built by ``torchplace.models``), same
load: ``wrk`` with 32 connections for a fixed duration, one row per request, the same Open
Inference Protocol v2 JSON body wherever the peer speaks it. Peers, each in its own venv (built
with pip outside the repository, with the repository's torch pin) and with its own batching
configured as it documents it (32 rows / 2 ms where it has such a setting):

* Triton Inference Server (``nvidia-pytriton``, which bundles tritonserver);
* the KServe model server (``kserve``); MLServer; Ray Serve; BentoML; LitServe;
* the article's ``Predictor`` behind FastAPI+uvicorn (no batching).

Each peer's configuration is printed before it is measured. Two limits are measured in the same
run: a constant-reply HTTP server (bare asyncio + httptools: the limit for tiny models) and the
model's in-process batch-32 forward throughput at the server's torch thread count (the limit
for compute). Between the two stands a lean reference (``peers/apps/lean_batcher.py``): the
least a dynamically batching server of torchplace's own stack (uvloop, httptools, orjson) does
per request, with none of its features; its share of the limits is what Python on this stack
reaches at best here, and torchplace's share of it is what the features cost. Every server is a subprocess in a session of its own on a free 127.0.0.1 port,
checked against the in-process model before it is measured, and stopped with every process it
started (also on SIGTERM and on errors). Prints req/s, p50, p99, ratios torchplace/peer, the
server's CPU microseconds per request under wrk (every process and thread of it, from /proc),
% of each limit, and one PASS/FAIL line per target; exits 1 if a target is missed.

Protocols (``--grpc``, default on): torchplace is also measured over REST with binary tensors
(Triton's binary tensor extension) and over gRPC, one server each, by Triton's ``perf_analyzer``
(``peers.perf_client``; its venv is installed like a peer's) at the same 32 concurrent requests of
one row, in alternating rounds; so is Triton, which serves both (KServe and MLServer serve gRPC
but not the model configuration perf_analyzer reads: SKIP lines). Those rows are compared with
torchplace's row of the same protocol, and the target is torchplace's gRPC req/s >= its REST
binary req/s on wide-mlp. The gRPC limit is measured the same way: torchplace's gRPC transport
answering every call with one fixed response (what a unary call costs on it here).

Targets (on a 2-core machine): seed-mlp >= 12x Triton and >= 30% of the HTTP limit;
wide-mlp >= 2.5x Triton and >= 80% of the in-process ceiling; torchplace p99 below every
peer's. Earlier targets stay: wide-mlp >= 5x LitServe and >= 4x FastAPI, seed-mlp >= 6x LitServe
and >= 3x FastAPI; metrics + tracing cost < 5% of req/s.

Where something is missing the run goes on with what there is and says so: a peer whose venv
cannot be built, or whose server does not start, is a SKIP line with the reason (and its targets
are SKIP lines too); without ``wrk`` the load comes from a built-in Python client, which
saturates before a fast server does, so the targets become INFO lines. Peer venvs are built
(``--setup-peers``) on a full run and never under ``--quick``, which keeps within a time budget
(``--time-budget``, 50 s), skips what would no longer fit, peers first, and prints its speed
targets as INFO lines: its rounds are too short to judge them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the peers package beside this file

from peers import perf_client, procs, venvs
from peers.catalog import APPS, PEERS, Peer, request_body
from peers.load import PythonLoad, WrkLoad, client_worker, lua_script  # noqa: F401 - API
from peers.perf_client import PerfLoad

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("seed-mlp", "wide-mlp")
#: model -> peer -> least torchplace req/s over the peer's
RATIO_TARGETS = {
    "seed-mlp": {"Triton": 12.0, "LitServe": 6.0, "FastAPI+uvicorn": 3.0},
    "wide-mlp": {"Triton": 2.5, "LitServe": 5.0, "FastAPI+uvicorn": 4.0},
}
#: model -> (limit, least share of it torchplace reaches)
LIMIT_TARGETS = {"seed-mlp": ("http", 0.30), "wide-mlp": ("ceiling", 0.80)}
LIMIT_NAMES = {"http": "constant-reply HTTP limit", "ceiling": "in-process ceiling"}
OBSERVABILITY_BUDGET = 0.05
#: peer -> the modules it needs to run in this interpreter when its venv is not built
PEER_MODULES = {p.name: p.fallback_modules for p in PEERS if p.fallback_modules}
HTTP_LIMIT = "HTTP limit"
LEAN = "lean Python server"
GRPC_LIMIT = "gRPC limit"
LEAN_GRPC = "lean gRPC server"
#: the two protocols perf_analyzer measures: (row suffix, its load in Workload.loads)
REST_BINARY, GRPC = "REST binary", "gRPC"
PERF_LOADS = {REST_BINARY: "perf-http", GRPC: "perf-grpc"}
#: the models on which torchplace's gRPC req/s must reach its REST req/s with binary tensors
GRPC_TARGET_MODELS = ("wide-mlp",)


@dataclass
class Run:
    server: str
    model: str
    rps: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    cpu_us: float = 0.0  # the server's CPU time (all its processes) per answered request
    requests: int = 0
    errors: int = 0
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Server:
    """A server to measure: its command, the URL and body format it is sent, its env."""

    name: str
    argv: list[str]
    url: str
    body: str = "oip"
    env: dict[str, str] = field(default_factory=dict)
    load: str = ""  # the load's key in Workload.loads (default: body)
    target: str = ""  # the address the load is given (default: url)
    extra: dict[str, Any] = field(default_factory=dict)  # copied into its Run's extra


@dataclass
class Workload:
    """One model's bodies, expected answer and loads, per body format."""

    model: str
    want: list[float]
    bodies: dict[str, bytes]
    loads: dict[str, WrkLoad | PythonLoad | PerfLoad]


def missing_modules(peer: str) -> list[str]:
    """The modules ``peer``'s server needs that are not installed in this interpreter."""
    return [name for name in PEER_MODULES[peer] if importlib.util.find_spec(name) is None]


def input_row(model: str) -> list[float]:
    from torchplace.models import embedded_model

    width = embedded_model(model).inputs[0].shape[1]
    return [round(((i * 37) % 17) / 17.0 - 0.5, 4) for i in range(width)]


def expected(model: str, row: list[float]) -> list[float]:
    import torch

    from torchplace.models import build_model

    with torch.inference_mode():
        return [float(v) for v in build_model(model)(torch.tensor([row])).flatten()]


def server_threads(device: str) -> int:
    """torchplace's intra-op thread count for one CPU replica: one core stays with its loop."""
    if device.startswith("cuda"):
        import torch

        return torch.get_num_threads()
    return max(1, (os.cpu_count() or 1) - 1)


def ceiling(model: str, device: str, seconds: float, threads: int) -> float:
    """In-process batched forward throughput at batch 32 (rows/s) on ``threads`` threads."""
    import torch

    from torchplace.models import build_model, embedded_model

    dev = torch.device(device)
    net = build_model(model).to(dev)
    width = embedded_model(model).inputs[0].shape[1]
    x = torch.randn(32, width, device=dev)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            for _ in range(20):
                net(x)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            n, began = 0, time.perf_counter()
            while time.perf_counter() - began < seconds and n < 1_000_000:
                net(x)
                n += 1
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            took = time.perf_counter() - began
    finally:
        torch.set_num_threads(before)
    return n * 32 / took


def _clip(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping its start and, above all, its end."""
    if len(text) <= limit:
        return text
    head = limit // 5
    return f"{text[:head]} [...] {text[-(limit - head) :]}"


@contextlib.contextmanager
def started(servers: list[Server], work: Workload) -> Iterator[list[procs.Started]]:
    """Start every server at once, each ready once it answers correctly; stop them all on exit."""
    with contextlib.ExitStack() as stack:
        up = []
        for server in servers:
            proc = procs.start(server.argv, env=server.env)
            stack.callback(procs.stop, proc)
            up.append(proc)
        for server, proc in zip(servers, up, strict=True):
            body = work.bodies[server.body]

            def ready(url: str = server.url, body: bytes = body) -> None:
                procs.check_answer(url, body, work.want, timeout=10)

            procs.wait_ready(proc, ready)
        yield up


def measure(servers: list[Server], work: Workload, args: argparse.Namespace) -> list[Run]:
    """Start the servers together, warm each up, then measure them in turn, round after
    round (A B C, B C A, C A B, ...), so that drifting background load hits them alike;
    each figure is the median over the rounds."""
    runs = {s.name: Run(s.name, work.model, extra=dict(s.extra)) for s in servers}
    rounds: dict[str, list[dict[str, Any]]] = {s.name: [] for s in servers}
    try:
        with started(servers, work) as up:
            pids: dict[str, list[int]] = {}
            for server, proc in zip(servers, up, strict=True):
                runs[server.name].extra["listens"] = proc.listens
                pids[server.name] = procs.members(proc.proc.pid, proc.marker)
            for server in servers:
                work.loads[server.load or server.body](server.target or server.url, args.warmup)
            for index in range(args.rounds):
                # Rotate who goes first: a slot in the round must not favour one variant.
                shift = index % len(servers)
                for server in servers[shift:] + servers[:shift]:
                    load = work.loads[server.load or server.body]
                    before = procs.cpu_seconds(pids[server.name])
                    result = load(server.target or server.url, args.duration)
                    result["cpu_s"] = procs.cpu_seconds(pids[server.name]) - before
                    rounds[server.name].append(result)
    except (
        RuntimeError,
        subprocess.SubprocessError,
        OSError,
        TimeoutError,
        concurrent.futures.TimeoutError,
    ) as exc:
        for run in runs.values():
            run.note = _clip(f"failed: {exc}", 800)
        # the end of a server's log is where its error is: keep it
        print(f"  {', '.join(runs)} {work.model}: {_clip(f'failed: {exc}', 2500)}", flush=True)
        return list(runs.values())
    for name, run in runs.items():
        done = rounds[name]
        # error answers are no throughput: req/s counts the successful answers only
        run.rps = statistics.median(
            r["rps"] * (1 - r["errors"] / r["requests"]) if r["requests"] else 0.0 for r in done
        )
        run.p50_ms = statistics.median(r["p50"] for r in done)
        run.p99_ms = statistics.median(r["p99"] for r in done)
        if "client" not in run.extra:  # perf_analyzer counts its last window's requests only
            run.cpu_us = statistics.median(
                1e6 * r["cpu_s"] / r["requests"] if r["requests"] else 0.0 for r in done
            )
        run.requests = sum(r["requests"] for r in done)
        run.errors = sum(r["errors"] for r in done)
        run.extra["rounds"] = [
            {"rps": r["rps"], "p50_ms": r["p50"], "p99_ms": r["p99"]} for r in done
        ]
        per_round = ", ".join(f"{r['rps']:.0f}" for r in done)
        print(
            f"  {name:<22} {work.model:<9} {run.rps:>10.0f} req/s  p50 {run.p50_ms:7.2f} ms  "
            f"p99 {run.p99_ms:7.2f} ms  cpu {_cpu(run):>6} us/req  errors {run.errors}  "
            f"(rounds: {per_round} req/s)",
            flush=True,
        )
    return list(runs.values())


def _cpu(run: Run) -> str:
    """The server's CPU microseconds per request, or ``-`` where it was not measured."""
    return f"{run.cpu_us:.1f}" if run.cpu_us else "-"


def measure_both_orders(
    servers: list[Server], work: Workload, args: argparse.Namespace
) -> list[Run]:
    """Measure the torchplace variants twice, started in one order and then in the reverse
    order (fresh processes), and pool the rounds. On a small machine the order in which
    processes start shifts their throughput by several percent; pooling both orders keeps that
    out of the metrics and tracing cost, which is a difference of a few percent itself."""
    total = args.rounds
    first = argparse.Namespace(**{**vars(args), "rounds": max(1, (total + 1) // 2)})
    runs = measure(servers, work, first)
    if total < 2:
        return runs
    second = argparse.Namespace(**{**vars(args), "rounds": total // 2})
    again = {run.server: run for run in measure(servers[::-1], work, second)}
    for run in runs:
        other = again.get(run.server)
        if other is None or run.note or other.note:
            run.note = run.note or (other.note if other else "")
            continue
        pooled = run.extra.get("rounds", []) + other.extra.get("rounds", [])
        run.extra["rounds"] = pooled
        run.rps = statistics.median(r["rps"] for r in pooled)
        run.p50_ms = statistics.median(r["p50_ms"] for r in pooled)
        run.p99_ms = statistics.median(r["p99_ms"] for r in pooled)
        run.requests += other.requests
        run.errors += other.errors
    return runs


def peer_pythons(peers: list[Peer], args: argparse.Namespace) -> dict[str, str]:
    """peer name -> the python that runs it; a SKIP line (in ``args.skipped``) for the rest.
    Builds the missing venvs (two at a time) when ``args.setup_peers`` says so."""
    pythons: dict[str, str] = {}
    to_build: list[Peer] = []
    for peer in peers:
        if venvs.is_built(args.venvs, peer.venv):
            pythons[peer.name] = str(venvs.python_of(args.venvs, peer.venv))
        elif args.setup_peers:
            to_build.append(peer)
        elif peer.fallback_modules and not missing_modules(peer.name):
            pythons[peer.name] = sys.executable
        else:
            args.skipped.append(
                f"{peer.name}: no venv at {args.venvs / peer.venv.name} (built by a full run, "
                "or --setup-peers); no ratio against it"
            )
    if to_build:
        names = ", ".join(p.name for p in to_build)
        print(f"setup: building venvs for {names} under {args.venvs} (pip) ...", flush=True)
        constraints = ROOT / "constraints" / "ci.txt"
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = {
                pool.submit(
                    venvs.build, args.venvs, p.venv, constraints, timeout=args.setup_timeout
                ): p
                for p in to_build
            }
            for future in concurrent.futures.as_completed(futures):
                peer = futures[future]
                try:
                    pythons[peer.name] = str(future.result())
                    print(f"setup: {peer.name} venv ready", flush=True)
                except (venvs.SetupError, OSError) as exc:
                    args.skipped.append(f"{peer.name}: venv could not be built: {exc}")
    return pythons


def peer_server(
    peer: Peer, python: str, model: str, device: str, args: argparse.Namespace, scratch: Path
) -> Server:
    port = procs.free_port()
    workdir = scratch / f"{peer.venv.name}-{model}"
    argv = [python, str(peer.script_path), model, str(port), device]
    argv += [str(args.peer_torch_threads), str(workdir)]
    env = {
        "PYTHONPATH": os.pathsep.join((str(APPS), str(ROOT / "src"))),
        "TMPDIR": str(scratch),
        **peer.env,
    }
    url = f"http://127.0.0.1:{port}" + peer.path.format(model=model)
    return Server(peer.name, argv, url, peer.body, env)


def torchplace_server(
    name: str, model: str, device: str, *extra: str, grpc_port: int = 0
) -> Server:
    """``torchplace serve`` on a free port; gRPC off unless ``grpc_port`` is given (servers
    started together must not all want 8001)."""
    port = procs.free_port()
    argv = [sys.executable, "-m", "torchplace.cli", "serve", "--model", model]
    argv += ["--port", str(port), "--grpc-port", str(grpc_port), "--device", device]
    argv += ["--log-level", "warning", *extra]
    return Server(name, argv, f"http://127.0.0.1:{port}/v2/models/{model}/infer")


def over_protocol(server: Server, base: str, protocol: str, grpc_port: int | None = None) -> Server:
    """``server`` measured by perf_analyzer over ``protocol`` (REST_BINARY or GRPC): at its
    REST host:port, or at ``grpc_port`` on 127.0.0.1; its row is named ``BASE PROTOCOL`` and
    compared with torchplace's row of the same protocol."""
    if grpc_port is None:
        address = server.url.removeprefix("http://").split("/", 1)[0]
    else:
        address = f"127.0.0.1:{grpc_port}"
    server.name = f"{base} {protocol}"
    server.load, server.target = PERF_LOADS[protocol], address
    server.extra = {"client": "perf_analyzer", "protocol": protocol,
                    "compare_to": f"torchplace {protocol}"}  # fmt: skip
    return server


def torchplace_protocols(model: str, device: str) -> list[Server]:
    """torchplace over REST with binary tensors and over gRPC (one server each)."""
    rest = torchplace_server("torchplace", model, device)
    grpc_port = procs.free_port()
    grpc = torchplace_server("torchplace", model, device, grpc_port=grpc_port)
    return [
        over_protocol(rest, "torchplace", REST_BINARY),
        over_protocol(grpc, "torchplace", GRPC, grpc_port),
    ]


def peer_protocols(
    peer: Peer, python: str, model: str, device: str, args: argparse.Namespace, scratch: Path
) -> list[Server]:
    """A peer that serves Triton's extensions over REST with binary tensors and over gRPC (one
    server each; its script takes the gRPC port from ``PEER_GRPC_PORT``)."""
    (scratch / "rest").mkdir(exist_ok=True)
    (scratch / "grpc").mkdir(exist_ok=True)
    rest = peer_server(peer, python, model, device, args, scratch / "rest")
    grpc = peer_server(peer, python, model, device, args, scratch / "grpc")
    grpc_port = procs.free_port()
    grpc.env["PEER_GRPC_PORT"] = str(grpc_port)
    return [
        over_protocol(rest, peer.name, REST_BINARY),
        over_protocol(grpc, peer.name, GRPC, grpc_port),
    ]


def reply_file(work: Workload, scratch: Path) -> Path:
    """The model's REST answer to the benchmark's row, as a file the limit servers read."""
    reply = scratch / f"reply-{work.model}.json"
    doc = {
        "model_name": work.model,
        "id": "1",
        "outputs": [
            {"name": "output", "datatype": "FP32", "shape": [1, len(work.want)], "data": work.want}
        ],
    }
    reply.write_text(json.dumps(doc, separators=(",", ":")))
    return reply


def http_limit_server(work: Workload, scratch: Path) -> Server:
    port = procs.free_port()
    argv = [sys.executable, str(APPS / "const_reply.py"), str(port), str(reply_file(work, scratch))]
    return Server(HTTP_LIMIT, argv, f"http://127.0.0.1:{port}/v2/models/{work.model}/infer")


def lean_server(work: Workload, device: str, threads: int, scratch: Path) -> Server:
    """The lean reference, in this interpreter, at torchplace's torch thread count."""
    port = procs.free_port()
    argv = [sys.executable, str(APPS / "lean_batcher.py"), work.model, str(port), device]
    argv += [str(threads), str(scratch / f"lean-{work.model}")]
    env = {"PYTHONPATH": os.pathsep.join((str(APPS), str(ROOT / "src")))}
    return Server(LEAN, argv, f"http://127.0.0.1:{port}/v2/models/{work.model}/infer", env=env)


def grpc_limit_server(work: Workload, scratch: Path, *lean: str) -> Server:
    """A constant-reply server on torchplace's gRPC transport, measured by perf_analyzer over
    gRPC like torchplace's gRPC row (it answers the constant REST reply on a second port, for
    the readiness check);
    with ``lean`` (DEVICE, THREADS), the lean gRPC reference that runs the model instead."""
    grpc_port, http_port = procs.free_port(), procs.free_port()
    argv = [sys.executable, str(APPS / "const_grpc.py"), str(grpc_port), str(http_port)]
    argv += [work.model, str(reply_file(work, scratch))]
    if lean:
        argv += ["lean", *lean]
    env = {"PYTHONPATH": os.pathsep.join((str(APPS), str(ROOT / "src")))}
    server = Server("", argv, f"http://127.0.0.1:{http_port}/v2/models/{work.model}/infer", env=env)
    over_protocol(server, "", GRPC, grpc_port)
    server.name = LEAN_GRPC if lean else GRPC_LIMIT
    return server


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda:N (default auto)")
    parser.add_argument("--quick", action="store_true", help="short runs (< 60 s in all)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results here")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated models")
    parser.add_argument(
        "--peers",
        default=",".join(p.name for p in PEERS),
        help="comma-separated peers to run (default all: %(default)s)",
    )
    parser.add_argument("--duration", type=float, help="seconds per measured round (5; quick 2)")
    parser.add_argument("--rounds", type=int, help="measured rounds per server (5; quick 1)")
    parser.add_argument("--warmup", type=float, help="seconds of warm-up load (2; quick 1)")
    parser.add_argument(
        "--connections",
        type=int,
        default=32,
        help="open connections, and perf_analyzer's concurrent requests (default 32)",
    )
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk threads (default 1)")
    parser.add_argument(
        "--load",
        choices=("auto", "wrk", "python"),
        default="auto",
        help="load generator: wrk, the built-in Python client, or auto (wrk when installed, "
        "else the Python client; default)",
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=0,
        metavar="N",
        help="processes of the Python client (default 0: a quarter of the cores, 1 to 4)",
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        metavar="S",
        help="seconds for the measurements: a server that would not fit is skipped, peers first "
        "(default none; --quick 50)",
    )
    parser.add_argument(
        "--no-peers", action="store_true", help="measure torchplace and the limits only"
    )
    parser.add_argument(
        "--grpc",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure torchplace (and Triton) over gRPC and over REST with binary tensors, "
        "with perf_analyzer at --connections concurrent requests (default: yes; its venv is "
        "installed when --setup-peers says so)",
    )
    parser.add_argument(
        "--setup-peers",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="build the missing peer venvs with pip before measuring (default: yes on a full "
        "run, no under --quick)",
    )
    parser.add_argument(
        "--venvs",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"where the peer venvs live (default ${venvs.ROOT_ENV} or {venvs.DEFAULT_ROOT})",
    )
    parser.add_argument(
        "--setup-timeout",
        type=float,
        default=1500.0,
        metavar="S",
        help="seconds one peer venv may take to build (default 1500)",
    )
    parser.add_argument(
        "--peer-torch-threads",
        type=int,
        default=0,
        metavar="N",
        help="torch threads in the peers (default 0: torch's own default, what users get); "
        "torchplace leaves one core to its event loop on CPU",
    )
    args = parser.parse_args(argv)
    args.duration = args.duration or (2.0 if args.quick else 5.0)
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.warmup = args.warmup or (1.0 if args.quick else 2.0)
    if args.time_budget is None:
        args.time_budget = 50.0 if args.quick else 0.0
    if args.setup_peers is None:
        args.setup_peers = not args.quick
    args.venvs = (args.venvs or venvs.default_root()).expanduser().resolve()
    if args.connections < 1:
        parser.error(f"--connections must be >= 1, got {args.connections}")
    known = {p.name.lower(): p.name for p in PEERS}
    wanted = [name.strip() for name in args.peers.split(",") if name.strip()]
    unknown = [name for name in wanted if name.lower() not in known]
    if unknown:
        parser.error(f"--peers: unknown {', '.join(unknown)}; known: {', '.join(known.values())}")
    args.peer_names = [] if args.no_peers else [known[name.lower()] for name in wanted]
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.perf = None  # perf_analyzer, once main() has found it
    return args


def workloads(args: argparse.Namespace, wrk: str | None, tmp: Path) -> dict[str, Workload]:
    """Per model: the body in each format, the expected answer and one load per format."""
    processes = args.client_processes or min(4, max(1, (os.cpu_count() or 1) // 4))
    out = {}
    for model in args.models:
        row = input_row(model)
        bodies = {kind: request_body(kind, row) for kind in ("oip", "bentoml")}
        loads: dict[str, WrkLoad | PythonLoad | PerfLoad] = {}
        for kind, body in bodies.items():
            if wrk is not None:
                lua = tmp / f"{model}-{kind}.lua"
                lua.write_text(lua_script(body))
                loads[kind] = WrkLoad(wrk, lua, args.connections, args.wrk_threads)
            else:
                loads[kind] = PythonLoad(body, args.connections, processes)
        if args.perf is not None:
            for protocol, key in PERF_LOADS.items():
                kind = "grpc" if protocol == GRPC else "http"
                loads[key] = PerfLoad(args.perf, model, kind, args.connections)
        out[model] = Workload(model, expected(model, row), bodies, loads)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.skipped = []
    wrk = shutil.which("wrk") if args.load != "python" else None
    if wrk is None and args.load == "wrk":
        print(
            "wrk is not installed (Debian/Ubuntu: apt-get install -y wrk; macOS: brew install "
            "wrk); run with --load python to use the built-in Python client instead.",
            file=sys.stderr,
        )
        return 2
    if wrk is None:
        args.skipped.append(
            "wrk: not installed; the load comes from the built-in Python client, which "
            "saturates before a fast server: only 'ran' and 'answered every request' are checks"
        )
    args.client = "wrk" if wrk is not None else "python"
    from torchplace.devices import resolve_device
    from torchplace.errors import TorchplaceError

    try:
        device = str(resolve_device(args.device))
    except TorchplaceError as exc:
        print(f"FAIL  device {args.device!r} cannot be used here: {exc}", flush=True)
        return 1
    args.device_resolved = device
    peers = [p for p in PEERS if p.name in args.peer_names]
    pythons = peer_pythons(peers, args)
    if args.grpc:
        found = perf_client.ensure(install=args.setup_peers)
        if isinstance(found, str):
            args.skipped.append(f"gRPC and REST binary rows: perf_analyzer {found}")
        else:
            args.perf = found
            for peer in peers:
                if peer.grpc_skip:
                    args.skipped.append(f"{peer.name} over gRPC: {peer.grpc_skip}")
    if importlib.util.find_spec("httptools") is None:
        args.skipped.append(f"{HTTP_LIMIT}: httptools is not installed (torchplace[serve])")
    for line in args.skipped:
        print(f"SKIP  {line}", flush=True)
    threads = server_threads(device)
    args.threads = threads
    runs: list[Run] = []
    ceilings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="tpb-") as tmp_dir:
        tmp = Path(tmp_dir)
        work = workloads(args, wrk, tmp)
        load_name = next(iter(work.values())).loads["oip"].describe()
        print(
            f"serve_vs_peers: device {device}, load from {load_name}, {args.rounds} x "
            f"{args.duration:g} s per server (+{args.warmup:g} s warm-up), one row per request; "
            "figures are medians over the rounds"
            + (f"; time budget {args.time_budget:g} s" if args.time_budget else ""),
            flush=True,
        )
        print("configurations:")
        print(
            "  torchplace: torchplace serve defaults: max batch 32, max delay 2 ms, 1 replica, "
            f"{threads} torch thread(s) on CPU (cores - 1), OIP v2 JSON"
        )
        print(f"  {HTTP_LIMIT}: bare asyncio + httptools (uvloop when installed), fixed reply")
        print(f"  in-process ceiling: batch-32 forward at {threads} torch thread(s)")
        print(
            f"  {LEAN}: uvloop + httptools + orjson, batches of up to 32 rows cut when the "
            f"loop has read what arrived, forward on the loop, {threads} torch thread(s)"
        )
        if args.perf is not None:
            print(
                f"  {REST_BINARY} and {GRPC} rows: the same servers measured by Triton's "
                f"perf_analyzer, {args.connections} concurrent requests of 1 row (zeros), "
                "binary tensors over HTTP, raw contents over gRPC; one server per protocol"
            )
        for peer in peers:
            where = pythons.get(peer.name)
            state = "SKIP" if where is None else f"python {where}"
            print(
                f"  {peer.name}: {peer.batching}; torch threads "
                f"{args.peer_torch_threads or 'default'}; {state}"
            )
        began = time.monotonic()

        def in_budget(what: str, servers: int, startup: float = 10.0, reserve: int = 0) -> bool:
            """Whether ``servers`` more servers, started in about ``startup`` seconds, fit the
            time budget with room left for ``reserve`` servers after them; a SKIP line when
            not."""
            if not args.time_budget:
                return True
            need = servers * (args.warmup + args.duration * args.rounds) + startup
            kept = reserve * (args.warmup + args.duration * args.rounds + startup)
            left = args.time_budget - (time.monotonic() - began)
            if need + kept <= left:
                return True
            line = f"{what}: needs about {need:.0f} s, {max(left, 0.0):.0f} s of the budget left"
            args.skipped.append(line)
            print(f"SKIP  {line}", flush=True)
            return False

        try:
            # torchplace and the HTTP limit on every model first: under a time budget the
            # peers are what gives way
            for i, (model, job) in enumerate(work.items()):
                trace = tmp / f"{model}-trace.json"
                variants = [
                    torchplace_server("torchplace", model, device),
                    torchplace_server("torchplace no-metrics", model, device, "--no-metrics"),
                    torchplace_server(
                        "torchplace +trace-file", model, device, "--trace-file", str(trace)
                    ),
                ]
                # the metrics and tracing variants give way first, keeping room for this
                # model's HTTP limit and for torchplace and the limit on each model after it;
                # the limit keeps room for torchplace on those; torchplace itself is always run
                later = len(work) - i - 1
                if in_budget(
                    f"torchplace's variants on {model}", len(variants) + 1, reserve=2 * later
                ):
                    runs += measure_both_orders(variants, job, args)
                else:
                    runs += measure(variants[:1], job, args)
                if importlib.util.find_spec("httptools") and in_budget(
                    f"{HTTP_LIMIT} on {model}", 1, reserve=later
                ):
                    runs += measure([http_limit_server(job, tmp)], job, args)
            # then the references each model is judged against, then the peers
            for model, job in work.items():
                if importlib.util.find_spec("httptools") and in_budget(f"{LEAN} on {model}", 1):
                    runs += measure([lean_server(job, device, threads, tmp)], job, args)
                if args.perf is not None and in_budget(f"torchplace {GRPC} on {model}", 2):
                    runs += measure_both_orders(torchplace_protocols(model, device), job, args)
                if args.perf is not None and in_budget(f"{GRPC_LIMIT} on {model}", 2):
                    runs += measure([grpc_limit_server(job, tmp)], job, args)
                    lean = grpc_limit_server(job, tmp, device, str(threads))
                    runs += measure([lean], job, args)
            for model, job in work.items():
                for peer in peers:
                    python = pythons.get(peer.name)
                    # a peer may take half a minute to start (Ray, Triton)
                    if python is None or not in_budget(f"{peer.name} on {model}", 1, 30.0):
                        continue
                    server = peer_server(peer, python, model, device, args, tmp)
                    runs += measure([server], job, args)
                    if (
                        args.perf is not None
                        and peer.perf_analyzer
                        and in_budget(f"{peer.name} {GRPC} on {model}", 2, 30.0)
                    ):
                        pair = peer_protocols(peer, python, model, device, args, tmp)
                        runs += measure(pair, job, args)
        finally:
            for job in work.values():
                for load in job.loads.values():
                    load.close()
    # The ceilings run last, once no server is left whose threads they could compete with.
    for model in args.models:
        ceilings[model] = ceiling(model, device, 1.0 if args.quick else 3.0, threads)
        print(
            f"  in-process batch-32 forward ceiling {model}: {ceilings[model]:,.0f} rows/s "
            f"at {threads} torch thread(s)"
        )
    return report(runs, ceilings, args)


def paired_ratio(one: Run, other: Run) -> float:
    """``one``'s req/s over ``other``'s: the median over rounds of the ratio between the two
    measured back to back in the same round, so background load that drifts from round to
    round cancels out instead of landing on one side."""
    pairs = zip(one.extra.get("rounds", []), other.extra.get("rounds", []), strict=False)
    ratios = [a["rps"] / b["rps"] for a, b in pairs if b["rps"]]
    return statistics.median(ratios) if ratios else one.rps / other.rps


def cut(value: float, digits: int) -> float:
    """``value`` cut, not rounded, to ``digits`` decimals: how this script prints the figures
    its targets judge. The targets are round at the precision shown, so a figure then sides
    with its verdict: a cost of 4.96% shows as 4.9% beside "target < 5%" (PASS), a share of 79.6% as
    79% beside ">= 80%" (FAIL), where rounding would print 5.0% and 80%. (The epsilon keeps
    0.29 from showing as 28%; NaN and infinity are returned as they are.)"""
    if not math.isfinite(value):
        return value
    scale = 10**digits
    return math.floor(value * scale + 1e-9) / scale


def paired_cost(with_it: Run, without: Run) -> float:
    """Throughput lost to a feature: 1 - :func:`paired_ratio`."""
    return max(0.0, 1 - paired_ratio(with_it, without))


def _first_line(note: str) -> str:
    return _clip(note.replace("\n", " | "), 300)


def table(runs: list[Run], ceilings: dict[str, float], threads: int) -> None:
    """The results: one row per server and model, torchplace's ratio to it, then the limits.
    The perf_analyzer rows (REST binary, gRPC) follow the wrk rows of their model and are
    compared with torchplace's row of the same protocol."""
    by = {(r.server, r.model): r for r in runs}
    print()
    print(
        f"{'server':<24} {'model':<9} {'req/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'tp/x':>7} "
        f"{'cpu us/req':>10}"
    )

    def order(run: Run) -> tuple[str, bool, bool]:
        return run.model, "client" in run.extra, not run.server.startswith("torchplace")

    for run in sorted(runs, key=order):
        tp = by.get((run.extra.get("compare_to", "torchplace"), run.model))
        ratio = tp.rps / run.rps if tp and run.rps and tp.rps else float("nan")
        note = f"  {_clip(run.note.splitlines()[0], 100)}" if run.note else ""
        print(
            f"{run.server:<24} {run.model:<9} {run.rps:>10.0f} {run.p50_ms:>8.2f} "
            f"{run.p99_ms:>8.2f} {cut(ratio, 2):>6.2f}x {_cpu(run):>10}{note}"
        )
    for model, rows in ceilings.items():
        tp = by.get(("torchplace", model))
        share = f"{cut(tp.rps / rows, 2):>7.0%}" if tp and tp.rps and rows else ""
        print(
            f"{'in-process ceiling':<24} {model:<9} {rows:>10.0f} rows/s at batch 32, "
            f"{threads} thread(s); torchplace at {share.strip() or 'n/a'} of it"
        )
    for model in sorted({r.model for r in runs}):
        tp, limit = by.get(("torchplace", model)), by.get((HTTP_LIMIT, model))
        if tp and limit and tp.rps and limit.rps:
            share = cut(tp.rps / limit.rps, 2)
            print(f"torchplace at {share:.0%} of the {LIMIT_NAMES['http']} on {model}")
        lean = by.get((LEAN, model))
        if lean and lean.rps:  # its share of the limit the model is judged against
            kind = LIMIT_TARGETS.get(model, ("http", 0.0))[0]
            rows = ceilings.get(model, 0.0) if kind == "ceiling" else (limit.rps if limit else 0.0)
            share = f"{lean.rps / rows:.0%}" if rows else "n/a"
            print(f"{LEAN} at {share} of the {LIMIT_NAMES[kind]} on {model}", end="")
            print(f"; torchplace at {tp.rps / lean.rps:.0%} of it" if tp and tp.rps else "")
        rest, grpc = (
            by.get((f"torchplace {REST_BINARY}", model)),
            by.get((f"torchplace {GRPC}", model)),
        )
        if rest and grpc and rest.rps and grpc.rps:
            print(
                f"torchplace {GRPC}/{REST_BINARY} on {model}: {cut(paired_ratio(grpc, rest), 2):.2f}x "
                "(perf_analyzer; the median of the ratios of rounds run back to back)"
            )
        limit = by.get((GRPC_LIMIT, model))
        if grpc and limit and grpc.rps and limit.rps:
            print(f"torchplace at {grpc.rps / limit.rps:.0%} of the {GRPC_LIMIT} on {model}")
        lean = by.get((LEAN_GRPC, model))
        if grpc and rest and lean and lean.rps:
            print(
                f"{LEAN_GRPC} at {lean.rps / rest.rps:.0%} of torchplace's {REST_BINARY} req/s "
                f"on {model}; torchplace {GRPC} at {grpc.rps / lean.rps:.0%} of it"
            )
    print()


def report(runs: list[Run], ceilings: dict[str, float], args: argparse.Namespace) -> int:
    table(runs, ceilings, args.threads)
    by = {(r.server, r.model): r for r in runs}
    checks: list[tuple[str, bool]] = []
    infos: list[tuple[str, bool, str]] = []  # (check, met, why it is information only)
    skips: list[str] = []
    # the targets are defined under wrk: under the Python client they are information only,
    # and so are the few-percent costs of metrics and tracing in --quick's short rounds
    under_wrk = args.client == "wrk"

    def target_append(check: tuple[str, bool]) -> None:
        if not under_wrk:
            infos.append((*check, "targets hold under wrk only"))
        elif args.quick:
            infos.append((*check, "--quick rounds are too short to judge speed"))
        else:
            checks.append(check)

    for run in runs:
        outside = [a for a in run.extra.get("listens", []) if not procs.is_loopback(a)]
        if outside:
            checks.append(
                (f"{run.server} on {run.model} listens on loopback only: {outside}", False)
            )
    for model in sorted({r.model for r in runs}):  # a model left out by the budget has a SKIP
        tp = by.get(("torchplace", model))
        if tp is None or not tp.rps:
            checks.append((f"{model}: torchplace ran", False))
            continue
        checks.append(
            (f"{model}: torchplace answered every request (errors {tp.errors})", tp.errors == 0)
        )
        for peer in args.peer_names:
            other = by.get((peer, model))
            need = RATIO_TARGETS.get(model, {}).get(peer)
            if other is None or not other.rps:
                why = _first_line(other.note) if other else "see the SKIP lines above"
                targets = f">= {need:g}x and p99 below" if need else "p99 below"
                skips.append(f"{model}: {peer} did not run, no target ({targets}) judged: {why}")
                continue
            ratio = tp.rps / other.rps
            if need:
                target_append(
                    (
                        f"{model}: req/s {cut(ratio, 2):.2f}x {peer} (target >= {need:g}x)",
                        ratio >= need,
                    )
                )
            target_append(
                (
                    f"{model}: p99 {tp.p99_ms:.2f} ms below {peer}'s {other.p99_ms:.2f} ms",
                    tp.p99_ms < other.p99_ms,
                )
            )
        if model in LIMIT_TARGETS:
            kind, share = LIMIT_TARGETS[model]
            limit_run = by.get((HTTP_LIMIT, model))
            limit = ceilings.get(model) if kind == "ceiling" else (limit_run and limit_run.rps)
            if limit:
                got = tp.rps / limit
                target_append(
                    (
                        f"{model}: {cut(got, 2):.0%} of the {LIMIT_NAMES[kind]} ({limit:,.0f}/s) "
                        f"(target >= {share:.0%})",
                        got >= share,
                    )
                )
            else:
                skips.append(
                    f"{model}: target >= {share:.0%} of the {LIMIT_NAMES[kind]}: "
                    "the limit was not measured"
                )
        grpc_verdict(by, model, args, checks, infos, skips)
        costs = (  # (feature, the run with it, the run without it)
            ("metrics", tp, by.get(("torchplace no-metrics", model))),
            ("tracing (--trace-file)", by.get(("torchplace +trace-file", model)), tp),
        )
        for feature, with_it, without in costs:
            if with_it is None or without is None or not (with_it.rps and without.rps):
                continue
            cost = paired_cost(with_it, without)
            target_append(
                (
                    f"{model}: {feature} cost {cut(cost, 3):.1%} of req/s "
                    f"(target < {OBSERVABILITY_BUDGET:.0%})",
                    cost < OBSERVABILITY_BUDGET,
                )
            )
    for line in args.skipped:  # SKIP lines were printed at the start
        print(f"skipped: {line}")
    for line in skips:
        print(f"SKIP  {line}")
    for text, ok, why in sorted(infos):
        print(f"INFO  {text} ({'met' if ok else 'not met'}; {why})")
    for text, ok in sorted(checks):
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    if args.json:
        write_json(args, runs, ceilings, checks, infos, skips)
    return 0 if checks and all(ok for _, ok in checks) else 1


def grpc_verdict(
    by: dict[tuple[str, str], Run],
    model: str,
    args: argparse.Namespace,
    checks: list[tuple[str, bool]],
    infos: list[tuple[str, bool, str]],
    skips: list[str],
) -> None:
    """torchplace's gRPC req/s against its REST req/s with binary tensors, both measured by
    perf_analyzer, judged on their :func:`paired_ratio`: a check on GRPC_TARGET_MODELS
    (information under --quick), else information."""
    if not args.grpc:
        return
    rest, grpc = by.get((f"torchplace {REST_BINARY}", model)), by.get((f"torchplace {GRPC}", model))
    text = f"{model}: gRPC req/s >= REST binary req/s on {model}"
    if rest is None or grpc is None or not (rest.rps and grpc.rps):
        if model in GRPC_TARGET_MODELS:
            run = rest if rest is not None and rest.note else grpc
            why = _first_line(run.note) if run is not None and run.note else "see SKIP above"
            skips.append(f"{text}: not judged, torchplace was not measured over both: {why}")
        return
    ratio = paired_ratio(grpc, rest)
    check = (
        f"{text} ({grpc.rps:,.0f} vs {rest.rps:,.0f} req/s; paired ratio {cut(ratio, 2):.2f}x; "
        f"perf_analyzer, {args.connections} concurrent, {len(grpc.extra.get('rounds', []))} "
        "rounds)",
        ratio >= 1.0,
    )
    if model not in GRPC_TARGET_MODELS:
        infos.append((*check, f"the target is on {', '.join(GRPC_TARGET_MODELS)}"))
    elif args.quick:
        infos.append((*check, "--quick rounds are too short to judge speed"))
    else:
        checks.append(check)


def write_json(
    args: argparse.Namespace,
    runs: list[Run],
    ceilings: dict[str, float],
    checks: list[tuple[str, bool]],
    infos: list[tuple[str, bool, str]],
    skips: list[str],
) -> None:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "serve_vs_peers",
        "device": args.device_resolved,
        "load": args.client,
        "connections": args.connections,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "torch_threads": args.threads,
        "peers": {p.name: p.batching for p in PEERS if p.name in args.peer_names},
        "runs": [asdict(r) for r in runs],
        "ceiling_rows_per_s": ceilings,
        "protocols": {
            "client": "perf_analyzer (tritonclient 2.51.0)" if args.perf else None,
            "concurrency": args.connections,
            "rows": f"'torchplace|PEER {REST_BINARY}', 'torchplace|PEER {GRPC}'",
        },
        "checks": [{"check": t, "pass": ok} for t, ok in checks],
        "information": [{"check": t, "met": ok, "why": why} for t, ok, why in infos],
        "skipped": args.skipped + skips,
    }
    args.json.write_text(json.dumps(doc, indent=2))


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM (``timeout``, a CI runner) unwinds like Ctrl-C: the servers, each in its own
    session, are stopped by the ``finally`` blocks instead of being left running."""
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.exit(main())
