"""Two transformer shapes built in code for planning: GPT-2-small-like and Llama-7B-like.

No hub access and no weights: :func:`build_shape` builds the module under ``torch.device``
(``meta`` by default), so even the 7B shape costs no memory. The attention is written out
(``q @ k^T``, softmax, ``@ v``) rather than fused, so the same operators run on ``meta`` and on
a real device and the planner's activation estimate can be checked against a real run.

Each shape declares its inputs (:class:`~torchplace.planner.inputs.InputSpec`) and its KV cache
(:class:`KVCacheSpec`), which the budget counts analytically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

    from torchplace.planner.decoder import Decoder  # imports torch: here, not at module import

    shape = SHAPES[name]
    if layers is not None:
        shape = dataclasses.replace(shape, layers=layers)
    with torch.device(device):
        model = Decoder(shape)
    return model.to(getattr(torch, shape.dtype)).eval()
