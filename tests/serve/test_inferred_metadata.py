"""Metadata inferred where it can be: outputs from a dry run, a factory's served name."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from torchplace.errors import ConfigError
from torchplace.models import TensorSpec
from torchplace.serve.config import ServeConfig
from torchplace.serve.engine import Engine
from torchplace.serve.loader import infer_outputs, load_model

from .engine_helpers import save_exported

HELPERS = "tests.serve.engine_helpers"


class TwoHeads(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.sum(dim=1, keepdim=True), (x > 0).to(torch.int64)


class Variable(nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"mean": x.mean(dim=1), "copy": x.to(torch.float16)}


def test_outputs_come_from_the_dry_run_when_not_declared() -> None:
    specs = infer_outputs(TwoHeads(), (TensorSpec("x", "FP32", (-1, 5)),), "two-heads")
    assert specs == (
        TensorSpec("output_0", "FP32", (-1, 1)),
        TensorSpec("output_1", "INT64", (-1, 5)),
    )


def test_a_dimension_that_follows_an_inputs_variable_one_is_minus_one() -> None:
    specs = infer_outputs(Variable(), (TensorSpec("x", "FP32", (-1, -1, 4)),), "variable")
    assert specs == (
        TensorSpec("mean", "FP32", (-1, 4)),
        TensorSpec("copy", "FP16", (-1, -1, 4)),
    )


def test_a_dry_run_that_fails_asks_for_declarations() -> None:
    with pytest.raises(ConfigError, match=r"declares no outputs and its dry run.*--output"):
        infer_outputs(nn.Linear(5, 2), (TensorSpec("x", "FP32", (-1, 3)),), "linear")


def test_an_undeclared_factory_output_is_inferred_and_served() -> None:
    """The factory declares only its inputs; the engine serves the inferred output."""
    model = load_model(f"{HELPERS}:undeclared_factory", inputs=(TensorSpec("x", "FP32", (-1, 4)),))
    assert model.outputs == (TensorSpec("output", "FP32", (-1, 4)),)
    assert model.name == "tests.serve.engine_helpers-undeclared_factory"

    async def run() -> dict[str, np.ndarray]:
        engine = Engine(model, [torch.device("cpu")], max_batch_size=4)
        await engine.start()
        try:
            return await engine.infer({"x": np.ones((2, 4), np.float32)})
        finally:
            await engine.stop()

    got = asyncio.run(run())["output"]
    with torch.inference_mode():
        want = model.module(torch.ones(2, 4)).numpy()
    np.testing.assert_allclose(got, want)


def test_name_overrides_every_default(tmp_path: Path) -> None:
    assert load_model("seed-mlp", name="scorer").name == "scorer"
    assert load_model(f"{HELPERS}:scale_factory", name="scale").name == "scale"
    path = save_exported(tmp_path / "prog.pt2", TwoHeads(), torch.ones(2, 5))
    assert load_model("seed-mlp", exported=path).name == path.stem
    assert load_model("seed-mlp", exported=path, name="prog").name == "prog"
    assert Engine.from_config(ServeConfig(name="served-as", device="cpu")).name == "served-as"
    with pytest.raises(ConfigError, match=r"name='a/b' is invalid"):
        ServeConfig(name="a/b")


def test_exported_inputs_come_from_the_programs_signature(tmp_path: Path) -> None:
    path = save_exported(tmp_path / "heads.pt2", TwoHeads(), torch.ones(2, 5))
    model = load_model("seed-mlp", exported=path)
    assert model.inputs == (TensorSpec("input", "FP32", (-1, 5)),)
    assert model.outputs == (
        TensorSpec("output_0", "FP32", (-1, 1)),
        TensorSpec("output_1", "INT64", (-1, 5)),
    )
