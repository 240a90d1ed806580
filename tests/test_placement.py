"""check_same_device, audit_module and move, on the cpu and meta devices (and CUDA where present)."""

from __future__ import annotations

import collections
import json
import logging
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from torchplace import (
    ConfigError,
    MixedDeviceError,
    ModuleAudit,
    PlacementError,
    audit_module,
    check_same_device,
    move,
)
from torchplace.placement import canonical_device, map_tensors

META = torch.device("meta")
CPU = torch.device("cpu")


def model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def marked(message: str) -> list[str]:
    """Names on the rows marked as odd ones out."""
    return [line.split()[1] for line in message.splitlines() if line.startswith(">> ")]


# --------------------------------------------------------------------------------------------
# check_same_device
# --------------------------------------------------------------------------------------------


def test_same_device_returns_it() -> None:
    assert check_same_device(x=torch.ones(2), model=model(), batch={"y": [torch.zeros(1)]}) == CPU
    assert check_same_device(x=torch.ones(2, device="meta")) == META


def test_none_and_plain_leaves_are_ignored() -> None:
    assert check_same_device(x=torch.ones(1), mask=None, meta={"n": 3, "s": "a"}) == CPU


def test_mismatch_table_names_paths_and_marks_the_minority() -> None:
    batch = {"x": torch.ones(2, 8, device="meta"), "y": torch.zeros(2, dtype=torch.int64)}
    with pytest.raises(MixedDeviceError) as info:
        check_same_device(model=model(), batch=batch)
    msg = str(info.value)
    assert marked(msg) == ['batch["x"]']
    for name in ("model.0.weight", "model.0.bias", "model.2.weight", 'batch["y"]'):
        assert name in msg
    row = next(line for line in msg.splitlines() if line.startswith(">> "))
    assert re.search(r"\(2, 8\)\s+float32\s+meta", row)
    assert "int64" in msg
    assert "cpu (5 tensors)" in msg
    assert "meta (1 tensor)" in msg
    assert "Fix" in msg


def test_paths_through_every_container_kind() -> None:
    class P(NamedTuple):
        a: torch.Tensor
        b: Any

    @dataclass
    class D:
        t: torch.Tensor
        rest: list[Any] = field(default_factory=list)

    odd = torch.ones(1, device="meta")
    value = {"p": P(torch.ones(1), [odd]), "d": D(torch.ones(1), [(torch.ones(1), {3: odd})])}
    with pytest.raises(MixedDeviceError) as info:
        check_same_device(v=value, w=torch.ones(1), z=torch.ones(2))
    msg = str(info.value)
    # the same tensor object is listed once, under the first path it was found at
    assert marked(msg) == ['v["p"].b[0]']
    assert 'v["d"].rest[0][0]' in msg


def test_expected_device() -> None:
    assert check_same_device(expected="cpu", x=torch.ones(1)) == CPU
    with pytest.raises(MixedDeviceError) as info:
        check_same_device(expected="meta", x=torch.ones(1), y=torch.ones(1, device="meta"))
    msg = str(info.value)
    assert marked(msg) == ["x"]
    assert "not on the expected device meta" in msg
    # no tensors: the expected device is the answer
    assert check_same_device(expected=torch.device("cpu"), x=None) == CPU


def test_no_tensor_at_all_is_a_usage_error() -> None:
    with pytest.raises(ConfigError, match="no tensor"):
        check_same_device(x=None, y=[1, 2])


def test_large_majority_is_summarised() -> None:
    many = [torch.ones(1) for _ in range(30)]
    with pytest.raises(MixedDeviceError) as info:
        check_same_device(many=many, odd=torch.ones(1, device="meta"))
    msg = str(info.value)
    assert marked(msg) == ["odd"]
    assert "... and 22 more on cpu" in msg
    assert len(msg.splitlines()) < 20


def test_canonical_forms_compare_equal_for_the_same_device() -> None:
    assert canonical_device("cpu") == canonical_device(torch.device("cpu"))
    assert canonical_device("cpu:0") == canonical_device("cpu")
    assert canonical_device("cpu") != canonical_device("meta")
    assert canonical_device("cuda:0") == canonical_device(torch.device("cuda", 0))


