"""The guard against code written the way real projects write it: training loops, hooks, custom
autograd functions, subclasses, generators, thread pools, sparse tensors, ``torch.func``, NumPy
interop, and hostile arguments to the guard's own API and command line.

Each test pins what the guard records for the pattern (or that it records nothing and leaves no
state behind). ``meta`` stands in for the accelerator; :class:`MetaReadback` makes up the data a
real device would hand back.
"""

from __future__ import annotations

import contextlib
import copy
import io
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import torchplace
from torchplace.errors import ConfigError, GuardViolation
from torchplace.sanitizer import GuardReport
from torchplace.sanitizer import syncs as sync_module

from .fakes import META, MetaReadback, attempt, line_of

HERE = __file__


def line(marker: str) -> int:
    return line_of(HERE, marker)


def _global_state() -> tuple[object, ...]:
    """Everything a guard changes while active and must restore when it exits."""
    return (
        len(_get_current_function_mode_stack()),
        len(_get_current_dispatch_mode_stack()),
        "copy_" in vars(torch.UntypedStorage),
        getattr(torch.cuda.synchronize, "__torchplace_original__", None),
        sync_module._patch_users,
        len(sync_module.active_guards()),
        threading.getprofile(),
        torch._C._is_torch_function_enabled(),
    )


@pytest.fixture(autouse=True)
def _no_state_left_behind() -> Iterator[None]:
    before = _global_state()
    yield
    assert _global_state() == before, "a guard left modes, wrappers or hooks behind"


def _rows(report: GuardReport) -> list[tuple[str, int, int, int]]:
    """``(kind, line, count, bytes)`` for each (line, kind) of this file, in report order."""
    return [
        (row.kind, row.site.lineno, row.count, row.nbytes)
        for row in report.by_site()
        if row.site.filename == HERE
    ]


# ------------------------------------------------------------------------ a training loop


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 8, generator=gen), torch.randint(0, 2, (4,), generator=gen))] * n


def test_a_training_loop_reports_its_per_step_item_and_nothing_from_clip_or_step() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    losses = []
    with MetaReadback(), torchplace.guard() as report:
        model = model.to(META)  # model-to
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for x, y in _batches(3):
            x, y = x.to(META, non_blocking=True), y.to(META, non_blocking=True)  # batch-to
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())  # loss-item
        summary = f"{loss}"  # loss-print
    assert len(losses) == 3
    assert summary
    assert sorted(_rows(report)) == sorted(
        [
            ("h2d", line("model-to"), 4, (8 * 16 + 16 + 16 * 2 + 2) * 4),
            ("sync", line("model-to"), 4, 0),  # one blocking copy per parameter
            ("h2d", line("batch-to"), 6, 3 * (4 * 8 * 4 + 4 * 8)),
            ("pageable_non_blocking", line("batch-to"), 6, 0),
            ("sync", line("loss-item"), 3, 0),
            ("sync", line("loss-print"), 1, 0),
        ]
    )


def test_a_cpu_training_loop_with_autocast_and_a_grad_scaler_records_nothing_and_is_unchanged() -> (
    None
):
    def train() -> tuple[list[float], list[torch.Tensor]]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        scaler = torch.amp.GradScaler("cpu")
        losses = []
        for x, y in _batches(3):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            losses.append(loss.item())
            assert bool(loss > 0)
            assert loss.tolist() == losses[-1]
            assert f"{loss:.3f}"
        return losses, [p.detach().clone() for p in model.parameters()]

    bare = train()
    with torchplace.guard("raise") as report:
        guarded = train()
    assert report.events == []
    assert bare[0] == guarded[0]
    assert all(torch.equal(a, b) for a, b in zip(bare[1], guarded[1], strict=True))


# ------------------------------------------------------------- hooks, autograd, views, modes


