"""Two transformer shapes built in code for planning: GPT-2-small-like and Llama-7B-like.

No hub access and no weights: :func:`build_shape` builds the module under ``torch.device``
(``meta`` by default), so even the 7B shape costs no memory. The attention is written out
(``q @ k^T``, softmax, ``@ v``) rather than fused, so the same operators run on ``meta`` and on
a real device and the planner's activation estimate can be checked against a real run.

Each shape declares its inputs (:class:`~torchplace.planner.inputs.InputSpec`) and its KV cache
(:class:`KVCacheSpec`), which the budget counts analytically.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["SHAPES", "KVCacheSpec", "TransformerShape", "build_shape"]


@dataclass(frozen=True)
class KVCacheSpec:
    """What a decoder keeps per token while it generates: K and V for every layer."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str  # torch dtype name, e.g. "float16"

    def bytes(self, batch: int, seq: int) -> int:
        """KV cache bytes for ``batch`` sequences of ``seq`` tokens: 2 x layers x B x S x H x D."""
        import torch

        item = torch.empty((), dtype=getattr(torch, self.dtype), device="meta").element_size()
        return 2 * self.layers * batch * seq * self.kv_heads * self.head_dim * item


@dataclass(frozen=True)
class TransformerShape:
    """A decoder-only transformer's sizes."""

    name: str
    description: str
    vocab: int
    width: int
    layers: int
    heads: int
    mlp: int
    max_seq: int
    dtype: str
    llama: bool  # RMSNorm, rotary positions, gated MLP, untied head; else GPT-2 style (tied)
    default_seq: int

    @property
    def kv_cache(self) -> KVCacheSpec:
        return KVCacheSpec(self.layers, self.heads, self.width // self.heads, self.dtype)


SHAPES: dict[str, TransformerShape] = {
    shape.name: shape
    for shape in (
        TransformerShape(
            name="gpt2-like",
            description="GPT-2-small shape: 12 layers, width 768, tied head, fp32 (124M)",
            vocab=50257,
            width=768,
            layers=12,
            heads=12,
            mlp=3072,
            max_seq=1024,
            dtype="float32",
            llama=False,
            default_seq=128,
        ),
        TransformerShape(
            name="llama-7b-like",
            description="Llama-7B shape: 32 layers, width 4096, gated MLP 11008, fp16 (6.7B)",
            vocab=32000,
            width=4096,
            layers=32,
            heads=32,
            mlp=11008,
            max_seq=4096,
            dtype="float16",
            llama=True,
            default_seq=512,
        ),
    )
}


def build_shape(name: str, *, device: str = "meta", layers: int | None = None) -> nn.Module:
    """Build a transformer shape on ``device`` (``meta``: no memory), optionally fewer layers."""
    import dataclasses

    import torch

    shape = SHAPES[name]
    if layers is not None:
        shape = dataclasses.replace(shape, layers=layers)
    with torch.device(device):
        model = _model_class()(shape)
    return model.to(getattr(torch, shape.dtype)).eval()


def _model_class() -> Callable[[TransformerShape], nn.Module]:
    """The module classes, defined on first use so that importing this module needs no torch."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class RMSNorm(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    class Attention(nn.Module):
        def __init__(self, s: TransformerShape) -> None:
            super().__init__()
            self.heads = s.heads
            self.qkv = nn.Linear(s.width, 3 * s.width, bias=not s.llama)
            self.proj = nn.Linear(s.width, s.width, bias=not s.llama)

        def forward(self, x: torch.Tensor, mask: torch.Tensor, rope: Any) -> torch.Tensor:
            b, n, w = x.shape
            q, k, v = self.qkv(x).view(b, n, 3, self.heads, w // self.heads).unbind(2)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if rope is not None:
                q, k = _rotate(q, rope), _rotate(k, rope)
            scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(w // self.heads)) + mask
            out = F.softmax(scores, dim=-1) @ v
            projected: torch.Tensor = self.proj(out.transpose(1, 2).reshape(b, n, w))
            return projected

    def _rotate(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        cos, sin = rope.unbind(0)
        half = x.shape[-1] // 2
        turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + turned * sin

    class MLP(nn.Module):
        def __init__(self, s: TransformerShape) -> None:
            super().__init__()
            self.llama = s.llama
            self.up = nn.Linear(s.width, s.mlp, bias=not s.llama)
            self.gate = nn.Linear(s.width, s.mlp, bias=False) if s.llama else None
            self.down = nn.Linear(s.mlp, s.width, bias=not s.llama)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.gate is not None:
                hidden = F.silu(self.gate(x)) * self.up(x)
            else:
                hidden = F.gelu(self.up(x), approximate="tanh")
            down: torch.Tensor = self.down(hidden)
            return down

    class Block(nn.Module):
        def __init__(self, s: TransformerShape) -> None:
            super().__init__()
            norm: Callable[[int], nn.Module] = RMSNorm if s.llama else nn.LayerNorm
            self.ln_1, self.attn = norm(s.width), Attention(s)
            self.ln_2, self.mlp = norm(s.width), MLP(s)

        def forward(self, x: torch.Tensor, mask: torch.Tensor, rope: Any = None) -> torch.Tensor:
            x = x + self.attn(self.ln_1(x), mask, rope)
            out: torch.Tensor = x + self.mlp(self.ln_2(x))
            return out

    class Decoder(nn.Module):
        def __init__(self, s: TransformerShape) -> None:
            super().__init__()
            self.shape = s
            self.wte = nn.Embedding(s.vocab, s.width)
            self.wpe = None if s.llama else nn.Embedding(s.max_seq, s.width)
            self.h = nn.ModuleList(Block(s) for _ in range(s.layers))
            self.ln_f = RMSNorm(s.width) if s.llama else nn.LayerNorm(s.width)
            self.lm_head = nn.Linear(s.width, s.vocab, bias=False)
            if not s.llama:
                self.lm_head.weight = self.wte.weight  # tied, as in GPT-2

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            n = input_ids.shape[1]
            x = self.wte(input_ids)
            positions = torch.arange(n, device=input_ids.device)
            rope = None
            if self.wpe is not None:
                x = x + self.wpe(positions)
            else:
                rope = _rope(positions, self.shape.width // self.shape.heads, x.dtype)
            causal = torch.full((n, n), float("-inf"), device=x.device, dtype=x.dtype)
            mask = torch.triu(causal, diagonal=1).expand(input_ids.shape[0], 1, n, n)
            mask = mask.contiguous()  # one (B, 1, S, S) mask, handed to every block
            for block in self.h:
                x = block(x, mask, rope)
            return self.lm_head(self.ln_f(x))  # type: ignore[no-any-return]

    def _rope(positions: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=positions.device) / dim))
        angles = positions[:, None].float() * inv[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return torch.stack((angles.cos(), angles.sin())).to(dtype)

    return Decoder
