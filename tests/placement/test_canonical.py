"""canonical_device: two specs name the same device exactly when their canonical forms are equal."""

from __future__ import annotations

import torch

from torchplace.placement import canonical_device


def test_canonical_forms_compare_equal_for_the_same_device() -> None:
    assert canonical_device("cpu") == canonical_device(torch.device("cpu"))
    assert canonical_device("cpu:0") == canonical_device("cpu")
    assert canonical_device("cpu") != canonical_device("meta")
    assert canonical_device("cuda:0") == canonical_device(torch.device("cuda", 0))


def test_canonical_device() -> None:
    assert canonical_device("cpu:0") == torch.device("cpu")
    assert canonical_device(torch.device("meta")) == torch.device("meta")
    assert canonical_device("cuda:1") == torch.device("cuda", 1)
    current = torch.cuda.current_device() if torch.cuda.is_available() else 0
    assert canonical_device("cuda") == torch.device("cuda", current)
