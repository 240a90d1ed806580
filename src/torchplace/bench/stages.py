"""Per-stage times of a model, per batch size: H2D, compute, D2H, total, throughput, peak memory.

The article's exercise 7. For each batch size a batch is made on the host (pinned when the
device is CUDA), and four things are timed with :class:`~torchplace.bench.timer.Timer`: the copy
in (``x.to(device)``), the forward pass under :func:`torch.inference_mode`, the copy out
(``y.cpu()``), and all three together, which gives the throughput in rows per second. Peak device
memory is ``torch.cuda.max_memory_allocated`` during the batch; on the CPU torch keeps no such
count, so it is reported as unavailable rather than guessed.

When the model already runs on the host (``--device cpu``) there is no copy: ``x.to("cpu")``
returns ``x`` itself, so H2D and D2H are reported as no-ops costing nothing, not timed.

The model is one of the embedded ones (``seed-mlp``, ``wide-mlp``) or ``module:callable``, a
callable that takes no arguments and returns an ``nn.Module`` (the input shape is then given
explicitly). The model is put in eval mode (dropout off, batch norm on its running statistics)
and called as ``model(x)`` with one tensor whose first dimension is the batch: ``torch.randn``
for a floating dtype, token ids 0 and 1 for an integer one. A model that takes a dict, a tuple,
several inputs or keyword arguments, or wants its batch on another dimension, is benchmarked
through a wrapper module whose ``forward(x)`` builds what it takes.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchplace.bench.memory import require_memory
from torchplace.bench.timer import Measurement, Timer
from torchplace.errors import ConfigError, TimingError

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = [
    "DEFAULT_BATCH_SIZES",
    "DTYPES",
    "ModelSpec",
    "StageResult",
    "StagesResult",
    "load_model_spec",
    "parse_shape",
    "run_stages",
    "to_host",
]

DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 8, 32, 128)

#: ``--dtype`` names, torch's own: floating ones convert the weights too; integer ones make
#: index inputs (token ids 0 and 1, valid for any embedding) and leave the weights as they are
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "float64", "int64", "int32")


@dataclass(frozen=True)
class ModelSpec:
    """A model to benchmark: its name, how to build it, and the shape of one input row."""

    name: str
    build: Callable[[], nn.Module]
    row_shape: tuple[int, ...]


def parse_shape(text: str) -> tuple[int, ...]:
    """``"512"`` or ``"-1,512"`` or ``"3x224x224"`` -> the shape of one row (batch dim dropped)."""
    parts = [p.strip() for p in text.replace("x", ",").split(",") if p.strip()]
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        dims = []
    if dims and dims[0] == -1:
        dims = dims[1:]
    if not dims or any(d < 1 for d in dims):
        raise ConfigError(
            f"cannot read input shape {text!r}; give the size of one row as positive integers, "
            "such as 512 or 3,224,224 (a leading -1 for the batch dimension is allowed)"
        )
    return tuple(dims)


def load_model_spec(model: str, input_shape: str | None = None) -> ModelSpec:
    """An embedded model by name, or ``module:callable`` with ``input_shape`` (required)."""
    from torchplace.models import embedded_model

    if ":" not in model:
        embedded = embedded_model(model)
        row = tuple(embedded.inputs[0].shape[1:])
        if input_shape is not None:
            row = parse_shape(input_shape)
        return ModelSpec(name=model, build=embedded.build, row_shape=row)
    module_name, _, attr = model.partition(":")
    if not module_name or not attr:
        raise ConfigError(
            f"cannot read model {model!r}; write module:callable, such as pkg.mod:make"
        )
    try:
        factory: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            factory = getattr(factory, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"cannot load {model!r}: {exc}; check that {module_name!r} is importable from the "
            "current directory or PYTHONPATH and defines that callable"
        ) from exc
    except (Exception, SystemExit) as exc:  # the module's own code failed (or exited) on import
        raise ConfigError(
            f"cannot load {model!r}: importing {module_name!r} failed with "
            f"{type(exc).__name__}: {exc}; fix the module so that it imports cleanly"
        ) from exc
    if not callable(factory):
        raise ConfigError(f"{model!r} is not callable; point at a function returning an nn.Module")
    _refuse_module_object(model, factory)
    if input_shape is None:
        raise ConfigError(
            f"model {model!r} declares no inputs: pass --input-shape with the size of one row, "
            "such as --input-shape 512"
        )

    def build() -> nn.Module:
        from torch import nn

        try:
            built = factory()
        except (Exception, SystemExit) as exc:  # the user's factory failed (or called sys.exit)
            raise ConfigError(
                f"cannot build {model!r}: {type(exc).__name__}: {exc}; the callable is called "
                "with no arguments and must return an nn.Module"
            ) from exc
        if not isinstance(built, nn.Module):
            raise ConfigError(
                f"{model!r} returned {type(built).__name__}, not a torch.nn.Module; point at a "
                "function that builds and returns the model"
            )
        return built

    return ModelSpec(name=model, build=build, row_shape=parse_shape(input_shape))


@dataclass(frozen=True)
class StageResult:
    """One batch size: the stage timings (None for a no-op copy) and peak memory."""

    batch_size: int
    h2d: Measurement | None
    compute: Measurement
    d2h: Measurement | None
    total: Measurement
    peak_memory_bytes: int | None
    first_call_s: float | None = None

    @property
    def rows_per_s(self) -> float:
        return self.batch_size / self.total.median_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "h2d_s": 0.0 if self.h2d is None else self.h2d.median_s,
            "h2d_noop": self.h2d is None,
            "compute_s": self.compute.median_s,
            "d2h_s": 0.0 if self.d2h is None else self.d2h.median_s,
            "d2h_noop": self.d2h is None,
            "total_s": self.total.median_s,
            "total_cold_s": self.total.cold_s,
            "first_call_s": self.first_call_s,
            "rows_per_s": self.rows_per_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "timings": {
                name: None if m is None else m.to_dict()
                for name, m in (
                    ("h2d", self.h2d),
                    ("compute", self.compute),
                    ("d2h", self.d2h),
                    ("total", self.total),
                )
            },
        }


@dataclass(frozen=True)
class StagesResult:
    """Every batch size of one model on one device."""

    model: str
    device: str
    dtype: str
    row_shape: tuple[int, ...]
    rows: tuple[StageResult, ...]
    memory_note: str
    input_note: str = ""
    weights_dtype: str = ""  # the dtype of the weights as timed ("" when not known)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "weights_dtype": self.weights_dtype or self.dtype,
            "row_shape": list(self.row_shape),
            "input": self.input_note,
            "memory_note": self.memory_note,
            "batches": [row.to_dict() for row in self.rows],
        }


def _refuse_module_object(model: str, factory: Any) -> None:
    """A module object is callable too, but calling it with no arguments runs its forward."""
    from torch import nn

    if isinstance(factory, nn.Module):
        name = model.partition(":")[2]
        raise ConfigError(
            f"{model!r} is an nn.Module object, not a function that builds one; point at a "
            f"function, such as def make(): return {name}"
        )


def _dtype(name: str | torch.dtype) -> torch.dtype:
    import torch

    if isinstance(name, torch.dtype):  # torch.float16 as well as "float16"
        name = str(name).removeprefix("torch.")
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}; choose one of: {', '.join(DTYPES)}")
    result: torch.dtype = getattr(torch, name)
    return result


def run_stages(
    spec: ModelSpec,
    device: torch.device,
    *,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    dtype: str | torch.dtype | None = None,
    min_time: float = 0.1,
    warmup: int = 3,
    progress: Callable[[str], None] | None = None,
) -> StagesResult:
    """Time H2D, compute, D2H and the total for every batch size.

    ``dtype`` None keeps the model's own dtype (that of its first floating parameter or buffer,
    float32 when it has none): a model built in half precision is timed in half precision.
    """
    import torch

    if not batch_sizes or any(
        isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in batch_sizes
    ):
        raise ConfigError(f"batch sizes must be positive integers, got {list(batch_sizes)!r}")
    repeated = sorted({b for b in batch_sizes if list(batch_sizes).count(b) > 1})
    if repeated:
        # a size's second row would report a warm call as its first call (compilation,
        # autotuning) and draw the same point twice
        raise ConfigError(
            f"batch sizes {list(batch_sizes)!r} repeat {', '.join(map(str, repeated))}: each size "
            "is timed once, its first call included; give each size once"
        )
    explicit = None if dtype is None else _dtype(dtype)  # a bad name fails before the build
    timer = Timer(device=device, warmup=warmup, min_time=min_time, min_repeats=5, max_repeats=2000)
    device = timer.device
    model = spec.build()
    mode = _eval_mode(model)
    own = explicit is None
    torch_dtype = _own_dtype(model) if explicit is None else explicit
    dtype = str(torch_dtype).removeprefix("torch.")  # as named in messages and the result
    floating = torch_dtype.is_floating_point
    # an integer dtype is the inputs' only (token ids): the weights keep their own dtype, and
    # so do they when no --dtype was given
    convert = floating and not own
    try:
        model = model.to(device=device, dtype=torch_dtype) if convert else model.to(device=device)
    except (Exception, SystemExit) as exc:
        first = next(iter(str(exc).strip().splitlines()), "")
        raise ConfigError(
            f"cannot move {spec.name!r} to {device}"
            + (f" as {dtype}" if convert else "")
            + f": {type(exc).__name__}: {first}; the callable must return a module with real "
            "weights (one built on the meta device has none: load or initialise them first)"
        ) from exc
    copies = device.type != "cpu"
    cuda = device.type == "cuda"
    rows: list[StageResult] = []
    for batch in batch_sizes:
        if progress is not None:
            progress(f"batch {batch}")
        _require_batch_memory(spec, device, batch, torch_dtype)
        shape = (batch, *spec.row_shape)
        if floating:
            host = torch.randn(shape, dtype=torch_dtype)
        else:
            host = torch.randint(0, 2, shape, dtype=torch_dtype)
        if cuda:  # one pinned batch per size of the sweep, each measured on its own
            host = host.pin_memory()  # noqa: TPL702
            torch.cuda.reset_peak_memory_stats(device)

        @torch.inference_mode()
        def forward(x: torch.Tensor) -> Any:
            return model(x)

        @torch.inference_mode()
        def total(host: torch.Tensor = host) -> Any:
            return to_host(model(host.to(device)))

        label = f"{spec.name} batch {batch}"
        h2d = d2h = None
        x = host.to(device)
        y, first_s = _first_forward(spec, forward, x, batch, dtype, timer)

        timed = functools.partial(_later_calls, spec, timer, batch, label)
        if copies:
            h2d = timed("H2D", lambda host=host: host.to(device))
        compute = timed("compute", forward, inputs=[x])
        if copies:
            d2h = timed("D2H", lambda y=y: to_host(y))
        whole = timed("total", total)
        peak = int(torch.cuda.max_memory_allocated(device)) if cuda else None
        rows.append(StageResult(batch, h2d, compute, d2h, whole, peak, first_s))
    note = (
        "torch.cuda.max_memory_allocated during each batch (model weights included)"
        if cuda
        else f"not measured: torch keeps no peak-allocation count for {device.type}"
    )
    return StagesResult(
        model=spec.name,
        device=str(device),
        dtype=dtype,
        row_shape=spec.row_shape,
        rows=tuple(rows),
        memory_note=note,
        input_note=_input_note(spec.row_shape, torch_dtype, mode),
        weights_dtype=str(_own_dtype(model)).removeprefix("torch."),
    )


def _eval_mode(model: nn.Module) -> str:
    """Put ``model`` in eval mode whatever the factory returned (dropout off, batch norm on its
    running statistics) and say so; a module that cannot switch (``ExportedProgram.module()``,
    whose mode was fixed when it was exported) is run as it is."""
    try:
        model.eval()
    except NotImplementedError:
        return f"the model as built ({type(model).__name__} cannot switch to eval mode)"
    return "the model in eval mode"


def _own_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's first floating parameter or buffer; float32 when it has none."""
    import itertools

    import torch

    for tensor in itertools.chain(model.parameters(), model.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.float32


def _later_calls(
    spec: ModelSpec,
    timer: Timer,
    batch: int,
    label: str,
    stage: str,
    fn: Callable[..., object],
    **kw: Any,
) -> Measurement:
    """Time one stage; a model that ran on its first call and fails on a later one says so in
    one line (an error of torchplace's, exit 1), not with a traceback."""
    import torch

    try:
        return timer.measure(fn, label=f"{label} {stage}", **kw)
    except (ConfigError, TimingError, Warning):  # a TimingWarning made an error (-W error)
        raise
    except (Exception, SystemExit) as exc:  # sys.exit() in a forward is a failure to report
        first = next(iter(str(exc).strip().splitlines()), "")
        if isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in first:
            raise ConfigError(
                f"batch {batch} of {spec.name!r} ran out of memory on {timer.device} while "
                f"timing its {stage} stage ({first}); give smaller --batch-sizes"
            ) from exc
        raise TimingError(
            f"{spec.name!r} ran on its first call but failed on a later one, while timing the "
            f"{stage} stage of batch {batch}: {type(exc).__name__}: {first}; bench model calls "
            "the model many times on the same input, so it must not fail on a repeat call "
            "(a counter, a consumed iterator, an input changed in place)"
        ) from exc


def _input_note(
    row_shape: tuple[int, ...], dtype: torch.dtype, mode: str = "the model in eval mode"
) -> str:
    """How the input of every batch is made and passed, as the report states it."""
    shape = ", ".join(["batch", *map(str, row_shape)])
    name = str(dtype).removeprefix("torch.")
    made = (
        f"torch.randn({shape}) {name}"
        if dtype.is_floating_point
        else f"token ids 0 and 1 of shape ({shape}) {name}"
    )
    return f"model(x), x = {made}, {mode} under torch.inference_mode"


def to_host(output: Any) -> Any:
    """``output`` with every tensor in it copied to the host: a model may return a tensor, or
    dicts, lists and tuples (named tuples included) and dataclasses of them, as Hugging Face
    models do. A plain object that holds tensors (the ``DynamicCache`` in a causal language
    model's output keeps its keys and values in ``cache.layers[i]``) cannot be rebuilt, so it
    comes back as the list of host copies of its tensors."""
    import torch

    from torchplace.placement.containers import object_tensors

    if isinstance(output, torch.Tensor):
        return output.cpu()  # noqa: TPL201 (the D2H stage is what a batch here times)
    if isinstance(output, dict):
        return type(output)((k, to_host(v)) for k, v in output.items())
    if isinstance(output, tuple) and hasattr(output, "_fields"):
        return type(output)(*(to_host(v) for v in output))
    if isinstance(output, (list, tuple)):
        return type(output)(to_host(v) for v in output)
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        fields = dataclasses.fields(output)
        changes = {f.name: to_host(getattr(output, f.name)) for f in fields if f.init}
        return dataclasses.replace(output, **changes)
    held = object_tensors(output, "")
    if held:
        return [t.cpu() for _, t in held]  # noqa: TPL201 (what D2H times)
    return output


def _holds_tensor(output: Any) -> bool:
    """True when :func:`to_host` finds a tensor in ``output`` to copy."""
    import torch

    from torchplace.placement.containers import object_tensors

    if isinstance(output, torch.Tensor):
        return True
    if isinstance(output, dict):
        return any(_holds_tensor(v) for v in output.values())
    if isinstance(output, (list, tuple)):
        return any(_holds_tensor(v) for v in output)
    if dataclasses.is_dataclass(output) and not isinstance(output, type):
        return any(_holds_tensor(getattr(output, f.name)) for f in dataclasses.fields(output))
    return bool(object_tensors(output, ""))


def _require_batch_memory(
    spec: ModelSpec, device: torch.device, batch: int, dtype: torch.dtype
) -> None:
    """Refuse a batch whose input alone cannot fit: on the host twice (random, then pinned or
    moved), once more on the device."""
    import math

    import torch

    nbytes = batch * math.prod(spec.row_shape) * dtype.itemsize
    what = f"batch {batch} of {spec.name!r} (input {batch}x{'x'.join(map(str, spec.row_shape))})"
    fix = "give smaller --batch-sizes (or a smaller --input-shape)"
    require_memory(torch.device("cpu"), 2 * nbytes, what, fix)
    if device.type != "cpu":
        require_memory(device, nbytes, what, fix)


def _first_forward(
    spec: ModelSpec,
    forward: Callable[[torch.Tensor], Any],
    x: torch.Tensor,
    batch: int,
    dtype: str,
    timer: Timer,
) -> tuple[Any, float]:
    """The first call, where a model that cannot run on these inputs says so once: its output
    and its synchronised wall time (compilation, lazy initialisation, autotuning included)."""
    import torch

    outputs: list[Any] = []
    try:
        _, first_s = timer._backend.time_one(lambda: outputs.append(forward(x)))
    except (Exception, SystemExit) as exc:  # sys.exit() in a forward is a failure to report
        first = next(iter(str(exc).strip().splitlines()), "")
        if isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in first:
            raise ConfigError(
                f"batch {batch} of {spec.name!r} ran out of memory on {x.device} ({first}); "
                "give smaller --batch-sizes"
            ) from exc
        shape = "x".join(map(str, x.shape))
        row = ", ".join(["batch", *map(str, spec.row_shape)])
        fix = (
            "check --input-shape (one row) and --dtype, and that the model runs on its own; "
            f"bench model calls model(x) with one tensor of shape ({row}), so a model that takes "
            "a dict, a tuple or several inputs needs a wrapper module whose forward(x) builds them"
        )
        if x.dtype.is_floating_point and ("'indices'" in first or "Long, Int" in first):
            # an embedding given random floats: its input is token ids
            fix = "the model takes token ids: give --dtype int64 (or int32)"
            if dtype != "float32":  # an integer --dtype leaves the weights as built
                fix += (
                    f", which leaves the weights in the dtype the callable built them in; for "
                    f"{dtype} weights, have the callable return model.to(torch.{dtype})"
                )
        if "require grad" in first or "grad_fn" in first or "inference tensor" in first.lower():
            # autograd inside forward: off under inference_mode, torch.enable_grad() or not
            fix = (
                "bench model runs the forward under torch.inference_mode, where autograd is off "
                "even inside torch.enable_grad(); time a model that differentiates in its "
                "forward with torchplace.measure(lambda: model(x), ...) instead"
            )
        if isinstance(exc, TypeError) and "argument" in first:
            # forward(x, mask), forward(input_ids=...): the call itself did not fit
            fix = (
                "bench model calls forward with one input tensor; for a model that takes "
                "several, have the callable return a module whose forward(x) builds the others "
                "and calls the model"
            )
        raise ConfigError(
            f"{spec.name!r} failed on a {shape} {dtype} input: {type(exc).__name__}: {first}; {fix}"
        ) from exc
    output = outputs[0]
    if not _holds_tensor(output):
        raise ConfigError(
            f"{spec.name!r} returned {type(output).__name__}, in which bench model finds no tensor "
            "to copy back, so D2H would time nothing; return a tensor, or dicts, lists, tuples "
            "or dataclasses of them (a wrapper module's forward can pick the tensors out)"
        )
    return output, first_s
