"""Architectures users bring, built in code (no downloads), for tests/planner/test_architectures.py.

Each ``make_*`` factory returns a module with its inputs declared (``torchplace_inputs``),
small enough to run for real on the CPU (``--verify``), except those built on ``meta``.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import parametrizations, parametrize
from torch.utils.checkpoint import checkpoint

from torchplace.models import TensorSpec

W = 16  # width
VOCAB = 50


def _declared(model: nn.Module, *specs: TensorSpec) -> nn.Module:
    model.torchplace_inputs = specs  # type: ignore[assignment]
    return model


def _x(*dims: int, name: str = "x", dtype: str = "FP32") -> TensorSpec:
    return TensorSpec(name, dtype, (-1, *dims))


# --------------------------------------------------------------------------- transformers


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int = W, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))  # type: ignore[no-any-return]


class GPTBlock(nn.Module):
    def __init__(self, width: int = W) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))  # type: ignore[no-any-return]


class TinyGPT(nn.Module):
    """GPT-style: token and position embeddings, blocks, a final norm and a head tied to the
    token embedding; positions made with ``torch.arange(t, device=ids.device)``."""

    def __init__(self, layers: int = 2, width: int = W, vocab: int = VOCAB) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(64, width)
        self.h = nn.ModuleList(GPTBlock(width) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # type: ignore[no-any-return]


def make_tiny_gpt() -> nn.Module:
    return _declared(TinyGPT(), TensorSpec("ids", "INT64", (-1, -1)))


class Wrapped(nn.Module):
    """A model wrapped once (``model.transformer``, as many libraries nest it): the tied
    embedding and head inside one child."""

    def __init__(self) -> None:
        super().__init__()
        self.transformer = TinyGPT()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.transformer(ids)  # type: ignore[no-any-return]


def make_wrapped_gpt() -> nn.Module:
    return _declared(Wrapped(), TensorSpec("ids", "INT64", (-1, -1)))


# --------------------------------------------------------------------------- sharing


class CalledTwice(nn.Module):
    """One block called twice in forward (shared weights, one registration)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(W, W)
        self.shared = nn.Linear(W, W)
        self.mid = nn.Linear(W, W)
        self.out = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.shared(self.inp(x))
        h = self.shared(self.mid(h))
        return self.out(h)  # type: ignore[no-any-return]


def make_called_twice() -> nn.Module:
    return _declared(CalledTwice(), _x(W))


class RepeatedLayer(nn.Module):
    """ALBERT-like: one layer held by a ModuleList four times."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.Linear(W, W)
        self.layers = nn.ModuleList([layer] * 4)
        self.head = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)  # type: ignore[no-any-return]


def make_repeated_layer() -> nn.Module:
    return _declared(RepeatedLayer(), _x(W))


class SharedLayer(nn.Module):
    """ALBERT-like, the shared layer registered by itself too: one module under two paths in
    different containers (``shared`` and ``layers.0``)."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(W, W)
        self.layers = nn.ModuleList([self.shared] * 3)
        self.head = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)  # type: ignore[no-any-return]


def make_shared_layer() -> nn.Module:
    return _declared(SharedLayer(), _x(W))


class SharedBuffer(nn.Module):
    """One (large) buffer registered in every block, as a shared causal mask or rotary table
    is: one tensor, held by four modules."""

    def __init__(self) -> None:
        super().__init__()
        table = torch.ones(256, W)
        self.blocks = nn.ModuleList(_BufferBlock(table) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class _BufferBlock(nn.Module):
    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.lin = nn.Linear(W, W)
        self.register_buffer("table", table)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.table[0]  # type: ignore[no-any-return]


def make_shared_buffer() -> nn.Module:
    return _declared(SharedBuffer(), _x(W))


class TiedAcrossRoot(nn.Module):
    """A top-level parameter that is a child's weight too (``self.proj = self.lin.weight``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(W, W)
        self.other = nn.Linear(W, W)
        self.proj = self.lin.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.other(self.lin(x)) @ self.proj  # type: ignore[no-any-return]


def make_tied_across_root() -> nn.Module:
    return _declared(TiedAcrossRoot(), _x(W))


# --------------------------------------------------------------------------- buffers


class Buffers(nn.Module):
    """BatchNorm (running stats, a num_batches_tracked int64) and a non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(W, W)
        self.bn = nn.BatchNorm1d(W)
        self.register_buffer("scale", torch.full((W,), 2.0), persistent=False)
        self.tail = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tail(self.bn(self.lin(x)) * self.scale)  # type: ignore[no-any-return]


def make_buffers() -> nn.Module:
    return _declared(Buffers(), _x(W))


class _Symmetric(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.triu() + x.triu(1).transpose(-1, -2)


class Parametrized(nn.Module):
    """Parametrizations: a custom one (symmetric), weight_norm (old and new), spectral_norm."""

    def __init__(self) -> None:
        super().__init__()
        self.sym = parametrize.register_parametrization(nn.Linear(W, W), "weight", _Symmetric())
        self.wn = nn.utils.parametrizations.weight_norm(nn.Linear(W, W))
        self.sn = nn.utils.parametrizations.spectral_norm(nn.Linear(W, W))
        self.old = nn.utils.weight_norm(nn.Linear(W, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.old(self.sn(self.wn(self.sym(x))))  # type: ignore[no-any-return]


def make_parametrized() -> nn.Module:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the old weight_norm is deprecated
        return _declared(Parametrized(), _x(W))


class Containers(nn.Module):
    """ModuleDict, ModuleList, ParameterList and ParameterDict."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(W, W), "b": nn.Linear(W, W)})
        self.stack = nn.ModuleList(nn.Linear(W, W) for _ in range(2))
        self.scales = nn.ParameterList(nn.Parameter(torch.ones(W)) for _ in range(2))
        self.biases = nn.ParameterDict({"p": nn.Parameter(torch.zeros(W))})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.heads["a"](x) * self.scales[0]
        for layer in self.stack:
            x = layer(x)
        return self.heads["b"](x) * self.scales[1] + self.biases["p"]  # type: ignore[no-any-return]


def make_containers() -> nn.Module:
    return _declared(Containers(), _x(W))


class NoParams(nn.Module):
    """A model with no parameter and no buffer."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 2, -1)


def make_no_params() -> nn.Module:
    return _declared(NoParams(), _x(W))


def make_identity() -> nn.Module:
    """Returns its input itself."""
    return _declared(nn.Identity(), _x(W))


# --------------------------------------------------------------------------- calls


class Kwargs(nn.Module):
    """``forward(x, mask=None, **kwargs)``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(W, W)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, **kwargs: object
    ) -> torch.Tensor:
        h = self.a(x)
        return h if mask is None else h * mask  # type: ignore[no-any-return]


def make_kwargs() -> nn.Module:
    return _declared(Kwargs(), _x(W), _x(W, name="mask"))


class MultiIn(nn.Module):
    """Three inputs of three dtypes (float, int64 ids, bool mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, W)
        self.a = nn.Linear(W, W)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return self.a(x + self.emb(ids)) * keep  # type: ignore[no-any-return]


def make_multi_in() -> nn.Module:
    return _declared(
        MultiIn(), _x(W), _x(name="ids", dtype="INT64"), _x(W, name="keep", dtype="BOOL")
    )


@dataclass
class Out:
    logits: torch.Tensor
    hidden: tuple[torch.Tensor, ...]
    extra: dict[str, torch.Tensor]
    loss: None = None
    steps: int = 3


Pair = collections.namedtuple("Pair", ["first", "second"])


class RichOutputs(nn.Module):
    """Nested outputs: a dataclass holding a tuple, a dict, None and an int."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(W, W)
        self.b = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> Out:
        h = self.a(x)
        y = self.b(h)
        return Out(y, (h, y), {"pair": Pair(h, x)})  # x: an input returned as an output


def make_rich_outputs() -> nn.Module:
    return _declared(RichOutputs(), _x(W))


class DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(W, W)
        self.b = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.a(x)
        return {"logits": self.b(h), "hidden": h}


def make_dict_out() -> nn.Module:
    return _declared(DictOut(), _x(W))


class ScalarOut(nn.Module):
    """Outputs and a 0-dim score, as a model returning its loss does."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.a(x)
        return y, y.square().mean()


def make_scalar_out() -> nn.Module:
    return _declared(ScalarOut(), _x(W))


class TupleOut(nn.Module):
    """Returns the same tensor twice, and a view of it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(W, W)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.a(x)
        return h, h, h[:, :2]


def make_tuple_out() -> nn.Module:
    return _declared(TupleOut(), _x(W))


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(W, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.sum() > 0:
            return h
        return -h


def make_data_dependent() -> nn.Module:
    return _declared(DataDependent(), _x(W))


class ItemCall(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(W, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = int(x.abs().max().item()) + 1
        return self.a(x)[:, :n]  # type: ignore[no-any-return]


def make_item_call() -> nn.Module:
    return _declared(ItemCall(), _x(W))


class Nonzero(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(W, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        return h[h > 0]


def make_nonzero() -> nn.Module:
    return _declared(Nonzero(), _x(W))


class MakesTensors(nn.Module):
    """Its forward makes tensors without ``device=``: a position index, a zero state."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, W)
        self.a = nn.Linear(W, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1])
        state = torch.zeros(x.shape[0], x.shape[1], W)
        return self.a(x + self.emb(pos) + state)  # type: ignore[no-any-return]


def make_makes_tensors() -> nn.Module:
    return _declared(MakesTensors(), _x(-1, W))


class MakesTensorsLikeInput(nn.Module):
    """Its forward makes tensors on the input's device (the right way)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, W)
        self.a = nn.Linear(W, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device)
        state = torch.zeros_like(x)
        return self.a(x + self.emb(pos) + state)  # type: ignore[no-any-return]


def make_makes_tensors_like_input() -> nn.Module:
    return _declared(MakesTensorsLikeInput(), _x(-1, W))


class MovesToWeight(nn.Module):
    """Moves its input to its weights' device itself (``x.to(self.a.weight.device)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(W, W)
        self.b = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x.to(self.a.weight.device))
        return self.b(h.to(self.b.weight.device))  # type: ignore[no-any-return]


def make_moves_to_weight() -> nn.Module:
    return _declared(MovesToWeight(), _x(W))


class MovesToCuda(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(W, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x.cuda())  # type: ignore[no-any-return]


def make_moves_to_cuda() -> nn.Module:
    return _declared(MovesToCuda(), _x(W))


class MovesToCpu(nn.Module):
    """Returns its output on the host (``.cpu()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(W, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x).cpu()  # type: ignore[no-any-return]


def make_moves_to_cpu() -> nn.Module:
    return _declared(MovesToCpu(), _x(W))


class Flatten(nn.Module):
    """Flattens its input in its own code (a view of an input) before its first unit."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3 * 4 * 4, W)
        self.b = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x.flatten(1)))  # type: ignore[no-any-return]


def make_flatten() -> nn.Module:
    return _declared(Flatten(), _x(3, 4, 4))


class Chunks(nn.Module):
    """q, k and v: three chunks of one projection, each handed to a unit of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(W, 3 * W)
        self.q = nn.Linear(W, 2)
        self.k = nn.Linear(W, 2)
        self.v = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        return self.q(q) + self.k(k) + self.v(v)  # type: ignore[no-any-return]


def make_chunks() -> nn.Module:
    return _declared(Chunks(), _x(W))


class TwoShapes(nn.Module):
    """One activation handed to one unit whole and to another flattened (two views of one
    storage, each the whole of it)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(W, W)
        self.b = nn.Linear(W, 2)
        self.c = nn.Linear(4 * W, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.a(x)
        flat = h.flatten(1)
        return self.b(h), self.c(flat)


def make_two_shapes() -> nn.Module:
    return _declared(TwoShapes(), _x(4, W))


class ClsHead(nn.Module):
    """A ViT/BERT-style head: the first token's state (a view) to a classifier, and the last
    token's logits returned (a view), as a language model's generation step takes them."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(W, W)
        self.head = nn.Linear(W, 2)
        self.lm = nn.Linear(W, VOCAB)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.head(h[:, 0]), self.lm(h)[:, -1]


def make_cls_head() -> nn.Module:
    return _declared(ClsHead(), _x(8, W))


class Expanded(nn.Module):
    """A per-feature gate made once and expanded over the batch (a stride-0 view), handed to a
    unit: a copy of it is the whole expanded size."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(W, W)
        self.mul = _Mul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gate(torch.ones(1, W, device=x.device))
        return self.mul(x, g.expand(x.shape[0], -1))  # type: ignore[no-any-return]


class _Mul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(W))

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x * g * self.scale


def make_expanded() -> nn.Module:
    return _declared(Expanded(), _x(W))


class BatchNormMLP(nn.Module):
    """An MLP with BatchNorm1d between its layers (eval): per-feature statistics as large as a
    small batch's activations."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(W, 64)
        self.bn = nn.BatchNorm1d(64)
        self.b = nn.Linear(64, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.bn(self.a(x))))  # type: ignore[no-any-return]


def make_batch_norm_mlp() -> nn.Module:
    return _declared(BatchNormMLP(), _x(W))


class VarKeyword(nn.Module):
    """``forward(self, **inputs)``: every input by name."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(W, W)

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
        return self.a(inputs["x"]) * inputs["mask"]  # type: ignore[no-any-return]


def make_var_keyword() -> nn.Module:
    return _declared(VarKeyword(), _x(W), _x(W, name="mask"))


class OddNames(nn.Module):
    """ModuleDict keys as users write them: a pipe, brackets (a tokenizer's "[CLS]", and "[/]",
    which rich reads as a closing tag), spaces and non-ASCII letters; and 0-dim tensors the
    forward makes on the CPU (which combine with any device's)."""

    def __init__(self) -> None:
        super().__init__()
        names = ("a|b", "[CLS]", "[/]", "ünï cödé")
        self.heads = nn.ModuleDict({name: nn.Linear(W, W) for name in names})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.heads["a|b"](x) * torch.tensor(0.5)
        h = self.heads["[/]"](self.heads["[CLS]"](h))
        return self.heads["ünï cödé"](h) + torch.full((), 2.0)  # type: ignore[no-any-return]


def make_odd_names() -> nn.Module:
    return _declared(OddNames(), _x(W))


# --------------------------------------------------------------------------- dtypes


class Mixed(nn.Module):
    """fp16, bf16 and fp32 parameters, cast between them; a frozen part."""

    def __init__(self) -> None:
        super().__init__()
        self.fp16 = nn.Linear(W, W, dtype=torch.float16)
        self.bf = nn.Linear(W, W, dtype=torch.bfloat16)
        self.full = nn.Linear(W, 2)
        self.mixed = nn.Module()
        self.mixed.a = nn.Linear(W, W, dtype=torch.float16)  # type: ignore[assignment]
        self.mixed.b = nn.Linear(W, W)  # type: ignore[assignment]
        for p in self.fp16.parameters():
            p.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fp16(x.half())
        h = self.bf(h.bfloat16())
        h = self.mixed.b(self.mixed.a(h.half()).float())  # type: ignore[operator]
        return self.full(h)  # type: ignore[no-any-return]


def make_mixed() -> nn.Module:
    return _declared(Mixed(), _x(W))


def make_half() -> nn.Module:
    model = nn.Sequential(nn.Linear(W, W), nn.ReLU(), nn.Linear(W, 2)).to(torch.bfloat16)
    return _declared(model, _x(W, dtype="BF16"))


# --------------------------------------------------------------------------- layers


class Attn(nn.Module):
    """nn.MultiheadAttention three ways: self-attention (fast path), different key and value
    widths (separate projections), and a key padding mask."""

    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(W, 2, batch_first=True)
        self.cross = nn.MultiheadAttention(W, 2, kdim=8, vdim=4, batch_first=True)
        self.seq_first = nn.MultiheadAttention(W, 2)

    def forward(self, x: torch.Tensor, mem: torch.Tensor) -> torch.Tensor:
        h = self.self_attn(x, x, x, need_weights=False)[0]
        h = self.cross(h, mem, mem[..., :4], need_weights=False)[0]
        t = h.transpose(0, 1)
        return self.seq_first(t, t, t)[0].transpose(0, 1)  # type: ignore[no-any-return]


def make_attn() -> nn.Module:
    return _declared(Attn(), _x(6, W), _x(6, 8, name="mem"))


class CausalEncoder(nn.Module):
    """``nn.TransformerEncoder`` and ``nn.TransformerDecoder`` given a causal mask without
    ``is_causal``, as word_language_model's TransformerModel gives it: torch reads the mask's
    values to tell whether it is causal."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(W, 2, 2 * W, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        block = nn.TransformerDecoderLayer(W, 2, 2 * W, dropout=0.0, batch_first=True)
        self.decoder = nn.TransformerDecoder(block, 1)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = self.mask[: x.shape[1], : x.shape[1]]
        return self.decoder(x, self.encoder(x, mask=mask), tgt_mask=mask)  # type: ignore[no-any-return]


def make_causal_encoder() -> nn.Module:
    return _declared(CausalEncoder(), _x(6, W))


class _AddPositions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(W, W)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.lin(x + pos)  # type: ignore[no-any-return]


class SlicedTable(nn.Module):
    """A position table (a buffer) sliced to the sequence by the model's code and handed to a
    unit, as rotary caches are."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(64, W))
        self.a = nn.Linear(W, W)
        self.b = _AddPositions()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x), self.table[: x.shape[1]])  # type: ignore[no-any-return]


