"""bench as an ML engineer uses it, second round: the models people write and the functions they time.

Covers:

- ``Timer``/``measure`` on a function that returns a generator, a coroutine or an async
  generator: refused after the first call (timing it would time only the object's creation),
  with no coroutine left un-awaited; the statistics of warm calls against an injected clock
  (cold call and warm-up left out);
- ``bench model`` on a model that runs once and then fails (an exception, an assert, a
  ``sys.exit``): exit 1 with one line naming the stage and batch, nothing on stdout under
  ``--json``; ``sys.exit`` in the first call: exit 2 instead of a silent exit with the model's code;
- a model that differentiates in its forward: the error names ``inference_mode`` and the fix,
  not ``--input-shape``;
- a model built on the ``meta`` device: a usage error, not a traceback;
- a ``torch.export`` program's module (which cannot switch to eval mode): benchmarked as
  exported, and the report says so;
- the model's own dtype without ``--dtype`` (a ``float16`` model stays ``float16``, an int
  buffer first does not decide it, no floating weights gives float32), and ``--dtype`` still
  converting;
- a ``TimingWarning`` turned into an error (``-W error``) passing through, not reported as
  the model failing;
- ``bench overlap --compute-ms`` below the copy time: kept, not silently raised to 1.25 x the
  copy;
- ``bench transfer`` with 1 byte, odd sizes and a size given twice (timed once, so the
  allocation and copy figures agree), and 0 bytes (exit 2, nothing on stdout);
- durations, rows/s and rates that round up to 1000 of their unit: shown in the next unit
  (``1 ms``, ``1M``), or as a whole number past the largest one, never as ``1e+03``;
- the ``first`` column and ``first_call_s``: the model's first call at each batch size (the one
  that pays for ``torch.compile``), not the total stage's cold call made after dozens of calls.

No assertion depends on how fast this machine is.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import torch
from rich.console import Console
from torch import nn

from torchplace.bench.measurement import Measurement
from torchplace.bench.render import stages_table
from torchplace.bench.stages import StageResult, StagesResult, load_model_spec, run_stages
from torchplace.bench.timer import measure
from torchplace.cli import main
from torchplace.errors import ConfigError

from .fake_clock import FakeClock, scripted

HERE = "tests.bench.test_realworld2"

# --------------------------------------------------------------------------------------------
# model factories, loaded as tests.bench.test_realworld2:make_*
# --------------------------------------------------------------------------------------------


class _FailsLater(nn.Module):
    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.calls = 0
        self.error = error

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 3:
            raise self.error
        return x * 2


def make_fails_later() -> nn.Module:
    return _FailsLater(ValueError("state exhausted"))


def make_exits_later() -> nn.Module:
    return _FailsLater(SystemExit(4))


class _ExitsAtOnce(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sys.exit(3)


def make_exits_at_once() -> nn.Module:
    return _ExitsAtOnce()


class _GradInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            x = x.detach().clone().requires_grad_(True)
            (grad,) = torch.autograd.grad(self.linear(x).sum(), x)
        return grad


def make_grad_in_forward() -> nn.Module:
    return _GradInForward()


def make_on_meta() -> nn.Module:
    with torch.device("meta"):
        return nn.Linear(4, 2)


def make_exported() -> nn.Module:
    program = torch.export.export(nn.Linear(4, 2), (torch.randn(2, 4),))
    return program.module()


def make_half() -> nn.Module:
    return nn.Linear(4, 2).half()


class _CounterThenFloat64(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.linear = nn.Linear(4, 2).to(torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        return self.linear(x)


def make_counter_then_float64() -> nn.Module:
    return _CounterThenFloat64()


def make_relu() -> nn.Module:
    return nn.ReLU()


class _FirstCallsPerShape(nn.Module):
    """Records every batch size it is called with, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.shape[0])
        return x + 1


def _bench(argv: list[str]) -> int:
    return main(["bench", "model", "--device", "cpu", "--min-time", "0.001", *argv])


# --------------------------------------------------------------------------------------------
# Timer: what the timed function returns
# --------------------------------------------------------------------------------------------


