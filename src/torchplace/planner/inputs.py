"""What the planner plans for: a model built on ``meta``, its declared inputs and KV cache.

Models come as ``torchplace serve`` takes them: an embedded name (``seed-mlp``, ``wide-mlp``),
``module:callable`` with declared inputs, or ``--exported FILE.pt2``, plus the two transformer
shapes of :mod:`torchplace.planner.shapes` (``gpt2-like``, ``llama-7b-like``). In a declared
shape the first ``-1`` is the batch dimension, as for ``serve``, and any later ``-1`` is the
sequence length (``--seq``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from torchplace.errors import ConfigError, TorchplaceError
from torchplace.planner.shapes import SHAPES, KVCacheSpec, build_shape
from torchplace.planner.values import LIMIT, built, forget_weights, give

if TYPE_CHECKING:
    import torch
    from torch import nn

    from torchplace.models import TensorSpec

__all__ = ["BATCH", "SEQ", "InputSpec", "PlanModel", "call_arguments", "load_plan_model"]

BATCH, SEQ = -1, -2

_DTYPES = {
    "FP32": "float32",
    "FP16": "float16",
    "BF16": "bfloat16",
    "FP64": "float64",
    "INT64": "int64",
    "INT32": "int32",
    "INT16": "int16",
    "INT8": "int8",
    "UINT8": "uint8",
    "BOOL": "bool",
}


@dataclass(frozen=True)
class InputSpec:
    """One model input: name, torch dtype name, shape (-1 batch, -2 sequence), integer range."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    high: int = 2  # integer inputs are drawn from [0, high)

    def concrete(self, batch: int, seq: int) -> tuple[int, ...]:
        return tuple(batch if d == BATCH else seq if d == SEQ else d for d in self.shape)

    def make(self, batch: int, seq: int, device: torch.device | str) -> torch.Tensor:
        """A tensor of this spec (zeros on meta; seeded values elsewhere)."""
        import torch

        dtype = getattr(torch, self.dtype)
        shape = self.concrete(batch, seq)
        if torch.device(device).type == "meta":
            return torch.empty(shape, dtype=dtype, device=device)
        gen = torch.Generator().manual_seed(0)
        if dtype.is_floating_point:
            return torch.randn(shape, generator=gen, dtype=dtype).to(device)
        return torch.randint(0, self.high, shape, generator=gen, dtype=dtype).to(device)


@dataclass(frozen=True)
class PlanModel:
    """A model ready to plan: the module (on meta unless it could not be), inputs, KV cache."""

    name: str
    source: str
    module: nn.Module
    inputs: tuple[InputSpec, ...]
    kv_cache: KVCacheSpec | None
    default_seq: int | None  # None: the inputs have no sequence dimension
    declared: tuple[TensorSpec, ...] | None = None  # inputs given by the caller (--input)

    @property
    def has_seq(self) -> bool:
        return any(SEQ in spec.shape for spec in self.inputs)

    def example(
        self, batch: int, seq: int | None, device: torch.device | str
    ) -> list[torch.Tensor]:
        """Inputs for one forward at ``batch`` (and ``seq``) on ``device``."""
        length = seq if seq is not None else (self.default_seq or 1)
        return [spec.make(batch, length, device) for spec in self.inputs]

    def values(self, batch: int, seq: int | None) -> list[torch.Tensor | None]:
        """The values of the integer and boolean inputs (ids, masks, lengths, timesteps: what a
        forward's own code branches on) at ``batch``, as ``--verify`` makes them, for the code
        that reads them on ``meta`` (:mod:`torchplace.planner.values`); None for a float input
        (data, whose values the planner would make up) or one past ``LIMIT`` elements."""
        import math

        from torchplace.planner.values import LIMIT

        length = seq if seq is not None else (self.default_seq or 1)
        return [
            spec.make(batch, length, "cpu")
            if not spec.dtype.startswith(("float", "bfloat"))
            and math.prod(spec.concrete(batch, length)) <= LIMIT
            else None
            for spec in self.inputs
        ]


