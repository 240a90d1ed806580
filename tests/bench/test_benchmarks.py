"""The benchmark functions behind ``torchplace bench``, their results, tables and plots."""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from rich.console import Console

from torchplace.bench import render
from torchplace.bench.link import LinkInfo
from torchplace.bench.overlap import OverlapResult, hidden_fraction, run_overlap
from torchplace.bench.plot import plot_stages, plot_transfer
from torchplace.bench.stages import ModelSpec, load_model_spec, parse_shape, run_stages, to_host
from torchplace.bench.timer import Measurement
from torchplace.bench.timing import compare_clocks, default_size
from torchplace.bench.transfer import (
    DEFAULT_SIZES,
    TransferCase,
    TransferResult,
    run_transfer,
    transfer_cases,
)
from torchplace.errors import ConfigError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Real clocks on a shared machine can be noisy; the warning itself is tested in test_timer.py.
pytestmark = pytest.mark.filterwarnings("ignore::torchplace.bench.timer.TimingWarning")


def text_of(*renderables: object) -> str:
    console = Console(file=io.StringIO(), width=200)
    for renderable in renderables:
        console.print(renderable)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def fake_measurement(seconds: float, label: str = "x") -> Measurement:
    return Measurement(
        label=label,
        device="cuda:0",
        clock="cuda events",
        times_s=(seconds * 0.99, seconds, seconds * 1.01),
        cold_s=seconds * 10,
        cold_wall_s=seconds * 11,
        wall_per_call_s=seconds * 1.1,
        warmup=2,
    )


def fake_transfer(link: LinkInfo | None) -> TransferResult:
    cases = []
    for size in (4 << 10, 1 << 20, 256 << 20):
        for direction, memory, non_blocking in transfer_cases():
            rate = (25e9 if memory == "pinned" else 10e9) * min(1.0, size / (1 << 20))
            cases.append(
                TransferCase(
                    size,
                    direction,
                    memory,
                    non_blocking,
                    fake_measurement(size / rate),
                    None if link is None else link.peak_bytes_per_s,
                )
            )
    sizes = sorted({c.size_bytes for c in cases})
    return TransferResult(
        device="cuda:0",
        cases=tuple(cases),
        pinned_alloc_s={s: 1e-3 for s in sizes},
        pageable_alloc_s={s: 1e-4 for s in sizes},
        link=link,
        link_note="n/a" if link is None else str(link),
    )


GEN5 = LinkInfo(32.0, 16, 63e9, "NVML", 5)


def test_default_transfer_sweep_spans_kilobytes_to_256_mib() -> None:
    assert min(DEFAULT_SIZES) <= 4 << 10
    assert max(DEFAULT_SIZES) >= 256 << 20
    assert len(transfer_cases()) == 8
    assert {(d, m) for d, m, _ in transfer_cases()} == {
        ("H2D", "pageable"),
        ("H2D", "pinned"),
        ("D2H", "pageable"),
        ("D2H", "pinned"),
    }


def test_transfer_case_rate_and_share_of_peak() -> None:
    case = TransferCase(1 << 30, "H2D", "pinned", True, fake_measurement(0.05), 50e9)
    assert case.bytes_per_s == pytest.approx((1 << 30) / 0.05)
    assert case.percent_of_peak == pytest.approx(100 * (1 << 30) / 0.05 / 50e9)
    assert TransferCase(1, "H2D", "pinned", True, fake_measurement(1.0)).percent_of_peak is None
    d = case.to_dict()
    assert d["gb_per_s"] == pytest.approx(case.bytes_per_s / 1e9)
    assert d["first_copy_s"] == pytest.approx(0.5)


@pytest.mark.parametrize("link", [GEN5, None])
def test_transfer_tables_and_json(link: LinkInfo | None) -> None:
    result = fake_transfer(link)
    out = text_of(*render.transfer_tables(result))
    assert "256 MiB" in out
    assert "pinned alloc" in out
    assert (re.search(r"\d%", out) is not None) == (link is not None)
    d = result.to_dict()
    assert len(d["cases"]) == 24
    assert [a["size_bytes"] for a in d["allocation"]] == [4 << 10, 1 << 20, 256 << 20]
    assert (d["link"] is None) == (link is None)


@pytest.mark.parametrize("link", [GEN5, None])
def test_transfer_plot_is_written(tmp_path: Path, link: LinkInfo | None) -> None:
    path = plot_transfer(fake_transfer(link), tmp_path / "transfer.png")
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_transfer_and_overlap_refuse_non_cuda_devices() -> None:
    with pytest.raises(ConfigError, match="CUDA"):
        run_transfer(torch.device("cpu"))
    with pytest.raises(ConfigError, match="CUDA"):
        run_overlap(torch.device("cpu"))


