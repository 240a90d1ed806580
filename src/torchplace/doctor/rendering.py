"""The doctor report for people: the facts, the visible devices, the checks and the verdict as
rich tables (the ``text`` format of ``torchplace doctor``)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from torchplace.doctor.checks import gib
from torchplace.report import console_width

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["render"]

_MARK = {
    "pass": "[green]✓ pass[/]",
    "warn": "[yellow]! warn[/]",
    "fail": "[red]✗ FAIL[/]",
    "skip": "[dim]- skip[/]",
    "info": "[cyan]i info[/]",
}


#: control characters shown as escapes (``\x1b``): an environment variable or a driver's
#: string holding a terminal escape sequence must not move the cursor or clear the screen
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(32), 127] if chr(c) not in "\n\t"}


def _safe(text: str) -> str:
    """``text`` for a rich table: markup escaped, control characters shown as escapes."""
    from rich.markup import escape

    return escape(text.translate(_CONTROLS))


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return " ".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)


def render(report: dict[str, Any], file: Any = None) -> None:
    """Print ``report`` (from :func:`~torchplace.doctor.collect`) as tables for people."""
    from rich.console import Console

    out = file or sys.stdout
    # a pipe or file gets 120 columns unless $COLUMNS says otherwise; a terminal its own width
    wide = out.isatty() or "COLUMNS" in os.environ
    console = Console(file=out, highlight=False, width=console_width(None if wide else 120))
    console.print(_facts_table(report))
    physical = report["driver"]["physical_gpus"]
    if physical:
        console.print("[bold]physical GPUs (NVML order):[/] " + _safe("; ".join(physical)))
    if report["devices"]:
        console.print(_devices_table(report["devices"]))
    else:
        console.print("[bold]visible devices:[/] none (no CUDA/ROCm/MPS/XPU device)")
    console.print(_checks_table(report["checks"]))
    _print_verdict(console, report["verdict"])


def _build_rows(build: dict[str, Any]) -> list[tuple[str, str]]:
    hip, miopen = _show(build["hip_compiled_version"]), _show(build["miopen_runtime_version"])
    return [
        ("torch", f"{build['torch_version']} ({build['kind']} build)"),
        ("CUDA used to build torch", _show(build["cuda_compiled_version"])),
        ("cuDNN (loaded by torch)", _show(build["cudnn_version"])),
        ("HIP / MIOpen", f"{hip} / {miopen}"),
        ("arch list", _show(build["arch_list"])),
        ("debug build", _show(build["debug_build"])),
        (
            "matmul precision",
            f"float32 {_show(build['float32_matmul_precision'])}, TF32 "
            f"{_show(build['cuda_matmul_allow_tf32'])} "
            f"(fp32_precision {_show(build['cuda_matmul_fp32_precision'])})",
        ),
        (
            "CPU",
            f"{build['cpu_threads']} threads; MKL {_show(build['mkl'])}, "
            f"oneDNN {_show(build['mkldnn'])}, XNNPACK {_show(build['xnnpack'])}",
        ),
    ]


def _machine_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    drv, cuda, accel = report["driver"], report["cuda"], report["accelerators"]
    cuda_driver = f" (CUDA {drv['cuda_driver_version']})" if drv["cuda_driver_version"] else ""
    rows = [
        ("NVML (nvidia-ml-py)", drv["nvml"] + (f" ({drv['error']})" if drv["error"] else "")),
        ("NVIDIA driver", _show(drv["driver_version"]) + cuda_driver),
        ("physical GPUs (NVML)", _show(drv["physical_gpu_count"])),
        ("CUDA toolkit (nvcc on PATH)", _show(report["toolkit"]["nvcc_version"])),
        ("CUDA available", f"{_show(cuda['is_available'])}, {cuda['device_count']} device(s)"),
        (
            "MPS / XPU available",
            f"{_show(accel['mps_available'])} / {_show(accel['xpu_available'])}",
        ),
    ]
    vis = cuda["visible_devices_variable"]
    if report["environment"].get(vis) is None:
        rows.append((vis, "unset (every GPU visible)"))
    rows += [(name, value) for name, value in report["environment"].items() if value is not None]
    return rows


def _facts_table(report: dict[str, Any]) -> Table:
    from rich.table import Table

    facts = Table(title="torchplace doctor", show_header=False, title_justify="left", box=None)
    facts.add_column(style="bold")
    facts.add_column()
    for key, value in _build_rows(report["build"]) + _machine_rows(report):
        facts.add_row(_safe(key), _safe(value))
    return facts


def _devices_table(devices: list[dict[str, Any]]) -> Table:
    from rich.table import Table

    table = Table(title="visible devices", title_justify="left")
    for col in ("device", "physical", "name", "cc", "build", "memory free/total", "SMs", "uuid"):
        table.add_column(col)
    for d in devices:
        table.add_row(
            d["device"],
            _safe(d["physical_id"]),
            _safe(d["name"]),
            _show(d["capability"]),
            _show(d.get("arch_support")),
            f"{gib(d['free_memory'])} / {gib(d['total_memory'])}",
            _show(d["multi_processor_count"]),
            _safe(_show(d["uuid"])),
        )
    return table


def _checks_table(checks: list[dict[str, Any]]) -> Table:
    from rich.table import Table

    table = Table(title="checks", title_justify="left")
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("detail")
    table.add_column("fix")
    for c in checks:
        table.add_row(
            _MARK[c["status"]], _safe(c["name"]), _safe(c["detail"]), _safe(c["fix"] or "")
        )
    return table


def _print_verdict(console: Console, verdict: dict[str, Any]) -> None:

    if verdict["usable"]:
        console.print(f"[bold green]verdict: {_safe(verdict['summary'])}[/]")
        return
    console.print(f"[bold red]verdict: {_safe(verdict['summary'])}[/]")
    for fix in verdict["fixes"]:
        console.print(f"[bold]fix:[/] {_safe(fix)}")
