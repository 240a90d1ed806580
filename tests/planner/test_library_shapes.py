"""A sixth round: the library models users feed ``torchplace plan`` (transformers' Llama,
Mistral, Mixtral, Qwen2, GPT-2, BERT, T5, Whisper, CLIP and ViT, timm's ConvNeXt, EfficientNet
and ViT, torchvision's ResNet and Faster R-CNN, diffusers' UNet2DConditionModel and
AutoencoderKL, built from small configs). The bugs they found, each reproduced here by a small
module that behaves the same way: the libraries are not needed to run these tests.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.planner.conftest import planned
from torchplace.models import TensorSpec
from torchplace.planner.api import Plan
from torchplace.planner.trace import UntraceableModel
from torchplace.planner.verify import verify

W, VOCAB, SEQ = 16, 32, 8


def _plan(factory: str, **options: Any) -> Plan:
    return planned(
        f"tests.planner.test_library_shapes:make_{factory}",
        **{"strategy": "pipeline", "max_memory": [7000, 7000], **options},
    )


# ------------------------------------------------- transformers' padding check on the mask


class MaskedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(W, 3 * W)
        self.out = nn.Linear(W, W)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, W // 2).permute(2, 0, 3, 1, 4)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return x + self.out(y.transpose(1, 2).reshape(b, t, W))  # type: ignore[no-any-return]


class PaddedDecoder(nn.Module):
    """As transformers' masking_utils: the mask is skipped where it pads nothing (its sum read
    as a Python bool, ``padding_mask.sum() == padding_mask.numel()``), else made a boolean
    (batch, 1, seq, seq) causal-and-padding mask handed to every layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, W)
        self.layers = nn.ModuleList(MaskedBlock() for _ in range(2))
        self.head = nn.Linear(W, VOCAB)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        t = input_ids.shape[1]
        mask = None
        if attention_mask.sum() != attention_mask.numel():  # reads the mask's values
            pos = torch.arange(t, device=input_ids.device)
            causal = pos[None, :] <= pos[:, None]
            mask = causal[None, None] & attention_mask[:, None, None, :].bool()
        for layer in self.layers:
            h = layer(h, mask)
        return self.head(h)  # type: ignore[no-any-return]


def make_padded_decoder() -> nn.Module:
    model = PaddedDecoder()
    model.torchplace_inputs = (  # type: ignore[assignment]
        TensorSpec("input_ids", "INT64", (-1, SEQ)),
        TensorSpec("attention_mask", "INT64", (-1, SEQ)),
    )
    return model


def test_a_padding_check_on_the_attention_mask_is_traced_with_its_values() -> None:
    # every transformers decoder and encoder given input_ids and attention_mask: "Tensor.item()
    # cannot be called on meta tensors", a usage error (exit 2). The mask's values are now
    # those --verify runs it with (drawn from {0, 1}: padding), so the mask is made and crosses
    p = _plan("padded_decoder")
    assert p.device_map() == {"embed": 0, "layers.0": 0, "layers.1": 1, "head": 1}
    assert p.fits()
    masks = [c for c in p.flow.crossings if c.shape == (2, 1, SEQ, SEQ)]
    assert [(c.src, c.dst, c.nbytes, c.count) for c in masks] == [
        ("cuda:0", "cuda:1", 2 * SEQ * SEQ, 1)
    ]
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_input_values_are_those_verify_runs_and_follow_every_batch_size() -> None:
    p = _plan("padded_decoder", batch_sizes=[1, 3, 4], strategy="accelerate")
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()
    assert all(m["error"] == 0 for m in verdict.memory)


