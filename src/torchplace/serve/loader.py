"""Build the served model once, on the host: embedded name, ``module:callable``, ``.pt2`` or a
TorchScript archive (``torch.jit.save``).

Where the declarations come from, first match wins:

1. ``inputs`` / ``outputs`` passed explicitly (the command line or the config file);
2. for a ``module:callable`` factory, the attributes ``torchplace_inputs`` /
   ``torchplace_outputs`` (tuples of :class:`~torchplace.models.TensorSpec`) on the returned
   module, else on the callable itself;
3. for an embedded model, its built-in declarations;
4. for an exported program (``.pt2``), the dtypes and shapes recorded in the program's
   signature (a dynamic first dimension becomes ``-1``; names are ``input``/``output`` for a
   single tensor and ``input_0``, ``input_1``, ... otherwise);
5. outputs still undeclared: inferred from a dry run of the host model on two rows of zeros
   (names as for an exported program, a dict's keys for a model that returns a dict; a
   dimension that changes with an input's variable dimension becomes ``-1``). The replicas'
   own dry runs then check them on their devices.

The served name is ``name`` when given (``--name``), else the embedded model's name, the
exported file's stem, or ``MODULE-CALLABLE`` for a ``module:callable`` factory
(``mymodel:build`` is served as ``mymodel-build``).

The first dimension of every declared shape must be ``-1``: it is the batch dimension the
dynamic batcher fills. A declaration whose ``reshape`` (Triton's) is not its dims has the model
wrapped (:mod:`torchplace.serve.reshape`): the model sees that shape, clients the dims.

Class labels for Triton's classification extension come from a labels file (``--labels``,
one class name per line, for every output), else from the module's ``torchplace_labels``: one
sequence of class names for every output, or a mapping of output name to its sequence. An
output's own ``label_filename`` (Triton's) labels that output, whatever the others have.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchplace.errors import ConfigError
from torchplace.models import EMBEDDED_MODELS, TensorSpec
from torchplace.serve.datatypes import host_numpy_dtype, oip_datatype, torch_dtype

if TYPE_CHECKING:
    import torch
    from torch import nn

    from torchplace.serve.config import ServeConfig

__all__ = [
    "LoadedModel",
    "batch_bytes",
    "infer_outputs",
    "load_configured",
    "load_model",
    "set_eval",
    "weight_bytes",
]


@dataclass(frozen=True)
class LoadedModel:
    """A model built on the host, with its declarations; replicas copy it to their devices."""

    name: str
    version: str
    module: nn.Module
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    weight_bytes: int
    source: str
    #: builds a fresh private copy for a replica on the given device (the replica still moves
    #: it with ``.to``); None = ``copy.deepcopy(module)``
    rebuild: Callable[[torch.device], nn.Module] | None = None
    #: class labels per output (Triton's classification extension): ``torchplace_labels``
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Triton's ``max_batch_size: 0``: the model takes each request's tensors as sent, one
    #: request per call; its declarations have a first dimension of one (the request) that
    #: :class:`~torchplace.serve.reshape.Unbatched` takes off before the forward
    unbatched: bool = False
    #: the row shape the start-up dry runs give an input, by name (``dry_run_shapes``)
    dry_rows: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def dry_row(self, spec: TensorSpec) -> tuple[int, ...]:
        """The row shape of ``spec`` in a dry run: its own, each variable dimension the size
        :attr:`dry_rows` gives (else 1)."""
        return self.dry_rows.get(spec.name) or _ones_row(spec)


def set_eval(module: nn.Module) -> nn.Module:
    """``module.eval()``; an exported program's module (which refuses it) is left as it is."""
    with contextlib.suppress(NotImplementedError):
        module.eval()
    return module


def weight_bytes(module: nn.Module) -> int:
    """Bytes held by the module's parameters and buffers."""
    total = 0
    for tensor in (*module.parameters(), *module.buffers()):
        total += tensor.numel() * tensor.element_size()
    return total


