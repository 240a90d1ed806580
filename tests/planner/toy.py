"""Small models whose activation peak, crossings and FLOPs are worked out by hand in the tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from torchplace.models import TensorSpec

WIDTH = 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * mask


class Toy(nn.Module):
    """x (B, 4) -> Linear(4, 8) -> three blocks, each given the same (B, 8) mask -> Linear(8, 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.out = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.ones(x.shape[0], WIDTH, device=x.device)  # made once, handed to each block
        h = self.inp(x)
        for block in self.blocks:
            h = block(h, mask)
        return self.out(h)  # type: ignore[no-any-return]


class Tied(nn.Module):
    """An embedding and a head that share one weight (10 x 8), with a Linear between."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, WIDTH)
        self.mid = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.mid(self.emb(ids)))  # type: ignore[no-any-return]


def make_toy() -> nn.Module:
    model = Toy()
    model.torchplace_inputs = (TensorSpec("x", "FP32", (-1, 4)),)  # type: ignore[assignment]
    return model


def make_tied() -> nn.Module:
    model = Tied()
    model.torchplace_inputs = (TensorSpec("ids", "INT64", (-1, -1)),)  # type: ignore[assignment]
    return model


class RootTensors(nn.Module):
    """A ViT-like model: a class token and a scale at the top level, beside its layers, and a
    top-level buffer (int8) that its forward reads."""

    def __init__(self) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, WIDTH))
        self.register_buffer("table", torch.ones(100, dtype=torch.int8))
        self.first = nn.Linear(WIDTH, WIDTH)
        self.second = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x) + self.cls_token
        return self.second(h) * self.table[0]  # type: ignore[no-any-return]


class Aliased(nn.Module):
    """One Linear registered under two names (``dec`` is ``enc``), called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(WIDTH, WIDTH)
        self.mid = nn.Linear(WIDTH, WIDTH)
        self.dec = self.enc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dec(self.mid(self.enc(x)))  # type: ignore[no-any-return]


class Branches(nn.Module):
    """Two inputs through two Linears; the model's own code adds their outputs (a U-Net's skip
    connection, a BERT's mask arithmetic: code between units that reads two stages' tensors)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)
        self.b = nn.Linear(WIDTH, WIDTH)
        self.c = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.a(x) + self.b(y * 2)
        return self.c(h), h


@dataclass
class Output:
    logits: torch.Tensor
    hidden: torch.Tensor


class DataclassOut(nn.Module):
    """Returns a dataclass, as many libraries' models do."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, WIDTH)
        self.b = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor) -> Output:
        h = self.a(x)
        return Output(self.b(h), h)


def _declared(model: nn.Module, *specs: TensorSpec) -> nn.Module:
    model.torchplace_inputs = specs  # type: ignore[assignment]
    return model


def make_root_tensors() -> nn.Module:
    return _declared(RootTensors(), TensorSpec("x", "FP32", (-1, WIDTH)))


def make_aliased() -> nn.Module:
    return _declared(Aliased(), TensorSpec("x", "FP32", (-1, WIDTH)))


def make_branches() -> nn.Module:
    x, y = TensorSpec("x", "FP32", (-1, WIDTH)), TensorSpec("y", "FP32", (-1, WIDTH))
    return _declared(Branches(), x, y)


def make_dataclass_out() -> nn.Module:
    return _declared(DataclassOut(), TensorSpec("x", "FP32", (-1, 4)))


class EncoderStack(nn.Module):
    """A ViT-like stack: a class token, two ``nn.TransformerEncoderLayer`` units (each a unit
    of its own, so the trace wraps it) and a head. In inference they take PyTorch's fast path."""

    def __init__(self, width: int = 32, seq: int = 16) -> None:
        super().__init__()
        self.patch = nn.Linear(12, width)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True)
            for _ in range(2)
        )
        self.head = nn.Linear(width, 3)
        self.seq = seq

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.patch(x)
        h = torch.cat([self.cls_token.expand(h.shape[0], -1, -1), h], 1)
        for layer in self.layers:
            h = layer(h)
        return self.head(h[:, 0])  # type: ignore[no-any-return]


class Attention(nn.Module):
    """``nn.MultiheadAttention`` on its fast path (without and with the attention weights)
    beside a ``scaled_dot_product_attention`` block, and a dropout (inactive in inference)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(width, 4, batch_first=True)
        self.qkv = nn.Linear(width, 3 * width)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, d = x.shape
        h = self.mha(x, x, x, need_weights=False)[0]
        h, weights = self.mha(h, h, h)  # the scores asked for, averaged over the heads
        q, k, v = self.qkv(h).view(b, t, 3, 4, d // 4).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.drop(y.transpose(1, 2).reshape(b, t, d)), weights


class Normed(nn.Module):
    """A convolution and two batch norms (eval): real kernels keep no per-channel statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.bn1d = nn.BatchNorm1d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn1d(self.bn(self.conv(x)).mean((2, 3)))  # type: ignore[no-any-return]


