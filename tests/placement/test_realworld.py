"""move, check_same_device and audit_module on the batches and modules real projects hand them:
namedtuples, mapping subclasses, BatchEncoding-like objects, PackedSequence, tensor subclasses,
generators, weight_norm and spectral_norm, parametrizations."""

from __future__ import annotations

import dataclasses
import io
import itertools
import warnings
from collections import OrderedDict, UserDict, defaultdict, deque, namedtuple
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations, parametrize
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from torchplace import (
    ConfigError,
    MixedDeviceError,
    PlacementError,
    audit_module,
    check_same_device,
    move,
)
from torchplace.placement import map_tensors

from .helpers import CPU, META

Pair = namedtuple("Pair", "x y")


class Encoding(UserDict[str, Any]):
    """Like transformers' BatchEncoding: a mapping with its own ``to``."""

    def to(self, device: torch.device | str) -> Encoding:
        return Encoding({k: v.to(device) for k, v in self.data.items()})


class Tagged(torch.Tensor):
    """A ``__torch_function__`` tensor subclass."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return super().__torch_function__(func, types, args, kwargs or {})  # type: ignore[no-untyped-call]


def t() -> torch.Tensor:
    return torch.randn(2, 3)


def test_batch_types_are_kept_and_every_tensor_moves() -> None:
    dd: defaultdict[str, Any] = defaultdict(list, x=t())
    packed = pack_padded_sequence(torch.randn(3, 2, 4), torch.tensor([3, 2]))
    batch: dict[Any, Any] = {
        "pair": Pair(t(), 1),
        "ordered": OrderedDict(x=t()),
        "dd": dd,
        "enc": Encoding(ids=t()),
        "packed": packed,
        "tagged": t().as_subclass(Tagged),
        0: t(),
        ("a", 1): t(),
        "set": {t()},
    }
    out = move(batch, META)
    assert type(out["pair"]) is Pair
    assert out["pair"].x.is_meta
    assert out["pair"].y == 1
    assert type(out["ordered"]) is OrderedDict
    assert out["ordered"]["x"].is_meta
    assert type(out["dd"]) is defaultdict
    assert out["dd"].default_factory is list
    assert type(out["enc"]) is Encoding
    assert out["enc"]["ids"].is_meta
    assert type(out["packed"]) is PackedSequence
    assert out["packed"].data.is_meta
    assert type(out["tagged"]) is Tagged
    assert out["tagged"].is_meta
    assert out[0].is_meta
    assert out[("a", 1)].is_meta
    assert type(out["set"]) is set
    assert next(iter(out["set"])).is_meta
    assert not batch["pair"].x.is_meta  # the input is not changed


def test_host_data_already_in_place_is_not_copied() -> None:
    arr = np.zeros(3)
    param = nn.Parameter(t())
    batch: dict[str, Any] = {
        "x": t(),
        "arr": arr,
        "p": param,
        "s": "text",
        "b": b"raw",
        "none": None,
    }
    out = move(batch, "cpu")
    assert out["x"] is batch["x"]
    assert out["p"] is param
    assert out["arr"] is arr
    assert out["s"] == "text"
    assert out["b"] == b"raw"
    assert out["none"] is None


def test_move_refuses_a_generator_instead_of_skipping_its_tensors() -> None:
    gen = (x for x in [t(), t()])
    with pytest.raises(ConfigError, match=r"generator.*list\("):
        move({"xs": gen}, META)
    assert len(list(gen)) == 2  # not consumed


def test_move_refuses_any_iterator() -> None:
    it: Iterator[torch.Tensor] = iter([t()])
    with pytest.raises(ConfigError, match=r"value\[0\]"):
        move([it], META)
    assert next(it).shape == (2, 3)


def _iterators() -> list[Any]:
    return [
        pytest.param(lambda xs: (x for x in xs), "generator", id="generator"),
        pytest.param(lambda xs: map(lambda x: x, xs), "map", id="map"),
        pytest.param(lambda xs: filter(lambda x: True, xs), "filter", id="filter"),
        pytest.param(lambda xs: zip(xs, xs, strict=True), "zip", id="zip"),
        pytest.param(lambda xs: enumerate(xs), "enumerate", id="enumerate"),
        pytest.param(lambda xs: reversed(xs), "list_reverseiterator", id="reversed"),
        pytest.param(lambda xs: itertools.chain(xs), "chain", id="chain"),
        pytest.param(lambda xs: itertools.islice(xs, 2), "islice", id="islice"),
        pytest.param(lambda xs: iter(xs), "list_iterator", id="iter"),
    ]


@pytest.mark.parametrize(("make", "kind"), _iterators())
def test_map_tensors_refuses_a_one_shot_iterator_instead_of_passing_it_unmapped(
    make: Any, kind: str
) -> None:
    it = make([t(), t()])
    seen: list[torch.Tensor] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        seen.append(x)
        return x

    with pytest.raises(ConfigError, match=rf'map_tensors: value\["xs"\] is a {kind} .*list\('):
        map_tensors({"xs": it}, fn)
    assert seen == []
    assert next(it) is not None  # left unconsumed


@pytest.mark.parametrize("view", ["keys", "values", "items"])
def test_map_tensors_refuses_a_dict_view_it_could_not_rebuild(view: str) -> None:
    batch = {"x": t()}
    seen: list[torch.Tensor] = []
    with pytest.raises(ConfigError, match=rf"dict_{view} \(a view of a mapping\).*mapping itself"):
        map_tensors([getattr(batch, view)()], seen.append)  # type: ignore[arg-type]
    assert seen == []
    with pytest.raises(ConfigError, match=r"value\[0\] is a dict_values"):
        move([batch.values()], META)


def test_check_same_device_reads_into_dict_views() -> None:
    batch = {"x": t(), "y": t().to(META)}
    for view in (batch.values(), batch.items()):
        with pytest.raises(PlacementError, match=r"args\[0\]\[1\]"):
            check_same_device(view)
    assert check_same_device({"x": t()}.values()) == CPU


def test_map_tensors_refuses_a_generator_passed_as_the_whole_value() -> None:
    gen = (x for x in [t()])
    with pytest.raises(ConfigError, match=r"map_tensors: value is a generator"):
        map_tensors(gen, lambda x: x, copy=False)
    assert len(list(gen)) == 1


def test_map_tensors_still_walks_every_container_it_accepts() -> None:
    class Box:
        def __init__(self, x: torch.Tensor) -> None:
            self.x = x

        def to(self, device: torch.device | str) -> Box:
            return Box(self.x.to(device))

    stream = io.BytesIO(b"line\n")  # an iterator too, but a file: a leaf, not refused
    batch: dict[str, Any] = {
        "list": [t()],
        "tuple": (t(),),
        "pair": Pair(t(), 1),
        "ordered": OrderedDict(x=t()),
        "set": {t()},
        "deque": deque([t()]),
        "range": range(3),
        "stream": stream,
        "box": Box(t()),
        "module": nn.Linear(1, 1),
    }
    seen: list[torch.Tensor] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        seen.append(x)
        return x.to(META)

    out = map_tensors(batch, fn, objects=lambda o: "moved")
    assert len(seen) == 6
    assert out["list"][0].is_meta
    assert out["tuple"][0].is_meta
    assert type(out["pair"]) is Pair
    assert out["pair"].x.is_meta
    assert out["ordered"]["x"].is_meta
    assert next(iter(out["set"])).is_meta
    assert out["deque"][0].is_meta
    assert out["range"] == range(3)
    assert out["stream"] is stream
    assert out["box"] == "moved"
    assert out["module"] is batch["module"]


def test_check_same_device_refuses_a_generator_instead_of_passing_it() -> None:
    gen = (x for x in [t().to(META)])
    with pytest.raises(ConfigError, match=r"xs.*generator"):
        check_same_device(xs=gen, expected="cpu")
    assert len(list(gen)) == 1


def test_check_same_device_walks_real_batch_types() -> None:
    packed = pack_padded_sequence(torch.randn(3, 2, 4), torch.tensor([3, 2]))
    assert check_same_device(packed, Encoding(ids=t()), Pair(t(), t())) == CPU
    with pytest.raises(Exception, match=r">> y\{0\}"):
        check_same_device(x=Encoding(ids=t()), y={t().to(META)})


@pytest.mark.parametrize(
    "wrap",
    [
        torch.nn.utils.weight_norm,
        torch.nn.utils.spectral_norm,
    ],
)
def test_a_weight_rebuilt_by_a_norm_hook_is_not_a_stray(wrap: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # weight_norm is deprecated, still used
        layer = wrap(nn.Linear(3, 3)).to(META)
    audit = audit_module(layer)
    assert audit.strays == ()
    audit.assert_on(META)  # the hook rebuilds ``weight`` on the next forward


def test_a_true_stray_beside_a_norm_hook_is_still_found() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        layer = torch.nn.utils.weight_norm(nn.Linear(3, 3))
    layer.cache = [torch.zeros(1)]  # type: ignore[assignment]
    assert [r.name for r in audit_module(layer).strays] == ["cache[0]"]


def test_parametrizations_and_none_buffers_audit_cleanly() -> None:
    class Sym(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.triu() + x.triu(1).T

    lin = nn.Linear(3, 3)
    parametrize.register_parametrization(lin, "weight", Sym())
    lin.register_buffer("mask", None)
    norm = parametrizations.weight_norm(nn.Linear(3, 3))
    for m in (lin, norm):
        audit = audit_module(m.to(META))
        assert audit.strays == ()
        audit.assert_on(META)
    assert [r.name for r in audit_module(lin).tensors] == [
        "bias",
        "parametrizations.weight.original",
    ]


def test_plain_lists_of_tensors_and_unregistered_parameters_are_strays() -> None:
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.anchors = [torch.zeros(2), torch.ones(2)]
            self.extra = [nn.Parameter(torch.zeros(1))]
            self.by_id = {0: torch.zeros(1)}

    audit = audit_module(Model().to(META))
    assert [r.name for r in audit.strays] == ["anchors[0]", "anchors[1]", "extra[0]", "by_id[0]"]


def test_a_quantized_tensor_that_cannot_go_there_is_a_placement_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # quantized creation is deprecated
        q = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.quint8)
    assert move({"q": q}, "cpu")["q"] is q
    with pytest.raises(PlacementError, match=r"quantized quint8 \(4,\).*dequantize"):
        move({"q": q}, META)


# --------------------------------------------------------------------------------------------
# hostile and real-world shapes found by probing
# --------------------------------------------------------------------------------------------


def _nested(layout: torch.layout) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # nested tensors are a prototype
        return torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=layout)


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
def test_nested_tensors_show_their_ragged_dimension_in_tables(layout: torch.layout) -> None:
    nt = _nested(layout)
    with pytest.raises(MixedDeviceError, match=r"args\[0\]\s+\(2, -1\)\s+float32\s+cpu"):
        check_same_device(nt, torch.ones(1, device=META))

    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("ragged", nt)
            self.stray = nt * 2

    audit = audit_module(Holder())
    assert [(r.name, r.shape, r.nbytes) for r in (*audit.tensors, *audit.strays)] == [
        ("ragged", (2, -1), 20),
        ("stray", (2, -1), 20),
    ]
    assert audit.groups[0].numel == 5
    assert "(2, -1)" in str(audit)


class ModelOutput(OrderedDict[str, Any]):
    """Like transformers' ModelOutput: a dict whose dataclass fields are attributes too."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        super().__setattr__(key, value)