def make_sliced_table() -> nn.Module:
    return _declared(SlicedTable(), _x(6, W))


class Recurrent(nn.Module):
    """LSTM (two layers, a projection) and a bidirectional GRU, batch first."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(W, 12, num_layers=2, batch_first=True, proj_size=6)
        self.gru = nn.GRU(6, 8, batch_first=True, bidirectional=True)
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(x)
        h, _ = self.gru(h)
        return self.head(h[:, -1])  # type: ignore[no-any-return]


def make_recurrent() -> nn.Module:
    return _declared(Recurrent(), _x(5, W))


class ConvNet(nn.Module):
    """A ResNet-like stem and block: conv, batch norm, relu, a residual, pooling, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU()
        )
        self.block = nn.Sequential(
            nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
        )  # fmt: skip
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = torch.relu(h + self.block(h))
        return self.fc(self.pool(h).flatten(1))  # type: ignore[no-any-return]


def make_conv_net() -> nn.Module:
    return _declared(ConvNet(), _x(3, 8, 8))


class SparseEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, W, sparse=True)
        self.bag = nn.EmbeddingBag(VOCAB, W, mode="mean", sparse=True)
        self.head = nn.Linear(W, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids).mean(1) + self.bag(ids))  # type: ignore[no-any-return]


def make_sparse_embedding() -> nn.Module:
    return _declared(SparseEmbedding(), TensorSpec("ids", "INT64", (-1, 6)))


# --------------------------------------------------------------------------- meta, big


def make_on_meta() -> nn.Module:
    """Built on ``meta`` explicitly (``device="meta"``), whatever device the caller sets."""
    model = nn.Sequential(nn.Linear(W, W, device="meta"), nn.ReLU(), nn.Linear(W, 2, device="meta"))
    return _declared(model, _x(W))


def make_on_cpu() -> nn.Module:
    """Built on the CPU explicitly (``device="cpu"``), whatever device the caller sets."""
    model = nn.Sequential(nn.Linear(W, W, device="cpu"), nn.ReLU(), nn.Linear(W, 2, device="cpu"))
    return _declared(model, _x(W))


class BigTied(nn.Module):
    """About 3.3 billion bf16 parameters with a tied 128k x 4096 embedding and head, on meta."""

    def __init__(self, layers: int = 12, width: int = 4096, vocab: int = 128_000) -> None:
        super().__init__()
        kw = {"device": "meta", "dtype": torch.bfloat16}
        self.embed = nn.Embedding(vocab, width, **kw)  # type: ignore[arg-type]
        self.layers = nn.ModuleList(
            nn.Sequential(
                nn.Linear(width, 4 * width, bias=False, **kw),
                nn.Linear(4 * width, width, bias=False, **kw),
            )  # type: ignore[arg-type]
            for _ in range(layers)
        )
        self.head = nn.Linear(width, vocab, bias=False, **kw)  # type: ignore[arg-type]
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)  # type: ignore[no-any-return]


def make_big_tied() -> nn.Module:
    return _declared(BigTied(), TensorSpec("ids", "INT64", (-1, -1)))


def make_tiny_gpt_on_cpu() -> nn.Module:
    """TinyGPT with real weights on the CPU whatever the caller's default device, as a factory
    that loads a whole pickled model or a checkpoint into fresh modules makes it."""
    with torch.device("cpu"):
        model = TinyGPT()
    return _declared(model, TensorSpec("ids", "INT64", (-1, -1)))


# --------------------------------------------------------------------------- as libraries write


class _PatchEmbeddings(nn.Module):
    """A ViT's embeddings: patches by a strided convolution, a class token and positions (its
    own parameters, as transformers' ``ViTEmbeddings`` holds them)."""

    def __init__(self, patch: int = 4, tokens: int = 4) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, W, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, W))
        self.position = nn.Parameter(torch.randn(1, tokens + 1, W))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        h = self.proj(pixels).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls_token.expand(h.shape[0], -1, -1), h], 1)
        return h + self.position  # type: ignore[no-any-return]


class _VitLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(W)
        self.attn = nn.MultiheadAttention(W, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(W, 2 * W), nn.GELU(), nn.Linear(2 * W, W))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.norm(h)
        h = h + self.attn(x, x, x, need_weights=False)[0]
        return h + self.mlp(h)  # type: ignore[no-any-return]


