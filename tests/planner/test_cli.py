"""The command: output convention, exit statuses, the exported device map, the plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchplace import report
from torchplace.cli import main

jsonschema = pytest.importorskip("jsonschema")


def _validate(document: dict[str, object]) -> None:
    jsonschema.validate(document, report.load_schema("plan"))


def test_json_report_validates_against_the_shipped_schema(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code = main(
        ["plan", "--model", "wide-mlp", "--batch", "1,4", "--format", "json", "-o", str(out)]
    )
    assert code == 0
    document = json.loads(out.read_text())
    _validate(document)
    assert document["schema"] == "torchplace.plan/v1"
    assert document["device"] == "cuda:0,cuda:1"
    assert document["result"]["devices"][0]["assumed"] is True


def test_json_with_verify_validates(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--model", "wide-mlp", "--strategy", "pipeline", "--verify", "--json"])
    document = json.loads(capsys.readouterr().out)
    _validate(document)
    assert code == 0
    assert document["result"]["verify"]["ok"] is True


def test_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "seed-mlp"]) == 0
    assert "Exercise 8: seed-mlp" in capsys.readouterr().out
    # llama-7b-like needs 12.6 GiB of weights: two 4 GiB devices cannot hold it
    assert main(["plan", "--model", "wide-mlp", "--assume", "2x16MiB"]) == 1
    assert main(["plan", "--assume", "2xB300"]) == 2
    assert "unknown device model 'B300'" in capsys.readouterr().err
    assert main(["plan", "--batch", "0"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--strategy", "greedy"])
    assert exc.value.code == 2


def test_assumed_figures_are_printed_as_assumed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--assume", "2x80GiB", "--link", "pcie5"]) == 0
    text = capsys.readouterr().out
    assert "devices (assumed figures)" in text
    assert "pcie5 52 GB/s" in text
    assert "80.00 GiB" in text


def test_exported_device_map_dispatches_with_accelerate(tmp_path: Path) -> None:
    import torch
    from accelerate import dispatch_model
    from accelerate.utils import get_max_memory

    from torchplace.models import build_model

    path = tmp_path / "map.json"
    assert (
        main(
            [
                "plan",
                "--model",
                "wide-mlp",
                "--strategy",
                "pipeline",
                "--export",
                "device-map",
                str(path),
            ]
        )
        == 0
    )
    exported = json.loads(path.read_text())
    assert set(exported["device_map"].values()) == {0, 1}
    max_memory = {int(k): v for k, v in exported["max_memory"].items()}
    assert get_max_memory({**max_memory, "cpu": 1 << 30})[0] == max_memory[0]
    # This machine has no GPU: send every planned device to the CPU, keeping the map's keys.
    model = build_model("wide-mlp")
    x = torch.randn(3, 512)
    want = model(x)
    dispatched = dispatch_model(model, device_map=dict.fromkeys(exported["device_map"], "cpu"))
    assert torch.equal(dispatched(x), want)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "plan.png"
    assert main(["plan", "--model", "wide-mlp", "--strategy", "pipeline", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_explicit_map_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"device_map": {"0": 0, "1": 0, "2": 1, "3": 1, "4": 1}}))
    assert (
        main(["plan", "--model", "wide-mlp", "--strategy", "map", "--map", str(path), "--json"])
        == 0
    )
    result = json.loads(capsys.readouterr().out)["result"]
    assert result["strategy"] == "map"
    assert [e["consumer"] for e in result["crossings"]["edges"] if e["kind"] == "d2d"] == ["2"]
    path.write_text(json.dumps({"0": 5}))
    assert main(["plan", "--model", "wide-mlp", "--strategy", "map", "--map", str(path)]) == 2
    assert "not one of the plan's devices" in capsys.readouterr().err


def test_a_map_given_alone_is_planned_and_a_bad_one_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "map.json"
    path.write_text(json.dumps({"0": 0, "1": 0, "2": 1, "3": 1, "4": 1}))
    assert main(["plan", "--model", "wide-mlp", "--map", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["result"]["strategy"] == "map"
    assert main(["plan", "--model", "wide-mlp", "--strategy", "pipeline", "--map", str(path)]) == 2
    assert "read by strategy 'map' only" in capsys.readouterr().err
    assert main(["plan", "--model", "wide-mlp", "--map", str(tmp_path / "none.json")]) == 2
    assert "cannot read the map file" in capsys.readouterr().err


def test_an_empty_device_list_and_an_unwritable_output_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--model", "seed-mlp", "--devices", ""]) == 2
    assert "names no device" in capsys.readouterr().err
    assert main(["plan", "--model", "seed-mlp", "-o", str(tmp_path / "no" / "x.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


_FACTORIES = """\
import sys
import torch


