"""Operators whose ``meta`` kernels allocate other than the CPU and CUDA ones, run as those do.

The trace runs on ``meta``; where a real kernel makes different tensors, the recorder runs the
replacement here instead, on ``meta``, so that every tensor the real kernel makes is recorded:

- ``scaled_dot_product_attention``: meta takes the math path, which makes the
  batch x heads x L x S score matrix; CPU and CUDA take a fused kernel (flash or
  memory-efficient) when the inputs allow it, which makes the output, laid out as the query
  is, and a float32 log-sum-exp;
- ``_native_multi_head_attention`` (``nn.MultiheadAttention``'s fast path) and
  ``_transformer_encoder_layer_fwd`` (``nn.TransformerEncoderLayer``'s): the meta kernels make
  the output alone; the real ones' intermediates follow PyTorch's C++ code
  (``attention.cpp``, ``transformer.cpp``);
- ``_nested_tensor_from_mask_left_aligned`` reads a padding mask's values: taken as not
  aligned, so ``nn.TransformerEncoder`` with a padding mask is traced padded, not nested (and
  run so by ``--verify``'s tracker on the CPU);
  likewise an attention mask is taken as not causal (:func:`causal_masks_unknown`);
- ``native_batch_norm`` in inference: meta returns the two per-feature statistics, cuDNN
  and the CPU empty ones (the CPU makes them inside the kernel, where only its allocator sees
  them: kept in a trace for the CPU).

:func:`fast_paths` lets those modules take their fast paths on ``meta``, as they do on the CPU
and CUDA (their Python code accepts only those devices and a renamed private backend).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "Count",
    "as_planned",
    "autocast_on_meta",
    "causal_masks_unknown",
    "fast_paths",
    "kernels",
    "opaque",
    "replacement",
]

#: Whose kernels the trace follows where CPU and CUDA differ: ``cuda`` (the planned devices)
#: or ``cpu`` (to compare with a CPU run, as ``benchmarks/plan_accuracy.py`` does).
_KERNELS: contextvars.ContextVar[str] = contextvars.ContextVar("kernels", default="cuda")

#: Adds FLOPs to the running unit.
Count = Callable[[int], None]


@contextlib.contextmanager
def kernels(kind: str) -> Iterator[None]:
    """Trace as ``kind``'s kernels run (``cuda`` or ``cpu``) where they differ: CUDA's
    ``_native_multi_head_attention`` runs self-attention through a fused kernel; the CPU's
    always through two bmm and the full score matrix."""
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"kernels {kind!r}: cuda or cpu")
    token = _KERNELS.set(kind)
    try:
        yield
    finally:
        _KERNELS.reset(token)


@contextlib.contextmanager
def fast_paths() -> Iterator[None]:
    """``meta`` accepted where PyTorch's modules check for a fast-path device (they accept the
    private backend's name; that name is borrowed while no backend has taken it)."""
    from torch.utils import backend_registration as registration

    name = getattr(registration, "_privateuse1_backend_name", None)
    if name != "privateuseone":  # a real backend took the name (or this torch lacks it)
        yield
        return
    registration._privateuse1_backend_name = "meta"
    try:
        yield
    finally:
        registration._privateuse1_backend_name = name


@contextlib.contextmanager
def causal_masks_unknown() -> Iterator[None]:
    """``nn.TransformerEncoder`` and ``nn.TransformerDecoder``, given an attention mask without
    ``is_causal``, read its values to tell whether it is causal: on ``meta`` it is taken as not
    causal, so the mask goes on to attention (a fused kernel with a mask: an upper bound)."""
    from torch.nn.modules import transformer

    detect = getattr(transformer, "_detect_is_causal_mask", None)
    if detect is None:  # a torch without the check
        yield
        return

    def not_causal(mask: Any, is_causal: bool | None = None, size: int | None = None) -> bool:
        if is_causal is None and mask is not None and mask.device.type == "meta":
            return False
        return bool(detect(mask, is_causal, size))

    transformer._detect_is_causal_mask = not_causal
    try:
        yield
    finally:
        transformer._detect_is_causal_mask = detect


