"""Embedded demo models, built in code (no downloads), selected by name.

``seed-mlp`` is the article's ``Linear(8, 16) -> ReLU -> Linear(16, 2)``; ``wide-mlp`` is a
``512 -> 2048 -> 2048 -> 512`` MLP with ReLUs. Weights are initialised from a fixed seed, so
every process that builds the same model gets the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

from torchplace.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn

__all__ = ["EMBEDDED_MODELS", "EmbeddedModel", "TensorSpec", "build_model", "embedded_model"]


@dataclass(frozen=True)
class TensorSpec:
    """A declared model input or output: OIP datatype name and shape (-1 = batch dimension).

    ``reshape``: the shape of one row as the model takes (input) or returns (output) it, where
    it is not ``shape[1:]`` (Triton's ``reshape``; the wire keeps ``shape``). ``label_filename``:
    an output's class labels file, one name per line (Triton's ``label_filename``)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    label_filename: str | None = None


@dataclass(frozen=True)
class EmbeddedModel:
    """A demo model: how to build it and what it takes and returns."""

    name: str
    description: str
    factory: Callable[[], nn.Module]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    seed: int = 0

    def build(self) -> nn.Module:
        """Build the model on the CPU, in eval mode, with deterministic weights."""
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return self.factory().eval()


def _mlp(*widths: int) -> Callable[[], nn.Module]:
    def factory() -> nn.Module:
        from torch import nn

        layers: list[nn.Module] = []
        for i, (fan_in, fan_out) in enumerate(pairwise(widths)):
            if i:
                layers.append(nn.ReLU())
            layers.append(nn.Linear(fan_in, fan_out))
        return nn.Sequential(*layers)

    return factory


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    model.name: model
    for model in (
        EmbeddedModel(
            name="seed-mlp",
            description="the article's Linear(8,16)-ReLU-Linear(16,2)",
            factory=_mlp(8, 16, 2),
            inputs=(TensorSpec("input", "FP32", (-1, 8)),),
            outputs=(TensorSpec("output", "FP32", (-1, 2)),),
        ),
        EmbeddedModel(
            name="wide-mlp",
            description="Linear 512-2048-2048-512 with ReLUs",
            factory=_mlp(512, 2048, 2048, 512),
            inputs=(TensorSpec("input", "FP32", (-1, 512)),),
            outputs=(TensorSpec("output", "FP32", (-1, 512)),),
        ),
    )
}


def embedded_model(name: str) -> EmbeddedModel:
    """Look up an embedded model by name; the error lists the names that exist."""
    try:
        return EMBEDDED_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(EMBEDDED_MODELS))
        raise ConfigError(
            f"unknown embedded model {name!r}; choose one of: {known}, or pass 'module:callable'"
        ) from None


def build_model(name: str) -> nn.Module:
    """Build an embedded model by name (CPU, eval mode, deterministic weights)."""
    return embedded_model(name).build()
