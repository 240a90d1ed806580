"""Sync detection: host reads, printing, data-dependent sizes and explicit synchronization.
``meta`` stands in for the accelerator."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchplace

from .fakes import META, MetaReadback, line_of

HERE = __file__


def line(marker: str) -> int:
    return line_of(HERE, marker)


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("Tensor.item", lambda t: t.sum().item()),
        ("Tensor.__bool__", lambda t: bool(t.sum())),
        ("Tensor.__int__", lambda t: int(t.sum())),
        ("Tensor.__float__", lambda t: float(t.sum())),
        ("Tensor.tolist", lambda t: t.tolist()),
    ],
)
def test_host_reads_of_device_values_are_one_sync_each(name: str, call: object) -> None:
    t = torch.ones(2, 3, device=META)
    with MetaReadback(), torchplace.guard() as report:
        call(t)  # type: ignore[operator]
    assert [e.op for e in report.syncs] == [name]  # seen at both layers, counted once


def test_if_tensor_is_a_sync() -> None:
    t = torch.ones(1, device=META)
    with MetaReadback(), torchplace.guard() as report:
        if t:  # if-line
            pass
    (sync,) = report.syncs
    assert (sync.op, sync.site.lineno) == ("Tensor.__bool__", line("if-line"))


def test_tolist_also_moves_its_bytes_device_to_host() -> None:
    t = torch.ones(10, device=META, dtype=torch.float64)
    with MetaReadback(), torchplace.guard() as report:
        assert t.tolist() == [0.0] * 10
    assert len(report.syncs) == 1
    assert (report.d2h, report.d2h_bytes) == (1, 80)


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("Tensor.__repr__", lambda t: print(t)),
        ("Tensor.__repr__", lambda t: str(t)),
        ("Tensor.__repr__", lambda t: repr(t)),
        ("Tensor.__format__", lambda t: f"{t}"),
        ("Tensor.__format__", lambda t: f"{t.sum()}"),  # meta refuses a spec such as :.3f
    ],
)
def test_printing_a_device_tensor_is_one_sync(
    name: str, call: Callable[[torch.Tensor], object], capsys: pytest.CaptureFixture[str]
) -> None:
    # torch's printing code disables dispatch modes, so the many reads it makes on a real
    # device are invisible below the function layer: the print itself is the sync
    t = torch.ones(2, 3, device=META)
    with MetaReadback(), torchplace.guard() as report:
        call(t)
    assert [(e.op, e.detail) for e in report.syncs] == [
        (name, "printing a device tensor reads its values on the host")
    ]
    capsys.readouterr()


def test_printing_host_or_empty_tensors_is_no_sync(capsys: pytest.CaptureFixture[str]) -> None:
    with MetaReadback(), torchplace.guard() as report:
        print(torch.ones(3), f"{torch.ones(())}")
        print(torch.ones(0, device=META))  # nothing to read
        assert torch.ones(0, device=META).tolist() == []
    assert report.syncs == []
    capsys.readouterr()


def test_numpy_of_a_device_tensor_is_recorded_before_torch_refuses_it() -> None:
    t = torch.ones(3, device=META)
    with torchplace.guard() as report, pytest.raises(TypeError, match="numpy"):
        t.numpy()
    assert [e.op for e in report.syncs] == ["Tensor.numpy"]


@pytest.mark.parametrize(
    ("op", "call"),
    [
        ("aten.nonzero", lambda t: t.nonzero()),
        ("aten.nonzero", lambda t: torch.nonzero(t)),
        ("aten.index.Tensor", lambda t: t[t > 0]),
        ("aten.masked_select", lambda t: torch.masked_select(t, t > 0)),
        ("aten.equal", lambda t: torch.equal(t, t)),
    ],
)
def test_data_dependent_shapes_are_syncs(op: str, call: object) -> None:
    t = torch.ones(4, 2, device=META)
    with MetaReadback(), torchplace.guard() as report:
        call(t)  # type: ignore[operator]
    assert [e.op for e in report.syncs] == [op]


@pytest.mark.parametrize(
    ("op", "call"),
    [
        ("aten._linalg_check_errors", lambda a: torch.linalg.inv(a)),
        ("aten._linalg_check_errors", lambda a: torch.inverse(a)),
        ("aten._linalg_check_errors", lambda a: torch.linalg.solve(a, a)),
        ("aten._linalg_check_errors", lambda a: torch.linalg.cholesky(a)),
        ("aten.linalg_inv_ex", lambda a: torch.linalg.inv_ex(a, check_errors=True)),
        ("aten.linalg_lu_factor_ex", lambda a: torch.linalg.lu_factor_ex(a, check_errors=True)),
        ("aten._linalg_check_errors", lambda a: torch.linalg.lu_factor(a)),
        ("aten.linalg_eig", lambda a: torch.linalg.eigvals(a)),
        ("aten._linalg_eigh", lambda a: torch.linalg.eigh(a)),
        ("aten._linalg_eigh", lambda a: torch.linalg.eigvalsh(a)),
        ("aten._linalg_svd", lambda a: torch.linalg.svdvals(a)),
        ("aten._linalg_svd", lambda a: torch.linalg.matrix_rank(a)),
        ("aten.linalg_pinv.atol_rtol_tensor", lambda a: torch.linalg.pinv(a)),
    ],
)
def test_linalg_solvers_that_read_their_error_codes_are_syncs(op: str, call: object) -> None:
    a = torch.eye(3, device=META)
    with MetaReadback(), torchplace.guard() as report:
        call(a)  # type: ignore[operator]
    assert [e.op for e in report.syncs] == [op]
    assert "*_ex" in report.syncs[0].detail


@pytest.mark.parametrize(
    "call",
    [
        lambda a: torch.linalg.inv_ex(a),
        lambda a: torch.linalg.cholesky_ex(a),
        lambda a: torch.linalg.solve_ex(a, a),
        lambda a: torch.linalg.det(a),
        lambda a: torch.linalg.qr(a),
        lambda a: torch.linalg.inv(torch.eye(3)),
    ],
)
def test_linalg_without_an_error_check_or_on_the_host_is_no_sync(call: object) -> None:
    a = torch.eye(3, device=META)
    with MetaReadback(), torchplace.guard() as report:
        call(a)  # type: ignore[operator]
    assert report.syncs == []


def test_allclose_is_a_sync_recorded_before_meta_refuses_it() -> None:
    t = torch.ones(3, device=META)
    with torchplace.guard() as report, pytest.raises(RuntimeError, match="meta"):
        torch.allclose(t, t)
    assert [e.op for e in report.syncs] == ["aten.allclose"]


@pytest.mark.parametrize(
    ("call", "syncs"),
    [
        (lambda t: torch.histc(t, bins=4), 1),
        (lambda t: t.histc(4, min=2, max=2), 1),
        (lambda t: torch.histc(t, 4, 0, 1), 0),
        (lambda t: torch.histc(t, bins=4, max=1.0), 0),
        (lambda t: torch.histc(t[:0], bins=4), 0),
    ],
)
def test_histc_syncs_only_to_find_its_own_range(call: object, syncs: int) -> None:
    t = torch.ones(8, device=META)
    with torchplace.guard() as report:
        call(t)  # type: ignore[operator]
    assert len(report.syncs) == syncs


@pytest.mark.parametrize(
    ("call", "syncs"),
    [
        (lambda m, s: torch.normal(m, s), 1),
        (lambda m, s: torch.normal(0.0, s), 1),
        (lambda m, s: torch.normal(m, 1.0), 0),
        (lambda m, s: torch.normal(0.0, 1.0, size=(3,), device=m.device), 0),
        (lambda m, s: torch.empty_like(m).normal_(0.0, 1.0), 0),
        (lambda m, s: torch.normal(m, torch.ones(3)), 0),  # a host std: mixed, no sync
    ],
)
def test_normal_with_a_device_std_checks_it_on_the_host(call: object, syncs: int) -> None:
    mean, std = torch.zeros(3, device=META), torch.ones(3, device=META)
    with torchplace.guard() as report, contextlib.suppress(RuntimeError):
        call(mean, std)  # type: ignore[operator]
    assert len(report.syncs) == syncs


@pytest.mark.parametrize(
    ("op", "call"),
    [
        ("aten.equal", lambda a, b: torch.equal(a, b)),
        ("aten._linalg_solve_ex", lambda a, b: torch.linalg.solve(a, b)),
    ],
)
def test_a_syncing_op_on_two_devices_is_also_a_mixed_device_op(op: str, call: object) -> None:
    a, b = torch.eye(3, device=META), torch.eye(3)
    with MetaReadback(), torchplace.guard() as report, contextlib.suppress(RuntimeError):
        call(a, b)  # type: ignore[operator]
    assert [e.op for e in report.mixed_device_ops] == [op]


def test_cuda_synchronize_is_recorded_even_where_it_cannot_run() -> None:
    # a CPU-only build cannot synchronize; the call is still made, and recorded first
    with torchplace.guard() as report, contextlib.suppress(AssertionError, RuntimeError):
        torch.cuda.synchronize()  # sync-line
    (sync,) = report.syncs
    assert (sync.op, sync.site.lineno) == ("torch.cuda.synchronize", line("sync-line"))
    assert getattr(torch.cuda.synchronize, "__torchplace_original__", None) is None  # unwrapped


def test_storage_copies_are_recorded_once_each_at_the_users_line() -> None:
    # what torch.save (storage.cpu()) and torch.load(map_location=...) do to device tensors:
    # copies between storages, which call no torch function
    host = torch.arange(4, dtype=torch.float32).untyped_storage()
    with torchplace.guard() as outer:
        with torchplace.guard() as inner:
            torch.UntypedStorage(16, device=META).copy_(host)  # storage-h2d
        on_device = torch.ones(4, device=META).untyped_storage()
        with contextlib.suppress(NotImplementedError):  # meta holds no data to copy back
            on_device.cpu()  # storage-d2h
    assert [(e.kind, e.nbytes, e.site.lineno) for e in inner.events] == [
        ("h2d", 16, line("storage-h2d")),
        ("sync", 0, line("storage-h2d")),
    ]
    assert [(e.kind, e.nbytes, e.site.lineno) for e in outer.events] == [
        ("h2d", 16, line("storage-h2d")),
        ("sync", 0, line("storage-h2d")),
        ("d2h", 16, line("storage-d2h")),
        ("sync", 0, line("storage-d2h")),
    ]
    assert "copy_" not in vars(torch.UntypedStorage)  # unwrapped again


def _kernel_read_calls() -> list[tuple[str, Callable[[torch.Tensor], object]]]:
    """Ops whose kernel reads device data on the host, out of any dispatch mode's sight."""
    return [
        ("aten.masked_fill.Tensor", lambda t: t.masked_fill(t > 0, t.sum())),
        ("aten.masked_fill_.Tensor", lambda t: t.clone().masked_fill_(t > 0, t.sum())),
        ("aten.index_fill.int_Tensor", lambda t: t.index_fill(0, t[0].long(), t.sum())),
        ("aten.index_fill_.int_Tensor", lambda t: t.clone().index_fill_(0, t[0].long(), t.sum())),
        ("aten.linspace.Tensor_Tensor", lambda t: torch.linspace(t.sum(), t.sum(), 5)),
        ("aten.logspace.Scalar_Tensor", lambda t: torch.logspace(0.0, t.sum(), 5)),
        ("aten.isin.Tensor_Tensor", lambda t: torch.isin(t, torch.ones(100, device=META))),
        ("aten.isin.Scalar_Tensor", lambda t: torch.isin(1.0, torch.ones(10, device=META))),
        ("aten.linalg_matrix_exp", lambda t: torch.linalg.matrix_exp(t[:2, :2])),
        ("aten.cholesky_inverse", lambda t: torch.cholesky_inverse(t[:2, :2])),
    ]


