"""The founding article's exercise 8, answered for a plan: for two devices, where the model
replicas, input batches, temporary activations and final outputs live, and every point where
data crosses between devices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchplace.planner.hardware import human
from torchplace.planner.strategies import HOST
from torchplace.planner.trace import label

if TYPE_CHECKING:
    from torchplace.planner.api import Plan
    from torchplace.planner.crossings import Crossing

__all__ = ["cell", "exercise_rows", "exercise_table", "shape_text"]


def shape_text(shape: tuple[int, ...] | list[int]) -> str:
    """``4x128``; ``scalar`` for a 0-dim tensor (a model's loss), which has no dims to join."""
    return "x".join(map(str, shape)) or "scalar"


def _shape(shape: tuple[int, ...] | list[int], dtype: str) -> str:
    return f"{shape_text(shape)} {dtype}"


def _ranges(paths: list[str]) -> str:
    """``h.0, h.1, h.2, ln_f`` -> ``h.0-h.2, ln_f``: runs of numbered siblings folded."""
    out: list[str] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            out.append(run[0] if len(run) == 1 else f"{run[0]}-{run[-1].rpartition('.')[2]}")
            run.clear()

    for path in paths:
        stem, _, num = path.rpartition(".")
        if (
            num.isdigit()
            and run
            and run[-1].rpartition(".")[0] == stem
            and int(run[-1].rpartition(".")[2]) + 1 == int(num)
        ):
            run.append(path)
            continue
        flush()
        if num.isdigit():
            run.append(path)
        else:
            out.append(label(path))
    flush()
    return ", ".join(out)


def _model_io(c: Crossing) -> bool:
    """Whether ``c`` is the input batch's copy in or the outputs' copy out: not what a unit
    spilled to the host (accelerate's ``cpu``) hands to a device or takes from one, which are
    copies between devices like any other."""
    return (c.src == HOST and c.producer == "input") or (c.dst == HOST and c.consumer == "(host)")


def _copies_into(p: Plan, dev: str) -> str:
    """The copies a device receives, one line per tensor (consumers folded)."""
    groups: dict[tuple[str, str, tuple[int, ...], str], list[Any]] = {}
    for c in p.flow.crossings:
        if c.dst != dev or _model_io(c):
            continue
        groups.setdefault((c.src, c.producer, c.shape, c.dtype), []).append(c)
    parts = []
    for (src, producer, shape, dtype), items in groups.items():
        count = sum(c.count for c in items)
        consumers = _ranges([c.consumer for c in items])
        again = " (hooks copy it again for each)" if any(c.kind == "recopy" for c in items) else ""
        parts.append(
            f"{src} -> {dev}: {label(producer)} output to {consumers}, "
            f"{_shape(shape, dtype)}, {human(items[0].nbytes)} x{count}{again}"
        )
    return "; ".join(parts) or "none"


def exercise_rows(p: Plan) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """Column heads (the devices) and rows (what, one cell per device)."""
    devices = [d.device for d in p.devices]
    b = p.reference_batch
    flow = p.flow
    rows: list[tuple[str, list[str]]] = []
    replicas = p.placement.replicas > 1
    cells = []
    for dev in devices:
        budget = p.budgets.get(dev)
        state = human(budget.weights + budget.buffers) if budget else ""  # buffers are state too
        if replicas:
            cells.append(f"full copy, {state}")
            continue
        held = [u.path for u in p.units.units if p.placement.device_of(u.path) == dev]
        cells.append(f"{_ranges(held)} ({state})" if held and budget else "-")
    rows.append(("model replica", cells))
    ins = []
    for dev in devices:
        got = [c for c in flow.crossings if _model_io(c) and c.dst == dev]
        ins.append("; ".join(f"{_shape(c.shape, c.dtype)} from host" for c in got) or "-")
    rows.append((f"input batch (batch {b})", ins))
    rows.append(
        (
            "temporary activations (peak)",
            [human(p.budgets[d].activation[b]) if d in p.budgets else "-" for d in devices],
        )
    )
    outs = []
    for dev in devices:
        got = [c for c in flow.crossings if _model_io(c) and c.src == dev]
        outs.append("; ".join(f"{_shape(c.shape, c.dtype)} to host" for c in got) or "-")
    rows.append(("final outputs", outs))
    comm = [_copies_into(p, dev) for dev in devices]
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
    lines += [f"| {what} | " + " | ".join(map(cell, cells)) + " |" for what, cells in rows]
    return "\n".join(lines) + "\n"


def cell(text: str) -> str:
    """``text`` as a Markdown table cell: a pipe in a module's name (a ModuleDict key) escaped,
    so that it does not end the cell."""
    return text.replace("|", "\\|")
