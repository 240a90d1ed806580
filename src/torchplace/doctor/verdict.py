"""The verdict: whether the requested device is usable, every cause once, and each fix once.

Only failures that concern the requested device count (a GPU that fails its arch check does not
make another usable); a device that did not resolve is judged by the checks of its type, so
``cuda:0`` that cannot be used also gets the driver's and the visibility's fixes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torchplace.doctor.checks import Check

if TYPE_CHECKING:
    import torch

__all__ = ["judge"]


def _scope(spec: str | None, device: str | None) -> str | None:
    """The device whose checks decide: the resolved one, else the spec read as resolve_device
    reads it (``"CUDA:00"`` and ``"0"`` are ``cuda:0``); None for "auto" that did not resolve."""
    from torchplace.devices.spec import parse_spec
    from torchplace.errors import ConfigError

    if device is not None:
        return device
    try:
        kind, index = parse_spec(spec)
    except ConfigError:
        return None
    if kind == "auto":
        return None
    return kind if index is None else f"{kind}:{index}"


def judge(
    checks: Sequence[Check], spec: str | None, chosen: torch.device | None, *, smoke: bool
) -> dict[str, Any]:
    """The ``verdict`` section of the report."""
    device = None if chosen is None else str(chosen)
    scope = _scope(spec, device)
    failures = [c for c in checks if c.status == "fail" and c.concerns(scope)]
    usable = chosen is not None and not failures
    if usable:
        summary = f"{device} is usable" + ("" if smoke else " (smoke tests skipped)")
    else:
        # every cause on the one line: the first failure, then the others
        causes = "; also: ".join(dict.fromkeys(c.detail for c in failures))
        summary = f"{device or scope or spec} is not usable" + (f": {causes}" if causes else "")
    return {
        "usable": usable,
        "status": "ok" if usable else "fail",
        "requested": spec,
        "device": device,
        "summary": summary,
        "fixes": list(dict.fromkeys(c.fix for c in failures if c.fix)),  # once each, in order
        "warnings": [c.detail for c in checks if c.status == "warn"],
    }
