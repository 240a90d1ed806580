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
    dry_run_shapes = { input = [8] }  # the row shape the dry runs give an input with variable
                                      # dimensions (default: each variable dimension 1)
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
``ModelConfig`` JSON is (:mod:`torchplace.serve.triton_config`), and each version's
``model.pt`` (or ``default_model_filename``) is a TorchScript archive
(:mod:`torchplace.serve.torchscript`); another backend (onnxruntime, tensorrt, python,
ensemble) is that model's error. A TorchScript ``.pt`` of a ``config.toml`` model is served as
TorchScript too (a state dict stays weights).

An error in one model's configuration names the file, the field and the fix
(:class:`~torchplace.errors.ConfigError`); the other models are not affected. A load request
may carry an inline configuration (Triton's ``parameters.config``, a JSON string): either these
keys, or Triton's ``ModelConfig`` JSON (``max_batch_size``, ``dynamic_batching``,
``version_policy``, ``instance_group``, ``input``/``output``), which
:func:`~torchplace.serve.triton_config.triton_settings` maps.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchplace.errors import ConfigError, ModelLoadError
from torchplace.models import EMBEDDED_MODELS, TensorSpec
from torchplace.serve.config import load_config_file
from torchplace.serve.datatypes import HOST_DTYPES
from torchplace.serve.kserve import CONFIG_NAME as KSERVE_CONFIG
from torchplace.serve.loader import batch_bytes, dry_rows
from torchplace.serve.triton_config import (
    BATCHING_KEYS,
    CONFIG_NAME,
    MODEL_CONFIG_FIELDS,
    NESTED_FIELDS,
    PBTXT_NAME,
    SETTING_KEYS,
    TRITON_MODEL_FILE,
    pbtxt_settings,
    shown,
    triton_settings,
)

if TYPE_CHECKING:
    from torchplace.serve.config import ServeConfig

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
    "Notices",
    "RepositoryPollError",
    "VersionPolicy",
    "check_inline_batch",
    "check_model_name",
    "inline_config",
    "load_failed",
    "model_names",
    "read_model",
    "triton_settings",
    "unload_parameters",
]

logger = logging.getLogger(__name__)
#: Triton's words for a load whose model could not be read from the repository
POLL_FAILED = "failed to poll from model repository"
#: ServeConfig fields that config.toml names otherwise (KServe's torchplace.toml uses ours)
RENAMED = {"model": "source", "replicas_per_device": "replicas"}
_WEIGHTS = (".safetensors", ".pt", ".pth")


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
    #: the .pt/.pth files of the versions that were read to tell TorchScript archives from
    #: state dicts when the model was read, and those that are archives (each file is read once)
    examined: frozenset[Path] = frozenset()
    archives: frozenset[Path] = frozenset()

    def version_settings(self, version: str) -> dict[str, Any]:
        """The ServeConfig fields of one version (its weights or program resolved); a version
        directory that cannot be read is the model's ConfigError."""
        with _reading(f"model {self.name!r}"):
            return self._version_settings(version)

    def _version_settings(self, version: str) -> dict[str, Any]:
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
        if weights is not None and self._is_archive(Path(weights)):  # not a state dict
            settings["torchscript"], settings["weights"] = weights, None
        return settings

    def _is_archive(self, path: Path) -> bool:
        """Whether ``path`` is a TorchScript archive: as the model's read found it, or read now
        (a ``weights`` file of another suffix than .pt/.pth)."""
        if path in self.examined:
            return path in self.archives
        return path.suffix != ".safetensors" and _is_torchscript(path)

    def fingerprint(self) -> tuple[Any, ...]:
        """Changes when the config or a version directory changes (for polling). A directory
        that cannot be listed is the model's ConfigError, not one that stops the poll."""
        configs = (self.directory / CONFIG_NAME, self.directory / PBTXT_NAME)
        paths = [*configs, *(self.directory / v for v in self.versions)]
        paths = [self.directory] if self.flat else paths
        stamps: list[Any] = [self.versions]
        with _reading(f"model {self.name!r}"):
            for path in paths:
                for item in [path, *(path.iterdir() if path.is_dir() else ())]:
                    try:
                        stat = item.stat()
                    except FileNotFoundError:  # not there, or removed since it was listed
                        continue
                    stamps.append((str(item), stat.st_mtime_ns, stat.st_size))
        return tuple(stamps)


