"""A model repository on disk: one directory per model, a ``config.toml`` each, numbered versions.

::

    models/                         # --model-repository models
      seed/
        config.toml                 # source = "seed-mlp"
        1/model.safetensors         # version 1's weights
        2/model.safetensors
      wide/
        config.toml
        1/                          # no weights: the model as its source builds it

``config.toml`` (every field but ``source`` optional)::

    source = "seed-mlp"             # an embedded model, or "module:callable" returning an nn.Module
    weights = "model.safetensors"   # the weights file in each version directory (default: the
                                    # one .safetensors/.pt/.pth there, if any)
    exported = "model.pt2"          # or a torch.export program in each version directory
    labels = "labels.txt"           # class names, one per line (classification extension)
    inputs = ["input:FP32:-1,8"]    # when they cannot be inferred (outputs come from a dry run)
    outputs = ["output:FP32:-1,2"]
    dtype = "float32"
    devices = ["cpu"]               # default: the server's --device/--devices
    replicas = 1                    # per device
    [batching]
    max_batch_size = 32
    max_delay_ms = 2.0
    [version_policy]                # one of: latest = N (default 1), all = true, specific = [1, 3]
    latest = 1

A model directory without version directories that holds its model file directly (what
KServe's model puller downloads) is version 1; its settings may then come from a
``torchplace.toml`` as for ``--model_dir`` (``model = "seed-mlp"``, any batching setting).

A model directory with Triton's ``config.pbtxt`` (protobuf text format ``ModelConfig``) and no
``config.toml`` is read as Triton's PyTorch backend's: the file is mapped as an inline config's
``ModelConfig`` JSON is (:func:`triton_settings`), and each version's ``model.pt`` (or
``default_model_filename``) is a TorchScript archive (:mod:`torchplace.serve.torchscript`);
another backend (onnxruntime, tensorrt, python, ensemble) is that model's error. A TorchScript
``.pt`` of a ``config.toml`` model is served as TorchScript too (a state dict stays weights).

An error in one model's configuration names the file, the field and the fix
(:class:`~torchplace.errors.ConfigError`); the other models are not affected. A load request
may carry an inline configuration (Triton's ``parameters.config``, a JSON string): either these
keys, or Triton's ``ModelConfig`` JSON (``max_batch_size``, ``dynamic_batching``,
``version_policy``, ``instance_group``, ``input``/``output``), which :func:`triton_settings` maps.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchplace.errors import ConfigError, ModelLoadError
from torchplace.models import EMBEDDED_MODELS
from torchplace.serve.config import MAX_PRIORITY_LEVELS, load_config_file
from torchplace.serve.datatypes import HOST_DTYPES
from torchplace.serve.kserve import CONFIG_NAME as KSERVE_CONFIG

__all__ = [
    "CONFIG_NAME",
    "MAX_INLINE_REPLICAS",
    "MAX_NAME_BYTES",
    "MODEL_CONFIG_FIELDS",
    "NESTED_FIELDS",
    "PBTXT_NAME",
    "POLL_FAILED",
    "RENAMED",
    "ModelDir",
    "RepositoryPollError",
    "VersionPolicy",
    "check_model_name",
    "inline_config",
    "load_failed",
    "model_names",
    "read_model",
    "triton_settings",
    "unload_parameters",
]

CONFIG_NAME = "config.toml"
#: a Triton model directory's configuration (protobuf text format ``ModelConfig``), read
#: when the directory has no ``config.toml``
PBTXT_NAME = "config.pbtxt"
#: the name of a Triton PyTorch model's file in each version directory, by default
TRITON_MODEL_FILE = "model.pt"
logger = logging.getLogger(__name__)
#: model directories already told that their config.toml wins over their config.pbtxt
_BOTH_TOLD: set[Path] = set()
#: Triton's words for a load whose model could not be read from the repository
POLL_FAILED = "failed to poll from model repository"
#: ServeConfig fields that config.toml names otherwise (KServe's torchplace.toml uses ours)
RENAMED = {"model": "source", "replicas_per_device": "replicas"}
_WEIGHTS = (".safetensors", ".pt", ".pth")
_KEYS = ("source", "weights", "exported", "labels", "inputs", "outputs", "dtype", "devices",
         "replicas", "batching", "version_policy")  # fmt: skip
_BATCHING = ("max_batch_size", "max_delay_ms", "max_queue", "priority_levels",
             "default_priority", "priority_queue_limits", "default_timeout_ms")  # fmt: skip
#: the fields of Triton's ``ModelConfig`` (model_config.proto, as protobuf names them): an inline
#: config may carry any of them (what ``get_model_config`` returns may be sent back); the ones
#: this server has no use for are not read
MODEL_CONFIG_FIELDS = frozenset({
    "backend", "batch_input", "batch_output", "cc_model_filenames", "default_model_filename",
    "dynamic_batching", "ensemble_scheduling", "input", "instance_group", "max_batch_size",
    "metric_tags", "model_metrics", "model_operations", "model_repository_agents",
    "model_transaction_policy", "model_warmup", "name", "optimization", "output",
    "parameters", "platform", "response_cache", "runtime", "sequence_batching",
    "version_policy",
})  # fmt: skip
#: the fields of the ``ModelConfig`` messages an inline config's fields hold, where a field is
#: read (a typo in one, ``max_queue_delay_microsecond``, would load without it): as the
#: top-level ones, each is taken, and only those :func:`triton_settings` maps are read
NESTED_FIELDS: dict[str, frozenset[str]] = {
    "dynamic_batching": frozenset({
        "default_priority_level", "default_queue_policy", "max_queue_delay_microseconds",
        "preferred_batch_size", "preserve_ordering", "priority_levels", "priority_queue_policy",
    }),
    "instance_group": frozenset({
        "count", "gpus", "host_policy", "kind", "name", "passive", "profile", "rate_limiter",
        "secondary_devices",
    }),
    "input": frozenset({
        "allow_ragged_batch", "data_type", "dims", "format", "is_non_linear_format_io",
        "is_shape_tensor", "name", "optional", "reshape",
    }),
    "output": frozenset({
        "data_type", "dims", "is_non_linear_format_io", "is_shape_tensor", "label_filename",
        "name", "reshape",
    }),
    "queue_policy": frozenset({
        "allow_timeout_override", "default_timeout_microseconds", "max_queue_size",
        "timeout_action",
    }),
    "version_policy": frozenset({"all", "latest", "specific"}),
    "version_policy.latest": frozenset({"num_versions"}),
    "version_policy.all": frozenset(),
    "version_policy.specific": frozenset({"versions"}),
}  # fmt: skip


@dataclass(frozen=True)
class VersionPolicy:
    """Which numbered versions are served: the ``latest`` N, ``all``, or ``specific`` ones."""

    kind: str = "latest"
    count: int = 1
    versions: tuple[int, ...] = ()

    def triton(self) -> dict[str, Any]:
        """The policy as Triton's ``ModelConfig.version_policy`` JSON (what a model's config
        document says, and what a load's inline config may send back)."""
        if self.kind == "all":
            return {"all": {}}
        if self.kind == "specific":
            return {"specific": {"versions": list(self.versions)}}
        return {"latest": {"num_versions": self.count}}

    def select(self, available: list[int]) -> list[int]:
        """The versions to serve, oldest first."""
        found = sorted(available)
        if self.kind == "all":
            return found
        if self.kind == "specific":
            return [v for v in found if v in self.versions]
        return found[-self.count :]


