"""The decoder-only transformer :func:`~torchplace.planner.shapes.build_shape` builds.

GPT-2 style (LayerNorm, learned positions, GELU MLP, tied head) or Llama style (RMSNorm, rotary
positions, gated SiLU MLP, untied head), as :class:`~torchplace.planner.shapes.TransformerShape`
says. This module imports torch; :mod:`~torchplace.planner.shapes` imports it on first build.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn import functional as F

if TYPE_CHECKING:
    from torchplace.planner.shapes import TransformerShape

__all__ = ["Decoder"]


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