class _VitEncoder(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layer = nn.ModuleList(_VitLayer() for _ in range(layers))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            h = layer(h)
        return h


class _VitModel(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.embeddings = _PatchEmbeddings()
        self.encoder = _VitEncoder(layers)
        self.layernorm = nn.LayerNorm(W)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        embedding_output = self.embeddings(pixels)
        sequence_output = self.encoder(embedding_output)  # embedding_output alive meanwhile
        return self.layernorm(sequence_output)  # type: ignore[no-any-return]


class Vit(nn.Module):
    """ViT as transformers nests it (``vit.embeddings``, ``vit.encoder.layer.N``, a classifier
    on the class token): the embeddings' output stays alive in ``ViTModel.forward`` while the
    encoder runs, so a copy a runner keeps for as long as its original is kept too long."""

    def __init__(self, layers: int = 4) -> None:
        super().__init__()
        self.vit = _VitModel(layers)
        self.classifier = nn.Linear(W, 10)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.vit(pixel_values)[:, 0])  # type: ignore[no-any-return]


def make_vit() -> nn.Module:
    return _declared(Vit(), TensorSpec("pixel_values", "FP32", (-1, 3, 8, 8)))


class _Rotary(nn.Module):
    """Rotary positions as Llama computes them: a table of inverse frequencies (a buffer)
    and, per forward, ``(cos, sin)`` handed to every layer as one tuple."""

    def __init__(self, dim: int = W // 2) -> None:
        super().__init__()
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), -1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _rotate(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, -1)
    return torch.cat((-b, a), -1)


class _DecoderLayer(nn.Module):
    def __init__(self, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.RMSNorm(W)
        self.qkv = nn.Linear(W, 3 * W, bias=False)
        self.o = nn.Linear(W, W, bias=False)
        self.mlp = nn.Sequential(nn.Linear(W, 2 * W), nn.SiLU(), nn.Linear(2 * W, W))

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, t, d = hidden_states.shape
        cos, sin = (e.unsqueeze(1) for e in position_embeddings)
        qkv = self.qkv(self.norm(hidden_states)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        q, k = q * cos + _rotate(q) * sin, k * cos + _rotate(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = hidden_states + self.o(y.transpose(1, 2).reshape(b, t, d))
        return h + self.mlp(h)  # type: ignore[no-any-return]


class RotaryDecoder(nn.Module):
    """Llama-shaped: rotary ``(cos, sin)`` passed to each layer by keyword, as one tuple
    (``position_embeddings=``), with the position ids; a head tied to the embedding."""

    def __init__(self, layers: int = 4) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, W)
        self.rotary_emb = _Rotary()
        self.layers = nn.ModuleList(_DecoderLayer() for _ in range(layers))
        self.norm = nn.RMSNorm(W)
        self.lm_head = nn.Linear(W, VOCAB, bias=False)
        self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        position_ids = torch.arange(input_ids.shape[1], device=h.device)[None]
        position_embeddings = self.rotary_emb(h, position_ids)
        for layer in self.layers:
            h = layer(h, position_embeddings=position_embeddings, position_ids=position_ids)
        return self.lm_head(self.norm(h))  # type: ignore[no-any-return]


def make_rotary_decoder() -> nn.Module:
    return _declared(RotaryDecoder(), TensorSpec("input_ids", "INT64", (-1, -1)))


class _CrossBlock(nn.Module):
    """A decoder block: causal self-attention, then cross-attention to the encoder's states."""

    def __init__(self) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(W, 2, batch_first=True)
        self.cross = nn.MultiheadAttention(W, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(W, 2 * W), nn.ReLU(), nn.Linear(2 * W, W))

    def forward(self, h: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        h = h + self.cross(h, memory, memory, need_weights=False)[0]
        return h + self.mlp(h)  # type: ignore[no-any-return]


class Seq2Seq(nn.Module):
    """T5-shaped encoder-decoder with cross-attention: ``forward(input_ids, attention_mask=None,
    decoder_input_ids=None)``, its inputs declared (input_ids, decoder_input_ids), so the second
    declared input is the forward's third parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Embedding(VOCAB, W)
        layer = nn.TransformerEncoderLayer(W, 2, 2 * W, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.decoder = nn.ModuleList(_CrossBlock() for _ in range(2))
        self.lm_head = nn.Linear(W, VOCAB, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if decoder_input_ids is None:
            raise ValueError("decoder_input_ids is required")
        memory = self.encoder(self.shared(input_ids))
        if attention_mask is not None:
            memory = memory * attention_mask[..., None]
        h = self.shared(decoder_input_ids)
        t = decoder_input_ids.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool, device=h.device).triu(1)
        for block in self.decoder:
            h = block(h, memory, mask)
        return self.lm_head(h)  # type: ignore[no-any-return]


def make_seq2seq() -> nn.Module:
    ids = TensorSpec("input_ids", "INT64", (-1, -1))
    return _declared(Seq2Seq(), ids, TensorSpec("decoder_input_ids", "INT64", (-1, -1)))


class LstmLM(nn.Module):
    """A word-level language model: an embedding, a two-layer LSTM without projections (the
    CPU runs it as one oneDNN operator per layer) and a head over every step."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, W)
        self.lstm = nn.LSTM(W, W, num_layers=2, batch_first=True)
        self.head = nn.Linear(W, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.emb(ids))
        return self.head(h)  # type: ignore[no-any-return]


def make_lstm_lm() -> nn.Module:
    return _declared(LstmLM(), TensorSpec("ids", "INT64", (-1, 5)))


class Normalized(nn.Module):
    """Top-level buffers that normalise the input (a mean, and a standard deviation not saved
    with the weights), weight-normed Linear and Conv1d layers, batch norm and a spectral-normed
    head: parametrized weights computed in each forward."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(W))
        self.register_buffer("std", torch.ones(W), persistent=False)
        self.a = nn.utils.parametrizations.weight_norm(nn.Linear(W, W))
        self.bn = nn.BatchNorm1d(W)
        self.b = nn.utils.parametrizations.weight_norm(nn.Conv1d(W, W, 3, padding=1))
        self.c = nn.utils.parametrizations.spectral_norm(nn.Linear(W, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.mean) / self.std
        h = self.bn(self.a(x).transpose(1, 2))
        return self.c(self.b(h).transpose(1, 2))  # type: ignore[no-any-return]


def make_normalized() -> nn.Module:
    return _declared(Normalized(), _x(6, W))


class _CachedAttention(nn.Module):
    """Attention with a static KV cache in buffers, written in place at the positions given
    (gpt-fast's ``KVCache``), and the causal mask handed in by the model."""

    def __init__(self, batch: int = 2, length: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(W, 3 * W)
        self.o = nn.Linear(W, W)
        shape = (batch, heads, length, W // heads)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        self.k_cache[:b, :, pos] = k
        self.v_cache[:b, :, pos] = v
        keys, values = self.k_cache[:b], self.v_cache[:b]
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, :, pos])
        return self.o(y.transpose(1, 2).reshape(b, t, d))  # type: ignore[no-any-return]


class _CachedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(W)
        self.attn = _CachedAttention()
        self.mlp = nn.Sequential(nn.Linear(W, 4 * W), nn.GELU(), nn.Linear(4 * W, W))

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln(x), pos, mask)
        return x + self.mlp(x)  # type: ignore[no-any-return]


class CachedGPT(nn.Module):
    """gpt-fast-shaped: a head tied to the token embedding, a static KV cache per layer, and a
    top-level causal mask (a buffer) handed to every layer."""

    def __init__(self, layers: int = 3) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, W)
        self.layers = nn.ModuleList(_CachedBlock() for _ in range(layers))
        self.norm = nn.LayerNorm(W)
        self.out = nn.Linear(W, VOCAB, bias=False)
        self.out.weight = self.wte.weight
        causal = torch.tril(torch.ones(16, 16, dtype=torch.bool)).view(1, 1, 16, 16)
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids)
        for layer in self.layers:
            x = layer(x, pos, self.causal)
        return self.out(self.norm(x))  # type: ignore[no-any-return]


def make_cached_gpt() -> nn.Module:
    return _declared(CachedGPT(), TensorSpec("ids", "INT64", (-1, -1)))


class _ConvBlock(nn.Module):
    def __init__(self, channels_in: int, channels_out: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, padding=1)
        self.norm1 = nn.GroupNorm(2, channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, padding=1)
        self.norm2 = nn.BatchNorm2d(channels_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.norm2(self.conv2(F.silu(self.norm1(self.conv1(x))))))


class UNet(nn.Module):
    """A U-Net: two levels down, transposed convolutions up, the skips concatenated by the
    model's own code (activations kept from the first stage for the last)."""

    def __init__(self) -> None:
        super().__init__()
        self.down1, self.down2 = _ConvBlock(3, 8), _ConvBlock(8, 16)
        self.mid = _ConvBlock(16, 16)
        self.up2, self.dec2 = nn.ConvTranspose2d(16, 16, 2, stride=2), _ConvBlock(32, 8)
        self.up1, self.dec1 = nn.ConvTranspose2d(8, 8, 2, stride=2), _ConvBlock(16, 8)
        self.out = nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1 = self.down1(x)
        s2 = self.down2(F.max_pool2d(s1, 2))
        m = self.mid(F.max_pool2d(s2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), s2], 1))
        return self.out(self.dec1(torch.cat([self.up1(d2), s1], 1)))  # type: ignore[no-any-return]


def make_unet() -> nn.Module:
    return _declared(UNet(), _x(3, 8, 8))


class _Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Linear(W, 2 * W), nn.Linear(2 * W, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))  # type: ignore[no-any-return]


class _MoE(nn.Module):
    """Top-2 gating over four experts, every expert run on every token and weighted (no
    shapes that depend on the routing)."""

    def __init__(self, experts: int = 4, k: int = 2) -> None:
        super().__init__()
        self.gate = nn.Linear(W, experts, bias=False)
        self.experts = nn.ModuleList(_Expert() for _ in range(experts))
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x)
        top, idx = logits.topk(self.k, -1)
        weights = torch.zeros_like(logits).scatter(-1, idx, F.softmax(top, -1))
        out = torch.stack([expert(x) for expert in self.experts], -1)
        return (out * weights.unsqueeze(-2)).sum(-1)