# --------------------------------------------------------------------------------------------
# audit_module
# --------------------------------------------------------------------------------------------


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))
        self.cache: list[torch.Tensor] = []


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.layers[1].cache.append(torch.zeros(3))  # stray, two levels down
        self.mask = torch.ones(2, 2)  # plain attribute: stray
        self.tables = {"pos": {"sin": torch.zeros(5)}, "ids": (1, torch.arange(3))}
        self.heads = [nn.Linear(4, 1)]  # a module in a plain list: its weights are strays
        self.tags = {"a", "b"}
        self.alias = [self.layers[0].lin.weight]  # a registered parameter: not a stray


def test_audit_groups_by_device_and_dtype() -> None:
    m = Encoder()
    m.layers[0].half()
    audit = audit_module(m)
    groups = {(str(g.device), str(g.dtype)): g for g in audit.groups}
    assert set(groups) == {("cpu", "torch.float16"), ("cpu", "torch.float32")}
    half = groups[("cpu", "torch.float16")]
    assert (half.parameters, half.buffers, half.numel) == (2, 1, 16 + 4 + 4)
    assert half.nbytes == 2 * (16 + 4 + 4)
    full = groups[("cpu", "torch.float32")]
    assert (full.parameters, full.buffers) == (2, 1)
    assert audit.nbytes == half.nbytes + full.nbytes


def test_audit_finds_strays_at_any_depth() -> None:
    audit = audit_module(Encoder())
    names = sorted(s.name for s in audit.strays)
    assert names == sorted(
        [
            "layers.1.cache[0]",
            "mask",
            'tables["pos"]["sin"]',
            'tables["ids"][1]',
            "heads[0].weight",
            "heads[0].bias",
        ]
    )
    assert all(s.kind == "stray" for s in audit.strays)


def test_strays_are_exactly_what_module_to_leaves_behind() -> None:
    m = Encoder()
    m.to("meta")
    audit = audit_module(m)
    left = sorted(r.name for r in audit.off("meta"))
    assert left == sorted(s.name for s in audit.strays)
    assert "alias[0]" in left  # to("meta") swaps parameters, so the alias stays behind
    assert all(r.device == META for r in audit.tensors)


def test_standard_modules_have_no_strays() -> None:
    mods: list[nn.Module] = [
        nn.LSTM(4, 4, num_layers=2),
        nn.GRU(3, 3),
        nn.MultiheadAttention(8, 2),
        nn.BatchNorm1d(3),
        nn.Embedding(10, 4),
        nn.TransformerEncoderLayer(16, 2, 32, batch_first=True),
        nn.utils.parametrizations.weight_norm(nn.Linear(3, 3)),
    ]
    for mod in mods:
        assert audit_module(mod).strays == (), type(mod).__name__


def test_audit_renders_as_table_and_json() -> None:
    audit = audit_module(Encoder())
    text = str(audit)
    assert "Encoder" in text
    assert "layers.1.cache[0]" in text
    assert "float32" in text
    data = json.loads(audit.to_json())
    assert data["module"] == "Encoder"
    assert {s["name"] for s in data["strays"]} >= {"mask", "layers.1.cache[0]"}
    assert data["groups"][0]["device"] == "cpu"
    assert data["bytes"] == audit.nbytes
    assert sum(g["parameters"] for g in data["groups"]) == len(list(Encoder().parameters()))

    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(audit)
    assert "layers.1.cache[0]" in console.export_text()


def test_assert_on_lists_everything_off_the_device() -> None:
    m = Encoder()
    with pytest.raises(PlacementError) as info:
        audit_module(m).assert_on("meta")
    msg = str(info.value)
    for name in ("layers.0.lin.weight", "layers.1.scale", "mask", "heads[0].bias"):
        assert name in msg
    assert "module.to('meta')" in msg
    m.to("meta")
    with pytest.raises(PlacementError) as info:
        audit_module(m).assert_on("meta")
    msg = str(info.value)
    assert "layers.0.lin.weight" not in msg
    assert "layers.1.cache[0]" in msg
    # alias[0] too: to("meta") replaces parameters instead of moving them in place (between cpu
    # and cuda it moves them in place, and the alias follows)
    assert "alias[0]" in msg
    assert "7 tensor(s) not on meta, 7 of them stray" in msg
    assert "register_buffer" in msg
    assert "call module.to(" not in msg
    # strays that happen to be on the device are not an error (yet): only placement is checked
    audit_module(Encoder()).assert_on("cpu")