def load_model(
    model: str = "seed-mlp",
    *,
    version: str = "1",
    weights: Path | str | None = None,
    exported: Path | str | None = None,
    inputs: tuple[TensorSpec, ...] | None = None,
    outputs: tuple[TensorSpec, ...] | None = None,
    name: str | None = None,
    labels: Path | str | None = None,
    torchscript: Path | str | None = None,
    unbatched: bool = False,
    dry_run_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> LoadedModel:
    """Build the model on the CPU in eval mode, load optional weights, resolve declarations.

    With ``exported`` the program is loaded with :func:`torch.export.load` and ``model`` is used
    only as the served name (the file's stem when ``model`` is an embedded name). ``labels``: a
    file of class names, one per line, for every output (else the module's
    ``torchplace_labels``). With ``torchscript`` (a ``torch.jit.save`` archive, see
    :mod:`torchplace.serve.torchscript`) the archive is the model, as ``exported``; it records
    no declarations, so ``inputs`` must be given. ``unbatched``: Triton's ``max_batch_size:
    0`` (see :attr:`LoadedModel.unbatched`); its outputs must be declared. ``dry_run_shapes``:
    the row shape its dry runs give an input with variable dimensions (see :func:`dry_rows`).
    """
    declared_in: tuple[TensorSpec, ...] | None = None
    declared_out: tuple[TensorSpec, ...] | None = None
    rebuild: Callable[[torch.device], nn.Module] | None = None
    served = model
    if exported is not None:
        path = Path(exported)
        module, declared_in, declared_out = _load_exported(path)
        # an exported module does not deep-copy cleanly, and its graph may hold devices burnt
        # in at export time: each replica loads its own, moved to its device
        rebuild = functools.partial(_reload_exported, path)
        if model in EMBEDDED_MODELS:
            served = Path(exported).stem
        source = f"exported:{exported}"
    elif torchscript is not None:
        path = Path(torchscript)
        module, rebuild = _load_torchscript(path, inputs, outputs)
        if model in EMBEDDED_MODELS:
            served = path.stem
        source = f"torchscript:{torchscript}"
    elif model in EMBEDDED_MODELS:
        embedded = EMBEDDED_MODELS[model]
        module = embedded.build()
        declared_in, declared_out = embedded.inputs, embedded.outputs
        source = f"embedded:{model}"
    elif ":" in model:
        module, declared_in, declared_out = _load_factory(model)
        served = model.replace(":", "-")
        source = f"factory:{model}"
    else:
        known = ", ".join(sorted(EMBEDDED_MODELS))
        raise ConfigError(
            f"model {model!r} is neither an embedded model ({known}) nor 'module:callable'; "
            "pass e.g. --model mypkg.models:build"
        )
    if weights is not None:
        from torchplace.checkpoint import load_checkpoint

        if not Path(weights).is_file():  # a path given wrongly: the user's to fix, as --exported
            what = "is a directory" if Path(weights).is_dir() else "does not exist"
            raise ConfigError(f"weights {str(weights)!r} {what}; pass a .safetensors or .pt file")
        load_checkpoint(Path(weights), "cpu", module=module)
        if exported is not None:
            # the replicas' copies are loaded from the program again: give them these weights
            rebuild = functools.partial(_reload_exported, Path(exported), weights=module)
    set_eval(module)
    called = name or (served if exported is not None or torchscript is not None else model)
    final_in = _declarations("inputs", inputs or declared_in, called)
    given_out = outputs or declared_out or ()
    if unbatched and not given_out:
        raise ConfigError(
            f"model {called!r} takes whole tensors (Triton's max_batch_size 0) and declares no "
            "outputs, which a dry run cannot find without a batch dimension; declare them"
        )
    served_module, rebuild = _reshaped(module, rebuild, final_in, given_out, unbatched)
    rows = dry_rows(final_in, dry_run_shapes or {}, called)
    final_out = _declarations(
        "outputs", given_out or infer_outputs(served_module, final_in, called, rows), called
    )
    own = _labels(
        _read_labels(labels) if labels is not None else getattr(module, "torchplace_labels", None),
        final_out,
    )
    return LoadedModel(
        name=name or served,
        version=version,
        module=served_module,
        inputs=final_in,
        outputs=final_out,
        weight_bytes=weight_bytes(module),
        source=source,
        rebuild=rebuild,
        labels={**own, **_output_labels(final_out)},
        unbatched=unbatched,
        dry_rows=rows,
    )


def _reshaped(
    module: nn.Module,
    rebuild: Callable[[torch.device], nn.Module] | None,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    unbatched: bool = False,
) -> tuple[nn.Module, Callable[[torch.device], nn.Module] | None]:
    """The module (and a replica's rebuild) wrapped to apply the declarations' ``reshape``
    and Triton's no batching (see :mod:`torchplace.serve.reshape`), or as they are when
    neither applies."""
    if not unbatched and all(spec.reshape is None for spec in (*inputs, *outputs)):
        return module, rebuild
    from torchplace.serve.reshape import reshaped

    wrapped = reshaped(module, inputs, outputs, unbatched)
    if rebuild is None or wrapped is module:
        return wrapped, rebuild
    return wrapped, functools.partial(_rebuild_reshaped, rebuild, inputs, outputs, unbatched)


def _rebuild_reshaped(
    rebuild: Callable[[torch.device], nn.Module],
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    unbatched: bool,
    device: torch.device,
) -> nn.Module:
    from torchplace.serve.reshape import reshaped

    return reshaped(rebuild(device), inputs, outputs, unbatched)


def _output_labels(outputs: tuple[TensorSpec, ...]) -> dict[str, tuple[str, ...]]:
    """The labels of each output that names its own file (Triton's ``label_filename``)."""
    return {
        spec.name: _read_labels(spec.label_filename)
        for spec in outputs
        if spec.label_filename is not None
    }


def _read_labels(path: str | Path) -> tuple[str, ...]:
    """A labels file: one class name per line (index i on line i + 1)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read the labels file {str(path)!r}: {exc}; give a UTF-8 text file with one "
            "class name per line"
        ) from None
    return tuple(text.splitlines())


def _labels(value: object, outputs: tuple[TensorSpec, ...]) -> dict[str, tuple[str, ...]]:
    """A module's ``torchplace_labels``: one sequence of class names for every output, or a
    mapping of output name to its sequence (index i names class i)."""
    if value is None:
        return {}
    every = {spec.name: value for spec in outputs}
    given = dict(value) if isinstance(value, Mapping) else every
    unknown = sorted(set(given) - {spec.name for spec in outputs})
    if unknown:
        raise ConfigError(
            f"torchplace_labels names {unknown}, not outputs of the model "
            f"({', '.join(s.name for s in outputs)})"
        )
    labels: dict[str, tuple[str, ...]] = {}
    for name, names in given.items():
        if isinstance(names, str) or not isinstance(names, Sequence) or not all(
            isinstance(n, str) for n in names
        ):  # fmt: skip
            raise ConfigError(
                f"torchplace_labels[{name!r}] must be a sequence of class names (strings), "
                f"got {names!r}"
            )
        labels[name] = tuple(names)
    return labels


def load_configured(config: ServeConfig) -> LoadedModel:
    """:func:`load_model` with the model fields of a server's configuration."""
    return load_model(
        config.model,
        version=config.model_version,
        weights=config.weights,
        exported=config.exported,
        inputs=config.inputs,
        outputs=config.outputs,
        name=config.name,
        labels=config.labels,
        torchscript=config.torchscript,
        unbatched=config.unbatched,
        dry_run_shapes=config.dry_run_shapes,
    )


#: where a dry run's shapes come from, as its errors name them
_DRY_RUN_SHAPES = "the dry-run shapes (--dry-run-shape, dry_run_shapes, a model_warmup's dims)"


def dry_rows(
    inputs: tuple[TensorSpec, ...], given: Mapping[str, tuple[int, ...]], model: str
) -> dict[str, tuple[int, ...]]:
    """The row shape each input gets in a dry run: ``given``'s where it names the input (of
    the declared rank, its fixed dimensions as declared), else each variable dimension 1."""
    specs = {spec.name: spec for spec in inputs}
    rows: dict[str, tuple[int, ...]] = {}
    for name, shape in given.items():
        spec = specs.get(name)
        if spec is None:
            raise ConfigError(
                f"{_DRY_RUN_SHAPES} names input {name!r}, which model {model!r} does not have; "
                f"its inputs are {', '.join(specs)}"
            )
        declared = spec.shape[1:]
        if len(shape) != len(declared) or any(
            d >= 0 and d != got for d, got in zip(declared, shape, strict=False)
        ):
            raise ConfigError(
                f"{_DRY_RUN_SHAPES} gives input {name!r} of model {model!r} rows of shape "
                f"{list(shape)}, but it is declared {list(declared)} (-1: variable); give "
                "a shape of that rank with its fixed dimensions as declared"
            )
        rows[name] = tuple(shape)
    for spec in inputs:
        rows.setdefault(spec.name, _ones_row(spec))
    return rows


def _ones_row(spec: TensorSpec) -> tuple[int, ...]:
    """A row of ``spec`` with each variable dimension 1."""
    return tuple(d if d > 0 else 1 for d in spec.shape[1:])


def batch_bytes(
    rows: int,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    dry: Mapping[str, tuple[int, ...]],
) -> int:
    """Bytes of a dry run's batch of ``rows`` rows: each input at its row shape in ``dry``
    (:func:`dry_rows`; else each variable dimension 1), each output at its declared row, each
    variable dimension 1 (its size is the model's to say, known only once it ran)."""
    total = 0
    for spec in inputs:
        total += math.prod(dry.get(spec.name) or _ones_row(spec)) * _itemsize(spec)
    for spec in outputs:
        total += math.prod(_ones_row(spec)) * _itemsize(spec)
    return rows * total


def _itemsize(spec: TensorSpec) -> int:
    return int(host_numpy_dtype(spec.datatype).itemsize)


def infer_outputs(
    module: nn.Module,
    inputs: tuple[TensorSpec, ...],
    model: str,
    rows_of: Mapping[str, tuple[int, ...]] | None = None,
) -> tuple[TensorSpec, ...]:
    """The outputs of a dry run of the host model on zeros (see the module docstring);
    ``rows_of``: each input's row shape in it (:func:`dry_rows`), its variable dimensions
    doubled in the second run."""
    import torch

    given = dry_rows(inputs, rows_of or {}, model)

    def run(rows: int, scale: int) -> list[tuple[str, torch.Tensor]]:
        def shape(spec: TensorSpec) -> tuple[int, ...]:
            dims = zip(spec.shape[1:], given[spec.name], strict=True)
            return (rows, *(d if d > 0 else size * scale for d, size in dims))

        batch = [torch.zeros(shape(spec), dtype=torch_dtype(spec.datatype)) for spec in inputs]
        try:
            with torch.inference_mode():
                raw = module(*batch)
        except Exception as exc:
            raise ConfigError(
                f"model {model!r} declares no outputs and its dry run on zeros failed "
                f"({type(exc).__name__}: {exc}); declare them with --output NAME:DATATYPE:-1,DIMS"
            ) from exc
        return _named_outputs(raw, model)

    first = run(2, 1)
    variable = any(dim == -1 for spec in inputs for dim in spec.shape[1:])
    second = run(3, 2) if variable else first
    specs: list[TensorSpec] = []
    for (name, tensor), (_, other) in zip(first, second, strict=True):
        datatype = oip_datatype(tensor.dtype)
        if datatype is None or tensor.dim() == 0 or tensor.shape[0] != 2:
            raise ConfigError(
                f"model {model!r}: output {name!r} of its dry run ({tensor.dtype}, shape "
                f"{list(tensor.shape)}) is not a servable batch; declare it with --output"
            )
        dims = [
            dim if dim == again else -1
            for dim, again in zip(tensor.shape[1:], other.shape[1:], strict=False)
        ]
        specs.append(TensorSpec(name, datatype, (-1, *dims)))
    return tuple(specs)


def _named_outputs(raw: Any, model: str) -> list[tuple[str, torch.Tensor]]:
    import torch

    if isinstance(raw, torch.Tensor):
        return [("output", raw)]
    if isinstance(raw, dict) and all(isinstance(v, torch.Tensor) for v in raw.values()):
        return [(str(key), value) for key, value in raw.items()]
    if isinstance(raw, tuple | list) and all(isinstance(v, torch.Tensor) for v in raw):
        return [(f"output_{i}", value) for i, value in enumerate(raw)]
    raise ConfigError(
        f"model {model!r} returned {type(raw).__name__} from its dry run, not tensors; "
        "declare its outputs with --output NAME:DATATYPE:-1,DIMS"
    )


def _declarations(
    kind: str, specs: tuple[TensorSpec, ...] | None, model: str
) -> tuple[TensorSpec, ...]:
    flag = "--input" if kind == "inputs" else "--output"
    if not specs:
        raise ConfigError(
            f"model {model!r} declares no {kind}; declare them with {flag} NAME:DATATYPE:-1,DIMS "
            f"or a torchplace_{kind} attribute on the factory"
        )
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{kind} of {model!r} repeat a name: {names}")
    for spec in specs:
        host_numpy_dtype(spec.datatype)
        if not spec.shape or spec.shape[0] != -1:
            raise ConfigError(
                f"{kind[:-1]} {spec.name!r} has shape {list(spec.shape)}; the first dimension "
                "must be -1 (the batch dimension), e.g. [-1, 8]"
            )
        if any(dim < -1 or dim == 0 for dim in spec.shape[1:]):
            raise ConfigError(
                f"{kind[:-1]} {spec.name!r} has shape {list(spec.shape)}; dimensions after the "
                "first must be positive or -1"
            )
        _check_reshape(kind, spec, model)
    return tuple(specs)


def _check_reshape(kind: str, spec: TensorSpec, model: str) -> None:
    """A declaration's ``reshape`` fits its dims (Triton's check and words), and only an
    output names a labels file."""
    if spec.label_filename is not None and kind == "inputs":
        raise ConfigError(
            f"input {spec.name!r} of {model!r} names a label_filename; labels are an "
            "output's (classification extension): give it on the output"
        )
    if spec.reshape is None:
        return
    from torchplace.serve.triton_config import reshape_problem

    problem = reshape_problem(spec.shape[1:], spec.reshape)
    if problem is not None:
        raise ConfigError(
            f"model {kind[:-1]} {spec.name!r} of {model!r} {problem}; give reshape the "
            "model's shape of one row, with as many elements as the dims (the batch dimension "
            "left out of both)"
        )


def _load_factory(
    target: str,
) -> tuple[nn.Module, tuple[TensorSpec, ...] | None, tuple[TensorSpec, ...] | None]:
    from torch import nn

    module_name, _, attr = target.rpartition(":")
    if not module_name or not attr:
        raise ConfigError(f"model {target!r} must look like 'package.module:callable'")
    try:
        namespace = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"cannot import {module_name!r} for model {target!r}: {exc}; "
            "check the module is on PYTHONPATH"
        ) from exc
    factory: Any = namespace
    for part in attr.split("."):
        try:
            factory = getattr(factory, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(factory):
        raise ConfigError(f"{target!r} is not callable; point --model at a factory function")
    try:
        built = factory()
    except Exception as exc:  # the user's code: one line that says where, not a traceback
        raise ConfigError(
            f"cannot build the model {target!r}: {type(exc).__name__}: {exc}; the factory must "
            "take no arguments and return a torch.nn.Module"
        ) from exc
    if not isinstance(built, nn.Module):
        raise ConfigError(
            f"factory {target!r} returned {type(built).__name__}, not a torch.nn.Module"
        )
    declared_in = getattr(built, "torchplace_inputs", None) or getattr(
        factory, "torchplace_inputs", None
    )
    declared_out = getattr(built, "torchplace_outputs", None) or getattr(
        factory, "torchplace_outputs", None
    )
    return built, _spec_tuple(declared_in), _spec_tuple(declared_out)


def _spec_tuple(value: object) -> tuple[TensorSpec, ...] | None:
    if value is None:
        return None
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, TensorSpec) for v in value):
        raise ConfigError(
            f"torchplace_inputs/torchplace_outputs must be a tuple of TensorSpec, got {value!r}"
        )
    return tuple(value)