class MixtureOfExperts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(W, W)
        self.moe1, self.moe2 = _MoE(), _MoE()
        self.head = nn.Linear(W, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = h + self.moe1(h)
        return self.head(h + self.moe2(h))  # type: ignore[no-any-return]


def make_mixture_of_experts() -> nn.Module:
    return _declared(MixtureOfExperts(), _x(5, W))


# --------------------------------------------------------------------------- more real shapes


class _WhisperAttention(nn.Module):
    """Whisper's attention: separate q, k, v projections (k without a bias), self-attention
    (causal in the decoder) or cross-attention to the encoder's states."""

    def __init__(self, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = nn.Linear(W, W), nn.Linear(W, W, bias=False)
        self.v_proj, self.out_proj = nn.Linear(W, W), nn.Linear(W, W)

    def forward(
        self, x: torch.Tensor, states: torch.Tensor | None = None, causal: bool = False
    ) -> torch.Tensor:
        b, t, d = x.shape
        kv = x if states is None else states

        def heads(h: torch.Tensor) -> torch.Tensor:
            return h.view(b, h.shape[1], self.heads, -1).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(kv)), heads(self.v_proj(kv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, d))  # type: ignore[no-any-return]


class _WhisperLayer(nn.Module):
    def __init__(self, cross: bool) -> None:
        super().__init__()
        self.self_attn_layer_norm, self.self_attn = nn.LayerNorm(W), _WhisperAttention()
        self.encoder_attn = _WhisperAttention() if cross else None
        self.encoder_attn_layer_norm = nn.LayerNorm(W) if cross else None
        self.final_layer_norm = nn.LayerNorm(W)
        self.fc1, self.fc2 = nn.Linear(W, 4 * W), nn.Linear(4 * W, W)

    def forward(self, h: torch.Tensor, states: torch.Tensor | None = None) -> torch.Tensor:
        h = h + self.self_attn(self.self_attn_layer_norm(h), causal=states is not None)
        if self.encoder_attn is not None and self.encoder_attn_layer_norm is not None:
            h = h + self.encoder_attn(self.encoder_attn_layer_norm(h), states)
        return h + self.fc2(F.gelu(self.fc1(self.final_layer_norm(h))))  # type: ignore[no-any-return]


class _WhisperEncoder(nn.Module):
    """Two convolutions over the mel frames (the second strided), fixed positions added as the
    embedding's weight itself, then the layers."""

    def __init__(self, mels: int = 8, frames: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(mels, W, 3, padding=1)
        self.conv2 = nn.Conv1d(W, W, 3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(frames // 2, W)
        self.layers = nn.ModuleList(_WhisperLayer(cross=False) for _ in range(2))
        self.layer_norm = nn.LayerNorm(W)

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.conv2(F.gelu(self.conv1(input_features)))).permute(0, 2, 1)
        h = h + self.embed_positions.weight
        for layer in self.layers:
            h = layer(h)
        return self.layer_norm(h)  # type: ignore[no-any-return]


class _WhisperDecoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, W)
        self.embed_positions = nn.Embedding(32, W)
        self.layers = nn.ModuleList(_WhisperLayer(cross=True) for _ in range(2))
        self.layer_norm = nn.LayerNorm(W)

    def forward(self, input_ids: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.embed_tokens(input_ids) + self.embed_positions(pos)
        for layer in self.layers:
            h = layer(h, states)
        return self.layer_norm(h)  # type: ignore[no-any-return]


class _WhisperModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder, self.decoder = _WhisperEncoder(), _WhisperDecoder()

    def forward(
        self, input_features: torch.Tensor, decoder_input_ids: torch.Tensor
    ) -> torch.Tensor:
        return self.decoder(decoder_input_ids, self.encoder(input_features))  # type: ignore[no-any-return]


class Whisper(nn.Module):
    """Whisper-shaped, nested as transformers nests it (``model.encoder``, ``model.decoder``,
    ``proj_out`` tied to the decoder's token embedding): a convolutional front end over mel
    frames, an encoder, a decoder with cross-attention to the encoder's states."""

    def __init__(self) -> None:
        super().__init__()
        self.model = _WhisperModel()
        self.proj_out = nn.Linear(W, VOCAB, bias=False)
        self.proj_out.weight = self.model.decoder.embed_tokens.weight

    def forward(
        self, input_features: torch.Tensor, decoder_input_ids: torch.Tensor
    ) -> torch.Tensor:
        return self.proj_out(self.model(input_features, decoder_input_ids))  # type: ignore[no-any-return]


def make_whisper() -> nn.Module:
    features = TensorSpec("input_features", "FP32", (-1, 8, 16))
    return _declared(Whisper(), features, TensorSpec("decoder_input_ids", "INT64", (-1, -1)))


class Detr(nn.Module):
    """DETR-shaped: a CNN backbone (``nn.Sequential`` with ReLUs between its weighted layers),
    a 1x1 projection, sine-free learned row and column positions (top-level parameters), an
    ``nn.Transformer``, learned object queries used as the embedding's weight itself, and a
    dict of class logits and boxes."""

    def __init__(self, queries: int = 6) -> None:
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, W, 3, stride=2, padding=1),
            nn.BatchNorm2d(W),
            nn.ReLU(),
        )
        self.input_projection = nn.Conv2d(W, W, 1)
        self.query_position_embeddings = nn.Embedding(queries, W)
        self.row_embed = nn.Parameter(torch.rand(8, W // 2))
        self.col_embed = nn.Parameter(torch.rand(8, W // 2))
        self.transformer = nn.Transformer(W, 2, 1, 1, 2 * W, dropout=0.0, batch_first=True)
        self.class_labels_classifier = nn.Linear(W, 5)
        self.bbox_predictor = nn.Sequential(nn.Linear(W, W), nn.ReLU(), nn.Linear(W, 4))

    def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
        f = self.input_projection(self.backbone(pixel_values))
        b, _, h, w = f.shape
        cols = self.col_embed[:w].unsqueeze(0).repeat(h, 1, 1)
        rows = self.row_embed[:h].unsqueeze(1).repeat(1, w, 1)
        pos = torch.cat([cols, rows], -1).flatten(0, 1).unsqueeze(0)
        queries = self.query_position_embeddings.weight.unsqueeze(0).repeat(b, 1, 1)
        hs = self.transformer(f.flatten(2).permute(0, 2, 1) + pos, queries)
        boxes = self.bbox_predictor(hs).sigmoid()
        return {"logits": self.class_labels_classifier(hs), "pred_boxes": boxes}


def make_detr() -> nn.Module:
    return _declared(Detr(), TensorSpec("pixel_values", "FP32", (-1, 3, 16, 16)))


class _Tower(nn.Module):
    """One CLIP tower: an input projection, encoder layers iterated from an ``nn.ModuleList``
    by the tower's own code, a final norm on the first token."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.embed = nn.Linear(features, W)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(W, 2, 2 * W, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(2)
        )
        self.post = nn.LayerNorm(W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.post(h[:, 0])  # type: ignore[no-any-return]


@dataclass
class ClipOutput:
    logits_per_image: torch.Tensor
    logits_per_text: torch.Tensor
    text_embeds: torch.Tensor
    image_embeds: torch.Tensor


class Clip(nn.Module):
    """CLIP-shaped: a text tower and a vision tower, their projections, a top-level
    ``logit_scale`` parameter, and a dataclass of both logits (one the other's transpose) and
    the normalised embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(VOCAB, 8)
        self.text_model, self.vision_model = _Tower(8), _Tower(12)
        self.visual_projection = nn.Linear(W, W, bias=False)
        self.text_projection = nn.Linear(W, W, bias=False)
        self.logit_scale = nn.Parameter(torch.tensor(2.6592))

    def forward(self, input_ids: torch.Tensor, pixel_values: torch.Tensor) -> ClipOutput:
        text = self.text_projection(self.text_model(self.token_embedding(input_ids)))
        image = self.visual_projection(self.vision_model(pixel_values))
        text = text / text.norm(dim=-1, keepdim=True)
        image = image / image.norm(dim=-1, keepdim=True)
        logits = text @ image.t() * self.logit_scale.exp()
        return ClipOutput(logits.t(), logits, text, image)


def make_clip() -> nn.Module:
    ids = TensorSpec("input_ids", "INT64", (-1, 6))
    return _declared(Clip(), ids, TensorSpec("pixel_values", "FP32", (-1, 5, 12)))


class SelfAttentionStack(nn.Module):
    """``nn.MultiheadAttention`` self-attention layers called as ``attn(h, h, h)`` (its fast
    path): its forward reads ``out_proj``'s weight and bias itself, never calling it."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Linear(8, W)
        self.attn = nn.ModuleList(nn.MultiheadAttention(W, 2, batch_first=True) for _ in range(3))
        self.norms = nn.ModuleList(nn.LayerNorm(W) for _ in range(3))
        self.head = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for attn, norm in zip(self.attn, self.norms, strict=True):
            h = norm(h + attn(h, h, h, need_weights=False)[0])
        return self.head(h)  # type: ignore[no-any-return]


def make_self_attention_stack() -> nn.Module:
    return _declared(SelfAttentionStack(), _x(6, 8))


class Dlrm(nn.Module):
    """DLRM-shaped: a bottom MLP over dense features, ``nn.EmbeddingBag`` tables (one big) over
    the sparse ids, each handed its column of the ids by the model's code, pairwise dot
    products of the embeddings, and a top MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(4, W), nn.ReLU(), nn.Linear(W, W))
        self.tables = nn.ModuleList(
            [
                nn.EmbeddingBag(2000, W, mode="sum"),
                nn.EmbeddingBag(100, W, mode="mean"),
                nn.EmbeddingBag(VOCAB, W, mode="max"),
            ]
        )
        self.top = nn.Sequential(nn.Linear(W + 6, W), nn.ReLU(), nn.Linear(W, 1))

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        embedded = [table(sparse[:, i]) for i, table in enumerate(self.tables)]
        z = torch.stack([x, *embedded], 1)
        i, j = torch.triu_indices(4, 4, 1, device=z.device)
        pairs = torch.bmm(z, z.transpose(1, 2))[:, i, j]
        return torch.sigmoid(self.top(torch.cat([x, pairs], 1)))


def make_dlrm() -> nn.Module:
    dense = TensorSpec("dense", "FP32", (-1, 4))
    return _declared(Dlrm(), dense, TensorSpec("sparse", "INT64", (-1, 3, 5)))


class _GraphConv(nn.Module):
    """Message passing as PyTorch Geometric writes it: messages gathered from the source
    nodes (``index_select``), summed into the destinations (``index_add_``), each divided by
    its in-degree (``scatter_add_``); the edges cut from ``edge_index`` by the layer's code."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.root = nn.Linear(W, W), nn.Linear(W, W)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        src, dst = edge_index[0], edge_index[1]
        messages = self.lin(x).index_select(0, src)
        summed = torch.zeros_like(x).index_add_(0, dst, messages)
        ones = torch.ones_like(dst, dtype=x.dtype)
        degree = torch.zeros(x.shape[0], device=x.device, dtype=x.dtype).scatter_add_(0, dst, ones)
        return F.relu(self.root(x) + summed / degree.clamp(min=1)[:, None])


class Gnn(nn.Module):
    """A graph network over ``x`` (nodes, the batch) and ``edges`` (one per node, as pairs):
    the model's code takes ``edges.t()`` as the ``edge_index`` every layer is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(8, W)
        self.convs = nn.ModuleList(_GraphConv() for _ in range(3))
        self.out = nn.Linear(W, 3)

    def forward(self, x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        edge_index = edges.t()
        h = self.enc(x)
        for conv in self.convs:
            h = conv(h, edge_index)
        return self.out(h)  # type: ignore[no-any-return]


def make_gnn() -> nn.Module:
    return _declared(Gnn(), _x(8), TensorSpec("edges", "INT64", (-1, 2)))


class _BertEmbeddings(nn.Module):
    """BERT's embeddings: words, token types and positions, the position ids and default token
    types registered as buffers (not saved), sliced to the sequence."""

    position_ids: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, W)
        self.position_embeddings = nn.Embedding(64, W)
        self.token_type_embeddings = nn.Embedding(2, W)
        self.LayerNorm = nn.LayerNorm(W)
        self.register_buffer("position_ids", torch.arange(64).expand((1, -1)), persistent=False)
        types = torch.zeros(1, 64, dtype=torch.long)
        self.register_buffer("token_type_ids", types, persistent=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = self.position_ids[:, : input_ids.shape[1]]
        e = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(e + self.position_embeddings(positions))  # type: ignore[no-any-return]


class _BertLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(W, 2, batch_first=True)
        self.ln1, self.ln2 = nn.LayerNorm(W), nn.LayerNorm(W)
        self.intermediate, self.output = nn.Linear(W, 4 * W), nn.Linear(4 * W, W)

    def forward(self, h: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        a = self.attention(h, h, h, key_padding_mask=padding, need_weights=False)[0]
        h = self.ln1(h + a)
        return self.ln2(h + self.output(F.gelu(self.intermediate(h))))  # type: ignore[no-any-return]


class _BertModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embeddings = _BertEmbeddings()
        self.encoder = nn.ModuleList(_BertLayer() for _ in range(3))
        self.pooler = nn.Sequential(nn.Linear(W, W), nn.Tanh())

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.embeddings(input_ids, token_type_ids)
        padding = attention_mask == 0
        for layer in self.encoder:
            h = layer(h, padding)
        return h, self.pooler(h[:, 0])


class _MlmHead(nn.Module):
    """The MLM head: a transform, then a decoder whose bias is the head's own parameter and
    whose weight is tied to the word embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.transform = nn.Sequential(nn.Linear(W, W), nn.GELU(), nn.LayerNorm(W))
        self.decoder = nn.Linear(W, VOCAB, bias=False)
        self.bias = nn.Parameter(torch.zeros(VOCAB))
        self.decoder.bias = self.bias

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(h))  # type: ignore[no-any-return]


class BertMLM(nn.Module):
    """BERT for masked language modelling, as transformers nests it: token types, a pooler, a
    padding mask handed to every layer and an MLM head tied to the word embeddings; returns
    the logits and the pooled output."""

    def __init__(self) -> None:
        super().__init__()
        self.bert = _BertModel()
        self.cls = _MlmHead()
        self.cls.decoder.weight = self.bert.embeddings.word_embeddings.weight

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h, pooled = self.bert(input_ids, attention_mask, token_type_ids)
        return self.cls(h), pooled


def make_bert() -> nn.Module:
    ids, mask = (
        TensorSpec("input_ids", "INT64", (-1, 8)),
        TensorSpec("attention_mask", "INT64", (-1, 8)),
    )
    return _declared(BertMLM(), ids, mask, TensorSpec("token_type_ids", "INT64", (-1, 8)))


class _WindowAttention(nn.Module):
    """Swin's window attention: a relative position bias table (a parameter) indexed by a
    registered index buffer, added to the scores of each window."""

    relative_position_index: torch.Tensor

    def __init__(self, window: int = 4, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, heads))
        grid = torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
        flat = torch.stack(grid).flatten(1)
        rel = (flat[:, :, None] - flat[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer(
            "relative_position_index", rel[..., 0] * (2 * window - 1) + rel[..., 1]
        )
        self.qkv, self.proj = nn.Linear(W, 3 * W), nn.Linear(W, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        scores = (q * (c // self.heads) ** -0.5) @ k.transpose(-2, -1)
        index = self.relative_position_index.view(-1)
        bias = self.relative_position_bias_table[index].view(n, n, -1).permute(2, 0, 1)
        attn = (scores + bias.unsqueeze(0)).softmax(-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))  # type: ignore[no-any-return]


class _SwinBlock(nn.Module):
    def __init__(self, shift: int, window: int = 4) -> None:
        super().__init__()
        self.shift, self.window = shift, window
        self.norm1, self.attn = nn.LayerNorm(W), _WindowAttention(window)
        self.norm2 = nn.LayerNorm(W)
        self.mlp = nn.Sequential(nn.Linear(W, 2 * W), nn.GELU(), nn.Linear(2 * W, W))

    def forward(self, x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        (h, w), s = size, self.window
        b, _, c = x.shape
        y = torch.roll(self.norm1(x).view(b, h, w, c), (-self.shift, -self.shift), (1, 2))
        y = y.view(b, h // s, s, w // s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, s * s, c)
        y = self.attn(y).view(b, h // s, w // s, s, s, c).permute(0, 1, 3, 2, 4, 5)
        y = torch.roll(y.reshape(b, h, w, c), (self.shift, self.shift), (1, 2))
        x = x + y.reshape(b, h * w, c)
        return x + self.mlp(self.norm2(x))  # type: ignore[no-any-return]


class Swin(nn.Module):
    """Swin-shaped: patches, windowed blocks (shifted every other one) with relative position
    bias tables and index buffers, a mean-pooled head."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, W, 2, stride=2)
        self.blocks = nn.ModuleList(_SwinBlock(shift) for shift in (0, 2, 0, 2))
        self.norm, self.head = nn.LayerNorm(W), nn.Linear(W, 10)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixels)
        size = (x.shape[2], x.shape[3])
        x = x.flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = block(x, size)
        return self.head(self.norm(x).mean(1))  # type: ignore[no-any-return]


def make_swin() -> nn.Module:
    return _declared(Swin(), _x(3, 16, 16))


class _ScanBlock(nn.Module):
    """A Mamba-like selective state-space block, its scan a Python loop over the steps."""

    def __init__(self, state: int = 4) -> None:
        super().__init__()
        self.state = state
        self.norm, self.in_proj = nn.RMSNorm(W), nn.Linear(W, 2 * W)
        self.conv1d = nn.Conv1d(W, W, 3, groups=W, padding=2)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, state + 1).float()).repeat(W, 1))
        self.D = nn.Parameter(torch.ones(W))
        self.x_proj, self.dt_proj = nn.Linear(W, 2 * state + 1), nn.Linear(1, W)
        self.out_proj = nn.Linear(W, W)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape
        x, z = self.in_proj(self.norm(h)).chunk(2, -1)
        x = F.silu(self.conv1d(x.transpose(1, 2))[..., :t].transpose(1, 2))
        dt, B, C = self.x_proj(x).split([1, self.state, self.state], -1)
        dt = F.softplus(self.dt_proj(dt))
        A = -torch.exp(self.A_log)
        s = torch.zeros(b, d, self.state, device=h.device, dtype=h.dtype)
        steps = []
        for i in range(t):
            s = (
                torch.exp(dt[:, i, :, None] * A) * s
                + dt[:, i, :, None] * B[:, i, None] * x[:, i, :, None]
            )
            steps.append((s @ C[:, i, :, None]).squeeze(-1))
        y = torch.stack(steps, 1) + x * self.D
        return h + self.out_proj(y * F.silu(z))  # type: ignore[no-any-return]


class Mamba(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, W)
        self.layers = nn.ModuleList(_ScanBlock() for _ in range(3))
        self.norm_f = nn.RMSNorm(W)
        self.lm_head = nn.Linear(W, VOCAB, bias=False)
        self.lm_head.weight = self.embedding.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embedding(input_ids)
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(self.norm_f(h))  # type: ignore[no-any-return]


def make_mamba() -> nn.Module:
    return _declared(Mamba(), TensorSpec("input_ids", "INT64", (-1, 6)))


class Checkpointed(nn.Module):
    """Blocks run through ``torch.utils.checkpoint`` (non-reentrant), as training code leaves
    them when the model is served."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(W, W)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(W, 4 * W), nn.GELU(), nn.Linear(4 * W, W)) for _ in range(3)
        )
        self.out = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + checkpoint(block, h, use_reentrant=False)
        return self.out(h)  # type: ignore[no-any-return]


def make_checkpointed() -> nn.Module:
    return _declared(Checkpointed(), _x(5, W))


class _Int8Linear(nn.Module):
    """Weight-only int8: an int8 weight and per-row scales (buffers), dequantised in forward."""

    weight: torch.Tensor
    scales: torch.Tensor

    def __init__(self, features_in: int, features_out: int) -> None:
        super().__init__()
        weight = torch.randint(-127, 127, (features_out, features_in), dtype=torch.int8)
        self.register_buffer("weight", weight)
        self.register_buffer("scales", torch.rand(features_out))
        self.bias = nn.Parameter(torch.zeros(features_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype) * self.scales[:, None], self.bias)


class Int8MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        sizes = [(W, 4 * W), (4 * W, 4 * W), (4 * W, W)]
        self.layers = nn.ModuleList(_Int8Linear(i, o) for i, o in sizes)
        self.head = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)  # type: ignore[no-any-return]


def make_int8() -> nn.Module:
    return _declared(Int8MLP(), _x(W))


class MultiTask(nn.Module):
    """A trunk and heads in an ``nn.ModuleDict``, a dict returned, and a layer kept in a plain
    Python list (not registered: neither counted nor placed)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(W, 2 * W), nn.ReLU(), nn.Linear(2 * W, W))
        heads = {"cls": nn.Linear(W, 5), "reg": nn.Linear(W, 1), "emb": nn.Linear(W, 8)}
        self.heads = nn.ModuleDict(heads)
        self.unused = [nn.Linear(W, W)]

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.trunk(x)
        return {name: head(h) for name, head in self.heads.items()}


def make_multi_task() -> nn.Module:
    return _declared(MultiTask(), _x(W))


# ---------------------------------------------------------------- round four: other mechanisms


class _LoraLinear(nn.Module):
    """peft-style LoRA: the frozen base layer and adapters in ``ModuleDict``s keyed by name."""

    def __init__(self, base: nn.Linear, rank: int = 4) -> None:
        super().__init__()
        self.base_layer = base.requires_grad_(False)
        self.lora_A = nn.ModuleDict({"default": nn.Linear(base.in_features, rank, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(rank, base.out_features, bias=False)})
        self.lora_dropout = nn.ModuleDict({"default": nn.Dropout(0.1)})
        self.scaling = {"default": 2.0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low = self.lora_A["default"](self.lora_dropout["default"](x))
        return self.base_layer(x) + self.lora_B["default"](low) * self.scaling["default"]  # type: ignore[no-any-return]


class Lora(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        sizes = [(W, 4 * W), (4 * W, W)] * 2
        self.layers = nn.ModuleList(_LoraLinear(nn.Linear(i, o)) for i, o in sizes)
        self.head = nn.Linear(W, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = F.gelu(layer(x)) if i % 2 == 0 else layer(x)
        return self.head(x)  # type: ignore[no-any-return]


def make_lora() -> nn.Module:
    return _declared(Lora(), _x(4, W))


class _GroupedAttention(nn.Module):
    """Grouped-query attention: K/V heads repeated with ``repeat_interleave``, rotary positions
    applied, ``scaled_dot_product_attention`` given a boolean mask."""

    def __init__(self, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, W // heads
        self.q = nn.Linear(W, W, bias=False)
        self.kv = nn.Linear(W, 2 * kv_heads * self.dim, bias=False)
        self.o = nn.Linear(W, W, bias=False)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor
    ) -> torch.Tensor:
        b, t, _ = x.shape
        cos, sin = rope
        q = self.q(x).view(b, t, self.heads, self.dim).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.kv_heads, self.dim).permute(2, 0, 3, 1, 4)
        q, k = (u * cos + torch.cat((-u[..., 2:], u[..., :2]), -1) * sin for u in (q, k))
        k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
        v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o(y.transpose(1, 2).reshape(b, t, W))  # type: ignore[no-any-return]


class _RMSNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(W))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = x.float()
        return (up * torch.rsqrt(up.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.weight


class _GroupedBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2 = _RMSNorm(), _GroupedAttention(), _RMSNorm()
        self.mlp = nn.Sequential(nn.Linear(W, 3 * W), nn.SiLU(), nn.Linear(3 * W, W))

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope, mask)
        return x + self.mlp(self.norm2(x))  # type: ignore[no-any-return]


class GroupedQuery(nn.Module):
    """A Llama-3-like decoder: rotary tables computed in forward from a non-persistent
    ``inv_freq`` buffer under ``torch.autocast(x.device.type, enabled=False)``, a causal mask
    combined with a padding mask given as an input."""

    inv_freq: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, W)
        self.register_buffer(
            "inv_freq", 1.0 / 10000 ** (torch.arange(0, 4, 2) / 4), persistent=False
        )
        self.layers = nn.ModuleList(_GroupedBlock() for _ in range(3))
        self.norm = _RMSNorm()
        self.head = nn.Linear(W, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        x = self.embed(input_ids)
        # as transformers' rotary embeddings: float32 tables, autocast off for the device
        with torch.autocast(device_type=x.device.type, enabled=False):
            positions = torch.arange(t, device=x.device, dtype=torch.float32)
            freqs = torch.outer(positions, self.inv_freq.float())
            angles = torch.cat((freqs, freqs), -1)
            rope = (angles.cos(), angles.sin())
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        mask = causal[None, None] & attention_mask[:, None, None, :].bool()
        for layer in self.layers:
            x = layer(x, rope, mask)
        return self.head(self.norm(x))  # type: ignore[no-any-return]


def make_grouped_query() -> nn.Module:
    ids = TensorSpec("input_ids", "INT64", (-1, -1))
    return _declared(GroupedQuery(), ids, TensorSpec("attention_mask", "INT64", (-1, -1)))


class _Scaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x * scale

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class _SpectralConv(nn.Module):
    """FNO-style: complex weights applied to the lowest modes of an ``rfft``."""

    def __init__(self, channels: int, modes: int) -> None:
        super().__init__()
        self.modes = modes
        self.weight = nn.Parameter(torch.randn(channels, channels, modes, dtype=torch.cfloat))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spectrum = torch.fft.rfft(x)
        shape = (x.shape[0], x.shape[1], x.shape[-1] // 2 + 1)
        out = torch.zeros(shape, dtype=torch.cfloat, device=x.device)
        low = spectrum[:, :, : self.modes]
        out[:, :, : self.modes] = torch.einsum("bix,iox->box", low, self.weight)
        return torch.fft.irfft(out, n=x.shape[-1])


class Spectral(nn.Module):
    """FNet's Fourier mixing (``fft2(x).real``) and FNO's complex spectral convolutions, with a
    custom ``torch.autograd.Function`` between them."""

    def __init__(self) -> None:
        super().__init__()
        self.lift = nn.Linear(W, W)
        self.mix_norm = nn.LayerNorm(W)
        self.spectral = nn.ModuleList(_SpectralConv(8, 4) for _ in range(2))
        self.pointwise = nn.ModuleList(nn.Conv1d(8, 8, 1) for _ in range(2))
        self.head = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lift(x)
        h = self.mix_norm(h + torch.fft.fft2(h).real)
        h = _Scaled.apply(h, 0.5)
        for spectral, pointwise in zip(self.spectral, self.pointwise, strict=True):
            h = F.gelu(spectral(h) + pointwise(h))
        return self.head(h.mean(1))  # type: ignore[no-any-return]


def make_spectral() -> nn.Module:
    return _declared(Spectral(), _x(8, W))


class _LayerNorm2d(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _SqueezeExcite(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(channels, channels // 4, 1)
        self.expand = nn.Conv2d(channels // 4, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.expand(F.silu(self.reduce(x.mean((2, 3), keepdim=True))))
        return x * torch.sigmoid(scale)


class _StochasticDepth(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        keep = torch.empty(x.shape[0], 1, 1, 1, device=x.device).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class _ConvNeXtBlock(nn.Module):
    def __init__(self, channels: int, drop: float) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)
        self.norm = _LayerNorm2d(channels)
        self.pwconv1 = nn.Conv2d(channels, 4 * channels, 1)
        self.pwconv2 = nn.Conv2d(4 * channels, channels, 1)
        self.se = _SqueezeExcite(channels)
        self.gamma = nn.Parameter(torch.full((channels, 1, 1), 1e-6))
        self.drop_path = _StochasticDepth(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(self.dwconv(x)))))
        return x + self.drop_path(self.gamma * self.se(y))  # type: ignore[no-any-return]


class ConvNeXt(nn.Module):
    """ConvNeXt/EfficientNet-style: depthwise convolutions, squeeze-excitation, a layer scale,
    stochastic depth, channels-last weights and input."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 4, stride=4), _LayerNorm2d(8))
        down = nn.Sequential(_LayerNorm2d(8), nn.Conv2d(8, 16, 2, stride=2))
        blocks = [_ConvNeXtBlock(8, 0.0), _ConvNeXtBlock(8, 0.1), down, _ConvNeXtBlock(16, 0.2)]
        self.stages = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(16), nn.Linear(16, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        return self.head(self.stages(self.stem(x)))  # type: ignore[no-any-return]


def make_convnext() -> nn.Module:
    return _declared(ConvNeXt().to(memory_format=torch.channels_last), _x(3, 32, 32))


class BFloat16Mixed(nn.Module):
    """bfloat16 weights, float32 norms, ``.float()`` upcasts in forward, float32 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, W).to(torch.bfloat16)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(W, 4 * W), nn.GELU(), nn.Linear(4 * W, W)).to(torch.bfloat16)
            for _ in range(2)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(W) for _ in range(2))
        self.head = nn.Linear(W, VOCAB).to(torch.bfloat16)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block, norm in zip(self.blocks, self.norms, strict=True):
            x = x + block(norm(x.float()).to(torch.bfloat16))
        return self.head(x).float()  # type: ignore[no-any-return]


def make_bfloat16_mixed() -> nn.Module:
    return _declared(BFloat16Mixed(), TensorSpec("input_ids", "INT64", (-1, -1)))


class ShapeBranches(nn.Module):
    """Python control flow on the input's shape (not its values), and a tuple with None."""

    def __init__(self) -> None:
        super().__init__()
        self.short = nn.Linear(W, W)
        self.long = nn.Sequential(nn.Linear(W, 4 * W), nn.ReLU(), nn.Linear(4 * W, W))
        self.head = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None, tuple[torch.Tensor, None]]:
        h = self.long(x) if x.shape[0] > 4 else self.short(x)
        return self.head(h.mean(1)), None, (h, None)


def make_shape_branches() -> nn.Module:
    return _declared(ShapeBranches(), _x(4, W))


class _Decoder(nn.Module):
    """Reads the encoder's weight, transposed, without tying it (kept out of its registered
    modules, in a plain list, as some autoencoders do)."""

    def __init__(self, encoder: nn.Linear) -> None:
        super().__init__()
        self.encoder = [encoder]
        self.bias = nn.Parameter(torch.zeros(encoder.in_features))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.encoder[0].weight.t(), self.bias)


class TransposedShare(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(W, 4 * W)
        self.middle = nn.Linear(4 * W, 4 * W)
        self.decoder = _Decoder(self.encoder)
        self.register_buffer("scale", torch.ones(4 * W), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.middle(F.relu(self.encoder(x)) * self.scale))
        return self.decoder(h)  # type: ignore[no-any-return]


def make_transposed_share() -> nn.Module:
    return _declared(TransposedShare(), _x(W))


class Orthogonal(nn.Module):
    """``parametrizations.orthogonal``, whose initialiser reads values (it cannot run on
    ``meta``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = parametrizations.orthogonal(nn.Linear(W, W))
        self.b = parametrizations.orthogonal(nn.Linear(W, W))
        self.head = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x)))))  # type: ignore[no-any-return]


def make_orthogonal() -> nn.Module:
    return _declared(Orthogonal(), _x(W))


class Translation(nn.Module):
    """``nn.Transformer`` with a causal target mask and padding masks for the source, as
    PyTorch's translation tutorial writes it; ``pad`` is the id taken as padding (one no
    input holds: every sequence full length, the mask left-aligned)."""

    def __init__(self, pad: int = 0) -> None:
        super().__init__()
        self.pad = pad
        self.src_embed, self.tgt_embed = nn.Embedding(VOCAB, W), nn.Embedding(VOCAB, W)
        self.transformer = nn.Transformer(W, 2, 2, 2, 32, dropout=0.1, batch_first=True)
        self.generator = nn.Linear(W, VOCAB)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        t = tgt.shape[1]
        tgt_mask = nn.Transformer.generate_square_subsequent_mask(t, device=tgt.device)
        padding = src == self.pad
        h = self.transformer(
            self.src_embed(src),
            self.tgt_embed(tgt),
            tgt_mask=tgt_mask,
            src_key_padding_mask=padding,
            memory_key_padding_mask=padding,
            tgt_is_causal=True,
        )
        return self.generator(h)  # type: ignore[no-any-return]


def _translation(pad: int) -> nn.Module:
    src, tgt = (TensorSpec(name, "INT64", (-1, -1)) for name in ("src", "tgt"))
    return _declared(Translation(pad), src, tgt)


def make_translation() -> nn.Module:
    return _translation(0)


def make_translation_unpadded() -> nn.Module:
    return _translation(-1)


class Packed(nn.Module):
    """A GRU over a ``PackedSequence``: ``pack_padded_sequence`` needs the lengths on the CPU
    and reads them (the batch sizes of each step are their values)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, W)
        self.rnn = nn.GRU(W, W, num_layers=2, batch_first=True)
        self.head = nn.Linear(W, 3)

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(
            self.embed(input_ids), lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        _, h = self.rnn(packed)
        return self.head(h[-1])  # type: ignore[no-any-return]


def make_packed() -> nn.Module:
    ids = TensorSpec("input_ids", "INT64", (-1, 6))
    return _declared(Packed(), ids, TensorSpec("lengths", "INT64", (-1,)))


class LayerScales(nn.Module):
    """Per-layer scales in an ``nn.ParameterList`` and gains in an ``nn.ParameterDict``, each
    read beside the layer it goes with (CaiT's and ConvNeXt's layer scales kept apart)."""

    def __init__(self) -> None:
        super().__init__()
        self.scales = nn.ParameterList(nn.Parameter(torch.ones(4 * W)) for _ in range(3))
        gains = {"first": nn.Parameter(torch.ones(4 * W)), "last": nn.Parameter(torch.ones(4 * W))}
        self.gains = nn.ParameterDict(gains)
        self.inp = nn.Linear(W, 4 * W)
        self.layers = nn.ModuleList(nn.Linear(4 * W, 4 * W) for _ in range(3))
        self.out = nn.Linear(4 * W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x) * self.gains["first"]
        for scale, layer in zip(self.scales, self.layers, strict=True):
            h = F.relu(layer(h)) * scale
        return self.out(h * self.gains["last"])  # type: ignore[no-any-return]


def make_layer_scales() -> nn.Module:
    return _declared(LayerScales(), _x(W))


class _Float8Linear(nn.Module):
    """A float8 weight and its scales, buffers (as fp8 checkpoints store them), dequantised to
    bfloat16 in forward."""

    weight: torch.Tensor
    scale: torch.Tensor

    def __init__(self, features: int) -> None:
        super().__init__()
        weight = torch.randn(features, features).to(torch.float8_e4m3fn)
        self.register_buffer("weight", weight)
        self.register_buffer("scale", torch.ones(features, 1, dtype=torch.bfloat16))
        self.bias = nn.Parameter(torch.zeros(features, dtype=torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(torch.bfloat16) * self.scale, self.bias)


class _TupleLayer(nn.Module):
    """Returns ``(hidden, None, None)``, as transformers' layers return attentions and cache."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = _Float8Linear(4 * W)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return h + self.fc(h), None, None


class Float8(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(W, 4 * W).to(torch.bfloat16)
        self.layers = nn.ModuleList(_TupleLayer() for _ in range(3))
        self.out = nn.Linear(4 * W, 2).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x.to(torch.bfloat16))
        for layer in self.layers:
            h = layer(h)[0]
        return self.out(h).float()  # type: ignore[no-any-return]


def make_float8() -> nn.Module:
    return _declared(Float8(), _x(W))


class CachedOrthogonal(nn.Module):
    """An orthogonal layer called twice under ``parametrize.cached()`` (its weight computed
    once, kept in the cache), around a plain one."""

    def __init__(self) -> None:
        super().__init__()
        self.a = parametrizations.orthogonal(nn.Linear(W, W))
        self.b = nn.Linear(W, W)
        self.head = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with parametrize.cached():
            h = torch.tanh(self.a(x))
            h = torch.tanh(self.a(self.b(h)))
        return self.head(h)  # type: ignore[no-any-return]


def make_cached_orthogonal() -> nn.Module:
    return _declared(CachedOrthogonal(), _x(W))


# ------------------------------------------------------------------ round five: models users feed


class _Bahdanau(nn.Module):
    """Additive attention over the encoder's states, as PyTorch's seq2seq tutorial writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Linear(2 * W, W)
        self.v = nn.Linear(W, 1, bias=False)

    def forward(self, hidden: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        query = hidden.unsqueeze(1).expand(-1, states.shape[1], -1)
        scores = self.v(torch.tanh(self.w(torch.cat([query, states], -1)))).squeeze(-1)
        return torch.bmm(torch.softmax(scores, -1).unsqueeze(1), states).squeeze(1)


class AttentionSeq2Seq(nn.Module):
    """A GRU encoder and a ``GRUCell`` decoder with additive attention, stepped in Python with
    teacher forcing (``random.random() < ratio``, 1.0 here: the target token is fed)."""

    def __init__(self, teacher_forcing: float = 1.0) -> None:
        super().__init__()
        self.teacher_forcing = teacher_forcing
        self.src_embed = nn.Embedding(VOCAB, W)
        self.encoder = nn.GRU(W, W, batch_first=True)
        self.tgt_embed = nn.Embedding(VOCAB, W)
        self.attention = _Bahdanau()
        self.cell = nn.GRUCell(2 * W, W)
        self.out = nn.Linear(2 * W, VOCAB)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        import random

        states, hidden = self.encoder(self.src_embed(src))
        h = hidden[0]
        token = tgt[:, 0]
        logits = []
        for t in range(tgt.shape[1]):
            context = self.attention(h, states)
            h = self.cell(torch.cat([self.tgt_embed(token), context], -1), h)
            step = self.out(torch.cat([h, context], -1))
            logits.append(step)
            teach = random.random() < self.teacher_forcing and t + 1 < tgt.shape[1]
            token = tgt[:, t + 1] if teach else step.argmax(-1)
        return torch.stack(logits, 1)


def make_attention_seq2seq() -> nn.Module:
    src, tgt = (TensorSpec(name, "INT64", (-1, -1)) for name in ("src", "tgt"))
    return _declared(AttentionSeq2Seq(), src, tgt)


class _MacaronFeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(W),
            nn.Linear(W, 4 * W),
            nn.SiLU(),
            nn.Dropout(0.1),
            nn.Linear(4 * W, W),
            nn.Dropout(0.1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.5 * self.net(x)


class _ConvModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(W)
        self.pointwise1 = nn.Conv1d(W, 2 * W, 1)
        self.depthwise = nn.Conv1d(W, W, 7, padding=3, groups=W)
        self.bn = nn.BatchNorm1d(W)
        self.pointwise2 = nn.Conv1d(W, W, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.glu(self.pointwise1(self.norm(x).transpose(1, 2)), dim=1)
        y = self.pointwise2(F.silu(self.bn(self.depthwise(y))))
        return x + y.transpose(1, 2)


class _ConformerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ff1 = _MacaronFeedForward()
        self.attn_norm = nn.LayerNorm(W)
        self.attn = nn.MultiheadAttention(W, 2, dropout=0.1, batch_first=True)
        self.conv = _ConvModule()
        self.ff2 = _MacaronFeedForward()
        self.norm = nn.LayerNorm(W)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        x = self.ff1(x)
        h = self.attn_norm(x)
        x = x + self.attn(h, h, h, key_padding_mask=padding, need_weights=False)[0]
        return self.norm(self.ff2(self.conv(x)))  # type: ignore[no-any-return]


class Conformer(nn.Module):
    """Conformer (speech): a strided convolutional subsampler, blocks of a macaron feed-forward
    pair around self-attention with a padding mask made from the lengths, and a convolution
    module (GLU, depthwise convolution, batch norm); CTC log-probabilities out."""

    def __init__(self) -> None:
        super().__init__()
        self.subsample = nn.Sequential(
            nn.Conv2d(1, 4, 3, stride=2), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2), nn.ReLU()
        )
        self.proj = nn.Linear(4 * 3, W)
        self.blocks = nn.ModuleList(_ConformerBlock() for _ in range(2))
        self.ctc = nn.Linear(W, VOCAB)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        h = self.subsample(features.unsqueeze(1))  # b, 4, t', 3
        b, c, t, f = h.shape
        x = self.proj(h.permute(0, 2, 1, 3).reshape(b, t, c * f))
        frames = torch.div(lengths - 3, 2, rounding_mode="floor") + 1
        frames = torch.div(frames - 3, 2, rounding_mode="floor") + 1
        padding = torch.arange(t, device=x.device)[None, :] >= frames[:, None]
        for block in self.blocks:
            x = block(x, padding)
        return F.log_softmax(self.ctc(x), -1)


def make_conformer() -> nn.Module:
    features = TensorSpec("features", "FP32", (-1, -1, 16))
    return _declared(Conformer(), features, TensorSpec("lengths", "INT64", (-1,)))


class _ConvBnAct(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))  # type: ignore[no-any-return]


class Detections(collections.namedtuple("Detections", ["boxes", "raw"])):
    """A NamedTuple output: decoded boxes of every scale, and the raw head outputs."""


class _DetectHead(nn.Module):
    """YOLOv5's Detect: a 1x1 convolution per scale, decoded with a grid made in forward and
    the anchors in a buffer, the scales concatenated."""

    anchors: torch.Tensor

    def __init__(self, channels: tuple[int, ...], classes: int = 3) -> None:
        super().__init__()
        self.outputs = 5 + classes
        self.strides = (8, 16, 32)
        self.convs = nn.ModuleList(nn.Conv2d(c, 2 * self.outputs, 1) for c in channels)
        self.register_buffer("anchors", torch.rand(len(channels), 2, 2) * 30)

    def forward(self, features: list[torch.Tensor]) -> Detections:
        boxes, raw = [], []
        for i, (conv, f) in enumerate(zip(self.convs, features, strict=True)):
            b, _, h, w = f.shape
            out = conv(f).view(b, 2, self.outputs, h, w).permute(0, 1, 3, 4, 2).contiguous()
            raw.append(out)
            ys, xs = torch.meshgrid(
                torch.arange(h, device=f.device), torch.arange(w, device=f.device), indexing="ij"
            )
            grid = torch.stack((xs, ys), 2).view(1, 1, h, w, 2).float()
            y = out.sigmoid()
            xy = (y[..., :2] * 2 - 0.5 + grid) * self.strides[i]
            wh = (y[..., 2:4] * 2) ** 2 * self.anchors[i].view(1, 2, 1, 1, 2)
            boxes.append(torch.cat((xy, wh, y[..., 4:]), -1).view(b, -1, self.outputs))
        return Detections(torch.cat(boxes, 1), raw)


class Yolo(nn.Module):
    """A YOLO-style detector: a strided backbone giving three scales, a top-down neck
    (upsample and concatenate), a detection head per scale, a NamedTuple returned."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(_ConvBnAct(3, 8, 2), _ConvBnAct(8, 8, 2), _ConvBnAct(8, 8, 2))
        self.p4 = _ConvBnAct(8, 16, 2)
        self.p5 = _ConvBnAct(16, 16, 2)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.fuse4 = _ConvBnAct(32, 16)
        self.fuse3 = _ConvBnAct(24, 8)
        self.detect = _DetectHead((8, 16, 16))

    def forward(self, images: torch.Tensor) -> Detections:
        p3 = self.stem(images)
        p4 = self.p4(p3)
        p5 = self.p5(p4)
        n4 = self.fuse4(torch.cat([self.up(p5), p4], 1))
        n3 = self.fuse3(torch.cat([self.up(n4), p3], 1))
        return self.detect([n3, n4, p5])  # type: ignore[no-any-return]


def make_yolo() -> nn.Module:
    return _declared(Yolo(), TensorSpec("images", "FP32", (-1, 3, 64, 64)))


class Vae(nn.Module):
    """A convolutional VAE: the reparameterisation draws ``torch.randn_like(std)`` in forward;
    the reconstruction, mean and log-variance returned."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(1, 8, 4, 2, 1), nn.ReLU(), nn.Conv2d(8, 16, 4, 2, 1), nn.ReLU(), nn.Flatten()
        )
        self.mu = nn.Linear(16 * 4 * 4, W)
        self.logvar = nn.Linear(16 * 4 * 4, W)
        self.expand = nn.Linear(W, 16 * 4 * 4)
        self.decoder = nn.Sequential(
            nn.ConvTranspose2d(16, 8, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(8, 1, 4, 2, 1)
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.encoder(x)
        mu, logvar = self.mu(h), self.logvar(h)
        std = torch.exp(0.5 * logvar)
        z = mu + torch.randn_like(std) * std
        recon = torch.sigmoid(self.decoder(self.expand(z).view(-1, 16, 4, 4)))
        return recon, mu, logvar


def make_vae() -> nn.Module:
    return _declared(Vae(), _x(1, 16, 16))


class _SqueezeExcitation(nn.Module):
    """torchvision's: pool, reduce, SiLU, expand, sigmoid, scale."""

    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeezed, 1)
        self.fc2 = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc2(F.silu(self.fc1(self.avgpool(x)))))


class _DropPath(nn.Module):
    """timm's drop path, whose mask ``torch.rand`` draws in forward (in training)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        keep = 1 - self.p
        mask = (keep + torch.rand((x.shape[0], 1, 1, 1), dtype=x.dtype, device=x.device)).floor()
        return x.div(keep) * mask


class _MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, drop: float) -> None:
        super().__init__()
        mid = 4 * cin
        self.block = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False),
            nn.BatchNorm2d(mid),
            nn.SiLU(inplace=True),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False),
            nn.BatchNorm2d(mid),
            nn.SiLU(inplace=True),
            _SqueezeExcitation(mid, max(1, cin // 4)),
            nn.Conv2d(mid, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.residual = stride == 1 and cin == cout
        self.drop = _DropPath(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + self.drop(y) if self.residual else y  # type: ignore[no-any-return]


class EfficientNet(nn.Module):
    """EfficientNet as torchvision builds it: MBConv blocks (expansion, depthwise convolution,
    squeeze-excitation, in-place SiLU, batch norm), drop path, a pooled classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.SiLU(True)),
            _MBConv(8, 8, 1, 0.0),
            _MBConv(8, 16, 2, 0.05),
            _MBConv(16, 16, 1, 0.1),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2, inplace=True), nn.Linear(16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))  # type: ignore[no-any-return]


def make_efficientnet() -> nn.Module:
    return _declared(EfficientNet(), _x(3, 32, 32))


def _rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Meta's Llama: pairs of features as complex numbers, rotated by ``freqs`` (complex)."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs).flatten(3).type_as(x)


class _RopeAttention(nn.Module):
    def __init__(self, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.wq, self.wk = nn.Linear(W, W, bias=False), nn.Linear(W, W, bias=False)
        self.wv, self.wo = nn.Linear(W, W, bias=False), nn.Linear(W, W, bias=False)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (m(x).view(b, t, self.heads, -1) for m in (self.wq, self.wk, self.wv))
        q, k = _rope(q, freqs), _rope(k, freqs)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))  # type: ignore[no-any-return]


