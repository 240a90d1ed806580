"""``torchplace plan``: where a model's pieces, batches, activations and outputs live on a set of
devices, what crosses between them, and whether it fits, worked out on ``meta`` before loading.

Modules, one concept each:

- ``inputs``: the model to plan (embedded, ``module:callable``, exported, or a shape) and its inputs;
- ``shapes``: the GPT-2-small-like and Llama-7B-like transformers, built in code on ``meta``;
- ``decoder``: their module classes (imports torch, so ``shapes`` imports it on first build);
- ``hardware``: the device set, assumed from a table of measured figures or the real inventory;
- ``units``: the placeable modules, their sizes and tied groups (accelerate's helpers);
- ``trace``: one forward on ``meta``: allocations, readers, FLOPs (``torch.utils.flop_counter``);
- ``fused``: operators whose ``meta`` kernels allocate other than the real ones, run as those do;
- ``strict``: the checks the real kernels make that ``meta``'s skip (operands of one dtype);
- ``values``: the values of tensors made from the integer and boolean inputs alone, for code that reads them;
- ``scaling``: traces at every batch size from two;
- ``strategies``: replicate, pipeline (memory, compute, fill), accelerate's map, a map file;
- ``crossings``: the copies a placement causes, cached or re-copied by dispatch hooks;
- ``budget``: memory per device, reserves, headroom, largest batch;
- ``compute``: FLOPs, roofline time and pipeline idle share per device;
- ``checks``: the warnings (tied split, return trip, spill, too big, does not fit);
- ``exercise``: the founding article's exercise-8 table;
- ``runner``: one forward of a placement for real, logical devices mapped onto real ones;
- ``verify``: run it and compare: memory (tracker or ``max_memory_allocated``), edges, copies (guard);
- ``render``: JSON result, rich tables, device-map export, PNG;
- ``api``: :func:`plan` and :class:`Plan`; ``cli``: the command.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Plan", "plan"]

_EXPORTS = {"Plan": "torchplace.planner.api", "plan": "torchplace.planner.api"}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'torchplace.planner' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
