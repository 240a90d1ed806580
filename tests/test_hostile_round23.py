"""Hostile input, round 23: a probe that is no probe, guard arguments of the wrong kind, tensors
in a ``functools.partial``, an object whose ``__getattr__`` raises, old ``weight_norm`` keys
under a wrapper's prefix, an absurd prefetch depth, and a shape fault too large to re-check."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchplace
from torchplace import ConfigError, DevicePrefetcher, device_inventory, move, resolve_device
from torchplace.checkpoint import compare_state_dict, load_checkpoint
from torchplace.devices import FakeProbe, visible_devices
from torchplace.devices.inventory import inventory_by_device
from torchplace.models import TensorSpec
from torchplace.placement import map_tensors
from torchplace.planner.trace import UntraceableModel, _untraceable
from torchplace.sanitizer.report import GuardReport

# ------------------------------------------------------------------ 1. a probe that is no probe


@pytest.mark.parametrize("probe", [3, 0, "cuda", object()])
@pytest.mark.parametrize(
    "call",
    [
        lambda p: device_inventory(probe=p),
        lambda p: inventory_by_device(probe=p),
        lambda p: visible_devices(probe=p),
        lambda p: resolve_device("cpu", probe=p),
    ],
    ids=["device_inventory", "inventory_by_device", "visible_devices", "resolve_device"],
)
def test_a_probe_that_is_no_probe_is_a_config_error_naming_it(probe: object, call: Any) -> None:
    # was: AttributeError: 'int' object has no attribute 'cuda_build' (and probe=0, being
    # false, silently stood in for this machine's probe)
    with pytest.raises(ConfigError, match=r"probe=.* is not a device probe") as exc:
        call(probe)
    assert "FakeProbe" in str(exc.value)


def test_plan_refuses_a_probe_that_is_no_probe() -> None:
    for devices in (None, "all"):
        with pytest.raises(ConfigError, match=r"probe=3 \(int\) is not a device probe"):
            torchplace.plan("seed-mlp", devices=devices, probe=3)


def test_doctor_collect_refuses_a_probe_that_is_no_probe() -> None:
    from torchplace.doctor.assemble import collect

    with pytest.raises(ConfigError, match=r"probe='x' \(str\) is not a device probe"):
        collect("cpu", probe="x", smoke=False)  # type: ignore[arg-type]


def test_a_fake_probe_is_still_taken() -> None:
    assert device_inventory(probe=FakeProbe()) == []


# ------------------------------------------------------------- 2. guard arguments of the wrong kind


@pytest.mark.parametrize("allow", [b"h2d", bytearray(b"h2d"), memoryview(b"h2d")])
def test_guard_names_bytes_given_as_allow(allow: object) -> None:
    # was: "allow entries must be non-empty strings ..., got 104" (the bytes iterated)
    with pytest.raises(ConfigError, match=r"allow=.*h2d.* is (bytes|bytearray|memoryview)"):
        torchplace.guard(allow=allow)  # type: ignore[arg-type]


def test_guard_refuses_a_mapping_as_allow() -> None:
    # was: its keys taken, its values ignored ({"h2d": False} allowed h2d)
    with pytest.raises(ConfigError, match="is a mapping"):
        torchplace.guard(allow={"h2d": False})


@pytest.mark.parametrize("site", ["train.py:0", "train.py:00", "train.py:0:step"])
def test_guard_refuses_line_zero(site: str) -> None:
    # was: accepted, and matched nothing (line numbers start at 1)
    with pytest.raises(ConfigError, match="line numbers start at 1"):
        torchplace.guard(allow=site)
    with pytest.raises(ConfigError, match="line numbers start at 1"):
        GuardReport("record").filter(site=site)


@pytest.mark.parametrize("site", ["train.py:\u00b2", "train.py:\u00b2:step"])
def test_a_superscript_digit_is_no_line_number(site: str) -> None:
    # was: ValueError: invalid literal for int() with base 10: '²' (str.isdigit takes it)
    with pytest.raises(ConfigError, match="is not a source location"):
        torchplace.guard(allow=[site])
    with pytest.raises(ConfigError, match="is not a source location"):
        GuardReport("record").filter(site=site)


def test_guard_cli_refuses_allow_line_zero(tmp_path: Path) -> None:
    from torchplace.cli import main

    script = tmp_path / "x.py"
    script.write_text("print('ran')\n")
    assert main(["guard", "--allow", f"{script.name}:0", "--", "python", str(script)]) == 2


# ------------------------------------------------------------------ 3. tensors in a partial


def test_move_moves_the_tensors_a_partial_binds() -> None:
    # was: the partial came back as it was, its tensors left on the cpu
    fn = functools.partial(torch.add, torch.ones(2), alpha=torch.tensor(2.0))
    moved = move({"fn": fn, "x": torch.zeros(2)}, "meta")["fn"]
    assert isinstance(moved, functools.partial)
    assert moved.func is torch.add
    assert moved.args[0].device.type == "meta"
    assert moved.keywords["alpha"].device.type == "meta"
    assert fn.args[0].device.type == "cpu"  # the original is left as it was


def test_a_partial_subclass_keeps_its_class_and_attributes() -> None:
    class Step(functools.partial):  # type: ignore[type-arg]
        pass

    step = Step(torch.mul, torch.ones(1))
    step.note = "kept"  # type: ignore[attr-defined]
    moved = move(step, "meta")
    assert type(moved) is Step
    assert moved.note == "kept"  # type: ignore[attr-defined]
    assert moved.args[0].is_meta


def test_a_partial_is_seen_by_the_other_walks() -> None:
    fn = functools.partial(torch.add, torch.ones(1, device="meta"))
    with pytest.raises(torchplace.MixedDeviceError, match=r"fn\.args\[0\]"):
        torchplace.check_same_device(fn=fn, x=torch.zeros(1))
    model = nn.Linear(2, 2)
    model.act = functools.partial(torch.mul, other=torch.ones(2))  # type: ignore[assignment]
    assert 'act.keywords["other"]' in str(torchplace.audit_module(model))
    same = functools.partial(torch.mul, 3)
    assert map_tensors(same, lambda t: t, copy=False) is same


# ------------------------------------------------- 4. an object whose __getattr__ raises


class _Proxy:
    """A lazy proxy: every attribute it does not have raises a RuntimeError."""

    def __init__(self, x: torch.Tensor | None = None) -> None:
        if x is not None:
            self.x = x

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"proxy not connected ({name})")


def test_move_treats_an_unreadable_to_as_absent() -> None:
    # was: RuntimeError: proxy not connected (to), leaked from getattr(obj, "to", None)
    empty = _Proxy()
    assert move([empty], "meta")[0] is empty
    assert map_tensors({"p": empty}, lambda t: t)["p"] is empty
    with pytest.raises(ConfigError, match=r"_Proxy that keeps tensors as attributes \(x\)"):
        move({"p": _Proxy(torch.zeros(1))}, "meta")


# --------------------------------- 5. old weight_norm keys under a prefix; compare_state_dict


def _old_weight_norm() -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return nn.Sequential(
            nn.utils.weight_norm(nn.Conv1d(2, 3, 3)), nn.utils.weight_norm(nn.Linear(3, 4))
        )


def _new_weight_norm() -> nn.Sequential:
    wn = nn.utils.parametrizations.weight_norm
    return nn.Sequential(wn(nn.Conv1d(2, 3, 3)), wn(nn.Linear(3, 4)))


@pytest.mark.parametrize("prefix", ["", "model.", "module.", "_orig_mod."])
def test_old_weight_norm_keys_load_under_a_prefix(tmp_path: Path, prefix: str) -> None:
    # was: a Lightning "model." prefix refused (StateDictMismatchError): the prefix was only
    # stripped when every key then fit, and the old names did not count as fitting
    saved = _old_weight_norm().state_dict()
    path = tmp_path / "old.ckpt"
    torch.save({"state_dict": {prefix + k: v for k, v in saved.items()}}, path)
    model = _new_weight_norm()
    load_checkpoint(path, module=model)
    assert torch.equal(model[0].parametrizations.weight.original1, saved["0.weight_v"])
    assert torch.equal(model[1].parametrizations.weight.original0, saved["1.weight_g"])


def test_compare_state_dict_counts_old_weight_norm_keys_as_they_load() -> None:
    # was: 4 missing (parametrizations...original0/1) and 4 unexpected (weight_g/weight_v),
    # though load_state_dict takes them
    model, saved = _new_weight_norm(), _old_weight_norm().state_dict()
    diff = compare_state_dict(model, saved)
    assert diff.ok, diff.describe()
    model.load_state_dict(saved)  # as torch takes it
    half = {k: v for k, v in saved.items() if not k.endswith("weight_v")}
    assert not compare_state_dict(model, half).ok  # a pair half there is still a difference


# ----------------------------------------------------------------- 6. an absurd prefetch depth


@pytest.mark.parametrize("depth", [65, 10**9])
def test_prefetcher_refuses_a_depth_past_the_bound(depth: int) -> None:
    # was: accepted; on CUDA a pass would fetch and copy that many batches before the first
    with pytest.raises(ConfigError, match=r"more than 64 batches copied ahead"):
        DevicePrefetcher([torch.zeros(1)], "cpu", depth=depth)


def test_prefetcher_takes_the_bound_itself() -> None:
    assert DevicePrefetcher([torch.zeros(1)], "cpu", depth=64).depth == 64


# ------------------------------------------- 7. a shape fault too large to re-check with data


def make_linear() -> nn.Module:
    return nn.Linear(8, 2)


def test_a_shape_fault_too_large_to_recheck_is_named_as_the_shapes() -> None:
    # was: "... a model whose control flow reads tensor values cannot be planned this way"
    with pytest.raises(UntraceableModel) as exc:
        torchplace.plan(
            "tests.test_hostile_round23:make_linear",
            inputs=[TensorSpec("x", "FP32", (-1, -1))],
            seq=4,
            batch_sizes=[1 << 20],
        )
    message = str(exc.value)
    assert "a and b must have same reduction dim" in message
    assert "refuses the shapes the forward gave it" in message
    assert "control flow" not in message


def test_a_value_read_too_large_to_recheck_still_says_values() -> None:
    text = "Tensor.item() cannot be called on meta tensors"
    message = str(_untraceable(RuntimeError(text), "aten.item in (model)", shapes=None))
    assert "control flow reads tensor values" in message


def test_a_move_too_large_to_recheck_still_says_the_move() -> None:
    text = "Found no NVIDIA driver on your system"
    message = str(_untraceable(RuntimeError(text), "aten._to_copy in (model)", shapes=None))
    assert "moves a tensor to a device itself" in message
