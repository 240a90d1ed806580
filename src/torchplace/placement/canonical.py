"""What "the same device" means: :func:`canonical_device` gives a device in the form tensors
report it, so two specs name the same device exactly when their canonical forms are equal.
"""

from __future__ import annotations

import torch

from torchplace.errors import ConfigError

__all__ = ["DeviceLike", "canonical_device"]

DeviceLike = torch.device | str


def canonical_device(device: DeviceLike) -> torch.device:
    """A device in the form tensors report: ``cpu`` without index, accelerators with one.

    ``"cuda"`` becomes the current ``cuda:N``, so two specs name the same device exactly when
    their canonical forms are equal. A value torch does not read as a device raises
    :class:`~torchplace.errors.ConfigError`.
    """
    try:
        d = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError) as exc:
        reason = str(exc).splitlines()[0]
        raise ConfigError(
            f"device {device!r} is not a device torch can use here ({reason}); pass a "
            "torch.device or a string such as 'cpu', 'cuda', 'cuda:0' or 'meta' "
            "(torchplace.resolve_device also takes 'auto' and loose spellings such as ' CUDA')"
        ) from None
    if d.type in ("cpu", "meta"):
        return torch.device(d.type)
    given: int | None = d.index  # typed int in torch's stubs, but None for "cuda"
    if given is None:
        backend = getattr(torch, d.type, None)
        index = 0
        try:
            if backend is not None and backend.is_available():
                index = int(backend.current_device())
        except (AttributeError, RuntimeError):
            index = 0
        return torch.device(d.type, index)
    return d
