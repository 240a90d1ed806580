from __future__ import annotations

import pytest

#: no CUDA context, workspace or margin: the budgets of the hand-worked tests are exact
NO_RESERVES = ("cuda_context=0", "workspace=0", "margin=0")


@pytest.fixture(autouse=True)
def _needs_accelerate() -> None:
    pytest.importorskip("accelerate")
