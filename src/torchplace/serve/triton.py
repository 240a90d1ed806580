"""Triton's model configuration and statistics extensions, built once for REST and gRPC.

:func:`model_config` is the model's configuration as Triton's JSON spells it (the
``ModelConfig`` message of ``model_config.proto`` with its field names): ``max_batch_size``,
``input``/``output`` with ``data_type`` (``TYPE_FP32``...) and ``dims`` without the batch
dimension (and a ``reshape`` and an output's ``label_filename`` as the configuration gave them), ``dynamic_batching`` from the batcher's settings and ``instance_group`` from the
replicas (one group per device: ``KIND_GPU`` with its index, ``KIND_CPU``, ``KIND_MODEL`` for
other accelerators; the CPU fallback a ``passive`` ``KIND_CPU`` group, as it takes requests only
when the others fail). ``GET /v2/models/{m}/config`` answers it as JSON; the gRPC
``ModelConfig`` RPC parses the same document into the message.

:func:`model_statistics` is the ``ModelStatisticsResponse`` document (``model_stats``: one
entry per model version) from each engine's
:class:`~torchplace.serve.statistics.InferStatistics`.

Both read the engine duck-typed (an engine without batcher settings, replicas or statistics,
such as a test's stand-in, gets Triton's defaults and zeros).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePath
from typing import Any

from torchplace.models import TensorSpec

__all__ = ["EXTENSIONS", "NOT_SERVED", "extensions", "model_config", "model_statistics"]

#: the protocol extensions ``/v2`` and gRPC ``ServerMetadata`` list
EXTENSIONS = (
    "binary_tensor_data",
    "metrics",
    "openapi",
    "model_configuration",
    "statistics",
    "model_repository",
    "classification",
    "schedule_policy",
    "logging",
    "trace",
)


#: Triton's extensions this server does not serve (nor list in the server metadata's
#: ``extensions``), and what a client that calls one is told (the LLM ``generate``
#: routes): REST
#: answers 404 (``no route ...``, then this), gRPC ``UNIMPLEMENTED``
NOT_SERVED = {
    "generate": (
        "Triton's generate extension is not supported by this server; POST the model's "
        "inputs to /v2/models/{name}/infer"
    ),
}


def extensions(config: Any) -> list[str]:
    """The extensions a server with this :class:`~torchplace.serve.config.ServeConfig` lists:
    :data:`EXTENSIONS`, and ``system_shared_memory`` when clients may register regions."""
    return [*EXTENSIONS, *(["system_shared_memory"] if config.allow_client_shm else [])]


def _tensor(spec: TensorSpec) -> dict[str, Any]:
    """A declaration as Triton's ``ModelInput``/``ModelOutput``: ``dims`` (what clients send
    and receive), the ``reshape`` and ``label_filename`` (the file's name) where it has them."""
    doc: dict[str, Any] = {
        "name": spec.name,
        "data_type": "TYPE_" + spec.datatype,
        "dims": list(spec.shape[1:]),
    }
    if spec.reshape is not None:
        doc["reshape"] = {"shape": list(spec.reshape)}
    if spec.label_filename is not None:
        doc["label_filename"] = PurePath(spec.label_filename).name
    return doc


def _instance_groups(engine: Any) -> list[dict[str, Any]]:
    """One instance group per device (and one for the CPU fallback), counts from the replicas."""
    groups: dict[tuple[str, bool], dict[str, Any]] = {}
    for replica in getattr(engine, "replicas", ()):
        device = replica.device
        key = (str(device), bool(replica.fallback))
        group = groups.get(key)
        if group is None:
            kind = {"cuda": "KIND_GPU", "cpu": "KIND_CPU"}.get(device.type, "KIND_MODEL")
            suffix = "fallback" if replica.fallback else str(device).replace(":", "_")
            group = groups[key] = {
                "name": f"{engine.name}_{suffix}",
                "kind": kind,
                "count": 0,
                "gpus": [device.index or 0] if device.type == "cuda" else [],
            }
            if replica.fallback:  # takes requests only when the others fail, not as scheduled
                group["passive"] = True
        group["count"] += 1
    return list(groups.values())


def _dynamic_batching(engine: Any) -> dict[str, Any]:
    delay_ms = float(getattr(engine, "max_delay_ms", 0.0))
    policy = getattr(engine, "policy", None)
    doc: dict[str, Any] = {
        "preferred_batch_size": [engine.max_batch_size],
        "max_queue_delay_microseconds": round(delay_ms * 1000),
        "preserve_ordering": False,
    }
    if policy is not None:
        levels = int(policy.priority_levels)
        timeout_s = policy.default_timeout_s or 0.0
        queue_policy = {
            "timeout_action": "REJECT",
            "default_timeout_microseconds": round(timeout_s * 1e6),
            "allow_timeout_override": True,
            "max_queue_size": policy.max_queue,
        }
        doc["default_queue_policy"] = queue_policy
        if levels > 1:
            doc["priority_levels"] = levels
            doc["default_priority_level"] = policy.default_priority or levels
            doc["priority_queue_policy"] = {
                str(level): {**queue_policy, "max_queue_size": limit}
                for level, limit in enumerate(policy.limits, start=1)
            }
    return doc


def model_config(engine: Any) -> dict[str, Any]:
    """The engine's model as Triton's ``ModelConfig`` JSON (see the module docstring)."""
    doc: dict[str, Any] = {
        "name": engine.name,
        "platform": engine.platform,
        "backend": "pytorch",
        "version_policy": {"specific": {"versions": [_version_number(engine.version)]}},
        "max_batch_size": engine.max_batch_size,
        "input": [_tensor(s) for s in engine.inputs],
        "output": [_tensor(s) for s in engine.outputs],
        "dynamic_batching": _dynamic_batching(engine),
        "instance_group": _instance_groups(engine),
    }
    if not doc["instance_group"]:
        del doc["instance_group"]
    if getattr(engine, "unbatched", False):  # Triton's no batching: dims are the whole shape
        doc["max_batch_size"] = 0
        del doc["dynamic_batching"]
    if getattr(engine, "dtype", None) is not None:
        # Triton's free-form model parameters: where the serving precision is told
        doc["parameters"] = {"dtype": {"string_value": engine.dtype}}
    return doc


def _version_number(version: str) -> int:
    """Triton's version policy takes numbers; a version that is not one is listed as 0."""
    return int(version) if version.isascii() and version.isdigit() and len(version) < 19 else 0


def model_statistics(engines: Iterable[Any]) -> dict[str, Any]:
    """The ``ModelStatisticsResponse`` document of these engines (one entry per version)."""
    from torchplace.serve.statistics import InferStatistics

    entries = []
    for engine in engines:
        stats = getattr(engine, "statistics", None)
        if not isinstance(stats, InferStatistics):
            stats = InferStatistics()  # an engine that keeps none: zeros
        entries.append(stats.snapshot(engine.name, engine.version))
    return {"model_stats": entries}
