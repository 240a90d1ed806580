"""Safe loading of state dicts onto any device, whatever device they were saved from.

:func:`load_checkpoint` reads safetensors files, and ``.pt``/``.pth``/``.bin`` files with
``torch.load(weights_only=True)`` only: a pickle that would need arbitrary code to load is refused
with :class:`~torchplace.errors.UnsafeCheckpointError` unless the caller opts in for a trusted
file. Every storage is mapped to the requested device while loading, so a checkpoint saved on
``cuda:1`` loads on a CPU-only machine. :func:`compare_state_dict` names missing, unexpected and
mis-shaped keys against a module.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pickle
import pickletools
import re
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from torchplace.errors import (
    CheckpointError,
    ConfigError,
    StateDictMismatchError,
    UnsafeCheckpointError,
)

__all__ = ["StateDictDiff", "compare_state_dict", "load_checkpoint"]

_log = logging.getLogger(__name__)

_SAFETENSORS_SUFFIXES = (".safetensors",)
# What a Hugging Face save_pretrained directory holds, in order of preference.
_DIRECTORY_FILES = (
    "model.safetensors.index.json",
    "model.safetensors",
    "pytorch_model.bin.index.json",
    "pytorch_model.bin",
)
# Prefixes that wrappers put before every key: DataParallel/DDP, torch.compile.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")
# Plain-data classes training scripts save beside the weights, safe to rebuild without code.
_SAFE_EXTRAS: list[Any] = [argparse.Namespace]
# Keys under which training scripts commonly nest the model's state dict, in order of preference.
_CONTAINER_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "network")
_SAFETENSORS_DEVICES = ("cpu", "cuda", "mps", "xpu", "npu", "hpu", "mlu")
_TORCH_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER, legacy torch.save
_EXTRA_STATE = "_extra_state"  # the key of what a module's get_extra_state() returns
_PACKED = "_packed_params"  # what torch.ao quantized modules save their packed weights under


@dataclass(frozen=True)
class StateDictDiff:
    """How a state dict differs from what a module expects, by key name."""

    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    mismatched: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]
    """(key, shape in the checkpoint, shape in the module)."""

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def describe(self) -> str:
        lines: list[str] = []
        if self.missing:
            lines.append(f"missing from the checkpoint ({len(self.missing)}):")
            lines.extend(f"  {k}" for k in self.missing)
        if self.unexpected:
            lines.append(f"unexpected in the checkpoint ({len(self.unexpected)}):")
            lines.extend(f"  {k}" for k in self.unexpected)
        if self.mismatched:
            lines.append(f"shape mismatches ({len(self.mismatched)}):")
            lines.extend(
                f"  {k}: checkpoint {list(a)} vs module {list(b)}" for k, a, b in self.mismatched
            )
        return "\n".join(lines) if lines else "state dict matches the module"


def compare_state_dict(module: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> StateDictDiff:
    """Compare ``state_dict`` with ``module.state_dict()`` by key and shape. A lazy module's
    uninitialized parameters (``nn.LazyLinear``) have no shape yet: loading gives them one.
    A key tied to another (one tensor under two names, saved once) is not missing when the
    other is there. A ``module`` that is not an ``nn.Module``, or a ``state_dict`` that is not a
    mapping, raises :class:`~torchplace.errors.ConfigError`."""
    if not isinstance(module, nn.Module):
        raise ConfigError(
            f"compare_state_dict: module must be an nn.Module instance, not {module!r:.80}"
        )
    if not isinstance(state_dict, Mapping):
        raise ConfigError(
            f"compare_state_dict: state_dict must be a mapping of names to tensors, not "
            f"{type(state_dict).__name__}; load it with load_checkpoint(path) first"
        )
    expected = module.state_dict()
    tied = _tied_names(module)
    # the old weight_norm names, as load_state_dict's hook renames them before it compares
    state_dict, _ = _renamed_weight_norm(module, state_dict)
    missing = tuple(
        k
        for k in expected
        if k not in state_dict and not any(t in state_dict for t in tied.get(k, ()))
    )
    unexpected = tuple(k for k in state_dict if k not in expected)
    mismatched = tuple(
        (k, tuple(v.shape), tuple(expected[k].shape))
        for k, v in state_dict.items()
        if k in expected
        and isinstance(v, torch.Tensor)
        and isinstance(expected[k], torch.Tensor)
        and not is_lazy(expected[k])
        and v.shape != expected[k].shape
    )
    return StateDictDiff(missing, unexpected, mismatched)


def load_checkpoint(
    path: str | os.PathLike[str],
    device: torch.device | str = "cpu",
    *,
    module: nn.Module | None = None,
    strict: bool = True,
    allow_pickle: bool = False,
    key: str | None = None,
) -> dict[str, torch.Tensor]:
    """Load a state dict from ``path`` with every tensor on ``device``.

    - ``device`` goes through :func:`torchplace.resolve_device` (``"auto"``, ``"cuda"`` ->
      ``cuda:N``, ...); storages are mapped there while loading, whatever device the file was
      saved from (a checkpoint saved on ``cuda:1`` loads on a CPU-only machine).
    - ``*.safetensors`` files (recognised by suffix or header) load with safetensors; anything
      else with ``torch.load(weights_only=True)``. A pickle that needs arbitrary code raises
      :class:`~torchplace.errors.UnsafeCheckpointError`; ``allow_pickle=True`` loads it anyway
      with full pickle, which can run any code the file contains: only for files you trust.
      A whole pickled module (``torch.save(model)``, or one under a key, as YOLOv5 saves
      ``{"model": model, ...}``) loaded so gives its ``state_dict()``.
    - A directory (as ``save_pretrained`` writes it) loads its ``model.safetensors.index.json``,
      ``model.safetensors``, ``pytorch_model.bin.index.json`` or ``pytorch_model.bin``; an
      ``*.index.json`` file loads every shard its ``weight_map`` names, merged.
    - A state dict nested as ``{"state_dict": ...}``, ``{"model": ...}`` (also
      ``model_state_dict``, ``module``, ``net``, ``network``) is unwrapped; failing those, the
      one entry that is a state dict (an EMA copy under ``"state_dict_ema"``, ...). ``key``
      names the entry to use instead (``key="model_ema"``). ``argparse.Namespace`` objects
      beside the weights load without ``allow_pickle``.
    - With ``module``, keys that all start with a wrapper's prefix the module's keys lack
      (``module.`` from DataParallel/DDP, ``_orig_mod.`` from ``torch.compile``) lose it, a
      wrapped module gets it added, and any other common first component (a LightningModule's
      ``model.``) is stripped when every key then fits, as is a nested run of those prefixes
      (``model.module.``: a DataParallel model saved inside a wrapper; ``module._orig_mod.``).
      When no key fits as saved, a base model's weights get the one prefix under which the
      module holds it (``bert.``), and a task model's lose it for the base model; each
      renaming is logged (INFO). Tied weights saved once (``safetensors.torch.save_model``)
      fill every name they are tied to.
    - With ``module``, the state dict is compared with the module by key and shape and loaded
      into it. With ``strict`` (the default) any missing or unexpected key or shape mismatch
      raises :class:`~torchplace.errors.StateDictMismatchError` naming each one, and the module
      is left untouched; without ``strict`` the differences are logged as a warning and every
      key that fits is loaded (use :func:`compare_state_dict` to get them as data). A tensor
      that cannot be copied into the module's (sparse or quantized into dense, complex into
      real), or weights for
      a module on the meta device (materialise it with ``module.to_empty(device=...)`` first),
      raise :class:`~torchplace.errors.CheckpointError` before anything is copied. ``module``
      that is not an ``nn.Module`` instance raises :class:`~torchplace.errors.ConfigError`, as
      does a ``strict`` or ``allow_pickle`` that is not a bool.

    Returns the state dict as a plain ``dict``; a module's extra state (the
    ``..._extra_state`` entries of ``get_extra_state``) is kept as saved, and loaded by the
    module's ``set_extra_state``. A missing or unreadable file, or one that is no
    torch checkpoint (a plain ``pickle.dump`` file), raises
    :class:`~torchplace.errors.CheckpointError` naming the path.
    """
    from torchplace.devices import resolve_device

    if module is not None and not isinstance(module, nn.Module):
        raise ConfigError(
            f"load_checkpoint(module=...) must be an nn.Module instance or None, not "
            f"{module!r:.80}; pass the model (an instance, not its class) to load the weights "
            "into, e.g. module=model"
        )
    if key is not None and not isinstance(key, str):
        raise ConfigError(f"load_checkpoint(key={key!r}) must be a str naming an entry, or None")
    for flag, value in (("strict", strict), ("allow_pickle", allow_pickle)):
        if not isinstance(value, bool):
            raise ConfigError(
                f"load_checkpoint({flag}={value!r:.40}) must be True or False, not "
                f"{type(value).__name__} (a string such as 'False' would count as true)"
            )
    target = resolve_device(device)
    try:
        file = Path(os.fsdecode(path))
    except TypeError:
        raise ConfigError(
            f"load_checkpoint: path {path!r} has type {type(path).__name__}; pass the checkpoint's "
            "path as a str or a pathlib.Path"
        ) from None
    try:
        file = _checked_file(file)
    except OSError as exc:  # a name too long, a directory that cannot be searched, ...
        raise CheckpointError(
            f"cannot read checkpoint {str(file)!r}: {exc.strerror or exc}; check the path"
        ) from None
    if file.name.lower().endswith(".json"):
        loaded: object = _load_index(file, target, allow_pickle)
    else:
        loaded = _load_file(file, target, allow_pickle)
    state = _as_state_dict(loaded, file, key)
    versions = getattr(state, "_metadata", None)  # torch.save keeps each module's version
    if target.type != "meta":
        _refuse_meta(state, file, target)
    state = {k: _to(v, target) for k, v in state.items()}  # .to returns a tensor in place itself
    if module is not None:
        renames: list[tuple[str, str]] = []
        state = _match_keys(module, state, file, renames)
        state = _fill_tied(module, _weight_norm_keys(module, state, file))
        _load_into(module, state, strict, file, _renamed_versions(versions, renames))
    return state


def _checked_file(file: Path) -> Path:
    """The weights file at ``file`` (in it, for a directory), or a CheckpointError saying why
    there is none; OSError when the filesystem cannot answer."""
    if not file.exists():
        raise CheckpointError(f"checkpoint {str(file)!r} does not exist; check the path")
    if file.is_dir():
        file = _weights_in(file)
    if not file.is_file():
        raise CheckpointError(f"checkpoint {str(file)!r} is not a file")
    if file.stat().st_size == 0:
        raise CheckpointError(
            f"checkpoint {str(file)!r} is empty (0 bytes); was it written completely? Save it "
            "again (torch.save or safetensors) or check the download"
        )
    return file


def _to(value: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor on ``device``; a module's extra state (any object) as it was loaded."""
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _load_file(file: Path, device: torch.device, allow_pickle: bool) -> object:
    if _is_safetensors(file):
        return _load_safetensors(file, device)
    return _load_pickle(file, device, allow_pickle)


