"""torchplace lint vs TorchFix: files per second on the same files, one process each.

Both tools run as a single process on the same explicit list of files (``torch/nn`` of the
installed torch package), and the wall-clock time of each process is measured. Then torchplace
runs alone over the whole installed torch package in one process, which must finish in under
20 s with no internal error (every file linted, syntax errors reported as findings).

Targets: torchplace at least 50x TorchFix's files/second; the whole torch package in < 20 s.
The same run measures the floor under any linter built on Python's ``ast``: every file of the
package parsed (and its tree freed) in one process, with nothing else done. The ratio to it
reads the same on a busy machine as on a quiet one.
Both tools run from bytecode, as a package installed by pip does (pip compiles it at install):
each tool's package is compiled first, which an editable install or PYTHONDONTWRITEBYTECODE
would otherwise leave to every run (about 0.1 s of start-up each).
No GPU is involved: ``--device`` is accepted for a uniform benchmark interface and ignored.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MIN_SPEEDUP = 50.0
MAX_TORCH_SECONDS = 20.0
QUICK_FILES = 64
TIMEOUT_S = 900.0


def _torch_root() -> Path:
    spec = importlib.util.find_spec("torch")  # locates the package without importing it
    if spec is None or spec.origin is None:
        raise SystemExit("torch is not installed")
    return Path(spec.origin).parent


def _compile_tools() -> None:
    """Write the bytecode of both tools' packages, as ``pip install`` does for an installed one
    (an up-to-date file is left as it is)."""
    for name in ("torchplace", "torchfix"):
        spec = importlib.util.find_spec(name)  # locates the package without importing it
        if spec is not None and spec.origin is not None:
            compileall.compile_dir(Path(spec.origin).parent, quiet=1)


def _run(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    return time.perf_counter() - start, proc


# Every .py/.pyi file under argv[1] through ast.parse, trees freed, the collector off as the
# linter has it; prints the seconds it took.
_PARSE_ONLY = """
import ast, gc, pathlib, sys, time
gc.disable()
start = time.perf_counter()
for path in sorted(pathlib.Path(sys.argv[1]).rglob("*.py*")):
    if path.suffix in {".py", ".pyi"}:
        try:
            ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            pass
print(time.perf_counter() - start)
"""


def _torchplace(files: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torchplace.cli",
        "lint",
        "--isolated",
        "--jobs",
        "1",
        "--exit-zero",
        "--json",
        *files,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="ignored: linting needs no device")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_FILES} files of torch/nn")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)

    root = _torch_root()
    _compile_tools()
    files = sorted(str(p) for p in (root / "nn").rglob("*.py"))
    if args.quick:
        # An even spread over the directory, so the subset is not only small __init__ files.
        step = max(1, len(files) // QUICK_FILES)
        files = files[::step][:QUICK_FILES]

    tp_seconds, tp = _run(_torchplace(files))
    if tp.returncode != 0:
        print(tp.stderr, file=sys.stderr)
        raise SystemExit(f"torchplace lint failed with exit status {tp.returncode}")
    tp_findings = len(json.loads(tp.stdout)["result"]["findings"])

    tf_seconds, tf = _run([sys.executable, "-m", "torchfix", "--jobs", "1", *files])
    if tf.returncode not in (0, 1):
        print(tf.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"torchfix failed with exit status {tf.returncode}")
    tf_findings = sum(1 for line in tf.stdout.splitlines() if ": TOR" in line)

    whole_files = sum(1 for p in root.rglob("*.py*") if p.suffix in {".py", ".pyi"})
    whole_seconds, whole = _run(_torchplace([str(root)]))
    crashes = [line for line in whole.stderr.splitlines() if "internal error" in line]
    whole_ok = whole.returncode == 0 and not crashes
    found = json.loads(whole.stdout)["result"]["findings"] if whole.returncode == 0 else None
    whole_findings = -1 if found is None else len(found)
    syntax = -1 if found is None else sum(1 for f in found if f["code"] == "TPL000")

    floor = subprocess.run(
        [sys.executable, "-c", _PARSE_ONLY, str(root)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
    )
    parse_seconds = float(floor.stdout.strip())

    tp_rate = len(files) / tp_seconds
    tf_rate = len(files) / tf_seconds
    speedup = tp_rate / tf_rate
    rows = [
        ("torchplace lint", len(files), tp_seconds, tp_rate, tp_findings),
        ("TorchFix", len(files), tf_seconds, tf_rate, tf_findings),
    ]
    print(f"same files: {len(files)} from torch/nn, one process each (wall clock)")
    print(f"{'tool':<16} {'files':>6} {'seconds':>9} {'files/s':>9} {'findings':>9}")
    for name, count, seconds, rate, found in rows:
        print(f"{name:<16} {count:>6} {seconds:>9.2f} {rate:>9.1f} {found:>9}")
    speed_pass = speedup >= MIN_SPEEDUP
    whole_pass = whole_ok and whole_seconds < MAX_TORCH_SECONDS
    print(f"ratio: torchplace is {speedup:.0f}x TorchFix's files/second")
    print(
        f"whole torch package: {whole_files} files in {whole_seconds:.2f} s, one process; "
        f"{whole_findings} findings ({syntax} syntax errors reported as TPL000), "
        f"{len(crashes)} internal errors"
    )
    print(
        f"floor: parsing the same files with Python's ast alone takes {parse_seconds:.2f} s; "
        f"torchplace takes {whole_seconds / parse_seconds:.1f}x that"
    )
    # under --quick the few files leave start-up costs to dominate: the speed-up is INFO there
    speed = "INFO" if args.quick else ("PASS" if speed_pass else "FAIL")
    why = " (--quick: too few files to judge)" if args.quick else ""
    print(f"{speed}: speed-up >= {MIN_SPEEDUP:.0f}x ({speedup:.0f}x){why}")
    print(
        f"{'PASS' if whole_pass else 'FAIL'}: whole torch package < {MAX_TORCH_SECONDS:.0f} s "
        f"with zero crashes ({whole_seconds:.2f} s, exit {whole.returncode})"
    )
    if args.json is not None:
        result: dict[str, Any] = {
            "files": len(files),
            "quick": args.quick,
            "torchplace": {"seconds": tp_seconds, "files_per_s": tp_rate, "findings": tp_findings},
            "torchfix": {"seconds": tf_seconds, "files_per_s": tf_rate, "findings": tf_findings},
            "speedup": speedup,
            "whole_torch": {
                "files": whole_files,
                "seconds": whole_seconds,
                "parse_only_seconds": parse_seconds,
                "findings": whole_findings,
                "internal_errors": len(crashes),
                "exit_status": whole.returncode,
            },
            "targets": {"speedup": speed_pass, "whole_torch": whole_pass},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if (speed_pass or args.quick) and whole_pass else 1


if __name__ == "__main__":
    sys.exit(main())