class _RoundTrip(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * x.cpu().to(grad.device)  # backward-round-trip


def test_a_round_trip_inside_a_custom_backward_is_found_at_its_line() -> None:
    x = torch.ones(3, device=META, requires_grad=True)
    with MetaReadback(), torchplace.guard() as report:
        _RoundTrip.apply(x).sum().backward()
    assert sorted(_rows(report)) == [
        ("d2h", line("backward-round-trip"), 1, 12),
        ("h2d", line("backward-round-trip"), 1, 12),
        ("sync", line("backward-round-trip"), 2, 0),
    ]


def test_hooks_that_move_their_inputs_are_found_in_the_hook() -> None:
    model = nn.Linear(3, 3).to(META)
    model.register_forward_pre_hook(lambda m, args: tuple(a.to(META) for a in args))  # pre-hook
    model.register_forward_hook(lambda m, args, out: out.sum())
    model.weight.register_hook(lambda grad: grad * 2)
    with MetaReadback(), torchplace.guard() as report:
        model(torch.ones(2, 3)).sum().backward()
    assert _rows(report) == [
        ("h2d", line("pre-hook"), 1, 24),
        ("sync", line("pre-hook"), 1, 0),
    ]


def test_in_place_ops_and_views() -> None:
    x = torch.zeros(4, 4, device=META)
    with MetaReadback(), torchplace.guard() as report:
        x[1:3].add_(1)
        x.diagonal().fill_(3)
        x[0] = 1.0  # a Python scalar: a fill on the device
        x[:, 0] = torch.tensor(2.0)  # a CPU scalar: a fill too
        x[0] = torch.ones(4)  # view-copy
        x[x > 0]  # view-mask
        x.view(-1)[torch.tensor([0, 1])] = 5.0  # view-cpu-index
    assert sorted(_rows(report)) == [
        ("h2d", line("view-copy"), 1, 16),
        ("mixed_device", line("view-cpu-index"), 1, 0),
        ("sync", line("view-copy"), 1, 0),
        ("sync", line("view-mask"), 1, 0),
    ]


def test_no_grad_and_inference_mode_see_the_same_crossings() -> None:
    model = nn.Linear(4, 2).to(META)
    reports = []
    for context in (torch.no_grad, torch.inference_mode):
        with MetaReadback(), torchplace.guard() as report, context():
            scores = model(torch.randn(3, 4).to(META))
            scores[0, 0].item()
            scores.cpu()
        reports.append([(e.kind, e.nbytes) for e in report.events])
    assert (
        reports[0]
        == reports[1]
        == [
            ("h2d", 48),
            ("sync", 0),
            ("sync", 0),
            ("d2h", 24),
            ("sync", 0),
        ]
    )


# ---------------------------------------------------------------- nesting, generators, exits


def test_an_exception_inside_nested_guards_leaves_nothing_behind() -> None:
    def program() -> None:
        with torchplace.guard("raise"):
            torch.ones(2).to(META)

    outer = GuardReport()
    try:
        with torchplace.guard() as outer:
            try:
                program()
            except GuardViolation:
                raise KeyError("the program's own error") from None
    except KeyError:
        pass
    assert outer.h2d == 1


def _guarded_stream(n: int) -> Iterator[GuardReport | torch.Tensor]:
    with torchplace.guard() as report:
        yield report
        for _ in range(n):
            yield torch.ones(2).to(META)


def test_a_guard_in_a_generator_that_finishes_inside_another_guard_leaves_that_one_watching() -> (
    None
):
    # peek at a guarded stream, then drain it in a guarded block: the stream's guard exits
    # while the later one is still active (not in the order they were entered)
    stream = _guarded_stream(1)
    first = next(stream)
    assert isinstance(first, GuardReport)
    with torchplace.guard() as later:
        for _ in stream:
            pass
        torch.ones(3).to(META)  # after-the-stream
    assert first.h2d == 1
    assert later.h2d == 2
    assert later.filter("h2d")[-1].site.lineno == line("after-the-stream")


def test_thread_watching_guards_exited_out_of_order_restore_the_thread_hook() -> None:
    def copy_once() -> None:
        torch.ones(1).to(META)

    def run_thread() -> None:
        thread = threading.Thread(target=copy_once)
        thread.start()
        thread.join()

    def watching() -> Iterator[GuardReport]:
        with torchplace.guard(threads=True) as report:
            yield report

    first_stream, second_stream = watching(), watching()
    first, second = next(first_stream), next(second_stream)
    first_stream.close()  # exits before the guard entered after it
    run_thread()  # second is still watching new threads
    second_stream.close()
    assert (first.h2d, second.h2d) == (0, 1)
    assert threading.getprofile() is None


def test_an_abandoned_guarded_generator_exits_its_guard_when_collected() -> None:
    stream = _guarded_stream(3)
    report = next(stream)
    next(stream)
    del stream  # closed by the garbage collector, inside no other guard
    assert isinstance(report, GuardReport)
    assert report.h2d == 1


# ----------------------------------------------------------------------- threads


def test_a_pool_thread_that_outlives_the_guard_does_no_more_guard_work() -> None:
    entered = []
    from torchplace.sanitizer.dispatch_mode import DispatchLayer

    real_enter = DispatchLayer.__enter__

    def counting_enter(self: DispatchLayer) -> DispatchLayer:
        entered.append(threading.get_ident())
        return real_enter(self)  # type: ignore[no-any-return]

    with ThreadPoolExecutor(1) as pool:
        with torchplace.guard(threads=True) as report:
            pool.submit(lambda: torch.ones(2).to(META)).result()
        DispatchLayer.__enter__ = counting_enter  # type: ignore[method-assign]
        try:
            worker = pool.submit(threading.get_ident).result()
            pool.submit(lambda: torch.ones(2).to(META)).result()  # after the guard exited
        finally:
            DispatchLayer.__enter__ = real_enter  # type: ignore[method-assign]
    assert report.h2d == 1
    assert worker not in entered


# --------------------------------------------------------------------- subclasses and modes


class _Logged(torch.Tensor):
    """A tensor subclass with its own ``__torch_function__``, as tracing and quantization
    libraries write them."""

    @classmethod
    def __torch_function__(
        cls,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return super().__torch_function__(func, types, args, kwargs or {})


class _CallLog(TorchFunctionMode):
    """A user's own torch-function mode (a logger, a FLOP counter)."""

    def __torch_function__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return func(*args, **(kwargs or {}))


def test_crossings_through_a_tensor_subclass_are_at_the_users_line() -> None:
    x = torch.ones(3).as_subclass(_Logged)
    with MetaReadback(), torchplace.guard() as report:
        y = x.to(META)  # subclass-h2d
        y.cpu()  # subclass-d2h
    assert type(y) is _Logged
    assert {(e.kind, e.site.lineno) for e in report.events} == {
        ("h2d", line("subclass-h2d")),
        ("sync", line("subclass-h2d")),
        ("d2h", line("subclass-d2h")),
        ("sync", line("subclass-d2h")),
    }


def test_crossings_under_a_users_own_function_mode_are_at_the_users_line() -> None:
    with torchplace.guard() as report, _CallLog():
        torch.ones(3).to(META)  # mode-h2d
    assert {e.site.lineno for e in report.events} == {line("mode-h2d")}


def test_parameters_keep_their_type_and_their_copies_are_seen() -> None:
    with torchplace.guard() as report:
        moved = nn.Parameter(torch.ones(3)).to(META)
    assert isinstance(moved, torch.Tensor)
    assert (report.h2d, report.h2d_bytes) == (1, 12)


# ------------------------------------------------------------------ sparse, complex, scalars


def test_a_sparse_copy_moves_its_stored_elements_not_its_dense_size() -> None:
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[0, 7], [3, 9]]), torch.ones(2), (1000, 1000), check_invariants=True
    )
    with torchplace.guard() as report:
        sparse.to(META)
    # indices (2 x 2 int64) and values (2 float32), not 1000 x 1000 float32
    assert report.h2d_bytes == 2 * 2 * 8 + 2 * 4


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta:UserWarning")
def test_a_sparse_csr_copy_moves_its_stored_elements() -> None:
    csr = torch.eye(100).to_sparse_csr()
    with torchplace.guard() as report:
        csr.to(META)
    # crow_indices (101 int64), col_indices (100 int64) and values (100 float32)
    assert report.h2d_bytes == 101 * 8 + 100 * 8 + 100 * 4