@pytest.mark.parametrize(("op", "call"), _kernel_read_calls())
def test_ops_whose_kernel_reads_device_data_are_syncs(op: str, call: object) -> None:
    t = torch.ones(4, 2, device=META)
    with MetaReadback(), torchplace.guard() as report:
        call(t)  # type: ignore[operator]
    assert [e.op for e in report.syncs] == [op]


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.masked_fill(t > 0, 1.0),
        lambda t: t.clone().masked_fill_(t > 0, -1.0),
        lambda t: t.index_fill(0, t[0].long(), 1.0),
        lambda t: torch.linspace(0, 1, 5, device=META),
        lambda t: torch.linspace(torch.tensor(0.0), torch.tensor(1.0), 5),  # host ends
        lambda t: torch.isin(t, torch.ones(3, device=META)),  # compared pairwise on the device
        lambda t: torch.isin(t, torch.ones(100, device=META), assume_unique=True),
        lambda t: torch.isin(1.0, torch.ones(9, device=META)),
        lambda t: torch.isin(t, 1.0),
        lambda t: torch.linalg.matrix_exp(t[:1, :1]),  # a 1x1 matrix is exp()
        lambda t: torch.linalg.matrix_exp(torch.eye(3)),
    ],
)
def test_look_alikes_of_kernel_reads_are_no_sync(call: object) -> None:
    t = torch.ones(4, 2, device=META)
    with MetaReadback(), torchplace.guard() as report:
        call(t)  # type: ignore[operator]
    assert report.syncs == []


