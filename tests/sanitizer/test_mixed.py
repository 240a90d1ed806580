"""Mixed-device detection: operands on two devices, named one by one, CPU scalars let through."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchplace
from torchplace.errors import GuardViolation

from .fakes import META, attempt, line_of

HERE = __file__


def line(marker: str) -> int:
    return line_of(HERE, marker)


def test_mixed_device_op_names_every_operand() -> None:
    x = torch.ones(2, 3)
    weight = torch.ones(4, 3, device=META)
    with torchplace.guard() as report:
        F.linear(x, weight)  # mixed-line
    (event,) = report.mixed_device_ops
    assert event.op == "F.linear"
    assert event.site.lineno == line("mixed-line")
    assert [(o.shape, o.dtype, o.device) for o in event.operands] == [
        ((2, 3), "float32", "cpu"),
        ((4, 3), "float32", "meta"),
    ]


def test_cpu_temporary_created_inside_forward_is_caught_at_its_line() -> None:
    class Leaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            offset = torch.zeros(x.shape)  # a CPU temporary: pitfall 3
            return self.lin(x) + offset  # leaky-line

    model = Leaky().to(META)
    with torchplace.guard() as report, pytest.raises(RuntimeError, match="device"):
        model(torch.ones(2, 3, device=META))  # record mode lets torch's own error through
    (event,) = report.mixed_device_ops
    assert event.site.lineno == line("leaky-line")
    assert event.site.function == "forward"
    assert {o.device for o in event.operands} == {"cpu", "meta"}


def test_cpu_scalar_operands_are_legitimate() -> None:
    x = torch.ones(3, device=META)
    with torchplace.guard() as report:
        x * torch.tensor(2.0)
        torch.add(x, torch.tensor(1.0))
    assert report.events == []


def test_mixed_lists_and_calls_seen_only_at_the_dispatch_layer() -> None:
    a, b = torch.ones(2), torch.ones(2, device=META)
    with torchplace.guard() as report:
        attempt(lambda: torch.cat([a, b]))
        attempt(lambda: torch.where(torch.ones(2, dtype=torch.bool), b, a))
        attempt(lambda: b[torch.tensor([0, 1])])  # a CPU index tensor on a device tensor
    assert [e.op for e in report.mixed_device_ops] == [
        "torch.cat",
        "aten.where.self",
        "aten.index.Tensor",
    ]
    assert [o.name for o in report.mixed_device_ops[0].operands] == ["tensors[0]", "tensors[1]"]


def test_mixed_operands_passed_by_keyword_are_seen_on_the_fast_path() -> None:
    a, b = torch.ones(2), torch.ones(2, device=META)
    with torchplace.guard() as report:
        attempt(lambda: torch.add(b, other=a))
        attempt(lambda: torch.add(b, a, alpha=2))  # a non-tensor keyword; operands positional
        torch.add(b, b, alpha=2)
    assert [(e.op, [o.name for o in e.operands]) for e in report.mixed_device_ops] == [
        ("torch.add", ["self", "other"]),
        ("torch.add", ["self", "other"]),
    ]


def test_raise_mode_stops_a_mixed_device_op_with_every_operand_and_the_line() -> None:
    x = torch.ones(2, 3)
    weight = torch.ones(4, 3, device=META, dtype=torch.float16)
    with torchplace.guard("raise") as report, pytest.raises(GuardViolation) as info:
        F.linear(x, weight)  # raise-line
    message = str(info.value)
    assert f"test_mixed.py:{line('raise-line')}" in message
    assert "shape=(2, 3) dtype=float32 device=cpu" in message
    assert "shape=(4, 3) dtype=float16 device=meta" in message
    assert len(report.mixed_device_ops) == 1
