"""Site attribution: which line of the user's code an event belongs to.

A stack is looked at only when something is recorded: :func:`user_site` walks
``sys._getframe`` up to the first frame outside torch, torchplace and the standard library (and
outside the ``__torch_function__`` / ``__torch_dispatch__`` overrides torch calls on the way).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from types import FrameType
from typing import Final

import torch

import torchplace
from torchplace.sanitizer.events import Site

__all__ = ["is_internal", "user_site"]

_INTERNAL_PREFIXES: Final = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(torchplace.__file__) + os.sep,
    "<frozen ",
)
_STDLIB: Final = os.path.normcase(sysconfig.get_paths()["stdlib"]) + os.sep
_internal_files: dict[str, bool] = {}
_UNKNOWN_SITE: Final = Site("<unknown>", 0, "<unknown>")


def is_internal(filename: str) -> bool:
    """torch, torchplace and the standard library (``copy``, ``contextlib``, ...) are not the
    user's code; third-party packages are."""
    internal = _internal_files.get(filename)
    if internal is None:
        normalized = os.path.normcase(filename)
        internal = filename.startswith(_INTERNAL_PREFIXES) or (
            normalized.startswith(_STDLIB)
            and "site-packages" not in normalized
            and "dist-packages" not in normalized
        )
        _internal_files[filename] = internal
    return internal


#: The hooks through which torch hands a call to a tensor subclass or a mode: plumbing, even in
#: the user's own files; the line that made the call is further out.
_OVERRIDES: Final = frozenset({"__torch_function__", "__torch_dispatch__"})


def user_site() -> Site:
    """The innermost frame on this thread's stack that is neither torch nor torchplace code, nor
    a ``__torch_function__`` / ``__torch_dispatch__`` override (a tensor subclass's or a
    mode's) that torch called on the way."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and (
        is_internal(frame.f_code.co_filename) or frame.f_code.co_name in _OVERRIDES
    ):
        frame = frame.f_back
    if frame is None:
        return _UNKNOWN_SITE
    return Site(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
