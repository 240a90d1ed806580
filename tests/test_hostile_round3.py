"""Hostile input, round 3: checkpoints, timers, the doctor's and bench's text reports, outputs.

Each test pins one fault that an odd input used to cause (a traceback, silent wrong output or
lost data) and the clear refusal or faithful output that replaced it; its docstring says the
attack.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import torchplace
from torchplace import load_checkpoint, measure
from torchplace.errors import CheckpointError, ConfigError, TimingError
from torchplace.report import check_distinct

sys.path.insert(0, str(Path(__file__).parent))
from doctor.machines import H200, machine, report_for


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``torchplace ARGS`` from ``cwd``, in a fresh interpreter importing this torchplace."""
    package_root = str(Path(torchplace.__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "torchplace.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": path},
    )


# ---------------------------------------------------------------------------- checkpoints


def test_an_index_nested_past_the_recursion_limit_is_a_checkpoint_error(tmp_path: Path) -> None:
    """Attack: a ``*.index.json`` of 100,000 nested arrays; json.loads raised RecursionError."""
    index = tmp_path / "model.safetensors.index.json"
    index.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match="nests deeper"):
        load_checkpoint(index)


def test_a_shard_lacking_tensors_its_index_maps_to_it_is_refused(tmp_path: Path) -> None:
    """Attack: an index from one save beside a shard from another (a partial re-download). The
    tensors the index names but the shard lacks were silently left out of the state dict."""
    save_file({"w": torch.zeros(2)}, tmp_path / "model-00001-of-00001.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    weight_map = {"w": "model-00001-of-00001.safetensors", "v": "model-00001-of-00001.safetensors"}
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=r"lacks 1 of the 2 tensor\(s\).*\(v\)"):
        load_checkpoint(index)


@pytest.mark.parametrize("flag", ["strict", "allow_pickle"])
def test_a_flag_given_as_a_string_is_refused(tmp_path: Path, flag: str) -> None:
    """Attack: ``strict="False"`` (from a config file); any non-empty string counted as true."""
    path = tmp_path / "w.pt"
    torch.save(nn.Linear(2, 2).state_dict(), path)
    with pytest.raises(ConfigError, match=rf"{flag}='False'"):
        load_checkpoint(path, **{flag: "False"})  # type: ignore[arg-type]


def test_complex_weights_into_a_real_module_are_refused_not_truncated(tmp_path: Path) -> None:
    """Attack: complex weights loaded into a float module; copy_ dropped the imaginary parts
    with only a warning, and the module held wrong weights."""
    path = tmp_path / "c.pt"
    torch.save(
        {"weight": torch.ones(2, 2, dtype=torch.complex64) * 1j, "bias": torch.ones(2)}, path
    )
    module = nn.Linear(2, 2)
    before = module.weight.detach().clone()
    with pytest.raises(CheckpointError, match=r"weight \(complex64 in the checkpoint, float32"):
        load_checkpoint(path, module=module)
    assert torch.equal(module.weight, before)  # untouched


def test_a_numpy_npz_is_named_as_a_zip_torch_did_not_write(tmp_path: Path) -> None:
    """Attack: a numpy ``.npz`` (a zip archive); the error was torch's C++ enforce text."""
    path = tmp_path / "weights.npz"
    np.savez(path, w=np.zeros(3))
    with pytest.raises(CheckpointError, match=r"not one torch\.save wrote.*numpy\.load"):
        load_checkpoint(path)


# ---------------------------------------------------------------------------- timers


def test_a_seconds_clock_is_refused() -> None:
    """Attack: ``clock=time.perf_counter`` (seconds, not nanoseconds); every time came out a
    billion times too small ("median 0.00108 ns") without a word."""
    with pytest.raises(ConfigError, match="perf_counter_ns"):
        measure(lambda: None, device="cpu", warmup=0, repeats=2, clock=time.perf_counter)  # type: ignore[arg-type]


def test_a_clock_that_goes_backwards_is_a_timing_error() -> None:
    """Attack: a clock that is set back (wall time); negative call times were reported."""
    ticks = itertools.count(10**12, -1000)
    with pytest.raises(TimingError, match="went backwards"):
        measure(lambda: None, device="cpu", warmup=0, repeats=3, clock=lambda: next(ticks))


