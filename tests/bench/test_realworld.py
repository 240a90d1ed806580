"""Timer and measure as real code uses them: functions that fail, vary or return things, budgets
under a noisy machine, nesting and threads, one-sample statistics, and odd ``bench`` flags.

No assertion here depends on how fast this machine is: the budgets run on a fake clock, and the
real-clock tests count calls and check invariants only.
"""

from __future__ import annotations

import json
import math
import re
import threading
from typing import Any

import pytest
import torch

from torchplace.bench.timer import MAX_CALLS, Measurement, Timer, measure
from torchplace.cli import main
from torchplace.errors import ConfigError

from .fake_clock import FakeClock, scripted

# --------------------------------------------------------------------------------------------
# min_time: decided by the time measured, not only by the warm-up's estimate
# --------------------------------------------------------------------------------------------


def test_a_slow_warmup_does_not_cut_the_time_budget_short() -> None:
    # A machine busy during the warm-up (10 ms a call) and quiet afterwards (0.1 ms): the
    # estimate from the warm-up asked for 2 calls, 0.2 ms of the 20 ms budget.
    clock = FakeClock()
    fn, calls = scripted(clock, [0.1] + [0.01] * 2 + [0.0001] * 1000)
    m = measure(fn, device="cpu", warmup=2, min_time=0.02, clock=clock, spread_warning=None)
    assert sum(m.times_s) == pytest.approx(0.02)
    assert m.count == 200
    assert len(calls) == 1 + 2 + 200
    assert m.wall_per_call_s == pytest.approx(0.0001)


def test_a_slow_cold_call_without_warmup_does_not_cut_the_budget_short() -> None:
    clock = FakeClock()
    fn, _ = scripted(clock, [1.0] + [0.001] * 100)
    m = measure(fn, device="cpu", warmup=0, min_time=0.01, clock=clock, spread_warning=None)
    assert m.count == 10
    assert sum(m.times_s) == pytest.approx(0.01)


def test_the_extra_calls_still_stop_at_max_repeats() -> None:
    clock = FakeClock()
    fn, calls = scripted(clock, [0.1] + [0.1] + [1e-6] * 100)
    m = measure(
        fn, device="cpu", warmup=1, min_time=1.0, max_repeats=25, clock=clock, spread_warning=None
    )
    assert m.count == 25
    assert len(calls) == 1 + 1 + 25


def test_inputs_keep_rotating_across_the_extra_calls() -> None:
    clock = FakeClock()
    seen: list[int] = []
    durations = iter([0.1, 0.01] + [0.001] * 100)

    def fn(k: int) -> None:
        seen.append(k)
        clock.advance(next(durations))

    m = measure(
        fn,
        device="cpu",
        warmup=1,
        min_time=0.01,
        inputs=[0, 1, 2],
        clock=clock,
        spread_warning=None,
    )
    assert m.count == 10
    assert seen == [k % 3 for k in range(len(seen))]


def test_a_real_budget_is_spent_on_the_cpu() -> None:
    # whatever the machine's load, the timed calls (and the wall clock around them) add up to
    # at least min_time unless max_repeats stopped them
    calls = [0]

    def work() -> torch.Tensor:
        calls[0] += 1
        return torch.ones(64).sum()

    m = measure(work, device="cpu", warmup=1, min_time=0.01, spread_warning=None)
    assert m.count == calls[0] - 2
    assert m.wall_per_call_s * m.count >= 0.01 or m.count == 10_000


# --------------------------------------------------------------------------------------------
# what the timed function does
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("warmup", "repeats"), [(0, 5), (1, 5), (5, 5)])
def test_an_error_on_the_third_call_reaches_the_caller_unchanged(warmup: int, repeats: int) -> None:
    calls = [0]

    class Boom(Exception):
        pass

    def fn() -> None:
        calls[0] += 1
        if calls[0] == 3:
            raise Boom("third call")

    with pytest.raises(Boom, match="third call"):
        measure(fn, device="cpu", warmup=warmup, repeats=repeats)
    assert calls[0] == 3  # nothing more is called after the error


@pytest.mark.parametrize("value", [None, torch.ones(3), (torch.ones(1), "x"), 7])
def test_whatever_the_function_returns_is_ignored(value: Any) -> None:
    m = measure(lambda: value, device="cpu", warmup=1, repeats=3, spread_warning=None)
    assert m.count == 3


def test_a_call_slower_than_min_time_is_timed_min_repeats_times() -> None:
    clock = FakeClock()
    fn, calls = scripted(clock, [0.5] * 10)
    m = measure(fn, device="cpu", warmup=1, min_time=0.1, min_repeats=2, clock=clock)
    assert m.count == 2
    assert len(calls) == 1 + 1 + 2