class _RopeBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = _RMSNorm()
        self.attention = _RopeAttention()
        self.ffn_norm = _RMSNorm()
        self.w1, self.w2 = nn.Linear(W, 3 * W, bias=False), nn.Linear(3 * W, W, bias=False)
        self.w3 = nn.Linear(W, 3 * W, bias=False)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs)
        y = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(y)) * self.w3(y))  # type: ignore[no-any-return]


class RopeInForward(nn.Module):
    """Meta's Llama reference code, its rotary table made in forward (``torch.arange(...,
    device=ids.device)``, ``torch.outer``, ``torch.polar``: complex) and handed to each block;
    an embedding and an output head not tied."""

    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, W)
        self.layers = nn.ModuleList(_RopeBlock() for _ in range(3))
        self.norm = _RMSNorm()
        self.output = nn.Linear(W, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        half = W // 2 // 2  # head size 8: 4 frequencies
        inv = 1.0 / (10000 ** (torch.arange(0, half, device=tokens.device).float() / half))
        angles = torch.outer(torch.arange(t, device=tokens.device).float(), inv)
        freqs = torch.polar(torch.ones_like(angles), angles).view(1, t, 1, half)
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, freqs)
        return self.output(self.norm(h)).float()  # type: ignore[no-any-return]


def make_rope_in_forward() -> nn.Module:
    return _declared(RopeInForward(), TensorSpec("tokens", "INT64", (-1, -1)))