def _weights_in(directory: Path) -> Path:
    """The weights file of a ``save_pretrained`` directory, or a CheckpointError naming what
    was looked for and the weight-like files that are there."""
    for name in _DIRECTORY_FILES:
        if (directory / name).is_file():
            return directory / name
    there = sorted(
        p.name
        for p in directory.iterdir()
        if p.suffix in (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
    )
    hint = f"; it holds {', '.join(there[:10])}: pass one of them" if there else ""
    raise CheckpointError(
        f"checkpoint {str(directory)!r} is a directory without any of "
        f"{', '.join(_DIRECTORY_FILES)}{hint}. Fix: pass the weights file itself"
    )


def _load_index(file: Path, device: torch.device, allow_pickle: bool) -> dict[str, torch.Tensor]:
    """Every shard a sharded checkpoint's index (``model.safetensors.index.json``) names,
    merged into one state dict."""
    try:
        index = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"cannot read checkpoint index {str(file)!r}: {exc}") from exc
    except RecursionError:  # arrays nested thousands deep: no index, and json cannot say so
        raise CheckpointError(
            f"cannot read checkpoint index {str(file)!r}: its JSON nests deeper than Python's "
            "recursion limit, which no sharded checkpoint's index does. Fix: pass the index "
            "(model.safetensors.index.json) or the weights file itself"
        ) from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(
            f"{str(file)!r} is a JSON file but not a sharded checkpoint's index: it has no "
            '"weight_map" of tensor names to shard files (as model.safetensors.index.json has). '
            "Fix: pass the index, or the weights file (.safetensors, .pt, .bin)"
        )
    merged: dict[str, torch.Tensor] = {}
    for name in dict.fromkeys(weight_map.values()):
        if not isinstance(name, str) or Path(name).name != name:
            raise CheckpointError(
                f"checkpoint index {str(file)!r} names shard {name!r}; a shard must be a file "
                "name in the index's own directory"
            )
        shard = file.parent / name
        if not shard.is_file():
            raise CheckpointError(
                f"shard {name!r} named by checkpoint index {str(file)!r} is missing ({shard}); "
                "download or copy every shard next to the index"
            )
        loaded = _as_state_dict(_load_file(shard, device, allow_pickle), shard, None)
        _refuse_missing(file, name, [k for k, v in weight_map.items() if v == name], loaded)
        merged.update(loaded)
    return merged


