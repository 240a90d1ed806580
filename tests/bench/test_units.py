from __future__ import annotations

import pytest

from torchplace.bench.units import (
    format_bytes,
    format_duration,
    format_rate,
    parse_size,
    parse_sizes,
)
from torchplace.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("4K", 4 << 10),
        ("64KiB", 64 << 10),
        ("1m", 1 << 20),
        ("256MiB", 256 << 20),
        ("1G", 1 << 30),
        ("1.5K", 1536),
        (" 16 MB ", 16 << 20),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "-4K", "4X", "0", "0.1"])
def test_parse_size_rejects_nonsense(text: str) -> None:
    with pytest.raises(ConfigError, match="size"):
        parse_size(text)


def test_parse_sizes_keeps_order() -> None:
    assert parse_sizes("1M,4K") == (1 << 20, 4 << 10)
    with pytest.raises(ConfigError, match="no sizes"):
        parse_sizes(" , ")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(2.5, "2.5 s"), (0.00231, "2.31 ms"), (12e-6, "12 µs"), (3e-9, "3 ns"), (None, "n/a")],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_bytes_and_rate() -> None:
    assert format_bytes(256 << 20) == "256 MiB"
    assert format_bytes(4 << 10) == "4 KiB"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(1000.5 * 1024) == "1000 KiB"  # never "1e+03 KiB"
    assert format_bytes(None) == "n/a"
    assert format_rate(2.5e10) == "25 GB/s"
    assert format_rate(None) == "n/a"
