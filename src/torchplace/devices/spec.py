"""Device spec parsing: ``"auto"``, ``"cuda"``, ``1``, ``"cuda:1"``, ``torch.device(...)`` into a
(type, index) pair, or a :class:`~torchplace.errors.ConfigError` that lists what is understood.
"""

from __future__ import annotations

import re

import torch

from torchplace.errors import ConfigError

__all__ = ["OTHER_ACCELERATORS", "PASS_THROUGH", "parse_spec"]


#: Accelerators other than CUDA that a spec may name.
OTHER_ACCELERATORS = ("mps", "xpu")
#: Devices returned as they are, with no hardware to ask.
PASS_THROUGH = ("cpu", "meta")
_SPEC_RE = re.compile(r"^(?P<type>[a-z_]+)(?::(?P<index>-?[0-9]+))?$")


def parse_spec(spec: str | torch.device | int | None) -> tuple[str, int | None]:
    """Split a spec into (type, index); type may be ``"auto"``."""
    if spec is None:
        return "auto", None
    if isinstance(spec, bool):
        raise ConfigError(f"device spec {spec!r} is a bool; pass 'auto', 'cpu', 'cuda:0' or an int")
    if isinstance(spec, int):
        if spec < 0:
            raise ConfigError(f"device index {spec} is negative; use 0 or more (e.g. 0 = 'cuda:0')")
        return "cuda", spec
    if isinstance(spec, torch.device):
        return _check_kind(spec.type, spec.index, spec)
    if not isinstance(spec, str):
        raise ConfigError(
            f"device spec {spec!r} has type {type(spec).__name__}; "
            "pass a str ('auto', 'cpu', 'cuda', 'cuda:1'), an int or a torch.device"
        )
    text = spec.strip().lower()
    if text.isascii() and text.isdigit():  # not "٣": str.isdigit takes any script's digits
        return "cuda", int(text)
    match = _SPEC_RE.match(text)
    if match is None:
        raise ConfigError(
            f"device spec {spec!r} is not understood; use 'auto', 'cpu', 'meta', 'cuda', "
            "'cuda:N', 'mps', 'xpu:N' or an int N (meaning 'cuda:N')"
        )
    index = None if match.group("index") is None else int(match.group("index"))
    return _check_kind(match.group("type"), index, spec)


def _check_kind(kind: str, index: int | None, spec: object) -> tuple[str, int | None]:
    if kind not in ("auto", "cuda", *PASS_THROUGH, *OTHER_ACCELERATORS):
        raise ConfigError(
            f"device type {kind!r} in spec {spec!r} is not supported; "
            "use 'auto', 'cpu', 'meta', 'cuda', 'cuda:N', 'mps' or 'xpu'"
        )
    if kind == "auto" and index is not None:
        raise ConfigError(f"device spec {spec!r}: 'auto' takes no index; use 'auto' or 'cuda:N'")
    if index is not None and index < 0:
        raise ConfigError(f"device spec {spec!r} has a negative index; use 0 or more")
    return kind, index
