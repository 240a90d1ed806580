"""A fourteenth round of library models users feed ``torchplace plan``, built from small
configs, by pipeline (``--balance memory`` and ``fill``) and accelerate over three devices with
a ``--max-memory`` below their weights, verified on the CPU. The faults, each reproduced here
by a small module that behaves the same way (the libraries are not needed to run these
tests): GPT-Neo's blocks each hold a ``bool`` causal mask, which accelerate's
``compute_module_sizes`` counts at a bit an element, so ``--balance fill`` put two blocks on a
device past its ``--max-memory`` (388.00 KiB of weights and buffers on ``cuda:1`` for 348.52
KiB given).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tests.planner.conftest import planned
from torchplace.models import TensorSpec
from torchplace.planner.api import Plan
from torchplace.planner.verify import verify

W, SEQ, TABLE = 16, 8, 64


def _plan(factory: str, **options: Any) -> Plan:
    return planned(
        f"tests.planner.test_architectures11:make_{factory}",
        **{"strategy": "pipeline", **options},
    )


# ----------------------------------------------- a bool mask is a byte an element on a device


class MaskedBlock(nn.Module):
    """As GPT-Neo's attention: a ``bool`` mask kept as a non-persistent buffer, cut to the
    sequence in forward (1,024 B held, 128 B as accelerate sizes it), beside 1,088 B of
    weights."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(W, W)
        mask = torch.ones(TABLE, W, dtype=torch.bool).tril()
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask: torch.Tensor = self.mask  # type: ignore[assignment]
        return self.lin(x).masked_fill(~mask[:t], 0.0)  # type: ignore[no-any-return]


class MaskedStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MaskedBlock() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def make_masked_stack() -> nn.Module:
    model = MaskedStack().eval()
    model.torchplace_inputs = (TensorSpec("x", "FP32", (-1, SEQ, W)),)  # type: ignore[assignment]
    return model


BLOCK = (W * W + W) * 4 + TABLE * W  # 2,112 B: weights, and the mask at a byte an element


def test_fill_sizes_a_bool_buffer_as_a_device_holds_it() -> None:
    # accelerate's sizes (1,216 B a block) let fill keep room for one block on cuda:0 and put
    # all three there: 6,336 B for 4,500 B given (over-max-memory, exit 1); held as they are,
    # one block goes on cuda:0 (room kept for the largest) and two on cuda:1
    budget = 4500
    p = _plan("masked_stack", balance="fill", assume="3x1GiB", max_memory=[budget] * 3)
    assert p.units.sizes["blocks.0"] == BLOCK
    assert p.placement.assign == {
        "blocks.0": "cuda:0",
        "blocks.1": "cuda:1",
        "blocks.2": "cuda:1",
    }
    held = {d: b.weights + b.buffers for d, b in p.budgets.items()}
    assert held == {"cuda:0": BLOCK, "cuda:1": 2 * BLOCK}
    assert all(v <= budget for v in held.values())
    assert not [w for w in p.warnings if w.code == "over-max-memory"], p.warnings
    assert p.fits()
    verdict = verify(p, devices=["cpu"])
    assert verdict.ok, verdict.render()


def test_accelerate_keeps_its_own_sizes_and_says_the_device_is_over() -> None:
    # --strategy accelerate is accelerate's map as it chooses it (a bit a mask element): all
    # three blocks on cuda:0, which the plan, counting what the device holds, says is over
    p = _plan("masked_stack", strategy="accelerate", assume="3x1GiB", max_memory=[4500] * 3)
    assert set(p.placement.assign.values()) == {"cuda:0"}
    assert [w.code for w in p.warnings if w.code == "over-max-memory"] == ["over-max-memory"]
    assert not p.fits()


# ------------------------------------- ids read through a list index, as transformers reads
