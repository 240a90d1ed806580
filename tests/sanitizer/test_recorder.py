"""Every detection of the guard, on CPU: ``meta`` stands in for the accelerator."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchplace
from torchplace.errors import ConfigError, GuardViolation
from torchplace.models import build_model
from torchplace.sanitizer import GuardWarning
from torchplace.sanitizer.recorder import _direction, user_site

from .fakes import DeviceClaim, MetaReadback, line_of

META = torch.device("meta")
HERE = __file__


def line(marker: str) -> int:
    return line_of(HERE, marker)


def attempt(call: Callable[[], object]) -> None:
    """Run ``call``; torch may refuse a mixed-device op after the guard recorded it."""
    with contextlib.suppress(RuntimeError):
        call()


# -- transfers -------------------------------------------------------------------------------
def test_h2d_copy_records_bytes_devices_and_the_users_line() -> None:
    x = torch.ones(4, 8)
    with torchplace.guard() as report:
        y = x.to(META)  # h2d-line
    assert y.device == META
    event, sync = report.events
    assert event.kind == "h2d"
    assert (event.src, event.dst, event.nbytes) == ("cpu", "meta", 4 * 8 * 4)
    assert event.op == "aten._to_copy"
    assert event.site.filename == HERE
    assert event.site.lineno == line("h2d-line")
    assert event.site.function == "test_h2d_copy_records_bytes_devices_and_the_users_line"
    assert (report.h2d, report.h2d_bytes, report.d2h, report.d2h_bytes) == (1, 128, 0, 0)
    # a blocking copy: the host waits for the device (on CUDA, memcpy_and_sync)
    assert (sync.kind, sync.op, sync.site) == ("sync", "aten._to_copy", event.site)
    assert sync.detail == "blocking host-to-device copy"
    assert report.syncs == [sync]


def test_d2h_copy_is_a_transfer_and_a_blocking_sync() -> None:
    y = torch.ones(3, 5, device=META, dtype=torch.float16)
    with MetaReadback(), torchplace.guard() as report:
        out = y.cpu()  # d2h-line
    assert out.device.type == "cpu"
    assert report.d2h == 1
    assert report.d2h_bytes == 3 * 5 * 2
    (transfer,) = report.transfers
    assert (transfer.src, transfer.dst) == ("meta", "cpu")
    (sync,) = report.syncs
    assert sync.site.lineno == transfer.site.lineno == line("d2h-line")
    assert sync.detail == "blocking device-to-host copy"


def test_copies_inside_module_to_are_attributed_to_the_calling_line() -> None:
    model = build_model("seed-mlp")
    with torchplace.guard() as report:
        model.to(META)  # module-to
    assert report.h2d == 4  # two weights, two biases
    assert report.h2d_bytes == sum(p.numel() * 4 for p in build_model("seed-mlp").parameters())
    assert len(report.syncs) == 4  # each blocking copy waits: one sync per copy
    assert {e.site.lineno for e in report.events} == {line("module-to")}


def test_copy_into_an_existing_tensor_is_seen() -> None:
    dst = torch.empty(2, 2, device=META)
    with torchplace.guard() as report:
        dst.copy_(torch.ones(2, 2))  # copy-line
        dst.copy_(torch.ones(2, 2), non_blocking=True)
    assert report.h2d == 2
    assert report.events[0].op == "aten.copy_"
    (sync,) = report.syncs  # the blocking one only
    assert (sync.op, sync.site.lineno) == ("aten.copy_", line("copy-line"))
    assert sync.detail == "blocking host-to-device copy"


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


def test_direction_is_classified_by_device_type() -> None:
    cpu, cuda0, cuda1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)
    assert _direction(cpu, cuda0) == "h2d"
    assert _direction(cuda0, cpu) == "d2h"
    assert _direction(cuda0, cuda1) == "d2d"
    assert _direction(META, cpu) == "d2h"


# -- syncs ---------------------------------------------------------------------------------
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


def test_print_line_is_the_users(capsys: pytest.CaptureFixture[str]) -> None:
    t = torch.ones(4, device=META)
    with torchplace.guard() as report:
        print("loss", t)  # print-line
    (sync,) = report.syncs
    assert (sync.site.filename, sync.site.lineno) == (HERE, line("print-line"))
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


def test_cuda_synchronize_is_recorded_even_where_it_cannot_run() -> None:
    # a CPU-only build cannot synchronize; the call is still made, and recorded first
    with torchplace.guard() as report, contextlib.suppress(AssertionError, RuntimeError):
        torch.cuda.synchronize()  # sync-line
    (sync,) = report.syncs
    assert (sync.op, sync.site.lineno) == ("torch.cuda.synchronize", line("sync-line"))
    assert getattr(torch.cuda.synchronize, "__torchplace_original__", None) is None  # unwrapped


# -- non_blocking that is not --------------------------------------------------------------
def test_non_blocking_from_pageable_memory_is_flagged_but_is_not_a_sync() -> None:
    x = torch.ones(16)
    with torchplace.guard() as report:
        x.to(META, non_blocking=True)  # pageable-line
    (event,) = report.pageable_non_blocking
    assert event.site.lineno == line("pageable-line")
    assert "pin" in event.detail
    assert report.h2d == 1
    # the driver stages pageable data and returns; torch does not wait for the stream
    assert report.syncs == []


def test_non_blocking_copy_into_pageable_host_memory_is_flagged_and_syncs() -> None:
    src = torch.ones(8, device=META)
    dst = torch.empty(8)
    with MetaReadback(), torchplace.guard() as report:
        dst.copy_(src, non_blocking=True)
    assert len(report.pageable_non_blocking) == 1
    assert report.d2h == 1
    assert len(report.syncs) == 1


def test_blocking_h2d_is_a_sync_not_a_pageable_non_blocking_copy() -> None:
    with torchplace.guard() as report:
        torch.ones(4).to(META)  # blocking-h2d
    assert report.pageable_non_blocking == []
    (sync,) = report.syncs
    assert (sync.op, sync.site.lineno) == ("aten._to_copy", line("blocking-h2d"))


def test_device_to_device_copies_are_not_syncs_and_host_copies_are() -> None:
    # meta has no device indices: tensors that only claim cuda:0 and cuda:1 stand in. Their
    # aten ops are called directly (torch's Python bindings would want a CUDA build to pick
    # the device); the guard's dispatch layer sees them exactly as it sees those of a user call
    aten = torch.ops.aten
    gpu0, gpu1, host = DeviceClaim((4,), "cuda:0"), DeviceClaim((4,), "cuda:1"), torch.ones(4)
    with torchplace.guard() as report:
        aten.copy_.default(gpu1, gpu0)  # d2d-line
        aten._to_copy.default(gpu0, device=torch.device("cuda:1"))
        aten.copy_.default(gpu0, host)  # claimed-h2d
        aten.copy_.default(host, gpu0)  # claimed-d2h
    assert (report.d2d, report.d2d_bytes) == (2, 32)
    assert [(e.kind, e.op, e.src, e.dst) for e in report.transfers] == [
        ("d2d", "aten.copy_", "cuda:0", "cuda:1"),
        ("d2d", "aten._to_copy", "cuda:0", "cuda:1"),
        ("h2d", "aten.copy_", "cpu", "cuda:0"),
        ("d2h", "aten.copy_", "cuda:0", "cpu"),
    ]
    assert report.transfers[0].site.lineno == line("d2d-line")
    assert [(e.site.lineno, e.detail) for e in report.syncs] == [
        (line("claimed-h2d"), "blocking host-to-device copy"),
        (line("claimed-d2h"), "blocking device-to-host copy"),
    ]


def test_a_destination_without_index_is_reported_with_the_current_one() -> None:
    # x.to("cuda") names no index; the copy lands on the current cuda:N, and the report says so
    aten = torch.ops.aten
    gpu0, host = DeviceClaim((4,), "cuda:0"), torch.ones(4)
    with torchplace.guard() as report:
        # recorded before it runs; a CPU-only build then refuses it
        attempt(lambda: aten._to_copy.default(host, device=torch.device("cuda")))
        aten._to_copy.default(gpu0, device=torch.device("cuda"))  # same device: no copy
    assert [(e.kind, e.src, e.dst) for e in report.transfers] == [("h2d", "cpu", "cuda:0")]


# -- mixed devices -------------------------------------------------------------------------
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
    assert f"test_recorder.py:{line('raise-line')}" in message
    assert "shape=(2, 3) dtype=float32 device=cpu" in message
    assert "shape=(4, 3) dtype=float16 device=meta" in message
    assert len(report.mixed_device_ops) == 1


def test_raise_mode_raises_before_the_copy_runs() -> None:
    calls = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            calls.append(func)
            return func(*args, **(kwargs or {}))

    with Spy(), torchplace.guard("raise"), pytest.raises(GuardViolation, match="H2D"):
        torch.ones(2).to(META)
    assert torch.ops.aten._to_copy.default not in calls


# -- modes and allow -----------------------------------------------------------------------
def test_warn_mode_warns_once_per_new_line_and_points_at_it() -> None:
    x = torch.ones(2)
    with warnings.catch_warnings(record=True) as caught, torchplace.guard("warn") as report:
        warnings.simplefilter("always")
        for _ in range(3):
            x.to(META)  # warn-line
    assert report.h2d == 3
    assert len(report.syncs) == 3
    guard_warnings = [w for w in caught if issubclass(w.category, GuardWarning)]
    assert len(guard_warnings) == 2  # once for the H2D kind, once for the sync kind
    assert {(w.filename, w.lineno) for w in guard_warnings} == {(HERE, line("warn-line"))}
    assert "H2D" in str(guard_warnings[0].message)
    assert "host synchronization" in str(guard_warnings[1].message)


def test_allow_by_kind_and_by_line() -> None:
    x = torch.ones(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torchplace.guard("raise", allow=["h2d", "sync"]) as report:
            x.to(META)
        assert report.events == []
        with torchplace.guard("raise", allow=["transfer", "sync"]) as report:
            x.to(META)
        with torchplace.guard("raise", allow=["h2d", "pageable_non_blocking"]) as report:
            x.to(META, non_blocking=True)  # no sync to allow
        assert report.events == []
        with torchplace.guard("raise", allow=[f"test_recorder.py:{line('allowed-line')}"]):
            x.to(META)  # allowed-line
        with torchplace.guard("raise", allow=["sanitizer/test_recorder.py"]):
            x.to(META)
    with torchplace.guard("raise", allow=["test_recorder.py:1"]), pytest.raises(GuardViolation):
        x.to(META)
    # allowing the copy does not allow the wait a blocking copy makes the host do
    with (
        torchplace.guard("raise", allow=["h2d"]),
        pytest.raises(GuardViolation, match=r"host synchronization \(aten\._to_copy\)"),
    ):
        x.to(META)


@pytest.mark.parametrize("allow", [["h2x"], [""], [3]])
def test_bad_allow_entries_are_config_errors(allow: list[object]) -> None:
    with pytest.raises(ConfigError, match="allow"):
        torchplace.guard(allow=allow)  # type: ignore[arg-type]


def test_bad_mode_is_a_config_error_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match="record, warn, raise"):
        torchplace.guard("loud")


def test_a_guard_cannot_be_entered_twice_at_once() -> None:
    g = torchplace.guard()
    with g, pytest.raises(ConfigError, match="already active"), g:
        pass


def test_nested_guards_both_record() -> None:
    with torchplace.guard() as outer:
        torch.ones(1).to(META)
        with torchplace.guard() as inner:
            torch.ones(2).to(META)
    assert (outer.h2d, inner.h2d) == (2, 1)


# -- threads -------------------------------------------------------------------------------
def test_only_the_entering_thread_is_recorded() -> None:
    seen: dict[str, int] = {}

    def other() -> None:
        torch.ones(3).to(META)
        torch.ones(2).sum().to(META)
        with contextlib.suppress(AssertionError, RuntimeError):
            torch.cuda.synchronize()
        with torchplace.guard() as own:
            torch.ones(5).to(META)
        seen["own"] = own.h2d

    with torchplace.guard() as report:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        torch.ones(4).to(META)
    assert seen == {"own": 1}
    assert report.h2d == 1
    assert report.h2d_bytes == 16
    (sync,) = report.syncs  # the main thread's blocking copy only
    assert (sync.op, sync.site.function) == (
        "aten._to_copy",
        "test_only_the_entering_thread_is_recorded",
    )


# -- where the user is ---------------------------------------------------------------------
def test_user_site_skips_torch_frames() -> None:
    site = user_site()
    assert site.filename == HERE
    assert site.function == "test_user_site_skips_torch_frames"


def test_import_of_the_plugin_does_not_import_torch() -> None:
    code = (
        "import sys, torchplace.sanitizer.pytest_plugin, torchplace.sanitizer.cli, torchplace.sanitizer; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_guard_is_the_same_function_through_the_facade() -> None:
    import torchplace.sanitizer as package

    assert torchplace.guard is package.guard
    assert callable(torchplace.guard)


def test_every_detection_also_works_under_inference_mode() -> None:
    # Without autograd, composite ops (aten.to, aten.item, aten.linear) reach the dispatch
    # layer whole; the guard decomposes them to see the copies and reads inside.
    t = torch.ones(4, 2, device=META)
    with torch.inference_mode(), MetaReadback(), torchplace.guard() as report:
        torch.ones(3).to(META)  # inference-h2d
        torch.ones(3).to(META, non_blocking=True)
        t.cpu()
        t.sum().item()
        t.tolist()
        t.nonzero()
        t[t > 0]
        attempt(lambda: F.linear(torch.ones(2, 2), t))
        attempt(lambda: torch.where(torch.ones(2, dtype=torch.bool), t[0], torch.ones(2)))
    assert (report.h2d, report.d2h) == (2, 2)
    assert [e.op for e in report.syncs] == [
        "aten._to_copy",  # the blocking H2D (the non_blocking one is not a sync)
        "aten._to_copy",  # the blocking D2H
        "Tensor.item",
        "Tensor.tolist",
        "aten.nonzero",
        "aten.index.Tensor",
    ]
    assert report.syncs[0].site.lineno == line("inference-h2d")
    assert report.syncs[0].detail == "blocking host-to-device copy"
    assert len(report.pageable_non_blocking) == 1
    assert [e.op for e in report.mixed_device_ops] == ["F.linear", "aten.where.self"]


def test_standard_library_frames_are_not_the_users_line() -> None:
    import statistics

    values = [torch.ones((), device=META), torch.ones((), device=META)]
    with MetaReadback(), torchplace.guard() as report:
        # float() of each value happens inside statistics.py
        statistics.fmean(values)  # stdlib-line
    assert len(report.syncs) == 2
    assert {e.site.lineno for e in report.events} == {line("stdlib-line")}