def _load_torchscript(
    path: Path,
    inputs: tuple[TensorSpec, ...] | None,
    outputs: tuple[TensorSpec, ...] | None,
) -> tuple[nn.Module, Callable[[torch.device], nn.Module]]:
    """A TorchScript archive on the host, and how a replica loads its own copy onto its
    device (``torch.jit.load`` with ``map_location``: no deepcopy of a scripted module)."""
    from torchplace.serve.torchscript import check_archive, load_torchscript

    check_archive(path)
    if not inputs:
        raise ConfigError(
            f"TorchScript archive {str(path)!r} records no declarations of its inputs; declare "
            "them: --input INPUT__0:FP32:-1,8 on the command line, inputs = "
            '["INPUT__0:FP32:-1,8"] in config.toml, or input [{name: "INPUT__0", data_type: '
            "TYPE_FP32, dims: [8]}] in config.pbtxt"
        )
    ins, outs = [s.name for s in inputs], [s.name for s in outputs or ()]
    rebuild = functools.partial(load_torchscript, path, inputs=ins, outputs=outs)
    return load_torchscript(path, "cpu", inputs=ins, outputs=outs), rebuild


def _load_exported(
    path: Path,
) -> tuple[nn.Module, tuple[TensorSpec, ...] | None, tuple[TensorSpec, ...] | None]:

    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise ConfigError(f"exported program {str(path)!r} {what}; pass a .pt2 file")
    if not zipfile.is_zipfile(path):
        raise ConfigError(
            f"exported program {str(path)!r} is not a .pt2 archive (torch.export.save writes "
            "a zip archive); save it with torch.export.save(torch.export.export(model, args), "
            "path)"
        )
    try:
        program = _export_load(path)
    except Exception as exc:
        raise ConfigError(
            f"cannot load exported program {str(path)!r}: {exc}; "
            "save it with torch.export.save(torch.export.export(model, args), path)"
        ) from exc
    module = program.module()
    return module, _specs_from_graph(program, "input"), _specs_from_graph(program, "output")


