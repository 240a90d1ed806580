#!/usr/bin/env python
"""torchplace serve vs LitServe vs the article's Predictor behind FastAPI+uvicorn, under wrk.

One run, same machine, same models (seed-mlp, wide-mlp built by ``torchplace.models``), same
load: ``wrk`` with 32 connections for a fixed duration, POSTing the same Open Inference
Protocol JSON body (one row) to each server. Peers:

* LitServe with dynamic batching (max batch 32, 5 ms batch timeout), one worker;
* the article's ``Predictor`` (model placed once, one forward per request under
  ``inference_mode``) behind FastAPI on uvicorn (uvloop + httptools), one worker.

Each server is a subprocess on a free 127.0.0.1 port; each answer format is checked against
the model run in-process before it is measured. Prints req/s, p50, p99 and the ratios, the
model's in-process batched throughput (the ceiling), the cost of metrics + tracing in
torchplace, one PASS/FAIL line per target, and exits 1 if a target is missed.

Targets (issue 3/4): wide-mlp >= 5x LitServe and >= 4x FastAPI req/s; seed-mlp >= 6x LitServe
and >= 3x FastAPI; torchplace p99 below both peers' in each case; metrics + tracing cost < 5%
of req/s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MODELS = ("seed-mlp", "wide-mlp")
TARGETS = {  # model -> (x LitServe, x FastAPI)
    "seed-mlp": (6.0, 3.0),
    "wide-mlp": (5.0, 4.0),
}
OBSERVABILITY_BUDGET = 0.05

LITSERVE_SCRIPT = """
import sys
import litserve as ls
import torch
from torchplace.models import build_model

NAME, PORT, ACCEL = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if len(sys.argv) > 4 and int(sys.argv[4]) > 0:
    torch.set_num_threads(int(sys.argv[4]))


class API(ls.LitAPI):
    def setup(self, device):
        self.device = device
        self.model = build_model(NAME).eval().to(device)

    def decode_request(self, request):
        tensor = request["inputs"][0]
        return torch.tensor(tensor["data"], dtype=torch.float32).reshape(tensor["shape"])

    def batch(self, inputs):
        return torch.cat(inputs)

    def predict(self, x):
        with torch.inference_mode():
            return self.model(x.to(self.device)).cpu()

    def unbatch(self, output):
        return list(output.split(1))

    def encode_response(self, output):
        return {
            "model_name": NAME,
            "outputs": [
                {
                    "name": "output",
                    "datatype": "FP32",
                    "shape": list(output.shape),
                    "data": output.flatten().tolist(),
                }
            ],
        }


if __name__ == "__main__":
    api = API(max_batch_size=32, batch_timeout=0.005, api_path=f"/v2/models/{NAME}/infer")
    server = ls.LitServer(api, accelerator=ACCEL, devices=1, workers_per_device=1)
    server.run(host="127.0.0.1", port=PORT, generate_client_file=False, log_level="warning")
"""

FASTAPI_SCRIPT = """
import sys
import torch
import uvicorn
from fastapi import FastAPI
from torchplace.models import build_model

NAME, PORT, DEVICE = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if len(sys.argv) > 4 and int(sys.argv[4]) > 0:
    torch.set_num_threads(int(sys.argv[4]))


class Predictor:  # the article's section 5.3, with the device injected
    def __init__(self, model, device):
        self.device = torch.device(device)
        self.model = model.eval().to(self.device)

    def predict(self, features):
        x = torch.as_tensor(features, dtype=torch.float32)
        x = x.to(self.device)
        with torch.inference_mode():
            y = self.model(x)
        return y.cpu().numpy()


predictor = Predictor(build_model(NAME), DEVICE)
app = FastAPI()


@app.get("/health")
async def health():
    return {"ok": True}