@pytest.mark.parametrize(
    ("copy", "compute", "overlapped", "hidden"),
    [
        (1.0, 2.0, 2.0, 1.0),  # fully hidden
        (1.0, 2.0, 3.0, 0.0),  # sequential
        (1.0, 2.0, 2.5, 0.5),
        (1.0, 2.0, 3.5, 0.0),  # worse than sequential: clipped
        (1.0, 2.0, 1.0, 1.0),  # faster than compute alone (noise): clipped
        (0.0, 2.0, 2.0, 0.0),
    ],
)
def test_hidden_fraction(copy: float, compute: float, overlapped: float, hidden: float) -> None:
    assert hidden_fraction(copy, compute, overlapped) == pytest.approx(hidden)


def test_overlap_result_table_and_json() -> None:
    result = OverlapResult("cuda:0", 64 << 20, 32, 3, 0.040, 0.060, 0.062, 5)
    assert result.hidden == pytest.approx((0.04 + 0.06 - 0.062) / 0.04)
    assert result.best_possible == pytest.approx(31 / 32)
    d = result.to_dict()
    assert d["hidden_fraction"] == pytest.approx(result.hidden)
    assert d["sequential_s"] == pytest.approx(0.1)
    out = text_of(render.overlap_table(result))
    assert "hidden fraction" in out
    assert "95.0%" in out
    assert "DevicePrefetcher" not in out  # not run: no row
    assert d["prefetcher_hidden_fraction"] is None
    with_prefetcher = dataclasses.replace(result, prefetcher_s=0.064)
    assert with_prefetcher.prefetcher_hidden == pytest.approx((0.04 + 0.06 - 0.064) / 0.04)
    out = text_of(render.overlap_table(with_prefetcher))
    assert "hidden fraction, DevicePrefetcher" in out
    assert "90.0%" in out


def test_timing_on_cpu_uses_the_cpu_clock_and_skips_the_device_columns() -> None:
    result = compare_clocks(torch.device("cpu"), size=32, repeats=3, warmup=1)
    assert default_size(torch.device("cpu")) < default_size(torch.device("meta"))
    assert result.workload.startswith("matmul 32x32")
    measured = [row for row in result.rows if row.measurement is not None]
    skipped = [row for row in result.rows if row.measurement is None]
    assert [row.method for row in measured] == ["cpu clock"]
    assert measured[0].measurement is not None
    assert measured[0].measurement.count == 3
    assert {row.method for row in skipped} == {"naive wall clock", "device events"}
    assert all("CUDA only" in (row.skipped or "") for row in skipped)
    out = text_of(render.timing_table(result))
    assert "skipped" in out
    assert "CUDA only" in out
    d = result.to_dict()
    assert [row["skipped"] for row in d["rows"]] == [False, True, True]


def test_timing_rejects_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="repeats"):
        compare_clocks(torch.device("cpu"), repeats=0)


@pytest.mark.parametrize(
    ("text", "shape"), [("512", (512,)), ("-1,512", (512,)), ("3x224x224", (3, 224, 224))]
)
def test_parse_shape(text: str, shape: tuple[int, ...]) -> None:
    assert parse_shape(text) == shape


@pytest.mark.parametrize("text", ["", "-1", "a,b", "0", "4,-2"])
def test_parse_shape_rejects_nonsense(text: str) -> None:
    with pytest.raises(ConfigError, match="input shape"):
        parse_shape(text)


def test_model_specs() -> None:
    assert load_model_spec("seed-mlp").row_shape == (8,)
    assert load_model_spec("wide-mlp").row_shape == (512,)
    spec = load_model_spec("tests.bench.factories:tiny", "6")
    assert spec.row_shape == (6,)
    assert isinstance(spec.build(), torch.nn.Module)
    with pytest.raises(ConfigError, match="--input-shape"):
        load_model_spec("tests.bench.factories:tiny")
    with pytest.raises(ConfigError, match="unknown embedded model"):
        load_model_spec("no-such-model")
    with pytest.raises(ConfigError, match="cannot load"):
        load_model_spec("tests.bench.factories:missing", "6")
    with pytest.raises(ConfigError, match="cannot load"):
        load_model_spec("no_such_module_xyz:make", "6")
    # A module that does not exist is reported as such, not as a missing --input-shape.
    with pytest.raises(ConfigError, match=r"cannot load 'no_such_module_xyz:make'.*PYTHONPATH"):
        load_model_spec("no_such_module_xyz:make")
    with pytest.raises(ConfigError, match="not callable"):
        load_model_spec("tests.bench.factories:NOT_CALLABLE", "6")
    with pytest.raises(ConfigError, match=r"not a torch\.nn\.Module"):
        load_model_spec("tests.bench.factories:not_a_module", "6").build()
    with pytest.raises(ConfigError, match="module:callable"):
        load_model_spec(":make", "6")


