"""An eleventh round of library models users feed ``torchplace plan`` (transformers' Mamba2,
RWKV, Zamba2, Falcon-H1, StableLM, Granite, GraniteMoE, DBRX, Cohere, Nemotron, Persimmon,
BLOOM, GPT-J, CodeGen, T5Gemma, Wav2Vec2-BERT, HuBERT, SigLIP, SigLIP2, CLIPSeg, OWLv2,
RT-DETR, Depth Anything, Swin2SR, VitMatte, PaliGemma and Qwen2-VL; diffusers' Sana, LTX-Video,
CogVideoX, Mochi, HunyuanVideo, AuraFlow, Lumina2, Wan and AutoencoderKLCogVideoX), built from
small configs. The bugs they found, each reproduced here by a small module that behaves the
same way: the libraries are not needed to run these tests.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.planner.conftest import planned
from torchplace.models import TensorSpec
from torchplace.planner.api import Plan
from torchplace.planner.trace import UntraceableModel
from torchplace.planner.verify import verify

W, PATCHES = 16, 16


def _plan(factory: str, **options: Any) -> Plan:
    return planned(
        f"tests.planner.test_architectures8:make_{factory}",
        **{"strategy": "pipeline", **options},
    )


# ------------------------------------- a grid made from Python data, read back with .tolist()


class GridTower(nn.Module):
    """As Qwen2-VL's vision tower (``get_vision_position_ids``: ``grid_thw.tolist()``) and
    SigLIP2's embeddings (``spatial_shapes[i].tolist()``): each image's patch grid, made by
    the caller beside the pixels (``torch.tensor([[1, 4, 4]], device=x.device)``), read on
    the host to cut and position the patches."""

    def __init__(self, make: str) -> None:
        super().__init__()
        self.make = make
        self.embed = nn.Linear(W, W)
        self.pos = nn.Embedding(PATCHES, W)
        self.blocks = nn.ModuleList(nn.Linear(W, W) for _ in range(2))

    def grid(self, x: torch.Tensor) -> torch.Tensor:
        if self.make == "new_tensor":
            return x.new_tensor([[4, 4]], dtype=torch.long).expand(x.shape[0], 2)
        if self.make == "as_tensor":
            return torch.as_tensor([[4, 4]] * x.shape[0], device=x.device)
        return torch.tensor([[4, 4]], device=x.device).expand(x.shape[0], 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        rows = []
        for i, (height, width) in enumerate(self.grid(x).tolist()):
            ids = torch.arange(height * width, device=x.device)
            rows.append(h[i, : height * width] + self.pos(ids))
        h = torch.stack(rows)
        for block in self.blocks:
            h = torch.relu(block(h))
        return h


def make_grid_tower(make: str = "tensor") -> nn.Module:
    model = GridTower(make).eval()
    model.torchplace_inputs = (TensorSpec("x", "FP32", (-1, PATCHES, W)),)  # type: ignore[assignment]
    return model


def make_grid_tower_new_tensor() -> nn.Module:
    return make_grid_tower("new_tensor")


def make_grid_tower_as_tensor() -> nn.Module:
    return make_grid_tower("as_tensor")


@pytest.mark.parametrize("make", ["grid_tower", "grid_tower_new_tensor", "grid_tower_as_tensor"])
def test_a_tensor_made_from_python_data_keeps_its_values(make: str) -> None:
    # Qwen2-VL given its image grid as torch.tensor([[1, 4, 4]], device=ids.device): "cannot
    # trace the model on 'meta': Cannot copy out of meta tensor ... The forward moves a tensor
    # to a device itself", exit 2; SigLIP2, its spatial shapes so made: "aten._local_scalar_dense
    # in m.embeddings". The factory copies the data inside one call, unseen by the dispatch
    # mode that follows values, and .tolist() copies to the host, which meta cannot
    p = _plan(make, max_memory=[1200, 1200])
    assert len(p.placement.used()) == 2
    assert p.budgets["cuda:0"].activation[2] > 0
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


class FloatGrid(nn.Module):
    """Sizes read with ``.tolist()`` from a float input: values the planner does not make up."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(W, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (n,) = x[0, :1, 0].long().tolist()
        return self.proj(x[:, : n + 1])  # type: ignore[no-any-return]


def make_float_grid() -> nn.Module:
    model = FloatGrid().eval()
    model.torchplace_inputs = (TensorSpec("x", "FP32", (-1, PATCHES, W)),)  # type: ignore[assignment]
    return model


def test_tolist_of_a_value_the_planner_lacks_names_its_cause() -> None:
    # the message spoke of moving tensors (.cpu(), .cuda()) alone, for a .tolist()
    with pytest.raises(UntraceableModel, match=r"\.tolist\(\).*torch\.tensor\(\.\.\., device"):
        _plan("float_grid", strategy="replicate")


# --------------------------------------- a forward that does not take the shapes declared


class Matting(nn.Module):
    """As VitMatte's decoder: features of a stride-2 stream concatenated with a backbone's
    stride-4 features upsampled twice, which match for an image a multiple of 4 alone."""

    def __init__(self) -> None:
        super().__init__()
        self.stream = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.backbone = nn.Conv2d(3, 4, 4, stride=4)
        self.head = nn.Conv2d(8, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        deep = nn.functional.interpolate(self.backbone(x), scale_factor=2.0)
        return self.head(torch.cat([self.stream(x), deep], dim=1))  # type: ignore[no-any-return]


def make_matting(size: int = 14) -> nn.Module:
    model = Matting().eval()
    model.torchplace_inputs = (TensorSpec("x", "FP32", (-1, 3, size, size)),)  # type: ignore[assignment]
    return model


def make_matting_fits() -> nn.Module:
    return make_matting(16)


def test_a_shape_the_forward_does_not_take_is_blamed_on_the_inputs() -> None:
    # VitMatte with a patch size its decoder does not take: "aten.cat in decoder: Sizes of
    # tensors must match except in dimension 1. The planner runs the forward without data; a
    # model whose control flow reads tensor values cannot be planned this way", where the
    # CPU, given the same shapes, fails the same way: the declared inputs are at fault
    with pytest.raises(UntraceableModel) as caught:
        _plan("matting", strategy="replicate")
    message = str(caught.value)
    assert message.startswith("cannot trace the model on 'meta': aten.cat in (model code)")
    assert "check the declared inputs (--input)" in message
    assert "control flow" not in message
    assert _plan("matting_fits", strategy="replicate").fits()