@app.post(f"/v2/models/{NAME}/infer")
async def infer(body: dict):
    tensor = body["inputs"][0]
    y = predictor.predict(tensor["data"]).reshape(tensor["shape"][0], -1)
    return {
        "model_name": NAME,
        "outputs": [
            {"name": "output", "datatype": "FP32", "shape": list(y.shape),
             "data": y.ravel().tolist()}
        ],
    }


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning", access_log=False)
"""


@dataclass
class Run:
    server: str
    model: str
    rps: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    requests: int = 0
    errors: int = 0
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def body_for(model: str) -> bytes:
    from torchplace.models import embedded_model

    width = embedded_model(model).inputs[0].shape[1]
    data = [round(((i * 37) % 17) / 17.0 - 0.5, 4) for i in range(width)]
    doc = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, width], "data": data}]}
    return json.dumps(doc, separators=(",", ":")).encode()


def expected(model: str, body: bytes) -> list[float]:
    import torch

    from torchplace.models import build_model

    tensor = json.loads(body)["inputs"][0]
    x = torch.tensor(tensor["data"], dtype=torch.float32).reshape(tensor["shape"])
    with torch.inference_mode():
        return [float(v) for v in build_model(model)(x).flatten()]


def ceiling(model: str, device: str, seconds: float) -> float:
    """In-process batched forward throughput at batch 32 (rows/s): the upper bound."""
    import torch

    from torchplace.models import build_model, embedded_model

    dev = torch.device(device)
    net = build_model(model).to(dev)
    width = embedded_model(model).inputs[0].shape[1]
    x = torch.randn(32, width, device=dev)
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
    return n * 32 / took


@contextlib.contextmanager
def server_processes(
    servers: list[tuple[list[str], str]], timeout: float = 120.0
) -> Iterator[None]:
    """Start every ``(argv, health_url)`` at once, wait until all answer 200, stop them all."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started: list[tuple[subprocess.Popen[bytes], Any]] = []
    try:
        for argv, _ in servers:
            log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
            # A session of its own, so a peer's worker processes stop with it as a group.
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            started.append((proc, log))
        deadline = time.monotonic() + timeout
        waiting = list(range(len(servers)))
        while waiting:
            for i in list(waiting):
                proc, log = started[i]
                argv, health_url = servers[i]
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(
                        f"{argv[1:3]} exited with {proc.returncode}:\n"
                        f"{log.read().decode(errors='replace')[-3000:]}"
                    )
                with (
                    contextlib.suppress(urllib.error.URLError, OSError),
                    urllib.request.urlopen(health_url, timeout=2) as resp,
                ):
                    if resp.status == 200:
                        waiting.remove(i)
            if time.monotonic() > deadline:
                raise RuntimeError(f"servers not ready within {timeout} s")
            if waiting:
                time.sleep(0.2)
        yield
    finally:
        for proc, _ in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, log in started:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            # Workers that outlived their parent (LitServe's may even start during shutdown):
            # kill the group until it is empty, bounded.
            for _ in range(50):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            log.close()


def check_answer(url: str, body: bytes, want: list[float]) -> None:
    req = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        got = json.loads(resp.read())["outputs"][0]["data"]
    flat = [float(v) for row in got for v in (row if isinstance(row, list) else [row])]
    if len(flat) != len(want) or any(
        abs(a - b) > 1e-4 + 1e-4 * abs(b) for a, b in zip(flat, want, strict=True)
    ):
        raise RuntimeError(f"{url} answered {flat[:4]}..., expected {want[:4]}...")


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    found = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    if not found:
        return float("nan")
    return float(found.group(1)) * _UNITS[found.group(2)]


def run_wrk(
    wrk: str, url: str, lua: Path, *, seconds: float, connections: int, threads: int
) -> dict[str, Any]:
    cmd = [
        wrk,
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "--latency",
        "-s",
        str(lua),
        url,
    ]
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=seconds + 60, check=True
    ).stdout
    result: dict[str, Any] = {"raw": out}
    found = re.search(r"Requests/sec:\s+([\d.]+)", out)
    result["rps"] = float(found.group(1)) if found else 0.0
    found = re.search(r"(\d+) requests in", out)
    result["requests"] = int(found.group(1)) if found else 0
    for pct in ("50", "99"):
        found = re.search(rf"^\s+{pct}%\s+(\S+)", out, re.M)
        result[f"p{pct}"] = _ms(found.group(1)) if found else float("nan")
    errors = 0
    found = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    if found:
        errors += int(found.group(1))
    found = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if found:
        errors += sum(int(g) for g in found.groups())
    result["errors"] = errors
    return result


@dataclass
class Server:
    name: str
    argv: list[str]
    health: str
    url: str