def test_complex_copies_count_both_parts() -> None:
    c = torch.ones(4, dtype=torch.complex64)
    with MetaReadback(), torchplace.guard() as report:
        on_device = c.to(META)
        on_device.real.cpu()
    assert (report.h2d_bytes, report.d2h_bytes) == (32, 16)


def test_cpu_scalars_next_to_device_tensors_are_fine_and_python_reads_are_syncs() -> None:
    x = torch.ones(3, device=META)
    with MetaReadback(), torchplace.guard() as report:
        x * 2.0 + torch.tensor(3.0)  # a CPU scalar: passed as a value
        float(x.sum())  # scalar-float
        "%d" % x.sum().long()  # noqa: UP031  # scalar-percent
    assert _rows(report) == [
        ("sync", line("scalar-float"), 1, 0),
        ("sync", line("scalar-percent"), 1, 0),
    ]


@pytest.mark.parametrize(
    "call",
    [
        lambda n, ref: torch.arange(n, device=META),
        lambda n, ref: torch.zeros(n, 4, device=META),
        lambda n, ref: torch.zeros((n, 4), device=META),
        lambda n, ref: torch.full((3,), n, device=META),
        lambda n, ref: torch.randn(n, device=META),
        lambda n, ref: ref.new_zeros(n),
        lambda n, ref: ref.narrow(0, n - 4, 1),
        lambda n, ref: ref.view(n - 4, -1),
        lambda n, ref: ref.reshape((n - 4, -1)),
        lambda n, ref: ref.expand(n - 4, -1),
    ],
    ids=[
        "arange",
        "zeros",
        "zeros-tuple",
        "full",
        "randn",
        "new_zeros",
        "narrow",
        "view",
        "reshape",
        "expand",
    ],
)
def test_a_size_read_from_a_device_tensor_is_a_sync(
    call: Callable[[torch.Tensor, torch.Tensor], object],
) -> None:
    # torch.arange(lengths.max()): torch reads the device value on the host, an item() each
    lengths = torch.tensor([3, 5, 2], device=META)
    n = lengths.max()
    # MetaReadback reads every device value as 0; the op may then refuse the size
    with MetaReadback(), torchplace.guard() as report, contextlib.suppress(RuntimeError):
        call(n, lengths.view(-1, 1))
    assert [(e.kind, e.detail) for e in report.events] == [
        ("sync", "a device value read on the host")
    ]