@dataclass(frozen=True)
class ModelDir:
    """One model of the repository, read and checked: what each of its versions loads."""

    name: str
    directory: Path
    source: str  # the config file, or "inline config"
    settings: dict[str, Any]  # ServeConfig fields shared by every version
    weights: str | None
    exported: str | None
    policy: VersionPolicy
    versions: tuple[str, ...]  # the selected version directories, oldest first
    #: the model files lie in the directory itself (KServe's layout): one version, "1"
    flat: bool = False
    #: read from Triton's config.pbtxt: each version's ``weights`` file is a TorchScript archive
    triton: bool = False

    def version_settings(self, version: str) -> dict[str, Any]:
        """The ServeConfig fields of one version (its weights or program resolved)."""
        folder = self.directory if self.flat else self.directory / version
        settings = {**self.settings, "name": self.name, "model_version": version,
                    "weights": None, "exported": None, "torchscript": None}  # fmt: skip
        if self.triton:  # the loader says what is wrong with the file, for this version
            settings["torchscript"] = str(folder / (self.weights or TRITON_MODEL_FILE))
        elif self.exported is not None:
            settings["exported"] = str(folder / self.exported)
        elif self.weights is not None:
            settings["weights"] = str(folder / self.weights)
        else:
            found = sorted(p for p in folder.iterdir() if p.suffix in _WEIGHTS)
            exported = sorted(folder.glob("*.pt2"))
            if exported:
                settings["exported"] = str(exported[0])
            elif found:
                settings["weights"] = str(found[0])
        weights = settings["weights"]
        if weights is not None and _is_torchscript(Path(weights)):  # not a state dict
            settings["torchscript"], settings["weights"] = weights, None
        return settings

    def fingerprint(self) -> tuple[Any, ...]:
        """Changes when the config or a version directory changes (for polling)."""
        configs = (self.directory / CONFIG_NAME, self.directory / PBTXT_NAME)
        paths = [*configs, *(self.directory / v for v in self.versions)]
        paths = [self.directory] if self.flat else paths
        stamps: list[Any] = [self.versions]
        for path in paths:
            for item in [path, *(path.iterdir() if path.is_dir() else ())]:
                if item.exists():
                    stat = item.stat()
                    stamps.append((str(item), stat.st_mtime_ns, stat.st_size))
        return tuple(stamps)


def model_names(root: Path) -> list[str]:
    """The model directories of the repository (hidden ones skipped), sorted."""
    if not root.is_dir():
        raise ConfigError(
            f"model repository {str(root)!r} is not a directory; create it with one "
            "directory per model (see docs/serve.md, 'Model repository')"
        )
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _fail(where: str, key: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"{where}: {key} {problem}; {fix}")


#: replicas per device a load request's inline config may ask for (the model's config.toml,
#: the operator's, may set more): a client's load must not start threads without bound
MAX_INLINE_REPLICAS = 64
#: the largest batch (rows) and the most bytes of the tensors an inline config declares that
#: one batch may stage: a client's load must not make the server allocate without bound
MAX_INLINE_BATCH_ROWS = 4096
MAX_INLINE_BATCH_BYTES = 1 << 30
#: the longest model directory name (Linux's NAME_MAX, in bytes)
MAX_NAME_BYTES = 255


class RepositoryPollError(ModelLoadError):
    """A load whose files could not be laid out, as Triton answers it: an internal error
    (HTTP 500, gRPC ``INTERNAL``) whose message starts ``failed to poll from model
    repository``."""

    status = 500


def check_model_name(name: str) -> None:
    """Refuse (ConfigError) a name that cannot be one directory of the repository (Triton's
    words first for an empty name and for one that climbs out of it)."""
    shown = name if len(name) <= 80 else f"{name[:80]}... ({len(name)} characters)"
    if not name.strip():
        raise ConfigError(
            f"Model name cannot be empty. Please enter a valid name to deploy. ({shown!r} "
            "is not a directory name of the repository; give the name of one of its model "
            "directories)"
        )
    if name.strip() == ".." or any(c in name for c in "/\\"):
        raise ConfigError(
            f"model name must not contain path traversal characters: {shown!r} is not a "
            "directory name of the repository; give the name of one of its model directories"
        )
    bad = name == "." or "\0" in name
    if bad or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise ConfigError(
            f"model name {shown!r} is not a directory name of the repository; give the name "
            f"of one of its model directories (at most {MAX_NAME_BYTES} bytes)"
        )


def read_model(root: Path, name: str, inline: Mapping[str, Any] | None = None) -> ModelDir:
    """Read and check ``root/name`` (its ``config.toml``, then ``inline`` over it)."""
    check_model_name(name)
    try:
        return _read_model(root, name, inline)
    except OSError as exc:  # unreadable, or removed while it is read
        raise ConfigError(
            f"model {name!r}: cannot read its directory ({exc.strerror or exc}); check the "
            "repository's files and permissions"
        ) from None


