"""Suite-wide fixtures: ``@pytest.mark.cuda`` tests run only where CUDA really works."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; scripts/gpu-check runs it on one")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
