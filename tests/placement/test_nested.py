"""move and map_tensors: every container rebuilt, tensors moved once, non_blocking only where safe."""

from __future__ import annotations

import collections
import logging
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchplace import (
    ConfigError,
    DeviceError,
    PlacementError,
    move,
)
from torchplace.placement import map_tensors

from .helpers import CPU, META, model

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


@pytest.mark.parametrize("flag", ["False", None, 1])
def test_move_non_blocking_must_be_a_bool(flag: Any) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"move(non_blocking={flag!r}) must be True")):
        move(torch.ones(2), "meta", non_blocking=flag)


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


# --------------------------------------------------------------------------------------------
# exotic but legitimate containers
# --------------------------------------------------------------------------------------------


def test_move_walks_deques_and_keeps_maxlen() -> None:
    t = torch.randn(2)
    out = move({"window": collections.deque([t, 1], maxlen=4)}, "meta")
    window = out["window"]
    assert isinstance(window, collections.deque)
    assert window.maxlen == 4
    assert window[0].device == META
    assert window[1] == 1


class Args(tuple):  # a tuple subclass whose constructor takes the items one by one
    def __new__(cls, *items: Any) -> Args:
        return super().__new__(cls, items)


class Tagged(list):  # a list subclass with its own __init__ signature and an attribute
    def __init__(self, a: Any, b: Any) -> None:
        super().__init__([a, b])
        self.tag = "train"


def test_move_rebuilds_sequence_subclasses_with_their_items_not_nested_in_one() -> None:
    t = torch.randn(2)
    args = move(Args(t, 1), "meta")
    assert type(args) is Args
    assert len(args) == 2
    assert args[0].device == META
    assert args[1] == 1
    tagged = move(Tagged(t, 2), "meta")
    assert type(tagged) is Tagged
    assert tagged.tag == "train"
    assert tagged[0].device == META
    assert tagged[1] == 2
    assert type(move(torch.Size([2, 100_000]), "meta")) is torch.Size


@dataclass
class Lazy:
    x: torch.Tensor
    cache: torch.Tensor = field(init=False)  # set on first use, not in __init__


def test_move_leaves_an_unset_init_false_dataclass_field_unset() -> None:
    out = move(Lazy(torch.randn(2)), "meta")
    assert out.x.device == META
    assert not hasattr(out, "cache")


@dataclass
class Masked:
    ids: torch.Tensor

    def __post_init__(self) -> None:
        self.mask = self.ids != 0  # an attribute that is no field


@dataclass(frozen=True)
class Shifted:
    ids: torch.Tensor

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", self.ids + 1)


def test_move_moves_a_dataclass_attribute_set_in_post_init() -> None:
    out = move(Masked(torch.tensor([1, 0])), "meta")
    assert out.ids.device == META
    assert out.mask.device == META
    frozen = move(Shifted(torch.tensor([1, 0])), "meta")
    assert frozen.labels.device == META


def test_a_structure_that_contains_itself_is_a_config_error() -> None:
    cyclic: list[Any] = [torch.randn(2)]
    cyclic.append(cyclic)
    with pytest.raises(ConfigError, match=re.escape("value[1]") + ".*cyclic"):
        move(cyclic, "meta")
    looped: dict[str, Any] = {"x": torch.randn(2)}
    looped["self"] = looped
    with pytest.raises(ConfigError, match=re.escape('value["self"]')):
        map_tensors(looped, lambda t: t)


def test_nesting_past_the_recursion_limit_is_a_config_error() -> None:
    deep: Any = torch.randn(2)
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(ConfigError, match=r"10000 levels deep.*flatten"):
        move(deep, "meta")


def test_move_of_a_meta_tensor_to_a_real_device_says_it_has_no_data() -> None:
    with pytest.raises(PlacementError, match=r"meta tensor \(float32 \(3,\)\) to cpu.*to_empty"):
        move({"w": torch.empty(3, device="meta")}, "cpu")


# ids without the word "cuda": tests/conftest.py skips items with that keyword on CPU
@pytest.mark.parametrize("device", ["cuda", "cuda:7", "mps"], ids=["gpu", "gpu7", "mps"])
def test_move_to_a_device_this_machine_lacks_says_why(device: str) -> None:
    if torch.cuda.is_available() and device.startswith("cuda"):
        pytest.skip("this machine has CUDA")
    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    with pytest.raises(DeviceError, match=f"cannot use {device!r}.*Fix:"):
        move({"x": torch.randn(2)}, device)


def test_move_to_cpu_0_reuses_tensors_already_on_the_cpu() -> None:
    t = torch.randn(2)
    out = move({"x": t}, "cpu:0")
    assert out["x"] is t
    assert out["x"].device == CPU
