"""The founding article's exercise 8, answered for a plan: for two devices, where the model
replicas, input batches, temporary activations and final outputs live, and every point where
data crosses between devices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchplace.planner.hardware import MiB
from torchplace.planner.strategies import HOST

if TYPE_CHECKING:
    from torchplace.planner.api import Plan

__all__ = ["exercise_rows", "exercise_table"]


def _mib(n: int) -> str:
    return f"{n / MiB:,.2f} MiB" if n < 100 * MiB else f"{n / MiB:,.0f} MiB"


def _shape(shape: tuple[int, ...] | list[int], dtype: str) -> str:
    return f"{'x'.join(map(str, shape))} {dtype}"


def _ranges(paths: list[str]) -> str:
    """``h.0, h.1, h.2`` -> ``h.0-h.2``; other names as they are."""
    if len(paths) <= 3:
        return ", ".join(p or "(model)" for p in paths)
    return f"{paths[0] or '(model)'} ... {paths[-1]} ({len(paths)} units)"


def exercise_rows(p: Plan) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """Column heads (the devices) and rows (what, one cell per device)."""
    devices = [d.device for d in p.devices]
    b = p.reference_batch
    flow = p.flow
    rows: list[tuple[str, list[str]]] = []
    replicas = p.placement.replicas > 1
    cells = []
    for dev in devices:
        if replicas:
            cells.append(f"full copy, {_mib(p.budgets[dev].weights)}")
            continue
        held = [u.path for u in p.units.units if p.placement.device_of(u.path) == dev]
        budget = p.budgets.get(dev)
        cells.append(f"{_ranges(held)}, {_mib(budget.weights)}" if held and budget else "-")
    rows.append(("model replica", cells))
    ins = []
    for dev in devices:
        got = [c for c in flow.crossings if c.kind == "h2d" and c.dst == dev]
        ins.append("; ".join(f"{_shape(c.shape, c.dtype)} from host" for c in got) or "-")
    rows.append((f"input batch (batch {b})", ins))
    rows.append(
        (
            "temporary activations (peak)",
            [_mib(p.budgets[d].activation[b]) if d in p.budgets else "-" for d in devices],
        )
    )
    outs = []
    for dev in devices:
        got = [c for c in flow.crossings if c.kind == "d2h" and c.src == dev]
        outs.append("; ".join(f"{_shape(c.shape, c.dtype)} to host" for c in got) or "-")
    rows.append(("final outputs", outs))
    comm = []
    for dev in devices:
        got = [c for c in flow.crossings if HOST not in (c.src, c.dst) and c.dst == dev]
        comm.append(
            "; ".join(
                f"{c.src} -> {c.dst} at {c.consumer or '(model code)'}: "
                f"{_shape(c.shape, c.dtype)}, {_mib(c.nbytes)} x{c.count}"
                for c in got
            )
            or "none"
        )
    rows.append(("cross-device copies in", comm))
    return devices, rows


def exercise_table(p: Plan) -> str:
    """The table as Markdown, the same in the terminal, the JSON report and the docs."""
    heads, rows = exercise_rows(p)
    lines = [
        f"Exercise 8: {p.model.name}, {p.placement.strategy} over {', '.join(heads)}",
        "",
        "| | " + " | ".join(heads) + " |",
        "| --- |" + " --- |" * len(heads),
    ]
    lines += [f"| {what} | " + " | ".join(cells) + " |" for what, cells in rows]
    return "\n".join(lines) + "\n"
