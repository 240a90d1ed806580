"""Triton's model configuration (``ModelConfig``, model_config.proto) read as a repository model's
settings: a model directory's ``config.pbtxt`` (protobuf text format, Triton's PyTorch backend)
and a load request's inline config (``parameters.config``, JSON: our ``config.toml`` keys, or
Triton's ``ModelConfig``). Each field is checked against the proto (a typo is refused, not left
unread) and mapped: ``max_batch_size`` and ``dynamic_batching`` (delay, priority levels, queue
policies) onto the batching settings, ``version_policy`` onto ours, ``instance_group`` onto the
replicas per device and the devices, ``input``/``output`` onto tensor declarations (``dims``
without the batch dimension, ``-1`` a variable one; a ``reshape`` the shape the model takes or
returns, checked as Triton checks it), an output's ``label_filename`` onto that output's labels.
An input's ``optional: true`` is refused, as Triton's PyTorch backend refuses it; so is what
makes Triton hand the model tensors no request holds (``sequence_batching``'s control inputs and
state, ragged batching), which this server would leave out of the forward's arguments.

An error names where the configuration came from (``inline config``, or the file), the field
and the fix (:class:`~torchplace.errors.ConfigError`). :mod:`torchplace.serve.repository` reads
the model directories with it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchplace.errors import ConfigError
from torchplace.serve.config import MAX_PRIORITY_LEVELS, MAX_QUEUE

__all__ = [
    "BATCHING_KEYS",
    "CONFIG_NAME",
    "INLINE",
    "MODEL_CONFIG_FIELDS",
    "NESTED_FIELDS",
    "PBTXT_NAME",
    "SETTING_KEYS",
    "TRITON_MODEL_FILE",
    "pbtxt_settings",
    "reshape_problem",
    "shown",
    "triton_settings",
]

#: a model directory's own configuration (torchplace's keys, TOML)
CONFIG_NAME = "config.toml"
#: a Triton model directory's configuration (protobuf text format ``ModelConfig``), read
#: when the directory has no ``config.toml``
PBTXT_NAME = "config.pbtxt"
#: the name of a Triton PyTorch model's file in each version directory, by default
TRITON_MODEL_FILE = "model.pt"
#: where a load request's configuration came from, as its errors name it
INLINE = "inline config"
#: the keys of a ``config.toml`` (an inline config may give them too)
SETTING_KEYS = ("source", "weights", "exported", "labels", "inputs", "outputs", "dtype",
                "devices", "replicas", "batching", "version_policy", "dry_run_shapes")  # fmt: skip
#: the keys of its ``[batching]`` table
BATCHING_KEYS = ("max_batch_size", "max_delay_ms", "max_queue", "priority_levels",
                 "default_priority", "priority_queue_limits", "default_timeout_ms",
                 "unbatched")  # fmt: skip
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
            f"{shown(json.dumps(doc))}"
        )
    return _Reader(INLINE).mapped(doc, model)


#: the PyTorch backend, as a config.pbtxt names it (Triton's platform or backend field)
_PYTORCH = {"platform": "pytorch_libtorch", "backend": "pytorch"}
_PBTXT_FIX = (
    "write it in Triton's protobuf text format for ModelConfig (model_config.proto), e.g. "
    'platform: "pytorch_libtorch" max_batch_size: 8 input [{name: "INPUT__0", data_type: '
    "TYPE_FP32, dims: [8]}]"
)


def pbtxt_settings(path: Path, name: str) -> dict[str, Any]:
    """A Triton model directory's ``config.pbtxt`` in the repository's terms: parsed into
    ``ModelConfig``, checked to be the PyTorch backend's, and mapped as an inline config's
    Triton JSON is (:meth:`_Reader.mapped`); each version's file is ``default_model_filename``."""
    message = _parse_pbtxt(path)  # first: it says what to install when protobuf is missing
    from google.protobuf import json_format

    where = str(path)
    _check_pytorch(message, where, name)
    filename = message.default_model_filename or TRITON_MODEL_FILE
    if "/" in filename or "\\" in filename or filename in (".", ".."):
        raise ConfigError(
            f"{where}: default_model_filename {filename!r} is not a file name; give the name "
            f"of the TorchScript archive inside each version directory (default "
            f"{TRITON_MODEL_FILE!r})"
        )
    doc = json_format.MessageToDict(message, preserving_proto_field_name=True)
    doc.setdefault("max_batch_size", 0)  # left out when 0: Triton's no batching
    settings = _Reader(where).mapped(doc, name)
    # the file's delay is Triton's, 0 when not given (MessageToDict leaves a 0 out): with
    # ``dynamic_batching {}``, or none, Triton runs what is queued without waiting for more,
    # where the server's --max-delay-ms would hold every request up to fill a batch
    delay = message.dynamic_batching.max_queue_delay_microseconds
    settings.setdefault("batching", {}).setdefault("max_delay_ms", delay / 1000)
    return {**settings, "weights": filename}


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