class Perceiver(nn.Module):
    """Perceiver IO: a learned latent array (a top-level ``nn.Parameter``) expanded per batch,
    cross-attention from the inputs, latent self-attention, a learned output query."""

    def __init__(self) -> None:
        super().__init__()
        self.latents = nn.Parameter(torch.randn(6, W))
        self.input_proj = nn.Linear(8, W)
        self.cross = nn.MultiheadAttention(W, 1, batch_first=True)
        self.process = nn.ModuleList(
            nn.TransformerEncoderLayer(W, 2, 32, dropout=0.0, batch_first=True) for _ in range(2)
        )
        self.query = nn.Parameter(torch.randn(1, 1, W))
        self.decode = nn.MultiheadAttention(W, 1, batch_first=True)
        self.head = nn.Linear(W, 5)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        b = inputs.shape[0]
        kv = self.input_proj(inputs)
        latents = self.latents.expand(b, -1, -1)
        x = latents + self.cross(latents, kv, kv, need_weights=False)[0]
        for layer in self.process:
            x = layer(x)
        out = self.decode(self.query.expand(b, -1, -1), x, x, need_weights=False)[0]
        return self.head(out.squeeze(1))  # type: ignore[no-any-return]


def make_perceiver() -> nn.Module:
    return _declared(Perceiver(), _x(-1, 8))


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(W, 4 * W), nn.Linear(4 * W, W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(x)))  # type: ignore[no-any-return]