@pytest.mark.parametrize(
    ("op", "call"),
    [
        ("aten._to_sparse", lambda t: t.to_sparse()),
        ("aten._to_sparse_csr", lambda t: t.to_sparse_csr()),
        ("aten._to_sparse_bsr", lambda t: t.to_sparse_bsr((2, 2))),
    ],
)
def test_a_dense_device_tensor_made_sparse_is_a_sync(op: str, call: object) -> None:
    t = torch.ones(4, 2, device=META)
    # meta has no sparse kernels: the sync is recorded before torch refuses the call
    with torchplace.guard() as report, pytest.raises(NotImplementedError, match="Meta"):
        call(t)  # type: ignore[operator]
    assert [e.op for e in report.syncs] == [op]


def test_ctc_loss_copies_its_lengths_to_the_device_with_blocking_copies() -> None:
    log_probs = torch.randn(10, 2, 5, device=META)
    targets = torch.ones(2, 4, dtype=torch.long, device=META)
    with MetaReadback(), torchplace.guard() as report:
        torch.nn.functional.ctc_loss(log_probs, targets, [10, 10], [4, 3], reduction="sum")
    assert [e.op for e in report.syncs] == ["aten._ctc_loss"]
    on_host = torch.randn(10, 2, 5), torch.ones(2, 4, dtype=torch.long)
    with torchplace.guard() as report:
        torch.nn.functional.ctc_loss(*on_host, [10, 10], [4, 3], reduction="sum")
    assert report.syncs == []


