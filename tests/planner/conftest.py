from __future__ import annotations

from typing import Any

import pytest

from torchplace.planner.api import Plan, plan

#: no CUDA context, workspace or margin: the budgets of the hand-worked tests are exact
NO_RESERVES = ("cuda_context=0", "workspace=0", "margin=0")


def planned(target: str, **options: Any) -> Plan:
    """``target`` (``module:factory``) planned at batch 2 on two 1 GiB devices without
    reserves; ``options`` (any of :func:`plan`'s) add to those or replace them."""
    settings: dict[str, Any] = {"batch_sizes": [2], "assume": "2x1GiB", "reserves": NO_RESERVES}
    return plan(target, **{**settings, **options})


def toy_plan(factory: str, **options: Any) -> Plan:
    """``tests.planner.toy:FACTORY`` planned as :func:`planned` does."""
    return planned(f"tests.planner.toy:{factory}", **options)


def weights_and_buffers(p: Plan) -> int:
    """The bytes of weights and buffers the plan puts on all its devices together."""
    return sum(b.weights + b.buffers for b in p.budgets.values())


@pytest.fixture(autouse=True)
def _needs_accelerate() -> None:
    pytest.importorskip("accelerate")
