"""A plan as JSON (the report's ``result``), as rich tables, as a device map, and as a PNG."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchplace import report
from torchplace.errors import ConfigError
from torchplace.planner.compute import copy_seconds
from torchplace.planner.exercise import cell, exercise_rows, exercise_table, shape_text
from torchplace.planner.hardware import MiB, human
from torchplace.planner.trace import label as unit_label

if TYPE_CHECKING:
    from torchplace.planner.api import Plan

__all__ = ["export_device_map", "plan_result", "plot_plan", "render_text"]


def plan_result(p: Plan) -> dict[str, Any]:
    """The JSON ``result`` of ``torchplace plan`` (schema ``torchplace.plan/v1``)."""
    heads, rows = exercise_rows(p)
    return {
        "model": {"name": p.model.name, "source": p.model.source},
        "batch_sizes": p.batches,
        "seq": p.seq,
        "devices": [d.to_dict() for d in p.devices],
        "strategy": p.placement.strategy,
        "fits": p.fits(),
        "considered": p.considered,
        "placement": [
            {
                "unit": unit_label(u.path),
                "kind": u.kind,
                "device": "all" if p.placement.replicas > 1 else p.placement.device_of(u.path),
                "param_bytes": u.weight_bytes,
                "buffer_bytes": u.buffer_bytes,
                "dtype": u.dtype,
                "tied": [n for g in p.units.tied for n in g if any(map(u.holds, g))],
            }
            for u in p.units.units
        ],
        "tied_groups": [list(g) for g in p.units.tied],
        "budget": [b.to_dict(p.batches) for b in p.budgets.values()],
        "crossings": {
            "batch": p.reference_batch,
            "device_bytes_per_forward": p.flow.bytes_between_devices(),
            "total_bytes_per_forward": p.flow.total_bytes(),
            "edges": [
                {**c.to_dict(), "seconds": copy_seconds(c, p.specs)} for c in p.flow.crossings
            ],
        },
        "compute": {"batch": p.reference_batch, "devices": [w.to_dict() for w in p.work]},
        "warnings": [w.to_dict() for w in p.warnings],
        "exercise8": {"devices": heads, "rows": [{"what": w, "cells": c} for w, c in rows]},
        "device_map": p.device_map(),
        "max_memory": p.max_memory,
    }


def render_text(p: Plan, *, width: int = 160) -> str:
    """The report for a terminal: rich tables (Markdown-boxed, so they paste anywhere)."""
    from rich.console import Console

    out = io.StringIO()
    console = Console(  # no markup: a module's name may hold brackets ("[CLS]", "[/]")
        file=out, width=width, no_color=True, highlight=False, soft_wrap=False, markup=False
    )
    kind = "assumed" if p.devices[0].assumed else "this machine's"
    console.print(
        f"plan: {p.model.name} ({p.model.source}), batch {', '.join(map(str, _short(p.batches)))}"
        f"{f', seq {p.seq}' if p.seq else ''}; strategy {p.placement.strategy}"
        f"{'' if p.fits() else ' (DOES NOT FIT)'}"
    )
    devs = _table(
        f"devices ({kind} figures)",
        ("device", "model", "memory", "GB/s", "TFLOP/s", "link", "host link"),
    )
    for d in p.devices:
        devs.add_row(
            d.device,
            d.model,
            human(d.memory),
            f"{d.mem_gbps:g}",
            f"{d.tflops:g}",
            f"{d.link.name} {d.link.gbps:g} GB/s",
            f"{d.host_link.name} {d.host_link.gbps:g} GB/s",
        )
    console.print(devs)
    console.print(_placement_table(p))
    console.print(_budget_table(p))
    console.print(_crossing_table(p))
    console.print(_compute_table(p))
    text = out.getvalue()
    if p.warnings:
        text += "\nwarnings:\n" + "".join(f"  [{w.code}] {w.message}\n" for w in p.warnings)
    if p.considered and len(p.considered) > 1:
        text += (
            "\nconsidered: "
            + "; ".join(
                f"{name}: {'fits' if c['fits'] else 'does not fit'}, "
                f"{human(c['device_bytes_per_forward'])} between devices, "
                f"{c['forward_s'] * 1e3:.3f} ms/forward"
                for name, c in p.considered.items()
            )
            + "\n"
        )
    text = "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
    return text + "\n" + exercise_table(p)


def _short(batches: list[int]) -> list[str]:
    if len(batches) > 8 and batches == list(range(batches[0], batches[-1] + 1)):
        return [f"{batches[0]}-{batches[-1]}"]
    return [str(b) for b in batches]


def _placement_table(p: Plan) -> Any:

    table = _table(
        "placement", ("unit", "kind", "device", "params", "buffers", "dtype", "tied with")
    )
    for row in plan_result_rows(p):
        table.add_row(*row)
    return table


def plan_result_rows(p: Plan) -> list[list[str]]:
    rows = []
    for u in p.units.units:
        tied = sorted(
            {m for g in p.units.tied if any(map(u.holds, g)) for m in g if not u.holds(m)}
        )
        dev = "every device" if p.placement.replicas > 1 else p.placement.device_of(u.path)
        rows.append(
            [
                cell(unit_label(u.path)),
                u.kind,
                dev,
                human(u.weight_bytes),
                human(u.buffer_bytes),
                u.dtype,
                cell(", ".join(tied)) or "-",
            ]
        )
    return rows


def _budget_table(p: Plan) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title="memory per device", box=box.MARKDOWN, title_justify="left")
    heads = (
        "device",
        "batch",
        "weights",
        "buffers",
        "activation peak",
        "inputs",
        "KV cache",
        "reserves",
        "total",
        "capacity",
        "headroom",
        "largest batch",
    )
    for head in heads:
        table.add_column(head, justify="right" if head != "device" else "left")
    shown = (
        p.batches
        if len(p.batches) <= 8
        else sorted({p.batches[0], *p.batches[7::8], p.batches[-1]})
    )
    for dev, b in p.budgets.items():
        reserve = b.reserves.fixed()
        for n in shown:
            table.add_row(
                dev,
                str(n),
                human(b.weights),
                human(b.buffers),
                human(b.activation[n]),
                human(b.inputs[n]),
                human(b.kv_cache[n]),
                f"{human(reserve)} +{b.reserves.margin:.0%}",
                human(b.total(n)),
                human(b.capacity),
                human(b.headroom(n)),
                str(b.largest_batch()),
            )
    return table


def _crossing_table(p: Plan) -> Any:

    table = _table(
        f"crossings per forward, in run order (batch {p.reference_batch})",
        (
            "from",
            "to",
            "producer",
            "consumer",
            "shape",
            "dtype",
            "bytes",
            "count",
            "kind",
            "ms at link",
        ),
    )
    for c in p.flow.crossings:
        table.add_row(
            c.src,
            c.dst,
            cell(unit_label(c.producer)),
            cell(unit_label(c.consumer)),
            shape_text(c.shape),
            c.dtype,
            human(c.nbytes),
            str(c.count),
            c.kind,
            f"{copy_seconds(c, p.specs) * 1e3:.3f}",
        )
    table.caption = f"between devices: {human(p.flow.bytes_between_devices())} per forward"
    return table


def _compute_table(p: Plan) -> Any:

    table = _table(
        f"compute per forward (batch {p.reference_batch})",
        ("device", "GFLOP", "bytes moved", "roofline ms", "idle share"),
    )
    for w in p.work:
        table.add_row(
            w.device,
            f"{w.flops / 1e9:,.3f}",
            human(w.bytes_moved),
            f"{w.seconds * 1e3:.3f}",
            f"{w.idle_share:.0%}",
        )
    return table


def export_device_map(p: Plan, path: str | Path) -> dict[str, Any]:
    """Write ``{"device_map": ..., "max_memory": ...}`` as accelerate and transformers take them."""
    index = {d.device: i for i, d in enumerate(p.devices)}
    document = {
        "device_map": p.device_map(),
        "max_memory": {str(index[d]): m for d, m in p.max_memory.items()},
    }
    report.write_report(json.dumps(document, indent=2) + "\n", path)  # a failure names the file
    return document


def plot_plan(p: Plan, path: str | Path) -> None:
    """A PNG: one bar per device (weights, activations, KV cache, reserves against capacity),
    and the crossings between devices as arrows labelled with their MiB per forward."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'torchplace[plot]'") from None
    b = p.reference_batch
    devices = list(p.budgets)
    fig, ax = plt.subplots(figsize=(2.6 * len(devices) + 3, 5))
    parts: list[tuple[str, Callable[[str], int], str]] = [
        ("weights", lambda d: p.budgets[d].weights + p.budgets[d].buffers, "#4c72b0"),
        ("activation peak", lambda d: p.budgets[d].activation[b], "#dd8452"),
        ("inputs", lambda d: p.budgets[d].inputs[b], "#937860"),
        ("KV cache", lambda d: p.budgets[d].kv_cache[b], "#55a868"),
        ("reserves", lambda d: p.budgets[d].reserves.fixed(), "#8c8c8c"),
    ]
    bottoms = [0.0] * len(devices)
    for label, value, color in parts:
        heights = [value(d) / MiB for d in devices]
        ax.bar(devices, heights, bottom=bottoms, label=label, color=color, width=0.5)
        bottoms = [x + y for x, y in zip(bottoms, heights, strict=True)]
    used = max(max(bottoms, default=0.0), 1e-9)  # no device used: an empty chart
    top = used
    for i, d in enumerate(devices):
        cap = p.budgets[d].capacity / MiB
        if cap <= 3 * used:  # on the scale: a dashed line; else said in words
            ax.hlines(cap, i - 0.3, i + 0.3, colors="black", linestyles="dashed")
            top = max(top, cap)
        else:
            ax.text(i, bottoms[i], f"of {cap:,.0f} MiB", ha="center", va="bottom")
    edges: dict[tuple[str, str], int] = {}
    for c in p.flow.crossings:
        if c.src in devices and c.dst in devices and c.src != c.dst:
            edges[(c.src, c.dst)] = edges.get((c.src, c.dst), 0) + c.total
    for k, ((src, dst), nbytes) in enumerate(edges.items()):
        i, j = devices.index(src), devices.index(dst)
        y = top * (1.08 + 0.08 * k)
        ax.annotate("", xy=(j, y), xytext=(i, y), arrowprops={"arrowstyle": "->", "lw": 2})
        ax.text((i + j) / 2, y, f"{human(nbytes)}/forward", ha="center", va="bottom")
    ax.set_ylim(0, top * (1.2 + 0.08 * len(edges)))
    ax.set_ylabel("MiB")
    ax.set_title(f"{p.model.name}: {p.placement.strategy}, batch {b}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table(title: str, heads: Sequence[str]) -> Any:
    """A rich table in Markdown style with these columns, titled on the left."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.MARKDOWN, title_justify="left")
    for head in heads:
        table.add_column(head)
    return table
