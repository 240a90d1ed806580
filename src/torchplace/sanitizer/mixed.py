"""Mixed-device detection: an op whose tensor operands sit on more than one device.

:func:`maybe_mixed` is the cheap pre-check every call runs; only a ``True`` reaches the precise
check (:func:`check_call` for a torch function, :func:`check_op` for an aten op), which names
every operand and lets CPU scalars through (``x * torch.tensor(2.0)`` is legitimate), and the
operands torch requires on the host whatever the device of the others (``_HOST_OPERANDS``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import torch
from torch import Tensor

from torchplace.sanitizer.calls import function_name, op_name
from torchplace.sanitizer.events import Operand

if TYPE_CHECKING:
    from torchplace.sanitizer.recorder import Guard

__all__ = ["check_call", "check_op", "maybe_mixed", "subclass_decides"]


def maybe_mixed(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Cheap pre-check: do the tensor operands name more than one device?

    A ``True`` only sends the call to the precise check (:func:`_mixed_operands`), which also
    lets CPU scalars through.
    """
    device = None
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, Tensor):
            if device is None:
                device = value.device
            elif value.device != device:
                return True
        elif type(value) is list or type(value) is tuple:
            for item in value:
                if isinstance(item, Tensor):
                    if device is None:
                        device = item.device
                    elif item.device != device:
                        return True
    return False


#: The ``__torch_function__`` of a tensor type that leaves a call to torch: ``Tensor``'s own, and
#: the one ``nn.Parameter`` and ``DTensor`` disable it with.
_PLAIN_TORCH_FUNCTIONS: Final = frozenset(
    {Tensor.__torch_function__.__func__, torch._C._disabled_torch_function_impl}  # type: ignore[attr-defined]
)


def _overrides_torch_function(t: Tensor) -> bool:
    impl = type(t).__torch_function__
    return getattr(impl, "__func__", impl) not in _PLAIN_TORCH_FUNCTIONS


