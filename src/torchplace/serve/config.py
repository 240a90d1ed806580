"""Configuration of ``torchplace serve``: one frozen, validated dataclass.

A :class:`ServeConfig` can be built in code (keyword arguments), from a mapping, or from a
config file: TOML (``.toml``) or JSON (``.json``). Keys are the field names (``max_batch_size``
or ``max-batch-size``), optionally under a ``[serve]`` table. On the command line, flags
override the file.

Tensor declarations (``inputs``/``outputs``) use ``NAME:DATATYPE:DIMS`` strings such as
``input:FP32:-1,8`` (``-1`` is the batch dimension) or ``{"name", "datatype", "shape"}`` tables.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchplace.errors import ConfigError
from torchplace.models import TensorSpec
from torchplace.serve.datatypes import HOST_DTYPES, serving_dtype
from torchplace.serve.tracing import TRACE_FORMATS

__all__ = [
    "CONTROL_MODES",
    "DATATYPES",
    "LOG_LEVELS",
    "MAX_PRIORITY_LEVELS",
    "ServeConfig",
    "parse_tensor_spec",
]

#: Open Inference Protocol datatypes a served model may declare: every torch tensor type (BF16
#: is held as float32 on the host and is torch.bfloat16 on the device); BYTES is not a torch type.
DATATYPES: frozenset[str] = frozenset(HOST_DTYPES)
LOG_LEVELS: tuple[str, ...] = ("debug", "info", "warning", "error", "critical")
CONTROL_MODES: tuple[str, ...] = ("none", "explicit", "poll")
MIB = 1024 * 1024


#: the most elements one row of a declared tensor may hold (8 GiB of float32): a declaration
#: past it is a typo, and would fail (or exhaust memory) only when its first batch is staged
MAX_ROW_ELEMENTS = 2**31


def _dry_run_shapes(value: Any, source: str) -> dict[str, tuple[int, ...]]:
    """``{name: [dims]}`` (a file's table) or ``["NAME:DIMS", ...]`` (the flag, repeated) as
    row shapes by input name; each dimension a size of at least 1."""
    fix = "give NAME:DIMS such as image:3,224,224 (a table of name = [dims] in a file)"
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list | tuple):
        pairs: list[tuple[Any, Any]] = []
        for item in value:
            name, sep, dims = str(item).partition(":")
            if not sep or not name or not dims:
                raise ConfigError(
                    f"{source}: dry_run_shapes entry {item!r:.100} is not NAME:DIMS; {fix}"
                )
            pairs.append((name, dims.split(",")))
        value = dict(pairs)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: dry_run_shapes={value!r:.100} is not understood; {fix}")
    shapes: dict[str, tuple[int, ...]] = {}
    for name, dims in value.items():
        try:
            shape = tuple(int(str(d).strip()) for d in dims)
        except (TypeError, ValueError):
            shape = ()
        if not shape or any(d < 1 for d in shape) or isinstance(dims, str | bytes):
            raise ConfigError(
                f"{source}: dry_run_shapes of {name!r}: {dims!r:.100} is not a row shape of "
                f"sizes >= 1; {fix}"
            )
        if math.prod(shape) > MAX_ROW_ELEMENTS:  # each dry run allocates max_batch_size rows
            raise ConfigError(
                f"{source}: dry_run_shapes of {name!r}: {list(shape)!r:.100} makes a row of "
                f"more than {MAX_ROW_ELEMENTS:,} elements (a declared row's limit); give the "
                "row shape of a request the model takes"
            )
        shapes[str(name)] = shape
    return shapes


def parse_tensor_spec(text: str) -> TensorSpec:
    """Parse ``NAME:DATATYPE:DIMS`` (e.g. ``input:FP32:-1,8``) into a :class:`TensorSpec`.
    A later ``-1`` is a variable dimension (the planner's sequence length)."""
    parts = text.strip().split(":")
    if len(parts) != 3 or not parts[0]:
        raise ConfigError(
            f"tensor declaration {text!r} is not NAME:DATATYPE:DIMS; write e.g. 'input:FP32:-1,8'"
        )
    name, datatype, dims = parts
    try:
        shape = tuple(int(d) for d in dims.split(",") if d.strip() != "")
    except ValueError:
        raise ConfigError(
            f"tensor declaration {text!r}: dims {dims!r} must be comma-separated integers "
            "(-1 for the batch dimension), e.g. '-1,8'"
        ) from None
    spec = TensorSpec(name, datatype.upper(), shape)
    return _checked_spec(spec, where="tensor declaration")


def _checked_spec(spec: TensorSpec, *, where: str) -> TensorSpec:
    """``spec`` checked: -1 first (the batch); a later -1 is a variable dimension (Triton's
    ``dims: [-1]``), whose rows the engine stages per batch at the size each request sends."""
    if not spec.name:  # Triton refuses it too ("must specify 'name'")
        raise ConfigError(
            f"{where} {spec.name!r}: a tensor declaration must specify a name; give the "
            "name requests send the tensor under"
        )
    if spec.datatype not in DATATYPES:
        raise ConfigError(
            f"{where} {spec.name!r}: datatype {spec.datatype!r} is not servable; "
            f"choose one of {', '.join(sorted(DATATYPES))}"
        )
    if not spec.shape or spec.shape[0] != -1:
        raise ConfigError(
            f"{where} {spec.name!r}: shape {list(spec.shape)} must start with -1, the batch "
            "dimension, e.g. [-1, 8]"
        )
    if any(d < -1 for d in spec.shape):
        raise ConfigError(
            f"{where} {spec.name!r}: shape {list(spec.shape)} has a dimension below -1; the "
            "dimensions after the first (batch) one are sizes >= 0, or -1 for a variable one"
        )
    if math.prod(d for d in spec.shape[1:] if d > 0) > MAX_ROW_ELEMENTS:
        raise ConfigError(
            f"{where} {spec.name!r}: shape {list(spec.shape)} makes a row of more than "
            f"{MAX_ROW_ELEMENTS:,} elements; check the dimensions"
        )
    return spec


def _int_list(value: object) -> bool:
    return isinstance(value, list | tuple) and all(
        isinstance(d, int) and not isinstance(d, bool) for d in value
    )


def _to_spec(value: Any, field_name: str) -> TensorSpec:
    if isinstance(value, TensorSpec):
        return _checked_spec(value, where=field_name)
    if isinstance(value, str):
        return parse_tensor_spec(value)
    if isinstance(value, Mapping):
        try:
            name, datatype, shape = value["name"], value["datatype"], value["shape"]
        except KeyError as exc:
            raise ConfigError(
                f"{field_name}: entry {dict(value)!r} lacks {exc.args[0]!r}; give name, "
                "datatype and shape"
            ) from None
        if not _int_list(shape):
            raise ConfigError(f"{field_name} {name!r}: shape {shape!r} must be a list of ints")
        reshape = value.get("reshape")
        if reshape is not None and not _int_list(reshape):
            raise ConfigError(
                f"{field_name} {name!r}: reshape {reshape!r} must be a list of ints (the "
                "model's shape of one row, the batch dimension left out)"
            )
        label = value.get("label_filename")
        if label is not None and not isinstance(label, str):
            raise ConfigError(
                f"{field_name} {name!r}: label_filename {label!r} must be a file's path"
            )
        spec = TensorSpec(
            str(name),
            str(datatype).upper(),
            tuple(shape),
            reshape=None if reshape is None else tuple(reshape),
            label_filename=label,
        )
        return _checked_spec(spec, where=field_name)
    raise ConfigError(
        f"{field_name}: {value!r} is not a tensor declaration; use 'NAME:DATATYPE:DIMS' or a "
        "table with name, datatype and shape"
    )


#: the fields that hold a path (strings from flags and files become :class:`~pathlib.Path`)
#: upper bounds: past them a setting is a mistake (or a client's load asking for the
#: impossible: a batch of millions of rows, a delay of hours, thousands of worker threads)
#: the most torch threads: far more than any machine's cores, far below the counts at which
#: torch's thread pool crashes the process (100000 segfaults at the first op)
_MOST_THREADS = 1024
_MOST_SECONDS = 1e7  # the longest duration setting
#: the most priority levels a queue may have (each is a queue of its own)
MAX_PRIORITY_LEVELS = 1024
#: the longest queue: what Triton's ModelQueuePolicy.max_queue_size (uint32) holds, as a
#: model's configuration document states the queue (its gRPC ModelConfig failed past it)
MAX_QUEUE = 2**32 - 1
_MOST: dict[str, int | float] = {
    "max_batch_size": 1 << 20,
    "max_queue": MAX_QUEUE,
    "replicas_per_device": 1024,
    "max_delay_ms": 3_600_000.0,
    "priority_levels": MAX_PRIORITY_LEVELS,
}
_MOST_COUNT = 2**63 - 1  # any other count: what a 64-bit field of a Triton document holds
_PATHS = ("weights", "exported", "torchscript", "labels", "auth_token_file", "trace_file",
          "model_repository")  # fmt: skip


#: why max_batch_size 0 (Triton's "no batching") is refused here, and what to do instead
_NO_BATCHING = (
    "0 is Triton's 'no batching', served as unbatched: give --unbatched, unbatched = true in "
    "a config.toml's [batching] table, or max_batch_size: 0 in a Triton config.pbtxt (each "
    "request then goes to the model as sent, one per call). Here, "
    "every model is batched along the first dimension of its inputs, a request's rows split "
    "into batches of at most max_batch_size"
)


def _fail(name: str, value: object, need: str) -> None:
    raise ConfigError(f"serve config: {name}={value!r} is invalid; {need}")


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """Everything ``torchplace serve`` needs; every field is validated on construction."""

    model: str = "seed-mlp"
    #: the name the model is served under; None = derived from ``model`` (see the loader)
    name: str | None = None
    model_version: str = "1"
    weights: Path | None = None
    #: class labels (one per line) for the classification extension, for every output
    labels: Path | None = None
    exported: Path | None = None
    #: a TorchScript archive (``torch.jit.save``, Triton's PyTorch backend's ``model.pt``)
    torchscript: Path | None = None
    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    device: str = "auto"
    devices: tuple[str, ...] | None = None
    #: cast the model's floating weights to this dtype on each device; None = its own dtypes
    dtype: str | None = None
    replicas_per_device: int = 1
    max_batch_size: int = 32
    #: Triton's ``max_batch_size: 0``: each request's tensors go to the model as sent, one
    #: request per call (declarations as Triton's ``dims``); batching settings are not used
    unbatched: bool = False
    #: the row shape the start-up dry runs give an input, by name, where it has variable
    #: dimensions (Triton's ``model_warmup``); None or an input left out: each variable one is 1
    dry_run_shapes: Mapping[str, tuple[int, ...]] | None = None
    max_delay_ms: float = 2.0
    max_queue: int = 1024
    max_request_rows: int = 4096
    priority_levels: int = 1
    #: the level of a request that names none (1 = served first); None = the lowest
    default_priority: int | None = None
    #: a queue limit per priority level, highest first; None = max_queue each
    priority_queue_limits: tuple[int, ...] | None = None
    #: a request's deadline when it gives none (0 = none)
    default_timeout_ms: float = 0.0
    #: refuse (503) a request when the queued work ahead of it takes longer (0 = never)
    max_queue_wait_ms: float = 500.0
    host: str = "127.0.0.1"
    port: int = 8000
    #: the gRPC port; None = 8001 with the grpc extra installed (any free port when ``port``
    #: is 0), else off; 0 = off
    grpc_port: int | None = None
    max_body_bytes: int = 64 * MIB
    request_timeout_s: float = 30.0
    keepalive_timeout_s: float = 60.0
    drain_timeout_s: float = 30.0
    drain_grace_s: float = 3.0
    fallback: str | None = None
    failure_threshold: int = 3
    torch_threads: int | None = None
    gil_switch_interval_ms: float = 0.2
    #: a sole CPU replica whose full batch takes at most this runs batches on the event loop
    inline_batch_ms: float = 1.0
    #: one dearer, up to this, runs a full batch no other request waits behind on the loop
    #: (the longest the loop is held: health probes and scrapes wait that long at most)
    inline_full_batch_ms: float = 50.0
    allow_nan: bool = False
    #: let clients register system shared-memory regions (Triton's extension)
    allow_client_shm: bool = False
    metrics: bool = True
    auth_token_file: Path | None = None
    trace_file: Path | None = None
    #: the trace file's format: chrome (Chrome/Perfetto, a file per model version) or triton
    #: (Triton's JSON trace, the server's one file, as trace_summary.py reads it)
    trace_format: str = "chrome"
    log_level: str = "info"
    #: more models served next to ``model``, each under its own name (``--model`` repeated)
    models: tuple[str, ...] = ()
    #: a model repository: one directory per model (see :mod:`torchplace.serve.repository`)
    model_repository: Path | None = None
    #: Triton's model control modes: none, explicit (load/unload calls), poll (watch the dir)
    model_control_mode: str = "none"
    #: repository models loaded at start in explicit mode ("*": all)
    load_models: tuple[str, ...] = ()
    repository_poll_secs: float = 15.0
    #: bytes each device may hold for the loaded models (None: a CUDA device's free memory)
    memory_budget: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check_model_and_devices(_fail)
        self._check_numbers(_fail)
        self._check_priorities(_fail)
        if self.fallback not in (None, "cpu"):
            _fail("fallback", self.fallback, "the only fallback is 'cpu' (or leave it unset)")
        for name in ("allow_nan", "allow_client_shm", "metrics", "unbatched"):
            if not isinstance(getattr(self, name), bool):
                _fail(name, getattr(self, name), "give true or false")
        if self.log_level not in LOG_LEVELS:
            _fail("log_level", self.log_level, f"choose one of {', '.join(LOG_LEVELS)}")
        if self.dry_run_shapes is not None:
            shapes = _dry_run_shapes(self.dry_run_shapes, "serve config")
            object.__setattr__(self, "dry_run_shapes", shapes)
        if self.trace_format not in TRACE_FORMATS:
            _fail("trace_format", self.trace_format, f"choose one of {', '.join(TRACE_FORMATS)}")
        self._check_repository(_fail)

    def _check_repository(self, fail: Any) -> None:
        if self.model_control_mode not in CONTROL_MODES:
            fail("model_control_mode", self.model_control_mode,
                 f"choose one of {', '.join(CONTROL_MODES)}")  # fmt: skip
        if self.model_control_mode != "none" and self.model_repository is None:
            fail("model_control_mode", self.model_control_mode,
                 "explicit and poll need a --model-repository DIR")  # fmt: skip
        poll = self.repository_poll_secs
        if not isinstance(poll, int | float) or isinstance(poll, bool) or not 0.1 <= poll <= 3600:
            fail("repository_poll_secs", poll, "give seconds in 0.1..3600")
        budget = self.memory_budget
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool)
                                   or budget < 0):  # fmt: skip
            fail("memory_budget", budget, "give bytes >= 0 (or e.g. '2GiB' in a file or flag)")
        for name in ("models", "load_models"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(isinstance(v, str) and v for v in value):
                fail(name, value, "give a tuple of non-empty names")
        if self.models and any(
            getattr(self, k) is not None
            for k in ("name", "weights", "exported", "torchscript", "labels", "inputs", "outputs")
        ):
            fail(
                "models",
                self.models,
                "with several --model, --name, --weights, --exported, --labels, "
                "--input and --output are ambiguous; give them per model in a --model-repository",
            )

    def _check_model_and_devices(self, fail: Any) -> None:
        for name in ("model", "model_version", "device", "host"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                fail(name, value, "give a non-empty string")
        if self.name is not None and (
            not isinstance(self.name, str)
            or not self.name.strip()
            or any(c in self.name for c in "/?#% ")
        ):
            fail("name", self.name, "give a non-empty name without '/', '?', '#', '%' or spaces")
        if "/" in self.model_version or "?" in self.model_version:
            fail("model_version", self.model_version, "a version cannot contain '/' or '?'")
        for name in _PATHS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                fail(name, value, "give a path")
        if self.weights is not None and self.exported is not None:
            fail("exported", str(self.exported), "give either weights or exported, not both")
        if self.torchscript is not None and (
            self.weights is not None or self.exported is not None
        ):  # fmt: skip
            fail("torchscript", str(self.torchscript),
                 "a TorchScript archive holds its weights: give no weights or exported with it")  # fmt: skip
        for name in ("inputs", "outputs"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, tuple) or not value:
                fail(name, value, "give a non-empty tuple of TensorSpec")
            specs = tuple(_to_spec(v, name) for v in value)
            if len({s.name for s in specs}) != len(specs):
                fail(name, [s.name for s in specs], "tensor names must be unique")
            object.__setattr__(self, name, specs)
        if self.devices is not None and (
            not isinstance(self.devices, tuple)
            or not self.devices
            or not all(isinstance(d, str) and d.strip() for d in self.devices)
        ):
            fail(
                "devices",
                self.devices,
                "give device names such as ('cuda:0', 'cuda:1') or ('all',)",
            )
        if self.device.strip().lower() == "meta":
            fail("device", self.device, "meta runs no kernels and holds no data; use cpu or cuda:N")
        if self.devices is not None and any(d.strip().lower() == "meta" for d in self.devices):
            fail(
                "devices", self.devices, "meta runs no kernels and holds no data; use cpu or cuda:N"
            )
        if self.dtype is not None:
            object.__setattr__(
                self, "dtype", serving_dtype(self.dtype, where="serve config: dtype")
            )

    def _check_numbers(self, fail: Any) -> None:
        for name, low in (
            ("replicas_per_device", 1),
            ("max_batch_size", 1),
            ("max_queue", 1),
            ("max_request_rows", 1),
            ("priority_levels", 1),
            ("max_body_bytes", 1024),
            ("failure_threshold", 1),
        ):
            value = getattr(self, name)
            if name == "max_batch_size" and value == 0 and not isinstance(value, bool):
                fail(name, value, _NO_BATCHING)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                fail(name, value, f"give an integer >= {low}")
            if value > _MOST_COUNT:
                fail(name, value, f"give an integer <= {_MOST_COUNT} (2**63 - 1)")
        for name in ("max_batch_size", "max_queue", "replicas_per_device", "priority_levels"):
            if getattr(self, name) > _MOST[name]:
                fail(name, getattr(self, name), f"give an integer <= {_MOST[name]}")
        if self.torch_threads is not None and (
            not isinstance(self.torch_threads, int)
            or isinstance(self.torch_threads, bool)
            or not 1 <= self.torch_threads <= _MOST_THREADS
        ):
            fail(
                "torch_threads",
                self.torch_threads,
                f"give an integer from 1 to {_MOST_THREADS} (or leave it unset)",
            )
        if (
            not isinstance(self.port, int)
            or isinstance(self.port, bool)
            or not 0 <= self.port <= 65535
        ):
            fail("port", self.port, "give a port in 0..65535 (0 picks a free one)")
        if self.grpc_port is not None and (
            not isinstance(self.grpc_port, int)
            or isinstance(self.grpc_port, bool)
            or not 0 <= self.grpc_port <= 65535
        ):
            fail("grpc_port", self.grpc_port, "give a port in 1..65535, or 0 to turn gRPC off")
        for name, positive in (
            ("max_delay_ms", False),
            ("request_timeout_s", True),
            ("keepalive_timeout_s", True),
            ("drain_timeout_s", False),
            ("drain_grace_s", False),
            ("default_timeout_ms", False),
            ("max_queue_wait_ms", False),
            ("gil_switch_interval_ms", True),
            ("inline_batch_ms", False),
            ("inline_full_batch_ms", False),
        ):
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            ok = ok and math.isfinite(value) and (value > 0 if positive else value >= 0)
            if not ok:
                fail(name, value, "give a finite number " + ("> 0" if positive else ">= 0"))
            unit = "ms" if name.endswith("_ms") else "s"
            most = _MOST_SECONDS * (1000 if unit == "ms" else 1)
            if value > most:  # past what timers wait for and Triton's microsecond fields hold
                fail(name, value, f"give at most {most:,.0f} {unit} (115 days)")
        if self.max_delay_ms > _MOST["max_delay_ms"]:
            fail("max_delay_ms", self.max_delay_ms, f"give at most {_MOST['max_delay_ms']:g}")

    def _check_priorities(self, fail: Any) -> None:
        levels = self.priority_levels
        default = self.default_priority
        if default is not None and (
            not isinstance(default, int) or isinstance(default, bool) or not 1 <= default <= levels
        ):
            fail("default_priority", default, f"give a level in 1..{levels} (1 is served first)")
        limits = self.priority_queue_limits
        if limits is not None and (
            not isinstance(limits, tuple)
            or len(limits) != levels
            or not all(
                isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_QUEUE
                for n in limits
            )
        ):
            fail(
                "priority_queue_limits",
                limits,
                f"give one queue limit in 1..{MAX_QUEUE} per priority level ({levels}), "
                "highest first",
            )

    # -- construction helpers ------------------------------------------------------------
    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names a config file or mapping may use (besides ``extra``)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "extra")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "config") -> ServeConfig:
        """Build from a mapping of field names (dashes allowed) to plain values."""
        return cls().with_overrides(data, source=source)

    @classmethod
    def from_file(cls, path: str | Path) -> ServeConfig:
        """Load a ``.toml`` or ``.json`` config file."""
        return cls.from_mapping(load_config_file(path), source=str(path))

    def with_overrides(self, data: Mapping[str, Any], *, source: str = "config") -> ServeConfig:
        """A copy with the given fields replaced (values converted like a config file's)."""
        known = set(self.field_names())
        changes: dict[str, Any] = {}
        for raw_key, value in data.items():
            key = str(raw_key).replace("-", "_")
            if key not in known:
                raise ConfigError(
                    f"{source}: unknown setting {raw_key!r}; known settings: {', '.join(sorted(known))}"
                )
            if key == "model" and isinstance(value, list | tuple):  # --model repeated
                if not value:
                    raise ConfigError(f"{source}: model=[] names no model")
                changes["models"] = tuple(str(v) for v in value[1:])
                value = value[0]
            changes[key] = _convert(key, value, source)
        return dataclasses.replace(self, **changes)


