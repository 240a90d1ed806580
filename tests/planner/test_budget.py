"""The budget: reserves, the KV cache, headroom and the largest batch that fits."""

from __future__ import annotations

import pytest

from tests.planner.conftest import NO_RESERVES
from torchplace.errors import ConfigError
from torchplace.planner.api import plan
from torchplace.planner.budget import parse_reserves
from torchplace.planner.shapes import SHAPES


def test_reserves_default_and_override() -> None:
    default = parse_reserves([])
    assert default.cuda_context == 500 << 20
    assert default.margin == 0.05
    assert parse_reserves(["cuda_context=1GiB", "margin=0.1"]).fixed() == (1 << 30) + (32 << 20)
    with pytest.raises(ConfigError, match="cuda_context=1GiB"):
        parse_reserves(["context=1GiB"])


def test_kv_cache_is_analytic() -> None:
    kv = SHAPES["llama-7b-like"].kv_cache
    # 2 (K and V) x 32 layers x 4096 wide x 2 bytes per token
    assert kv.bytes(1, 1) == 2 * 32 * 4096 * 2
    assert kv.bytes(4, 512) == 4 * 512 * kv.bytes(1, 1)


def test_largest_batch_is_the_one_that_still_fits() -> None:
    p = plan("wide-mlp", batch_sizes=[1, 8], assume="1x64MiB", reserves=NO_RESERVES)
    budget = p.budgets["cuda:0"]
    largest = budget.largest_batch()
    per = (budget.activation[8] + budget.inputs[8] - budget.activation[1] - budget.inputs[1]) / 7
    base = budget.weights + budget.activation[1] + budget.inputs[1] - per
    assert base + per * largest <= budget.capacity < base + per * (largest + 1)


def test_llama_7b_on_two_h200_fits_and_splits_the_kv_cache() -> None:
    p = plan("llama-7b-like", batch_sizes=[1, 4], seq=64, assume="2xH200", strategy="pipeline")
    kv = SHAPES["llama-7b-like"].kv_cache.bytes(4, 64)
    assert sum(b.kv_cache[4] for b in p.budgets.values()) == kv
    weights = sum(b.weights for b in p.budgets.values())
    assert 6.7e9 * 2 * 0.98 < weights < 6.8e9 * 2
    assert p.fits()


def test_max_memory_given_is_a_hard_budget_for_the_weights() -> None:
    mib = 1 << 20
    p = plan("wide-mlp", assume="2xH200", strategy="pipeline", max_memory=[mib, mib])
    assert not p.fits()
    over = [w for w in p.warnings if w.code == "over-max-memory"]
    assert len(over) == 2
    assert "over the 1.00 MiB --max-memory gives it" in over[0].message
    assert all(b.largest_batch() == 0 for b in p.budgets.values())
    roomy = plan("wide-mlp", assume="2xH200", strategy="pipeline", max_memory=[5 * mib, 21 * mib])
    assert roomy.fits()