def test_sizes_from_python_ints_or_cpu_tensors_are_no_sync() -> None:
    ref = torch.ones(6, device=META)
    with torchplace.guard() as report:
        torch.arange(5, device=META)
        torch.zeros(torch.tensor(3), 4, device=META)
        ref.view(2, 3).narrow(0, 1, 1).expand(4, -1)
        ref.new_zeros(3)
    assert report.events == []


def test_operands_torch_keeps_on_the_host_are_no_mixed_device_ops() -> None:
    # a packed sequence's lengths (and batch sizes) and CTC's lengths are CPU tensors whatever
    # the device of the data (torch takes them to the host otherwise): pack_padded_sequence
    # was a mixed_device op at the user's line, for the one way torch allows
    rnn = nn.GRU(8, 8, batch_first=True).to(META)
    x = torch.randn(3, 5, 8, device=META)
    log_probs = torch.randn(5, 3, 6, device=META).log_softmax(-1)
    targets = torch.randint(1, 6, (3, 4), device=META)
    no_meta_kernel = contextlib.suppress(NotImplementedError, RuntimeError)  # CTC has none
    with MetaReadback(), torchplace.guard("raise") as report:
        packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([5, 3, 2]), batch_first=True)
        out, _ = rnn(packed)
        nn.utils.rnn.pad_packed_sequence(out, batch_first=True)
        rnn(nn.utils.rnn.pack_sequence([x[0], x[1, :3]]))
        with no_meta_kernel:
            F.ctc_loss(log_probs, targets, torch.tensor([5, 5, 4]), torch.tensor([4, 3, 2]))
    assert report.events == []
    host_targets, lengths = torch.randint(1, 6, (3, 4)), torch.full((3,), 4)
    with MetaReadback(), torchplace.guard() as report:
        with no_meta_kernel:  # the targets are no host operand: torch copies them over
            F.ctc_loss(log_probs, host_targets, lengths + 1, lengths)  # ctc
        attempt(lambda: x * torch.ones(3, 5, 8))  # mixed
    assert _rows(report) == [
        ("h2d", line("ctc"), 1, 3 * 4 * 8),
        ("sync", line("ctc"), 1, 0),
        ("mixed_device", line("mixed"), 1, 0),
    ]


def test_type_as_onto_another_device_is_a_copy_not_a_mixed_device_op() -> None:
    on_device = torch.ones(3, device=META)
    with torchplace.guard("raise", allow=["h2d", "sync"]) as report:
        moved = torch.ones(3, dtype=torch.float64).type_as(on_device)
        same = on_device.type_as(on_device)
    assert (moved.device, same.device) == (META, META)
    assert (report.h2d, report.h2d_bytes) == (0, 0)  # allowed: nothing kept
    with torchplace.guard() as report:
        torch.ones(3, dtype=torch.float64).type_as(on_device)  # type-as
    # float64 converted to float32 on the host, then sent: 3 x 4 bytes
    assert _rows(report) == [("h2d", line("type-as"), 1, 12), ("sync", line("type-as"), 1, 0)]


