"""The guard as a whole: modes, ``allow``, nesting, threads and the lazy facade.
``meta`` stands in for the accelerator."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import warnings

import pytest
import torch

import torchplace
from torchplace.errors import ConfigError, GuardViolation
from torchplace.sanitizer import GuardWarning

from .fakes import META, line_of

HERE = __file__


def line(marker: str) -> int:
    return line_of(HERE, marker)


def test_raise_mode_raises_before_the_copy_runs() -> None:
    calls = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            calls.append(func)
            return func(*args, **(kwargs or {}))

    with Spy(), torchplace.guard("raise"), pytest.raises(GuardViolation, match="H2D"):
        torch.ones(2).to(META)
    assert torch.ops.aten._to_copy.default not in calls


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


def test_threads_true_watches_threads_the_block_starts() -> None:
    from concurrent.futures import ThreadPoolExecutor

    def copy(n: int) -> None:
        torch.ones(n).to(META)

    with torchplace.guard(threads=True) as report:
        thread = threading.Thread(target=copy, args=(3,))
        thread.start()
        thread.join()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(copy, [1, 2, 4]))
        torch.ones(5).to(META)
    assert report.h2d == 5
    assert report.h2d_bytes == 4 * (3 + 1 + 2 + 4 + 5)
    assert {e.site.function for e in report.transfers} == {
        "copy",
        "test_threads_true_watches_threads_the_block_starts",
    }
    assert threading.getprofile() is None  # the hook is gone with the guard
    later = threading.Thread(target=copy, args=(6,))
    later.start()
    later.join()
    assert report.h2d == 5


def test_a_watched_thread_that_outlives_the_guard_records_no_more() -> None:
    go, done = threading.Event(), threading.Event()

    def late() -> None:
        torch.ones(1).to(META)
        go.wait(10)
        torch.ones(2).to(META)  # after the guard exited
        done.set()

    with torchplace.guard(threads=True) as report:
        thread = threading.Thread(target=late)
        thread.start()
        while report.h2d < 1 and thread.is_alive():
            thread.join(0.01)
    go.set()
    assert done.wait(10)
    thread.join()
    assert report.h2d == 1


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
