"""Architectures users bring, built in code (no downloads), for tests/planner/test_architectures.py.

Each ``make_*`` factory returns a module with its inputs declared (``torchplace_inputs``),
small enough to run for real on the CPU (``--verify``), except those built on ``meta``.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import parametrize

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