def test_shape_only_operands_on_another_device_are_not_mixed_device_ops() -> None:
    host, device = torch.ones(2, 3), torch.ones(3, 2, device=META)
    with torchplace.guard("raise"):
        host.view_as(device)
        host.reshape_as(device)
        torch.ones(1, 2).expand_as(device)


def test_compiled_code_under_a_guard_records_its_crossings_at_each_call() -> None:
    # warnings are errors here: dynamo breaks the graph at the guard's site lookup (marked as
    # torch.compiler.disable marks) without a warning that it cannot trace sys._getframe
    compiled = torch.compile(lambda t: t.to(META) * 2, backend="eager")
    try:
        with torchplace.guard() as report:
            for _ in range(3):
                compiled(torch.ones(3))
    finally:
        torch._dynamo.reset()
    assert (report.h2d, report.h2d_bytes, len(report.syncs)) == (3, 36, 3)


def test_torch_func_transforms_see_the_crossings_inside() -> None:
    from torch.func import grad, vmap

    x = torch.randn(5, 3, device=META)
    w = torch.randn(3, device=META)
    with MetaReadback(), torchplace.guard() as report:
        vmap(lambda row: (row * w).sum())(x)
        grad(lambda v: (v * w).sum())(torch.randn(3, device=META))
        vmap(lambda row: row.to("cpu"))(x)  # vmap-d2h
    assert _rows(report) == [("d2h", line("vmap-d2h"), 1, 60), ("sync", line("vmap-d2h"), 1, 0)]


def test_distributions_on_the_device_record_only_normals_check_of_its_scale() -> None:
    loc, scale = torch.zeros(3, device=META), torch.ones(3, device=META)
    with MetaReadback(), torchplace.guard() as report:
        normal = torch.distributions.Normal(loc, scale, validate_args=False)
        normal.log_prob(normal.rsample((4,)))
        categorical = torch.distributions.Categorical(
            logits=torch.zeros(4, 5, device=META), validate_args=False
        )
        categorical.sample()
        categorical.entropy()
    assert report.events == []
    # sample() draws with torch.normal(loc, scale), whose kernel reads min(scale) >= 0 on the
    # host (CUDA included); rsample() scales a standard draw and reads nothing
    with MetaReadback(), torchplace.guard() as report:
        normal.sample((4,))  # sample-line
    assert [(e.kind, e.op, e.site.lineno) for e in report.events] == [
        ("sync", "aten.normal.Tensor_Tensor", line("sample-line"))
    ]


def test_numpy_interop() -> None:
    array = np.arange(6, dtype=np.float32)
    with MetaReadback(), torchplace.guard() as report:
        host = torch.from_numpy(array)
        np.asarray(host)  # host memory: nothing crosses
        on_device = torch.as_tensor(array, device=META)  # numpy-h2d
        np.asarray(on_device.cpu())  # numpy-d2h
    assert sorted(_rows(report)) == [
        ("d2h", line("numpy-d2h"), 1, 24),
        ("h2d", line("numpy-h2d"), 1, 24),
        ("sync", line("numpy-h2d"), 1, 0),
        ("sync", line("numpy-d2h"), 1, 0),
    ]


def test_deepcopy_and_save_of_a_device_model_cross_nothing_on_the_host() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).to(META)
    with torchplace.guard() as report:
        clone = copy.deepcopy(model)
        torch.save(clone.state_dict(), io.BytesIO())  # meta holds no data to copy
    assert next(clone.parameters()).device == META
    assert report.events == []


def test_a_dataloader_with_workers_and_pin_memory(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.ones(8, 4), torch.zeros(8))
    loader = DataLoader(data, batch_size=4, num_workers=2, pin_memory=False)
    with torchplace.guard(threads=True) as report:
        for x, _ in loader:
            x.to(META, non_blocking=True)  # loader-h2d
    assert _rows(report) == [
        ("h2d", line("loader-h2d"), 2, 2 * 64),
        ("pageable_non_blocking", line("loader-h2d"), 2, 0),
    ]


# ------------------------------------------------------------------ hostile API arguments


@pytest.mark.parametrize("threads", ["no", None, 1])
def test_guard_threads_must_be_a_bool(threads: object) -> None:
    with pytest.raises(ConfigError, match="threads"):
        torchplace.guard(threads=threads)  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["count", "nbytes"])
def test_report_count_and_nbytes_refuse_a_missing_kind(method: str) -> None:
    report = GuardReport()
    with pytest.raises(ConfigError, match="event kind"):
        getattr(report, method)(None)