def loud():
    print("hello from the factory")
    return torch.nn.Sequential(torch.nn.Linear(8, 4))


def raises():
    raise RuntimeError("factory boom")


def needs(width):
    return torch.nn.Linear(width, 2)


def exits():
    sys.exit(3)


class _Bad(torch.nn.Module):
    def forward(self, x):
        raise ValueError("forward boom")


def bad_forward():
    return _Bad()
"""


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "plan_factories_mod.py").write_text(_FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "plan_factories_mod"


def test_what_the_factory_prints_stays_out_of_the_json_report(
    factories: str, capsys: pytest.CaptureFixture[str]
) -> None:
    words = ["plan", "--model", f"{factories}:loud", "--input", "x:FP32:-1,8", "--json"]
    assert main([*words, "--strategy", "pipeline", "--verify"]) == 0
    captured = capsys.readouterr()
    _validate(json.loads(captured.out))  # stdout is the report alone
    assert "hello from the factory" in captured.err


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("raises", "RuntimeError: factory boom"),
        ("needs", "TypeError: needs() missing 1 required positional argument"),
        ("exits", "SystemExit: 3"),
    ],
)
def test_a_factory_that_fails_is_a_one_line_error(
    factories: str, name: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    words = ["plan", "--model", f"{factories}:{name}", "--input", "x:FP32:-1,8"]
    assert main(words) == 2
    err = capsys.readouterr().err
    assert f"cannot build the model '{factories}:{name}': {message}" in err
    assert "Traceback" not in err


def test_a_forward_that_raises_is_a_one_line_usage_error(
    factories: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--model", f"{factories}:bad_forward", "--input", "x:FP32:-1,8"]) == 2
    err = capsys.readouterr().err
    assert "its forward raised ValueError: forward boom" in err


def test_a_forward_needing_a_non_tensor_argument_names_the_fix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--model", "tests.planner.toy:make_needs_flag"]) == 2
    err = capsys.readouterr().err
    assert "missing 1 required positional argument: 'flag'" in err
    assert "give a non-tensor argument (an int or bool flag) a default" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["--batch", "1-1048576"], "more than 1024 batch sizes"),
        (["--batch", "1-"], "cannot read --batch '1-'"),
        (["--batch", "8-2"], "a range must go up"),
        (["--assume", "100000xH200"], "more than the 1024 a plan takes"),
        (["--assume", ""], "--assume '' names no device"),
        (["--assume", "2x0GiB"], "a device of 0GiB holds nothing"),
        (["--reserve", "margin=nan"], "margin is a fraction"),
        (["--reserve", "cuda_context=-5MiB"], "cuda_context is a size of 0 or more"),
        (["--model", "gpt2-like", "--seq", "0"], "--seq 0: a sequence length is 1 or more"),
        (["--export", "device-map", "/no/such/dir/map.json"], "--export device-map"),
        (["--plot", "/no/such/dir/p.png"], "--plot '/no/such/dir/p.png'"),
    ],
)
def test_edge_values_are_usage_errors_before_any_work(
    words: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *words]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_a_failed_export_write_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    assert main(["plan", "--export", "device-map", "/dev/full"]) == 1
    assert "cannot use '/dev/full': No space left on device" in capsys.readouterr().err


@pytest.mark.parametrize(("sizes", "device"), [("0", 0), ("1GiB,0.1", 1)])
def test_a_max_memory_of_no_bytes_names_the_device_and_the_fix(
    capsys: pytest.CaptureFixture[str], sizes: str, device: int
) -> None:
    # it said "must be a list of byte counts", which 0 is
    assert main(["plan", f"--max-memory={sizes}"]) == 2
    err = capsys.readouterr().err
    assert f"device {device} is given 0 bytes, which hold no weights" in err
    assert "give each device one byte or more" in err
