"""``torchplace bench ...`` end to end on the CPU, through the real command-line entry point."""

from __future__ import annotations

import json
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from torchplace.bench import timing
from torchplace.bench.timer import TimingWarning
from torchplace.cli import main

ENVELOPE = {"schema", "command", "device", "torch", "torchplace", "result"}
RESULT = {"benchmark", "threads", "skipped", "reason", "figures", "plot", "warnings"}


def parse(text: str) -> dict[str, Any]:
    """The ``result`` of a bench JSON report, after checking its envelope."""
    document = json.loads(text)
    assert isinstance(document, dict)
    assert set(document) == ENVELOPE
    assert document["schema"] == "torchplace.bench/v1"
    assert document["command"] == "bench"
    result = document["result"]
    assert set(result) == RESULT
    assert isinstance(result, dict)
    result["device"] = document["device"]
    return result


def read(path: Path) -> dict[str, Any]:
    return parse(path.read_text())


def test_timing_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "timing.json"
    args = ["bench", "timing", "--device", "cpu", "--size", "48", "--repeats", "4"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "cpu clock" in out
    assert "skipped" in out
    assert "CUDA only" in out
    assert main([*args, "-o", str(path), "--json"]) == 0
    assert capsys.readouterr().out == ""  # the report went to the file
    document = read(path)
    assert document["benchmark"] == "timing"
    assert document["device"] == "cpu"
    assert document["skipped"] is False
    rows = document["figures"]["rows"]
    assert [row["method"] for row in rows] == ["cpu clock", "naive wall clock", "device events"]
    assert rows[0]["timing"]["count"] == 4
    assert rows[0]["timing"]["median_s"] > 0
    assert rows[1]["timing"] is None
    assert "CUDA only" in rows[1]["reason"]
    assert document["figures"]["explanation"]


def test_text_report_to_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "timing.txt"
    args = ["bench", "timing", "--device", "cpu", "--size", "8", "--repeats", "2"]
    assert main([*args, "-o", str(path)]) == 0
    assert capsys.readouterr().out == ""
    assert "cpu clock" in path.read_text()


@pytest.mark.parametrize("command", ["transfer", "overlap"])
def test_cuda_only_commands_skip_plainly_on_cpu(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / f"{command}.json"
    assert main(["bench", command, "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "skipped on cpu" in out
    assert "CUDA only" in out
    assert main(["bench", command, "--device", "cpu", "-o", str(path), "--json"]) == 0
    document = read(path)
    assert document["skipped"] is True
    assert "CUDA only" in document["reason"]
    assert document["figures"] is None


def test_transfer_plot_on_cpu_is_skipped_too(tmp_path: Path) -> None:
    plot = tmp_path / "t.png"
    assert main(["bench", "transfer", "--device", "cpu", "--plot", str(plot)]) == 0
    assert not plot.exists()


def test_model_json_to_stdout_is_pure_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "bench",
            "model",
            "--device",
            "cpu",
            "--batch-sizes",
            "1,4",
            "--min-time",
            "0.002",
            "--json",
        ]
    )
    assert rc == 0
    captured = capsys.readouterr()
    document = parse(captured.out)
    assert document["benchmark"] == "model"
    batches = document["figures"]["batches"]
    assert [b["batch_size"] for b in batches] == [1, 4]
    for batch in batches:
        assert batch["h2d_noop"] is True
        assert batch["d2h_noop"] is True
        assert batch["h2d_s"] == 0.0
        assert batch["d2h_s"] == 0.0
        assert batch["compute_s"] > 0
        assert batch["total_s"] > 0
        assert batch["rows_per_s"] == pytest.approx(batch["batch_size"] / batch["total_s"])
        assert batch["peak_memory_bytes"] is None


def test_model_table_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "model.png"
    rc = main(
        [
            "bench",
            "model",
            "--model",
            "seed-mlp",
            "--device",
            "cpu",
            "--batch-sizes",
            "2",
            "--min-time",
            "0.002",
            "--plot",
            str(plot),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "seed-mlp on cpu" in out
    assert "no-op" in out
    assert "wrote plot" in out
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_model_from_module_callable(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    rc = main(
        [
            "bench",
            "model",
            "--model",
            "tests.bench.factories:tiny",
            "--input-shape",
            "6",
            "--batch-sizes",
            "3",
            "--min-time",
            "0.002",
            "--device",
            "cpu",
            "--json",
            "-o",
            str(path),
        ]
    )
    assert rc == 0
    result = read(path)["figures"]
    assert result["model"] == "tests.bench.factories:tiny"
    assert result["row_shape"] == [6]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["model", "--model", "tests.bench.factories:tiny"], "--input-shape"),
        (["model", "--model", "no-such-model"], "unknown embedded model"),
        (["model", "--plot", "out.svg"], ".png"),
        (["timing", "--warmup", "-1"], "--warmup"),
        (["timing", "--device", "warp:0"], "warp"),
    ],
)
def test_usage_errors_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["model", "--batch-sizes", "1,x"], "'1,x' is not a comma-separated list"),
        (["transfer", "--sizes", "4Q"], "cannot read size '4Q'"),
        (["timing", "--repeats", "0"], "'0' is not a positive integer"),
        (["timing", "--repeats", "2.5"], "'2.5' is not a positive integer"),
        (["transfer", "--min-time", "nan"], "'nan' is not a positive finite number"),
        ([], "BENCHMARK"),
    ],
)
def test_bad_flags_are_argparse_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "flag", "value"),
    [
        ("model", "--batch-sizes", "1,,2"),
        ("model", "--batch-sizes", "1,2,"),
        ("model", "--batch-sizes", ",8"),
        ("model", "--input-shape", "3,,224"),
        ("model", "--input-shape", "3xx224"),
        ("transfer", "--sizes", "4K,,1M"),
        ("transfer", "--sizes", "4K,"),
    ],
)
def test_empty_list_entries_are_usage_errors(
    command: str, flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", command, flag, value, "--device", "cpu"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag in err
    assert f"{value!r} has an empty entry" in err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["timing", "--size", "8", "--json", "-o"], "-o"),
        (["model", "--batch-sizes", "1", "--plot"], "--plot"),
    ],
)
def test_unwritable_output_is_refused_before_running(
    argv: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suffix = ".png" if flag == "--plot" else ".json"
    missing = tmp_path / "nodir" / f"out{suffix}"
    assert main(["bench", *argv, str(missing), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert flag in err
    assert "does not exist" in err
    assert not missing.parent.exists()


def test_meta_device_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "timing", "--device", "meta"]) == 1
    assert "TimingError" in capsys.readouterr().err


def test_plot_without_matplotlib_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["bench", "model", "--device", "cpu", "--plot", "x.png"]) == 2
    assert "pip install 'torchplace[plot]'" in capsys.readouterr().err