def test_a_generator_function_is_refused_not_timed_as_its_creation() -> None:
    calls = [0]

    def batches() -> Iterator[torch.Tensor]:
        calls[0] += 1
        yield torch.ones(3)

    with pytest.raises(ConfigError, match=r"returned a generator.*list\(fn\(\)\)"):
        measure(batches, device="cpu", warmup=2, repeats=5)
    assert calls[0] == 0  # its body never ran: the refusal comes after the first call alone


def test_a_lambda_returning_a_generator_is_refused_too() -> None:
    with pytest.raises(ConfigError, match="generator"):
        measure(lambda: (i for i in range(3)), device="cpu", repeats=3)


def test_a_coroutine_is_refused_and_closed() -> None:
    async def step() -> int:
        return 1

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would fail here
        with pytest.raises(ConfigError, match=r"coroutine.*asyncio\.run"):
            measure(step, device="cpu", repeats=3)


def test_an_async_generator_is_refused() -> None:
    async def stream() -> AsyncIterator[int]:
        yield 1

    with pytest.raises(ConfigError, match="async_generator"):
        measure(stream, device="cpu", repeats=3)


def test_consuming_the_generator_is_timed() -> None:
    def batches() -> Iterator[int]:
        yield from range(3)

    m = measure(lambda: list(batches()), device="cpu", warmup=0, repeats=3, spread_warning=None)
    assert m.count == 3


def test_statistics_of_the_warm_calls_against_known_times() -> None:
    clock = FakeClock()
    # a 1 s cold call, two 0.5 s warm-up calls, then 1..10 ms
    fn, _ = scripted(clock, [1.0, 0.5, 0.5] + [k / 1000 for k in range(1, 11)])
    m = measure(fn, device="cpu", warmup=2, repeats=10, clock=clock, spread_warning=None)
    assert m.cold_s == pytest.approx(1.0)
    assert m.median_s == pytest.approx(0.0055)
    assert (m.q1_s, m.q3_s) == (pytest.approx(0.00325), pytest.approx(0.00775))
    assert (m.min_s, m.max_s, m.mean_s) == (
        pytest.approx(0.001),
        pytest.approx(0.01),
        pytest.approx(0.0055),
    )
    assert m.wall_per_call_s == pytest.approx(0.0055)


def test_an_exception_keeps_no_measurement_and_reaches_the_caller() -> None:
    def fn() -> None:
        raise KeyError("missing")

    result = None
    with pytest.raises(KeyError, match="missing"):
        result = measure(fn, device="cpu", repeats=3)
    assert result is None


