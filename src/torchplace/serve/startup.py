"""Start-up of an engine: which devices, how many threads, and what the start-up record says.

:func:`resolve_devices` turns ``--device``/``--devices`` into full device names;
:func:`thread_count` decides torch's intra-op threads on CPU replicas; :func:`startup_error`
explains a failed start-up dry run as a configuration error naming the fix; and
:func:`startup_record` is the one JSON record logged when serving starts.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torchplace.errors import ConfigError, KernelError
from torchplace.serve.loader import weight_bytes

if TYPE_CHECKING:
    import torch

    from torchplace.serve.engine import Engine
    from torchplace.serve.replica import Replica

__all__ = [
    "device_memory",
    "full_device",
    "resolve_devices",
    "startup_error",
    "startup_record",
    "thread_count",
]


def resolve_devices(
    device: str = "auto", devices: Sequence[str] | None = None
) -> list[torch.device]:
    """The devices to place replicas on: ``devices`` (``"all"`` = every visible GPU) or ``device``."""
    import torch

    from torchplace.devices import resolve_device

    specs = list(devices) if devices else [device]
    resolved: list[torch.device] = []
    for spec in specs:
        if str(spec).strip().lower() == "all":
            if torch.cuda.is_available() and torch.cuda.device_count() > 0:
                found = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
            else:
                found = [resolve_device("auto")]
        else:
            found = [resolve_device(spec)]
        for dev in found:
            if dev not in resolved:
                resolved.append(dev)
    return resolved


def thread_count(engine: Engine) -> int | None:
    """The torch intra-op threads to set: ``torch_threads``, or on an all-CPU engine
    ``(cores - 1) // CPU replicas``; None leaves torch's own."""
    if engine.torch_threads is not None:
        return engine.torch_threads
    primaries = [r for r in engine.replicas if not r.fallback]
    if primaries and all(r.device.type == "cpu" for r in primaries):
        # keep one core for the event loop (HTTP parsing, batching), share the rest
        return max(1, ((os.cpu_count() or 1) - 1) // len(primaries))
    return None


def startup_error(engine: Engine, exc: KernelError, replica: Replica) -> ConfigError:
    """The start-up dry run (zeros of the declared shapes, before any request) failed in
    the forward pass: the declarations (or the serving dtype) do not fit the model, a
    configuration error."""
    declared = ", ".join(
        f"{spec.name}:{spec.datatype}:{','.join(str(dim) for dim in spec.shape)}"
        for spec in engine.loaded.inputs
    )
    if engine.dtype is not None:
        return ConfigError(
            f"the start-up dry run of model {engine.loaded.name!r} with --dtype {engine.dtype} "
            f"on {replica.label} failed: {exc}; the model (or an op it uses) may not support "
            f"{engine.dtype} on {replica.device.type}: serve it without --dtype (its own "
            "dtypes) or with another --dtype, or make its own tensors follow the inputs' "
            "dtype (x.new_*/torch.*_like rather than fixed-dtype temporaries); if it fails "
            f"without --dtype too, check the declared inputs {declared} (name:datatype:shape)"
        )
    bf16 = [spec.name for spec in engine.loaded.inputs if spec.datatype == "BF16"]
    if bf16:
        return ConfigError(
            f"the start-up dry run of model {engine.loaded.name!r} failed with the declared "
            f"inputs {declared} (name:datatype:shape) at --max-batch-size "
            f"{engine.max_batch_size}: {exc}; the BF16 inputs {bf16} reach the model as "
            "torch.bfloat16, so its weights must be bfloat16 too: serve it with --dtype "
            "bf16, or declare the inputs FP32; if that is not it, check the declared shapes"
        )
    return ConfigError(
        f"the start-up dry run of model {engine.loaded.name!r} failed with the declared "
        f"inputs {declared} (name:datatype:shape) at --max-batch-size {engine.max_batch_size}: "
        f"{exc}; declare the input shape the model takes with --input NAME:DTYPE:DIMS "
        "(-1 first, for the batch; its outputs with --output), or, for a .pt2, export it "
        "with a dynamic batch dimension whose max >= --max-batch-size "
        "(torch.export.Dim('batch', max=N) in dynamic_shapes)"
    )


def startup_record(engine: Engine, seconds: float, threads: int | None) -> dict[str, Any]:
    """The start-up log record: what was placed where, memory after warm-up, timings."""
    import torch

    visible = ["cpu"]
    if torch.cuda.is_available():
        visible += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    memory: dict[str, dict[str, int]] = {}
    for label in {r.label for r in engine.replicas}:
        found = device_memory(label)
        if found is not None:
            memory[label] = {"allocated_bytes": found[0], "reserved_bytes": found[1]}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss_bytes = rss if sys.platform == "darwin" else rss * 1024
    staging = sum(r.staging.nbytes for r in engine.replicas if r.staging is not None)
    return {
        "event": "torchplace.serve.start",
        "model": engine.name,
        "version": engine.version,
        "source": engine.loaded.source,
        "device": engine.default_label,
        "devices": engine.devices,
        "dtype": engine.dtype,
        "replicas": [
            {
                "name": r.name,
                "device": r.label,
                "fallback": r.fallback,
                "ready": r.is_ready(),
                "pinned_staging": bool(r.staging and r.staging.is_pinned()),
                "weight_dtypes": r.weight_dtypes(),
                "weight_bytes": weight_bytes(r.module) if r.module is not None else 0,
                "full_batch_ms": (
                    round(r.full_batch_s * 1000, 3) if r.full_batch_s is not None else None
                ),
                "inline": r.inline or (r.probation > 0 and not r.planned_full),
                "inline_full": r.full_inline or (r.probation > 0 and r.planned_full),
            }
            for r in engine.replicas
        ],
        "visible_devices": visible,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "weight_bytes": engine.loaded.weight_bytes,
        "max_batch_size": engine.max_batch_size,
        "max_delay_ms": engine.max_delay_ms,
        "max_queue": engine.max_queue,
        "staging_bytes": staging,
        "memory_after_warmup": memory,
        "host_max_rss_bytes": rss_bytes,
        "torch_threads": threads if threads is not None else torch.get_num_threads(),
        "torch_version": torch.__version__,
        "startup_seconds": round(seconds, 4),
    }


def full_device(device: torch.device) -> torch.device:
    """``cuda`` -> ``cuda:N`` (the current device): labels, placement checks and memory gauges
    all need the index."""
    index: int | None = device.index  # None for a bare "cuda" (torch's stubs say int)
    if index is not None or device.type in ("cpu", "meta"):
        return device
    from torchplace.devices import resolve_device

    return resolve_device(device)


def device_memory(label: str) -> tuple[int, int] | None:
    """(allocated, reserved) bytes of an accelerator; None for the CPU and friends."""
    if not label.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.memory_allocated(label), torch.cuda.memory_reserved(label)