def test_stages_on_cpu_report_copies_as_no_ops(tmp_path: Path) -> None:
    spec = load_model_spec("seed-mlp")
    result = run_stages(spec, torch.device("cpu"), batch_sizes=(1, 4), min_time=0.002, warmup=1)
    assert [row.batch_size for row in result.rows] == [1, 4]
    for row in result.rows:
        assert row.h2d is None
        assert row.d2h is None
        assert row.compute.count >= 5
        assert row.rows_per_s == pytest.approx(row.batch_size / row.total.median_s)
        assert row.peak_memory_bytes is None
    d = result.to_dict()
    assert d["batches"][0]["h2d_noop"] is True
    assert d["batches"][0]["h2d_s"] == 0.0
    assert d["batches"][1]["timings"]["d2h"] is None
    assert "not measured" in d["memory_note"]
    out = text_of(render.stages_table(result))
    assert "no-op" in out
    assert plot_stages(result, tmp_path / "model.png").read_bytes().startswith(PNG_MAGIC)


def test_stages_reject_bad_batches_and_dtypes() -> None:
    spec = load_model_spec("seed-mlp")
    with pytest.raises(ConfigError, match="batch sizes"):
        run_stages(spec, torch.device("cpu"), batch_sizes=(0,))
    with pytest.raises(ConfigError, match="dtype"):
        run_stages(spec, torch.device("cpu"), dtype="int8")


class _Out(NamedTuple):
    logits: torch.Tensor
    hidden: torch.Tensor | None