def _refuse_missing(index: Path, shard: str, named: list[str], loaded: Mapping[str, Any]) -> None:
    """Raise when ``shard`` lacks tensors its index maps to it: the shard and the index come from
    different saves (a partial download, a shard of another revision)."""
    missing = [k for k in named if k not in loaded]
    if missing:
        raise CheckpointError(
            f"shard {shard!r} lacks {len(missing)} of the {len(named)} tensor(s) that checkpoint "
            f"index {str(index)!r} maps to it ({_some(missing)}): the shard and the index come "
            "from different saves. Fix: download or copy the index and every shard again, from "
            "one revision"
        )


def _refuse_meta(state: dict[str, torch.Tensor], file: Path, target: torch.device) -> None:
    """Raise when the file holds meta tensors (shapes without data) that cannot go to ``target``."""
    empty = [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_meta]
    if empty:
        raise CheckpointError(
            f"checkpoint {str(file)!r} holds {len(empty)} tensor(s) without data, saved from the "
            f"meta device ({_some(empty)}), which "
            f"cannot be loaded onto {target}. Fix: save the state dict of a materialised model "
            "(module.to_empty(device=...), then initialise or load real weights), or load it "
            "with device='meta' to get the shapes only"
        )


def _is_safetensors(file: Path) -> bool:
    if file.suffix.lower() in _SAFETENSORS_SUFFIXES:
        return True
    try:
        with file.open("rb") as fh:
            head = fh.read(9)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {str(file)!r}: {exc}") from exc
    # safetensors: 8-byte little-endian header length, then a JSON object
    return len(head) == 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < 1 << 28


def _load_safetensors(file: Path, device: torch.device) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if _looks_like_torch_save(file):  # torch.load too reads a *.safetensors name as safetensors
        raise CheckpointError(
            f"checkpoint {str(file)!r} is named .safetensors but holds torch.save's format "
            "(torch.save(state_dict, 'model.safetensors') writes a torch archive, not "
            "safetensors). Fix: rename it to .pt and load that, or save it with "
            "safetensors.torch.save_file(state_dict, path)"
        )
    direct = device.type in _SAFETENSORS_DEVICES
    try:  # on another device, load_checkpoint moves the tensors from the cpu
        return load_file(file, device=str(device) if direct else "cpu")
    except Exception as exc:  # safetensors raises its own SafetensorError and OSError
        raise CheckpointError(
            f"cannot load safetensors checkpoint {str(file)!r}: {exc}; is the file complete?"
        ) from exc


_GLOBAL_RE = re.compile(r"Unsupported global: GLOBAL (\S+)")
_SHARD_RE = re.compile(r"-(\d+)-of-(\d+)\.[^.]+$")


def _looks_like_torch_save(file: Path) -> bool:
    """Whether ``file`` is as torch.save writes it: a zip archive, or the legacy format, a pickle
    stream that opens with torch's magic number (a plain ``pickle.dump`` file does not)."""
    try:
        with file.open("rb") as stream:
            if stream.read(4) == b"PK\x03\x04":
                return True
            stream.seek(0)
            for op, arg, _ in pickletools.genops(stream):  # reads opcodes, runs nothing
                if op.name not in ("PROTO", "FRAME"):
                    return op.name.startswith("LONG") and arg == _TORCH_MAGIC
    except (OSError, ValueError):  # unreadable, or not a pickle stream
        return False
    return False


def _safe_extras() -> contextlib.AbstractContextManager[object]:
    """Allow the plain-data classes in ``_SAFE_EXTRAS`` for one weights-only load."""
    allow = getattr(torch.serialization, "safe_globals", None)  # torch 2.5+
    return allow(_SAFE_EXTRAS) if allow is not None else contextlib.nullcontext()


