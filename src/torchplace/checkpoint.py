"""Safe loading of state dicts onto any device, whatever device they were saved from.

:func:`load_checkpoint` reads safetensors files, and ``.pt``/``.pth``/``.bin`` files with
``torch.load(weights_only=True)`` only: a pickle that would need arbitrary code to load is refused
with :class:`~torchplace.errors.UnsafeCheckpointError` unless the caller opts in for a trusted
file. Every storage is mapped to the requested device while loading, so a checkpoint saved on
``cuda:1`` loads on a CPU-only machine. :func:`compare_state_dict` names missing, unexpected and
mis-shaped keys against a module.
"""

from __future__ import annotations

import logging
import os
import pickle
import pickletools
import re
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
# Keys under which training scripts commonly nest the model's state dict, in order of preference.
_CONTAINER_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "network")
_SAFETENSORS_DEVICES = ("cpu", "cuda", "mps", "xpu", "npu", "hpu", "mlu")
_TORCH_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER, legacy torch.save


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
    uninitialized parameters (``nn.LazyLinear``) have no shape yet: loading gives them one."""
    expected = module.state_dict()
    missing = tuple(k for k in expected if k not in state_dict)
    unexpected = tuple(k for k in state_dict if k not in expected)
    mismatched = tuple(
        (k, tuple(v.shape), tuple(expected[k].shape))
        for k, v in state_dict.items()
        if k in expected
        and isinstance(v, torch.Tensor)
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
) -> dict[str, torch.Tensor]:
    """Load a state dict from ``path`` with every tensor on ``device``.

    - ``device`` goes through :func:`torchplace.resolve_device` (``"auto"``, ``"cuda"`` ->
      ``cuda:N``, ...); storages are mapped there while loading, whatever device the file was
      saved from (a checkpoint saved on ``cuda:1`` loads on a CPU-only machine).
    - ``*.safetensors`` files (recognised by suffix or header) load with safetensors; anything
      else with ``torch.load(weights_only=True)``. A pickle that needs arbitrary code raises
      :class:`~torchplace.errors.UnsafeCheckpointError`; ``allow_pickle=True`` loads it anyway
      with full pickle, which can run any code the file contains: only for files you trust.
    - A state dict nested as ``{"state_dict": ...}``, ``{"model": ...}`` (also
      ``model_state_dict``, ``module``, ``net``, ``network``) is unwrapped.
    - With ``module``, the state dict is compared with the module by key and shape and loaded
      into it. With ``strict`` (the default) any missing or unexpected key or shape mismatch
      raises :class:`~torchplace.errors.StateDictMismatchError` naming each one, and the module
      is left untouched; without ``strict`` the differences are logged as a warning and every
      key that fits is loaded (use :func:`compare_state_dict` to get them as data). A tensor
      that cannot be copied into the module's (sparse or quantized into dense), or weights for
      a module on the meta device (materialise it with ``module.to_empty(device=...)`` first),
      raise :class:`~torchplace.errors.CheckpointError` before anything is copied. ``module``
      that is not an ``nn.Module`` instance raises :class:`~torchplace.errors.ConfigError`.

    Returns the state dict as a plain ``dict``. A missing or unreadable file, or one that is no
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
    target = resolve_device(device)
    try:
        file = Path(os.fsdecode(path))
    except TypeError:
        raise ConfigError(
            f"load_checkpoint: path {path!r} has type {type(path).__name__}; pass the checkpoint's "
            "path as a str or a pathlib.Path"
        ) from None
    if not file.exists():
        raise CheckpointError(f"checkpoint {str(file)!r} does not exist; check the path")
    if not file.is_file():
        raise CheckpointError(f"checkpoint {str(file)!r} is not a file")
    if file.stat().st_size == 0:
        raise CheckpointError(
            f"checkpoint {str(file)!r} is empty (0 bytes); was it written completely? Save it "
            "again (torch.save or safetensors) or check the download"
        )
    if _is_safetensors(file):
        loaded: object = _load_safetensors(file, target)
    else:
        loaded = _load_pickle(file, target, allow_pickle)
    state = _as_state_dict(loaded, file)
    if target.type != "meta":
        _refuse_meta(state, file, target)
    state = {k: v.to(target) for k, v in state.items()}  # .to returns a tensor in place itself
    if module is not None:
        _load_into(module, state, strict, file)
    return state


def _refuse_meta(state: dict[str, torch.Tensor], file: Path, target: torch.device) -> None:
    """Raise when the file holds meta tensors (shapes without data) that cannot go to ``target``."""
    empty = [k for k, v in state.items() if v.is_meta]
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

    direct = device.type in _SAFETENSORS_DEVICES
    try:  # on another device, load_checkpoint moves the tensors from the cpu
        return load_file(file, device=str(device) if direct else "cpu")
    except Exception as exc:  # safetensors raises its own SafetensorError and OSError
        raise CheckpointError(
            f"cannot load safetensors checkpoint {str(file)!r}: {exc}; is the file complete?"
        ) from exc


