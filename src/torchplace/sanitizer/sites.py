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
from torchplace.sanitizer.function_mode import FunctionLayer

__all__ = ["is_internal", "user_site"]

_INTERNAL_PREFIXES: Final = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(torchplace.__file__) + os.sep,
    "<frozen ",
)
_STDLIB: Final = os.path.normcase(sysconfig.get_paths()["stdlib"]) + os.sep
_internal_files: dict[str, bool] = {}
_UNKNOWN_SITE: Final = Site("<unknown>", 0, "<unknown>")
#: The guard's front door: every torch call the program makes enters it from the program's frame.
_LAYER_CODE: Final = FunctionLayer.__torch_function__.__code__


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
_OVERRIDE_NAMES: Final = ("__torch_function__", "__torch_dispatch__")


def _is_plumbing(frame: FrameType) -> bool:
    code = frame.f_code
    return is_internal(code.co_filename) or code.co_name.endswith(_OVERRIDE_NAMES)


def _start(frame: FrameType) -> FrameType:
    """Where the walk starts: the outermost override (a ``__torch_function__`` or
    ``__torch_dispatch__``, or a function so named at its end, such as torchao's
    ``_dispatch__torch_function__``) that the innermost call into the guard's function layer
    led to, when there is one. What runs under it (the subclass's helpers, a lambda or
    comprehension written in it, a mode's) is plumbing of the call. Code of the program that
    torch calls back without one (a hook, a checkpointed block recomputed by backward) is not."""
    start = frame
    outer: FrameType | None = frame
    while outer is not None and outer.f_code is not _LAYER_CODE:
        if outer.f_code.co_name.endswith(_OVERRIDE_NAMES):
            start = outer
        outer = outer.f_back
    return start


def user_site() -> Site:
    """The innermost frame on this thread's stack that is neither torch nor torchplace code, nor
    a ``__torch_function__`` / ``__torch_dispatch__`` override (a tensor subclass's or a
    mode's) that torch called on the way, nor code that such an override ran."""
    frame: FrameType | None = _start(sys._getframe(1))
    while frame is not None and _is_plumbing(frame):
        frame = frame.f_back
    if frame is None:
        return _UNKNOWN_SITE
    return Site(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


# What ``torch.compiler.disable`` marks a function with: dynamo, tracing the guard's layers
# inside a ``torch.compile`` region, breaks the graph at this call instead of stepping in and
# warning that it cannot trace ``sys._getframe``. Set on torchplace's own function only.
user_site._torchdynamo_disable = True  # type: ignore[attr-defined]