def _zip_names(file: Path) -> list[str] | None:
    """The members of a zip archive (torch.save's format), or None when ``file`` is not one;
    CheckpointError when it opens as one but its directory at the end is missing."""
    with file.open("rb") as stream:
        if stream.read(4) != b"PK\x03\x04":
            return None
    try:
        with zipfile.ZipFile(file) as archive:
            return archive.namelist()
    except (zipfile.BadZipFile, ValueError) as exc:
        raise CheckpointError(
            f"cannot load checkpoint {str(file)!r}: it starts as a zip archive, as torch.save "
            f"writes, but is damaged or cut short ({exc}); was it written or downloaded "
            "completely? Save or download it again"
        ) from exc


def _refuse_foreign(file: Path) -> None:
    """Refuse, before torch.load reads it, a file torch.load cannot take as a checkpoint."""
    if not _looks_like_torch_save(file):
        # Not torch.save's zip nor its legacy format (a plain pickle.dump file, or garbage):
        # torch.load cannot read it at all, so allow_pickle would not help and is not advised.
        raise CheckpointError(
            f"cannot load checkpoint {str(file)!r}: it is not a torch checkpoint, neither a "
            "torch.save zip archive nor torch.save's legacy format (a plain pickle.dump file "
            "is neither); is it a torch checkpoint, and complete? Fix: save it with "
            "torch.save(model.state_dict(), path) or as safetensors"
        )
    names = _zip_names(file)
    if names is not None and any(n.rpartition("/")[2] == "archive_format" for n in names):
        raise CheckpointError(
            f"checkpoint {str(file)!r} is a torch.export archive (torch.export.save, a .pt2 "
            "package): a whole exported program, not a state dict. Fix: load it with "
            "ep = torch.export.load(path) and take its weights from ep.state_dict, or pass "
            "weights saved with torch.save(ep.state_dict, 'weights.pt')"
        )
    if names is not None and not any(n.rpartition("/")[2] == "data.pkl" for n in names):
        raise CheckpointError(
            f"cannot load checkpoint {str(file)!r}: it is a zip archive, but not one torch.save "
            f"wrote (it holds {', '.join(repr(n) for n in names[:5]) or 'nothing'}, no "
            "data.pkl); a numpy .npz loads with numpy.load, each array then with "
            "torch.from_numpy. Fix: pass a torch checkpoint (torch.save) or a safetensors file"
        )
    names = names or []
    if any(name.rpartition("/")[2] == "constants.pkl" for name in names):
        raise CheckpointError(
            f"checkpoint {str(file)!r} is a TorchScript archive (torch.jit.save): a whole "
            "program, not a state dict. Fix: load it with torch.jit.load(path, "
            "map_location=device), or pass its weights, saved with "
            "torch.save(torch.jit.load(path).state_dict(), 'weights.pt')"
        )
    if names:
        _refuse_damaged(file)


def _refuse_damaged(file: Path) -> None:
    """Refuse a zip archive a member of which fails its CRC check: torch.load does not check
    them, and a flipped byte in a tensor's storage (a bad disk, a corrupted copy) would load as
    wrong weights without a word. Reading every member through zipfile checks it, at the cost
    of one read of the file (which also warms the page cache for torch.load)."""
    try:
        with zipfile.ZipFile(file) as archive:
            bad = archive.testzip()  # the first member whose CRC does not match, else None
    except (zipfile.BadZipFile, EOFError, ValueError, zlib.error) as exc:  # a member cut short
        raise _damaged(file, f"a member cannot be read ({exc})") from exc
    if bad is not None:
        raise _damaged(file, f"CRC mismatch in {bad}")


def _damaged(file: Path, what: str) -> CheckpointError:
    return CheckpointError(
        f"cannot load checkpoint {str(file)!r}: it is damaged: {what}, so its data is not what "
        "was saved (a bad disk, a corrupted copy, an interrupted write). Fix: re-save it or "
        "re-download it"
    )