def reshape_problem(dims: Sequence[int], reshape: Sequence[int]) -> str | None:
    """Why ``reshape`` cannot stand for ``dims`` (one row, the batch dimension left out), in
    the words of Triton's check of a model's ``reshape`` (``... has different size for dims and
    reshape``), or None when it can: both of one element count, ``[]`` standing for a single
    element, and with variable dimensions (``-1``), as many of them in each and the fixed
    dimensions between them of one element count (``[2, 4, -1, 6]`` as ``[8, -1, 1, 6]``)."""
    if any(d < 1 and d != -1 for d in reshape):
        return (
            f"reshape dimensions must be integer >= 1, or -1 to indicate a variable-size "
            f"dimension (reshape {list(reshape)})"
        )
    chunks = [_chunks(dims), _chunks(reshape)]
    if len(chunks[0]) != len(chunks[1]):
        return (
            f"has different number of variable-size dimensions for dims and reshape (dims "
            f"{list(dims)}, reshape {list(reshape)})"
        )
    if chunks[0] != chunks[1] and not (list(reshape) == [] and chunks[0] == [1]):
        return (
            f"has different size for dims and reshape (dims {list(dims)}, reshape "
            f"{list(reshape)}: {' x '.join(map(str, chunks[0]))} elements against "
            f"{' x '.join(map(str, chunks[1]))})"
        )
    return None


def _chunks(shape: Sequence[int]) -> list[int]:
    """The element counts of the runs of fixed dimensions between the variable ones (``-1``)."""
    counts = [1]
    for dim in shape:
        if dim == -1:
            counts.append(1)
        else:
            counts[-1] *= dim
    return counts


def _cut(text: str, most: int = 300) -> str:
    """A parse error as a message quotes it: protobuf quotes the whole token it stopped at,
    which may be a line megabytes long (it went into the index and every log line)."""
    return text if len(text) <= most else f"{text[:most]}... ({len(text):,} characters)"


def _check_pytorch(message: Any, where: str, name: str) -> None:
    """Refuse a config.pbtxt of another backend than PyTorch's (or of its Python runtime),
    naming it. Neither platform nor backend given is taken as PyTorch (Triton picks the
    backend from the model file's name)."""
    if message.platform == "torch_aoti":  # the PyTorch backend's, but not TorchScript
        raise ConfigError(
            f"{where}: model {name!r} is an AOTInductor package (platform: 'torch_aoti', a "
            "model.pt2 from torch._inductor.aoti_compile_and_package), which torchplace does not "
            "load; save the model as a TorchScript archive (torch.jit.save) named model.pt with "
            'platform: "pytorch_libtorch", or save its torch.export program (torch.export.save) '
            f'in each version directory with a {CONFIG_NAME} (exported = "model.pt2"), or serve '
            "it with Triton"
        )
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


#: ``ModelConfig`` maps whose keys are the user's own, not field names
_FREE_MAPS = frozenset({"parameters", "metric_tags", "cc_model_filenames", "inputs"})


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


def shown(text: str) -> str:
    """A value a client sent, as a message quotes it: cut past 80 characters."""
    return text if len(text) <= 80 else f"{text[:80]}... ({len(text)} characters)"


#: what Triton's sequence batcher gives a model through each field, as errors name it
_SEQUENCE_TENSORS = {
    "control_input": "sequence control tensors (START, END, READY, CORRID)",
    "state": "implicit state tensors",
}
#: ``ModelInstanceGroup.Kind``'s names, by their numbers (protobuf's JSON takes either)
_KINDS = ("KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL")