# --------------------------------------------------------------------------------------------
# bench model: models that fail after their first call
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("factory", "error"), [("make_fails_later", "ValueError"), ("make_exits_later", "SystemExit")]
)
def test_a_model_failing_on_a_later_call_is_one_line_and_exit_1(
    factory: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _bench(["--model", f"{HERE}:{factory}", "--input-shape", "4", "--batch-sizes", "2"])
    captured = capsys.readouterr()
    assert code == 1
    assert "Traceback" not in captured.err
    assert "later one" in captured.err
    assert "compute stage of batch 2" in captured.err
    assert error in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_under_json_a_later_failure_prints_nothing_on_stdout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--model", f"{HERE}:make_fails_later", "--input-shape", "4", "--batch-sizes", "2"]
    assert _bench([*argv, "--json"]) == 1
    assert capsys.readouterr().out == ""


def test_sys_exit_in_the_first_forward_is_a_usage_error_not_a_silent_exit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = _bench(["--model", f"{HERE}:make_exits_at_once", "--input-shape", "4"])
    assert code == 2
    assert "SystemExit: 3" in capsys.readouterr().err


def test_a_model_on_the_meta_device_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = _bench(["--model", f"{HERE}:make_on_meta", "--input-shape", "4"])
    err = capsys.readouterr().err
    assert code == 2
    assert "cannot move" in err
    assert "meta" in err
    assert "Traceback" not in err


def test_autograd_in_forward_says_inference_mode_not_input_shape(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = _bench(["--model", f"{HERE}:make_grad_in_forward", "--input-shape", "4"])
    err = capsys.readouterr().err
    assert code == 2
    assert "inference_mode" in err
    assert "torchplace.measure" in err
    assert "check --input-shape" not in err


# --------------------------------------------------------------------------------------------
# bench model: exported programs and the model's own dtype
# --------------------------------------------------------------------------------------------


def test_an_exported_program_runs_as_exported(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", f"{HERE}:make_exported", "--input-shape", "4", "--batch-sizes", "2"]
    assert _bench([*argv, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    figures = document["result"]["figures"]
    assert "cannot switch to eval mode" in figures["input"]
    assert figures["batches"][0]["first_call_s"] is not None
    jsonschema = pytest.importorskip("jsonschema")
    from torchplace import report

    jsonschema.Draft202012Validator(report.load_schema("bench")).validate(document)
    assert "the model in eval mode" not in figures["input"]


@pytest.mark.parametrize(
    ("factory", "dtype"),
    [
        ("make_half", "float16"),
        ("make_counter_then_float64", "float64"),
        ("make_relu", "float32"),
    ],
)
def test_without_dtype_the_model_keeps_its_own(
    factory: str, dtype: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", f"{HERE}:{factory}", "--input-shape", "4", "--batch-sizes", "2", "--json"]
    assert _bench(argv) == 0
    figures = json.loads(capsys.readouterr().out)["result"]["figures"]
    assert figures["dtype"] == dtype
    assert f") {dtype}," in figures["input"]


@pytest.mark.filterwarnings("ignore::torchplace.bench.timer.TimingWarning")
def test_an_explicit_dtype_still_converts_the_weights() -> None:
    model = make_half()
    spec = load_model_spec(f"{HERE}:make_half", "4")
    spec = type(spec)(spec.name, lambda: model, spec.row_shape)
    result = run_stages(
        spec, torch.device("cpu"), batch_sizes=(2,), dtype="float64", min_time=0.001, warmup=0
    )
    assert result.dtype == "float64"
    assert next(model.parameters()).dtype == torch.float64


def test_a_timing_warning_made_an_error_is_not_reported_as_a_model_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torchplace.bench import stages
    from torchplace.bench.timer import TimingWarning

    class Noisy(stages.Timer):
        def measure(self, fn: Any, **kw: Any) -> Measurement:
            m = super().measure(fn, **kw)
            warnings.warn(TimingWarning("the spread is large"), stacklevel=2)
            return m

    monkeypatch.setattr(stages, "Timer", Noisy)
    spec = load_model_spec(f"{HERE}:make_relu", "4")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TimingWarning)  # as python -W error or pytest would
        with pytest.raises(TimingWarning, match="spread"):
            run_stages(spec, torch.device("cpu"), batch_sizes=(2,), min_time=0.001, warmup=0)


# --------------------------------------------------------------------------------------------
# bench model: the first call
# --------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::torchplace.bench.timer.TimingWarning")
def test_first_call_is_the_models_first_at_each_batch_size() -> None:
    model = _FirstCallsPerShape()
    spec = load_model_spec(f"{HERE}:make_relu", "4")
    spec = type(spec)("recorder", lambda: model, spec.row_shape)
    result = run_stages(spec, torch.device("cpu"), batch_sizes=(2, 3), min_time=0.001, warmup=0)
    # each batch size starts with the call whose time first_call_s is
    assert model.seen[0] == 2
    assert 3 in model.seen
    for row in result.to_dict()["batches"]:
        assert row["first_call_s"] is not None
        assert row["first_call_s"] >= 0


def _m(label: str, seconds: float, cold: float) -> Measurement:
    return Measurement(label, "cpu", "cpu perf_counter", (seconds,), cold, cold, seconds, 0)


def test_the_first_column_shows_the_first_call_not_the_total_stages_cold_call() -> None:
    row = StageResult(
        batch_size=4,
        h2d=None,
        compute=_m("compute", 0.001, 0.002),
        d2h=None,
        total=_m("total", 0.001, 0.003),  # total's cold call: after dozens of calls
        peak_memory_bytes=None,
        first_call_s=7.0,  # the first call: torch.compile at work
    )
    result = StagesResult("m", "cpu", "float32", (4,), (row,), "n/a", "x")
    console = Console(width=200, record=True)
    console.print(stages_table(result))
    text = console.export_text()
    assert "7 s" in text
    assert "3 ms" not in text
    assert "first call at that batch" in text
    assert result.to_dict()["batches"][0]["first_call_s"] == 7.0


def test_first_call_s_is_in_the_shipped_schema() -> None:
    from torchplace import report

    schema = report.load_schema("bench")
    text = json.dumps(schema)
    assert '"first_call_s"' in text


# --------------------------------------------------------------------------------------------
# bench overlap: --compute-ms
# --------------------------------------------------------------------------------------------


def _calibrated(compute_ms: float | None) -> int:
    """Matmuls per batch chosen by calibration when a copy takes 10 ms a batch, a matmul 0.1 ms."""
    from torchplace.bench import overlap

    pipe = object.__new__(overlap._Pipeline)
    pipe.batches, pipe.matmuls = 4, 1

    def copy() -> None: ...

    def compute() -> None: ...

    pipe.copy_alone, pipe.compute_alone = copy, compute
    pipe.overlapped = pipe.prefetched = lambda: None
    pipe.elapsed = lambda work: 4 * (0.010 if work is copy else 0.0001)
    pipe.calibrate(compute_ms)
    return int(pipe.matmuls)


def test_overlap_sizes_compute_to_cover_the_copy_by_default() -> None:
    assert _calibrated(None) == 125  # 1.25 x 10 ms of 0.1 ms matmuls


def test_overlap_compute_ms_below_the_copy_time_is_kept_not_silently_raised() -> None:
    assert _calibrated(1.0) == 10  # 1 ms asked for: 10 matmuls, not 1.25 x the copy
    assert _calibrated(50.0) == 500


# --------------------------------------------------------------------------------------------
# bench transfer: odd sizes
# --------------------------------------------------------------------------------------------


def test_a_transfer_size_given_twice_is_timed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchplace.bench import transfer
    from torchplace.bench.timer import Timer

    monkeypatch.setattr(transfer, "_pinned", lambda size: torch.empty(size, dtype=torch.uint8))
    timer = Timer(device="cpu", warmup=0, repeats=1, spread_warning=None)
    # 1 byte, an odd size, and 4 KiB twice under two spellings
    result = transfer._sweep(timer, (1, 1000, 4096, 4096), None, lambda d: (None, "no link"))
    figures = result.to_dict()
    assert [row["size_bytes"] for row in figures["allocation"]] == [1, 1000, 4096]
    sizes = [case["size_bytes"] for case in figures["cases"]]
    assert sizes == [1] * 8 + [1000] * 8 + [4096] * 8


def test_transfer_sizes_of_zero_or_below_are_usage_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "transfer", "--sizes", "0", "--json"])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "below one byte" in captured.err


# --------------------------------------------------------------------------------------------
# numbers in the tables: rounding never shows "1e+03"
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.99996e-3, "1 ms"),  # was "1e+03 µs"
        (0.9996, "1 s"),  # was "1e+03 ms"
        (999.6, "1000 s"),
        (3700.0, "3700 s"),  # a very slow model's first call: was "3.7e+03 s"
        (0.00231, "2.31 ms"),
        (5e-7, "500 ns"),
        (0.0, "0 ns"),
    ],
)
def test_durations_round_into_the_next_unit(seconds: float, text: str) -> None:
    from torchplace.bench.units import format_duration

    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    ("rows_per_s", "text"), [(999_600.0, "1M"), (999.6, "1k"), (116e3, "116k"), (0.5, "0.5")]
)
def test_throughput_rounds_into_the_next_unit(rows_per_s: float, text: str) -> None:
    from torchplace.bench.render import _count

    assert _count(rows_per_s) == text  # 999,600 rows/s was "1e+03k"


def test_rates_never_show_an_exponent() -> None:
    from torchplace.bench.units import format_rate

    assert format_rate(999.6e9) == "1000 GB/s"
    assert format_rate(25e9) == "25 GB/s"