class _Structured(torch.nn.Module):
    """Returns what Hugging Face-style models return: a dict holding a named tuple and a list."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        logits = self.linear(x)
        return {"out": _Out(logits, None), "extra": [x.sum(), "label"]}


def test_stages_of_a_model_returning_dicts_and_tuples() -> None:
    spec = ModelSpec(name="structured", build=_Structured, row_shape=(4,))
    result = run_stages(spec, torch.device("cpu"), batch_sizes=(1, 3), min_time=0.001, warmup=1)
    assert [row.batch_size for row in result.rows] == [1, 3]


def test_to_host_keeps_the_structure_of_an_output() -> None:
    out = to_host({"out": _Out(torch.ones(2), None), "extra": [torch.zeros(1), "label"]})
    assert isinstance(out["out"], _Out)
    assert out["out"].hidden is None
    assert out["extra"][1] == "label"
    assert torch.equal(out["out"].logits, torch.ones(2))


def test_stages_of_a_model_taking_token_ids_with_an_integer_dtype() -> None:
    spec = ModelSpec(name="embedding", build=lambda: torch.nn.Embedding(10, 4), row_shape=(6,))
    result = run_stages(
        spec, torch.device("cpu"), batch_sizes=(2,), dtype="int64", min_time=0.001, warmup=1
    )
    assert result.dtype == "int64"
    assert result.rows[0].compute.count >= 5


def test_stages_with_another_dtype() -> None:
    spec = load_model_spec("seed-mlp")
    result = run_stages(
        spec, torch.device("cpu"), batch_sizes=(2,), dtype="float64", min_time=0.001
    )
    assert result.dtype == "float64"


@pytest.mark.cuda
def test_cuda_timing_shows_the_naive_clock_is_wrong() -> None:
    result = compare_clocks(torch.device("cuda", 0), size=4096, repeats=10)
    rows = {row.method: row.measurement for row in result.rows}
    naive, synced, events = (
        rows[m] for m in ("naive wall clock", "synchronised wall clock", "device events")
    )
    assert naive is not None
    assert synced is not None
    assert events is not None
    assert events.clock == "cuda events"
    # A 4096^3 matmul is milliseconds of device work; its launch is microseconds.
    assert naive.median_s < events.median_s
    assert synced.median_s > 0


@pytest.mark.cuda
def test_cuda_transfers() -> None:
    result = run_transfer(torch.device("cuda", 0), sizes=(64 << 10, 8 << 20), min_time=0.01)
    assert len(result.cases) == 16
    assert set(result.pinned_alloc_s) == {64 << 10, 8 << 20}
    for case in result.cases:
        assert case.bytes_per_s > 0
        assert case.measurement.clock == "cuda events"
        assert case.measurement.count >= 5
    d = result.to_dict()
    assert len(d["cases"]) == 16
    assert isinstance(d["link_note"], str)


@pytest.mark.cuda
def test_cuda_overlap() -> None:
    result = run_overlap(torch.device("cuda", 0), batch_bytes=8 << 20, batches=8, repeats=2)
    assert result.copy_s > 0
    assert result.compute_s > 0
    assert result.overlapped_s > 0
    assert 0.0 <= result.hidden <= 1.0
    assert result.matmuls_per_batch >= 1
    # Compute is sized to cover the copy, so the pipeline cannot cost more than both in a row
    # by more than the noise of a few launches.
    assert result.overlapped_s <= 1.5 * (result.copy_s + result.compute_s)


@pytest.mark.cuda
def test_cuda_overlap_hides_nine_tenths_of_the_copy() -> None:
    # The target: with compute per batch at least the copy time, 90 % or more of the
    # copy hides, in the hand-written pipeline and through DevicePrefetcher alike. With 32
    # batches the best reachable is 31/32 (the first copy has nothing to hide behind).
    result = run_overlap(torch.device("cuda", 0), batch_bytes=32 << 20, batches=32, repeats=3)
    assert result.compute_s >= result.copy_s
    assert result.hidden >= 0.9, result.to_dict()
    assert result.prefetcher_hidden is not None
    assert result.prefetcher_hidden >= 0.9, result.to_dict()


@pytest.mark.cuda
def test_cuda_stages_measure_copies_and_memory() -> None:
    result = run_stages(
        load_model_spec("wide-mlp"), torch.device("cuda", 0), batch_sizes=(8,), min_time=0.01
    )
    row = result.rows[0]
    assert row.h2d is not None
    assert row.d2h is not None
    assert row.h2d.clock == "cuda events"
    assert row.peak_memory_bytes is not None
    assert row.peak_memory_bytes > 0


def test_three_way_comparison_rows_and_explanation() -> None:
    from torchplace.bench import timing as timing_module
    from torchplace.bench.timer import Timer

    timer = Timer(device="cpu", warmup=1, repeats=4, spread_warning=None)
    a = torch.randn(32, 32)
    result = timing_module._three_ways(lambda: a @ a, timer, workload="mm 32", repeats=4)
    assert [row.method for row in result.rows] == list(timing_module.METHODS)
    for row in result.rows:
        assert row.measurement is not None
        assert row.measurement.count == 4
        assert row.skipped is None
    assert "no sync" in (result.rows[0].measurement.clock if result.rows[0].measurement else "")
    assert "asynchronously" in result.explanation
    assert "mm 32" in text_of(render.timing_table(result))


def _load_script(name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_script_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_timer_vs_peers_skips_a_peer_that_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    script = _load_script("timer_vs_peers", monkeypatch)

    def broken(fn: Any, device: Any, min_time: float) -> float:
        raise RuntimeError("no C compiler for the helper")

    monkeypatch.setattr(script, "time_torch_benchmark", broken)
    monkeypatch.setattr(script, "workloads", lambda device: {"tiny": lambda: None})
    rows, targets = script.run(torch.device("cpu"), rounds=1, min_time=0.001)
    assert {row.timer for row in rows} == {"torchplace"}
    assert len(targets) == 1
    assert targets[0].passed is None  # skipped, not failed, and it says why
    assert "no C compiler" in targets[0].note


class FakeDriverConfig:
    """triton.runtime.driver as do_bench sees it: ``active`` starts the driver on first use."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.stand_in: Any = None

    @property
    def active(self) -> Any:
        if self.stand_in is not None:
            return self.stand_in
        if self.error is not None:
            raise self.error
        return "the real driver"

    def set_active(self, driver: Any) -> None:
        self.stand_in = driver


def _fake_triton(monkeypatch: pytest.MonkeyPatch, error: Exception | None) -> FakeDriverConfig:
    import sys
    import types

    config = FakeDriverConfig(error)
    triton = types.ModuleType("triton")
    runtime = types.ModuleType("triton.runtime")
    runtime.driver = config  # type: ignore[attr-defined]
    triton.runtime = runtime  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton", triton)
    monkeypatch.setitem(sys.modules, "triton.runtime", runtime)
    return config