class SlicedByLength(nn.Module):
    """A length read with ``.item()`` from an integer input cuts the sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, W)
        self.proj = nn.Linear(W, W)

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        n = int(lengths.max().item()) + 1
        return self.proj(self.embed(input_ids[:, :n]))  # type: ignore[no-any-return]


def make_sliced_by_length() -> nn.Module:
    model = SlicedByLength()
    model.torchplace_inputs = (  # type: ignore[assignment]
        TensorSpec("input_ids", "INT64", (-1, SEQ)),
        TensorSpec("lengths", "INT64", (-1,)),
    )
    return model


def test_a_length_read_from_an_integer_input_is_planned_as_verify_runs_it() -> None:
    # lengths drawn from {0, 1}: n is 2, the embedding's output (batch, 2, W)
    p = _plan("sliced_by_length", max_memory=[2200, 2200])
    handed = [c for c in p.flow.crossings if c.src == "cuda:0" and c.dst == "cuda:1"]
    assert [(c.shape, c.nbytes) for c in handed] == [((2, 2, W), 2 * 2 * W * 4)]
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


# ----------------------------------------------------------- an operator meta cannot run


class Proposals(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(W, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.nonzero(self.score(x).squeeze(-1) > 0)  # values of the weights' output
        return x[keep[:, 0]]


class Detector(nn.Module):
    """As torchvision's Faster R-CNN: proposals kept by their scores (nonzero, nms)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(W, W)
        self.rpn = Proposals()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rpn(self.backbone(x))  # type: ignore[no-any-return]


def make_detector() -> nn.Module:
    model = Detector()
    model.torchplace_inputs = (TensorSpec("x", "FP32", (-1, W)),)  # type: ignore[assignment]
    return model


def test_an_operator_that_reads_the_weights_values_is_named_with_its_unit() -> None:
    # was torch's own text, advice included: "... please set
    # 'torch.fx.experimental._config.meta_nonzero_assume_all_nonzero' to True"
    with pytest.raises(UntraceableModel) as exc:
        _plan("detector", max_memory=None)
    message = str(exc.value)
    assert "aten.nonzero in rpn" in message
    assert "torch.fx" not in message
    assert "control flow reads tensor values" in message


# ------------------------------------------------ a mixture of experts on torch._grouped_mm


class GroupedExperts(nn.Module):
    """As transformers' mixture-of-experts layers (Mixtral, Qwen-MoE): the tokens sorted by
    expert, and every expert's weights applied at once by ``torch._grouped_mm``."""

    def __init__(self, experts: int = 4) -> None:
        super().__init__()
        self.experts = experts
        self.router = nn.Linear(W, experts, bias=False)
        self.up = nn.Parameter(torch.randn(experts, W, 2 * W) * 0.1)
        self.down = nn.Parameter(torch.randn(experts, 2 * W, W) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, W)
        expert = self.router(tokens).argmax(-1)
        order = expert.argsort()
        counts = torch.histc(expert.float(), bins=self.experts, min=0, max=self.experts - 1)
        offs = counts.cumsum(0).to(torch.int32)
        h = torch._grouped_mm(tokens[order], self.up, offs=offs)
        out = torch._grouped_mm(F.silu(h), self.down, offs=offs)
        return x + out[order.argsort()].reshape(x.shape)  # type: ignore[no-any-return]


class MoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = GroupedExperts()
        self.second = GroupedExperts()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))  # type: ignore[no-any-return]


def make_moe() -> nn.Module:
    model = MoE()
    model.torchplace_inputs = (TensorSpec("x", "FP32", (-1, SEQ, W)),)  # type: ignore[assignment]
    return model


def test_grouped_mm_of_float32_experts_is_planned_as_the_cpu_runs_it() -> None:
    # Mixtral in float32: "Expected inputs of BF16 type but got mat_a.dtype=torch.float32",
    # blamed on control flow (meta's kernel takes bfloat16 alone; the CPU's takes float32)
    p = _plan("moe", max_memory=[20000, 20000])
    assert p.device_map() == {"first": 0, "second": 1}
    assert p.work[0].flops > 2 * (2 * SEQ) * W * (2 * W) * 2  # both grouped matmuls counted
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


class _Noisy(nn.Module):
    """Draws noise the size of its integer input's length, as a sampler would."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        noise = torch.rand(ids.shape[0], 4, device=ids.device)
        return self.proj(noise + ids[:, :1].float())


def make_noisy() -> nn.Module:
    model = _Noisy()
    model.torchplace_inputs = (TensorSpec("ids", "INT64", (-1, 5)),)  # type: ignore[assignment]
    return model


def test_planning_leaves_the_callers_random_generator_as_it_was() -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    _plan("noisy")
    assert torch.equal(torch.rand(3), expected)
