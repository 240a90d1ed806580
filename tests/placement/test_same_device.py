"""check_same_device: the one common device, or a table that marks the odd ones out."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest
import torch

from torchplace import (
    ConfigError,
    MixedDeviceError,
    check_same_device,
)

from .helpers import CPU, META, marked, model

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
