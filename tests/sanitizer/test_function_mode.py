"""Function-mode recording: the fast path for pure compute and host-data factories.
``meta`` stands in for the accelerator."""

from __future__ import annotations

import torch

import torchplace
from torchplace.models import build_model

from .fakes import META, line_of

HERE = __file__


def line(marker: str) -> int:
    return line_of(HERE, marker)


def test_same_device_moves_and_cpu_compute_record_nothing() -> None:
    model = build_model("seed-mlp")
    x = torch.randn(4, 8)
    with torchplace.guard() as report:
        x.to("cpu")
        out = model(x).softmax(-1)
        out.argmax(-1).tolist()
        out.sum().item()
        out[out > 0.5]
        out.nonzero()
        bool(out[0, 0] > 0)
    assert report.events == []


def test_factory_from_host_data_onto_a_device_is_an_h2d_copy() -> None:
    on_device = torch.ones(1, device=META)
    with torchplace.guard() as report:
        torch.tensor([1.0, 2.0, 3.0], device=META)  # factory-line
        torch.as_tensor([1, 2], device=META)
        on_device.new_tensor([1.0, 2.0])
        torch.tensor([1.0])  # stays on the host: nothing
    # torch builds the data on the host and copies it over with a blocking copy: a sync too
    assert [(e.kind, e.op, e.nbytes) for e in report.events] == [
        ("h2d", "torch.tensor", 12),
        ("sync", "torch.tensor", 0),
        ("h2d", "torch.as_tensor", 16),
        ("sync", "torch.as_tensor", 0),
        ("h2d", "Tensor.new_tensor", 8),
        ("sync", "Tensor.new_tensor", 0),
    ]
    assert [e.site.lineno for e in report.events[:2]] == [line("factory-line")] * 2
    assert {e.detail for e in report.syncs} == {"blocking host-to-device copy"}


def test_factory_from_a_list_of_device_tensors_reads_each_one_on_the_host() -> None:
    # torch.tensor([loss_a, loss_b]) reads every device tensor in the list as a Python scalar
    # (an item() each, out of the dispatch layer's sight); torch.stack keeps them on the device
    losses = [torch.ones((), device=META), torch.ones((), device=META)]
    one = torch.ones(1, device=META)
    with torchplace.guard() as report:
        torch.tensor(losses, device=META)  # scalars-line
        torch.as_tensor([[one, one], [one, torch.ones(1)]], device=META)  # nested-line
        torch.stack(losses)
    reads = [(e.op, e.site.lineno) for e in report.syncs if "blocking" not in e.detail]
    assert reads == [
        *[("torch.tensor", line("scalars-line"))] * 2,
        *[("torch.as_tensor", line("nested-line"))] * 3,  # the CPU one reads nothing
    ]
    assert len(report.syncs) == len(reads) + 2  # and the two blocking copies of the host data
    assert (report.h2d, report.h2d_bytes) == (2, 2 * 4 + 4 * 4)