# ---------------------------------------------------------------------------- text reports


def test_doctor_text_shows_control_characters_as_escapes() -> None:
    """Attack: CUDA_VISIBLE_DEVICES holding a terminal escape sequence (clear screen); the text
    report wrote it raw, so printing the report cleared the terminal."""
    from torchplace.doctor.rendering import render

    report = report_for("auto", machine(H200, env={"CUDA_VISIBLE_DEVICES": "0\x1b[2J"}))
    out = io.StringIO()
    render(report, file=out)
    assert "\x1b" not in out.getvalue()
    assert "0\\x1b[2J" in out.getvalue()


def test_bench_text_prints_a_plot_path_with_brackets_as_given(tmp_path: Path) -> None:
    """Attack: ``--plot 'x[bold]y.png'``; rich read the brackets as markup and the report said
    it wrote ``xy.png``, a file that does not exist."""
    pytest.importorskip("matplotlib")
    proc = _cli(
        [
            "bench", "model", "--device", "cpu", "--batch-sizes", "1", "--min-time", "0.001",
            "--plot", "x[bold]y.png",
        ],
        tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "x[bold]y.png").is_file()
    assert "wrote plot x[bold]y.png" in proc.stdout


# ---------------------------------------------------------------------------- outputs


def test_bench_model_output_onto_the_model_source_is_refused(tmp_path: Path) -> None:
    """Attack: ``bench model --model mymod:make -o mymod.py``; the report overwrote the user's
    model source."""
    source = "import torch\n\n\ndef make():\n    return torch.nn.Linear(4, 2)\n"
    (tmp_path / "mymod.py").write_text(source)
    proc = _cli(
        [
            "bench", "model", "--device", "cpu", "--model", "mymod:make", "--input-shape", "4",
            "--batch-sizes", "1", "--min-time", "0.001", "--json", "-o", "mymod.py",
        ],
        tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "mymod.py" in proc.stderr
    assert "input" in proc.stderr
    assert (tmp_path / "mymod.py").read_text() == source


def test_plan_output_onto_the_model_source_is_refused(tmp_path: Path) -> None:
    """Attack: ``plan --model mymod:make -o mymod.py``; as with bench, the report would
    overwrite the model's own source."""
    source = "import torch\n\n\ndef make():\n    return torch.nn.Linear(4, 2)\n"
    (tmp_path / "mymod.py").write_text(source)
    proc = _cli(
        ["plan", "--model", "mymod:make", "--input", "x:FP32:-1,4", "--json", "-o", "mymod.py"],
        tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert "mymod.py" in proc.stderr
    assert "input" in proc.stderr
    assert (tmp_path / "mymod.py").read_text() == source


def test_check_distinct_still_allows_other_outputs(tmp_path: Path) -> None:
    check_distinct([tmp_path / "r.json"], [tmp_path / "mymod.py"])


def test_a_report_that_fails_half_way_leaves_the_previous_file(tmp_path: Path) -> None:
    """Attack: ``-o report.json`` over last run's report, and the new one fails half-way (a full
    disk, Ctrl-C, an error while drawing a table); the file was truncated first and left
    holding half a report, the previous one lost."""
    from torchplace.report import open_report

    path = tmp_path / "report.json"
    path.write_text("previous report\n")
    path.chmod(0o640)

    def interrupted() -> None:
        with open_report(path) as out:
            out.write("half a rep")
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    assert path.read_text() == "previous report\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary file left
    with open_report(path) as out:
        out.write("new report\n")
    assert path.read_text() == "new report\n"
    assert path.stat().st_mode & 0o777 == 0o640  # the old file's permissions kept


def test_a_report_through_a_symbolic_link_keeps_the_link(tmp_path: Path) -> None:
    from torchplace.report import write_report

    (tmp_path / "real.txt").write_text("old\n")
    (tmp_path / "link.txt").symlink_to("real.txt")
    write_report("new\n", tmp_path / "link.txt")
    assert (tmp_path / "link.txt").is_symlink()
    assert (tmp_path / "real.txt").read_text() == "new\n"


@pytest.mark.parametrize(
    ("module", "state"), [(nn.Linear(2, 2), [1, 2]), (nn.Linear(2, 2), None), ("model", {})]
)
def test_compare_state_dict_refuses_what_is_no_module_or_mapping(
    module: object, state: object
) -> None:
    """Attack: ``compare_state_dict(model, list_or_None)`` or a non-module; it raised
    AttributeError/TypeError from deep inside."""
    from torchplace.checkpoint import compare_state_dict

    with pytest.raises(ConfigError, match="compare_state_dict"):
        compare_state_dict(module, state)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- bench API


@pytest.mark.parametrize("size", [0, 2.5, True])
def test_compare_clocks_refuses_a_size_that_is_no_positive_int(size: object) -> None:
    """Attack: ``compare_clocks(cpu, size=0)`` silently timed the default 1024x1024 product
    (0 read as "not given"); a float or bool size raised torch's TypeError."""
    from torchplace.bench.timing import compare_clocks

    with pytest.raises(ConfigError, match="size must be a positive int"):
        compare_clocks(torch.device("cpu"), size=size, repeats=1, warmup=0)  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore::torchplace.bench.timer.TimingWarning")  # a busy machine
def test_run_stages_takes_a_torch_dtype_and_refuses_fractional_batches() -> None:
    """Attack: ``run_stages(..., dtype=torch.float16)`` was refused as an unknown dtype while
    the message listed float16; ``batch_sizes=[1.5]`` raised torch's TypeError."""
    from torchplace.bench.stages import load_model_spec, run_stages

    spec, cpu = load_model_spec("seed-mlp"), torch.device("cpu")
    result = run_stages(spec, cpu, batch_sizes=(1,), dtype=torch.float16, min_time=0.01)
    assert result.dtype == "float16"
    with pytest.raises(ConfigError, match="batch sizes must be positive integers"):
        run_stages(spec, cpu, batch_sizes=[1.5], min_time=0.01)  # type: ignore[list-item]


# ---------------------------------------------------------------------------- plain objects


class _Rope:
    """A plain helper object caching tensors, as rotary-embedding code often keeps them."""

    def __init__(self) -> None:
        self.cos = torch.ones(4)
        self.sin = torch.zeros(4)


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(4, 4)
        self.rope = _Rope()


def test_audit_finds_tensors_a_plain_helper_object_keeps() -> None:
    """Attack: a module keeping a cache of tensors in a plain helper object (``self.rope =
    Rope()``); module.to() leaves them behind, but the audit reported no stray."""
    from torchplace import audit_module

    audit = audit_module(_Attention().to("meta"))
    assert [s.name for s in audit.strays] == ["rope.cos", "rope.sin"]


def test_check_same_device_reads_a_plain_objects_tensors() -> None:
    """Attack: a cpu tensor inside a plain object passed beside meta ones; the check passed."""
    from torchplace import MixedDeviceError, check_same_device

    with pytest.raises(MixedDeviceError, match=r"rope\.cos"):
        check_same_device(x=torch.ones(1, device="meta"), rope=_Rope())


def test_move_refuses_a_plain_object_whose_tensors_it_cannot_put_back() -> None:
    """Attack: ``move([Batch(x)], "meta")`` with a plain class; it came back with its tensors
    still on the cpu, without a word."""
    from torchplace import move

    with pytest.raises(ConfigError, match=r"value\[0\] is a _Rope .*\(cos, sin\).*dataclass"):
        move([_Rope()], "meta")


def test_a_plain_object_already_in_place_still_passes() -> None:
    """Regression guard: a plain object whose tensors are already on the device is no reason
    to refuse (the CPU pass-through of a DevicePrefetcher over such batches)."""
    from torchplace import DevicePrefetcher, move

    rope = _Rope()
    assert move([rope], "cpu")[0] is rope
    assert next(iter(DevicePrefetcher([rope], "cpu"))) is rope


class _Config(Mapping[str, object]):
    """A read-only mapping whose constructor takes more than its items."""

    def __init__(self, data: dict[str, object], *, name: str) -> None:
        self._data = dict(data)
        self.name = name

    def __getitem__(self, key: str) -> object:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def test_a_mapping_that_cannot_be_rebuilt_is_refused_not_turned_into_a_dict() -> None:
    """Attack: ``move`` of a Mapping (not a dict) whose constructor needs a keyword; it came back
    as a plain dict, its type and attributes (``.name``) silently gone."""
    from torchplace import move

    batch = _Config({"x": torch.ones(1)}, name="n")
    with pytest.raises(ConfigError, match=r"cannot rebuild a _Config"):
        move(batch, "meta")
    assert move(batch, "cpu") is batch  # nothing to change: passed back as it is


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch's own, on loading with full pickle
def test_a_whole_module_saved_under_a_key_loads_as_its_state_dict(tmp_path: Path) -> None:
    """Attack: a training checkpoint that saves the module itself under a key, as YOLOv5's do
    (``{"model": model.half(), "epoch": 3}``); trusted with allow_pickle=True, it was still
    refused ("none of the keys ... holds one"), and ``key="model"`` too."""
    src = nn.Linear(2, 2)
    path = tmp_path / "last.pt"
    torch.save({"model": src.half(), "epoch": 3}, path)
    dst = nn.Linear(2, 2)
    state = load_checkpoint(path, allow_pickle=True, module=dst)
    assert sorted(state) == ["bias", "weight"]
    assert torch.equal(dst.weight, src.weight.float())
    assert sorted(load_checkpoint(path, allow_pickle=True, key="model")) == ["bias", "weight"]
    torch.save({"ema": nn.Linear(2, 2), "epoch": 3}, path)  # the one entry holding one
    assert sorted(load_checkpoint(path, allow_pickle=True)) == ["bias", "weight"]


@pytest.mark.skipif(not Path("/dev/stdout").exists(), reason="needs /dev/stdout")
def test_output_to_dev_stdout_that_is_a_pipe_is_written(tmp_path: Path) -> None:
    """Attack: ``-o /dev/stdout`` with stdout a pipe (``| jq`` in CI); the link resolves to
    ``/proc/PID/fd/pipe:[N]``, which is no file, and the path was refused with "No such file
    or directory"."""
    proc = _cli(["doctor", "--no-smoke", "--json", "-o", "/dev/stdout"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["command"] == "doctor"


def test_rich_rendering_of_an_audit_shows_bracketed_keys_as_they_are() -> None:
    """Attack: a stray dict keyed by special tokens (``{"[CLS]": ..., "[/INST]": ...}``);
    ``rich.print(audit)`` read the keys as markup and raised MarkupError."""
    from rich.console import Console

    from torchplace import audit_module

    module = nn.Linear(2, 2)
    module.special = {"[CLS]": torch.tensor(101), "[/INST]": torch.tensor(5)}
    console = Console(file=io.StringIO(), width=120)
    console.print(audit_module(module))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert 'special["[CLS]"]' in text
    assert 'special["[/INST]"]' in text


@pytest.mark.parametrize("columns", ["0", "1", "abc"])
def test_a_text_report_under_an_unusable_columns_is_still_drawn(
    columns: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack: ``COLUMNS=0`` (as some CI shells set it); the doctor's and bench's text reports
    came out empty (0 bytes) with exit status 0, and ``COLUMNS=1`` one character a line."""
    from torchplace.cli import main

    monkeypatch.setenv("COLUMNS", columns)
    assert main(["doctor", "--device", "cpu", "--no-smoke"]) == 0
    assert "verdict: cpu is usable" in capsys.readouterr().out
    assert main(["bench", "timing", "--device", "cpu", "--size", "8", "--repeats", "1"]) == 0
    assert "cpu clock" in capsys.readouterr().out


def test_assert_on_lists_the_first_rows_of_thousands_and_a_count() -> None:
    """Attack: a model of thousands of layers each with a stray; ``assert_on`` raised a
    message of one row per tensor (2,500 lines, 98 KB)."""
    from torchplace import PlacementError, audit_module

    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(300)]).to("meta")
    for layer in model:
        layer.cache = torch.ones(1)
    with pytest.raises(PlacementError, match=r"300 tensor\(s\) not on meta") as err:
        audit_module(model).assert_on("meta")
    assert str(err.value).count("\n") < 60
    assert "... and 250 more (audit.off(device) lists them all)" in str(err.value)
