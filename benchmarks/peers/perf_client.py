"""Triton's own load tool, ``perf_analyzer``, as a load client: where it comes from, one run.

It speaks the Open Inference Protocol over HTTP with binary tensors (Triton's binary tensor
extension, its default) and over gRPC (raw contents), so one client measures both protocols
alike. It reads the model's configuration first (Triton's model configuration extension), so
it runs against servers that serve that extension only (torchplace, Triton).

What it needs, installed (:func:`ensure`) outside the repository when missing:

* ``tritonclient==2.51.0`` in its own venv (``~/.cache/torchplace-bench/venvs/perf-analyzer``):
  its wheel bundles a ``perf_analyzer`` binary that runs on older glibc than the newer
  ``perf-analyzer`` wheel (glibc >= 2.38);
* the CUDA runtime library the binary links against, from the ``nvidia-cuda-runtime-cu12``
  wheel in the same venv (no GPU is needed or used);
* ``libb64.so.0d`` (Debian: ``apt-get install libb64-0d``; tried when missing and root).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VENV = Path.home() / ".cache" / "torchplace-bench" / "venvs" / "perf-analyzer"
#: a --stability-percentage no three windows miss: a fixed-length measurement
STABILITY_OFF = 10_000
PACKAGES = ("tritonclient[all]==2.51.0", "nvidia-cuda-runtime-cu12")


def _run(cmd: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )


@dataclass(frozen=True)
class PerfAnalyzer:
    """The binary and the environment it runs in."""

    binary: Path
    env: dict[str, str] = field(repr=False)

    def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return _run([str(self.binary), *args], timeout, env=self.env)


def ensure(install: bool = True, venv: Path = VENV) -> PerfAnalyzer | str:
    """perf_analyzer ready to run, or why not (installed first when ``install`` says so)."""
    python = venv / "bin" / "python"
    binary = venv / "bin" / "perf_analyzer"
    if not binary.exists():
        if not install:
            return f"not installed in {venv} (a full run, or --setup-peers, installs it)"
        if not python.exists():
            made = _run([sys.executable, "-m", "venv", str(venv)], 300)
            if made.returncode != 0:
                return f"cannot create {venv}: {made.stderr.strip()[-300:]}"
        print(f"installing {' '.join(PACKAGES)} into {venv} ...", flush=True)
        pip = _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *PACKAGES], 900)  # fmt: skip
        if pip.returncode != 0 or not binary.exists():
            return f"cannot install {' '.join(PACKAGES)}: {pip.stderr.strip()[-300:]}"
    libs = glob.glob(
        str(venv / "lib" / "python3*" / "site-packages" / "nvidia" / "cuda_runtime" / "lib")
    )
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join([*libs, env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    missing = _missing_libraries(binary, env)
    if (
        missing
        and install
        and any("libb64" in m for m in missing)
        and shutil.which("apt-get")
        and os.geteuid() == 0
    ):
        print("installing libb64-0d with apt-get ...", flush=True)
        _run(["apt-get", "install", "-y", "-qq", "libb64-0d"], 300)
        missing = _missing_libraries(binary, env)
    if missing:
        return f"the binary lacks {', '.join(missing)} (Debian: apt-get install libb64-0d)"
    tool = PerfAnalyzer(binary, env)
    version = tool.run(["--version"], 30)
    if version.returncode not in (0, 1) or "error while loading" in version.stderr:
        return f"the binary does not run: {version.stderr.strip()[-300:]}"
    return tool


def _missing_libraries(binary: Path, env: dict[str, str]) -> list[str]:
    ldd = _run(["ldd", str(binary)], 30, env=env)
    return sorted({line.split()[0] for line in ldd.stdout.splitlines() if "not found" in line})


def command(
    model: str,
    address: str,
    protocol: str,
    concurrency: str,
    *,
    interval_ms: int,
    max_trials: int,
    stability: int,
    shared_memory: str = "none",
) -> list[str]:
    """perf_analyzer's arguments: one row per request, zeros as input, ``concurrency`` as
    ``START:END:STEP``, binary tensors both ways over HTTP (its default, said explicitly);
    ``shared_memory="system"``: tensors through system shared memory instead."""
    args = ["-m", model, "-u", address, "-i", protocol, "-b", "1",
            "--concurrency-range", concurrency, "-p", str(interval_ms),
            "--max-trials", str(max_trials), "--input-data", "zero",
            "--stability-percentage", str(stability)]  # fmt: skip
    if protocol == "http":
        args += ["--input-tensor-format", "binary", "--output-tensor-format", "binary"]
    if shared_memory != "none":
        args += ["--shared-memory", shared_memory]
    return args


def rates(output: str) -> dict[int, float]:
    """req/s per concurrency from perf_analyzer's summary lines."""
    found = re.findall(r"Concurrency: (\d+), throughput: ([\d.]+) infer/sec", output)
    return {int(c): float(r) for c, r in found}


def summary(output: str) -> dict[str, Any]:
    """The last measurement of a run: ``rps``, ``requests``, ``p50`` and ``p99`` (ms)."""

    def last(pattern: str) -> float:
        found = re.findall(pattern, output)
        return float(found[-1]) if found else float("nan")

    return {
        "rps": last(r"Throughput: ([\d.]+) infer/sec"),
        "requests": int(last(r"Request count: (\d+)")) if "Request count" in output else 0,
        "p50": last(r"p50 latency: (\d+) usec") / 1e3,
        "p99": last(r"p99 latency: (\d+) usec") / 1e3,
    }


class PerfLoad:
    """perf_analyzer as a load of :mod:`peers.load`'s shape: ``load(address, seconds)`` holds
    ``connections`` requests in flight over ``protocol`` (``http`` with binary tensors, or
    ``grpc``) for three windows of ``seconds / 3`` (no stability check) and returns ``rps``, ``requests``, ``p50``,
    ``p99`` (ms) and ``errors`` (perf_analyzer stops at the first failed request: a failure is a
    RuntimeError with its output's end)."""

    def __init__(self, tool: PerfAnalyzer, model: str, protocol: str, connections: int) -> None:
        if protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be 'http' or 'grpc', got {protocol!r}")
        self.tool = tool
        self.model = model
        self.protocol = protocol
        self.connections = connections

    def describe(self) -> str:
        kind = "gRPC" if self.protocol == "grpc" else "HTTP with binary tensors"
        return f"perf_analyzer ({kind}, {self.connections} concurrent requests)"

    def close(self) -> None:
        """Nothing stays running between calls."""

    def __call__(self, address: str, seconds: float) -> dict[str, Any]:
        c = self.connections
        args = command(
            self.model,
            address,
            self.protocol,
            f"{c}:{c}:1",
            interval_ms=max(200, round(seconds * 1000 / 3)),
            max_trials=3,
            # its stability check off: three windows, averaged, every time (on a shared machine
            # even 100% failed now and then); the benchmark's rounds and medians handle noise
            stability=STABILITY_OFF,
        )
        done = self.tool.run(args, timeout=60 + 3 * seconds)
        result = summary(done.stdout)
        if done.returncode != 0 or not result["rps"] > 0:
            tail = (done.stdout + done.stderr).strip()[-600:]
            raise RuntimeError(f"perf_analyzer -i {self.protocol} {address} failed: {tail}")
        result["errors"] = 0
        result["raw"] = done.stdout
        return result