def _load_pickle(file: Path, device: torch.device, allow_pickle: bool) -> object:
    _refuse_foreign(file)
    try:
        with _safe_extras():
            return torch.load(file, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only" not in str(exc).lower():
            raise CheckpointError(
                f"cannot load checkpoint {str(file)!r}: {exc}; is it a torch checkpoint, and "
                "complete?"
            ) from exc
        if "unsupported operand" in str(exc).lower() and not allow_pickle:
            # torch.save with pickle_protocol=4+ or <2: opcodes the weights-only unpickler lacks,
            # so whether the file needs code cannot be told; it is not known to need any.
            raise CheckpointError(
                f"cannot load checkpoint {str(file)!r} safely: it was saved with a pickle "
                "protocol (torch.save(..., pickle_protocol=...)) that torch.load(weights_only=True) "
                "cannot read, so it cannot be checked for code. Fix: re-save it with the default "
                "protocol (torch.save(model.state_dict(), path)) or as safetensors; if you trust "
                "the file, pass allow_pickle=True."
            ) from exc
        if not allow_pickle:
            match = _GLOBAL_RE.search(str(exc))
            needed = _unsafe_globals(file) or ([match.group(1)] if match else [])
            what = f" (it references {', '.join(needed)})" if needed else ""
            just = (
                f"; if {', '.join(needed)} {'is' if len(needed) == 1 else 'are'} plain data "
                f"you trust, allow only {'it' if len(needed) == 1 else 'them'} with "
                f"torch.serialization.add_safe_globals([{', '.join(needed)}])"
                if needed
                else ""
            )
            raise UnsafeCheckpointError(
                f"checkpoint {str(file)!r} is a pickle that needs arbitrary code to load{what}. "
                "Loading it could run any code its author put in it, so it was refused "
                "(torch.load(weights_only=True) failed). If you trust the file, pass "
                f"allow_pickle=True{just}; better, re-save it as safetensors or as a plain "
                "state dict (torch.save(model.state_dict(), path))."
            ) from exc
        _log.warning(
            "loading %s with full pickle (allow_pickle=True): this runs code from the file",
            file,
        )
    except NotImplementedError as exc:
        if device.type == "cpu":
            raise CheckpointError(
                f"cannot load checkpoint {str(file)!r}: {type(exc).__name__}: {exc}; is it a "
                "torch checkpoint, and complete?"
            ) from exc
        raise CheckpointError(
            f"cannot load checkpoint {str(file)!r} onto {device}: it holds tensors (quantized, "
            f"nested, ...) that torch cannot create on {device.type} while loading "
            f"({str(exc).splitlines()[0][:160]}). Fix: load it onto the cpu "
            "(load_checkpoint(path, 'cpu')), then convert those tensors (tensor.dequantize(), "
            "tensor.to_padded_tensor(0.0)) before moving them"
        ) from exc
    except Exception as exc:  # torch.load raises many kinds on a corrupt or foreign file
        raise CheckpointError(
            f"cannot load checkpoint {str(file)!r}: {type(exc).__name__}: {exc}; is it a torch "
            "checkpoint, and complete?"
        ) from exc
    try:
        return torch.load(file, map_location=device, weights_only=False)
    except Exception as exc:
        raise CheckpointError(f"cannot load checkpoint {str(file)!r}: {exc}") from exc


def _unsafe_globals(file: Path) -> list[str]:
    """Every global a weights-only load of ``file`` would refuse (torch names only the first),
    up to eight, or [] when torch cannot list them."""
    lister = getattr(torch.serialization, "get_unsafe_globals_in_checkpoint", None)  # torch 2.5+
    if lister is None:
        return []
    try:
        found = [str(g) for g in lister(file)]
    except Exception:  # the legacy format, or a file it cannot read: torch's own message serves
        return []
    return found if 0 < len(found) <= 8 else []


def _is_state_dict(obj: object) -> bool:
    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(_tensor_entry(k, v) for k, v in obj.items())
    )


def _under_key(obj: object, file: Path, key: str) -> dict[str, torch.Tensor]:
    """The state dict in entry ``key`` of a training checkpoint, or a CheckpointError."""
    if not isinstance(obj, Mapping) or key not in obj:
        keys = ", ".join(repr(k) for k in list(obj)[:20]) if isinstance(obj, Mapping) else ""
        raise CheckpointError(
            f"checkpoint {str(file)!r} has no entry {key!r} (key={key!r}); "
            + (f"its entries are {keys}" if keys else f"it holds a {type(obj).__name__}")
        )
    if isinstance(obj[key], nn.Module):  # a whole module under the key, loaded with allow_pickle
        return _typed(obj[key].state_dict())
    if not _is_state_dict(obj[key]):
        raise CheckpointError(
            f"entry {key!r} of checkpoint {str(file)!r} holds a {type(obj[key]).__name__}, not a "
            "state dict (a mapping of names to tensors); pick another with key=..."
        )
    return _typed(obj[key])


def _as_state_dict(obj: object, file: Path, key: str | None) -> dict[str, torch.Tensor]:
    if key is not None:
        return _under_key(obj, file, key)
    if isinstance(obj, nn.Module):  # torch.save(model), loaded with allow_pickle=True
        return _typed(obj.state_dict())
    if _is_state_dict(obj):
        return _typed(obj)
    if isinstance(obj, Mapping):
        for name in _CONTAINER_KEYS:
            inner = obj.get(name)
            if isinstance(inner, nn.Module):  # torch.save({"model": model}), allow_pickle
                inner = inner.state_dict()
            if _is_state_dict(inner):
                _log.debug("checkpoint %s: using the state dict under %r", file, name)
                return _typed(inner)
        found = [k for k, v in obj.items() if _is_state_dict(v) or isinstance(v, nn.Module)]
        if len(found) == 1:
            _log.info("checkpoint %s: using the state dict under %r", file, found[0])
            return _as_state_dict(obj[found[0]], file, None)
        if found:
            raise CheckpointError(
                f"checkpoint {str(file)!r} holds {len(found)} state dicts, under "
                f"{', '.join(repr(k) for k in found)}. Fix: name the one to load with "
                f"key=..., e.g. load_checkpoint(path, key={found[0]!r})"
            )
        if len(obj) == 0:
            raise CheckpointError(f"checkpoint {str(file)!r} holds an empty dict")
        if "state" in obj and "param_groups" in obj:
            raise CheckpointError(
                f"checkpoint {str(file)!r} is an optimizer's state dict (its entries are 'state' "
                "and 'param_groups', as optimizer.state_dict() gives), not a model's: it holds "
                "no weights. Fix: load it with optimizer.load_state_dict(torch.load(path)), and "
                "pass the model's weights file (model.safetensors, pytorch_model.bin, ...) here"
            )
        _refuse_near_state_dict(obj, file)
        bad = [f"{k!r} ({type(v).__name__})" for k, v in obj.items() if not _tensor_entry(k, v)]
        raise CheckpointError(
            f"checkpoint {str(file)!r} is not a state dict: these entries are not named tensors: "
            f"{', '.join(bad[:10])}{' ...' if len(bad) > 10 else ''}; and none of the keys "
            f"{', '.join(_CONTAINER_KEYS)} holds one. Load it with torch.load and pick the "
            "state dict yourself."
        )
    raise CheckpointError(
        f"checkpoint {str(file)!r} holds a {type(obj).__name__}, not a state dict "
        "(a mapping of names to tensors)"
    )


