"""The memory check before a model is loaded: would its replicas fit next to what is there?

:func:`estimate` is what one replica of a model needs on its device: its parameter and buffer
bytes plus the activation peak of one forward at ``max_batch_size`` rows, measured by running
the model on ``meta`` (no memory, no kernels) under the planner's recorder
(:func:`torchplace.planner.trace.trace_forward`). A model that cannot run on ``meta`` (an
exported program, a forward that reads tensor values) is counted with its inputs and outputs
instead of its peak.

:class:`MemoryCheck` holds what the models already loaded reserve on each device and refuses a
load that would not fit with :class:`~torchplace.errors.InsufficientMemoryError`, whose message
gives the numbers (needed, free, budget, model). ``free`` comes from an injectable probe
(default: ``torch.cuda.mem_get_info`` for CUDA devices; nothing for the CPU), ``budget`` from
``--memory-budget`` (bytes per device, what the CPU is checked against): with a budget, what the
loaded models reserve is subtracted from it; with a probe, the device's own free bytes already
count them. With neither, there is nothing to check against and the load goes ahead.

:func:`trim_host_heap` hands the host memory a retired version freed back to the system.
"""

from __future__ import annotations

import copy
import ctypes
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from torchplace.errors import InsufficientMemoryError
from torchplace.serve.datatypes import host_torch_dtype

if TYPE_CHECKING:
    import torch

    from torchplace.serve.loader import LoadedModel

__all__ = ["MemoryCheck", "cuda_free_bytes", "estimate", "trim_host_heap"]

#: free bytes of a device, or None when unknown (the CPU)
FreeProbe = Callable[[str], "int | None"]


def trim_host_heap() -> bool:
    """Give the free pages of the C heap back to the system (glibc's ``malloc_trim``): glibc
    keeps what each thread's arena freed for reuse, so the memory a version's replicas and
    their worker threads let go of stayed in the server's resident size after an unload (one
    of 16 replicas of a wide model: 390 MiB). True when trimmed; False where the C library has
    no such call (not Linux, or not glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True


def cuda_free_bytes(label: str) -> int | None:
    """Free bytes of a CUDA device from ``torch.cuda.mem_get_info``; None for other devices."""
    if not label.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    free, _total = torch.cuda.mem_get_info(label)
    return int(free)


def _activation_peak(loaded: LoadedModel, rows: int, dtype: str | None = None) -> int:
    """The activation peak of one forward of ``rows`` rows, traced on ``meta`` (in the serving
    ``dtype`` when one is given, as the replicas run it: floating weights and inputs cast)."""
    import torch

    from torchplace.planner.trace import trace_forward

    cast = None if dtype is None else getattr(torch, dtype)
    batch = []
    for spec in loaded.inputs:
        host = host_torch_dtype(spec.datatype)
        shape = (rows, *loaded.dry_row(spec))
        want = cast if cast is not None and host.is_floating_point else host
        batch.append(torch.zeros(shape, dtype=want, device="meta"))
    try:
        module = _on_meta(loaded.module)
        if cast is not None:
            module = module.to(cast)
        return trace_forward(module, batch, (), batch=rows, seq=None).peak()
    except Exception:  # cannot run on meta: count the batch's inputs and outputs
        from torchplace.serve.loader import batch_bytes

        # at the row shapes the replicas' dry runs give the inputs (dry_run_shapes, a
        # model_warmup's dims), not each variable dimension 1: those runs allocate them
        return batch_bytes(rows, loaded.inputs, loaded.outputs, loaded.dry_rows)


def _on_meta(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` whose parameters and buffers are on ``meta``: the weights are not
    copied on the host (a deepcopy of a large model would double its host memory)."""
    import torch

    memo: dict[int, object] = {}
    for param in module.parameters():
        memo[id(param)] = torch.nn.Parameter(
            torch.empty_like(param, device="meta"), requires_grad=param.requires_grad
        )
    for buffer in module.buffers():
        memo[id(buffer)] = torch.empty_like(buffer, device="meta")
    copied: torch.nn.Module = copy.deepcopy(module, memo)
    return copied


def estimate(loaded: LoadedModel, max_batch_size: int, dtype: str | None = None) -> int:
    """Bytes one replica needs: weights (parameters + buffers) + the activation peak; with a
    serving ``dtype`` (``--dtype``), both as the replica holds them, floating tensors cast."""
    weights = loaded.weight_bytes if dtype is None else _cast_bytes(loaded.module, dtype)
    return weights + _activation_peak(loaded, max_batch_size, dtype)


def _cast_bytes(module: torch.nn.Module, dtype: str) -> int:
    """Bytes of the module's parameters and buffers after ``module.to(dtype)``, which casts the
    floating (and complex) ones only."""
    import torch

    size = getattr(torch, dtype).itemsize
    total = 0
    for tensor in (*module.parameters(), *module.buffers()):
        cast = tensor.is_floating_point() or tensor.is_complex()
        total += tensor.numel() * (size if cast else tensor.element_size())
    return total


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB ({n} bytes)"


class MemoryCheck:
    """What the loaded models reserve per device, and the check of a new load against it."""

    def __init__(self, *, budget: int | None = None, probe: FreeProbe | None = None) -> None:
        if budget is not None and budget < 0:
            raise ValueError(f"memory budget {budget} must be >= 0 bytes")
        self.budget = budget
        self.probe: FreeProbe = probe if probe is not None else cuda_free_bytes
        self.reserved: dict[str, dict[str, int]] = {}  # owner -> device -> bytes
        #: owners reserved whose replicas are not on their devices yet: the device's free
        #: bytes do not show them, so their reservations are taken off those
        self.placing: set[str] = set()

    def check(self, model: str, needs: Mapping[str, int], *, owner: str) -> None:
        """Refuse (InsufficientMemoryError) when ``needs`` (device -> bytes) does not fit."""
        for device, needed in needs.items():
            free = self.probe(device)
            if free is not None:
                placing = (self.reserved[o] for o in self.placing if o != owner)
                free = max(free - sum(r.get(device, 0) for r in placing), 0)
            used = sum(r.get(device, 0) for o, r in self.reserved.items() if o != owner)
            left = None if self.budget is None else self.budget - used
            available = min((v for v in (free, left) if v is not None), default=None)
            if available is None or needed <= available:
                continue
            raise InsufficientMemoryError(
                f"model {model!r} needs {_mib(needed)} on {device} (weights + activation peak "
                f"at max_batch_size, times its replicas) but only {_mib(available)} is free "
                f"(device free: {'unknown' if free is None else _mib(free)}; budget: "
                f"{'none' if self.budget is None else _mib(self.budget)}; held by loaded "
                f"models: {_mib(used)}); unload a model, lower max_batch_size or replicas, "
                "or raise --memory-budget"
            )

    def reserve(self, owner: str, needs: Mapping[str, int], *, placing: bool = False) -> None:
        """Count ``needs`` as held by ``owner`` (a model version); ``placing``: its replicas
        are not on their devices yet (see :meth:`placed`). Reserve in the same step as the
        :meth:`check`, before anything awaits: a load checked meanwhile then counts it."""
        self.reserved[owner] = dict(needs)
        if placing:
            self.placing.add(owner)

    def placed(self, owner: str) -> None:
        """``owner``'s replicas are on their devices: their free bytes show them now."""
        self.placing.discard(owner)

    def release(self, owner: str) -> None:
        """``owner`` was unloaded (or its load failed): its bytes are free again."""
        self.reserved.pop(owner, None)
        self.placing.discard(owner)