class _Reader:
    """Maps one ``ModelConfig`` document onto our settings; every error it raises names where
    the document came from (``origin``: ``inline config``, or the config.pbtxt's path)."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def error(self, text: str) -> ConfigError:
        """``text`` (a field's problem and its fix) as this document's error."""
        return ConfigError(f"{self.origin}: {text}")

    def check_text(self, doc: dict[str, Any]) -> None:
        """Every string of the document is text: a lone surrogate escape (``\\udc00``, half of
        a pair) read as one failed deep in the load, with a codec's words."""
        try:
            json.dumps(doc, ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            raise ConfigError(
                f"{self.origin} holds a lone surrogate escape (\\u{ord(exc.object[exc.start]):x}, "
                "half of a UTF-16 pair), which is not text; send names and values as UTF-8 text"
            ) from None

    def mapped(self, doc: dict[str, Any], model: str | None) -> dict[str, Any]:
        """The core of :func:`triton_settings`: a ``ModelConfig`` document (or ours) mapped onto
        our settings; also what a Triton model directory's ``config.pbtxt`` is read with."""
        self.check_text(doc)
        doc = _protobuf_names(doc)
        self.check_fields(doc)
        self.check_nested(doc)
        self.check_name(doc.get("name"), model)
        self.check_extra_tensors(doc)
        out: dict[str, Any] = {k: v for k, v in doc.items() if k in SETTING_KEYS}
        batching: dict[str, Any] = dict(self.mapping(out.pop("batching", {}), "batching"))
        if "max_batch_size" in doc:
            batching["max_batch_size"] = self.integer(doc["max_batch_size"], "max_batch_size")
            if batching["max_batch_size"] < 0:  # Triton's words
                raise self.error(
                    f"'max_batch_size' must be non-negative value (max_batch_size "
                    f"{batching['max_batch_size']}); give the most rows a batch may hold, or 0 "
                    "for a model that takes no batch dimension"
                )
        if batching.get("max_batch_size") == 0:  # Triton's no batching: dims are the whole shape
            batching.update(max_batch_size=1, unbatched=True)
        dynamic = self.mapping(doc.get("dynamic_batching", {}), "dynamic_batching")
        delay = dynamic.get("max_queue_delay_microseconds")
        if delay is not None:
            where = "dynamic_batching.max_queue_delay_microseconds"
            batching["max_delay_ms"] = self.integer(delay, where) / 1000
        batching.update(self.queue_settings(dynamic))
        if batching:
            out["batching"] = batching
        policy = self.mapping(doc.get("version_policy", {}), "version_policy")
        if any(isinstance(v, dict) for v in policy.values()):
            out["version_policy"] = self.triton_policy(policy)  # Triton's {"latest": {...}} shape
        groups = self.array(doc.get("instance_group", []), "instance_group")
        if groups:
            out.update(self.instance_groups(groups))
        for ours, theirs in (("inputs", "input"), ("outputs", "output")):
            if theirs in doc:
                unbatched = bool(batching.get("unbatched"))
                out[ours] = [self.tensor(t, f"{theirs}[{i}]", unbatched)
                             for i, t in enumerate(self.array(doc[theirs], theirs))]  # fmt: skip
        warmup = self.array(doc.get("model_warmup", []), "model_warmup")
        if warmup:
            out["dry_run_shapes"] = self.warmup_shapes(warmup[0])
        parameters = self.mapping(doc.get("parameters", {}), "parameters")
        source = self.mapping(parameters.get("source", {}), "parameters.source")
        if "string_value" in source:
            out["source"] = source["string_value"]
        return out

    def warmup_shapes(self, sample: Any) -> dict[str, list[int]]:
        """The row shapes of ``model_warmup``'s first sample, by input: what the start-up dry
        runs give inputs with variable dimensions (its data, zeros or random, is not read)."""
        inputs = self.mapping(self.mapping(sample, "model_warmup[0]").get("inputs", {}),
                              "model_warmup[0].inputs")  # fmt: skip
        shapes: dict[str, list[int]] = {}
        for name, tensor in inputs.items():
            where = f"model_warmup[0].inputs[{name!r}].dims"
            dims = self.array(self.mapping(tensor, where).get("dims", []), where)
            shapes[str(name)] = [self.integer(d, where) for d in dims]
        return shapes

    def check_extra_tensors(self, doc: Mapping[str, Any]) -> None:
        """Refuse what makes Triton's PyTorch backend hand the model tensors, or batches, that no
        request holds: ``sequence_batching``'s ``control_input`` and ``state`` (the sequence
        batcher's start, end, ready and correlation-ID flags and the implicit state, each a
        forward argument), ``batch_input`` (element counts and shapes of the batch, each a
        forward argument), ``batch_output`` and an input's ``allow_ragged_batch`` (rows of
        different lengths concatenated into one dimension). Taken and not read, they loaded a
        model whose forward was called without those arguments, or on rows it did not expect.
        So are what asks for another way of running it than one answer per request from one
        PyTorch model: ``ensemble_scheduling`` and a decoupled transaction policy."""
        sequence = doc.get("sequence_batching")
        if isinstance(sequence, Mapping):
            for field in ("control_input", "state"):
                if sequence.get(field):
                    raise self.error(
                        f"sequence_batching.{field} is not served: Triton's sequence batcher "
                        f"gives the model its {_SEQUENCE_TENSORS[field]} as forward arguments, "
                        "and this server has no sequence batcher (each request is batched on "
                        "its own, whatever its sequence_id); serve the model with Triton, or "
                        f"remove sequence_batching and take the {_SEQUENCE_TENSORS[field]} as "
                        "inputs the clients send"
                    )
        if doc.get("ensemble_scheduling"):  # Triton's words
            name = doc.get("name")
            raise self.error(
                "ensemble scheduling cannot be set for model"
                f"{f' {shown(name)!r}' if isinstance(name, str) and name else ''} "
                "whose platform is not ensemble: this server serves the PyTorch model of the "
                "directory and runs no ensembles; remove ensemble_scheduling, or chain the "
                "models in one module (or serve the ensemble with Triton)"
            )
        policy = doc.get("model_transaction_policy")
        if isinstance(policy, Mapping) and policy.get("decoupled") is True:
            raise self.error(
                "model_transaction_policy.decoupled is not served: a decoupled model answers a "
                "request with any number of responses (Triton's Python backend), where this "
                "server answers each request once with the model's outputs; remove it, or "
                "serve the model with Triton"
            )
        for field in ("batch_input", "batch_output"):
            if doc.get(field):
                raise self.error(
                    f"{field} is not served: Triton's ragged batching gives the model tensors "
                    "about the batch (element counts, shapes) that this server does not make; "
                    f"remove {field} (and allow_ragged_batch) and have the model take rows of "
                    "one shape per batch, or serve it with Triton"
                )
        inputs = doc.get("input")
        for i, item in enumerate(inputs if isinstance(inputs, list) else ()):
            if isinstance(item, Mapping) and item.get("allow_ragged_batch") is True:
                raise self.error(
                    f"input[{i}].allow_ragged_batch is not served: Triton concatenates the "
                    "rows of a ragged batch into one dimension, where this server gives the "
                    "model a batch of rows of one shape (a -1 dimension of one size per "
                    "batch); remove allow_ragged_batch, or serve the model with Triton"
                )

    def check_fields(self, doc: Mapping[str, Any]) -> None:
        """Every field of the document ours or ``ModelConfig``'s: one that is neither (a typo)
        would not be read, and the load would go on without it."""
        for key in doc:
            if key in SETTING_KEYS or key in MODEL_CONFIG_FIELDS:
                continue
            fix = (
                "give ModelConfig's fields (max_batch_size, dynamic_batching, version_policy, "
                f"instance_group, input, output...) or torchplace's ({', '.join(SETTING_KEYS)})"
            )
            raise self.error(
                f"field {shown(key)!r} is neither a field of Triton's ModelConfig "
                f"nor a torchplace setting; {fix}"
            )

    def check_nested(self, doc: Mapping[str, Any]) -> None:
        """The fields of the messages that the document's ``dynamic_batching``,
        ``instance_group``, ``input``, ``output`` and ``version_policy`` (Triton's shape) hold are
        theirs: a typo in one (``max_queue_delay_microsecond``, ``cout``, ``num_version``, a
        policy ``lattest``) was not read, and the load went on without it (the policy as ``all``).
        A field of the wrong type is left to the mapping, which names it."""
        batching = doc.get("dynamic_batching")
        if isinstance(batching, Mapping):
            self.check_message(batching, "dynamic_batching")
        policy = doc.get("version_policy")
        # a policy in our shape ({"latest": 2}) is checked as config.toml's
        if isinstance(policy, Mapping) and any(isinstance(v, Mapping) for v in policy.values()):
            self.check_message(policy, "version_policy")  # so each kind is latest, all or specific
            for kind, inner in policy.items():
                if isinstance(inner, Mapping):
                    self.check_message(inner, f"version_policy.{kind}")
        for key in ("instance_group", "input", "output"):
            value = doc.get(key)
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, Mapping):
                        self.check_message(item, key, f"{key}[{i}]")

    def check_message(self, value: Mapping[str, Any], kind: str, where: str | None = None) -> None:
        """Refuse a key of ``value`` that is not a field of the ``NESTED_FIELDS[kind]`` message."""
        fields = NESTED_FIELDS[kind]
        for key in value:
            if key in fields:
                continue
            names = ", ".join(sorted(fields)) if fields else "none: send it as {}"
            raise self.error(
                f"field {shown(str(key))!r} of {where or kind} is not a field of "
                f"Triton's ModelConfig there; its fields are {names}"
            )

    def check_name(self, name: object, model: str | None) -> None:
        """The document's ``name`` (if any) is the loaded model's: Triton refuses another."""
        if name is None:
            return
        if not isinstance(name, str):
            raise self.error(
                f"name must be a string, not {shown(json.dumps(name))}; give the "
                "model's name or leave it out"
            )
        if name and model is not None and name != model:
            # Triton's words: a load's answer says "failed to load 'm': unexpected ...", a
            # config.pbtxt's error names the file first
            origin = "" if self.origin == INLINE else f"{self.origin}: "
            raise ConfigError(
                f"{origin}unexpected directory name {model!r} for model {shown(name)!r}, "
                f'directory name must equal model name; send the config with "name": {json.dumps(model)} or '
                "without a name"
            )

    def tensor(self, raw: object, where: str, unbatched: bool = False) -> dict[str, Any]:
        """One of Triton's ``input``/``output`` entries as our tensor declaration: the batch
        dimension (implicit in ``dims``, as with Triton's ``max_batch_size > 0``) first, then
        ``dims``, where ``-1`` is a variable dimension (each request gives its size; the
        engine stages such an input per batch). A ``reshape`` (the model's shape of a row,
        checked against ``dims`` as Triton checks it; an empty one is refused in a model
        without batching, ``unbatched``, whose tensor it would make a scalar) and an output's
        ``label_filename`` go with it; an input's ``optional: true`` is refused (see
        :meth:`check_optional`)."""
        tensor = self.mapping(raw, where)
        # an empty string is protobuf's default, no value: Triton's "must specify 'name'"
        missing = [f for f in ("name", "data_type") if not isinstance(tensor.get(f), str)
                   or not tensor[f]]  # fmt: skip
        if missing:
            raise self.error(
                f"{where} needs a 'name' and a 'data_type' string (it has no {missing[0]} "
                f"string), as Triton's 'must specify {missing[0]!r}' says; give both, e.g. "
                'name: "INPUT__0" data_type: TYPE_FP32 (Triton\'s PyTorch backend does not '
                "fill them in from the model)"
            )
        self.check_optional(tensor, where)
        if tensor["data_type"] == "TYPE_STRING":
            raise self.error(
                f"{where}.data_type {tensor['data_type']} (the protocol's BYTES: strings) is not "
                f"served for {shown(tensor['name'])!r}: this server's models take and return "
                "numeric torch tensors, where Triton's PyTorch backend passes strings as a "
                "List[str]; encode the strings as numbers outside the model (token ids as "
                "TYPE_INT64, UTF-8 bytes as TYPE_UINT8 with dims: [ -1 ]) and declare that "
                "data_type, or serve the model with Triton"
            )
        dims = [
            self.integer(d, f"{where}.dims")
            for d in self.array(tensor.get("dims", []), f"{where}.dims")
        ]
        if any(d < -1 for d in dims):
            raise self.error(
                f"{where}.dims {dims} has a dimension below -1; give each dimension its size, "
                "or -1 for a variable one (the batch dimension is implicit: leave it out)"
            )
        # how Triton's messages name the tensor: "model input 'x' ..."
        named = f"{where}: model {'input' if where.startswith('input') else 'output'} "
        named += repr(shown(tensor["name"]))
        if 0 in dims:  # Triton's words
            raise self.error(
                f"{named} dimension must be integer >= 1, "
                f"or -1 to indicate a variable-size dimension (dims {dims}); a tensor with a "
                "dimension of 0 holds no values: give each dimension its size, or -1"
            )
        datatype = tensor["data_type"].removeprefix("TYPE_")
        out: dict[str, Any] = {"name": tensor["name"], "datatype": datatype, "shape": [-1, *dims]}
        reshape = tensor.get("reshape")
        if reshape is not None:
            shape = self.mapping(reshape, f"{where}.reshape").get("shape", [])
            shape = [
                self.integer(d, f"{where}.reshape.shape")
                for d in self.array(shape, f"{where}.reshape.shape")
            ]
            if unbatched and not shape:  # Triton's words
                raise self.error(
                    f"{named} cannot have empty reshape for non-batching model as scalar tensors "
                    "are not supported; give reshape.shape the model's whole shape (such as "
                    "[ 1 ]), or leave reshape out"
                )
            problem = reshape_problem(dims, shape)
            if problem is not None:  # Triton's words: "model input 'x' has different size ..."
                raise self.error(
                    f"{named} {problem}; give "
                    "reshape.shape the model's shape of one row, with as many elements as dims "
                    "(the batch dimension left out of both)"
                )
            out["reshape"] = shape
        label = tensor.get("label_filename")
        if label:  # protobuf's default, "", is no file
            if not isinstance(label, str):
                raise self.error(
                    f"{where}.label_filename must be a file name, not {shown(json.dumps(label))}"
                )
            out["label_filename"] = label
        return out

    def check_optional(self, tensor: Mapping[str, Any], where: str) -> None:
        """Refuse ``optional: true`` on an input, as Triton's PyTorch backend does: a TorchScript
        forward takes its inputs positionally, and a batch of requests that left an input out
        and requests that sent it has no one tensor to give it."""
        optional = tensor.get("optional", False)
        if optional is False:
            return
        if optional is not True:
            raise self.error(
                f"{where}.optional must be true or false, not {shown(json.dumps(optional))}"
            )
        name = shown(str(tensor["name"]))
        raise self.error(
            f"'optional' is set to true for input {name!r} while the backend model doesn't "
            "support optional input (Triton's PyTorch backend refuses it too); remove "
            "optional and have clients send the input every time (a value the model takes as "
            "'not given', such as zeros, where they have none), or serve the model with and "
            "without the input as two models"
        )

    def queue_settings(self, dynamic: Mapping[str, Any]) -> dict[str, Any]:
        """``dynamic_batching``'s queue as our settings: ``priority_levels``, the
        ``default_priority_level``, and the queue policies (``max_queue_size`` per level, the
        default timeout). Triton's 0 (no limit, no level, no timeout) leaves the server's own."""
        where = "dynamic_batching"
        out: dict[str, Any] = {}
        for theirs, ours in (("priority_levels", "priority_levels"),
                             ("default_priority_level", "default_priority")):  # fmt: skip
            if dynamic.get(theirs) is not None and (
                n := self.integer(dynamic[theirs], f"{where}.{theirs}")
            ):
                if n > MAX_PRIORITY_LEVELS:  # before a loop over the levels, not after
                    raise self.error(
                        f"{where}.{theirs} {n} is past the {MAX_PRIORITY_LEVELS} "
                        "priority levels a queue may have; give a level count (or level) of at "
                        f"most {MAX_PRIORITY_LEVELS}"
                    )
                out[ours] = n
        levels_given, default = out.get("priority_levels"), out.get("default_priority")
        if dynamic.get("preserve_ordering") is True and (levels_given or 0) > 1:
            raise self.error(  # Triton's words
                f"Only one priority level is allowed when 'preserve_ordering' is true "
                f"({where}.priority_levels {levels_given}); drop preserve_ordering or the "
                "priority levels"
            )
        if levels_given and (default is None or default > levels_given):
            # Triton's check: proto3 cannot tell a 0 from a level not given, and neither is one
            raise self.error(
                f"{where}.default_priority_level {default or 0}: default priority level must "
                f"be in range [1, {levels_given}] ({where}.priority_levels); give a level in "
                f"1..{levels_given} (1 is served first) to the requests that name none"
            )
        size, timeout = self.queue_policy(
            dynamic.get("default_queue_policy"), f"{where}.default_queue_policy"
        )
        if size:
            out["max_queue"] = size
        if timeout is not None:
            out["default_timeout_ms"] = timeout / 1000
        levels = self.mapping(
            dynamic.get("priority_queue_policy", {}), f"{where}.priority_queue_policy"
        )
        if levels:
            limits = self.level_limits(levels, out.get("priority_levels"), size, timeout)
            if limits is not None:
                out["priority_queue_limits"] = limits
        return out

    def queue_policy(self, raw: object, where: str) -> tuple[int | None, int | None]:
        """A ``ModelQueuePolicy``'s ``max_queue_size`` (None for 0, no limit) and
        ``default_timeout_microseconds``; a ``timeout_action`` other than ``REJECT`` is refused."""
        if raw is None:
            return None, None
        policy = self.mapping(raw, where)
        self.check_message(policy, "queue_policy", where)
        action = policy.get("timeout_action", "REJECT")
        if action not in ("REJECT", 0):
            raise self.error(
                f"{where}.timeout_action {shown(str(action))!r} is not served: a "
                "request still queued at its timeout is refused (REJECT); drop timeout_action, or "
                "give REJECT"
            )
        size = self.integer(policy.get("max_queue_size", 0), f"{where}.max_queue_size")
        if size > MAX_QUEUE:  # the model's document states it: its gRPC ModelConfig failed
            raise self.error(
                f"{where}.max_queue_size {size} is past the {MAX_QUEUE:,} that the field "
                "(uint32) holds; give a queue size of at most that (0: the server's --max-queue)"
            )
        timeout = policy.get("default_timeout_microseconds")
        micros = (
            None
            if timeout is None
            else self.integer(timeout, f"{where}.default_timeout_microseconds")
        )
        return size or None, micros

    def level_limits(
        self, levels: Mapping[str, Any], count: int | None, size: int | None, timeout: int | None
    ) -> list[int] | None:
        """``priority_queue_policy`` (a policy per level) as one queue limit per level, level 1
        first: a level without one takes the default policy's. None where no level has one,
        nor the default policy (Triton's 0 everywhere, no limit): every level takes the
        server's ``--max-queue``, as without ``priority_queue_policy``."""
        where = "dynamic_batching.priority_queue_policy"
        if not count:
            raise self.error(
                f"{where} needs dynamic_batching.priority_levels, the number of levels"
            )
        named = {str(n) for n in range(1, count + 1)}
        stray = sorted(str(k) for k in levels if str(k) not in named)
        if stray:
            raise self.error(
                f"{where} names level {shown(stray[0])}, not one of 1..{count} "
                "(dynamic_batching.priority_levels)"
            )
        found: list[int | None] = []
        for level in range(1, count + 1):
            raw = levels.get(str(level))
            own, own_timeout = self.queue_policy(raw, f"{where}[{level}]")
            if own_timeout is not None and own_timeout != (timeout or 0):
                raise self.error(
                    f"{where}[{level}] has its own default_timeout_microseconds "
                    f"({own_timeout}); this server has one default timeout for every level: "
                    "give it in default_queue_policy"
                )
            found.append(own or size)
        if all(limit is None for limit in found):
            return None
        limits: list[int] = []
        for level, limit in enumerate(found, start=1):
            if limit is None:
                raise self.error(
                    f"level {level} has no max_queue_size in {where} nor in "
                    "dynamic_batching.default_queue_policy (Triton's no limit) while another "
                    "level has one; this server keeps a limit per level: give it in one of them"
                )
            limits.append(limit)
        return limits

    def instance_groups(self, groups: list[Any]) -> dict[str, Any]:
        """Triton's instance groups as ``replicas`` (per device) and ``devices``: ``KIND_CPU`` the
        CPU; ``KIND_GPU`` (and ``KIND_AUTO`` naming ``gpus``) its ``gpus``, every GPU when it names
        none, as in Triton; ``KIND_AUTO`` and ``KIND_MODEL`` the server's own devices (no
        ``devices``). A ``passive`` group, which takes no requests from the scheduler (the CPU
        fallback that ``get_model_config`` lists), is the server's ``--fallback``, not a device.
        Groups that place instances on the same device add up there, as in Triton (each
        group makes its ``count`` instances on each of its devices); every device must then
        hold the same number, the replicas per device here."""
        counts: set[int] = set()
        devices: list[str] = []
        per_device: dict[str, int] = {}
        own, own_count = False, 0  # groups on the server's own devices, their instances
        for i, raw in enumerate(groups):
            where = f"instance_group[{i}]"
            group = self.mapping(raw, where)
            if group.get("passive") is True:
                continue
            count = self.integer(group.get("count", 1), f"{where}.count")
            counts.add(count)
            placed = self.group_devices(group, where)
            if placed is None:
                own, own_count = True, own_count + count
                continue
            devices += placed
            for device in placed:
                per_device[device] = per_device.get(device, 0) + count
        if own and devices:
            raise self.error(
                f"instance_group mixes groups on the server's own devices "
                "(KIND_AUTO without gpus, KIND_MODEL) with groups that name theirs "
                f"({', '.join(devices)}); give every group its kind (KIND_GPU with gpus, KIND_CPU)"
            )
        totals = set(per_device.values()) or {own_count}
        if len(totals) > 1:  # replicas are per device: 1 on one GPU and 2 on another cannot hold
            listed = ", ".join(f"{d}: {n}" for d, n in per_device.items())
            raise self.error(
                f"instance_group places different numbers of instances on its devices "
                f"({listed}); this server places the same number of replicas on each of the "
                "model's devices: give each device one group, of one count"
            )
        out: dict[str, Any] = {"replicas": totals.pop()} if counts else {}
        if devices:
            out["devices"] = list(dict.fromkeys(devices))
        return out

    def group_devices(self, group: Mapping[str, Any], where: str) -> list[str] | None:
        """One instance group's devices by its ``kind`` and ``gpus`` (see :meth:`instance_groups`);
        None for the server's own (``KIND_AUTO`` without ``gpus``, ``KIND_MODEL``)."""
        kind = group.get("kind", "KIND_AUTO")
        if type(kind) is int and 0 <= kind < len(_KINDS):
            kind = _KINDS[kind]
        if kind not in _KINDS:
            raise self.error(f"{where}.kind {shown(str(kind))!r} is not one of {', '.join(_KINDS)}")
        gpus = [
            self.integer(g, f"{where}.gpus")
            for g in self.array(group.get("gpus", []), f"{where}.gpus")
        ]
        if any(g < 0 for g in gpus):  # Triton's words, naming the field
            raise self.error(
                f"{where}.gpus {gpus} specifies invalid or unsupported gpu id "
                f"{min(gpus)}; give the index of a CUDA device (0, 1...)"
            )
        if gpus and kind in ("KIND_CPU", "KIND_MODEL"):
            raise self.error(
                f"{where} is {kind} with gpus {gpus}; only a KIND_GPU or "
                "KIND_AUTO group names GPUs: drop gpus, or make it KIND_GPU"
            )
        if kind == "KIND_CPU":
            return ["cpu"]
        if gpus:
            return [f"cuda:{g}" for g in gpus]
        if kind == "KIND_GPU":
            return self.every_gpu(where)
        return None

    def every_gpu(self, where: str) -> list[str]:
        """``cuda:0`` ... for each GPU torch sees: a ``KIND_GPU`` group that names no ``gpus``."""
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise self.error(
                f"{where} is KIND_GPU, but torch sees no CUDA GPU on this machine; "
                "make it KIND_CPU, or KIND_AUTO for the server's own devices"
            )
        return [f"cuda:{i}" for i in range(count)]

    def triton_policy(self, policy: Mapping[str, Any]) -> dict[str, Any]:
        """Triton's ``ModelVersionPolicy`` (its fields checked already: ``latest``, ``all`` or
        ``specific``) as ours."""
        if len(policy) > 1:  # a oneof: Triton's parse refuses two of them
            raise self.error(
                f"version_policy must hold one of 'latest', 'all' and 'specific', "
                f'not {len(policy)}: for example {{"latest": {{"num_versions": 1}}}}'
            )
        if "latest" in policy:
            latest = self.mapping(policy["latest"], "version_policy.latest")
            return {"latest": self.integer(latest.get("num_versions", 1), "latest.num_versions")}
        if "specific" in policy:
            specific = self.mapping(policy["specific"], "version_policy.specific")
            versions = self.array(specific.get("versions", []), "version_policy.specific.versions")
            return {
                "specific": [self.integer(v, "version_policy.specific.versions") for v in versions]
            }
        return {"all": True}

    def mapping(self, value: object, where: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.error(f"{where} must be an object, not {value!r}")
        return value

    def array(self, value: object, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.error(f"{where} must be an array, not {value!r}")
        return value

    def integer(self, value: object, where: str) -> int:
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
            quoted = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}..."
            why = "" if number is None else " in the 64-bit range"
            raise self.error(f"{where} must be an integer{why}, not {quoted}")
        return number
