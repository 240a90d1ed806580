"""Which torch calls the guard must look at, and what a report calls them.

Calls known to be *pure device compute* (:data:`PURE`: matmuls, pointwise ops, views, norms, ...)
take the function layer's fast path; indexing with plain Python values (:func:`plain_index`)
cannot cross devices; factories that copy host data (:data:`DATA_FACTORIES`) are recorded as
host-to-device copies. :func:`function_name` and :func:`op_name` give the names events carry.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import torch
from torch import Tensor

__all__ = [
    "DATA_FACTORIES",
    "GETITEM",
    "NO_KWARGS",
    "OTHER_NOT_AN_OPERAND",
    "PURE",
    "SCALAR_PARAMS",
    "SEQUENCES",
    "SIZED",
    "function_name",
    "index_lists",
    "op_name",
    "plain_index",
    "reads_device_scalar",
    "reads_device_value",
]


def _resolve(owner: Any, names: Iterable[str]) -> set[Any]:
    found: set[Any] = set()
    for name in names:
        value = getattr(owner, name, None)
        if value is not None:
            found.add(value)
    return found


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_PURE_TENSOR_METHODS: Final = _words(
    """
__add__ __radd__ __iadd__ __sub__ __rsub__ __isub__ __mul__ __rmul__ __imul__ __truediv__
__rtruediv__ __itruediv__ __floordiv__ __rfloordiv__ __matmul__ __rmatmul__ __neg__ __pos__
__pow__ __rpow__ __ipow__ __mod__ __and__ __or__ __xor__ __invert__ __eq__ __ne__ __lt__ __le__
__gt__ __ge__ __abs__ __len__ __hash__ add add_ sub sub_ mul mul_ div div_ matmul mm bmm addmm
pow exp exp_ log sqrt rsqrt abs neg clamp clamp_ relu relu_ sigmoid tanh softmax log_softmax
sum mean std var amax amin argmax argmin max min norm view_as reshape_as permute
transpose t contiguous flatten unflatten unsqueeze squeeze expand_as chunk
split unbind clone detach detach_ float half double bfloat16 int long bool type_as
fill_ zero_ cumsum sort topk gather scatter scatter_ scatter_add_ index_select eq
ne lt le gt ge logical_and logical_or logical_not any all size dim numel stride is_contiguous
element_size nelement data_ptr requires_grad_ retain_grad
sin cos erf flip roll tril triu maximum minimum square softplus exp2 dtype_
is_floating_point is_complex
"""
)

_PURE_TENSOR_PROPERTIES: Final = _words(
    """
shape device dtype is_cuda is_cpu is_meta ndim T mT H mH requires_grad grad data layout is_leaf
grad_fn names is_sparse is_quantized itemsize nbytes
"""
)

_PURE_TORCH_FUNCTIONS: Final = _words(
    """
add sub mul div matmul mm bmm addmm baddbmm cat concat concatenate stack hstack vstack relu
sigmoid tanh softmax log_softmax exp log sqrt rsqrt abs neg clamp sum mean amax amin argmax
argmin max min flatten permute transpose t squeeze unsqueeze chunk split
zeros_like ones_like empty_like full_like rand_like randn_like einsum layer_norm group_norm
batch_norm dropout conv1d conv2d conv3d embedding topk sort gather index_select eq
ne gt lt ge le logical_and logical_or logical_not maximum minimum erf sin cos cumsum flip roll
tril triu outer dot softplus
square
"""
)

_PURE_FUNCTIONAL: Final = _words(
    """
