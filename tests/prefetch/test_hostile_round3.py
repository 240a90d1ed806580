"""Hostile batches for the prefetcher, round 3 (see tests/test_hostile_round3.py for the rest)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torchplace.errors import ConfigError


class Batch:
    """A plain batch class of a user's own: tensors as attributes, no ``to`` method."""

    def __init__(self, i: int) -> None:
        self.i = i
        self.x = torch.full((2,), float(i))


def test_a_plain_batch_object_is_refused_at_its_place_not_yielded_unmoved(make: Any) -> None:
    """Attack: a DataLoader-like source yielding plain ``Batch`` objects; both modes handed them
    out with their tensors still on the cpu, as if moved."""
    p = make([{"i": 0, "x": torch.zeros(2)}, Batch(1)], depth=2)
    seen: list[int] = []

    def drain() -> None:
        for batch in p:
            assert batch["x"].is_meta
            seen.append(batch["i"])

    with pytest.raises(ConfigError, match=r"Batch that keeps tensors as attributes \(x\)"):
        drain()
    assert seen == [0]  # the batches before it came through, moved


@pytest.mark.parametrize(
    "bad_pin",
    [lambda b: None, lambda b: b.float(), lambda b: b[:1], lambda b: b.view(1, -1)],
    ids=["none", "float", "short", "2d"],
)
def test_a_pin_fn_returning_the_wrong_tensor_is_named(fake: Any, bad_pin: Any) -> None:
    """Attack: a ``pin_fn`` of one's own that returns None, another dtype, a shorter or a 2-D
    tensor; staging failed later with torch's view/shape errors (or AttributeError)."""
    from torchplace import DevicePrefetcher

    p = DevicePrefetcher([{"x": torch.arange(6.0)}], "meta", pin_fn=bad_pin)
    with pytest.raises(ConfigError, match="pin_fn returned"):
        list(p)