def test_assert_on_passes_and_compares_devices_properly() -> None:
    audit = audit_module(model())
    audit.assert_on("cpu")
    audit.assert_on(torch.device("cpu"))
    audit.assert_on("cpu:0")
    assert isinstance(audit, ModuleAudit)
    assert audit.devices == (CPU,)


def test_audit_is_safe_on_cycles() -> None:
    m = model()
    loop: list[Any] = [torch.ones(1)]
    loop.append(loop)
    m.loop = loop  # type: ignore[assignment]
    m.parent = [m]  # type: ignore[assignment]
    assert [s.name for s in audit_module(m).strays] == ["loop[0]"]


def test_audit_rejects_non_modules() -> None:
    with pytest.raises(ConfigError, match=r"nn\.Module"):
        audit_module(torch.ones(1))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# move
# --------------------------------------------------------------------------------------------


class Point(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


@dataclass(frozen=True)
class Sample:
    image: torch.Tensor
    label: torch.Tensor
    name: str
    extra: dict[str, Any] = field(default_factory=dict)
    cached: int = field(default=0, init=False)


class WithTo:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.calls: list[Any] = []

    def to(self, device: Any) -> WithTo:
        self.calls.append(device)
        return WithTo(self.t.to(device))


def test_move_walks_every_container_and_returns_new_ones() -> None:
    batch = {
        "p": Point(torch.ones(2), torch.zeros(2)),
        "s": Sample(torch.ones(1, 2), torch.tensor(3), "n", {"k": [torch.ones(1)]}),
        "list": [torch.ones(1), (torch.ones(1), 5, "str", None)],
        "od": collections.OrderedDict(a=torch.ones(1)),
        "dd": collections.defaultdict(list, b=torch.ones(1)),
        "set": frozenset({1, 2}),
        "w": WithTo(torch.ones(1)),
    }
    out = move(batch, "meta")
    assert out is not batch
    assert isinstance(out["p"], Point)
    assert isinstance(out["s"], Sample)
    assert out["s"].name == "n"
    assert out["s"].cached == 0
    assert isinstance(out["od"], collections.OrderedDict)
    assert isinstance(out["dd"], collections.defaultdict)
    assert out["dd"].default_factory is list
    assert out["list"][1][1:] == (5, "str", None)
    assert out["set"] == frozenset({1, 2})
    assert batch["w"].calls == [META]
    tensors: list[torch.Tensor] = []
    map_tensors(out, lambda t: tensors.append(t) or t)
    assert len(tensors) == 9  # WithTo is a leaf to map_tensors; move() called its own .to
    assert all(t.device == META for t in tensors)
    assert out["w"].t.device == META
    # the input is untouched
    assert batch["p"].x.device == CPU
    assert batch["s"].image.device == CPU


def test_move_dtype_converts_floating_tensors_only() -> None:
    out = move(
        {"x": torch.ones(2), "y": torch.arange(2), "m": torch.ones(2).bool()},
        "cpu",
        dtype=torch.float16,
    )
    assert out["x"].dtype == torch.float16
    assert out["y"].dtype == torch.int64
    assert out["m"].dtype == torch.bool
    with pytest.raises(ConfigError, match="floating"):
        move(torch.ones(1), "cpu", dtype=torch.int32)


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "auto", 1.5])
def test_move_bad_device_is_a_usage_error_naming_it(device: Any) -> None:
    with pytest.raises(ConfigError, match=re.escape(repr(device))):
        move({"x": torch.ones(2)}, device)


def test_move_dtype_must_be_a_torch_dtype() -> None:
    with pytest.raises(ConfigError, match=r"torch\.float16"):
        move(torch.ones(2), "cpu", dtype="float16")  # type: ignore[arg-type]


def test_move_keeps_tensors_already_in_place_and_aliasing() -> None:
    t = torch.ones(3)
    out = move({"a": t, "b": [t]}, "cpu")
    assert out["a"] is t
    moved = move({"a": t, "b": [t]}, "meta")
    assert moved["a"] is moved["b"][0]


def test_move_leaves_modules_alone() -> None:
    m = model()
    out = move({"model": m, "x": torch.ones(1)}, "meta")
    assert out["model"] is m
    assert m[0].weight.device == CPU


def test_move_single_tensor_fast_path() -> None:
    t = torch.arange(4.0)
    assert move(t, "cpu") is t
    assert move(t, "meta").device == META
    assert move(t, torch.device("cpu"), dtype=torch.float64).dtype == torch.float64