def test_nested_timers_each_count_their_own_calls() -> None:
    inner_counts: list[int] = []

    def outer() -> None:
        m = measure(lambda: None, device="cpu", warmup=0, repeats=3, spread_warning=None)
        inner_counts.append(m.count)

    m = measure(outer, device="cpu", warmup=1, repeats=2, spread_warning=None)
    assert m.count == 2
    assert inner_counts == [3] * (1 + 1 + 2)


def test_timers_in_threads_do_not_mix_their_counts() -> None:
    results: dict[int, Measurement] = {}
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            results[n] = Timer(device="cpu", warmup=0, repeats=n, spread_warning=None).measure(
                lambda: torch.ones(8).sum()
            )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in (3, 5, 7, 9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert {n: m.count for n, m in results.items()} == {3: 3, 5: 5, 7: 7, 9: 9}


# --------------------------------------------------------------------------------------------
# statistics and reports
# --------------------------------------------------------------------------------------------


def test_one_sample_has_consistent_statistics_and_a_nan_free_report() -> None:
    m = Measurement("one", "cpu", "cpu perf_counter", (0.25,), 0.5, 0.5, 0.25, 0)
    assert (m.count, m.median_s, m.q1_s, m.q3_s, m.min_s, m.max_s, m.mean_s) == (
        1,
        0.25,
        0.25,
        0.25,
        0.25,
        0.25,
        0.25,
    )
    assert m.iqr_s == 0.0
    assert m.spread == 0.0
    json.dumps(m.to_dict(include_times=True), allow_nan=False)
    assert not re.search(r"\bnan\b", str(m), re.IGNORECASE)


def test_a_clock_that_never_moves_gives_a_nan_free_report() -> None:
    clock = FakeClock()
    m = measure(lambda: None, device="cpu", warmup=0, repeats=4, clock=clock, label="still")
    report = m.to_dict()
    json.dumps(report, allow_nan=False)
    assert all(not (isinstance(v, float) and math.isnan(v)) for v in report.values())
    assert not re.search(r"\bnan\b", str(m), re.IGNORECASE)


# --------------------------------------------------------------------------------------------
# counts too large to run
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["repeats", "warmup", "max_repeats"])
def test_call_counts_beyond_the_limit_are_refused_before_any_call(name: str) -> None:
    calls = [0]

    def fn() -> None:
        calls[0] += 1

    with pytest.raises(ConfigError, match=rf"{name}=10000000000000000 is more than"):
        measure(fn, device="cpu", **{name: 10**16})
    assert calls[0] == 0


def test_the_largest_allowed_count_is_accepted() -> None:
    assert Timer(device="cpu", repeats=MAX_CALLS).repeats == MAX_CALLS


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["timing", "--repeats", "99999999999999999"], "'99999999999999999' is more than the"),
        (["overlap", "--repeats", str(MAX_CALLS + 1)], f"'{MAX_CALLS + 1}' is more than the"),
    ],
)
def test_huge_repeats_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # --repeats 99999999999999999 was a MemoryError traceback out of `torchplace bench timing`
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv, "--device", "cpu"])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_huge_warmup_is_a_usage_error_not_a_run_that_never_ends(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # --warmup 99999999999999999999 ran untimed matmuls until killed
    argv = ["bench", "timing", "--device", "cpu", "--size", "8", "--warmup", "99999999999999999999"]
    assert main(argv) == 2
    assert "--warmup must be 0 to 1,000,000" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# CUDA-only benchmarks: sizes that cannot fit are refused before anything is allocated
# --------------------------------------------------------------------------------------------


def test_a_transfer_size_larger_than_the_host_is_refused_before_allocating() -> None:
    # no machine has an exabyte: the check answers on the host before CUDA is touched (on a
    # GPU machine `--sizes 99999T` was an allocator traceback out of torch.empty)
    from torchplace.bench.transfer import run_transfer

    with pytest.raises(ConfigError, match=r"needs .* on the host.*give smaller --sizes"):
        run_transfer(torch.device("cuda", 0), sizes=(4096, 1 << 60))


def test_an_overlap_batch_larger_than_the_host_is_refused_before_allocating() -> None:
    from torchplace.bench.overlap import run_overlap

    with pytest.raises(ConfigError, match=r"needs .* on the host.*give a smaller --batch-mib"):
        run_overlap(torch.device("cuda", 0), batch_bytes=1 << 60)


def test_overlap_with_one_batch_is_refused_on_every_device(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # it was refused on CUDA only (as "batches", not the flag), and skipped with exit 0 elsewhere
    with pytest.raises(SystemExit) as exc:
        main(["bench", "overlap", "--device", "cpu", "--batches", "1"])
    assert exc.value.code == 2
    assert "--batches: '1' batches make no pipeline; give 2 or more" in capsys.readouterr().err
