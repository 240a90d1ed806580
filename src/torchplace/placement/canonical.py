"""What "the same device" means: :func:`canonical_device` gives a device in the form tensors
report it, so two specs name the same device exactly when their canonical forms are equal.
"""

from __future__ import annotations

import torch

__all__ = ["DeviceLike", "canonical_device"]

DeviceLike = torch.device | str


def canonical_device(device: DeviceLike) -> torch.device:
    """A device in the form tensors report: ``cpu`` without index, accelerators with one.

    ``"cuda"`` becomes the current ``cuda:N``, so two specs name the same device exactly when
    their canonical forms are equal.
    """
    d = device if isinstance(device, torch.device) else torch.device(device)
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