@contextlib.contextmanager
def autocast_on_meta() -> Iterator[None]:
    """``torch.autocast(device_type=x.device.type, ...)`` and ``torch.is_autocast_enabled`` of
    a ``meta`` tensor's device (transformers' rotary embeddings turn autocast off so, for
    float32 tables): autocast has no ``meta`` backend and raises ("unsupported scalarType"); it
    casts nothing on ``meta`` either, so the region runs as the rest, autocast off."""
    import torch
    from torch.amp import autocast_mode

    cls = autocast_mode.autocast
    init, enabled = cls.__init__, torch.is_autocast_enabled

    def patched_init(
        self: Any,
        device_type: str,
        dtype: torch.dtype | None = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ) -> None:
        if device_type == "meta":
            device_type, enabled = "cpu", False
        init(self, device_type, dtype, enabled, cache_enabled)

    def patched_enabled(*args: Any) -> bool:
        return False if args and args[0] == "meta" else bool(enabled(*args))

    cls.__init__ = patched_init  # type: ignore[method-assign]
    torch.is_autocast_enabled = patched_enabled  # type: ignore[assignment]
    try:
        yield
    finally:
        cls.__init__ = init  # type: ignore[method-assign]
        torch.is_autocast_enabled = enabled


def replacement(func: Any) -> Callable[..., Any] | None:
    """The meta stand-in for ``func`` (called as ``impl(count, *args, **kwargs)``, returns
    NotImplemented where the real kernel takes the path meta takes), or None."""
    return _REPLACED.get(func._overloadpacket.__name__)


def opaque(func: Any) -> Callable[..., Any] | None:
    """The stand-in for a real kernel whose temporaries a tensor tracker cannot see (they are
    made inside one operator): run where the tracker must see them (``--verify`` on the CPU).
    Its outputs hold no values, which verify does not read."""
    name = func._overloadpacket.__name__
    return _REPLACED[name] if name in _OPAQUE else None


#: Operators whose CPU kernel returns other auxiliary tensors than CUDA's, which ``meta``'s
#: follow: ``embedding_bag`` (``nn.EmbeddingBag``) in sum mode returns an empty
#: ``offset2bag`` and a per-bag ``max_indices`` on the CPU, the reverse on CUDA.
_AUXILIARY = frozenset({"embedding_bag", "_embedding_bag", "_embedding_bag_forward_only"})

#: Operators whose CPU kernel lays its output out otherwise than the planned one: batch norm
#: in inference makes its output contiguous on the CPU, and like its input on CUDA (and in the
#: plan, :func:`_batch_norm`'s ``empty_like``): a 3-d input transposed, as PatchTST's
#: ``BatchNorm1d`` takes ``x.transpose(1, 2)``, gives a transposed output, transposed back a
#: contiguous one, which the next ``linear`` runs as one ``mm``, where the CPU's strided view
#: takes a ``bmm`` and a separate bias add.
_LAYOUT = frozenset(
    {"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training"}
)


def as_planned(func: Any, args: Any, kwargs: Any, out: Any) -> Any:
    """``out``, what ``func`` returned on the CPU, made as the planned kernel makes it, for
    ``--verify``'s tracker on the CPU: the auxiliary outputs (all but the first, which
    inference alone reads) with their planned shapes (their shapes on ``meta``), and, for the
    operators in ``_LAYOUT``, the first laid out as its input (its values kept)."""
    import torch
    from torch.utils._pytree import tree_map

    name = func._overloadpacket.__name__
    if not isinstance(out, tuple):
        return out
    if name in _LAYOUT:
        first, x = out[0], args[0]
        if first.shape == x.shape and first.stride() != x.stride():
            laid = torch.empty_like(x, dtype=first.dtype)  # its input's strides, where dense
            return (laid.copy_(first), *out[1:])
        return out
    if name not in _AUXILIARY:
        return out

    def meta(v: Any) -> Any:
        return v.to("meta") if isinstance(v, torch.Tensor) else v

    planned = func(*tree_map(meta, args), **tree_map(meta, kwargs))
    aux = [torch.empty(m.shape, dtype=m.dtype, device=out[0].device) for m in planned[1:]]
    return (out[0], *aux)


