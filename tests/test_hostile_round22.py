"""Hostile round 22: inputs a new or hostile user gives the non-server commands."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

import torchplace
from torchplace.errors import ConfigError


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchplace", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        check=False,
    )


# --- plan --exported given another kind of torch file ----------------------------------------


def test_plan_exported_refuses_a_torch_save_checkpoint_by_name(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt2"
    torch.save(nn.Linear(8, 2).state_dict(), path)
    with pytest.raises(ConfigError, match=r"torch\.save checkpoint.*not a torch\.export program"):
        torchplace.plan(exported=path)


@pytest.mark.filterwarnings("ignore:`torch.jit.* is deprecated")
def test_plan_exported_refuses_a_torchscript_archive_by_name(tmp_path: Path) -> None:
    path = tmp_path / "script.pt2"
    torch.jit.save(torch.jit.script(nn.Linear(8, 2)), str(path))
    with pytest.raises(ConfigError, match=r"TorchScript archive \(torch\.jit\.save\)"):
        torchplace.plan(exported=path)


def test_plan_exported_refuses_a_foreign_zip_naming_what_it_holds(tmp_path: Path) -> None:
    path = tmp_path / "other.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("hello.txt", "x")
    with pytest.raises(ConfigError, match=r"not one torch\.export\.save wrote.*'hello\.txt'"):
        torchplace.plan(exported=path)


def test_plan_exported_damaged_archive_says_why_not_warnings_above(tmp_path: Path) -> None:
    real = tmp_path / "real.pt2"
    torch.export.save(torch.export.export(nn.Linear(8, 2), (torch.randn(1, 8),)), real)
    broken = tmp_path / "broken.pt2"
    with zipfile.ZipFile(real) as src, zipfile.ZipFile(broken, "w") as dst:
        for name in src.namelist():
            if not name.endswith("models/model.json"):
                dst.writestr(name, src.read(name))
    with pytest.raises(ConfigError) as info:
        torchplace.plan(exported=broken)
    assert "warnings above" not in str(info.value)
    assert "no exported program" in str(info.value)


def test_plan_cli_exported_checkpoint_is_one_line_without_torch_traceback(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "w.pt2")
    done = _cli("plan", "--exported", "w.pt2", "--json", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert 'File "' not in done.stderr
    assert done.stderr.count("\n") == 1
    assert "torch.save checkpoint" in done.stderr


# --- an old weight_norm checkpoint into a model using parametrizations.weight_norm -------------


@pytest.mark.filterwarnings("ignore:.*torch.nn.utils.weight_norm.* is deprecated")
def test_old_weight_norm_checkpoint_loads_into_parametrized_weight_norm(tmp_path: Path) -> None:
    """torch's own load_state_dict renames weight_g/weight_v (a pre-hook of
    parametrizations.weight_norm); load_checkpoint compared the keys first and refused."""

    def old() -> nn.Module:
        return nn.Sequential(nn.utils.weight_norm(nn.Conv1d(2, 4, 3)), nn.ReLU())

    def new() -> nn.Module:
        return nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Conv1d(2, 4, 3)), nn.ReLU())

    saved = old()
    path = tmp_path / "vocoder.pt"
    torch.save({"module." + k: v for k, v in saved.state_dict().items()}, path)  # DDP-saved
    reference = new()
    reference.load_state_dict({k.removeprefix("module."): v for k, v in torch.load(path).items()})
    model = new()
    state = torchplace.load_checkpoint(path, module=model)
    assert "0.parametrizations.weight.original0" in state
    assert "0.weight_g" not in state
    x = torch.randn(1, 2, 8)
    assert torch.allclose(model(x), saved(x))
    assert torch.allclose(model(x), reference(x))


# --- a plain helper object that keeps its tensors in __slots__ ---------------------------------


class _SlottedRope:
    """A rotary cache as a slotted class (no __dict__): its tensors were invisible."""

    __slots__ = ("__sin", "cos", "unset")

    def __init__(self) -> None:
        self.cos = torch.ones(4)
        self.__sin = torch.zeros(4)


class _SlottedChild(_SlottedRope):
    __slots__ = ("extra",)

    def __init__(self) -> None:
        super().__init__()
        self.extra = {"k": torch.ones(2)}


def test_check_same_device_sees_tensors_kept_in_slots() -> None:
    with pytest.raises(torchplace.MixedDeviceError, match=r"rope\.cos"):
        torchplace.check_same_device(rope=_SlottedRope(), x=torch.ones(1, device="meta"))
    with pytest.raises(torchplace.MixedDeviceError, match=r'rope\.extra\["k"\]'):
        torchplace.check_same_device(rope=_SlottedChild(), x=torch.ones(1, device="meta"))


def test_move_refuses_a_slotted_object_rather_than_leaving_its_tensors_behind() -> None:
    with pytest.raises(ConfigError, match=r"_SlottedRope that keeps tensors as attributes"):
        torchplace.move({"rope": _SlottedRope()}, "meta")
    rope = _SlottedRope()
    assert torchplace.move({"rope": rope}, "cpu")["rope"] is rope  # already in place: kept


def test_audit_module_reports_a_slotted_helpers_tensors_as_strays() -> None:
    model = nn.Linear(4, 4)
    model.rope = _SlottedRope()  # type: ignore[assignment]
    names = sorted(s.name for s in torchplace.audit_module(model).strays)
    assert names == ["rope._SlottedRope__sin", "rope.cos"]


# --- plan's outputs must not overwrite the files it reads (--map, --exported) ------------------


@pytest.mark.parametrize("flag", ["-o", "--export"])
def test_plan_refuses_an_output_that_is_its_map_file(tmp_path: Path, flag: str) -> None:
    device_map = tmp_path / "map.json"
    device_map.write_text(json.dumps({"0": 0, "2": 1}))
    before = device_map.read_bytes()
    out = [flag, "map.json"] if flag == "-o" else [flag, "device-map", "./map.json"]
    done = _cli("plan", "--map", "map.json", *out, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "is also an input of this command" in done.stderr
    assert device_map.read_bytes() == before


def test_plan_refuses_an_output_that_is_its_exported_program(tmp_path: Path) -> None:
    program = tmp_path / "model.pt2"
    torch.export.save(torch.export.export(nn.Linear(8, 2), (torch.randn(1, 8),)), program)
    before = program.read_bytes()
    done = _cli("plan", "--exported", "model.pt2", "--json", "-o", "model.pt2", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "is also an input of this command" in done.stderr
    assert program.read_bytes() == before


def test_plan_map_with_a_key_given_twice_is_refused_not_last_wins(tmp_path: Path) -> None:
    path = tmp_path / "map.json"
    path.write_text('{"0": 0, "0": 1, "2": 1}')
    with pytest.raises(ConfigError, match=r"the key '0' is given twice \(0, then 1\)"):
        torchplace.plan(map_file=path, strategy="map")


# --- plan: a model's stray tensors, and every warning code in the shipped schema ---------------


class _WithStray(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 2)
        self.mask = torch.ones(2)  # stray: module.to() leaves it on the CPU
        self.scale = torch.tensor(2.0)  # 0-dim: torch takes a CPU scalar beside device tensors

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self.mask * self.scale


def make_with_stray() -> nn.Module:
    return _WithStray()


def make_without_stray() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))


def _declared() -> list[torchplace.models.TensorSpec]:
    from torchplace.models import TensorSpec

    return [TensorSpec("input", "FP32", (-1, 8))]


def test_plan_warns_of_stray_tensors_that_module_to_leaves_behind() -> None:
    """The plan said 'fits' (and --verify PASS on the CPU) for a model whose forward fails on
    a GPU: the stray, built on meta with the rest, was planned as if it moved."""
    p = torchplace.plan(f"{__name__}:make_with_stray", inputs=_declared())
    (warning,) = [w for w in p.warnings if w.code == "stray-tensor"]
    assert warning.message.startswith("mask is kept outside the parameters and buffers")
    assert "scale" not in warning.message
    clean = torchplace.plan(f"{__name__}:make_without_stray", inputs=_declared())
    assert "stray-tensor" not in [w.code for w in clean.warnings]


def test_every_plan_warning_code_validates_against_the_shipped_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from torchplace import report
    from torchplace.planner import checks

    schema = report.load_schema("plan")
    codes = schema["properties"]["result"]["properties"]["warnings"]["items"]["properties"]
    enum = set(codes["code"]["enum"])
    documented = set(re.findall(r"``([a-z-]+)``: ", checks.__doc__ or ""))
    assert documented <= enum, documented - enum
    assert "stray-tensor" in enum
    p = torchplace.plan(f"{__name__}:make_with_stray", inputs=_declared())
    document = json.loads(report.to_json(report.envelope("plan", p.to_dict(), device="cuda:0")))
    jsonschema.validate(document, schema)
