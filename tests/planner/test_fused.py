"""Operators whose meta kernels allocate other than the real ones: the trace matches a CPU run."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.planner.toy import make_encoder_stack
from tests.scripts import load_benchmark
from torchplace.planner.fused import kernels
from torchplace.planner.inputs import load_plan_model
from torchplace.planner.trace import trace_forward
from torchplace.planner.units import select_units

B = 3


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("plan_accuracy")


def _traced_and_measured(factory: str, bench: ModuleType) -> tuple[int, int]:
    """The trace's activation peak (CPU kernels) and the CPU allocator's, at batch B."""
    meta = load_plan_model(f"tests.planner.toy:{factory}")
    with kernels("cpu"):
        units = select_units(meta.module).paths
        inputs = meta.example(B, None, "meta")
        estimate = trace_forward(meta.module, inputs, units, batch=B, seq=None).peak()
    real = load_plan_model(f"tests.planner.toy:{factory}", device="cpu")
    return estimate, bench.measured_peak(real.module, real.example(B, None, "cpu"), "cpu")


@pytest.mark.parametrize("factory", ["make_encoder_stack", "make_attention", "make_normed"])
def test_the_trace_matches_the_cpu_allocator(factory: str, bench: ModuleType) -> None:
    # encoder layers on their fast path (wrapped, not hooked), nn.MultiheadAttention's fast
    # path, a fused causal attention, dropout in inference; batch norm's two statistics (the
    # CPU kernel makes them too, and its caller frees them)
    estimate, measured = _traced_and_measured(factory, bench)
    assert estimate == measured


def test_cuda_kernels_run_self_attention_fused() -> None:
    model = make_encoder_stack().to("meta").eval()
    units = select_units(model).paths
    x = [torch.empty(B, 15, 12, device="meta")]
    with kernels("cpu"):
        cpu = trace_forward(model, x, units, batch=B, seq=None).peak()
    cuda = trace_forward(model, x, units, batch=B, seq=None).peak()
    assert cuda < cpu  # no 16 x 16 score matrix per head
    with pytest.raises(ValueError, match="cuda or cpu"), kernels("tpu"):
        pass


class _ViewsTheOutput(nn.Module):
    """Attention over a query laid out (L, B, H, E), its output permuted and viewed, as torch
    2.9's export writes nn.MultiheadAttention's (a view only the kernels' layout allows)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.qkv(x.transpose(0, 1)).view(t, b * 2, 8).transpose(0, 1).view(b, 2, t, 8)
        out = F.scaled_dot_product_attention(q, q, q)
        return out.permute(2, 0, 1, 3).view(t * b, 16)


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_the_fused_attention_output_is_laid_out_as_the_query(kind: str) -> None:
    model = _ViewsTheOutput().eval()
    x = torch.randn(2, 6, 16)
    assert model(x).shape == (12, 16)  # the CPU kernel allows the view
    with kernels(kind):
        trace = trace_forward(model.to("meta"), [x.to("meta")], ["qkv"], batch=2, seq=None)
    assert trace.peak() > 0


class _Grouped(nn.Module):
    """Attention with two key/value heads for eight query heads, under a boolean causal mask."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(64, 64)
        self.kv = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, 8, 8).transpose(1, 2)
        k = self.kv(x).view(b, t, 2, 8).transpose(1, 2)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        return F.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True)


def test_grouped_query_attention_is_fused_and_a_boolean_mask_made_additive() -> None:
    t = 128
    model = _Grouped().to("meta").eval()
    x = [torch.empty(B, t, 64, device="meta")]
    trace = trace_forward(model, x, ["q", "kv"], batch=B, seq=None)
    scores = B * 8 * t * t * 4  # the math path's score matrix, which a fused kernel never makes
    assert trace.peak() < scores
    assert any(a.shape == (t, t) and a.dtype == "float32" for a in trace.allocs)  # the mask