def _report_with_an_event() -> GuardReport:
    with torchplace.guard() as report:
        torch.ones(2).to(META)
    return report


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"site": 5}, "site"), ({"op": 5}, "op"), ({"site": ["a.py"]}, "site")]
)
def test_report_filter_refuses_non_string_site_and_op(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _report_with_an_event().filter(**kwargs)


@pytest.mark.parametrize("top", ["3", None, 1.5, True])
def test_report_top_must_be_an_int(top: object) -> None:
    report = _report_with_an_event()
    with pytest.raises(ConfigError, match="top"):
        report.top(top)  # type: ignore[arg-type]
    if top is not None:  # None means every row in the renderers
        with pytest.raises(ConfigError, match="top"):
            report.to_json(top=top)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="top"):
            report.format(top=top)  # type: ignore[arg-type]


@pytest.mark.parametrize("width", [0, -5, "wide", 1.5])
def test_report_format_refuses_a_width_that_draws_nothing(width: object) -> None:
    with pytest.raises(ConfigError, match="width"):
        _report_with_an_event().format(width=width)  # type: ignore[arg-type]


def test_report_refuses_an_unknown_mode_and_a_non_event() -> None:
    with pytest.raises(ConfigError, match="mode"):
        GuardReport("loud")
    with pytest.raises(ConfigError, match="Event"):
        GuardReport().add("h2d")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- command line

GUARD = [sys.executable, "-m", "torchplace.cli", "guard"]


def test_an_empty_program_name_is_a_usage_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*GUARD, "--", ""],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "empty" in proc.stderr, proc.stderr
    assert "directory" not in proc.stderr, proc.stderr


TRAIN = """\
import sys
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 2)

    def forward(self, x):
        return self.body(x)


def main(steps):
    device = torch.device("meta")
    model = Net().to(device)
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 8).to(device, non_blocking=True)
        loss = model(x).sum()
        losses.append(loss)
    torch.save(model, sys.argv[2])  # a class of __main__, as pickle finds it
    print("done", len(losses))
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
"""


def test_a_typical_training_script_under_the_command(tmp_path: Path) -> None:
    import json

    (tmp_path / "train.py").write_text(TRAIN)
    proc = subprocess.run(
        [*GUARD, "--json", "--", "python", "train.py", "3", "model.pt"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "done 3\n"
    result = json.loads(proc.stderr)["result"]
    assert result["program"]["exit_status"] == 0
    rows = {(s["line"], s["kind"]): s["count"] for s in result["sites"]}
    assert rows == {
        (17, "h2d"): 2,
        (17, "sync"): 2,
        (20, "h2d"): 3,
        (20, "pageable_non_blocking"): 3,
    }
    assert (tmp_path / "model.pt").is_file()


# -- the guard as a decorator ---------------------------------------------------------------


def test_decorated_function_is_guarded_on_every_call_into_one_report() -> None:
    model = torch.nn.Linear(8, 2).to("meta")

    @torchplace.guard()
    def step(batch: torch.Tensor) -> torch.Tensor:
        return model(batch.to("meta"))

    for _ in range(3):
        out = step(torch.randn(4, 8))
    assert out.device.type == "meta"
    assert step.report.h2d == 3
    assert step.__name__ == "step"
    model(torch.randn(4, 8).to("meta"))  # outside a call: not recorded
    assert step.report.h2d == 3


def test_decorated_recursive_call_runs_inside_the_active_guard() -> None:
    @torchplace.guard()
    def count_down(n: int) -> int:
        torch.ones(2).to("meta")
        return 0 if n == 0 else count_down(n - 1)

    assert count_down(3) == 0
    assert count_down.report.h2d == 4


def test_decorated_function_in_raise_mode_raises_at_the_op() -> None:
    @torchplace.guard("raise")
    def leak() -> None:
        torch.ones(2).to("meta")

    with pytest.raises(GuardViolation):
        leak()
    with pytest.raises(GuardViolation):  # the guard was left cleanly and works again
        leak()


@pytest.mark.parametrize(
    "func",
    [
        pytest.param(lambda: (yield 1), id="generator"),  # type: ignore[misc]
        pytest.param(None, id="not-callable"),
    ],
)
def test_decorating_a_generator_or_non_callable_is_refused(func: Any) -> None:
    with pytest.raises(ConfigError, match="guard"):
        torchplace.guard()(func)


def test_decorating_a_coroutine_function_is_refused() -> None:
    async def serve() -> None:
        return None

    with pytest.raises(ConfigError, match="coroutine"):
        torchplace.guard()(serve)
