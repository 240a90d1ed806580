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
