"""The facts read from torch: matmul precision flags, TF32 whichever API set it."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch

from torchplace.devices import FakeProbe
from torchplace.doctor import collect, render
from torchplace.doctor.probes import tf32_allowed, torch_flags


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch < 2.9")
def test_new_tf32_api_neither_breaks_the_report_nor_hides_tf32() -> None:
    # After torch.backends.cuda.matmul.fp32_precision = "tf32" the legacy getters raise
    # ("mix of the legacy and new APIs"): the doctor must still report, and allow for TF32.
    matmul: Any = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "tf32"
    try:
        with pytest.raises(RuntimeError, match="legacy"):
            torch.get_float32_matmul_precision()
        flags = torch_flags()
        report = collect("cpu", probe=FakeProbe(), smoke=False, toolkit=lambda: None)
        out = io.StringIO()
        render(report, file=out)
    finally:
        matmul.fp32_precision = before
    assert flags["cuda_matmul_fp32_precision"] == "tf32"
    assert tf32_allowed(flags)
    assert report["build"]["cuda_matmul_fp32_precision"] == "tf32"
    assert "fp32_precision tf32" in out.getvalue()
    assert report["verdict"]["usable"]


def test_tf32_flags() -> None:
    base = {
        "cuda_matmul_fp32_precision": None,
        "cuda_matmul_allow_tf32": False,
        "float32_matmul_precision": "highest",
    }
    assert not tf32_allowed(base)
    assert tf32_allowed({**base, "cuda_matmul_allow_tf32": True})
    assert tf32_allowed({**base, "float32_matmul_precision": "high"})
    assert tf32_allowed({**base, "float32_matmul_precision": None})  # torch refused: be safe
    assert not tf32_allowed({**base, "cuda_matmul_fp32_precision": "ieee"})
    assert tf32_allowed({**base, "cuda_matmul_fp32_precision": "tf32"})