@pytest.mark.parametrize(
    ("call", "syncs"),
    [
        (lambda x, y, w: F.cross_entropy(x, y, weight=w, label_smoothing=0.1), 1),
        (lambda x, y, w: F.cross_entropy(x, y, w, None, -100, None, "mean", 0.2), 1),
        (lambda x, y, w: nn.CrossEntropyLoss(weight=w, label_smoothing=0.1)(x, y), 1),
        (
            lambda x, y, w: F.cross_entropy(x, y, weight=w, size_average=True, label_smoothing=0.1),
            1,
        ),
        # look-alikes: no weight, another reduction, no smoothing, probabilities as targets
        (lambda x, y, w: F.cross_entropy(x, y, label_smoothing=0.1), 0),
        (lambda x, y, w: F.cross_entropy(x, y, weight=w, label_smoothing=0.1, reduction="sum"), 0),
        (lambda x, y, w: F.cross_entropy(x, y, weight=w, reduce=False, label_smoothing=0.1), 0),
        (lambda x, y, w: F.cross_entropy(x, y, weight=w), 0),
        (lambda x, y, w: F.cross_entropy(x, x.softmax(1), weight=w, label_smoothing=0.1), 0),
        (lambda x, y, w: F.cross_entropy(x[:0], y[:0], weight=w, label_smoothing=0.1), 0),
    ],
)
@pytest.mark.filterwarnings("ignore:size_average and reduce args will be deprecated")
def test_smoothed_weighted_cross_entropy_is_a_sync_hidden_from_dispatch_modes(
    call: object, syncs: int
) -> None:
    # torch's masked_select path runs only while no dispatch mode is active, so the guard
    # records it from the arguments
    x, y, w = torch.randn(4, 3), torch.zeros(4, dtype=torch.long), torch.ones(3)
    with torchplace.guard() as report:
        call(x, y, w)  # type: ignore[operator]
    assert report.syncs == []  # on the host: nothing to wait for
    x, y, w = x.to(META), y.to(META), w.to(META)
    with MetaReadback(), torchplace.guard() as report:
        call(x, y, w)  # type: ignore[operator]
    assert [e.op for e in report.syncs] == ["F.cross_entropy"] * syncs
    assert all("masked_select" in e.detail for e in report.syncs)