def _export_load(path: Path) -> Any:
    """``torch.export.load``, quiet about its internals: a read-only buffer (torch 2.11) and its
    inner ``torch.load``'s ``weights_only`` default (torch 2.4) are nothing a user can act on."""
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        warnings.filterwarnings("ignore", message="You are using `torch.load` with")
        return torch.export.load(path)


def _reload_exported(
    path: Path, device: torch.device, *, weights: nn.Module | None = None
) -> nn.Module:
    """The program loaded again and moved to ``device``: weights, constants and the devices
    that tracing burnt into the graph (``torch.ones(..., device=x.device)`` records the export
    device); ``.to(device)`` on the module moves only parameters and buffers. ``weights``: a
    host module whose state (``--weights``) replaces the program's own."""

    program = _export_load(path)
    try:
        from torch.export.passes import move_to_device_pass
    except ImportError:  # torch < 2.6: parameters and buffers still move with .to()
        pass
    else:
        program = move_to_device_pass(program, device)
    module: nn.Module = program.module()
    _move_burnt_in_devices(module, device)
    if weights is not None:
        module.load_state_dict(weights.state_dict())  # copied onto the module's device
    return module


def _move_burnt_in_devices(module: nn.Module, device: torch.device) -> None:
    """Point every ``device=`` an operator of the module's graphs names at ``device``, and
    regenerate the code of its subgraphs: torch 2.9's ``move_to_device_pass`` rewrites the
    nodes of a higher-order operator's subgraph (``torch.autocast(..., enabled=False)`` around
    a rotary embedding becomes ``wrap_with_autocast`` and a ``submod_1``) but leaves its code,
    which still makes tensors on the export device."""
    import torch.fx

    for name, sub in module.named_modules():
        if not isinstance(sub, torch.fx.GraphModule):
            continue
        moved = False
        for node in sub.graph.nodes:
            named = node.kwargs.get("device") if node.op == "call_function" else None
            if isinstance(named, torch.device) and named != device:
                node.update_kwarg("device", device)
                moved = True
        if moved or name:  # a subgraph's code may be older than its nodes
            sub.recompile()


def _specs_from_graph(program: Any, kind: str) -> tuple[TensorSpec, ...] | None:
    """Best effort: dtypes/shapes from the fake tensors recorded on the graph's nodes."""
    try:
        graph = program.graph
        user_inputs = set(program.graph_signature.user_inputs)
        if kind == "input":
            vals = [
                n.meta.get("val")
                for n in graph.nodes
                if n.op == "placeholder" and n.name in user_inputs
            ]
        else:
            out_node = next(n for n in graph.nodes if n.op == "output")
            args = out_node.args[0]
            n_user = len(program.graph_signature.user_outputs)
            nodes = list(args)[-n_user:] if n_user else []
            vals = [n.meta.get("val") for n in nodes]
    except Exception:
        return None
    specs: list[TensorSpec] = []
    for i, val in enumerate(vals):
        if val is None or not hasattr(val, "shape"):
            return None
        datatype = oip_datatype(val.dtype)
        if datatype is None:
            return None
        dims = [d if isinstance(d, int) else -1 for d in val.shape]
        shape = (-1, *dims[1:]) if dims else (-1,)
        name = kind if len(vals) == 1 else f"{kind}_{i}"
        specs.append(TensorSpec(name, datatype, tuple(shape)))
    return tuple(specs) or None
