"""The guard against a third round of real code: custom ops (``torch.library``), a one-process
gloo group, ``torch.autograd.Function`` with non-tensor outputs, module and state-dict hooks,
``torch.func.functional_call``, packed sequences, FFTs, ``einsum``/``cdist``, stable sorts,
``scatter_reduce``/``index_put_``, ``histc``, ``searchsorted``, CPU scalars and host-data
factories inside ``forward``, ``default_collate`` of device tensors and ``torch.compile`` with
``fullgraph=True``.

``meta`` stands in for the accelerator; :class:`MetaReadback` makes up the data a real device
would hand back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import default_collate

import torchplace
from torchplace.sanitizer import GuardReport

from .fakes import META, MetaReadback, attempt, line_of, site_rows

HERE = __file__


def line(marker: str) -> int:
    return line_of(HERE, marker)


def _rows(report: GuardReport) -> list[tuple[str, int, int, int]]:
    return site_rows(report, HERE)


# ----------------------------------------------------------------------------- custom ops

_LIB = torch.library.Library("torchplace_rc3", "DEF")
_LIB.define("shift(Tensor x) -> Tensor")


def _shift_kernel(x: torch.Tensor) -> torch.Tensor:
    return x + torch.ones(x.shape).to(x.device)  # lib-kernel-copy


_LIB.impl("shift", _shift_kernel, "Meta")


def _bump_kernel(x: torch.Tensor) -> torch.Tensor:
    return x + torch.tensor([1.0, 2.0, 3.0, 4.0], device=x.device)  # custom-op-factory


def _custom_op_on_meta() -> Any:
    """``custom_op`` with a kernel for ``meta``, or why this torch refuses one (torch 2.11
    keeps the Meta key for the op's fake implementation: "already a kernel registered")."""
    try:
        return torch.library.custom_op(
            "torchplace_rc3::bump", mutates_args=(), device_types="meta"
        )(_bump_kernel)
    except RuntimeError as exc:
        return f"torch {torch.__version__} cannot give a custom_op a meta kernel: {exc}"


_BUMP = _custom_op_on_meta()


@torch.library.custom_op("torchplace_rc3::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_the_copies_inside_a_library_kernel_are_found_at_the_kernels_line() -> None:
    x = torch.zeros(4, device=META)
    with torchplace.guard() as report:
        torch.ops.torchplace_rc3.shift(x)
    assert _rows(report) == [
        ("h2d", line("lib-kernel-copy"), 1, 16),
        ("sync", line("lib-kernel-copy"), 1, 0),
    ]


def test_the_copies_inside_a_custom_ops_python_kernel_are_found_at_the_kernels_line() -> None:
    if isinstance(_BUMP, str):
        pytest.skip(_BUMP)
    x = torch.zeros(4, device=META)
    with torchplace.guard() as report:
        _BUMP(x)
    assert _rows(report) == [
        ("h2d", line("custom-op-factory"), 1, 16),
        ("sync", line("custom-op-factory"), 1, 0),
    ]


def test_nested_guards_both_see_a_custom_ops_kernel() -> None:
    x = torch.zeros(4, device=META)
    with torchplace.guard() as outer, torchplace.guard() as inner:
        torch.ops.torchplace_rc3.shift(x)
    expected = [("h2d", line("lib-kernel-copy"), 1, 16), ("sync", line("lib-kernel-copy"), 1, 0)]
    assert _rows(inner) == _rows(outer) == expected


def test_pure_custom_ops_and_custom_ops_under_another_mode_record_nothing_and_still_run() -> None:
    cpu = torch.arange(4.0)
    with torchplace.guard() as report:
        doubled = _twice(cpu)
        shifted = torch.ops.torchplace_rc3.shift(torch.zeros(4, device=META))
    assert len(report) == 2  # the kernel's copy and its sync
    assert doubled.tolist() == [0.0, 2.0, 4.0, 6.0]
    assert shifted.device == META
    # a tracer (an infra mode) still records the op, not its kernel
    from torch.fx.experimental.proxy_tensor import make_fx

    with torchplace.guard() as report:
        traced = make_fx(lambda t: _twice(t) + 1)(cpu)
    assert "torchplace_rc3.twice" in traced.code
    assert len(report) == 0
    # another dispatch mode below the guard keeps its turn: the op reaches it unchanged
    with MetaReadback(), torchplace.guard() as report:
        out = _twice(torch.zeros(4, device=META))
    assert out.device == META
    assert len(report) == 0


# ------------------------------------------------------------------- distributed on one CPU


def test_a_one_process_gloo_group_and_object_collectives_cross_nothing() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = torch.ones(4)
        with torchplace.guard() as report:
            dist.all_reduce(t)
            dist.broadcast(t, 0)
            gathered: list[object] = [None]
            dist.all_gather_object(gathered, {"step": 1})
            model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
            model(torch.randn(3, 4)).sum().backward()
        assert len(report) == 0
        assert gathered == [{"step": 1}]
        assert t.tolist() == [1.0] * 4
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------ autograd functions and hooks


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, k: float) -> tuple[torch.Tensor, float]:  # type: ignore[override]
        ctx.save_for_backward(x)
        ctx.k = k
        return x * k, k

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _: object) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        return grad * ctx.k + x * 0, None