class SharedPosition(nn.Module):
    """Top-level parameters read away from their device: ``pos * scale`` in the model's own
    code, and ``pos`` handed to a block as an argument."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Parameter(torch.zeros(1, WIDTH))
        self.scale = nn.Parameter(torch.ones(1, WIDTH))
        self.a = nn.Linear(WIDTH, WIDTH)
        self.b = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) + self.pos * self.scale, self.pos)  # type: ignore[no-any-return]


class NeedsFlag(nn.Module):
    """A forward with a required non-tensor argument, which no declared input can give."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, flag: bool) -> torch.Tensor:
        return self.a(x) if flag else x  # type: ignore[no-any-return]


def make_encoder_stack() -> nn.Module:
    return _declared(EncoderStack(), TensorSpec("x", "FP32", (-1, 15, 12)))


def make_attention() -> nn.Module:
    return _declared(Attention(), TensorSpec("x", "FP32", (-1, 24, 32)))


def make_normed() -> nn.Module:
    return _declared(Normed(), TensorSpec("x", "FP32", (-1, 3, 8, 8)))


def make_shared_position() -> nn.Module:
    return _declared(SharedPosition(), TensorSpec("x", "FP32", (-1, WIDTH)))


def make_scripted() -> nn.Module:
    """A TorchScript module (whose modules take no hooks and refuse ``get_submodule``)."""
    model = torch.jit.script(nn.Sequential(nn.Linear(WIDTH, 16), nn.ReLU(), nn.Linear(16, 2)))
    return _declared(model, TensorSpec("x", "FP32", (-1, WIDTH)))


def make_needs_flag() -> nn.Module:
    return _declared(NeedsFlag(), TensorSpec("x", "FP32", (-1, WIDTH)))


def make_wide_stack() -> nn.Module:
    """Three Linear layers of 64 KiB of weights each: too big, each, for a 32 KiB device."""
    layers = nn.Sequential(*(nn.Linear(128, 128, bias=False) for _ in range(3)))
    return _declared(layers, TensorSpec("x", "FP32", (-1, 128)))


def make_deep() -> nn.Module:
    """1,000 Linear layers in one nn.Sequential: a thousand units."""
    layers = nn.Sequential(*(nn.Linear(16, 16) for _ in range(1000)))
    return _declared(layers, TensorSpec("x", "FP32", (-1, 16)))


def make_huge() -> nn.Module:
    """100 billion fp16 parameters (40 Linear layers of 50,000 x 50,000), declared on meta."""
    layers = nn.Sequential(
        *(
            nn.Linear(50_000, 50_000, bias=False, device="meta", dtype=torch.float16)
            for _ in range(40)
        )
    )
    return _declared(layers, TensorSpec("x", "FP16", (-1, 50_000)))


class KeywordOnly(nn.Module):
    """A forward that takes its mask by keyword only, and a flag with a default."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        return self.a(x) * mask * scale  # type: ignore[no-any-return]


def make_keyword_only() -> nn.Module:
    x, mask = TensorSpec("x", "FP32", (-1, WIDTH)), TensorSpec("mask", "FP32", (-1, WIDTH))
    return _declared(KeywordOnly(), x, mask)


class BuffersOnly(nn.Module):
    """No parameter: a scale and a shift held as buffers (a normalisation's statistics)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.ones(WIDTH))
        self.register_buffer("shift", torch.zeros(WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift  # type: ignore[no-any-return]


def make_buffers_only() -> nn.Module:
    return _declared(BuffersOnly(), TensorSpec("x", "FP32", (-1, WIDTH)))


class Wrapped(nn.Module):
    """A module whose only child is the whole model (a ``Toy``): one unit."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = make_toy()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)  # type: ignore[no-any-return]


def make_wrapped() -> nn.Module:
    return _declared(Wrapped(), TensorSpec("x", "FP32", (-1, 4)))


class TwoLinear(nn.Module):
    """Two Linear layers on a 3-D input: torch's ``linear`` runs a 2-D matmul on the folded
    input and reshapes its output back to (B, T, 8)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)
        self.b = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))  # type: ignore[no-any-return]


def make_two_linear() -> nn.Module:
    return _declared(TwoLinear(), TensorSpec("x", "FP32", (-1, 6, WIDTH)))


def make_lazy() -> nn.Module:
    """A lazy module, its weights without a shape until its first forward."""
    return _declared(nn.LazyLinear(WIDTH), TensorSpec("x", "FP32", (-1, WIDTH)))