def _convert(key: str, value: Any, source: str) -> Any:
    if value is None:
        return None
    if key in _PATHS:
        if not isinstance(value, str | Path):
            raise ConfigError(f"{source}: {key}={value!r} must be a path string")
        return Path(value)
    if key in ("inputs", "outputs"):
        items = [value] if isinstance(value, str | Mapping) else value
        if not isinstance(items, list | tuple):
            raise ConfigError(f"{source}: {key}={value!r} must be a list of tensor declarations")
        return tuple(_to_spec(v, key) for v in items)
    if key == "dry_run_shapes":
        return _dry_run_shapes(value, source)
    if key == "priority_queue_limits":
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ConfigError(f"{source}: {key}={value!r} must be a list or '64,1024'")
        try:
            return tuple(int(str(n).strip()) for n in items)
        except ValueError:
            raise ConfigError(
                f"{source}: {key}={value!r} must be integers, e.g. '64,1024'"
            ) from None
    if key in ("models", "load_models"):
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ConfigError(f"{source}: {key}={value!r} must be a list of names")
        return tuple(str(v).strip() for v in items)
    if key == "memory_budget":
        from torchplace.planner.hardware import parse_size

        if isinstance(value, int) and not isinstance(value, bool):
            return value  # bytes; the range is checked with the other fields
        try:
            return parse_size(str(value))
        except ConfigError as exc:
            raise ConfigError(f"{source}: memory_budget: {exc}") from None
    if key == "devices":
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ConfigError(f"{source}: devices={value!r} must be a list or 'cuda:0,cuda:1'")
        return tuple(str(d).strip() for d in items)
    seconds = (
        "max_delay_ms",
        "request_timeout_s",
        "keepalive_timeout_s",
        "drain_timeout_s",
        "drain_grace_s",
        "default_timeout_ms",
        "max_queue_wait_ms",
        "repository_poll_secs",
        "gil_switch_interval_ms",
        "inline_batch_ms",
        "inline_full_batch_ms",
    )
    if key in seconds and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a config file into a plain dict (the ``[serve]`` table if there is one)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    suffix = path.suffix.lower()
    data: Any
    if suffix == ".json":
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid JSON: {exc}") from None
    elif suffix == ".toml":
        try:
            tomllib = importlib.import_module("tomllib")
        except ImportError:  # pragma: no cover - Python 3.10: the tomli dependency
            tomllib = importlib.import_module("tomli")
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    else:
        raise ConfigError(
            f"config file {str(path)!r}: unknown format {suffix!r}; use .toml or .json"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a table of settings")
    if set(data) == {"serve"} and isinstance(data["serve"], dict):
        data = data["serve"]
    return dict(data)