def measure(
    servers: list[Server],
    model: str,
    body: bytes,
    want: list[float],
    args: argparse.Namespace,
    lua: Path,
    wrk: str,
) -> list[Run]:
    """Start the servers together, warm each up, then measure them in turn, round after
    round (A B C, B C A, C A B, ...), so that drifting background load hits them alike;
    each figure is the median over the rounds."""
    runs = {s.name: Run(s.name, model) for s in servers}
    rounds: dict[str, list[dict[str, Any]]] = {s.name: [] for s in servers}
    common = {"connections": args.connections, "threads": args.wrk_threads}
    try:
        with server_processes([(s.argv, s.health) for s in servers]):
            for server in servers:
                check_answer(server.url, body, want)
            for server in servers:
                run_wrk(wrk, server.url, lua, seconds=args.warmup, **common)
            for index in range(args.rounds):
                # Rotate who goes first: a slot in the round must not favour one variant.
                shift = index % len(servers)
                for server in servers[shift:] + servers[:shift]:
                    result = run_wrk(wrk, server.url, lua, seconds=args.duration, **common)
                    rounds[server.name].append(result)
    except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
        for run in runs.values():
            run.note = f"failed: {exc}"[:500]
        print(f"  {', '.join(runs)} {model}: failed: {exc}"[:600], flush=True)
        return list(runs.values())
    for name, run in runs.items():
        done = rounds[name]
        run.rps = statistics.median(r["rps"] for r in done)
        run.p50_ms = statistics.median(r["p50"] for r in done)
        run.p99_ms = statistics.median(r["p99"] for r in done)
        run.requests = sum(r["requests"] for r in done)
        run.errors = sum(r["errors"] for r in done)
        run.extra["rounds"] = [
            {"rps": r["rps"], "p50_ms": r["p50"], "p99_ms": r["p99"]} for r in done
        ]
        per_round = ", ".join(f"{r['rps']:.0f}" for r in done)
        print(
            f"  {name:<22} {model:<9} {run.rps:>10.0f} req/s  p50 {run.p50_ms:7.2f} ms  "
            f"p99 {run.p99_ms:7.2f} ms  errors {run.errors}  (rounds: {per_round} req/s)",
            flush=True,
        )
    return list(runs.values())


