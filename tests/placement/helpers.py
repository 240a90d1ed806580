"""Shared by the placement tests: devices, a small model, and the rows a mismatch table marks."""

from __future__ import annotations

import torch
from torch import nn

META = torch.device("meta")


CPU = torch.device("cpu")


def model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def marked(message: str) -> list[str]:
    """Names on the rows marked as odd ones out."""
    return [line.split()[1] for line in message.splitlines() if line.startswith(">> ")]
