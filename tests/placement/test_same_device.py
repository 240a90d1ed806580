"""check_same_device: the one common device, or a table that marks the odd ones out."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn
from torch.ao.nn.quantized.modules.linear import LinearPackedParams

from torchplace import (
    ConfigError,
    MixedDeviceError,
    check_same_device,
)

from .helpers import CPU, META, marked, model, quantized

# --------------------------------------------------------------------------------------------
# check_same_device
# --------------------------------------------------------------------------------------------


def test_same_device_returns_it() -> None:
    assert check_same_device(x=torch.ones(2), model=model(), batch={"y": [torch.zeros(1)]}) == CPU
    assert check_same_device(x=torch.ones(2, device="meta")) == META


def test_positional_values_are_named_by_position() -> None:
    assert check_same_device(torch.ones(2), model()) == CPU
    with pytest.raises(MixedDeviceError) as info:
        check_same_device(torch.ones(2), torch.ones(1, device="meta"), y=torch.ones(1))
    assert ">> args[1]" in str(info.value)
    assert "args[0]" in str(info.value)
    assert " y " in str(info.value)


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


# --------------------------------------------------------------------------------------------
# exotic values
# --------------------------------------------------------------------------------------------


def test_tensors_inside_a_deque_are_checked() -> None:
    import collections

    window = collections.deque([torch.zeros(2, device="meta")])
    with pytest.raises(MixedDeviceError, match=re.escape(">> window[0]")):
        check_same_device(x=torch.zeros(2), window=window)


@dataclass
class Lazy:
    x: torch.Tensor
    cache: torch.Tensor = field(init=False)


def test_an_unset_init_false_dataclass_field_is_skipped() -> None:
    assert check_same_device(batch=Lazy(torch.zeros(2))) == CPU


@dataclass
class Masked:
    ids: torch.Tensor

    def __post_init__(self) -> None:
        self.mask = torch.ones(2)  # an attribute that is no field, made on the cpu


def test_a_dataclass_attribute_set_in_post_init_is_checked() -> None:
    with pytest.raises(MixedDeviceError) as info:
        check_same_device(batch=Masked(torch.zeros(2, device="meta")))
    assert marked(str(info.value)) == ["batch.mask"]


def test_nesting_past_the_recursion_limit_is_a_config_error() -> None:
    deep: Any = torch.zeros(2)
    for _ in range(10_000):
        deep = {"inner": deep}
    with pytest.raises(ConfigError, match="check_same_device: batch nests containers 10000"):
        check_same_device(batch=deep)


@pytest.mark.parametrize("expected", ["", " cpu", "CPU", -1, True])
def test_an_expected_device_torch_cannot_read_is_a_config_error(expected: Any) -> None:
    with pytest.raises(ConfigError, match=f"device {re.escape(repr(expected))} is not a device"):
        check_same_device(x=torch.zeros(2), expected=expected)


# --------------------------------------------------------------------------------------------
# quantized modules: weights in packed params, CPU-only, outside parameters() and buffers()
# --------------------------------------------------------------------------------------------


def quantized_mlp() -> nn.Module:
    mlp = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3), nn.Linear(3, 2))
    return quantized(mlp, torch.qint8, {nn.Linear})


def count_unpacking(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts each time a dynamic Linear's packed params are unpacked."""
    calls: list[int] = []
    real = LinearPackedParams._weight_bias

    def counted(self: LinearPackedParams) -> Any:
        calls.append(1)
        return real(self)

    monkeypatch.setattr(LinearPackedParams, "_weight_bias", counted)
    return calls


def test_packed_weights_left_on_the_cpu_are_not_on_one_device() -> None:
    q = quantized_mlp().to(META)  # moves the LayerNorm; the packed weights stay on the cpu
    with pytest.raises(MixedDeviceError) as info:
        check_same_device(model=q, expected=META)  # was: meta, the packed weights unseen
    msg = str(info.value)
    assert marked(msg) == [
        "model.0._packed_params.weight",
        "model.0._packed_params.bias",
        "model.2._packed_params.weight",
        "model.2._packed_params.bias",
    ]
    assert "4 of 6 tensors not on the expected device meta" in msg
    assert re.search(r">> model\.0\._packed_params\.weight +\(3, 4\) +qint8 +cpu", msg)
    assert "CPU-only" in msg
    assert "module.to() leaves them on the cpu" in msg
    assert "move them to" not in msg  # module.to() cannot move them
    with pytest.raises(MixedDeviceError, match=re.escape(">> model.1.weight")):
        check_same_device(model=q)  # the 4 packed weights outnumber the LayerNorm's 2


def test_a_quantized_model_on_the_cpu_is_checked_without_unpacking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = count_unpacking(monkeypatch)
    q = quantized_mlp()
    assert check_same_device(q, x=torch.zeros(2)) == CPU
    assert calls == []
    with pytest.raises(MixedDeviceError):
        check_same_device(q, expected=META)
    assert len(calls) == 2  # the table shows the packed weights: one unpacking per layer


def test_packed_weights_are_listed_once_when_the_layer_is_passed_too() -> None:
    q = quantized_mlp()
    with pytest.raises(MixedDeviceError) as info:
        check_same_device(q, layer=q[0], expected=META)
    rows = [n for n in marked(str(info.value)) if "_packed_params" in n]
    assert rows == [
        "args[0].0._packed_params.weight",
        "args[0].0._packed_params.bias",
        "args[0].2._packed_params.weight",
        "args[0].2._packed_params.bias",
    ]


def test_a_packed_layer_passed_alone_is_checked() -> None:
    q = quantized_mlp()
    with pytest.raises(MixedDeviceError, match=re.escape(">> layer._packed_params.weight")):
        check_same_device(layer=q[0], x=torch.zeros(1, device="meta"), expected=META)


def test_packed_weights_that_cannot_be_unpacked_still_show_as_one_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(self: LinearPackedParams) -> Any:
        raise RuntimeError("no engine here")

    monkeypatch.setattr(LinearPackedParams, "_weight_bias", broken)
    with pytest.raises(MixedDeviceError) as info:
        check_same_device(model=quantized_mlp().to(META), expected=META)
    msg = str(info.value)
    assert marked(msg) == ["model.0._packed_params", "model.2._packed_params"]
    assert re.search(r">> model\.0\._packed_params +packed +qint8 +cpu", msg)