def measure_both_orders(
    servers: list[Server],
    model: str,
    body: bytes,
    want: list[float],
    args: argparse.Namespace,
    lua: Path,
    wrk: str,
) -> list[Run]:
    """Measure the torchplace variants twice, started in one order and then in the reverse
    order (fresh processes), and pool the rounds. On a small machine the order in which
    processes start shifts their throughput by several percent; pooling both orders keeps that
    out of the metrics and tracing cost, which is a difference of a few percent itself."""
    total = args.rounds
    first = argparse.Namespace(**{**vars(args), "rounds": max(1, (total + 1) // 2)})
    runs = measure(servers, model, body, want, first, lua, wrk)
    if total < 2:
        return runs
    second = argparse.Namespace(**{**vars(args), "rounds": total // 2})
    again = {run.server: run for run in measure(servers[::-1], model, body, want, second, lua, wrk)}
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda:N (default auto)")
    parser.add_argument("--quick", action="store_true", help="short runs (< 60 s in all)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results here")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated models")
    parser.add_argument("--duration", type=float, help="seconds per measured round (5; quick 2)")
    parser.add_argument("--rounds", type=int, help="measured rounds per server (5; quick 1)")
    parser.add_argument("--warmup", type=float, help="seconds of warm-up load (2; quick 1)")
    parser.add_argument(
        "--connections", type=int, default=32, help="open wrk connections (default 32)"
    )
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk threads (default 1)")
    parser.add_argument(
        "--no-peers", action="store_true", help="measure torchplace only (no ratios)"
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
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    wrk = shutil.which("wrk")
    if wrk is None:
        print(
            "wrk is not installed: this benchmark needs it as the load generator.\n"
            "Install it (Debian/Ubuntu: apt-get update && apt-get install -y wrk; macOS: brew "
            "install wrk) and run again.",
            file=sys.stderr,
        )
        return 1
    from torchplace.devices import resolve_device

    device = str(resolve_device(args.device))
    accel = "cuda" if device.startswith("cuda") else "cpu"
    python = sys.executable
    runs: list[Run] = []
    ceilings: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        lit = tmp / "litserve_peer.py"
        lit.write_text(textwrap.dedent(LITSERVE_SCRIPT))
        fast = tmp / "fastapi_peer.py"
        fast.write_text(textwrap.dedent(FASTAPI_SCRIPT))
        print(
            f"serve_vs_peers: device {device}, wrk {args.connections} connections, "
            f"{args.rounds} x {args.duration:g} s per server (+{args.warmup:g} s warm-up), "
            "one row per request; figures are medians over the rounds",
            flush=True,
        )
        for model in models:
            body = body_for(model)
            want = expected(model, body)
            lua = tmp / f"{model}.lua"
            lua.write_text(
                'wrk.method = "POST"\n'
                'wrk.headers["Content-Type"] = "application/json"\n'
                f"wrk.body = [[{body.decode()}]]\n"
            )
            path = f"/v2/models/{model}/infer"

            def torchplace(name: str, *extra: str, model: str = model, path: str = path) -> Server:
                port = free_port()
                base = f"http://127.0.0.1:{port}"
                argv = [python, "-m", "torchplace.cli", "serve", "--model", model]
                argv += ["--port", str(port), "--device", device, "--log-level", "warning"]
                return Server(name, [*argv, *extra], f"{base}/v2/health/ready", base + path)

            trace = tmp / f"{model}-trace.json"
            variants = [
                torchplace("torchplace"),
                torchplace("torchplace no-metrics", "--no-metrics"),
                torchplace("torchplace +trace-file", "--trace-file", str(trace)),
            ]
            runs += measure_both_orders(variants, model, body, want, args, lua, wrk)
            if args.no_peers:
                continue
            for name, script, where in (
                ("LitServe", lit, accel),
                ("FastAPI+uvicorn", fast, device),
            ):
                port = free_port()
                base = f"http://127.0.0.1:{port}"
                peer = Server(
                    name,
                    [python, str(script), model, str(port), where, str(args.peer_torch_threads)],
                    f"{base}/health",
                    base + path,
                )
                runs += measure([peer], model, body, want, args, lua, wrk)
    # The ceilings run last, once no server is left whose threads they could compete with.
    for model in models:
        ceilings[model] = ceiling(model, device, 1.0 if args.quick else 3.0)
        print(f"  in-process batch-32 forward ceiling {model}: {ceilings[model]:,.0f} rows/s")
    return report(runs, ceilings, args)


def paired_cost(with_it: Run, without: Run) -> float:
    """Throughput lost to a feature: 1 - the median over rounds of the ratio between the two
    variants measured back to back in the same round, so background load that drifts from
    round to round cancels out instead of landing on one side."""
    pairs = zip(with_it.extra.get("rounds", []), without.extra.get("rounds", []), strict=False)
    ratios = [a["rps"] / b["rps"] for a, b in pairs if b["rps"]]
    ratio = statistics.median(ratios) if ratios else with_it.rps / without.rps
    return max(0.0, 1 - ratio)


def report(runs: list[Run], ceilings: dict[str, float], args: argparse.Namespace) -> int:
    by = {(r.server, r.model): r for r in runs}
    print()
    print(f"{'server':<22} {'model':<9} {'req/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'x tp':>6}")
    for run in runs:
        tp = by.get(("torchplace", run.model))
        ratio = tp.rps / run.rps if tp and run.rps and tp.rps else float("nan")
        print(
            f"{run.server:<22} {run.model:<9} {run.rps:>10.0f} {run.p50_ms:>8.2f} "
            f"{run.p99_ms:>8.2f} {ratio:>6.2f}" + (f"  {run.note}" if run.note else "")
        )
    for model, rows in ceilings.items():
        print(f"{'in-process ceiling':<22} {model:<9} {rows:>10.0f} rows/s at batch 32")
    print()
    checks: list[tuple[str, bool]] = []
    for model in {r.model for r in runs}:
        tp = by.get(("torchplace", model))
        if tp is None or not tp.rps:
            checks.append((f"{model}: torchplace ran", False))
            continue
        checks.append(
            (f"{model}: torchplace answered every request (errors {tp.errors})", tp.errors == 0)
        )
        if not args.no_peers:
            lit_x, fast_x = TARGETS.get(model, (0.0, 0.0))
            for peer, need in (("LitServe", lit_x), ("FastAPI+uvicorn", fast_x)):
                other = by.get((peer, model))
                if other is None or not other.rps:
                    checks.append((f"{model}: {peer} ran", False))
                    continue
                ratio = tp.rps / other.rps
                checks.append(
                    (f"{model}: req/s {ratio:.2f}x {peer} (target >= {need:g}x)", ratio >= need)
                )
                checks.append(
                    (
                        f"{model}: p99 {tp.p99_ms:.2f} ms below {peer}'s {other.p99_ms:.2f} ms",
                        tp.p99_ms < other.p99_ms,
                    )
                )
        off = by.get(("torchplace no-metrics", model))
        if off is not None and off.rps:
            cost = paired_cost(tp, off)
            checks.append(
                (
                    f"{model}: metrics cost {cost:.1%} of req/s "
                    f"(target < {OBSERVABILITY_BUDGET:.0%})",
                    cost < OBSERVABILITY_BUDGET,
                )
            )
        traced = by.get(("torchplace +trace-file", model))
        if traced is not None and traced.rps:
            cost = paired_cost(traced, tp)
            checks.append(
                (
                    f"{model}: tracing (--trace-file) cost {cost:.1%} of req/s "
                    f"(target < {OBSERVABILITY_BUDGET:.0%})",
                    cost < OBSERVABILITY_BUDGET,
                )
            )
    for text, ok in sorted(checks):
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "benchmark": "serve_vs_peers",
                    "device": args.device,
                    "connections": args.connections,
                    "duration_s": args.duration,
                    "runs": [asdict(r) for r in runs],
                    "ceiling_rows_per_s": ceilings,
                    "checks": [{"check": t, "pass": ok} for t, ok in checks],
                },
                indent=2,
            )
        )
    return 0 if checks and all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