def model_names(root: Path, notices: Notices | None = None) -> list[str]:
    """The model directories of the repository, sorted: hidden ones skipped, and those whose
    name cannot be a model's (not UTF-8 text, such as a Latin-1 name unpacked from an archive:
    no index could list it), each with a warning, told once per directory of ``notices``."""
    if not root.is_dir():
        raise ConfigError(
            f"model repository {str(root)!r} is not a directory; create it with one "
            "directory per model (see docs/serve.md, 'Model repository')"
        )
    told = notices or Notices()
    names = []
    with _reading(f"model repository {str(root)!r}"):
        for path in root.iterdir():
            if not path.is_dir() or path.name.startswith("."):
                continue
            try:
                check_model_name(path.name)
            except ConfigError as exc:
                told.skipped(path, exc)
                continue
            names.append(path.name)
    return sorted(names)


@contextlib.contextmanager
def _reading(what: str) -> Iterator[None]:
    """An OSError while ``what`` is read (a directory the server may not read, a file removed
    meanwhile) as ``what``'s ConfigError: a model's error, which leaves the others loading, and
    a poll polling."""
    try:
        yield
    except OSError as exc:
        path = f"{exc.filename!r}: " if exc.filename else ""
        raise ConfigError(
            f"{what}: cannot read its directory ({path}{exc.strerror or exc}); check the "
            "repository's files and permissions"
        ) from None


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
    try:  # a directory name that is not UTF-8 is read with surrogate escapes (caf\udce9)
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(
            f"model name {shown!r} is not UTF-8 text, which a model's name must be (clients "
            "and the repository index send it as text); rename its directory in UTF-8"
        ) from None
    bad = name == "." or "\0" in name
    if bad or len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise ConfigError(
            f"model name {shown!r} is not a directory name of the repository; give the name "
            f"of one of its model directories (at most {MAX_NAME_BYTES} bytes)"
        )


class Notices:
    """What reading a repository has logged about each model directory, told once per
    directory: one per server (its :class:`~torchplace.serve.reload.ModelControl` holds it), so
    a poll every second does not repeat a warning every second."""

    def __init__(self) -> None:
        self._both: set[Path] = set()
        self._skipped: set[Path] = set()

    def skipped(self, directory: Path, why: ConfigError) -> None:
        """Log (once per directory) that it is not a model: its name cannot be one."""
        if directory in self._skipped:
            return
        self._skipped.add(directory)
        # %r: the path as Python escapes it, a name that is not UTF-8 too
        logger.warning("model repository: %r is skipped: %s", str(directory), why)

    def both_configs(self, directory: Path) -> None:
        """Log (once per directory) that its config.toml is read and its config.pbtxt is not."""
        if directory in self._both:
            return
        self._both.add(directory)
        both = f"{CONFIG_NAME} and {PBTXT_NAME}: {CONFIG_NAME} is read, {PBTXT_NAME} is not"
        logger.warning(
            "model directory %s holds both %s (remove one to silence this)", directory, both
        )


def read_model(
    root: Path,
    name: str,
    inline: Mapping[str, Any] | None = None,
    *,
    notices: Notices | None = None,
) -> ModelDir:
    """Read and check ``root/name`` (its ``config.toml``, then ``inline`` over it). What the
    read logs is told once per directory of ``notices`` (without it, at every read)."""
    check_model_name(name)
    with _reading(f"model {name!r}"):
        return _read_model(root, name, inline, notices or Notices())


def _read_model(
    root: Path, name: str, inline: Mapping[str, Any] | None, notices: Notices
) -> ModelDir:
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
        if pbtxt_file.is_file():
            notices.both_configs(directory)
    elif pbtxt_file.is_file():  # a Triton model directory
        where, data, triton = str(pbtxt_file), pbtxt_settings(pbtxt_file, name), True
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


def _checked(
    directory: Path, name: str, where: str, data: Mapping[str, Any], *, triton: bool = False
) -> ModelDir:
    unknown = sorted(set(data) - set(SETTING_KEYS))
    if unknown:
        raise _fail(where, f"field {unknown[0]!r}", "is not a setting",
                    f"use one of {', '.join(SETTING_KEYS)}")  # fmt: skip
    policy = _policy(where, data.get("version_policy", {}))
    available = _version_numbers(directory, where)
    flat = not available and bool(_model_files(directory, "*"))
    if not available and not flat:
        raise _fail(where, "model", "has no numbered version directory",
                    f"create {str(directory / '1')!r} holding the version's weights")  # fmt: skip
    folders = [directory] if flat else [directory / str(v) for v in available]
    # a TorchScript archive needs no source: each .pt/.pth is read here, once (not for a
    # config.pbtxt's model, whose files the loader checks to be archives)
    examined = [] if triton else [p for f in folders for p in _model_files(f, "*.pt*")
                                  if p.suffix != ".pt2"]  # fmt: skip
    archives = frozenset(p for p in examined if _is_torchscript(p))
    programs = any(_model_files(folder, "*.pt2") for folder in folders)
    own = triton or programs or bool(archives)
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
        _check_labels(where, "field 'labels'", files["labels"])
        settings["labels"] = str(directory / files["labels"])
    if "outputs" in settings:
        settings["outputs"] = _label_paths(where, directory, settings["outputs"])
    return ModelDir(name, directory, where, settings, files["weights"], files["exported"],
                    policy, tuple(str(v) for v in chosen), flat, triton,
                    frozenset(examined), archives)  # fmt: skip


