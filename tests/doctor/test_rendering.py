"""The report as tables for people."""

from __future__ import annotations

import io

from tests.doctor.machines import H200, K80, machine, report_for
from torchplace.doctor import render


def test_render_shows_mapping_and_verdict() -> None:
    probe = machine(K80, H200, env={"CUDA_VISIBLE_DEVICES": "1,0"})
    out = io.StringIO()
    render(report_for("cuda:1", probe), file=out)
    text = out.getvalue()
    assert "NVIDIA H200" in text
    assert "Tesla K80" in text
    assert "CUDA_VISIBLE_DEVICES" in text
    assert "1,0" in text
    assert "verdict: cuda:1 is not usable" in text
    assert "TORCH_CUDA_ARCH_LIST=3.7" in text