def _refuse_near_state_dict(obj: Mapping[Any, Any], file: Path) -> None:
    """Raise, naming them, when an entry is a state dict but for a few entries that are not named
    tensors (a ``"version": 2`` saved among the weights): the error otherwise names only the
    entry, which looks like a state dict."""
    for name, inner in obj.items():
        if not isinstance(inner, Mapping) or not any(
            isinstance(v, torch.Tensor) for v in inner.values()
        ):
            continue
        bad = [f"{k!r} ({type(v).__name__})" for k, v in inner.items() if not _tensor_entry(k, v)]
        if len(bad) <= max(3, len(inner) // 10):
            raise CheckpointError(
                f"entry {name!r} of checkpoint {str(file)!r} holds tensors, but also entries "
                f"that are not named tensors, so it is no state dict: {', '.join(bad[:10])}. Fix: "
                "keep only the tensors ({k: v for k, v in sd.items() if isinstance(v, "
                "torch.Tensor)}) and load that state dict with module.load_state_dict"
            )


class _Versioned(dict):  # type: ignore[type-arg]
    """A state dict that keeps the ``_metadata`` (each module's state-dict version) of the one
    ``torch.save`` wrote, for load_state_dict: a quantized or other versioned module reads its
    entries by that version. Never returned: load_checkpoint gives a plain dict."""

    _metadata: Any


def _typed(obj: Any) -> dict[str, torch.Tensor]:
    out = _Versioned((str(k), v) for k, v in obj.items())
    versions = getattr(obj, "_metadata", None)
    if isinstance(versions, Mapping):
        out._metadata = versions
    return out


def _renamed_versions(versions: object, renames: list[tuple[str, str]]) -> Any:
    """The module versions ``_metadata`` (keyed by module path: ``""``, ``"0"``, ``"0.1"``) with
    the key prefixes renamed as the state dict's were; None when there are none."""
    if not isinstance(versions, Mapping):
        return None
    out = dict(versions)
    for old, new in renames:
        moved = {}
        for k, v in out.items():
            path = f"{k}." if k else ""  # a module's path as a key prefix
            if path.startswith(old):
                moved[(new + path.removeprefix(old)).removesuffix(".")] = v
        out = moved
    return out


def _tensor_entry(key: Any, value: Any) -> bool:
    """A named tensor, or a module's extra state (``get_extra_state``), which may be anything."""
    if not isinstance(key, str):
        return False
    if isinstance(value, torch.Tensor) or key.rpartition(".")[2] == _EXTRA_STATE:
        return True
    # a quantized module's packed weights and their dtype (torch.ao quantize_dynamic, ...)
    return _PACKED in key.split(".")


def _some(keys: list[str]) -> str:
    """The first five keys, and an ellipsis when there are more."""
    return ", ".join(keys[:5]) + (" ..." if len(keys) > 5 else "")


def _own_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict, less any non-tensor extra state."""
    return {k: v for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)}


def _refuse_meta_into(module: nn.Module, state: dict[str, torch.Tensor], file: Path) -> None:
    """Raise, before any copy, when meta tensors would go into a module that has data, or tensors
    with data into a module on the meta device: either copy would load nothing."""
    own = _own_tensors(module)
    state = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}  # no extra state
    into_meta = [k for k, v in state.items() if not v.is_meta and k in own and own[k].is_meta]
    if into_meta:
        raise CheckpointError(
            f"{type(module).__name__}'s {_some(into_meta)} live on the meta device (shapes, no "
            f"data): copying checkpoint {str(file)!r} into them would load nothing, and the "
            "module was left untouched. Fix: materialise the module first with "
            "module.to_empty(device=...), then load the checkpoint into it"
        )
    no_data = [k for k, v in state.items() if v.is_meta and k in own and not own[k].is_meta]
    if no_data:
        raise CheckpointError(
            f"checkpoint {str(file)!r} was loaded onto the meta device (shapes, no data), but "
            f"{type(module).__name__}'s {_some(no_data)} live on {own[no_data[0]].device}: there "
            "is nothing to copy into them, and the module was left untouched. Fix: load onto "
            "the module's device (load_checkpoint(path, device, module=...)), or pass a module "
            "on the meta device"
        )


def _refuse_uncopyable(module: nn.Module, state: dict[str, torch.Tensor], file: Path) -> None:
    """Raise, before any copy, for tensors that load_state_dict cannot copy into the module's
    (a sparse tensor into a dense one, a quantized one into a plain one, ...)."""
    own = _own_tensors(module)
    bad = [
        f"{k} ({_kind(v)} in the checkpoint, {_kind(own[k])} in the module)"
        for k, v in state.items()
        if k in own and isinstance(v, torch.Tensor) and _kind(v) != _kind(own[k])
    ]
    if bad:
        raise CheckpointError(
            f"checkpoint {str(file)!r} holds tensors that cannot be copied into "
            f"{type(module).__name__}'s: {_some(bad)}; the module was left untouched. Fix: "
            "convert them before saving (tensor.to_dense(), tensor.dequantize())"
        )
    lossy = [
        f"{k} ({_dtype(v)} in the checkpoint, {_dtype(own[k])} in the module)"
        for k, v in state.items()
        if k in own and isinstance(v, torch.Tensor) and v.is_complex() and not own[k].is_complex()
    ]
    if lossy:  # copy_ would drop the imaginary parts with only a warning
        raise CheckpointError(
            f"checkpoint {str(file)!r} holds complex tensors for real ones of "
            f"{type(module).__name__}: {_some(lossy)}; copying them would drop their imaginary "
            "parts, so the module was left untouched. Fix: load them into the complex model "
            "they were saved from, or convert them yourself (tensor.real, tensor.abs())"
        )


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _kind(t: torch.Tensor) -> str:
    """The layout, and whether quantized: what copy_ needs to match besides the shape."""
    layout = str(t.layout).removeprefix("torch.")
    return f"quantized {layout}" if t.is_quantized else layout


def _load_into(
    module: nn.Module,
    state: dict[str, torch.Tensor],
    strict: bool,
    file: Path,
    versions: Any = None,
) -> None:
    _refuse_meta_into(module, state, file)
    diff = compare_state_dict(module, state)
    if not diff.ok:
        if strict:
            raise StateDictMismatchError(
                f"checkpoint {str(file)!r} does not fit {type(module).__name__}:\n"
                f"{diff.describe()}{_prefix_hint(module, state)}{_shard_hint(file)}\n"
                "Fix: load the checkpoint into the architecture it was saved from, or pass "
                "strict=False to load only the keys that fit."
            )
        _log.warning(
            "checkpoint %s does not fully fit %s; loading the keys that fit.\n%s%s",
            file,
            type(module).__name__,
            diff.describe(),
            _prefix_hint(module, state),
        )
    bad = {k for k, _, _ in diff.mismatched}
    fitting = {k: v for k, v in state.items() if k not in bad}
    _refuse_uncopyable(module, fitting, file)
    if versions is not None:  # load_state_dict reads the modules' versions from _metadata
        fitting = _Versioned(fitting)
        fitting._metadata = versions
    module.load_state_dict(fitting, strict=strict)


def _tied_names(module: nn.Module) -> dict[str, tuple[str, ...]]:
    """Each state-dict key of ``module`` that names a tensor also named by other keys (tied
    weights), with all of those names."""
    groups: dict[int, list[str]] = {}
    for k, v in module.state_dict(keep_vars=True).items():
        if isinstance(v, torch.Tensor):
            groups.setdefault(id(v), []).append(k)
    return {k: tuple(g) for g in groups.values() if len(g) > 1 for k in g}


def _fill_tied(module: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with every tied name the checkpoint saved once (as safetensors' ``save_model``
    does) filled from the name it was saved under."""
    out = dict(state)
    for k, names in _tied_names(module).items():
        saved = next((n for n in names if n in state), None)
        if k not in out and saved is not None:
            out[k] = state[saved]
    return out


def _rename(
    state: dict[str, torch.Tensor],
    old: str,
    new: str,
    renames: list[tuple[str, str]] | None = None,
) -> dict[str, torch.Tensor]:
    if renames is not None:
        renames.append((old, new))
    return {new + k.removeprefix(old): v for k, v in state.items()}


def _weight_norm_pairs(module: nn.Module) -> list[tuple[str, str, str]]:
    """``(NAME_g, NAME_v, parametrizations.NAME.original)`` keys, with their module's path, of
    each weight of ``module`` that ``torch.nn.utils.parametrizations.weight_norm`` holds: the
    names the deprecated ``torch.nn.utils.weight_norm`` saved it under, and the stem of those
    the parametrization loads (``original0``, ``original1``)."""
    from torch.nn.utils import parametrize

    try:
        from torch.nn.utils.parametrizations import _WeightNorm
    except ImportError:  # a torch without the parametrization: nothing to rename
        return []
    pairs = []
    for where, sub in module.named_modules():
        if not parametrize.is_parametrized(sub):
            continue
        prefix = f"{where}." if where else ""
        for name, chain in sub.parametrizations.items():
            if any(isinstance(p, _WeightNorm) for p in chain):
                pairs.append(
                    (
                        f"{prefix}{name}_g",
                        f"{prefix}{name}_v",
                        f"{prefix}parametrizations.{name}.original",
                    )
                )
    return pairs


def _known_keys(module: nn.Module) -> set[str]:
    """The keys ``module.load_state_dict`` takes: its own, and the old ``weight_norm`` names
    (``NAME_g``/``NAME_v``) that the parametrization's load hook renames."""
    own = set(module.state_dict())
    for g, v, _ in _weight_norm_pairs(module):
        own.update((g, v))
    return own


def _renamed_weight_norm(module: nn.Module, state: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """``state`` with the ``NAME_g``/``NAME_v`` keys of the deprecated
    ``torch.nn.utils.weight_norm`` renamed to ``parametrizations.NAME.original0``/``original1``
    where ``module`` uses ``torch.nn.utils.parametrizations.weight_norm``, as the hook that
    function registers renames them inside ``load_state_dict``; and how many keys were."""
    renamed: dict[str, str] = {}
    for g, v, new in _weight_norm_pairs(module):
        if g in state and v in state and f"{new}0" not in state and f"{new}1" not in state:
            renamed.update({g: f"{new}0", v: f"{new}1"})
    if not renamed:
        return dict(state), 0
    return {renamed.get(k, k): t for k, t in state.items()}, len(renamed)


def _weight_norm_keys(
    module: nn.Module, state: dict[str, torch.Tensor], file: Path
) -> dict[str, torch.Tensor]:
    """``state`` with its old ``weight_norm`` keys renamed (:func:`_renamed_weight_norm`),
    logged: the hook renames them only inside ``load_state_dict``, which runs after the keys
    are compared here. Checkpoints of vocoders and speech encoders (HiFi-GAN, wav2vec2's
    positional convolution) were saved with the old names."""
    out, count = _renamed_weight_norm(module, state)
    if not count:
        return state
    _log.info(
        "checkpoint %s: renamed %d key(s) of torch.nn.utils.weight_norm (NAME_g, NAME_v) to "
        "those of parametrizations.weight_norm (parametrizations.NAME.original0, original1)",
        file,
        count,
    )
    return out


def _all_start(keys: Any, prefix: str) -> bool:
    keys = list(keys)
    return bool(keys) and all(k.startswith(prefix) for k in keys)


def _none_start(keys: Any, prefix: str) -> bool:
    return not any(k.startswith(prefix) for k in keys)


def _common_first(keys: Any) -> str | None:
    """``"model."`` when every key starts with that one dotted component, else None."""
    firsts = {k.split(".", 1)[0] + "." for k in keys if "." in k}
    if len(firsts) != 1:
        return None
    first = firsts.pop()
    return first if _all_start(keys, first) else None


def _match_keys(
    module: nn.Module,
    state: dict[str, torch.Tensor],
    file: Path,
    renames: list[tuple[str, str]] | None = None,
) -> dict[str, torch.Tensor]:
    """``state`` with its keys renamed to the module's where only a wrapper prefix differs: a
    common first component and the wrapper prefixes after it (``model.``, ``model.module.``,
    ``net._orig_mod.``) stripped when every key then names one of the module's,
    ``module.``/``_orig_mod.`` stripped (or added for a wrapped module), and the first of that
    again after them."""
    own = _known_keys(module)  # the old weight_norm names fit too: renamed after this
    prefix = _leading_prefix(own, state)
    if prefix:
        _log.info("checkpoint %s: stripped the %r prefix of every key", file, prefix)
        return _rename(state, prefix, "", renames)
    done = False
    while not done:
        done = True
        for p in _WRAPPER_PREFIXES:
            if _all_start(state, p) and _none_start(own, p):
                state, done = _rename(state, p, "", renames), False
                _log.info("checkpoint %s: stripped the %r prefix of every key", file, p)
            elif _all_start(own, p) and _none_start(state, p):
                state, done = _rename(state, "", p, renames), False
                _log.info("checkpoint %s: added the %r prefix to every key", file, p)
    prefix = _leading_prefix(own, state)
    if prefix:
        _log.info("checkpoint %s: stripped the %r prefix of every key", file, prefix)
        state = _rename(state, prefix, "", renames)
    if any(k in own for k in state):
        return state
    return _match_base_model(own, state, file, renames)


def _leading_prefix(own: set[str], state: Mapping[str, Any]) -> str:
    """The longest run of leading components common to every key of ``state`` (wrapper
    prefixes, :data:`_WRAPPER_PREFIXES`, and at most one other name: a LightningModule's
    ``model.``, any attribute a training wrapper holds the model under; ``model.module.`` is a
    DataParallel model saved inside such a wrapper) that none of ``own`` has and whose
    removal makes every key one of ``own``; "" when there is none."""
    chain, runs, named = "", [], False
    while (step := _common_first([k[len(chain) :] for k in state])) is not None:
        if step not in _WRAPPER_PREFIXES:
            if named:
                break
            named = True
        chain += step
        runs.append(chain)
    for run in reversed(runs):  # the longest first: "model.module." before "model."
        if _none_start(own, run) and all(k.removeprefix(run) in own for k in state):
            return run
    return ""


def _match_base_model(
    own: set[str],
    state: dict[str, torch.Tensor],
    file: Path,
    renames: list[tuple[str, str]] | None,
) -> dict[str, torch.Tensor]:
    """``state`` renamed where it and the module differ by one submodule: a base model's
    weights for a model that holds it under an attribute (``BertModel``'s for
    ``BertForSequenceClassification``, whose keys start with ``bert.``) get that prefix; a
    model's weights for its base model lose the prefix of the keys that fit it, the rest (its
    head) staying as saved (a prefix of every key is only stripped when all then fit). Only one such prefix, and no key then named twice."""
    firsts = sorted({k.split(".", 1)[0] + "." for k in own if "." in k})
    adds = [p for p in firsts if all(p + k in own for k in state)]
    if len(adds) == 1:
        _log.info("checkpoint %s: added the %r prefix to every key", file, adds[0])
        return _rename(state, "", adds[0], renames)
    strips = [p for p in {k.split(".", 1)[0] + "." for k in state if "." in k}]
    strips = [p for p in strips if _none_start(own, p) and all(p + k in state for k in own)]
    if len(strips) != 1:
        return state
    p = strips[0]
    inner = {k.removeprefix(p): v for k, v in state.items() if k.startswith(p)}
    rest = {k: v for k, v in state.items() if not k.startswith(p)}
    if not rest or inner.keys() & rest.keys():  # a prefix of every key: named in the error
        return state
    _log.info(
        "checkpoint %s: stripped the %r prefix of the keys that fit; %d other key(s) kept as "
        "saved (%s)",
        file,
        p,
        len(rest),
        _some(list(rest)),
    )
    if renames is not None:
        renames.append((p, ""))
    return {**inner, **rest}


def _prefix_hint(module: nn.Module, state: dict[str, torch.Tensor]) -> str:
    """A line for the mismatch error when every checkpoint key has a prefix the module's lack."""
    first = _common_first(state)
    if not first or not _none_start(module.state_dict(), first):
        return ""
    return (
        f"\nEvery key in the checkpoint starts with {first!r} and none of the module's does: "
        f"it was saved from a model that held this one as attribute {first[:-1]!r}. Load it "
        f"into that model, or strip the prefix: {{k.removeprefix({first!r}): v for k, v in "
        "state.items()}."
    )


def _shard_hint(file: Path) -> str:
    """A line for the mismatch error when ``file`` is named as one shard of several."""
    match = _SHARD_RE.search(file.name)
    if not match or match.group(2).lstrip("0") in ("", "1"):
        return ""
    return (
        f"\n{file.name} is one shard of {int(match.group(2))}: load the index next to it "
        "(model.safetensors.index.json) or the directory, which merge every shard."
    )
