"""Triton's ``reshape``: the model takes (inputs) or returns (outputs) a row in another shape
than the wire's ``dims``.

A client sends and receives each tensor in its declared shape (``TensorSpec.shape``: the batch
dimension, then ``dims``); :class:`Reshaped` wraps the model so that it sees each input in its
``reshape`` shape and its outputs are answered in their ``dims``, the batch dimension kept
first. A variable dimension (``-1``) takes its size from the other side's variable dimensions,
in order, as in Triton. The batching and execution code see the wrapped model only.
:func:`reshaped` makes the wrapper, only where some declaration has a ``reshape`` that is not
its ``dims``. Imported only then.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from torchplace.models import TensorSpec

__all__ = ["Reshaped", "reshaped"]

#: one declaration's reshape: its name, its dims (the wire's row) and the model's row
_Plan = tuple[str, tuple[int, ...], tuple[int, ...]] | None


def _plan(spec: TensorSpec) -> _Plan:
    dims = tuple(spec.shape[1:])
    if spec.reshape is None or tuple(spec.reshape) == dims:
        return None
    return spec.name, dims, tuple(spec.reshape)


def reshaped(
    module: nn.Module,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    unbatched: bool = False,
) -> nn.Module:
    """``module`` wrapped in :class:`Unbatched` (``unbatched``: Triton's max_batch_size 0),
    then in :class:`Reshaped` when a declaration's ``reshape`` is not its ``dims``."""
    if unbatched:
        module = Unbatched(module)
    ins, outs = tuple(map(_plan, inputs)), tuple(map(_plan, outputs))
    if all(plan is None for plan in (*ins, *outs)):
        return module
    return Reshaped(module, ins, outs)


class Unbatched(nn.Module):
    """A model of Triton's ``max_batch_size: 0``, which takes each request's tensors as sent:
    the server runs one request per call, as a batch of one, and this takes that first
    dimension off each input and puts it back on each output."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> Any:
        raw = self.model(*(x[0] for x in args))
        return _each_output(raw, lambda value, _: _one(value))


def _one(value: Any) -> Any:
    return value.unsqueeze(0) if isinstance(value, torch.Tensor) else value


def _each_output(raw: Any, answer: Callable[[Any, int | str], Any]) -> Any:
    """A forward's result with ``answer(output, its position or name)`` applied to each
    output: a tensor (position 0), a mapping by name, or a sequence (a tuple back); anything
    else as it is, for the execution's check to name."""
    if isinstance(raw, torch.Tensor):
        return answer(raw, 0)
    if isinstance(raw, Mapping):
        return {key: answer(value, key) for key, value in raw.items()}
    if isinstance(raw, tuple | list):
        return tuple(answer(value, i) for i, value in enumerate(raw))
    return raw


def _row(source: Sequence[int], got: Sequence[int], target: Sequence[int]) -> list[int]:
    """``target`` with its variable dimensions given the sizes that ``got`` (a row of shape
    ``source``) has at ``source``'s variable dimensions, in order (Triton's mapping)."""
    sizes = iter([size for dim, size in zip(source, got, strict=True) if dim == -1])
    return [next(sizes) if dim == -1 else dim for dim in target]


class Reshaped(nn.Module):
    """A model fed its inputs in their ``reshape`` shapes and answered in the outputs' ``dims``
    (see the module docstring). ``inputs``/``outputs``: per declaration, in declared order,
    its name, dims and reshape, or None where nothing is reshaped."""

    def __init__(
        self, model: nn.Module, inputs: tuple[_Plan, ...], outputs: tuple[_Plan, ...]
    ) -> None:
        super().__init__()
        self.model = model
        self.input_plans = inputs
        self.output_plans = outputs

    def forward(self, *args: torch.Tensor) -> Any:
        fed = [
            x if plan is None else x.reshape(len(x), *_row(plan[1], x.shape[1:], plan[2]))
            for x, plan in zip(args, self.input_plans, strict=False)
        ]
        raw = self.model(*fed, *args[len(fed) :])
        plans = self.output_plans
        if all(plan is None for plan in plans):
            return raw
        named = {plan[0]: plan for plan in plans if plan is not None}

        def plan_of(where: int | str) -> _Plan:
            if isinstance(where, str):
                return named.get(where)
            return plans[where] if where < len(plans) else None

        return _each_output(raw, lambda value, where: self._answer(value, plan_of(where)))

    @staticmethod
    def _answer(tensor: Any, plan: _Plan) -> Any:
        """An output of the model (a row of its ``reshape``) in its ``dims``."""
        if plan is None or not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
            return tensor
        name, dims, shape = plan
        row = tuple(tensor.shape[1:])
        if len(row) != len(shape) or any(
            d not in (-1, got) for d, got in zip(shape, row, strict=True)
        ):
            raise ValueError(
                f"output {name!r}: the model returned rows of shape {list(row)}, where its "
                f"reshape says {list(shape)} (answered as dims {list(dims)}); give reshape the "
                "shape the model returns, the batch dimension left out"
            )
        return tensor.reshape(len(tensor), *_row(shape, row, dims))