def test_non_blocking_from_pageable_memory_falls_back_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="torchplace.placement")
    t = torch.ones(2)
    # cpu -> cpu: nothing to copy, nothing to say
    move(t, "cpu", non_blocking=True)
    assert caplog.records == []
    from torchplace.placement import nested

    assert nested._non_blocking_ok(t, torch.device("cuda", 0)) is False
    assert any("not pinned" in r.getMessage() for r in caplog.records)


def test_non_blocking_device_to_host_is_blocking(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from torchplace.placement import nested

    caplog.set_level(logging.DEBUG, logger="torchplace.placement")
    fake_gpu_tensor = torch.empty(2, device="meta")
    # meta carries no data: nothing to overlap, no message
    assert nested._non_blocking_ok(fake_gpu_tensor, CPU) is False
    assert caplog.records == []


# --------------------------------------------------------------------------------------------
# CUDA
# --------------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_cuda_move_non_blocking_only_from_pinned(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="torchplace.placement")
    dev = torch.device("cuda", torch.cuda.current_device())
    pinned = torch.arange(1000.0).pin_memory()
    out = move({"x": pinned}, "cuda", non_blocking=True)
    assert out["x"].device == dev
    assert caplog.records == []
    pageable = torch.arange(1000.0)
    out = move({"x": pageable}, dev, non_blocking=True)
    assert any("not pinned" in r.getMessage() for r in caplog.records)
    back = move(out, "cpu", non_blocking=True)
    assert any("to the host" in r.getMessage() for r in caplog.records)
    assert torch.equal(back["x"], pageable)


@pytest.mark.cuda
def test_cuda_check_same_device_and_audit() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    m = model().to(dev)
    assert check_same_device(model=m, x=torch.ones(2, 8, device=dev)) == dev
    assert check_same_device(expected="cuda", model=m) == dev
    with pytest.raises(MixedDeviceError) as info:
        check_same_device(model=m, x=torch.ones(2, 8))
    assert marked(str(info.value)) == ["x"]
    audit_module(m).assert_on("cuda")
    audit_module(m).assert_on(dev)


# --------------------------------------------------------------------------------------------
# docs/core.md: its examples run
# --------------------------------------------------------------------------------------------


def test_core_doc_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = Path(__file__).resolve().parents[1] / "docs" / "core.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "docs/core.md has no python examples"
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("core_doc")  # dataclasses look their module up in sys.modules
    monkeypatch.setitem(sys.modules, "core_doc", module)
    for block in blocks:
        exec(compile(block, str(doc), "exec"), module.__dict__)


# --------------------------------------------------------------------------------------------
# move: any nesting (property test)
# --------------------------------------------------------------------------------------------

_leaves = st.one_of(
    st.integers(-5, 5).map(lambda n: torch.full((2,), float(n))),
    st.integers(0, 9).map(lambda n: torch.tensor([n])),
    st.integers(),
    st.text(max_size=3),
    st.none(),
)
_batches = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=2), inner, max_size=3),
        st.builds(Point, inner, inner),
    ),
    max_leaves=12,
)


def _shape_of(obj: Any) -> Any:
    """The structure with tensors replaced by (dtype, values)."""
    if isinstance(obj, torch.Tensor):
        return ("tensor", obj.dtype, obj.tolist())
    if isinstance(obj, dict):
        return {k: _shape_of(v) for k, v in obj.items()}
    if isinstance(obj, Point):
        return ("Point", _shape_of(obj.x), _shape_of(obj.y))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [_shape_of(v) for v in obj])
    return obj


@settings(max_examples=60, deadline=None)
@given(_batches)
def test_move_preserves_any_nesting(batch: Any) -> None:
    before = _shape_of(batch)
    moved = move(batch, "cpu")
    assert _shape_of(moved) == before
    assert _shape_of(batch) == before
    on_meta = move(batch, "meta")
    found: list[torch.Tensor] = []
    map_tensors(on_meta, lambda t: found.append(t) or t)
    assert all(t.device == META for t in found)


def test_canonical_device() -> None:
    assert canonical_device("cpu:0") == torch.device("cpu")
    assert canonical_device(torch.device("meta")) == torch.device("meta")
    assert canonical_device("cuda:1") == torch.device("cuda", 1)
    current = torch.cuda.current_device() if torch.cuda.is_available() else 0
    assert canonical_device("cuda") == torch.device("cuda", current)
