"""Units for benchmark results: durations, byte counts and rates, formatted and parsed.

Results are stored in base units (seconds, bytes, bytes per second); these helpers turn them
into short human strings for tables and turn size strings such as ``"64K"`` or ``"256MiB"``
into byte counts for command-line flags. Binary prefixes (KiB = 1024 bytes) throughout; rates
are in decimal GB/s (10^9 bytes per second), as PCIe and GPU vendors quote them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from torchplace.errors import ConfigError

__all__ = ["format_bytes", "format_duration", "format_rate", "parse_size", "parse_sizes", "scaled"]

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def format_duration(seconds: float | None) -> str:
    """``0.00231`` -> ``"2.31 ms"``; picks s, ms, µs or ns so the number stays readable."""
    if seconds is None or math.isnan(seconds):
        return "n/a"
    return scaled(seconds, ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")), " ")


def scaled(value: float, units: Sequence[tuple[float, str]], sep: str = "") -> str:
    """``value`` in the largest of ``units`` (scale, name; largest first) it reaches, to 3
    significant digits: 0.99996 ms reads ``1 ms``, not ``1e+03 µs``, and a value past the
    largest unit is a whole number (``3700 s``), never an exponent."""
    magnitude = abs(value)
    for i, (scale, unit) in enumerate(units):
        if magnitude >= scale or i == len(units) - 1:
            if i > 0 and float(f"{magnitude / scale:.3g}") >= 1000:
                scale, unit = units[i - 1]  # rounding reached the next unit up
            text = f"{value / scale:.3g}"
            if "e+" in text:
                text = f"{value / scale:.0f}"
            return f"{text}{sep}{unit}"
    raise ConfigError("units must not be empty")


def format_bytes(n: int | float | None) -> str:
    """``268435456`` -> ``"256 MiB"`` (binary prefixes)."""
    if n is None:
        return "n/a"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            # 4 significant digits: a value up to 1023.x never turns into "1e+03"
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.4g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def format_rate(bytes_per_second: float | None) -> str:
    """Bytes per second as decimal GB/s: ``2.5e10`` -> ``"25 GB/s"``."""
    if bytes_per_second is None or math.isnan(bytes_per_second):
        return "n/a"
    return scaled(bytes_per_second / 1e9, ((1.0, "GB/s"),), " ")


def parse_size(text: str) -> int:
    """``"4K"``, ``"64KiB"``, ``"1M"``, ``"256MiB"``, ``"1G"``, ``"4096"`` -> bytes (binary units)."""
    match = _SIZE_RE.match(text)
    if match is None:
        raise ConfigError(
            f"cannot read size {text!r}; write a number with an optional K, M or G suffix "
            "(binary units), such as 4K, 64KiB, 256M or 1G"
        )
    number, unit = match.groups()
    size = int(float(number) * _SIZE_UNITS[unit.lower()])
    if size < 1:
        raise ConfigError(f"size {text!r} is below one byte; use at least 1")
    return size


def parse_sizes(text: str) -> tuple[int, ...]:
    """A comma-separated list of sizes, such as ``"4K,1M,256M"``, in the order given."""
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise ConfigError(f"no sizes in {text!r}; give a comma-separated list such as 4K,1M,256M")
    return tuple(parse_size(part) for part in parts)