@dataclasses.dataclass
class CausalLMOutput(ModelOutput):
    logits: torch.Tensor | None = None
    loss: torch.Tensor | None = None


def test_a_model_output_moves_its_attributes_with_its_items() -> None:
    out = move(CausalLMOutput(logits=t()), META)
    assert type(out) is CausalLMOutput
    assert out.loss is None
    assert out.logits is out["logits"]
    assert out.logits.device == META


class _Span(NamedTuple):
    start: torch.Tensor
    end: torch.Tensor


class Span(_Span):
    """A namedtuple subclass whose ``__new__`` takes other arguments than its fields."""

    __slots__ = ()

    def __new__(cls, start: torch.Tensor) -> Span:
        return super().__new__(cls, start, start + 1)


def test_a_namedtuple_with_its_own_new_is_rebuilt_without_calling_it() -> None:
    span = Span(torch.zeros(2))
    moved = move({"span": span}, META)["span"]
    assert type(moved) is Span
    assert moved.end.device == META
    assert map_tensors(span, lambda x: x * 2).end.tolist() == [2.0, 2.0]


def test_a_class_inside_a_batch_is_a_leaf_not_an_object_with_to() -> None:
    batch: dict[str, Any] = {"cls": nn.Linear, "kind": torch.Tensor, "x": t()}
    moved = move(batch, META)
    assert moved["cls"] is nn.Linear
    assert moved["kind"] is torch.Tensor
    assert moved["x"].device == META


def test_attrs_classes_are_walked_like_dataclasses() -> None:
    attr = pytest.importorskip("attr")

    @attr.s(auto_attribs=True, frozen=True)
    class Example:
        x: torch.Tensor
        label: str

    make: Any = Example  # attrs' __init__ is generated: mypy sees no arguments here
    moved = move(make(t(), "cat"), META)
    assert type(moved) is Example
    assert moved.x.device == META
    assert moved.label == "cat"
    with pytest.raises(MixedDeviceError, match=r">> args\[1\]\.x"):
        check_same_device(t(), make(t().to(META), "dog"))


def test_map_tensors_refuses_a_fn_that_is_not_callable() -> None:
    with pytest.raises(ConfigError, match=r"map_tensors: fn=3 must be callable"):
        map_tensors([t()], 3)  # type: ignore[arg-type]
