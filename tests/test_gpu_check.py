"""scripts/gpu-check can collect the CUDA tests on a GPU machine that lacks the optional extras.

The GPU machine runs ``pytest -m cuda`` from source with only the core dependencies and the
serve extra's parsers; one test module importing an optional package at its top would stop the
whole collection, and with it every CUDA test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Packages of the extras (trace, test, peers) that a GPU machine's image may not have.
ABSENT = (
    "opentelemetry",
    "schemathesis",
    "jsonschema",
    "litserve",
    "fastapi",
    "uvicorn",
    "torchfix",
)

_COLLECT = f"""
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {ABSENT!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Absent())
import pytest
sys.exit(pytest.main(["--collect-only", "-q", "-m", "cuda", "-p", "no:cacheprovider", "tests"]))
"""


def test_cuda_tests_collect_without_the_optional_extras() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-c", _COLLECT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "error" not in out.stdout.lower().splitlines()[-1], out.stdout[-3000:]
    collected = [line for line in out.stdout.splitlines() if "::" in line]
    assert len(collected) >= 40, out.stdout[-3000:]