def test_timer_vs_peers_keeps_triton_s_own_driver_when_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = _load_script("timer_vs_peers", monkeypatch)
    config = _fake_triton(monkeypatch, None)
    assert script.prepare_triton() == ""
    assert config.stand_in is None


def test_timer_vs_peers_stands_in_for_a_triton_driver_that_cannot_build(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # triton's CUDA driver compiles a C helper on first use; without a compiler or a libcuda.so
    # link, do_bench still runs, with a driver answering its three calls as triton's does.
    script = _load_script("timer_vs_peers", monkeypatch)
    config = _fake_triton(monkeypatch, AssertionError("libcuda.so cannot found!\nPossible ..."))
    note = script.prepare_triton()
    assert "AssertionError: libcuda.so cannot found!" in note
    assert "stand-in" in note
    driver = config.active
    assert isinstance(driver, script.StandInTritonDriver)
    assert driver.get_device_interface() is torch.cuda
    cache = torch.ones(8, dtype=torch.int)
    driver.clear_cache(cache)
    assert int(cache.abs().sum()) == 0


def test_timer_vs_peers_times_triton_in_seconds_on_the_chosen_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import contextlib
    import sys
    import types

    script = _load_script("timer_vs_peers", monkeypatch)
    calls: list[tuple[Any, ...]] = []

    def do_bench(fn: Any, warmup: int = 25, rep: int = 100, **kwargs: Any) -> float:
        calls.append((warmup, rep, kwargs))
        return 2.5  # milliseconds, as triton returns

    testing = types.ModuleType("triton.testing")
    testing.do_bench = do_bench  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    monkeypatch.setitem(sys.modules, "triton.testing", testing)
    entered: list[Any] = []

    @contextlib.contextmanager
    def on_device(device: Any) -> Any:
        entered.append(device)
        yield

    monkeypatch.setattr(torch.cuda, "device", on_device)
    seconds = script.time_triton(lambda: None, torch.device("cuda", 1), 0.1)
    assert seconds == pytest.approx(2.5e-3)
    assert calls == [(25, 100, {"return_mode": "median"})]
    assert entered == [torch.device("cuda", 1)]


@dataclasses.dataclass(frozen=True)
class _DataclassOut:
    logits: torch.Tensor
    label: str


def test_to_host_copies_the_tensors_of_a_dataclass_output(monkeypatch: pytest.MonkeyPatch) -> None:
    copied: list[torch.Tensor] = []
    real_cpu = torch.Tensor.cpu

    def cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        copied.append(self)
        return real_cpu(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", cpu)
    logits = torch.ones(2)
    out = to_host({"out": _DataclassOut(logits, "cat")})
    assert len(copied) == 1
    assert copied[0] is logits
    assert isinstance(out["out"], _DataclassOut)
    assert out["out"].label == "cat"


def test_a_model_returning_an_object_without_tensors_to_copy_is_refused() -> None:
    spec = load_model_spec("tests.bench.factories:returns_opaque", "6")
    with pytest.raises(ConfigError, match="returned _Opaque, in which bench model finds no tensor"):
        run_stages(spec, torch.device("cpu"), batch_sizes=(1,), min_time=0.001, warmup=1)


def test_a_model_in_train_mode_is_run_in_eval_mode_and_the_report_says_so() -> None:
    from tests.bench.factories import in_train_mode

    built: list[Any] = []

    def build() -> torch.nn.Module:
        built.append(in_train_mode())
        return built[-1]

    spec = ModelSpec(name="dropout", build=build, row_shape=(6,))
    result = run_stages(spec, torch.device("cpu"), batch_sizes=(2,), min_time=0.001, warmup=1)
    assert built[0].modes
    assert not any(built[0].modes)
    assert "eval mode" in result.to_dict()["input"]
    assert "eval mode" in text_of(render.stages_table(result))


def test_the_report_says_how_the_input_was_made() -> None:
    spec = ModelSpec(name="embedding", build=lambda: torch.nn.Embedding(10, 4), row_shape=(6,))
    ids = run_stages(
        spec, torch.device("cpu"), batch_sizes=(2,), dtype="int64", min_time=0.001, warmup=1
    )
    assert "token ids 0 and 1" in ids.to_dict()["input"]
    assert "(batch, 6)" in ids.to_dict()["input"]
    floats = run_stages(load_model_spec("seed-mlp"), torch.device("cpu"), batch_sizes=(2,))
    assert "torch.randn(batch, 8)" in floats.to_dict()["input"]