class DataParallelModel(nn.Module):
    """What a training script saves: the model inside ``nn.DataParallel`` (every name under
    ``module.``), on a machine without GPUs a plain call."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(W, W)
        self.blocks = nn.Sequential(*(_Mlp() for _ in range(3)))
        self.out = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.inp(x)))  # type: ignore[no-any-return]


def make_data_parallel() -> nn.Module:
    return _declared(nn.DataParallel(DataParallelModel()), _x(W))


def make_data_parallel_as_on_gpus() -> nn.Module:
    """``nn.DataParallel`` as a machine with a GPU builds it (``device_ids`` set): its forward
    refuses weights that are not on ``cuda:0``, ``meta`` included, and scatters the batch."""
    model = nn.DataParallel(DataParallelModel())
    model.device_ids, model.src_device_obj = [0], torch.device("cuda", 0)
    return _declared(model, _x(W))


class ScriptedBlocks(nn.Module):
    """Blocks compiled with ``torch.jit.script`` inside an eager model (as fused layers in
    speech and detection code are)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(W, W)
        self.blocks = nn.ModuleList(torch.jit.script(_Mlp()) for _ in range(3))
        self.out = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)  # type: ignore[no-any-return]


def make_scripted_blocks() -> nn.Module:
    import warnings

    with warnings.catch_warnings():
        # torch.jit.script is deprecated: a DeprecationWarning up to torch 2.13, a FutureWarning
        # from 2.14 on
        warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated")
        return _declared(ScriptedBlocks(), _x(W))