linear bilinear relu relu6 gelu silu mish elu leaky_relu sigmoid tanh softmax log_softmax
dropout layer_norm group_norm batch_norm instance_norm rms_norm conv1d conv2d conv3d
conv_transpose1d conv_transpose2d max_pool1d max_pool2d avg_pool1d avg_pool2d
adaptive_avg_pool1d adaptive_avg_pool2d embedding scaled_dot_product_attention pad normalize
mse_loss l1_loss softplus hardtanh hardswish
"""
)


#: Tensor methods whose arguments after ``self`` are sizes or fill values, and torch functions
#: whose arguments from the first (factories) or the second (``torch.reshape``) on are: torch
#: reads a tensor given there on the host, as a number (``torch.arange(lengths.max())`` makes
#: an ``item()``), so a device tensor there is a sync; the call is pure device compute otherwise.
_SIZED_TENSOR_METHODS: Final = _words(
    "view reshape expand repeat narrow new_zeros new_ones new_empty new_full"
)
_SIZED_TORCH_FUNCTIONS: Final = {
    **dict.fromkeys(_words("zeros ones empty full arange rand randn randint linspace eye"), 0),
    **dict.fromkeys(_words("reshape narrow"), 1),
}

#: Tensor methods whose second tensor gives only a shape (``view_as``) or a dtype and device
#: (``type_as``, a copy when the device differs), not data to compute with: on two devices
#: they are no mixed-device op.
_OTHER_NOT_AN_OPERAND: Final = _words("type_as view_as reshape_as expand_as")


#: Pure calls with number parameters (``Scalar``, ``float`` or ``int`` in every overload):
#: torch's argument parser reads a tensor given there with ``item()``, so a device tensor there
#: is a sync (``x.add(y, alpha=scale)``, ``torch.full_like(x, x.max())``, ``x.topk(k)`` with
#: ``k = mask.sum()``); the call is pure device compute otherwise.
#: ``(owner, names, positions, parameter names)``.
_SCALAR_PARAMETERS: Final = (
    (Tensor, "topk", (1,), ("k",)),
    (torch, "topk", (1,), ("k",)),
    (Tensor, "roll", (1,), ("shifts",)),
    (torch, "roll", (1,), ("shifts",)),
    (Tensor, "chunk", (1,), ("chunks",)),
    (torch, "chunk", (1,), ("chunks",)),
    (Tensor, "split", (1,), ("split_size",)),
    (torch, "split", (1,), ("split_size_or_sections",)),
    (Tensor, "tril triu", (1,), ("diagonal",)),
    (torch, "tril triu", (1,), ("diagonal",)),
    (Tensor, "add add_ sub sub_", (), ("alpha",)),
    (torch, "add sub", (), ("alpha",)),
    (torch, "full_like", (1,), ("fill_value",)),
    (torch, "dropout", (1,), ("p",)),
    (torch, "layer_norm group_norm", (4,), ("eps",)),
    (torch, "batch_norm", (6, 7), ("momentum", "eps")),
    (torch.nn.functional, "hardtanh", (1, 2), ("min_val", "max_val")),
    (torch.nn.functional, "leaky_relu", (1,), ("negative_slope",)),
    (torch.nn.functional, "softplus", (1, 2), ("beta", "threshold")),
    (torch.nn.functional, "elu", (1,), ("alpha",)),
    (torch.nn.functional, "dropout", (1,), ("p",)),
    (torch.nn.functional, "layer_norm group_norm", (4,), ("eps",)),
    (torch.nn.functional, "batch_norm instance_norm", (6, 7), ("momentum", "eps")),
    (torch.nn.functional, "rms_norm", (3,), ("eps",)),
    (torch.nn.functional, "normalize", (1,), ("p",)),  # eps goes to clamp_min: a tensor
    (torch.nn.functional, "pad", (3,), ("value",)),
    (torch.nn.functional, "embedding", (3, 4), ("max_norm", "norm_type")),
    (torch.nn.functional, "scaled_dot_product_attention", (4, 6), ("dropout_p", "scale")),
)


def _build_scalar_params() -> dict[Any, tuple[tuple[int, ...], frozenset[str]]]:
    found: dict[Any, tuple[tuple[int, ...], frozenset[str]]] = {}
    for owner, names, positions, parameters in _SCALAR_PARAMETERS:
        for func in _resolve(owner, _words(names)):
            found[func] = (positions, frozenset(parameters))
    return found


def _build_pure() -> frozenset[Any]:
    pure = _resolve(Tensor, _PURE_TENSOR_METHODS)
    for name in _PURE_TENSOR_PROPERTIES:
        prop = getattr(Tensor, name, None)
        getter = getattr(prop, "__get__", None)
        if getter is not None:
            pure.add(getter)
    pure |= _resolve(torch, _PURE_TORCH_FUNCTIONS)
    pure |= _resolve(torch.nn.functional, _PURE_FUNCTIONAL)
    return frozenset(pure - SCALAR_PARAMS.keys())


#: Pure calls unless a device tensor is given as a number (:func:`reads_device_scalar`): the
#: positions and names of their number parameters.
SCALAR_PARAMS: Final = _build_scalar_params()

#: Calls that only compute on the device their operands are on: no copy, no sync.
PURE: Final = _build_pure()

#: Calls that are pure unless a device tensor sits where torch reads a number
#: (:func:`reads_device_value`), by the position the numbers start at.
SIZED: Final[dict[Any, int]] = {
    **{getattr(Tensor, name): 1 for name in _SIZED_TENSOR_METHODS if hasattr(Tensor, name)},
    **{getattr(torch, n): i for n, i in _SIZED_TORCH_FUNCTIONS.items() if hasattr(torch, n)},
}

#: Pure calls whose operands on two devices are no mixed-device op (a shape or a target).
OTHER_NOT_AN_OPERAND: Final = frozenset(_resolve(Tensor, _OTHER_NOT_AN_OPERAND))

#: Factories that copy host data (lists, numbers, NumPy arrays) to the target device.
DATA_FACTORIES: Final[dict[Any, str]] = {
    **{getattr(torch, n): f"torch.{n}" for n in ("tensor", "as_tensor", "asarray")},
    Tensor.new_tensor: "Tensor.new_tensor",
}

#: ``x[i]``: pure unless the index holds a tensor (:func:`plain_index`).
GETITEM: Final = frozenset({Tensor.__getitem__})
#: ``x[i]`` and ``x[i] = v``: a list in the index becomes an index tensor on ``x``'s device
#: (:func:`index_lists`).
INDEXING: Final = frozenset({Tensor.__getitem__, Tensor.__setitem__})
#: Argument types whose items may be tensors on different devices.
SEQUENCES: Final = (list, tuple)
NO_KWARGS: Final[Mapping[str, Any]] = {}
_PLAIN_INDEX_TYPES: Final = (int, bool, type(None), type(Ellipsis))


def reads_device_value(args: Sequence[Any], start: int, kwargs: Mapping[str, Any]) -> bool:
    """True when a tensor not on the CPU (alone, or in a list or tuple of sizes) is among
    ``args[start:]`` or ``kwargs``: torch will read it on the host."""
    values = args[start:] if start else args
    for value in (*values, *kwargs.values()) if kwargs else values:
        if isinstance(value, Tensor):
            if value.device.type != "cpu":
                return True
        elif type(value) is list or type(value) is tuple:
            for item in value:
                if isinstance(item, Tensor) and item.device.type != "cpu":
                    return True
    return False


def reads_device_scalar(
    args: Sequence[Any], kwargs: Mapping[str, Any], params: tuple[tuple[int, ...], frozenset[str]]
) -> bool:
    """True when a tensor not on the CPU is given as one of a call's number parameters (by
    position or by name): torch reads it on the host."""
    positions, names = params
    for i in positions:
        if i < len(args):
            value = args[i]
            if isinstance(value, Tensor) and value.device.type != "cpu":
                return True
    if kwargs:
        for name in names:
            value = kwargs.get(name)
            if isinstance(value, Tensor) and value.device.type != "cpu":
                return True
    return False


def plain_index(index: Any) -> bool:
    """True when indexing cannot involve a tensor (ints, slices of ints, None, ...)."""
    items = index if type(index) is tuple else (index,)
    for item in items:
        if type(item) is slice:
            if not all(type(v) in _PLAIN_INDEX_TYPES for v in (item.start, item.stop, item.step)):
                return False
        elif type(item) not in _PLAIN_INDEX_TYPES:
            return False
    return True


def _index_items(index: Any) -> tuple[Any, ...]:
    """The items of an index as torch reads them: a tuple, a short list holding a sequence,
    slice, tensor, ``None`` or ``...`` (NumPy's heuristic, which torch keeps), else one item."""
    if type(index) is tuple:
        return index
    if type(index) is list and len(index) < 32:
        for item in index:
            if isinstance(item, (list, tuple, slice, Tensor)) or item is None or item is Ellipsis:
                return tuple(index)
    return (index,)


def _plain_leaves(data: Any) -> tuple[int, bool] | None:
    """How many numbers a nested list or tuple of ints and bools holds, and whether all are
    bools; None when it holds anything else (a tensor, a float, an array)."""
    count, all_bool = 0, True
    for item in data:
        if type(item) is bool:
            count += 1
        elif type(item) is int:
            count += 1
            all_bool = False
        elif type(item) is list or type(item) is tuple:
            inner = _plain_leaves(item)
            if inner is None:
                return None
            count += inner[0]
            all_bool = all_bool and inner[1]
        else:
            return None
    return count, all_bool


def index_lists(index: Any) -> list[int]:
    """The bytes of each index tensor torch makes from a Python list in ``index`` (``x[[0, 2]]``,
    ``x[0, [1, 2]]``, ``x[[True, False]]``): int64 for numbers, one byte for all-bool lists.
    Torch builds each on the CPU and copies it to the indexed tensor's device with a blocking
    copy, out of every mode's sight (``indexing_tensor_from_data``)."""
    sizes = []
    for item in _index_items(index):
        if type(item) is list or type(item) is tuple:
            leaves = _plain_leaves(item)
            if leaves is not None:
                count, all_bool = leaves
                sizes.append(count * (1 if all_bool and count else 8))
    return sizes


@functools.lru_cache(maxsize=512)
def function_name(func: Callable[..., Any]) -> str:
    """The name a report gives a torch function: ``Tensor.item``, ``F.linear``, ``torch.cat``."""
    name = getattr(func, "__name__", None) or repr(func)
    qualname = getattr(func, "__qualname__", name)
    if qualname.startswith(("TensorBase.", "Tensor.")):
        return "Tensor." + qualname.split(".", 1)[1]
    if getattr(torch.nn.functional, name, None) is func:
        return f"F.{name}"
    if getattr(torch, name, None) is func:
        return f"torch.{name}"
    if "__get__" in name or qualname.endswith("__get__"):
        owner = getattr(getattr(func, "__self__", None), "__name__", "?")
        return f"Tensor.{owner}"
    return qualname


def op_name(func: Any) -> str:
    """The name a report gives an aten op: ``aten._to_copy``, ``aten.index.Tensor``."""
    name = str(func)
    return name.removesuffix(".default")
