"""Hostile input, round 35: a ``UserDict`` whose constructor takes a tag first, a ``to`` that
works in place and returns None, transformers' batches whose ``to`` changes them in place, a
``to`` that is no device move (pint, arrow) or that meets meta tensors, and a checkpoint with a
flipped byte in a tensor's storage."""

from __future__ import annotations

import io
import re
import zipfile
from collections import UserDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from torchplace import (
    CheckpointError,
    ConfigError,
    DevicePrefetcher,
    PlacementError,
    load_checkpoint,
    move,
)

META = torch.device("meta")


def _through_prefetcher(batch: Any) -> Any:
    """``batch`` as a DevicePrefetcher hands it out on the meta device."""
    with DevicePrefetcher([batch], META) as batches:
        (out,) = list(batches)
    return out


# ------------------------------------------- 1. a mapping whose constructor takes a tag first


class Features(UserDict[str, Any]):
    """A batch with a tag: its constructor takes the split first, the items after."""

    def __init__(self, split: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.split = split


@pytest.mark.parametrize("mover", [lambda b: move(b, META), _through_prefetcher])
def test_a_userdict_whose_constructor_takes_a_tag_first_keeps_its_items(mover: Any) -> None:
    """Attack: ``type(m)(items)`` gave the items to ``split`` and built an empty Features."""
    batch = Features("train", x=torch.ones(2), y=torch.zeros(2))
    out = mover(batch)
    assert type(out) is Features
    assert out is not batch
    assert sorted(out) == ["x", "y"]
    assert out.split == "train"
    assert {t.device for t in out.values()} == {META}
    assert batch["x"].device.type == "cpu"  # the input is unchanged


class Tagged(Mapping[str, Any]):
    """A read-only mapping whose constructor takes its tag first and its items optionally."""

    def __init__(self, tag: object, items: Mapping[str, Any] | None = None) -> None:
        self.tag = tag
        self._items = dict(items or {})

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def test_a_mapping_rebuilt_without_its_items_is_refused_naming_its_path() -> None:
    """Attack: ``Tagged(items)`` took the items as its tag and came back empty, silently."""
    batch = {"feats": Tagged("train", {"x": torch.ones(2)})}
    with pytest.raises(ConfigError, match=r'cannot rebuild a Tagged .* at value\["feats"\]'):
        move(batch, META)
    with pytest.raises(ConfigError, match=r"Tagged"):
        _through_prefetcher(batch)


# ------------------------------------------------------- 2. a to that returns None


class GraphBatch:
    """Like a pre-2.0 PyG ``Batch``: ``to`` moves its attributes in place and returns None."""

    def __init__(self) -> None:
        self.x = torch.ones(4, 3)
        self.edge_index = torch.zeros(2, 5, dtype=torch.long)

    def to(self, device: Any) -> None:
        self.x = self.x.to(device)
        self.edge_index = self.edge_index.to(device)


@pytest.mark.parametrize("mover", [lambda b: move(b, META), _through_prefetcher])
def test_a_to_that_returns_none_is_refused_not_turned_into_none(mover: Any) -> None:
    """Attack: the batch's graph silently became None in the moved structure."""
    graph = GraphBatch()
    with pytest.raises(ConfigError, match=r'GraphBatch at value\["graph"\].*returned None') as err:
        mover({"graph": graph, "y": torch.ones(4)})
    assert "make its to return the moved object" in str(err.value)
    assert graph.x.device.type == "cpu"  # its to ran on a copy


# --------------------------------------- 3. transformers' batches, whose to changes them


class BatchEncoding(UserDict[str, Any]):
    """Mirrors transformers' ``BatchEncoding`` where it matters here: a ``UserDict`` whose
    ``__init__`` takes ``(data=None, encoding=None, tensor_type=None, ...)``, whose items read
    as attributes too (``__getattr__`` on ``data``), and whose ``to(device)`` replaces
    ``self.data`` with a new dict of moved tensors and returns ``self``."""

    def __init__(
        self,
        data: dict[str, Any] | None = None,
        encoding: object = None,
        tensor_type: object = None,
    ) -> None:
        super().__init__(data)
        self._encodings = encoding

    def __getattr__(self, item: str) -> Any:
        try:
            return self.__dict__["data"][item]
        except KeyError:
            raise AttributeError(item) from None

    def to(self, device: Any, *, non_blocking: bool = False) -> BatchEncoding:
        self.data = {
            k: v.to(device=device, non_blocking=non_blocking) if hasattr(v, "to") else v
            for k, v in self.data.items()
        }
        return self


class BatchFeature(UserDict[str, Any]):
    """Mirrors transformers' ``BatchFeature``: a ``UserDict`` whose ``to(*args, **kwargs)``
    moves its tensors (also inside lists and tuples), replaces ``self.data`` with a new dict
    of them and returns ``self``; a meta tensor in it going to the cpu raises torch's
    ``NotImplementedError`` from ``tensor.to``."""

    def __init__(self, data: dict[str, Any] | None = None, tensor_type: object = None) -> None:
        super().__init__(data)

    def to(self, *args: Any, **kwargs: Any) -> BatchFeature:
        def maybe_to(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                return v.to(*args, **kwargs)
            if isinstance(v, (list, tuple)):
                return type(v)(maybe_to(item) for item in v)
            return v

        self.data = {k: maybe_to(v) for k, v in self.items()}
        return self


@pytest.mark.parametrize("mover", [lambda b: move(b, META), _through_prefetcher])
def test_a_batch_whose_to_changes_it_in_place_is_left_unchanged(mover: Any) -> None:
    """Attack: ``move(enc, "meta") is enc``, and the caller's CPU batch then held meta tensors."""
    enc = BatchEncoding({"input_ids": torch.ones(2, 3, dtype=torch.long)})
    feat = BatchFeature({"pixel_values": torch.randn(1, 3, 2, 2)})
    for batch, key in ((enc, "input_ids"), (feat, "pixel_values")):
        out = mover(batch)
        assert out is not batch
        assert type(out) is type(batch)
        assert out[key].device == META
        assert batch[key].device.type == "cpu"
    assert mover({"enc": enc})["enc"].input_ids.device == META
    assert enc.input_ids.device.type == "cpu"


# ------------------------------------ 4. a to that is no device move, or meets meta tensors


class Quantity:
    """Mirrors pint's ``Quantity`` (pint 0.25): ``to(other)`` converts to other units, reading
    ``other`` as a units container; a ``torch.device`` gives none (None), and pint then fails
    with ``AttributeError: 'NoneType' object has no attribute 'items'``."""

    _UNITS: ClassVar[dict[str, dict[str, int]]] = {"kHz": {"kilohertz": 1}, "Hz": {"hertz": 1}}

    def __init__(self, magnitude: float, units: dict[str, int]) -> None:
        self.magnitude = magnitude
        self.units = units

    def to(self, other: Any) -> Quantity:
        container = self._UNITS.get(other) if isinstance(other, str) else None
        return Quantity(self.magnitude, dict(container.items()))  # type: ignore[union-attr]


class Arrow:
    """Mirrors arrow's ``Arrow`` (arrow 1.4): ``to(tz)`` converts to a time zone, parsing
    ``tz`` with a regular expression when it is no ``tzinfo``; a ``torch.device`` makes
    ``re.match`` raise ``TypeError: expected string or bytes-like object``."""

    _TZ = re.compile(r"^(?:\(UTC([\+\-]\d{2}):(\d{2})\))?(\w[\w+\-/]+)?$")

    def to(self, tz: Any) -> Arrow:
        if not self._TZ.match(tz):
            raise ValueError(f"not a time zone: {tz!r}")
        return Arrow()


@pytest.mark.parametrize(
    ("value", "kind", "cause"),
    [(Quantity(16, {"kilohertz": 1}), "Quantity", AttributeError), (Arrow(), "Arrow", TypeError)],
)
def test_a_to_that_is_no_device_move_is_a_config_error_naming_its_path(
    value: Any, kind: str, cause: type[Exception]
) -> None:
    """Attack: pint's AttributeError and arrow's TypeError came out raw, without a path."""
    batch = {"audio": torch.ones(4), "extra": value}
    for mover in (lambda b: move(b, "cpu"), _through_prefetcher):
        with pytest.raises(ConfigError, match=rf'the {kind} at value\["extra"\]') as err:
            mover(batch)
        assert "leave it out of the batch, or give it a to that takes a device" in str(err.value)
        assert isinstance(err.value.__cause__, cause)


def test_a_meta_batch_with_its_own_to_going_to_the_cpu_is_a_placement_error() -> None:
    """Attack: a meta BatchFeature moved to the cpu gave torch's raw NotImplementedError, where
    a meta tensor going to a real device raises PlacementError."""
    for values in (torch.empty(1, 3, device=META), [torch.empty(1, 3, device=META)]):
        batch = {"inputs": BatchFeature({"pixel_values": values})}
        with pytest.raises(
            PlacementError, match=r'BatchFeature at value\["inputs"\] holds meta'
        ) as err:
            move(batch, "cpu")
        assert isinstance(err.value.__cause__, NotImplementedError)


# ----------------------------------------------- 6. a checkpoint with a flipped byte


def test_a_checkpoint_with_a_flipped_byte_in_a_storage_is_refused_as_damaged(
    tmp_path: Path,
) -> None:
    """Attack: torch.load does not check the zip's CRCs, so one flipped byte inside data/0
    loaded as silently wrong weights."""
    torch.manual_seed(0)
    state = {"weight": torch.randn(64, 64)}
    good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
    torch.save(state, good)
    data = bytearray(good.read_bytes())
    archive = zipfile.ZipFile(io.BytesIO(bytes(data)))
    info = next(i for i in archive.infolist() if i.filename.endswith("data/0"))
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + 100] ^= 0xFF
    bad.write_bytes(bytes(data))
    assert torch.equal(load_checkpoint(good)["weight"], state["weight"])
    with pytest.raises(CheckpointError, match=rf"damaged: CRC mismatch in {info.filename}"):
        load_checkpoint(bad)
