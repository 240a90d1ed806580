"""Round 24: the prefetcher driven like a training loop over a one-shot source."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from torchplace.errors import ConfigError


def _numbered(n: int) -> Iterator[dict[str, Any]]:
    for i in range(n):
        yield {"x": torch.full((2,), float(i)), "i": i, "tag": f"b{i}"}


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_a_generator_left_early_resumes_where_the_consumer_stopped(make: Any, depth: int) -> None:
    # epochs of a fixed number of steps over one long generator: with streams the batches
    # fetched ahead of a `break` were dropped, so every resumed epoch silently skipped `depth`
    p = make(_numbered(7), depth=depth)
    seen: list[int] = []
    for stop in (2, 5):  # two short epochs, then the rest
        for batch in p:
            assert batch["x"].device.type == "meta"
            seen.append(batch["i"])
            if len(seen) == stop:
                break
    seen += [b["i"] for b in p]
    assert seen == list(range(7))
    assert p.stats().batches == 7
    with pytest.raises(ConfigError, match="one-shot"):
        iter(p)


def test_an_error_raised_by_the_consumer_keeps_the_rest_of_a_generator(make: Any) -> None:
    p = make(_numbered(4), depth=2)

    def train() -> None:
        for batch in p:
            if batch["i"] == 1:
                raise ValueError("step failed")

    with pytest.raises(ValueError, match="step failed"):
        train()
    assert [b["i"] for b in p] == [2, 3]


def test_close_drops_what_a_pass_left_early_had_fetched(make: Any) -> None:
    p = make(_numbered(5), depth=2)
    next(iter(p))
    p.close_pass()  # a pass ended: what it fetched ahead waits for the next pass
    p.close()  # the prefetcher closed: nothing is kept for a pass that will not come
    assert not p._carried