_GLOBAL_RE = re.compile(r"Unsupported global: GLOBAL (\S+)")


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


def _load_pickle(file: Path, device: torch.device, allow_pickle: bool) -> object:
    try:
        return torch.load(file, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only" not in str(exc).lower():
            raise CheckpointError(
                f"cannot load checkpoint {str(file)!r}: {exc}; is it a torch checkpoint, and "
                "complete?"
            ) from exc
        if not _looks_like_torch_save(file):
            # Not torch.save's zip nor its legacy format (a plain pickle.dump file, or garbage):
            # torch.load cannot read it at all, so allow_pickle would not help and is not advised.
            raise CheckpointError(
                f"cannot load checkpoint {str(file)!r}: it is not a torch checkpoint, neither a "
                "torch.save zip archive nor torch.save's legacy format (a plain pickle.dump file "
                "is neither); is it a torch checkpoint, and complete? Fix: save it with "
                "torch.save(model.state_dict(), path) or as safetensors"
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
            what = f" (it references {match.group(1)})" if match else ""
            raise UnsafeCheckpointError(
                f"checkpoint {str(file)!r} is a pickle that needs arbitrary code to load{what}. "
                "Loading it could run any code its author put in it, so it was refused "
                "(torch.load(weights_only=True) failed). If you trust the file, pass "
                "allow_pickle=True; better, re-save it as safetensors or as a plain state dict "
                "(torch.save(model.state_dict(), path))."
            ) from exc
        _log.warning(
            "loading %s with full pickle (allow_pickle=True): this runs code from the file",
            file,
        )
    except Exception as exc:  # torch.load raises many kinds on a corrupt or foreign file
        raise CheckpointError(
            f"cannot load checkpoint {str(file)!r}: {type(exc).__name__}: {exc}; is it a torch "
            "checkpoint, and complete?"
        ) from exc
    try:
        return torch.load(file, map_location=device, weights_only=False)
    except Exception as exc:
        raise CheckpointError(f"cannot load checkpoint {str(file)!r}: {exc}") from exc


def _is_state_dict(obj: object) -> bool:
    return (
        isinstance(obj, Mapping)
        and len(obj) > 0
        and all(_tensor_entry(k, v) for k, v in obj.items())
    )


def _as_state_dict(obj: object, file: Path) -> dict[str, torch.Tensor]:
    if _is_state_dict(obj):
        return _typed(obj)
    if isinstance(obj, Mapping):
        for key in _CONTAINER_KEYS:
            inner = obj.get(key)
            if _is_state_dict(inner):
                _log.debug("checkpoint %s: using the state dict under %r", file, key)
                return _typed(inner)
        if len(obj) == 0:
            raise CheckpointError(f"checkpoint {str(file)!r} holds an empty dict")
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


def _typed(obj: Any) -> dict[str, torch.Tensor]:
    return {str(k): v for k, v in obj.items()}


def _tensor_entry(key: Any, value: Any) -> bool:
    return isinstance(key, str) and isinstance(value, torch.Tensor)


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
        if k in own and _kind(v) != _kind(own[k])
    ]
    if bad:
        raise CheckpointError(
            f"checkpoint {str(file)!r} holds tensors that cannot be copied into "
            f"{type(module).__name__}'s: {_some(bad)}; the module was left untouched. Fix: "
            "convert them before saving (tensor.to_dense(), tensor.dequantize())"
        )


def _kind(t: torch.Tensor) -> str:
    """The layout, and whether quantized: what copy_ needs to match besides the shape."""
    layout = str(t.layout).removeprefix("torch.")
    return f"quantized {layout}" if t.is_quantized else layout


def _load_into(module: nn.Module, state: dict[str, torch.Tensor], strict: bool, file: Path) -> None:
    _refuse_meta_into(module, state, file)
    diff = compare_state_dict(module, state)
    if not diff.ok:
        if strict:
            raise StateDictMismatchError(
                f"checkpoint {str(file)!r} does not fit {type(module).__name__}:\n"
                f"{diff.describe()}\n"
                "Fix: load the checkpoint into the architecture it was saved from, or pass "
                "strict=False to load only the keys that fit."
            )
        _log.warning(
            "checkpoint %s does not fully fit %s; loading the keys that fit.\n%s",
            file,
            type(module).__name__,
            diff.describe(),
        )
    bad = {k for k, _, _ in diff.mismatched}
    fitting = {k: v for k, v in state.items() if k not in bad}
    _refuse_uncopyable(module, fitting, file)
    module.load_state_dict(fitting, strict=strict)
