"""TorchScript archives (``torch.jit.save``): the ``model.pt`` of Triton's PyTorch backend.

An archive is told from a ``torch.save`` file (a state dict, a pickled module), which is a zip
archive too, by its entries: TorchScript's hold the module's code (``ARCHIVE/code/...``) and
its constants (``ARCHIVE/constants.pkl``); ``torch.save``'s hold ``ARCHIVE/data.pkl`` without
either. It is loaded with ``torch.jit.load(..., map_location=device)``.

Its forward takes the inputs positionally. As in Triton's PyTorch backend, inputs named as
the forward's arguments (``forward(self, a, b)``: inputs ``b`` and ``a``) are given as those
arguments whatever their order in the configuration; else inputs named ``NAME__N``
(``INPUT__0``, ``INPUT__1``) are given as the forward's argument ``N`` (when their indexes are
``0`` to ``n - 1``), others in the configuration's order; outputs named ``NAME__N`` are element
``N`` of the tuple the forward returns, others are taken in order. Imported only when a
TorchScript archive is loaded.
"""

from __future__ import annotations

import re
import warnings
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchplace.errors import ConfigError

__all__ = [
    "TritonOrder",
    "check_archive",
    "forward_arguments",
    "is_torchscript",
    "load_torchscript",
    "tensor_order",
]

_INDEXED = re.compile(r".+__(\d+)")
#: how many times its own size an archive's entries may expand to: torch.jit.save stores its
#: entries uncompressed (about 1x); far more is a zip bomb, which torch.jit.load would inflate
MAX_EXPANSION = 16
_SAVE_FIX = "save it with torch.jit.save(torch.jit.script(model), path) (or torch.jit.trace)"


def is_torchscript(path: Path) -> bool:
    """Whether ``path`` is a TorchScript archive (a zip holding ``*/code/`` and
    ``*/constants.pkl``), not a ``torch.save`` file or anything else."""
    entries = _entries(path)
    return entries is not None and _is_script(entries)


def _entries(path: Path) -> list[zipfile.ZipInfo] | None:
    """The zip entries of ``path``; None when it is no zip archive (or cannot be read)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.infolist()
    except (OSError, zipfile.BadZipFile, ValueError):
        return None


def _is_script(entries: list[zipfile.ZipInfo]) -> bool:
    parts = [info.filename.split("/") for info in entries]
    code = any(len(p) > 2 and p[1] == "code" for p in parts)
    constants = any(len(p) == 2 and p[1] == "constants.pkl" for p in parts)
    return code and constants


def tensor_order(
    names: Sequence[str], *, inputs: bool, arguments: Sequence[str] = ()
) -> tuple[int, ...] | None:
    """Where each declared tensor goes, by Triton's conventions, or None for the
    configuration's own order. Inputs: the declared index feeding each forward argument, by
    the forward's argument names (``arguments``) when every input is one of them, else by
    ``NAME__N`` (when the indexes are ``0`` to ``n - 1``); outputs: the element of the
    forward's tuple for each declared output (``NAME__N``)."""
    if inputs and names and arguments and all(name in arguments for name in names):
        return _argument_order(names, arguments)
    found = [_INDEXED.fullmatch(name) for name in names]
    if not names or any(m is None for m in found):
        return None
    indexes = [int(m.group(1)) for m in found if m is not None]
    if indexes == list(range(len(indexes))):
        return None
    if not inputs:
        return tuple(indexes)
    if sorted(indexes) != list(range(len(indexes))):
        return None
    return tuple(indexes.index(argument) for argument in range(len(indexes)))


def _argument_order(names: Sequence[str], arguments: Sequence[str]) -> tuple[int, ...] | None:
    """The declared index feeding each forward argument, for inputs named as the forward's
    arguments (Triton's ``FORWARD_ARGUMENT`` convention); None when that is the declared
    order. Inputs that leave out an argument before the last one named are refused: the
    forward takes its arguments positionally, so a left-out one would shift the others."""
    positions = [list(arguments).index(name) for name in names]
    if len(set(positions)) != len(positions):
        raise ConfigError(f"inputs {list(names)!r} name a forward argument twice")
    if positions == list(range(len(positions))):
        return None
    if sorted(positions) != list(range(len(positions))):
        missing = [a for a in arguments[: max(positions) + 1] if a not in names]
        raise ConfigError(
            f"the inputs {list(names)!r} are the TorchScript forward's arguments "
            f"{list(arguments)!r} without {missing!r}, which come before an input declared; "
            "declare every argument the forward takes up to the last one given"
        )
    return tuple(positions.index(argument) for argument in range(len(positions)))