def _floats() -> tuple[torch.dtype, ...]:
    import torch

    return (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _empty(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    import torch

    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _fused_sdpa_ok(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, gqa: bool = False
) -> bool:
    """Whether CPU and CUDA run this attention as a fused kernel (the checks both share):
    grouped-query attention (fewer key/value heads) included where asked for."""
    heads = q.shape[1] == k.shape[1] == v.shape[1] if q.dim() == 4 else False
    grouped = gqa and k.shape[1] == v.shape[1] > 0 and q.shape[1] % k.shape[1] == 0
    return (
        q.dim() == k.dim() == v.dim() == 4
        and q.dtype in _floats()
        and q.dtype == k.dtype == v.dtype
        and not any(t.is_nested for t in (q, k, v))
        and dropout == 0.0
        and q.shape[0] == k.shape[0] == v.shape[0]
        and (heads or grouped)
        and q.shape[-1] == k.shape[-1] == v.shape[-1]
        and min(q.shape[2], k.shape[2]) > 0
        and all(t.stride(-1) == 1 for t in (q, k, v))
    )


def _sdpa(
    count: Count,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """A fused kernel's output, laid out as the query, and its log-sum-exp, freed at once; a
    boolean mask is first made an additive one of the query's dtype, as the composite does."""
    import torch

    if not _fused_sdpa_ok(q, k, v, dropout_p, enable_gqa):
        return NotImplemented
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        inverted = torch.empty(attn_mask.shape, dtype=torch.bool, device=q.device)
        attn_mask = _empty(tuple(attn_mask.shape), q)
        del inverted
    # laid out as the query is, as the kernels lay it out (empty_like of the query, seen as
    # (B, L, H, E)): code exported from a run on them may view the output where only that
    # layout allows it (torch 2.9's export of nn.MultiheadAttention: permute, then view)
    out = torch.empty_like(q)
    b, h, n, e = q.shape
    lse = torch.empty((b, h, n), dtype=torch.float32, device=q.device)
    del lse
    # its two matmuls for every query head (grouped key/value heads broadcast), as torch's flop
    # counter counts them; torch 2.9's counter refuses grouped heads
    s, ev = k.shape[2], v.shape[-1]
    count(2 * b * h * n * s * (e + ev))
    return out


def _native_mha(
    count: Count,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    embed_dim: int,
    num_head: int,
    qkv_weight: torch.Tensor,
    qkv_bias: torch.Tensor,
    proj_weight: torch.Tensor,
    proj_bias: torch.Tensor,
    mask: torch.Tensor | None = None,
    need_weights: bool = True,
    average_attn_weights: bool = True,
    mask_type: int | None = None,
) -> Any:
    """``native_multi_head_attention_cuda``: self-attention through a fused kernel where it
    can (projected qkv alive to the end), else (and always on the CPU) two bmm."""
    from torch.nn import functional as F

    head, b = embed_dim // num_head, query.shape[0]
    fused = (
        _KERNELS.get() == "cuda"
        and query is key is value
        and head % 8 == 0
        and not need_weights
        and mask is None
        and query.dim() == 3
        and query.dtype in _floats()
        and query.shape[1] > 0
    )
    if not fused:
        dims, asked = (embed_dim, num_head), (need_weights, average_attn_weights)
        return _mha_bmm(count, query, dims, (proj_weight, proj_bias), mask, asked)
    x = F.linear(query, qkv_weight, qkv_bias)
    q, k, v = (c.view(b, -1, num_head, head).transpose(1, 2) for c in x.chunk(3, -1))
    y = F.scaled_dot_product_attention(q, k, v)  # fused, where the recorder runs it
    out = F.linear(y.transpose(1, 2).reshape(b, -1, embed_dim), proj_weight, proj_bias)
    return out, _empty((0,), query)


def _mha_bmm(
    count: Count,
    query: torch.Tensor,
    dims: tuple[int, int],
    proj: tuple[torch.Tensor, torch.Tensor],
    mask: torch.Tensor | None,
    weights: tuple[bool, bool],
) -> Any:
    """The C++ path without a fused kernel: projected qkv, then q, k, v packed in one tensor
    (qkv freed), the score matrix (softmax in place, or masked into a new one), the context
    written over q and transposed for the output projection (the scores freed first unless
    asked for); then the scores, averaged over the heads where asked."""
    import torch
    from torch.nn import functional as F

    (embed_dim, num_head), (need, average) = dims, weights
    b, t, head = query.shape[0], query.shape[1], embed_dim // num_head
    qkv = _empty((b, t, 3 * embed_dim), query)
    packed = _empty((3, b, num_head, t, head), query)
    del qkv
    scores = _empty((b, num_head, t, t), query)
    if mask is not None:
        scores = torch.empty_like(scores)
    count(2 * b * t * embed_dim * 3 * embed_dim + 4 * b * num_head * t * t * head)
    kept = scores if need else _empty((0,), query)
    del scores
    ctx = packed[0].transpose(1, 2).contiguous().view(b * t, embed_dim)
    out = F.linear(ctx, *proj).view(b, t, embed_dim)
    del ctx
    return out, kept.sum(1) if need and average else kept


def _encoder_layer(
    count: Count,
    src: torch.Tensor,
    embed_dim: int,
    num_heads: int,
    *rest: Any,
    **named: Any,
) -> Any:
    """``transformer_encoder_layer_forward``: attention, residual, norm, FFN, residual, norm
    (norm first where asked), the residuals added in place. ``rest``: the qkv and output
    projections' weights and biases, use_gelu, norm_first, eps, the two norms' and the two FFN
    linears' weights and biases, then the mask and its type."""
    import torch
    from torch.nn import functional as F

    attn, (use_gelu, norm_first, eps), weights = rest[:4], rest[4:7], rest[7:15]
    mask, mask_type = (*rest[15:], named.get("mask"), named.get("mask_type"))[:2]
    if src.numel() == 0:
        return src.clone()
    n1w, n1b, n2w, n2b, w1, b1, w2, b2 = weights

    def norm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (embed_dim,), w, bias, eps)

    x = norm(src, n1w, n1b) if norm_first else src
    mha = torch.ops.aten._native_multi_head_attention
    x = mha(x, x, x, embed_dim, num_heads, *attn, mask, False, True, mask_type)[0]
    x.add_(src)
    pre = x = x if norm_first else norm(x, n1w, n1b)
    if norm_first:
        x = norm(x, n2w, n2b)
    x = F.linear(x, w1, b1)
    x = F.gelu(x) if use_gelu else x.relu_()
    x = F.linear(x, w2, b2)
    x.add_(pre)
    return x if norm_first else norm(x, n2w, n2b)


def _batch_norm(
    count: Count,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    mean: torch.Tensor | None,
    var: torch.Tensor | None,
    training: bool,
    *rest: Any,
) -> Any:
    """``native_batch_norm`` in inference: meta's kernel returns the two per-feature
    statistics; cuDNN's (``cudnn_batch_norm``) and the CPU's return empty ones (the CPU's makes
    them inside, which a trace for the CPU keeps: :func:`kernels`)."""
    import torch

    if training or _KERNELS.get() == "cpu":
        return NotImplemented
    out = torch.empty_like(x)
    stats = x.dtype if weight is None else weight.dtype
    return (
        out,
        torch.empty((0,), dtype=stats, device=x.device),
        torch.empty((0,), dtype=stats, device=x.device),
    )


def _batch_norm_inference(count: Count, *args: Any) -> Any:
    """``_native_batch_norm_legit_no_training`` (an exported program's): inference always."""
    return _batch_norm(count, *args[:5], False)


def _not_left_aligned(count: Count, *args: Any, **kwargs: Any) -> bool:
    """Whether a padding mask is left-aligned reads its values; on ``meta`` it is taken as not
    (``nn.TransformerEncoder`` then runs padded, not as nested tensors: an upper bound)."""
    return False


def _grouped_mm(
    count: Count,
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> Any:
    """``torch._grouped_mm`` (transformers' mixture-of-experts layers) of other dtypes than
    bfloat16: ``meta`` refuses them ("Expected inputs of BF16 type"), the CPU's kernel (and
    CUDA's fallback) runs them: its output, of the shape ``meta`` gives bfloat16 operands."""
    import torch

    if a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16:
        return NotImplemented
    shape: tuple[int, ...]
    if a.dim() == 2 and b.dim() == 2:
        groups = offs.shape[0] if offs is not None else 1
        shape, flops = (groups, a.shape[0], b.shape[1]), 2 * a.numel() * b.shape[1]
    elif a.dim() == 2:
        shape, flops = (a.shape[0], b.shape[-1]), 2 * a.numel() * b.shape[-1]
    elif b.dim() == 2:
        shape, flops = (a.shape[1], b.shape[1]), 2 * a.numel() * b.shape[1]
    else:
        shape, flops = (a.shape[0], a.shape[1], b.shape[-1]), 2 * a.numel() * b.shape[-1]
    count(int(flops))
    return torch.empty(shape, dtype=out_dtype or a.dtype, device=a.device)


_REPLACED: dict[str, Callable[..., Any]] = {
    "_grouped_mm": _grouped_mm,
    "scaled_dot_product_attention": _sdpa,
    "_native_multi_head_attention": _native_mha,
    "_transformer_encoder_layer_fwd": _encoder_layer,
    "_nested_tensor_from_mask_left_aligned": _not_left_aligned,
    "native_batch_norm": _batch_norm,
    "_native_batch_norm_legit_no_training": _batch_norm_inference,
}
#: ... and the padding-mask check, answered on the CPU as the plan answers it (a mask without
#: padding is left-aligned: the CPU would run the encoder on nested tensors, which the plan has
#: not, and which the fused stand-ins above cannot take)
_OPAQUE = frozenset(
    {
        "_native_multi_head_attention",
        "_transformer_encoder_layer_fwd",
        "_nested_tensor_from_mask_left_aligned",
    }
)
