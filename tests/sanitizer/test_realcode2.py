"""The guard against a second round of code written the way real projects write it: indexing
with Python lists, jagged nested tensors, a transformer's padding-mask fast path, device tensors
given where torch reads a number, NumPy conversion, composites that check their own operands,
and optimizers, schedulers and modules whose syncs must land on the user's line.

``meta`` stands in for the accelerator; :class:`MetaReadback` makes up the data a real device
would hand back.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchplace
from torchplace.errors import GuardViolation
from torchplace.sanitizer import GuardReport

from .fakes import META, MetaReadback, attempt, line_of, site_rows

HERE = __file__


def line(marker: str) -> int:
    return line_of(HERE, marker)


def _rows(report: GuardReport) -> list[tuple[str, int, int, int]]:
    return site_rows(report, HERE)


# ------------------------------------------------------------------- Python lists as indices


def test_a_python_list_index_is_copied_to_the_device_with_a_blocking_copy() -> None:
    x = torch.zeros(6, 3, device=META)
    with MetaReadback(), torchplace.guard() as report:
        x[[0, 2]]  # list-index
        x[1, [0, 2]]  # list-in-tuple
        x[[0, 1], [1, 2]]  # two-lists
        x[[True, False, True, False, True, False]]  # bool-list
        x[[0, 2]] = 1.0  # list-setitem
        x[np.array([0, 2])]  # numpy-index
        x[[]]  # empty-list
    assert _rows(report) == sorted(
        [
            ("h2d", line("list-index"), 1, 16),  # two int64 indices
            ("sync", line("list-index"), 1, 0),
            ("h2d", line("list-in-tuple"), 1, 16),
            ("sync", line("list-in-tuple"), 1, 0),
            # one index tensor per list: two copies
            ("h2d", line("two-lists"), 2, 32),
            ("sync", line("two-lists"), 2, 0),
            # six bools, one byte each; then the mask's nonzero
            ("h2d", line("bool-list"), 1, 6),
            ("sync", line("bool-list"), 2, 0),
            ("h2d", line("list-setitem"), 1, 16),
            ("sync", line("list-setitem"), 1, 0),
            # a NumPy index is copied where the dispatch layer sees it: the same record
            ("h2d", line("numpy-index"), 1, 16),
            ("sync", line("numpy-index"), 1, 0),
            ("h2d", line("empty-list"), 1, 0),  # nothing to copy: no wait
        ]
    )
    index_events = [e for e in report.events if e.op.startswith("Tensor.__")]
    assert {e.op for e in index_events} == {"Tensor.__getitem__", "Tensor.__setitem__"}


def test_python_list_indices_on_the_host_or_plain_indices_cross_nothing() -> None:
    host = torch.zeros(6, 3)
    device = torch.zeros(6, 3, device=META)
    with torchplace.guard("raise"):
        host[[0, 2]]
        host[[0, 2]] = 1.0
        device[1:3, None, ...]
        device[np.int64(1)]
        device[:, torch.tensor(1)]  # a CPU 0-dim index is read as a number on the host


def test_raise_mode_stops_a_list_index_at_its_line() -> None:
    x = torch.zeros(4, device=META)
    guard = torchplace.guard("raise")
    with pytest.raises(GuardViolation, match="H2D copy of 16 bytes") as caught, guard:
        x[[0, 1]]  # raise-list
    assert f"{line('raise-list')}" in str(caught.value)


# ---------------------------------------------------------------------- jagged nested tensors


def _jagged() -> torch.Tensor:
    return torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)], layout=torch.jagged)


def test_building_a_jagged_nested_tensor_is_no_mixed_device_op() -> None:
    # torch passes a dummy nested tensor on meta and CPU tensors whose shapes hold the
    # min/max sequence lengths to its view op: none of them is an operand
    with torchplace.guard("raise") as report:
        nt = _jagged()
        nt.sin()
        nt.to(torch.float64)
    assert report.events == []


def test_moving_a_jagged_nested_tensor_sends_its_values_and_offsets() -> None:
    nt = _jagged()
    bare = nt.to(META)
    with torchplace.guard() as report:
        moved = nt.to(META)  # nt-to
    assert (moved.device, moved.shape[0], moved.values().shape) == (
        bare.device,
        bare.shape[0],
        bare.values().shape,
    )
    # 6 x 3 float32 values and 3 int64 offsets
    assert _rows(report) == [
        ("h2d", line("nt-to"), 1, 6 * 3 * 4 + 3 * 8),
        ("sync", line("nt-to"), 1, 0),
    ]


def test_a_transformer_encoders_padding_mask_fast_path_syncs_at_the_forward() -> None:
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)
    encoder = encoder.to(META).eval()
    x = torch.zeros(2, 5, 8, device=META)
    mask = torch.zeros(2, 5, dtype=torch.bool, device=META)
    with torchplace.guard() as report, torch.no_grad():
        # meta has no kernel for the check: torch stops there, after the guard recorded it (on
        # CUDA the encoder goes on, on its regular path: torch turns the rest of the fast path,
        # and its _nested_tensor_from_mask, off while a torch-function mode is active)
        attempt(lambda: encoder(x, src_key_padding_mask=mask))  # encoder-mask
        attempt(lambda: torch._nested_tensor_from_mask(x, mask.logical_not()))  # from-mask
    assert [(e.op, e.site.lineno) for e in report.syncs] == [
        ("aten._nested_tensor_from_mask_left_aligned", line("encoder-mask")),
        ("aten._nested_tensor_from_mask", line("from-mask")),
    ]


def test_the_cpu_sizes_a_nested_tensor_is_made_from_are_no_mixed_device_op() -> None:
    padded = torch.zeros(2, 3, 4, device=META)
    sizes = torch.tensor([[3, 4], [2, 4]])  # torch takes them on the CPU
    with torchplace.guard("raise") as report, pytest.raises(NotImplementedError):
        torch._nested_from_padded(padded, sizes)  # meta has no kernel for it
    assert report.events == []


# ----------------------------------------------------- a device tensor given as a number


_SCALAR_CALLS: list[tuple[str, Callable[[torch.Tensor, torch.Tensor], object]]] = [
    ("full_like", lambda x, v: torch.full_like(x, v)),
    ("add alpha", lambda x, v: x.add(x, alpha=v)),
    ("torch.sub alpha", lambda x, v: torch.sub(x, x, alpha=v)),
    ("leaky_relu", lambda x, v: F.leaky_relu(x, v)),
    ("softplus beta", lambda x, v: F.softplus(x, beta=v)),
    ("elu", lambda x, v: F.elu(x, v)),
    ("pad value", lambda x, v: F.pad(x, (1, 1), value=v)),
    ("normalize p", lambda x, v: F.normalize(x, p=v)),
]


@pytest.mark.parametrize(("name", "call"), _SCALAR_CALLS)
def test_a_device_tensor_given_as_a_number_is_read_on_the_host(
    name: str, call: Callable[[torch.Tensor, torch.Tensor], object]
) -> None:
    x = torch.ones(2, 3, device=META)
    value = torch.ones((), device=META)
    with MetaReadback(), torchplace.guard() as report:
        call(x, value)
    assert [(e.kind, e.op) for e in report.events] == [("sync", "aten._local_scalar_dense")]


@pytest.mark.parametrize(("name", "call"), _SCALAR_CALLS)
def test_a_number_or_a_cpu_scalar_given_as_a_number_is_no_sync(
    name: str, call: Callable[[torch.Tensor, torch.Tensor], object]
) -> None:
    x = torch.ones(2, 3, device=META)
    with torchplace.guard("raise"):
        call(x, torch.tensor(0.5))
        call(x, 0.5)  # type: ignore[arg-type]


def test_hardtanh_with_a_device_bound_compares_it_then_reads_it() -> None:
    x = torch.ones(3, device=META)
    low = torch.zeros((), device=META)
    with MetaReadback(), torchplace.guard() as report:
        F.hardtanh(x, min_val=low)  # hardtanh-line
    # F.hardtanh checks min_val > max_val in Python (a bool), then torch reads min_val
    assert _rows(report) == [("sync", line("hardtanh-line"), 2, 0)]


def test_operands_that_are_tensors_in_some_overload_stay_on_the_fast_path() -> None:
    x = torch.ones(3, device=META)
    m = x.max()
    with torchplace.guard("raise"):
        x.clamp(min=m)
        x.mul(m)
        x.add(m)
        x.fill_(m)  # same device: a device-side copy


# --------------------------------------------------------------- NumPy and refusing composites


def test_numpy_asarray_of_a_device_tensor_is_recorded_before_torch_refuses_it() -> None:
    t = torch.ones(3, device=META)
    with torchplace.guard() as report, pytest.raises(TypeError, match="numpy"):
        np.asarray(t)  # asarray-line
    assert [(e.op, e.site.lineno) for e in report.syncs] == [
        ("Tensor.__array__", line("asarray-line"))
    ]
    with torchplace.guard("raise"):
        np.asarray(torch.ones(3))  # host memory: nothing to wait for


def test_a_composite_that_refuses_operands_on_two_devices_itself_is_a_mixed_device_op() -> None:
    x = torch.ones(5, device=META)
    q = torch.tensor([0.5, 0.9])
    with torchplace.guard() as report, pytest.raises(RuntimeError, match="same device"):
        torch.quantile(x, q)  # quantile-line
    (event,) = report.mixed_device_ops
    assert (event.op, event.site.lineno) == ("torch.quantile", line("quantile-line"))
    assert [o.device for o in event.operands] == ["meta", "cpu"]
    operand = "q: shape=\\(2,\\) dtype=float32 device=cpu"
    with pytest.raises(GuardViolation, match=operand), torchplace.guard("raise"):
        torch.quantile(x, q)


# --------------------------------------------- training code: syncs torch makes for the user


def test_optimizer_scheduler_and_module_syncs_land_on_the_users_line() -> None:
    model = nn.Linear(4, 1).to(META)
    x, y = torch.zeros(8, 4, device=META), torch.zeros(8, 1, device=META)
    lbfgs = torch.optim.LBFGS(model.parameters(), max_iter=2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(sgd)
    norm = nn.BatchNorm1d(4, momentum=None).to(META)

    def closure() -> torch.Tensor:
        lbfgs.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    with MetaReadback(), torchplace.guard() as report:
        lbfgs.step(closure)  # lbfgs-step
        loss = F.mse_loss(model(x), y)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # no sync
        torch.nn.utils.clip_grad_norm_(  # clip-nonfinite
            model.parameters(), 1.0, error_if_nonfinite=True
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # float() of a tensor that requires grad
            plateau.step(loss)  # plateau-step
        with contextlib.suppress(ZeroDivisionError):  # meta reads the count back as 0
            norm(x)  # batchnorm-cumulative
    lines = {(e.site.lineno, e.op) for e in report.syncs}
    assert {n for n, _ in lines} == {
        line("lbfgs-step"),
        line("clip-nonfinite"),
        line("plateau-step"),
        line("batchnorm-cumulative"),
    }
    assert (line("clip-nonfinite"), "Tensor.__bool__") in lines
    assert (line("plateau-step"), "Tensor.__float__") in lines
    assert (line("batchnorm-cumulative"), "Tensor.__float__") in lines
    assert report.transfers == []


def test_averaged_models_host_counter_is_copied_over_at_each_update() -> None:
    model = nn.Linear(3, 2).to(META)
    with MetaReadback(), torchplace.guard() as report:
        averaged = torch.optim.swa_utils.AveragedModel(model)
        averaged.update_parameters(model)  # first: copies the parameters on the device
        averaged.update_parameters(model)  # swa-update
    # n_averaged is a CPU buffer (the model was moved before it was wrapped): each average
    # copies it to the parameters' device
    assert _rows(report) == [
        ("h2d", line("swa-update"), 1, 8),
        ("sync", line("swa-update"), 1, 0),
    ]