def test_an_autograd_function_with_a_non_tensor_output_crosses_nothing() -> None:
    x = torch.zeros(3, device=META, requires_grad=True)
    with MetaReadback(), torchplace.guard() as report:
        y, k = _Scale.apply(x, 2.0)
        y.sum().backward()
    assert len(report) == 0
    assert k == 2.0
    assert x.grad is not None
    assert x.grad.device == META


def test_module_hooks_and_state_dict_hooks_cross_nothing() -> None:
    model = nn.Linear(4, 4).to(META)
    seen: list[str] = []
    model.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    model.register_full_backward_hook(lambda mod, gin, gout: seen.append("backward"))
    model.register_load_state_dict_post_hook(lambda mod, keys: seen.append("loaded"))
    x = torch.zeros(2, 4, device=META, requires_grad=True)
    with MetaReadback(), torchplace.guard() as report:
        model(x).sum().backward()
        model.load_state_dict(model.state_dict())
    assert len(report) == 0
    assert seen == ["backward", "loaded"]


def test_functional_call_with_device_buffers_and_a_host_buffer() -> None:
    norm = nn.BatchNorm1d(4).to(META)
    state = {k: v.clone() for k, v in (*norm.named_parameters(), *norm.named_buffers())}
    x = torch.zeros(3, 4, device=META)
    with MetaReadback(), torchplace.guard() as report:
        torch.func.functional_call(norm, state, (x,))
        host = {**state, "running_mean": torch.zeros(4)}
        attempt(lambda: torch.func.functional_call(norm, host, (x,)))  # host-buffer
    assert [(e.kind, e.site.lineno) for e in report.events] == [
        ("mixed_device", line("host-buffer"))
    ]


# ------------------------------------------------------------------------ numeric programs


def test_packed_sequences_with_host_lengths_cross_nothing() -> None:
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence

    rnn = nn.GRU(3, 4, batch_first=True).to(META)
    seqs = [torch.zeros(n, 3, device=META) for n in (5, 3, 2)]
    with MetaReadback(), torchplace.guard() as report:
        padded = pad_sequence(seqs, batch_first=True)
        packed = pack_padded_sequence(padded, torch.tensor([5, 3, 2]), batch_first=True)
        out, _ = rnn(packed)
        unpacked, lengths = pad_packed_sequence(out, batch_first=True)
    assert len(report) == 0
    assert unpacked.shape == (3, 5, 4)
    assert lengths.device.type == "cpu"


def test_fft_einsum_cdist_sorts_and_scatters_on_the_device_cross_nothing() -> None:
    x = torch.zeros(8, 16, device=META)
    idx = torch.zeros(3, dtype=torch.long, device=META)
    src = torch.ones(3, device=META)
    with MetaReadback(), torchplace.guard() as report:
        torch.fft.irfft(torch.fft.rfft(x), n=16)
        torch.fft.fftshift(torch.fft.fft2(x))
        torch.einsum("ij,kj->ik", x, x)
        torch.cdist(x, x)
        torch.sort(x, stable=True)
        x.argsort(dim=1, stable=True)
        x.topk(3)
        torch.zeros(5, device=META).scatter_reduce(0, idx, src, reduce="amax", include_self=False)
        torch.zeros(5, device=META).index_put_((idx,), src, accumulate=True)
        torch.histc(x, bins=10, min=-3, max=3)
        torch.searchsorted(torch.zeros(10, device=META), src)
    assert len(report) == 0


def test_histc_without_a_range_syncs_and_a_host_sorter_is_a_mixed_device_op() -> None:
    x = torch.zeros(100, device=META)
    with MetaReadback(), torchplace.guard() as report:
        torch.histc(x, bins=10)  # histc-no-range
        attempt(lambda: torch.searchsorted(x, x[:4], sorter=torch.arange(100)))  # host-sorter
    assert [(e.kind, e.site.lineno) for e in report.events] == [
        ("sync", line("histc-no-range")),
        ("mixed_device", line("host-sorter")),
    ]