def subclass_decides(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether an operand is a tensor subclass with a ``__torch_function__`` of its own, which
    decides what the call does with it after the guard's function layer has seen it: the
    ``CausalBias`` of ``torch.nn.attention.bias`` claims the CPU and builds its mask on the
    query's device. Its operands' devices are judged by the aten ops the call becomes."""
    for value in (*args, *kwargs.values()) if kwargs else args:
        items = value if type(value) is list or type(value) is tuple else (value,)
        for item in items:
            if (
                isinstance(item, Tensor)
                and type(item) is not Tensor
                and _overrides_torch_function(item)
            ):
                return True
    return False


#: Operands that torch requires on the CPU whatever the device of the data (an aten op's or a
#: torch function's name -> argument names): a packed sequence's lengths and batch sizes,
#: CTC's lengths (taken to the host by torch otherwise; cuDNN's and MIOpen's CTC its targets
#: too) and the sizes a nested tensor is made from a padded one with. On the CPU they are no
#: crossing.
_HOST_OPERANDS: Final[Mapping[str, frozenset[str]]] = {
    "_pack_padded_sequence": frozenset({"lengths"}),
    "_pack_padded_sequence_backward": frozenset({"batch_sizes"}),
    "_pad_packed_sequence": frozenset({"batch_sizes"}),
    "lstm": frozenset({"batch_sizes"}),
    "gru": frozenset({"batch_sizes"}),
    "rnn_tanh": frozenset({"batch_sizes"}),
    "rnn_relu": frozenset({"batch_sizes"}),
    "ctc_loss": frozenset({"input_lengths", "target_lengths"}),
    "_ctc_loss": frozenset({"input_lengths", "target_lengths"}),
    # cuDNN's and MIOpen's CTC take the targets on the host too (torch copies them there)
    **dict.fromkeys(
        ("_use_cudnn_ctc_loss", "_use_miopen_ctc_loss", "_cudnn_ctc_loss", "_miopen_ctc_loss"),
        frozenset({"targets", "input_lengths", "target_lengths"}),
    ),
    "_nested_from_padded": frozenset({"cpu_nested_shape_example"}),
}

#: Arguments that are no operands at all, wherever they sit: a jagged nested tensor's view ops
#: take a ``dummy`` nested tensor that torch keeps on ``meta`` (only to reach the subclass), and
#: ``min_seqlen`` / ``max_seqlen`` tensors on the CPU that hold a number in their shape (no data).
_NOT_OPERANDS: Final[Mapping[str, frozenset[str]]] = dict.fromkeys(
    (
        "_nested_view_from_jagged",
        "_nested_view_from_jagged_copy",
        "_nested_from_padded_tensor",
    ),
    frozenset({"dummy", "min_seqlen", "max_seqlen"}),
)


def _is_cpu_scalar(t: Tensor) -> bool:
    return t.dim() == 0 and t.device.type == "cpu"


def _describe(name: str, t: Tensor) -> Operand:
    return Operand(name, tuple(t.shape), str(t.dtype).removeprefix("torch."), str(t.device))


def _mixed_operands(
    named: Iterable[tuple[str, Any]],
    host: frozenset[str] = frozenset(),
    skip: frozenset[str] = frozenset(),
) -> tuple[Operand, ...] | None:
    """Every tensor operand, when those that are not CPU scalars (nor CPU tensors in the
    arguments ``host`` names) sit on 2+ devices; the arguments ``skip`` names are none."""
    operands: list[Operand] = []
    devices: set[str] = set()
    for name, value in named:
        if name in skip:
            continue
        if isinstance(value, Tensor):
            tensors = [(name, value)]
        elif isinstance(value, (list, tuple)):
            tensors = [(f"{name}[{i}]", v) for i, v in enumerate(value) if isinstance(v, Tensor)]
        else:
            continue
        for label, t in tensors:
            operands.append(_describe(label, t))
            if not (_is_cpu_scalar(t) or (name in host and t.device.type == "cpu")):
                devices.add(str(t.device))
    return tuple(operands) if len(devices) > 1 else None


@functools.lru_cache(maxsize=512)
def _parameter_names(func: Callable[..., Any]) -> tuple[str, ...]:
    """Argument names for messages: the Python signature, else the matching aten schema."""
    try:
        return tuple(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        pass
    name = getattr(func, "__name__", "")
    # torch._nested_from_padded is aten._nested_from_padded; Tensor.__add__ is aten.add (not a
    # TorchScript list op such as aten.__getitem__)
    candidates = (name.strip("_"),) if name.startswith("__") else (name, name.strip("_"))
    packet = None
    for candidate in candidates:
        packet = getattr(torch.ops.aten, candidate, None) if candidate else None
        if packet is not None:
            break
    if packet is None:
        return ()
    try:
        overload = getattr(packet, packet.overloads()[0])
        return tuple(argument.name for argument in overload._schema.arguments)
    except (AttributeError, IndexError, RuntimeError):
        return ()


def _named_args(
    names: Sequence[str], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> list[tuple[str, Any]]:
    named = [(names[i] if i < len(names) else f"arg{i}", a) for i, a in enumerate(args)]
    named.extend(kwargs.items())
    return named


def check_call(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Record a torch function call whose operands sit on two or more devices."""
    host = _HOST_OPERANDS.get(getattr(func, "__name__", ""), frozenset())
    named = _named_args(_parameter_names(func), args, kwargs)
    _check(owner, function_name(func), named, host)


def check_op(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Record an aten op whose operands sit on two or more devices."""
    names = [a.name for a in func._schema.arguments]  # an aten op names its operands
    packet = func._overloadpacket.__name__
    host = _HOST_OPERANDS.get(packet, frozenset())
    skip = _NOT_OPERANDS.get(packet, frozenset())
    _check(owner, op_name(func), _named_args(names, args, kwargs), host, skip)


def _check(
    owner: Guard,
    op: str,
    named: list[tuple[str, Any]],
    host: frozenset[str] = frozenset(),
    skip: frozenset[str] = frozenset(),
) -> None:
    operands = _mixed_operands(named, host, skip)
    if operands is not None:
        devices = sorted({o.device for o in operands})
        owner._emit(
            "mixed_device",
            op,
            detail=f"operands on {', '.join(devices)}",
            operands=operands,
        )