def test_timing_warnings_become_notes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = timing.compare_clocks

    def noisy(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(TimingWarning("the spread is large (test)"), stacklevel=1)
        return real(*args, **kwargs)

    monkeypatch.setattr(timing, "compare_clocks", noisy)
    path = tmp_path / "t.json"
    args = ["bench", "timing", "--device", "cpu", "--size", "16", "--repeats", "2"]
    assert main(args) == 0
    assert "note: the spread is large (test)" in capsys.readouterr().out
    assert main([*args, "--json", "-o", str(path)]) == 0
    assert read(path)["warnings"] == ["the spread is large (test)"]


def test_help_lists_the_benchmarks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    for name in ("timing", "transfer", "overlap", "model"):
        assert name in out


def test_threads_flag_sets_torch_threads(tmp_path: Path) -> None:
    import torch

    before = torch.get_num_threads()
    path = tmp_path / "t.json"
    try:
        args = ["bench", "timing", "--device", "cpu", "--size", "8", "--repeats", "2"]
        assert main([*args, "--threads", "1", "--json", "-o", str(path)]) == 0
        assert read(path)["threads"] == 1
    finally:
        torch.set_num_threads(before)


_SHORT = ["--batch-sizes", "1", "--min-time", "0.001", "--input-shape", "6"]


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("raises", "cannot build 'tests.bench.factories:raises': RuntimeError: factory boom"),
        ("needs_args", "TypeError: needs_args() missing 1 required positional argument"),
        ("bad_forward", "failed on a 1x6 float32 input: ValueError: forward boom"),
        ("two_inputs", "calls forward with one input tensor; for a model that takes several"),
        ("dict_input", "calls model(x) with one tensor of shape (batch, 6)"),
        ("dict_input", "a dict, a tuple or several inputs needs a wrapper module"),
        ("embedding", "token ids: give --dtype int64"),
        ("INSTANCE", "is an nn.Module object, not a function that builds one"),
    ],
)
def test_a_model_that_fails_is_a_one_line_error(
    factory: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bench", "model", "--model", f"tests.bench.factories:{factory}", *_SHORT])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_a_wrong_input_shape_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    words = ["--batch-sizes", "1", "--min-time", "0.001", "--input-shape", "5"]
    assert main(["bench", "model", "--model", "tests.bench.factories:tiny", *words]) == 2
    err = capsys.readouterr().err
    assert "mat1 and mat2 shapes cannot be multiplied" in err
    assert "check --input-shape" in err


def test_what_the_model_prints_stays_out_of_the_json_report(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["bench", "model", "--model", "tests.bench.factories:loud", *_SHORT, "--json"])
    assert code == 0
    captured = capsys.readouterr()
    assert parse(captured.out)["benchmark"] == "model"
    assert "hello from the factory" in captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["timing", "--size", "100000"], "a 100000x100000 float32 matmul"),
        (["model", "--batch-sizes", "100000000"], "batch 100000000 of 'seed-mlp'"),
    ],
)
def test_sizes_past_the_free_memory_are_refused_before_allocating(
    argv: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from torchplace.bench import memory

    monkeypatch.setattr(memory, "host_available_bytes", lambda: 64 << 20)  # 64 MiB free
    assert main(["bench", *argv, "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "64 MiB free" in err


def test_an_absurd_thread_count_is_refused_not_a_crash(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "timing", "--threads", "100000"])
    assert exc.value.code == 2
    assert "more than the 1024 allowed" in capsys.readouterr().err


def _bench_parsers() -> list[Any]:
    import argparse

    from torchplace.bench import cli

    parser = argparse.ArgumentParser(prog="torchplace bench")
    cli.configure(parser)
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(subs.choices.values())


@pytest.mark.parametrize("sub", _bench_parsers(), ids=lambda p: p.prog.split()[-1])
def test_help_gives_every_default(sub: Any) -> None:
    """A flag with a default says it in --help (docs/bench.md and docs/cli.md quote them)."""
    import argparse

    for action in sub._actions:
        default = action.default
        if default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            continue
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else str(default)
        assert re.search(rf"default:? {re.escape(shown)}\b", action.help or ""), (
            f"{sub.prog} {action.option_strings[-1]}: --help hides its default {shown}"
        )