def _read_model(root: Path, name: str, inline: Mapping[str, Any] | None) -> ModelDir:
    directory = root / name
    config_file = directory / CONFIG_NAME
    if not directory.is_dir():
        raise ConfigError(
            f"{POLL_FAILED}: model {name!r} is not in the repository "
            f"{str(root)!r}; create {str(directory)!r} "
            f"with a {CONFIG_NAME} and a version directory such as 1/"
        )
    data: dict[str, Any] = {}
    where = str(config_file)
    kserve_file, pbtxt_file = directory / KSERVE_CONFIG, directory / PBTXT_NAME
    triton = False
    if config_file.is_file():
        data = load_config_file(config_file)
        _tell_both(directory, pbtxt_file)
    elif pbtxt_file.is_file():  # a Triton model directory
        where, data, triton = str(pbtxt_file), _from_pbtxt(pbtxt_file, name), True
    elif kserve_file.is_file():  # a KServe model directory (see torchplace.serve.kserve)
        where, data = str(kserve_file), _from_kserve(load_config_file(kserve_file))
    elif inline is None and not _model_files(directory, "*.pt2"):
        raise ConfigError(
            f'{where} is missing; write one with at least source = "seed-mlp" (an embedded '
            f'model) or "module:callable" (or give the model Triton\'s {PBTXT_NAME})'
        )
    if inline is not None:
        merged = {**data, **inline}
        # the [batching] table too, key by key: an inline max_batch_size (or Triton's
        # dynamic_batching delay) alone keeps the file's other batching value
        batching, extra = data.get("batching"), inline.get("batching")
        if isinstance(batching, Mapping) and isinstance(extra, Mapping):
            merged["batching"] = {**batching, **extra}
        data = merged
        from_file = config_file.is_file() or kserve_file.is_file() or triton
        where = f"{where} with the inline config" if from_file else "inline config"
    return _checked(directory, name, where, data, triton=triton)


def _tell_both(directory: Path, pbtxt_file: Path) -> None:
    """Log (once per directory) that its config.toml is read and its config.pbtxt is not."""
    if directory in _BOTH_TOLD or not pbtxt_file.is_file():
        return
    _BOTH_TOLD.add(directory)
    both = f"{CONFIG_NAME} and {PBTXT_NAME}: {CONFIG_NAME} is read, {PBTXT_NAME} is not"
    logger.warning("model directory %s holds both %s (remove one to silence this)", directory, both)


def _checked(
    directory: Path, name: str, where: str, data: Mapping[str, Any], *, triton: bool = False
) -> ModelDir:
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise _fail(where, f"field {unknown[0]!r}", "is not a setting",
                    f"use one of {', '.join(_KEYS)}")  # fmt: skip
    policy = _policy(where, data.get("version_policy", {}))
    available = _version_numbers(directory, where)
    flat = not available and bool(_model_files(directory, "*"))
    if not available and not flat:
        raise _fail(where, "model", "has no numbered version directory",
                    f"create {str(directory / '1')!r} holding the version's weights")  # fmt: skip
    folders = [directory] if flat else [directory / str(v) for v in available]
    own = triton or any(_holds_own_model(folder) for folder in folders)
    settings = _settings(where, data, own or data.get("exported") is not None)
    available = [1] if flat else available
    chosen = policy.select(available)
    if not chosen:
        raise _fail(where, "version_policy", f"selects none of the versions {sorted(available)}",
                    "name versions that exist, or use latest = 1")  # fmt: skip
    files = {key: data.get(key) for key in ("weights", "exported", "labels")}
    for key, value in files.items():
        if value is not None and (not isinstance(value, str) or "/" in value or not value):
            inside = "the model directory" if key == "labels" else "each version directory"
            raise _fail(where, f"field {key!r}", f"= {value!r} is not a file name",
                        f"give the file's name inside {inside}")  # fmt: skip
    if files["labels"] is not None:
        settings["labels"] = str(directory / files["labels"])
    return ModelDir(name, directory, where, settings, files["weights"], files["exported"],
                    policy, tuple(str(v) for v in chosen), flat, triton)  # fmt: skip


def _holds_own_model(folder: Path) -> bool:
    """Whether ``folder`` holds a model that needs no ``source``: a ``torch.export`` program
    or a TorchScript archive."""
    if _model_files(folder, "*.pt2"):
        return True
    return any(_is_torchscript(p) for p in _model_files(folder, "*.pt*") if p.suffix != ".pt2")


def _is_torchscript(path: Path) -> bool:
    from torchplace.serve.torchscript import is_torchscript

    return is_torchscript(path)


def _version_numbers(directory: Path, where: str) -> list[int]:
    """The versions of ``directory``: its subdirectories named by a number in ASCII digits
    (other names are not versions, as in Triton). A version is loaded from the directory
    named as the number is written, so one written otherwise (``007``, which would be looked
    for in ``7``) is refused, naming the name to give it."""
    found = []
    for path in directory.iterdir():
        name = path.name
        # str.isdigit also takes other scripts' digits ('²' is one int() refuses): not versions
        if not (name.isascii() and name.isdigit() and path.is_dir()):
            continue
        number = int(name)
        if name != str(number):
            raise _fail(where, f"version directory {name!r}", "is not written as a version "
                        f"number (versions are loaded from {str(directory / str(number))!r})",
                        f"rename it {str(number)!r}")  # fmt: skip
        found.append(number)
    return found


def _from_kserve(data: Mapping[str, Any]) -> dict[str, Any]:
    """A KServe model directory's ``torchplace.toml`` (``torchplace serve`` settings) in the
    repository's terms: ``model`` is the source, batching settings go under ``batching``."""
    out: dict[str, Any] = {}
    batching: dict[str, Any] = {}
    for raw, value in data.items():
        key = str(raw).replace("-", "_")
        if key in _BATCHING:
            batching[key] = value
        else:
            out[RENAMED.get(key, key)] = value
    if batching:
        out["batching"] = batching
    return out


#: the PyTorch backend, as a config.pbtxt names it (Triton's platform or backend field)
_PYTORCH = {"platform": "pytorch_libtorch", "backend": "pytorch"}
_PBTXT_FIX = (
    "write it in Triton's protobuf text format for ModelConfig (model_config.proto), e.g. "
    'platform: "pytorch_libtorch" max_batch_size: 8 input [{name: "INPUT__0", data_type: '
    "TYPE_FP32, dims: [8]}]"
)


