"""PNG charts of the transfer and model sweeps (matplotlib, the ``plot`` extra).

matplotlib is imported only when a chart is drawn, and through its object API with the Agg
canvas, so no global backend is switched and no window opens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchplace.bench.stages import StagesResult
from torchplace.bench.transfer import DIRECTIONS, TransferResult
from torchplace.bench.units import format_bytes
from torchplace.errors import ConfigError

__all__ = ["plot_stages", "plot_transfer", "require_matplotlib"]


def require_matplotlib() -> None:
    """Raise :class:`ConfigError` naming the extra to install when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--plot needs matplotlib, which is not installed; run: pip install 'torchplace[plot]'"
        ) from None


def _figure(width: float, height: float) -> Any:
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def plot_transfer(result: TransferResult, path: str | Path) -> Path:
    """Bandwidth against copy size, one panel per direction, one line per memory/flag pair."""
    figure = _figure(11, 4.5)
    axes = figure.subplots(1, 2, sharey=True)
    sizes = sorted({case.size_bytes for case in result.cases})
    styles = {
        ("pinned", True): ("tab:green", "-"),
        ("pinned", False): ("tab:green", "--"),
        ("pageable", True): ("tab:orange", "-"),
        ("pageable", False): ("tab:orange", "--"),
    }
    for ax, direction in zip(axes, DIRECTIONS, strict=True):
        for (memory, non_blocking), (color, style) in styles.items():
            cases = sorted(
                (
                    c
                    for c in result.cases
                    if c.direction == direction
                    and c.memory == memory
                    and c.non_blocking == non_blocking
                ),
                key=lambda c: c.size_bytes,
            )
            if not cases:
                continue
            ax.plot(
                [c.size_bytes for c in cases],
                [c.bytes_per_s / 1e9 for c in cases],
                linestyle=style,
                color=color,
                marker="o" if non_blocking else "s",
                markerfacecolor=color if non_blocking else "none",
                label=f"{memory}, non_blocking={'on' if non_blocking else 'off'}",
            )
        if result.link is not None:
            ax.axhline(
                result.link.peak_bytes_per_s / 1e9,
                color="grey",
                linestyle=":",
                label=f"link peak ({result.link.peak_bytes_per_s / 1e9:.1f} GB/s)",
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [format_bytes(s) for s in sizes])
        ax.set_xlabel("copy size (bytes, log scale)")
        ax.set_title(
            f"{direction} ({'host to device' if direction == 'H2D' else 'device to host'})"
        )
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("bandwidth (GB/s, median)")
    axes[0].legend(fontsize="small")
    figure.suptitle(f"Host/device copy bandwidth on {result.device}")
    out = Path(path)
    figure.savefig(out)
    return out


def plot_stages(result: StagesResult, path: str | Path) -> Path:
    """Left: time per stage per batch size (stacked bars); right: throughput in rows/s."""
    figure = _figure(11, 4.5)
    left, right = figure.subplots(1, 2)
    labels = [str(row.batch_size) for row in result.rows]
    positions = list(range(len(result.rows)))
    bottom = [0.0] * len(result.rows)
    stages = (
        ("H2D", "tab:blue", [row.h2d for row in result.rows]),
        ("compute", "tab:orange", [row.compute for row in result.rows]),
        ("D2H", "tab:green", [row.d2h for row in result.rows]),
    )
    for name, color, measurements in stages:
        heights = [0.0 if m is None else m.median_s * 1e3 for m in measurements]
        noop = all(m is None for m in measurements)
        left.bar(
            positions,
            heights,
            bottom=bottom,
            color=color,
            label=f"{name} (no-op on {result.device})" if noop else name,
        )
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    left.plot(
        positions,
        [row.total.median_s * 1e3 for row in result.rows],
        color="black",
        marker="o",
        linestyle="--",
        label="total (one call, end to end)",
    )
    left.set_xticks(positions, labels)
    left.set_xlabel("batch size (rows)")
    left.set_ylabel("time per batch (ms, median)")
    left.set_title("time per stage")
    left.legend(fontsize="small")
    left.grid(True, axis="y", alpha=0.3)
    right.plot(
        [row.batch_size for row in result.rows],
        [row.rows_per_s for row in result.rows],
        marker="o",
        color="tab:purple",
        label="throughput (batch / total)",
    )
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xticks([row.batch_size for row in result.rows], labels)
    right.set_xlabel("batch size (rows, log scale)")
    right.set_ylabel("throughput (rows/s, log scale)")
    right.set_title("throughput")
    right.legend(fontsize="small")
    right.grid(True, which="both", alpha=0.3)
    figure.suptitle(f"{result.model} on {result.device} ({result.dtype}): stages and throughput")
    out = Path(path)
    figure.savefig(out)
    return out