def _label_paths(where: str, directory: Path, outputs: Any) -> Any:
    """The outputs with each ``label_filename`` (Triton's: a file in the model directory, the
    labels of that output alone) as its path; other declarations are left as they are."""
    if not isinstance(outputs, list):
        return outputs
    found: list[Any] = []
    for entry in outputs:
        name = entry.get("label_filename") if isinstance(entry, Mapping) else None
        if name is not None:
            if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name:
                raise _fail(where, f"label_filename of output {shown(str(entry.get('name')))!r}",
                            f"= {name!r} is not a file name",
                            "give the name of a file in the model directory")  # fmt: skip
            _check_labels(where, f"label_filename of output {shown(str(entry.get('name')))!r}",
                          name)  # fmt: skip
            entry = {**entry, "label_filename": str(directory / name)}
        found.append(entry)
    return found


#: files of a model directory that hold no class labels: labels naming one (a load's inline
#: config may) read it back to clients, a line a class name
_NOT_LABELS = frozenset(n.casefold() for n in (CONFIG_NAME, PBTXT_NAME, KSERVE_CONFIG))


def _check_labels(where: str, key: str, name: str) -> None:
    """Refuse class labels read from the model's configuration or a model file."""
    if name.casefold() in _NOT_LABELS or Path(name).suffix.lower() in (".pt2", *_WEIGHTS):
        raise _fail(where, key, f"= {name!r} is the model's configuration or a model file, "
                    "not class labels", "give a file of class names, one per line, such as "
                    "labels.txt")  # fmt: skip


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
        if key in BATCHING_KEYS:
            batching[key] = value
        else:
            out[RENAMED.get(key, key)] = value
    if batching:
        out["batching"] = batching
    return out


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
    for key in ("inputs", "outputs", "dtype", "devices", "dry_run_shapes"):
        if key in data:
            settings[key] = data[key]
    if RENAMED["replicas_per_device"] in data:
        settings["replicas_per_device"] = data[RENAMED["replicas_per_device"]]
    batching = data.get("batching", {})
    if not isinstance(batching, Mapping) or set(batching) - set(BATCHING_KEYS):
        raise _fail(where, "table [batching]", f"= {batching!r} is not understood",
                    f"give only {', '.join(BATCHING_KEYS)}")  # fmt: skip
    settings.update(batching)
    return settings


#: the ranges of the version policy's numbers: what Triton's ModelVersionPolicy fields hold
#: (``latest.num_versions`` uint32, ``specific.versions`` int64), as the model's configuration
#: document states the policy (past them, its gRPC ModelConfig and ModelMetadata failed)
_MOST_LATEST = 2**32 - 1
_MOST_VERSION = 2**63 - 1


def _policy(where: str, raw: Any) -> VersionPolicy:
    fix = "write latest = N, all = true, or specific = [1, 3] under [version_policy]"
    if not isinstance(raw, Mapping) or len(raw) > 1:
        raise _fail(where, "[version_policy]", f"= {raw!r} is not one policy", fix)
    if not raw:
        return VersionPolicy()
    ((kind, value),) = raw.items()
    if kind == "latest" and _number(value, 1, _MOST_LATEST):
        return VersionPolicy("latest", value)
    if kind == "all" and value is True:
        return VersionPolicy("all")
    if (
        kind == "specific"
        and isinstance(value, list)
        and value
        and all(_number(v, 0, _MOST_VERSION) for v in value)
    ):
        return VersionPolicy("specific", versions=tuple(value))
    shown_value = repr(value) if len(repr(value)) <= 80 else f"{repr(value)[:80]}..."
    ranges = f"latest in 1..{_MOST_LATEST:,}; specific versions in 0..{_MOST_VERSION:,}"
    raise _fail(where, f"version_policy.{kind}", f"= {shown_value} is invalid ({ranges})", fix)