class CompiledBlocks(nn.Module):
    """Blocks wrapped by ``torch.compile`` (``OptimizedModule``, each weight named under
    ``_orig_mod.``)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(W, W)
        self.blocks = nn.ModuleList(torch.compile(_Mlp()) for _ in range(3))
        self.out = nn.Linear(W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)  # type: ignore[no-any-return]


def make_compiled_blocks() -> nn.Module:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # what torch.compile imports warns
        return _declared(CompiledBlocks(), _x(W))


class SpectralGan(nn.Module):
    """A GAN discriminator with the old hook-based ``nn.utils.spectral_norm`` (``weight_orig``,
    ``weight_u`` and ``weight_v``; the weight a plain attribute each forward sets)."""

    def __init__(self) -> None:
        super().__init__()
        sn = nn.utils.spectral_norm
        self.convs = nn.Sequential(
            sn(nn.Conv2d(3, 8, 4, 2, 1)),
            nn.LeakyReLU(0.2),
            sn(nn.Conv2d(8, 16, 4, 2, 1)),
            nn.LeakyReLU(0.2),
            sn(nn.Conv2d(16, 16, 4, 2, 1)),
            nn.LeakyReLU(0.2),
        )
        self.head = sn(nn.Linear(16 * 4 * 4, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.convs(images).flatten(1))  # type: ignore[no-any-return]


def make_spectral_gan() -> nn.Module:
    return _declared(SpectralGan(), TensorSpec("images", "FP32", (-1, 3, 32, 32)))


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(W, 4 * W)
        self.hidden = nn.Linear(4 * W, 4 * W)
        self.out = nn.Linear(4 * W, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.relu(self.hidden(F.relu(self.inp(x)))))  # type: ignore[no-any-return]


def make_quantized_dynamic() -> nn.Module:
    """``torch.ao.quantization.quantize_dynamic``: int8 Linear layers whose packed weights are
    neither parameters nor buffers."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization and its tensors are deprecated
        model = torch.ao.quantization.quantize_dynamic(_Blocks(), {nn.Linear}, dtype=torch.qint8)
    return _declared(model, _x(W))


class _MoDBlock(nn.Module):
    """Mixture-of-depths: a router scores the tokens, the top half (``topk``) go through the
    block (gathered, processed, scattered back), the rest skip it."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(W, 1)
        self.block = GPTBlock(W)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, t, d = x.shape
        weights = self.router(x).squeeze(-1)
        top, index = torch.topk(weights, t // 2, dim=1, sorted=False)
        index = index.unsqueeze(-1).expand(-1, -1, d)
        chosen = torch.gather(x, 1, index)
        update = self.block(chosen) * torch.sigmoid(top).unsqueeze(-1)
        return torch.scatter_add(x, 1, index, update)


class MixtureOfDepths(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, W)
        self.layers = nn.ModuleList(_MoDBlock() for _ in range(3))
        self.head = nn.Linear(W, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)  # type: ignore[no-any-return]


def make_mixture_of_depths() -> nn.Module:
    return _declared(MixtureOfDepths(), TensorSpec("input_ids", "INT64", (-1, -1)))


class ModelOutput(collections.OrderedDict[str, Any]):
    """transformers' ``ModelOutput``: a dataclass that is an ``OrderedDict`` of the fields set."""

    def __post_init__(self) -> None:
        names = list(self.__dataclass_fields__)  # type: ignore[attr-defined]
        first = getattr(self, names[0])
        if isinstance(first, dict) and all(getattr(self, n) is None for n in names[1:]):
            setattr(self, names[0], None)  # built from a dict, as accelerate's hooks rebuild it
            for name, value in first.items():
                setattr(self, name, value)
        for name in names:
            value = getattr(self, name)
            if value is not None:
                self[name] = value


@dataclass
class BaseModelOutput(ModelOutput):
    last_hidden_state: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    pooler_output: torch.Tensor | None = None


class _HfLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.Linear(W, 3 * W)
        self.output = nn.Linear(W, W)
        self.norm = nn.LayerNorm(W)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> tuple[torch.Tensor]:
        b, t, d = hidden_states.shape
        q, k, v = self.attention(hidden_states).view(b, t, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
        y = self.output(y.transpose(1, 2).reshape(b, t, d))
        return (self.norm(hidden_states + y),)


class HfEncoder(nn.Module):
    """A transformers-style encoder: ``forward(input_ids, attention_mask=None, *,
    output_hidden_states=False, return_dict=True, **kwargs)``, the extended additive mask made
    with ``torch.finfo(dtype).min``, every layer's hidden states kept, a ``ModelOutput``
    (an ``OrderedDict`` dataclass) returned."""

    def __init__(self) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(VOCAB, W)
        self.layer = nn.ModuleList(_HfLayer() for _ in range(3))
        self.pooler = nn.Linear(W, W)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        output_hidden_states: bool = True,
        return_dict: bool = True,
        **kwargs: Any,
    ) -> BaseModelOutput | tuple[torch.Tensor, ...]:
        h = self.embeddings(input_ids)
        mask = None
        if attention_mask is not None:
            mask = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        states: tuple[torch.Tensor, ...] = (h,)
        for layer in self.layer:
            h = layer(h, mask, **kwargs)[0]
            states += (h,)
        pooled = torch.tanh(self.pooler(h[:, 0]))
        if not return_dict:
            return (h, pooled)
        return BaseModelOutput(
            last_hidden_state=h,
            hidden_states=states if output_hidden_states else None,
            pooler_output=pooled,
        )


def make_hf_encoder() -> nn.Module:
    ids, mask = (TensorSpec(name, "INT64", (-1, -1)) for name in ("input_ids", "attention_mask"))
    return _declared(HfEncoder(), ids, mask)


class FeatureHooks(nn.Module):
    """Features taken by forward hooks into a dict (as feature extractors and FPNs built on a
    classifier do), then combined by the model's code."""

    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.Sequential(
            _ConvBnAct(3, 8, 2), _ConvBnAct(8, 16, 2), _ConvBnAct(16, 16, 2)
        )
        self.lateral = nn.ModuleList(nn.Conv2d(c, 8, 1) for c in (8, 16, 16))
        self.head = nn.Linear(8, 4)
        self.features: dict[int, torch.Tensor] = {}
        for i, stage in enumerate(self.stages):
            stage.register_forward_hook(self._keep(i))

    def _keep(self, i: int) -> Any:
        def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
            self.features[i] = output

        return hook

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.features.clear()
        self.stages(images)
        pooled = [lat(self.features[i]).mean((2, 3)) for i, lat in enumerate(self.lateral)]
        self.features.clear()
        return self.head(torch.stack(pooled, 0).sum(0))  # type: ignore[no-any-return]


def make_feature_hooks() -> nn.Module:
    return _declared(FeatureHooks(), TensorSpec("images", "FP32", (-1, 3, 32, 32)))


class Streaming(nn.Module):
    """A streaming recurrent model keeping its hidden state between calls in a plain attribute
    (``self.hidden``, ``None`` before the first call), as online speech and control models do."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(W, W)
        self.rnn = nn.GRU(W, W, batch_first=True)
        self.head = nn.Linear(W, 2)
        self.hidden: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, self.hidden = self.rnn(F.relu(self.proj(x)), self.hidden)
        return self.head(out)  # type: ignore[no-any-return]


def make_streaming() -> nn.Module:
    return _declared(Streaming(), _x(-1, W))