def _from_pbtxt(path: Path, name: str) -> dict[str, Any]:
    """A Triton model directory's ``config.pbtxt`` in the repository's terms: parsed into
    ``ModelConfig``, checked to be the PyTorch backend's, and mapped as an inline config's
    Triton JSON is (:func:`_mapped`); each version's file is ``default_model_filename``."""
    message = _parse_pbtxt(path)  # first: it says what to install when protobuf is missing
    from google.protobuf import json_format

    where = str(path)
    _check_pytorch(message, where, name)
    if message.max_batch_size == 0:
        raise ConfigError(
            f"{where}: max_batch_size is 0 (or not given), Triton's 'no batching', where dims "
            "are the whole shape; torchplace batches every model along a first dimension: "
            "give max_batch_size: N (N >= 1) and dims without the batch dimension, as Triton "
            "takes them with batching"
        )
    filename = message.default_model_filename or TRITON_MODEL_FILE
    if "/" in filename or "\\" in filename or filename in (".", ".."):
        raise ConfigError(
            f"{where}: default_model_filename {filename!r} is not a file name; give the name "
            f"of the TorchScript archive inside each version directory (default "
            f"{TRITON_MODEL_FILE!r})"
        )
    doc = json_format.MessageToDict(message, preserving_proto_field_name=True)
    try:
        data = _mapped(doc, name)
    except ConfigError as exc:  # the mapping speaks of an inline config: name the file
        text = str(exc)
        shown = text.removeprefix("inline config").removeprefix(": ")
        raise ConfigError(f"{where}: {shown}") from None
    return {**data, "weights": filename}


def _parse_pbtxt(path: Path) -> Any:
    """``config.pbtxt`` parsed into Triton's ``ModelConfig`` (ConfigError naming the file, the
    line and the fix when it does not parse, or protobuf is not installed)."""
    try:
        from google.protobuf import text_format

        from torchplace.serve.proto import model_config_pb2
    except ImportError:
        raise ConfigError(
            f"{path!s}: reading Triton's {PBTXT_NAME} needs protobuf, part of the grpc "
            "extra; run: pip install 'torchplace[grpc]', or write the model a "
            f"{CONFIG_NAME} instead"
        ) from None
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path!s}: is not UTF-8 text ({exc.reason}); {_PBTXT_FIX}") from None
    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        line, column = exc.GetLine(), exc.GetColumn()
        # protobuf quotes the token it stopped at, which may be a line thousands long
        why = _cut(str(exc).split(" : ", 1)[-1])
        at = f"line {line}, column {column}: " if line else ""
        raise ConfigError(f"{path!s}: {at}{why}; {_PBTXT_FIX}") from None
    except (RecursionError, ValueError) as exc:  # nested too deep, a number out of range
        raise ConfigError(f"{path!s}: does not parse ({_cut(str(exc))}); {_PBTXT_FIX}") from None


def _cut(text: str, most: int = 300) -> str:
    """A parse error as a message quotes it: protobuf quotes the whole token it stopped at,
    which may be a line megabytes long (it went into the index and every log line)."""
    return text if len(text) <= most else f"{text[:most]}... ({len(text):,} characters)"


def _check_pytorch(message: Any, where: str, name: str) -> None:
    """Refuse a config.pbtxt of another backend than PyTorch's (or of its Python runtime),
    naming it. Neither platform nor backend given is taken as PyTorch (Triton picks the
    backend from the model file's name)."""
    for field, pytorch in _PYTORCH.items():
        value = getattr(message, field)
        if value and value != pytorch:
            kind = value.split("_")[0] if field == "platform" else value
            raise ConfigError(
                f"{where}: model {name!r} is a Triton {kind} model ({field}: {value!r}); "
                "torchplace serves PyTorch models: save it as a TorchScript archive "
                '(torch.jit.save) in each version directory with platform: "pytorch_libtorch" '
                '(or backend: "pytorch"), or serve this model with Triton'
            )
    if message.runtime and message.runtime.endswith(".py"):
        raise ConfigError(
            f"{where}: model {name!r} uses the PyTorch backend's Python runtime (runtime: "
            f"{message.runtime!r}); torchplace serves TorchScript archives from it: save the "
            "model with torch.jit.save as model.pt and remove runtime, or give the model a "
            f'{CONFIG_NAME} with source = "module:callable"'
        )


def _model_files(folder: Path, pattern: str) -> list[Path]:
    """The model files (programs, weights) directly in ``folder``."""
    suffixes = (".pt2", *_WEIGHTS)
    return [p for p in folder.glob(pattern) if p.is_file() and p.suffix in suffixes]


def _settings(where: str, data: Mapping[str, Any], exported: bool) -> dict[str, Any]:
    source = data.get("source")
    if source is None and not exported:
        raise _fail(where, "field 'source'", "is missing",
                    "give an embedded model (seed-mlp, wide-mlp) or 'module:callable'")  # fmt: skip
    if source is not None and (not isinstance(source, str) or not source.strip()):
        raise _fail(where, "field 'source'", f"= {source!r} is not a model",
                    "give an embedded model name or 'module:callable'")  # fmt: skip
    settings: dict[str, Any] = {"model": source or "seed-mlp"}
    for key in ("inputs", "outputs", "dtype", "devices"):
        if key in data:
            settings[key] = data[key]
    if RENAMED["replicas_per_device"] in data:
        settings["replicas_per_device"] = data[RENAMED["replicas_per_device"]]
    batching = data.get("batching", {})
    if not isinstance(batching, Mapping) or set(batching) - set(_BATCHING):
        raise _fail(where, "table [batching]", f"= {batching!r} is not understood",
                    f"give only {', '.join(_BATCHING)}")  # fmt: skip
    settings.update(batching)
    return settings