def _number(value: object, least: int, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= most


def _check_inline_batch(settings: Mapping[str, Any]) -> None:
    """An inline config's batch within :data:`MAX_INLINE_BATCH_ROWS` rows and, with the
    tensors it declares at their dry-run rows, :data:`MAX_INLINE_BATCH_BYTES`, as far as the
    config alone tells (its own rows, else 1): refused before the model is read.
    :func:`check_inline_batch` checks the whole batch once the model's settings are known."""
    batching = settings.get("batching")
    rows = batching.get("max_batch_size") if isinstance(batching, Mapping) else None
    if type(rows) is int and rows > MAX_INLINE_BATCH_ROWS:
        raise ConfigError(
            f"an inline config may ask for batches of at most {MAX_INLINE_BATCH_ROWS} rows, "
            f"not {rows}: every replica holds a whole batch; {_BIGGER}"
        )
    inputs, outputs = (_declared(settings.get(key)) for key in ("inputs", "outputs"))
    shapes = settings.get("dry_run_shapes")
    given = shapes if isinstance(shapes, Mapping) else {}
    dry = {s.name: tuple(given[s.name]) for s in inputs if _dims(given.get(s.name))}
    _check_batch_bytes(rows if type(rows) is int and rows > 0 else 1, inputs, outputs, dry)


#: what an inline config's batch limits tell the client to do instead
_BIGGER = f"set a larger batch in the model's {CONFIG_NAME}"
#: the settings by which an inline config changes the batch a load dry-runs
_BATCH_KEYS = frozenset(
    {"source", "inputs", "outputs", "dry_run_shapes", "max_batch_size", "unbatched"}
)


def check_inline_batch(inline: Mapping[str, Any], config: ServeConfig) -> None:
    """Refuse (ConfigError) a load whose ``inline`` config makes a batch of more than
    :data:`MAX_INLINE_BATCH_BYTES`, before anything is allocated. ``config`` is the version's
    settings with it: the rows are its ``max_batch_size`` (the inline config's, the file's or
    the server's), each input at the row shape its dry run gets (``dry_run_shapes``, a
    ``model_warmup``'s dims), as every replica stages and dry-runs that batch before the load
    can fail. Checked when the inline config shapes the batch (its tensors, dry-run shapes or
    rows); an input the model declares only once built (a factory's) counts at 8 bytes an
    element (the widest datatype) when the config gives its dry-run shape."""
    batching = inline.get("batching")
    keys = set(inline) | (set(batching) if isinstance(batching, Mapping) else set())
    if not keys & _BATCH_KEYS:
        return
    own = None if config.exported or config.torchscript else EMBEDDED_MODELS.get(config.model)
    inputs = config.inputs or (own.inputs if own else ())
    outputs = config.outputs or (own.outputs if own else ())
    given = dict(config.dry_run_shapes or {})
    if not inputs:  # the datatypes are the model's, known once it is built
        inputs = tuple(TensorSpec(name, "FP64", (-1, *shape)) for name, shape in given.items())
    dry = dry_rows(inputs, given, config.name or config.model)  # its errors, before the build
    _check_batch_bytes(config.max_batch_size, inputs, outputs, dry)


def _check_batch_bytes(
    rows: int,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    dry: Mapping[str, tuple[int, ...]],
) -> None:
    size = batch_bytes(rows, inputs, outputs, dry)
    if size > MAX_INLINE_BATCH_BYTES:
        raise ConfigError(
            f"an inline config's batch would stage {size:,} bytes ({size // rows:,} a row of "
            f"its tensors at their dry-run shapes, {rows:,} rows), over the "
            f"{MAX_INLINE_BATCH_BYTES:,} an inline config may ask for; send fewer rows, "
            f"smaller dims or a smaller model_warmup, or {_BIGGER}"
        )


def _declared(value: object) -> list[TensorSpec]:
    """The tensor declarations of an inline config's ``inputs``/``outputs`` that are tables
    of a known datatype and integer dims (Triton's, as mapped); the rest fail their load."""
    found = []
    for entry in value if isinstance(value, list) else ():
        if not isinstance(entry, Mapping) or str(entry.get("datatype")) not in HOST_DTYPES:
            continue
        shape = entry.get("shape")
        if isinstance(shape, list) and all(type(d) is int for d in shape):
            found.append(TensorSpec(str(entry.get("name")), str(entry["datatype"]), tuple(shape)))
    return found


def _dims(value: object) -> bool:
    """A dry-run row shape: a list of sizes >= 1 (another is refused when the model loads)."""
    return isinstance(value, list | tuple) and all(type(d) is int and d >= 1 for d in value)


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
            f"unrecognized load parameter {shown(str(unknown[0]))!r}; a load takes 'config' "
            "(the model configuration as a JSON string) and no other parameter"
        )
    too_long = [k for k in files if any(len(p.encode()) > MAX_NAME_BYTES for p in k[5:].split("/"))]
    if too_long:  # a path no file system takes: Triton fails its poll (500, gRPC INTERNAL)
        path = too_long[0] if len(too_long[0]) <= 80 else f"{too_long[0][:80]}..."
        raise RepositoryPollError(
            f"{POLL_FAILED}: load parameter {path!r} names a path "
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
            f"invalid value type for load parameter 'config': {shown(sent)}; send the model "
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
            f"{shown(json.dumps(value))}; send true or false"
        )
