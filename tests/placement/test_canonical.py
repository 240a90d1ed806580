"""canonical_device: two specs name the same device exactly when their canonical forms are equal."""

from __future__ import annotations

import re

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


def test_a_value_torch_cannot_read_as_a_device_is_a_config_error() -> None:
    import pytest

    from torchplace import ConfigError

    for bad in ("", " cpu", "CPU", "gpu:0", None, True, 1.5):
        with pytest.raises(ConfigError, match=f"device {re.escape(repr(bad))} is not a device"):
            canonical_device(bad)  # type: ignore[arg-type]