def _policy(where: str, raw: Any) -> VersionPolicy:
    fix = "write latest = N, all = true, or specific = [1, 3] under [version_policy]"
    if not isinstance(raw, Mapping) or len(raw) > 1:
        raise _fail(where, "[version_policy]", f"= {raw!r} is not one policy", fix)
    if not raw:
        return VersionPolicy()
    ((kind, value),) = raw.items()
    if kind == "latest" and isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return VersionPolicy("latest", value)
    if kind == "all" and value is True:
        return VersionPolicy("all")
    if (
        kind == "specific"
        and isinstance(value, list)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        return VersionPolicy("specific", versions=tuple(value))
    raise _fail(where, f"version_policy.{kind}", f"= {value!r} is invalid", fix)


def _check_text(doc: dict[str, Any]) -> None:
    """Every string of an inline config is text: a lone surrogate escape (``\\udc00``, half of
    a pair) read as one failed deep in the load, with a codec's words."""
    try:
        json.dumps(doc, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"inline config holds a lone surrogate escape (\\u{ord(exc.object[exc.start]):x}, "
            "half of a UTF-16 pair), which is not text; send names and values as UTF-8 text"
        ) from None


def triton_settings(text: str, model: str | None = None) -> dict[str, Any]:
    """An inline config (a JSON string): our keys as they are, Triton's ``ModelConfig`` mapped.

    Triton's integers may come as JSON strings (protobuf's JSON mapping writes int64 fields so,
    and ``tritonclient``'s ``get_model_config(as_json=True)`` returns them so). A field that is
    neither ours nor ``ModelConfig``'s is refused (Triton's parse refuses it too), and with
    ``model``, so is a ``name`` other than the model's (Triton's check)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"inline config is not JSON: {exc}; send a JSON object") from None
    except ValueError:  # an integer past Python's limit on the digits it converts
        raise ConfigError(
            "inline config holds an integer thousands of digits long; send the numbers its "
            "fields take"
        ) from None
    except RecursionError:  # arrays or objects nested thousands deep
        raise ConfigError(
            "inline config is nested too deeply to read; send a flat JSON object"
        ) from None
    if not isinstance(doc, dict):
        raise ConfigError(
            'inline config must be a JSON object, e.g. {"max_batch_size": 8}, not '
            f"{_shown(json.dumps(doc))}"
        )
    return _mapped(doc, model)


def _mapped(doc: dict[str, Any], model: str | None) -> dict[str, Any]:
    """The core of :func:`triton_settings`: a ``ModelConfig`` document (or ours) mapped onto
    our settings; also what a Triton model directory's ``config.pbtxt`` is read with."""
    _check_text(doc)
    doc = _protobuf_names(doc)
    _check_fields(doc)
    _check_nested(doc)
    _check_name(doc.get("name"), model)
    out: dict[str, Any] = {k: v for k, v in doc.items() if k in _KEYS}
    batching: dict[str, Any] = dict(_object(out.pop("batching", {}), "batching"))
    if "max_batch_size" in doc:
        batching["max_batch_size"] = _integer(doc["max_batch_size"], "max_batch_size")
    dynamic = _object(doc.get("dynamic_batching", {}), "dynamic_batching")
    delay = dynamic.get("max_queue_delay_microseconds")
    if delay is not None:
        where = "dynamic_batching.max_queue_delay_microseconds"
        batching["max_delay_ms"] = _integer(delay, where) / 1000
    batching.update(_queue_settings(dynamic))
    if batching:
        out["batching"] = batching
    policy = _object(doc.get("version_policy", {}), "version_policy")
    if any(isinstance(v, dict) for v in policy.values()):
        out["version_policy"] = _triton_policy(policy)  # Triton's {"latest": {...}} shape
    groups = _list(doc.get("instance_group", []), "instance_group")
    if groups:
        out.update(_instance_groups(groups))
    for ours, theirs in (("inputs", "input"), ("outputs", "output")):
        if theirs in doc:
            out[ours] = [_tensor(t, f"{theirs}[{i}]")
                         for i, t in enumerate(_list(doc[theirs], theirs))]  # fmt: skip
    labels = _label_file(_list(doc.get("output", []), "output"))
    if labels is not None:
        out["labels"] = labels
    parameters = _object(doc.get("parameters", {}), "parameters")
    source = _object(parameters.get("source", {}), "parameters.source")
    if "string_value" in source:
        out["source"] = source["string_value"]
    return out


#: ``ModelConfig`` maps whose keys are the user's own, not field names
_FREE_MAPS = frozenset({"parameters", "metric_tags", "cc_model_filenames"})


def _protobuf_names(value: Any, free: bool = False) -> Any:
    """``value`` with protobuf's lowerCamelCase field names (``maxBatchSize``, what
    ``MessageToJson`` writes) as the fields' own (``max_batch_size``): Triton's parse takes
    both. The keys of the maps in :data:`_FREE_MAPS` (``free``) are the user's and stay."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            name = key if free or not isinstance(key, str) else _snake(key)
            out[name] = _protobuf_names(item, free=not free and name in _FREE_MAPS)
        return out
    if isinstance(value, list):
        return [_protobuf_names(item) for item in value]
    return value


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


def _check_fields(doc: Mapping[str, Any]) -> None:
    """Every field of an inline config ours or ``ModelConfig``'s: one that is neither (a typo)
    would not be read, and the load would go on without it."""
    for key in doc:
        if key in _KEYS or key in MODEL_CONFIG_FIELDS:
            continue
        fix = (
            "give ModelConfig's fields (max_batch_size, dynamic_batching, version_policy, "
            f"instance_group, input, output...) or torchplace's ({', '.join(_KEYS)})"
        )
        raise ConfigError(
            f"inline config: field {_shown(key)!r} is neither a field of Triton's ModelConfig "
            f"nor a torchplace setting; {fix}"
        )


def _check_nested(doc: Mapping[str, Any]) -> None:
    """The fields of the messages that an inline config's ``dynamic_batching``,
    ``instance_group``, ``input``, ``output`` and ``version_policy`` (Triton's shape) hold are
    theirs: a typo in one (``max_queue_delay_microsecond``, ``cout``, ``num_version``, a
    policy ``lattest``) was not read, and the load went on without it (the policy as ``all``).
    A field of the wrong type is left to the mapping, which names it."""
    batching = doc.get("dynamic_batching")
    if isinstance(batching, Mapping):
        _check_message(batching, "dynamic_batching")
    policy = doc.get("version_policy")
    # a policy in our shape ({"latest": 2}) is checked as config.toml's
    if isinstance(policy, Mapping) and any(isinstance(v, Mapping) for v in policy.values()):
        _check_message(policy, "version_policy")  # so each kind is latest, all or specific
        for kind, inner in policy.items():
            if isinstance(inner, Mapping):
                _check_message(inner, f"version_policy.{kind}")
    for key in ("instance_group", "input", "output"):
        value = doc.get(key)
        if isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, Mapping):
                    _check_message(item, key, f"{key}[{i}]")


def _check_message(value: Mapping[str, Any], kind: str, where: str | None = None) -> None:
    """Refuse a key of ``value`` that is not a field of the ``NESTED_FIELDS[kind]`` message."""
    fields = NESTED_FIELDS[kind]
    for key in value:
        if key in fields:
            continue
        names = ", ".join(sorted(fields)) if fields else "none: send it as {}"
        raise ConfigError(
            f"inline config: field {_shown(str(key))!r} of {where or kind} is not a field of "
            f"Triton's ModelConfig there; its fields are {names}"
        )


def _check_name(name: object, model: str | None) -> None:
    """An inline config's ``name`` (if any) is the loaded model's: Triton refuses another."""
    if name is None:
        return
    if not isinstance(name, str):
        raise ConfigError(
            f"inline config: name must be a string, not {_shown(json.dumps(name))}; give the "
            "model's name or leave it out"
        )
    if name and model is not None and name != model:
        raise ConfigError(
            f"unexpected directory name {model!r} for model {_shown(name)!r}, directory name "
            f'must equal model name; send the config with "name": {json.dumps(model)} or '
            "without a name"
        )


def _shown(text: str) -> str:
    """A value a client sent, as a message quotes it: cut past 80 characters."""
    return text if len(text) <= 80 else f"{text[:80]}... ({len(text)} characters)"


def _check_inline_batch(settings: Mapping[str, Any]) -> None:
    """An inline config's batch within :data:`MAX_INLINE_BATCH_ROWS` rows and, with the
    tensors it declares, :data:`MAX_INLINE_BATCH_BYTES`: each replica stages and dry-runs a
    whole batch before the load can fail."""
    batching = settings.get("batching")
    rows = batching.get("max_batch_size") if isinstance(batching, Mapping) else None
    fix = f"set a larger batch in the model's {CONFIG_NAME}"
    if type(rows) is int and rows > MAX_INLINE_BATCH_ROWS:
        raise ConfigError(
            f"an inline config may ask for batches of at most {MAX_INLINE_BATCH_ROWS} rows, "
            f"not {rows}: every replica holds a whole batch; {fix}"
        )
    tensors = [*settings.get("inputs", ()), *settings.get("outputs", ())]
    row_bytes = sum(_row_bytes(t) for t in tensors if isinstance(t, Mapping))
    size = row_bytes * (rows if type(rows) is int and rows > 0 else 1)
    if size > MAX_INLINE_BATCH_BYTES:
        raise ConfigError(
            f"an inline config's batch would stage {size:,} bytes of the tensors it declares "
            f"({row_bytes:,} a row), over the {MAX_INLINE_BATCH_BYTES:,} an inline config may "
            f"ask for; send fewer rows or smaller dims, or {fix}"
        )


def _row_bytes(tensor: Mapping[str, Any]) -> int:
    """Bytes of one row of a declared tensor (0 for a datatype without a fixed size)."""
    dtype = HOST_DTYPES.get(str(tensor.get("datatype")))
    shape = tensor.get("shape")
    if dtype is None or not isinstance(shape, list):
        return 0
    return dtype.itemsize * math.prod(max(d, 1) for d in shape[1:] if type(d) is int)


def _tensor(raw: object, where: str) -> dict[str, Any]:
    """One of Triton's ``input``/``output`` entries as our tensor declaration."""
    tensor = _object(raw, where)
    if not isinstance(tensor.get("name"), str) or not isinstance(tensor.get("data_type"), str):
        raise ConfigError(f"inline config: {where} needs a 'name' and a 'data_type' string")
    dims = [_integer(d, f"{where}.dims") for d in _list(tensor.get("dims", []), f"{where}.dims")]
    if -1 in dims:  # the batch is implicit: a -1 among the dims is Triton's variable size
        raise ConfigError(
            f"inline config: {where}.dims {dims} has a variable dimension (-1); torchplace "
            "stages fixed-size rows (the batch dimension is the only variable one, and it is "
            "implicit): give every dimension its size, e.g. pad token ids to a fixed length"
        )
    reshape = tensor.get("reshape")
    if reshape is not None:
        shape = _object(reshape, f"{where}.reshape").get("shape", [])
        shape = [_integer(d, f"{where}.reshape.shape") for d in _list(shape, f"{where}.reshape")]
        if shape != dims:  # Triton's reshape between the wire's dims and the model's shape
            raise ConfigError(
                f"inline config: {where}.reshape {{shape: {shape}}} is not applied: torchplace "
                f"gives the model the tensor in its dims {dims} (and answers the model's "
                "output as it is), so the model would see another shape than under Triton; "
                "remove reshape and reshape inside the model, or give dims the model's own shape"
            )
    datatype = tensor["data_type"].removeprefix("TYPE_")
    return {"name": tensor["name"], "datatype": datatype, "shape": [-1, *dims]}


def _label_file(outputs: list[Any]) -> str | None:
    """The outputs' ``label_filename`` (Triton's classification labels, a file in the model
    directory) as the model's ``labels``: one file, which names the classes of every output;
    outputs naming different files are refused (the labels are one list per model here)."""
    named = {
        str(entry["label_filename"]): str(entry.get("name"))
        for entry in outputs
        if isinstance(entry, Mapping) and entry.get("label_filename")
    }
    if len(named) > 1:
        files = ", ".join(f"{file!r} ({output})" for file, output in named.items())
        raise ConfigError(
            f"inline config: the outputs name different label files ({files}); torchplace "
            "reads one label file for every output of a model: give the outputs one "
            "label_filename"
        )
    return next(iter(named), None)


def _queue_settings(dynamic: Mapping[str, Any]) -> dict[str, Any]:
    """``dynamic_batching``'s queue as our settings: ``priority_levels``, the
    ``default_priority_level``, and the queue policies (``max_queue_size`` per level, the
    default timeout). Triton's 0 (no limit, no level, no timeout) leaves the server's own."""
    where = "dynamic_batching"
    out: dict[str, Any] = {}
    for theirs, ours in (("priority_levels", "priority_levels"),
                         ("default_priority_level", "default_priority")):  # fmt: skip
        if dynamic.get(theirs) is not None and (
            n := _integer(dynamic[theirs], f"{where}.{theirs}")
        ):
            if n > MAX_PRIORITY_LEVELS:  # before a loop over the levels, not after
                raise ConfigError(
                    f"inline config: {where}.{theirs} {n} is past the {MAX_PRIORITY_LEVELS} "
                    "priority levels a queue may have; give a level count (or level) of at "
                    f"most {MAX_PRIORITY_LEVELS}"
                )
            out[ours] = n
    size, timeout = _queue_policy(
        dynamic.get("default_queue_policy"), f"{where}.default_queue_policy"
    )
    if size:
        out["max_queue"] = size
    if timeout is not None:
        out["default_timeout_ms"] = timeout / 1000
    levels = _object(dynamic.get("priority_queue_policy", {}), f"{where}.priority_queue_policy")
    if levels:
        out["priority_queue_limits"] = _level_limits(
            levels, out.get("priority_levels"), size, timeout
        )
    return out


def _queue_policy(raw: object, where: str) -> tuple[int | None, int | None]:
    """A ``ModelQueuePolicy``'s ``max_queue_size`` (None for 0, no limit) and
    ``default_timeout_microseconds``; a ``timeout_action`` other than ``REJECT`` is refused."""
    if raw is None:
        return None, None
    policy = _object(raw, where)
    _check_message(policy, "queue_policy", where)
    action = policy.get("timeout_action", "REJECT")
    if action not in ("REJECT", 0):
        raise ConfigError(
            f"inline config: {where}.timeout_action {_shown(str(action))!r} is not served: a "
            "request still queued at its timeout is refused (REJECT); drop timeout_action, or "
            "give REJECT"
        )
    size = _integer(policy.get("max_queue_size", 0), f"{where}.max_queue_size")
    timeout = policy.get("default_timeout_microseconds")
    micros = None if timeout is None else _integer(timeout, f"{where}.default_timeout_microseconds")
    return size or None, micros


def _level_limits(
    levels: Mapping[str, Any], count: int | None, size: int | None, timeout: int | None
) -> list[int]:
    """``priority_queue_policy`` (a policy per level) as one queue limit per level, level 1
    first: a level without one takes the default policy's."""
    where = "dynamic_batching.priority_queue_policy"
    if not count:
        raise ConfigError(
            f"inline config: {where} needs dynamic_batching.priority_levels, the number of levels"
        )
    named = {str(n) for n in range(1, count + 1)}
    stray = sorted(str(k) for k in levels if str(k) not in named)
    if stray:
        raise ConfigError(
            f"inline config: {where} names level {_shown(stray[0])}, not one of 1..{count} "
            "(dynamic_batching.priority_levels)"
        )
    limits: list[int] = []
    for level in range(1, count + 1):
        raw = levels.get(str(level))
        own, own_timeout = _queue_policy(raw, f"{where}[{level}]")
        if own_timeout is not None and own_timeout != (timeout or 0):
            raise ConfigError(
                f"inline config: {where}[{level}] has its own default_timeout_microseconds "
                f"({own_timeout}); this server has one default timeout for every level: give it "
                "in default_queue_policy"
            )
        limit = own or size
        if limit is None:
            raise ConfigError(
                f"inline config: level {level} has no max_queue_size in {where} nor in "
                "dynamic_batching.default_queue_policy; give it in one of them"
            )
        limits.append(limit)
    return limits


#: ``ModelInstanceGroup.Kind``'s names, by their numbers (protobuf's JSON takes either)
_KINDS = ("KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL")


def _instance_groups(groups: list[Any]) -> dict[str, Any]:
    """Triton's instance groups as ``replicas`` (per device) and ``devices``: ``KIND_CPU`` the
    CPU; ``KIND_GPU`` (and ``KIND_AUTO`` naming ``gpus``) its ``gpus``, every GPU when it names
    none, as in Triton; ``KIND_AUTO`` and ``KIND_MODEL`` the server's own devices (no
    ``devices``). A ``passive`` group, which takes no requests from the scheduler (the CPU
    fallback that ``get_model_config`` lists), is the server's ``--fallback``, not a device."""
    counts: set[int] = set()
    devices: list[str] = []
    own = False
    for i, raw in enumerate(groups):
        where = f"instance_group[{i}]"
        group = _object(raw, where)
        if group.get("passive") is True:
            continue
        counts.add(_integer(group.get("count", 1), f"{where}.count"))
        placed = _group_devices(group, where)
        if placed is None:
            own = True
        else:
            devices += placed
    if len(counts) > 1:  # replicas are per device: groups of 1 and 2 cannot both hold
        raise ConfigError(
            f"inline config: instance_group has groups of different counts "
            f"({', '.join(map(str, sorted(counts)))}); this server places the same number "
            "of replicas on each of the model's devices: give every group one count (the "
            "replicas per device), or one group"
        )
    if own and devices:
        raise ConfigError(
            "inline config: instance_group mixes groups on the server's own devices "
            "(KIND_AUTO without gpus, KIND_MODEL) with groups that name theirs "
            f"({', '.join(devices)}); give every group its kind (KIND_GPU with gpus, KIND_CPU)"
        )
    out: dict[str, Any] = {"replicas": counts.pop()} if counts else {}
    if devices:
        out["devices"] = list(dict.fromkeys(devices))
    return out


def _group_devices(group: Mapping[str, Any], where: str) -> list[str] | None:
    """One instance group's devices by its ``kind`` and ``gpus`` (see :func:`_instance_groups`);
    None for the server's own (``KIND_AUTO`` without ``gpus``, ``KIND_MODEL``)."""
    kind = group.get("kind", "KIND_AUTO")
    if type(kind) is int and 0 <= kind < len(_KINDS):
        kind = _KINDS[kind]
    if kind not in _KINDS:
        raise ConfigError(
            f"inline config: {where}.kind {_shown(str(kind))!r} is not one of {', '.join(_KINDS)}"
        )
    gpus = [_integer(g, f"{where}.gpus") for g in _list(group.get("gpus", []), f"{where}.gpus")]
    if gpus and kind in ("KIND_CPU", "KIND_MODEL"):
        raise ConfigError(
            f"inline config: {where} is {kind} with gpus {gpus}; only a KIND_GPU or "
            "KIND_AUTO group names GPUs: drop gpus, or make it KIND_GPU"
        )
    if kind == "KIND_CPU":
        return ["cpu"]
    if gpus:
        return [f"cuda:{g}" for g in gpus]
    if kind == "KIND_GPU":
        return _every_gpu(where)
    return None


def _every_gpu(where: str) -> list[str]:
    """``cuda:0`` ... for each GPU torch sees: a ``KIND_GPU`` group that names no ``gpus``."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not count:
        raise ConfigError(
            f"inline config: {where} is KIND_GPU, but torch sees no CUDA GPU on this machine; "
            "make it KIND_CPU, or KIND_AUTO for the server's own devices"
        )
    return [f"cuda:{i}" for i in range(count)]


def _triton_policy(policy: Mapping[str, Any]) -> dict[str, Any]:
    """Triton's ``ModelVersionPolicy`` (its fields checked already: ``latest``, ``all`` or
    ``specific``) as ours."""
    if len(policy) > 1:  # a oneof: Triton's parse refuses two of them
        raise ConfigError(
            "inline config: version_policy must hold one of 'latest', 'all' and 'specific', "
            f'not {len(policy)}: for example {{"latest": {{"num_versions": 1}}}}'
        )
    if "latest" in policy:
        latest = _object(policy["latest"], "version_policy.latest")
        return {"latest": _integer(latest.get("num_versions", 1), "latest.num_versions")}
    if "specific" in policy:
        specific = _object(policy["specific"], "version_policy.specific")
        versions = _list(specific.get("versions", []), "version_policy.specific.versions")
        return {"specific": [_integer(v, "version_policy.specific.versions") for v in versions]}
    return {"all": True}


def _object(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"inline config: {where} must be an object, not {value!r}")
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ConfigError(f"inline config: {where} must be an array, not {value!r}")
    return value


def _integer(value: object, where: str) -> int:
    """An integer, or one written as a JSON string (as protobuf writes int64 fields), in
    protobuf's int64 range (what Triton's ``ModelConfig`` fields hold)."""
    number: int | None = None
    if isinstance(value, str):
        digits = value.removeprefix("-")
        if digits.isascii() and digits.isdigit() and len(digits) <= 19:  # int() has a limit
            number = int(value)
    elif type(value) is int:
        number = value
    if number is None or not -(2**63) <= number < 2**63:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}..."
        why = "" if number is None else " in the 64-bit range"
        raise ConfigError(f"inline config: {where} must be an integer{why}, not {shown}")
    return number


def load_failed(name: str, why: object) -> str:
    """The message of a failed load of ``name``, as Triton's start: ``failed to load 'name',
    failed to poll from model repository`` when the repository did not give the model (no such
    directory, files it cannot take), else ``failed to load 'name': why``."""
    text = str(why)
    joint = ", " if text.startswith(POLL_FAILED) else ": "
    return f"failed to load {name!r}{joint}{text}"


def inline_config(body: Mapping[str, Any], model: str | None = None) -> dict[str, Any] | None:
    """The inline config of a load request's body (``parameters.config``), or None. With
    ``model``, an error names the load as Triton's do (``failed to load 'name': ...``), and
    a config naming another model is refused."""
    try:
        return _inline_config(body, model)
    except (ConfigError, RepositoryPollError) as exc:
        if model is None:
            raise
        raise type(exc)(load_failed(model, exc)) from None


def _inline_config(body: Mapping[str, Any], model: str | None) -> dict[str, Any] | None:
    parameters = body.get("parameters")
    if parameters is None:
        return None
    if not isinstance(parameters, Mapping):
        raise ConfigError("the load request's 'parameters' must be an object")
    files = [k for k in parameters if isinstance(k, str) and k.startswith("file:")]
    unknown = [k for k in parameters if k != "config" and k not in files]
    if unknown:  # Triton's words; ignored, a misspelt config would load without it
        raise ConfigError(
            f"unrecognized load parameter {_shown(str(unknown[0]))!r}; a load takes 'config' "
            "(the model configuration as a JSON string) and no other parameter"
        )
    too_long = [k for k in files if any(len(p.encode()) > MAX_NAME_BYTES for p in k[5:].split("/"))]
    if too_long:  # a path no file system takes: Triton fails its poll (500, gRPC INTERNAL)
        shown = too_long[0] if len(too_long[0]) <= 80 else f"{too_long[0][:80]}..."
        raise RepositoryPollError(
            f"{POLL_FAILED}: load parameter {shown!r} names a path "
            f"component over {MAX_NAME_BYTES} bytes; model files sent with a load request are "
            "not supported anyway: put them in the model's directory of the repository"
        )
    if files:
        raise ConfigError(
            f"{POLL_FAILED}: load parameters {', '.join(files)}: model "
            "files sent with a load request are not supported; put them in the model's "
            "directory of the repository and load it"
        )
    text = parameters.get("config")
    if text is None:
        return None
    if isinstance(text, Mapping):  # an object where Triton wants its JSON text: taken as meant
        text = json.dumps(text)
    if not isinstance(text, str):
        sent = type(text).__name__ if isinstance(text, bytes) else json.dumps(text)
        raise ConfigError(
            f"invalid value type for load parameter 'config': {_shown(sent)}; send the model "
            'configuration as a JSON string, e.g. "{\\"max_batch_size\\": 8}"'
        )
    settings = triton_settings(text, model)
    replicas = settings.get("replicas")
    if type(replicas) is int and replicas > MAX_INLINE_REPLICAS:
        raise ConfigError(
            f"an inline config may ask for at most {MAX_INLINE_REPLICAS} replicas per device, "
            f"not {replicas}: each is a worker thread and a copy of the model; set more in the "
            f"model's {CONFIG_NAME}"
        )
    _check_inline_batch(settings)
    source = settings.get("source")
    if source is not None and source not in EMBEDDED_MODELS:
        raise ConfigError(
            f"an inline config may name an embedded model as its source, not {source!r}: a load "
            "request does not choose code to import and run; set source in the model's "
            f"{CONFIG_NAME}"
        )
    return settings


def unload_parameters(body: Mapping[str, Any]) -> None:
    """Check an unload request's body: ``parameters.unload_dependents``, if given, is a
    boolean (Triton's one unload parameter; a model here has no dependents, so either value
    unloads it alone); other parameters are not read, as in Triton."""
    parameters = body.get("parameters")
    if parameters is None:
        return
    if not isinstance(parameters, Mapping):
        raise ConfigError(
            "the unload request's 'parameters' must be an object, e.g. "
            '{"unload_dependents": true}'
        )
    value = parameters.get("unload_dependents")
    if value is not None and not isinstance(value, bool):
        raise ConfigError(
            "Unable to parse 'unload_dependents': expected a boolean, got "
            f"{_shown(json.dumps(value))}; send true or false"
        )