def call_arguments(
    module: nn.Module, inputs: Sequence[torch.Tensor], names: Sequence[str]
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """How the planner calls ``module``: the inputs in order, but by their declared names those
    its forward takes by keyword only (``forward(self, x, *, mask)``), those that name a
    parameter of another position (T5's ``forward(input_ids, attention_mask=None,
    decoder_input_ids=None)`` given ``input_ids, decoder_input_ids``), and those past its
    positional parameters that its ``**kwargs`` takes."""
    import inspect

    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):  # a forward without a signature (compiled code)
        return list(inputs), {}
    kinds = [p.kind for p in params.values()]
    positional = [
        n
        for n, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    by_name = {
        n
        for n, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    # forward(self, x, **inputs): those past its positional parameters go by name (not past
    # a forward(self, *args, **kwargs), which takes them in order)
    spill = inspect.Parameter.VAR_KEYWORD in kinds and inspect.Parameter.VAR_POSITIONAL not in kinds
    args: list[torch.Tensor] = []
    kwargs: dict[str, torch.Tensor] = {}
    for t, name in zip(inputs, names, strict=False):
        slot = positional[len(args)] if len(args) < len(positional) else None
        if name in kwargs or (name == slot and not kwargs):
            args.append(t)  # in its place
        elif name in by_name or (spill and slot is None and name not in params):
            kwargs[name] = t  # a parameter of its name elsewhere, keyword only, or **kwargs
        else:
            args.append(t)  # a name the forward does not know (x for forward(self, input))
    args += list(inputs[len(names) :])
    return args, kwargs


def _to_meta(module: nn.Module) -> None:
    """Every parameter and buffer not on ``meta`` moved there, in place, each tensor once, so
    that a weight tied to another (or a buffer in several modules) stays one tensor;
    ``Module.to("meta")`` makes a new parameter per name, which unties them. A small buffer
    keeps its value beside it (:mod:`torchplace.planner.values`), as one built on ``meta``
    from Python data does."""
    from torch import Tensor, nn

    moved: dict[int, Tensor] = {}
    for owner in module.modules():
        for store in (owner._parameters, owner._buffers):
            for name, t in list(store.items()):
                if t is None or t.is_meta or nn.parameter.is_lazy(t):
                    continue
                if id(t) not in moved:
                    meta = t.to("meta")
                    if not isinstance(t, nn.Parameter) and t.numel() <= LIMIT:
                        give(meta, t.detach())  # a buffer's value, as built (or loaded)
                    moved[id(t)] = (
                        nn.Parameter(meta, t.requires_grad) if isinstance(t, nn.Parameter) else meta
                    )
                # through setattr, which a recurrent layer watches to keep its flat weights
                setattr(owner, name, moved[id(t)])


def _refuse_not_exported(path: Path) -> None:
    """Refuse, before ``torch.export.load`` reads it, a zip archive that no
    ``torch.export.save`` wrote, naming what it is: a ``torch.save`` checkpoint, a TorchScript
    archive (``torch.jit.save``) or another zip; ``torch.export.load`` fails on those with an
    internal error ("check the warnings above") after logging a traceback. A file that is no
    zip archive, or none at all, is left to the loader, which says so."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            names = [n.rpartition("/")[2] for n in archive.namelist()]
    except (OSError, zipfile.BadZipFile, ValueError):
        return  # missing, a directory, not a zip: the loader names the problem
    if "archive_format" in names or "serialized_exported_program.json" in names:
        return  # torch.export.save's archive (torch >= 2.6, and before)
    fix = (
        "give --exported a program saved with torch.export.save(torch.export.export(model, "
        "args), 'model.pt2'), or plan the model itself with --model module:callable"
    )
    if "constants.pkl" in names:
        raise ConfigError(
            f"exported program {str(path)!r} is a TorchScript archive (torch.jit.save), not a "
            f"torch.export program; {fix}"
        )
    if "data.pkl" in names:
        raise ConfigError(
            f"exported program {str(path)!r} is a torch.save checkpoint (weights, not a "
            f"program), not a torch.export program; {fix} whose factory loads these weights"
        )
    shown = ", ".join(repr(n) for n in names[:5]) or "nothing"
    raise ConfigError(
        f"exported program {str(path)!r} is a zip archive, but not one torch.export.save "
        f"wrote (it holds {shown}, no archive_format); {fix}"
    )


@contextlib.contextmanager
def _quiet_export_log(path: str | Path | None) -> Iterator[None]:
    """``torch.export.load`` logs the traceback of an archive it cannot read (at WARNING, on
    stderr), then raises an error that says only to "check the warnings above": kept off
    stderr, the logged error's own message goes into the one-line error instead."""
    import logging

    if path is None:
        yield
        return
    logged: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            exc = record.exc_info[1] if record.exc_info else None
            logged.append(str(exc).split("\n")[0] if exc is not None else record.getMessage())

    logger = logging.getLogger("torch.export")
    handler, propagate = _Keep(logging.WARNING), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    except ConfigError as exc:
        if "warnings above" not in str(exc):
            raise
        why = logged[-1] if logged else "torch.export.load found no exported program in it"
        raise ConfigError(
            f"cannot load exported program {str(path)!r}: {why}; is it complete? "
            "Save it again with torch.export.save(torch.export.export(model, args), path)"
        ) from exc
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _unwrapped(module: nn.Module) -> nn.Module:
    """The module a data-parallel wrapper holds (``nn.DataParallel``,
    ``DistributedDataParallel``: a training script's model, every name under ``module.``),
    which is what gets placed: the wrapper scatters each batch over the GPUs it found and
    refuses weights on any other device (``meta`` included)."""
    from torch import nn

    while isinstance(module, nn.DataParallel | nn.parallel.DistributedDataParallel):
        module = module.module
    return module


def _refuse_packed(module: nn.Module) -> None:
    """Refuse weights kept outside the parameters and buffers, in the packed objects of the
    quantized kernels (``torch.ao.quantization.quantize_dynamic``, ``convert``): they can be
    neither sized nor moved, and those kernels have no ``meta`` implementation."""
    import torch

    for name, owner in module.named_modules():
        packed = [
            k
            for k, v in vars(owner).items()
            if isinstance(v, torch._C.ScriptObject) and not isinstance(v, torch._C.ScriptModule)
        ]
        if packed:
            where = name.rsplit("._packed_params", 1)[0] or "(model)"
            kind = type(module.get_submodule(where) if name else owner)
            raise ConfigError(
                f"module {where!r} ({kind.__module__}.{kind.__qualname__}) keeps its weights "
                f"packed for quantized kernels ({name or 'the model'}.{packed[0]}), neither "
                "parameters nor buffers, which the planner can neither size nor place, and "
                "whose kernels do not run on 'meta'; plan the float model before "
                "quantize_dynamic or convert (int8 weights are a quarter of float32's bytes), "
                "or keep quantized weights in buffers dequantised in forward"
            )


def _refuse_shape_inputs(model: str, default_seq: int, inputs: Sequence[TensorSpec]) -> None:
    """A built-in transformer shape declares its one input itself: ``--input`` would be
    ignored, so it is refused, naming what the shape takes instead."""
    given = ", ".join(repr(spec.name) for spec in inputs)
    raise ConfigError(
        f"--input {given} given, but {model!r} is a built-in transformer shape, whose one input "
        "is input_ids (int64 token ids, batch x sequence) and cannot be declared; leave --input "
        f"out and give --batch for the batch sizes and --seq for the sequence length (default "
        f"{default_seq}), or plan your own model with --model module:callable --input ..."
    )


def _from_tensor_specs(specs: Sequence[TensorSpec]) -> tuple[InputSpec, ...]:
    out = []
    for spec in specs:
        dtype = _DTYPES.get(spec.datatype.upper())
        if dtype is None:
            raise ConfigError(
                f"input {spec.name!r} has datatype {spec.datatype!r}, which the planner cannot "
                f"build; use one of {', '.join(_DTYPES)}"
            )
        dims = tuple(SEQ if i and d == -1 else d for i, d in enumerate(spec.shape))
        out.append(InputSpec(spec.name, dtype, dims))
    return tuple(out)


def _uninitialized(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's refusal to size a lazy module's uninitialized parameter."""
    return isinstance(exc, ValueError) and "uninitialized parameter" in str(exc)


def load_plan_model(
    model: str,
    *,
    exported: str | Path | None = None,
    inputs: Sequence[TensorSpec] | None = None,
    device: str = "meta",
    layers: int | None = None,
) -> PlanModel:
    """Build ``model`` on ``device`` (``meta`` by default: nothing is allocated)."""
    import torch

    if model in SHAPES and exported is None:
        shape = SHAPES[model]
        if inputs:
            _refuse_shape_inputs(model, shape.default_seq, inputs)
        ids = InputSpec("input_ids", "int64", (BATCH, SEQ), high=shape.vocab)
        module = build_shape(model, device=device, layers=layers)
        kv = shape.kv_cache if layers is None else None
        return PlanModel(model, f"shape:{model}", module, (ids,), kv, shape.default_seq)
    # Everything else as `torchplace serve` loads it, built under the target device.
    from torchplace.models import TensorSpec
    from torchplace.serve.loader import LoadedModel, load_model

    # the planner reads no output declaration: a placeholder satisfies the loader's check
    placeholder = (TensorSpec("output", "FP32", (-1,)),)

    if exported is not None:
        _refuse_not_exported(Path(exported))

    def load(where: str) -> LoadedModel:
        # on meta, a buffer made from Python data keeps its value (Encodec's padding sizes)
        with (
            torch.device(where),
            built() if where == "meta" else contextlib.nullcontext(),
            _quiet_export_log(exported),
        ):
            return load_model(
                model,
                exported=exported,
                inputs=tuple(inputs) if inputs else None,
                outputs=placeholder,
            )

    try:
        try:
            loaded = load(device if exported is None else "cpu")
        except TorchplaceError as exc:
            # an initialiser that reads values (parametrizations.orthogonal's .item()) cannot
            # run on meta: built on the CPU, as its user runs it, then moved to meta below
            if device != "meta" or "meta" not in str(exc.__cause__ or ""):
                raise
            loaded = load("cpu")
    except TorchplaceError:
        raise
    except (Exception, SystemExit) as exc:  # the user's factory failed (or called sys.exit)
        if exported is not None:
            what, fix = f"exported program {str(exported)!r}", "save it with torch.export.save"
        elif _uninitialized(exc):
            raise ConfigError(
                f"model {model!r} has uninitialized parameters (a lazy module, such as "
                "nn.LazyLinear, gets its shapes at its first forward), so its weights have no "
                "size to plan. Fix: run one forward with a dummy batch in the factory before "
                "returning the model, or use the module with explicit sizes (nn.Linear)"
            ) from exc
        else:
            what = f"model {model!r}"
            fix = "the factory is called with no arguments and must return a torch.nn.Module"
        raise ConfigError(f"cannot build the {what}: {type(exc).__name__}: {exc}; {fix}") from exc
    module = _unwrapped(loaded.module)
    _refuse_packed(module)
    if exported is not None and device != "cpu":
        # the devices tracing burnt into the graph (torch.ones(..., device=x.device) records
        # the export's) move too: .to() moves the parameters and buffers alone
        module = loaded.rebuild(torch.device(device)) if loaded.rebuild else module.to(device)
    elif device == "meta":
        _to_meta(module)  # a factory that built (or loaded) real weights itself
        forget_weights(module)
    specs = _from_tensor_specs(loaded.inputs)
    seq = 128 if any(SEQ in spec.shape for spec in specs) else None
    declared = tuple(inputs) if inputs else None
    return PlanModel(loaded.name, loaded.source, module, specs, None, seq, declared)
