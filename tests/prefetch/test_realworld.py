"""DevicePrefetcher as training code uses it: DataLoaders with workers, a DistributedSampler
across epochs, batches with non-tensor leaves, infinite sources, failing sources, several passes,
abandoned iterators, ``no_grad`` and threads.

``make`` (conftest) builds a prefetcher in either mode towards ``meta``, where values are gone:
there the batches are compared by structure, types, non-tensor leaves, shapes and dtypes; on the
CPU (pass-through) the values are compared too.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import multiprocessing
import threading
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from torchplace import ConfigError, DevicePrefetcher

from .fakes import Source

# --------------------------------------------------------------------------------------------
# batches with non-tensor leaves
# --------------------------------------------------------------------------------------------


class Sample(NamedTuple):
    x: torch.Tensor
    name: str


@dataclasses.dataclass
class Record:
    x: torch.Tensor
    names: list[str]
    extra: Any = None


def shape_of(obj: Any) -> Any:
    """The batch with every tensor replaced by (shape, dtype) and every container by its type."""
    if isinstance(obj, torch.Tensor):
        return ("tensor", tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return (type(obj), {k: shape_of(v) for k, v in obj.items()})
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: shape_of(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return (type(obj), fields)
    if isinstance(obj, (list, tuple)):
        return (type(obj), [shape_of(v) for v in obj])
    return (type(obj), obj)


def mixed(i: int) -> Any:
    """Batches of changing shapes, kinds and non-tensor leaves, as collate functions make."""
    rows = i % 3 + 1
    kinds: list[Any] = [
        {"x": torch.full((rows, 2), float(i)), "name": f"s{i}", "names": ["a", "b"], "none": None},
        (torch.arange(rows), i, None, "tag"),
        Sample(torch.ones(rows, dtype=torch.float64), f"n{i}"),
        Record(torch.zeros(rows, 4), [f"r{i}"], extra={"k": i}),
        [torch.tensor(i), [f"w{i}", f"v{i}"], 3.5],
    ]
    return kinds[i % len(kinds)]


def test_batches_with_non_tensor_leaves_keep_structure_types_and_order(make: Any) -> None:
    source = [mixed(i) for i in range(15)]
    out = list(make(source, depth=3))
    assert [shape_of(b) for b in out] == [shape_of(b) for b in source]


def test_on_the_cpu_the_values_are_the_sources() -> None:
    source = [mixed(i) for i in range(15)]
    out = list(DevicePrefetcher(source, "cpu"))
    for got, want in zip(out, source, strict=True):
        assert got is want  # already in place: yielded as it is, values and all


def test_variable_shapes_through_the_staging_pool(make: Any) -> None:
    # each batch has a new size: staging buffers of the wrong size must not leak into the shapes
    sizes = [5, 1, 9, 2, 9, 1, 30, 3]
    out = list(make([torch.ones(n, 3) for n in sizes], depth=2))
    assert [tuple(b.shape) for b in out] == [(n, 3) for n in sizes]


# --------------------------------------------------------------------------------------------
# DataLoader: workers, pinning, persistent workers, a DistributedSampler across epochs
# --------------------------------------------------------------------------------------------


class Texts(Dataset[dict[str, Any]]):
    def __len__(self) -> int:
        return 11

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.full((2,), float(i)), "text": f"row {i}", "i": i}


def test_dataloader_with_workers_and_a_distributed_sampler_over_epochs(make: Any) -> None:
    data = Texts()
    sampler = DistributedSampler(data, num_replicas=2, rank=1, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=2, sampler=sampler, num_workers=2, persistent_workers=True)
    p = make(loader)
    assert len(p) == len(loader) == 3
    got, want = [], []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        got.append([(b["text"], tuple(b["i"].shape), tuple(b["x"].shape)) for b in p])
    for epoch in range(3):
        sampler.set_epoch(epoch)
        want.append([(b["text"], tuple(b["i"].shape), tuple(b["x"].shape)) for b in loader])
    # the loader's own order each epoch, and a new order per epoch (set_epoch took effect)
    assert got == want
    assert got[0] != got[1]


@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
def test_dataloader_with_pin_memory_and_workers_gives_the_loaders_values() -> None:
    data = TensorDataset(torch.arange(30.0).reshape(15, 2), torch.arange(15))
    loader = DataLoader(data, batch_size=4, num_workers=2, pin_memory=True)
    out = list(DevicePrefetcher(loader, "cpu"))
    want = list(loader)
    assert len(out) == len(want) == 4
    for (x, y), (wx, wy) in zip(out, want, strict=True):
        assert torch.equal(x, wx)
        assert torch.equal(y, wy)


def test_leaving_a_worker_loader_early_stops_its_workers(make: Any) -> None:
    data = TensorDataset(torch.arange(40.0).reshape(20, 2))
    p = make(DataLoader(data, batch_size=2, num_workers=2))
    for k, _ in enumerate(p):
        if k == 1:
            break
    gc.collect()
    assert multiprocessing.active_children() == []
    it = iter(p)
    next(it)
    assert multiprocessing.active_children() != []
    ref = weakref.ref(it)
    del it  # an abandoned iterator: its pass and the loader's workers end with it
    gc.collect()
    assert ref() is None
    assert multiprocessing.active_children() == []


# --------------------------------------------------------------------------------------------
# infinite and failing sources, several passes
# --------------------------------------------------------------------------------------------


def test_an_infinite_source_with_early_breaks(make: Any) -> None:
    p = make(itertools.cycle([torch.zeros(2), torch.ones(3)]), depth=2)
    with pytest.raises(TypeError, match="no len"):
        len(p)
    first = [tuple(b.shape) for b in itertools.islice(p, 5)]
    again = [tuple(b.shape) for b in itertools.islice(p, 3)]
    assert first == [(2,), (3,), (2,), (3,), (2,)]
    assert len(again) == 3  # the cycle goes on: a break never marks it used up


def test_a_source_raising_mid_epoch_yields_what_came_before_then_the_error(make: Any) -> None:
    source = Source(6, fail_at=4)
    p = make(source, depth=2)
    seen: list[int] = []

    def drain() -> None:
        for batch in p:
            seen.append(batch["i"])

    with pytest.raises(KeyError, match="bad sample 4"):
        drain()
    assert seen == [0, 1, 2, 3]
    source.fail_at = None
    assert [b["i"] for b in p] == list(range(6))  # a re-iterable source serves the next epoch


def test_two_epochs_give_the_same_batches(make: Any) -> None:
    source = [mixed(i) for i in range(7)]
    p = make(source)
    assert [shape_of(b) for b in p] == [shape_of(b) for b in p] == [shape_of(b) for b in source]


def test_a_pass_ended_by_a_new_pass_raises_instead_of_ending_quietly(make: Any) -> None:
    # a nested loop over the same prefetcher used to end the outer epoch silently after one
    # batch: the outer iterator just stopped
    source = Source(5)
    p = make(source)
    outer = iter(p)
    assert next(outer)["i"] == 0
    assert [b["i"] for b in p] == list(range(5))  # the new pass runs in full
    with pytest.raises(ConfigError, match="new pass over the same prefetcher started"):
        next(outer)


def test_zip_of_a_prefetcher_with_itself_is_refused(make: Any) -> None:
    p = make(Source(3))
    with pytest.raises(ConfigError, match="one pass at a time"):
        list(zip(p, p, strict=False))


def test_finished_or_closed_passes_still_end_quietly(make: Any) -> None:
    p = make(Source(3))
    done = iter(p)
    assert len(list(done)) == 3
    iter(p)
    with pytest.raises(StopIteration):
        next(done)  # it had ended by itself before the new pass
    closed = iter(p)
    next(closed)
    p.close_pass()
    with pytest.raises(StopIteration):
        next(closed)  # ended on request, not by another pass


def test_break_and_start_again_resumes_from_the_start(make: Any) -> None:
    p = make(Source(6), depth=2)
    for batch in p:
        if batch["i"] == 2:
            break
    assert [b["i"] for b in p] == list(range(6))


# --------------------------------------------------------------------------------------------
# no_grad and threads
# --------------------------------------------------------------------------------------------


def test_under_no_grad_in_a_thread(make: Any) -> None:
    source = [torch.ones(3, requires_grad=True) * i for i in range(4)]
    p = make(source)
    results: list[Any] = []

    def run() -> None:
        try:
            with torch.no_grad():
                results.append([(tuple(b.shape), b.dtype) for b in p])
        except BaseException as exc:  # pragma: no cover - reported below
            results.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert results == [[((3,), torch.float32)] * 4]


def test_a_prefetcher_per_thread_each_sees_every_batch(make: Any) -> None:
    results: dict[int, list[int]] = {}

    def run(k: int, p: DevicePrefetcher[Any]) -> None:
        results[k] = [b["i"] for b in p]

    prefetchers = [make(Source(8)) for _ in range(3)]
    threads = [threading.Thread(target=run, args=(k, p)) for k, p in enumerate(prefetchers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {k: list(range(8)) for k in range(3)}


def test_an_abandoned_iterator_releases_its_batches_and_closes_the_source(make: Any) -> None:
    source = Source(10)
    p = make(source, depth=3)
    it: Iterator[Any] | None = iter(p)
    assert it is not None
    batch = next(it)
    del batch
    it = None
    gc.collect()
    assert source.closed == 1
    assert [r() for r in source.sentinels if r() is not None] == []
