"""Device spec parsing: ``"auto"``, ``"cuda"``, ``1``, ``"cuda:1"``, ``torch.device(...)`` into a
(type, index) pair, or a :class:`~torchplace.errors.ConfigError` that lists what is understood.

A spec is read more loosely than :class:`torch.device` reads a string, on purpose: case,
surrounding whitespace and leading zeros do not matter (``" CUDA:01 "`` is ``cuda:1``), and an int
N (or an integer-like object such as numpy's, which torch takes too) means ``cuda:N``. What torch
cannot represent is refused: a negative index, and an index past 127 (``torch.device`` keeps the
index in 8 bits, so ``torch.device("cuda", 128)`` is ``cuda:-128``).
"""

from __future__ import annotations

import operator
import re
import warnings
from typing import NoReturn

import torch

from torchplace.errors import ConfigError

__all__ = ["MAX_INDEX", "OTHER_ACCELERATORS", "PASS_THROUGH", "parse_spec", "shown"]


#: Accelerators other than CUDA that a spec may name.
OTHER_ACCELERATORS = ("mps", "xpu")
#: Devices returned as they are, with no hardware to ask.
PASS_THROUGH = ("cpu", "meta")
#: The largest device index torch can hold (``c10::DeviceIndex`` is an int8).
MAX_INDEX = 127
_SPEC_RE = re.compile(r"^(?P<type>[a-z_]+)(?::(?P<index>-?[0-9]+))?$")
_KNOWN = "'auto', 'cpu', 'meta', 'cuda', 'cuda:N', 'mps', 'xpu:N' or an int N (meaning 'cuda:N')"
_SHOWN_LIMIT = 60


def shown(value: object) -> str:
    """``repr(value)`` for a message, cut to a readable length (a spec may be 100 KB long)."""
    if isinstance(value, int) and value.bit_length() > 64:  # repr of 10**5000 raises
        return f"<an integer of {value.bit_length()} bits>"
    try:
        text = repr(value)
    except Exception:  # an object whose repr fails must not hide the error being reported
        text = f"<a {type(value).__name__} object>"
    if len(text) <= _SHOWN_LIMIT:
        return text
    return f"{text[: _SHOWN_LIMIT - 20]}...{text[-10:]} ({len(text)} characters)"


def parse_spec(spec: str | torch.device | int | None) -> tuple[str, int | None]:
    """Split a spec into (type, index); type may be ``"auto"``."""
    if spec is None:
        return "auto", None
    if isinstance(spec, bool):
        raise ConfigError(f"device spec {spec!r} is a bool; pass 'auto', 'cpu', 'cuda:0' or an int")
    if isinstance(spec, torch.device):
        return _check_kind(spec.type, spec.index, spec)
    if not isinstance(spec, str):
        index = _as_index(spec)
        if index is None:
            raise ConfigError(
                f"device spec {shown(spec)} has type {type(spec).__name__}; "
                "pass a str ('auto', 'cpu', 'cuda', 'cuda:1'), an int or a torch.device"
            )
        return "cuda", _check_index(index, spec)
    text = spec.strip().lower()
    if re.fullmatch(r"-?[0-9]+", text):  # ASCII digits only: str.isdigit takes "٣"
        return "cuda", _check_index(_digits(text, spec), spec)
    match = _SPEC_RE.match(text)
    if match is None:
        joined = re.fullmatch(r"([a-z]+)[\s_-]*([0-9]+)", text)  # "cuda0", "cuda 1", "xpu-0"
        hint = ""
        if joined and joined.group(1) in ("cuda", "gpu", *OTHER_ACCELERATORS):
            kind = "cuda" if joined.group(1) == "gpu" else joined.group(1)
            hint = f" (did you mean '{kind}:{int(joined.group(2))}'?)"
        raise ConfigError(f"device spec {shown(spec)} is not understood{hint}; use {_KNOWN}")
    digits = match.group("index")
    index = None if digits is None else _digits(digits, spec)
    return _check_kind(match.group("type"), index, spec)


def _as_index(value: object) -> int | None:
    """An int, or an integer-like object (numpy's integers) as ``operator.index`` reads it."""
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def _digits(digits: str, spec: object) -> int:
    """A run of ASCII digits as an int, without converting thousands of them (int() refuses)."""
    negative = digits.startswith("-")
    body = digits.lstrip("-").lstrip("0") or "0"
    if len(body) > len(str(MAX_INDEX)):
        if negative:
            _negative(spec)
        _too_large(f"{body[:3]}... ({len(body)} digits)", spec)
    return -int(body) if negative else int(body)


def _negative(spec: object) -> NoReturn:
    raise ConfigError(
        f"device spec {shown(spec)} has a negative index; use 0 or more "
        "(for the CPU, use 'cpu': -1 means the CPU only in some tools' own flags)"
    )


def _too_large(index: object, spec: object) -> NoReturn:
    raise ConfigError(
        f"device index {index} in spec {shown(spec)} is past {MAX_INDEX}, the largest index "
        "torch can hold (torch.device('cuda', 128) becomes cuda:-128); use an index of a "
        "visible device, e.g. 0"
    )


def _check_index(index: int, spec: object) -> int:
    if index < 0:
        _negative(spec)
    if index > MAX_INDEX:
        _too_large(index if index.bit_length() <= 64 else shown(index), spec)
    return index


def _torch_knows(kind: str) -> bool:
    """Whether ``torch.device`` takes ``kind`` (``xla``, ``hpu``, a renamed privateuseone...)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.device("mkldnn") warns that it is deprecated
        try:
            torch.device(kind)
        except (RuntimeError, ValueError, TypeError):
            return False
    return True


def _check_kind(kind: str, index: int | None, spec: object) -> tuple[str, int | None]:
    if kind not in ("auto", "cuda", *PASS_THROUGH, *OTHER_ACCELERATORS):
        what = f"device type {shown(kind)}"
        if not (isinstance(spec, str) and spec.strip().lower() == kind):
            what += f" in spec {shown(spec)}"
        if _torch_knows(kind):
            raise ConfigError(
                f"{what} is one torch knows, but resolve_device cannot check it: it resolves "
                "'auto', 'cpu', 'meta', 'cuda', 'mps' and 'xpu'; pass "
                f"torch.device({kind!r}) to code that takes one directly"
            )
        hint = ""
        if kind in ("gpu", "nvidia", "rocm", "hip"):  # torch names NVIDIA and AMD GPUs "cuda"
            hint = f" (torch calls NVIDIA and AMD GPUs 'cuda': did you mean 'cuda{'' if index is None else f':{index}'}'?)"
        raise ConfigError(
            f"{what} is not a device type torch knows{hint}; "
            "use 'auto', 'cpu', 'meta', 'cuda', 'cuda:N', 'mps' or 'xpu'"
        )
    if kind == "auto" and index is not None:
        raise ConfigError(
            f"device spec {shown(spec)}: 'auto' takes no index; use 'auto' or 'cuda:N'"
        )
    if index is not None:
        _check_index(index, spec)
    return kind, index
