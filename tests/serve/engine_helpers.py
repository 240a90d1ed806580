"""Models and a copy counter shared by the engine-side serve tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from torchplace.models import TensorSpec
from torchplace.serve.loader import LoadedModel, set_eval, weight_bytes

aten = torch.ops.aten


class CopyCounter(TorchDispatchMode):
    """Counts tensor copies that cross devices, as aten sees them.

    ``meta`` tensors have no data, so a copy out of ``meta`` is recorded and then faked (zeros
    of the right shape on the host); every other op runs for real.
    """

    def __init__(self) -> None:
        super().__init__()
        self.crossings: list[tuple[str, str]] = []
        #: dtype conversions: (device type of the result, source dtype, result dtype)
        self.casts: list[tuple[str, torch.dtype, torch.dtype]] = []
        #: dtypes of the tensors that crossed, in the order of ``crossings``
        self.crossed_dtypes: list[torch.dtype] = []

    def h2d(self) -> int:
        return sum(1 for src, dst in self.crossings if src == "cpu" and dst != "cpu")

    def d2h(self) -> int:
        return sum(1 for src, dst in self.crossings if src != "cpu" and dst == "cpu")

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        target = kwargs.get("device")
        if target is None and len(args) > 1 and isinstance(args[1], torch.device):
            target = args[1]  # aten.to.device(self, device, ...)
        # under inference_mode `Tensor.to` reaches the dispatcher as aten.to, else aten._to_copy
        converts = func.overloadpacket in (aten._to_copy, aten.to)
        if converts and target is not None:
            src = args[0]
            dst = torch.device(target)
            if dst.type != src.device.type:
                self.crossings.append((src.device.type, dst.type))
                self.crossed_dtypes.append(src.dtype)
                if src.device.type == "meta":
                    out = torch.zeros(src.shape, dtype=kwargs.get("dtype") or src.dtype, device=dst)
                    self._note_cast(src, out)
                    return out
        if func is aten.copy_.default:
            dst, src = args[0], args[1]
            if dst.device.type != src.device.type:
                self.crossings.append((src.device.type, dst.device.type))
                self.crossed_dtypes.append(src.dtype)
                if src.device.type == "meta":
                    return dst
            if dst.dtype != src.dtype:
                self.casts.append((dst.device.type, src.dtype, dst.dtype))
        result = func(*args, **kwargs)
        if converts:
            self._note_cast(args[0], result)
        return result

    def _note_cast(self, src: Any, out: Any) -> None:
        tensors = isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor)
        if tensors and out.dtype != src.dtype:
            self.casts.append((out.device.type, src.dtype, out.dtype))


def save_exported(
    path: Path,
    module: nn.Module,
    example: torch.Tensor,
    *,
    batch_max: int | None = 1024,
    batch_min: int | None = 1,
) -> Path:
    """``module`` exported on ``example`` with a dynamic first dimension (``batch_min`` ..
    ``batch_max``; a static one when ``batch_max`` is None), saved to ``path``."""
    dynamic = (
        None
        if batch_max is None
        else ({0: torch.export.Dim("batch", min=batch_min, max=batch_max)},)
    )
    program = torch.export.export(module, (example,), dynamic_shapes=dynamic)
    torch.export.save(program, str(path))
    return path


def loaded(
    module: nn.Module,
    *,
    inputs: tuple[TensorSpec, ...] = (TensorSpec("input", "FP32", (-1, 4)),),
    outputs: tuple[TensorSpec, ...] = (TensorSpec("output", "FP32", (-1, 4)),),
    name: str = "test-model",
) -> LoadedModel:
    return LoadedModel(
        name=name,
        version="1",
        module=set_eval(module),
        inputs=inputs,
        outputs=outputs,
        weight_bytes=weight_bytes(module),
        source="test",
    )


class Scale(nn.Module):
    """y = x * w (w = 2): easy to check row by row."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((width,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class TwoInTwoOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"sum": a + b * self.weight, "prod": (a * b).sum(dim=1, keepdim=True)}


class Faulty(nn.Module):
    """Scale, plus switchable failures that raise the exception types torch raises.

    - ``kernel_failures``: that many forward calls raise RuntimeError (a CUDA kernel error's type);
    - ``oom_over``: a forward with more rows raises torch.OutOfMemoryError;
    - ``poison``: a row whose first value equals it raises torch.OutOfMemoryError even alone.
    """

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((width,), 2.0))
        self.kernel_failures = 0
        self.always_fail = False
        self.oom_over: int | None = None
        self.poison: float | None = None
        self.calls = 0
        self.rows_seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.rows_seen.append(int(x.shape[0]))
        if self.always_fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if self.kernel_failures > 0:
            self.kernel_failures -= 1
            raise RuntimeError("CUDA error: device-side assert triggered")
        if self.oom_over is not None and x.shape[0] > self.oom_over:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {x.shape[0]} rows")
        if self.poison is not None and bool((x[:, 0] == self.poison).any()):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return x * self.weight


def scale_factory() -> nn.Module:
    """A ``module:callable`` factory that declares its tensors on the returned module."""
    model = Scale()
    model.torchplace_inputs = (TensorSpec("x", "FP32", (-1, 4)),)  # type: ignore[assignment]
    model.torchplace_outputs = (TensorSpec("y", "FP32", (-1, 4)),)  # type: ignore[assignment]
    return model


def undeclared_factory() -> nn.Module:
    return Scale()


def declared_on_callable() -> nn.Module:
    return Scale()


declared_on_callable.torchplace_inputs = (TensorSpec("x", "FP32", (-1, 4)),)  # type: ignore[attr-defined]
declared_on_callable.torchplace_outputs = (TensorSpec("y", "FP32", (-1, 4)),)  # type: ignore[attr-defined]


def not_a_module() -> object:
    return object()