def forward_arguments(script: nn.Module) -> tuple[str, ...]:
    """The names of a TorchScript module's forward arguments (``self`` left out; scripted and
    traced modules both record them), or ``()`` when it has no schema to read."""
    try:
        schema = getattr(script.forward, "schema")  # noqa: B009 - a ScriptMethod's, untyped
        return tuple(str(argument.name) for argument in schema.arguments[1:])
    except (AttributeError, RuntimeError):
        return ()


class TritonOrder(nn.Module):
    """A TorchScript module fed and read in Triton's order (forward argument names, else
    ``NAME__N``; see the module docstring); made only when that order is not the
    configuration's."""

    def __init__(
        self,
        script: nn.Module,
        inputs: tuple[int, ...] | None,
        outputs: tuple[int, ...] | None,
    ) -> None:
        super().__init__()
        self.script = script
        self.input_order = inputs
        self.output_order = outputs

    def forward(self, *args: torch.Tensor) -> Any:
        if self.input_order is not None:
            args = tuple(args[i] for i in self.input_order)
        raw = self.script(*args)
        if self.output_order is None or not isinstance(raw, tuple | list):
            return raw
        if max(self.output_order) >= len(raw):
            raise ValueError(
                f"the TorchScript forward returned {len(raw)} tensors; the outputs declared "
                f"name element {max(self.output_order)} (OUTPUT__N is element N)"
            )
        return tuple(raw[i] for i in self.output_order)


def load_torchscript(
    path: Path,
    device: torch.device | str,
    *,
    inputs: Sequence[str] = (),
    outputs: Sequence[str] = (),
) -> nn.Module:
    """The archive at ``path`` (passed by :func:`check_archive` when the model was loaded:
    each replica's copy reads the same file) loaded onto ``device``, fed and read in Triton's
    order."""
    try:
        with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript: nothing to act on
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.load` is deprecated")
            script: nn.Module = torch.jit.load(  # type: ignore[no-untyped-call]
                str(path), map_location=device
            )
    except Exception as exc:  # the user's file: one line that says what, not a traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(
            f"cannot load the TorchScript archive {str(path)!r}: {type(exc).__name__}: "
            f"{first}; {_SAVE_FIX}"
        ) from exc
    ins = tensor_order(inputs, inputs=True, arguments=forward_arguments(script))
    outs = tensor_order(outputs, inputs=False)
    if ins is None and outs is None:
        return script
    return TritonOrder(script, ins, outs)


def check_archive(path: Path) -> None:
    """Refuse (ConfigError) a path that is not a TorchScript archive, saying what it is."""
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise ConfigError(
            f"TorchScript archive {str(path)!r} {what}; put the model there ({_SAVE_FIX}), or "
            "name its file with default_model_filename in config.pbtxt"
        )
    entries = _entries(path)
    if entries is not None and _is_script(entries):
        _check_expansion(path, entries)
        return
    what = "a torch.save file (a state dict or a pickled module)"
    if entries is None:
        what = "not a zip archive (a TorchScript archive of torch < 1.4, or another format)"
    raise ConfigError(
        f"{str(path)!r} is {what}, not a TorchScript archive, which Triton's PyTorch backend "
        f"and torchplace load from a version directory of a Triton model; {_SAVE_FIX}"
    )


def _check_expansion(path: Path, entries: list[zipfile.ZipInfo]) -> None:
    """Refuse (ConfigError) an archive whose compressed entries claim to expand to far more
    than the file (a zip bomb: ``torch.jit.load`` inflates an entry whole, in memory)."""
    declared = sum(info.file_size for info in entries)
    size = path.stat().st_size
    if declared > max(MAX_EXPANSION * size, 64 << 20):
        raise ConfigError(
            f"TorchScript archive {str(path)!r} ({size:,} bytes) expands to {declared:,} "
            f"bytes, over {MAX_EXPANSION} times its size: not an archive that torch.jit.save "
            f"wrote (it stores its entries uncompressed); {_SAVE_FIX}"
        )