# ------------------------------------------------------------- host data inside a forward


def test_cpu_scalars_in_forward_are_fine_and_host_data_factories_are_copies() -> None:
    x = torch.zeros(3, device=META)
    data = np.ones((2, 3), dtype=np.float32)
    with MetaReadback(), torchplace.guard() as report:
        half = torch.tensor(0.5)
        torch.where(x > 0, x, half) * half + half
        torch.maximum(x, torch.tensor(0.0))
        x.new_tensor([1.0, 2.0, 3.0])  # new-tensor
        torch.as_tensor(data, device=META)  # as-tensor-numpy
        torch.from_numpy(data).to(META, non_blocking=True)  # non-blocking-pageable
    assert _rows(report) == sorted(
        [
            ("h2d", line("new-tensor"), 1, 12),
            ("sync", line("new-tensor"), 1, 0),
            ("h2d", line("as-tensor-numpy"), 1, 24),
            ("sync", line("as-tensor-numpy"), 1, 0),
            ("h2d", line("non-blocking-pageable"), 1, 24),
            ("pageable_non_blocking", line("non-blocking-pageable"), 1, 0),
        ]
    )


def test_default_collate_of_device_samples_stays_on_the_device() -> None:
    samples = [{"x": torch.zeros(3, device=META), "y": 1} for _ in range(4)]
    with MetaReadback(), torchplace.guard() as report:
        batch = default_collate(samples)
    assert len(report) == 0
    assert batch["x"].device == META
    assert batch["y"].device.type == "cpu"


def test_fullgraph_compile_of_a_syncing_function_fails_the_same_under_the_guard() -> None:
    @torch.compile(fullgraph=True, backend="eager")
    def positive_part(x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x

    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported):
        positive_part(torch.ones(4))
    torch._dynamo.reset()
    with torchplace.guard(), pytest.raises(torch._dynamo.exc.Unsupported):
        positive_part(torch.ones(4))
    torch._dynamo.reset()


# ------------------------------------------------------- device counts given as an int


def _roll_takes_a_tensor_shift() -> bool:
    """Whether torch.roll takes a 0-d tensor as its shifts (torch 2.9 reads one as no shifts
    at all, and raises "`shifts` required", on the CPU too; 2.13 takes it as its value)."""
    try:
        torch.roll(torch.zeros(2), torch.tensor(1))
    except RuntimeError:
        return False
    return True


def test_a_device_count_given_as_k_shifts_chunks_or_diagonal_is_read_on_the_host() -> None:
    x = torch.zeros(4, 8, device=META)
    k = torch.tensor(3, device=META)  # e.g. mask.sum(): still on the device
    roll = _roll_takes_a_tensor_shift()
    with MetaReadback(), torchplace.guard() as report:
        x.topk(k)  # topk-k
        if roll:
            torch.roll(x, k)  # roll-shifts
        x.tril(k)  # tril-diagonal
        attempt(lambda: x.chunk(k))  # chunk-chunks
        attempt(lambda: torch.split(x, k, 1))  # split-size
    assert [(e.kind, e.site.lineno) for e in report.events] == [
        ("sync", line("topk-k")),
        *([("sync", line("roll-shifts"))] if roll else []),
        ("sync", line("tril-diagonal")),
        ("sync", line("chunk-chunks")),
        ("sync", line("split-size")),
    ]
    with MetaReadback(), torchplace.guard() as report:
        x.topk(3)
        if roll:
            torch.roll(x, torch.tensor(2))
        x.chunk(2)
        torch.split(x, 4, 1)
        x.triu(1)
    assert len(report) == 0


def test_cudnn_ctc_targets_on_the_host_are_no_mixed_device_op() -> None:
    # torch hands cuDNN's (and MIOpen's) CTC the targets on the CPU beside device log-probs;
    # meta has no kernel for the check, so the call fails after the guard has looked at it
    log_probs = torch.randn(10, 2, 5, device=META).log_softmax(2)
    targets = torch.randint(1, 5, (2, 4))
    with torchplace.guard() as report, pytest.raises(NotImplementedError):
        torch._use_cudnn_ctc_loss(log_probs, targets, [10, 10], [4, 3], 0)
    assert report.mixed_device_ops == []
    # a look-alike that mixes devices: still reported
    with torchplace.guard() as report, pytest.raises((NotImplementedError, RuntimeError)):
        torch.add(log_probs, torch.ones(10, 2, 5))
    assert [e.op for e in report.mixed_device_ops] != []
