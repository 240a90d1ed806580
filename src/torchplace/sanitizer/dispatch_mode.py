"""Dispatch-mode recording: the aten ops inside every call the function layer does not know.

:class:`DispatchLayer` is a :class:`~torch.utils._python_dispatch.TorchDispatchMode` pushed only
for the duration of such a call. It sees the aten ops the call decomposes into and records:

* copies (``_to_copy``, ``copy_``): direction, bytes, source and destination; a blocking copy
  between the host and a device is a sync as well as a transfer (on CUDA every such copy goes
  through ``at::cuda::memcpy_and_sync``); a ``non_blocking=True`` host-to-device copy is not (from
  pageable memory it is flagged as ``pageable_non_blocking`` instead). Device-to-device copies
  are never syncs. The ``meta`` device counts as a device, so CPU-only tests can stand it in for
  an accelerator;
* the aten ops that sync (:func:`torchplace.sanitizer.syncs.sync_handlers`);
* any other op whose operands sit on two devices (:mod:`torchplace.sanitizer.mixed`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping, Sequence
from types import CodeType
from typing import TYPE_CHECKING, Any, Final

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from torchplace.placement import canonical_device
from torchplace.sanitizer.calls import op_name
from torchplace.sanitizer.mixed import check_op, maybe_mixed
from torchplace.sanitizer.syncs import BLOCKING_COPY, Handler, active_guards, sync_handlers

if TYPE_CHECKING:
    from torchplace.sanitizer.recorder import Guard

__all__ = ["DispatchLayer", "copy_direction", "is_pinned", "nbytes", "run_under"]


#: What the dispatch layer does with an op it has no handler for, by op (computed once each):
#: decompose a composite, give a custom op's kernel the function layer, or run it.
_COMPOSITE: Final = "composite"
_CUSTOM: Final = "custom"
_PLAIN: Final = "plain"
_kinds: dict[Any, str] = {}


class DispatchLayer(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Sees the aten ops of every call the function layer does not know to be pure."""

    def __init__(self, owner: Guard) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._owner = owner
        _not_compiled_by_dynamo(DispatchLayer.__torch_dispatch__.__code__)
        _not_compiled_by_dynamo(run_under.__code__)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # The default wraps __torch_dispatch__ in a dynamo-disable shim that costs an import of
        # torch._dynamo and a frame per op. torch.compile under a guard traces its layers with
        # the program's code; a crossing recorded there breaks the graph (docs/guard.md, Limits).
        return False

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        if kwargs is None:
            kwargs = {}
        handler = _DISPATCH_HANDLERS.get(func)
        if handler is not None:
            return handler(self._owner, func, args, kwargs)
        kind = _kinds.get(func)
        if kind is None:
            kind = _kinds[func] = _kind(func)
        if kind == _CUSTOM:
            out = _kernel_in_sight(self._owner, func, args, kwargs)
            if out is not NotImplemented:
                return out
        elif kind == _COMPOSITE:
            # Without autograd (inference_mode) composite ops such as aten.to or aten.item
            # reach this mode whole; decompose them under it to see the copies inside.
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if maybe_mixed(args, kwargs):
            check_op(self._owner, func, args, kwargs)
        return func(*args, **kwargs)


#: Namespaces of the ops torch's own C++ kernels implement. Any other op (``torch.library``,
#: ``custom_op``) may have a Python kernel, whose torch calls no layer would see otherwise.
_BUILTIN_NAMESPACES: Final = frozenset({"aten", "prim", "prims"})
_BELOW_PYTHON: Final = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.Python)


def _kernel_in_sight(
    owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """Run a custom op's backend kernel with the guard's function layer active, so that the
    copies and syncs of a Python kernel (``x.cpu().numpy()``, ``.to(x.device)``) are seen at
    their lines. Without another dispatch mode below the guard nor a tensor subclass among the
    operands, torch would go straight to that kernel; it goes there now, by a redispatch below
    the Python key. NotImplemented when it cannot (the op then runs as any other)."""
    if not owner._live[0] or torch._C._len_torch_dispatch_stack():
        # another mode below: a user's or a tracer's keeps its turn; another guard's layer (a
        # nested guard) runs the kernel when the op reaches it, with every guard's layer active
        return NotImplemented
    keys = None
    for value in (*args, *kwargs.values()):
        for t in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(t, Tensor):
                tensor_keys = torch._C._dispatch_keys(t)
                if tensor_keys.has(torch._C.DispatchKey.Python):  # a subclass: its turn first
                    return NotImplemented
                keys = tensor_keys if keys is None else keys | tensor_keys
    if keys is None:
        return NotImplemented
    if maybe_mixed(args, kwargs):
        check_op(owner, func, args, kwargs)
    layers = [g._function for g in active_guards() if g._live[0]]
    if owner._function not in layers:
        layers.append(owner._function)
    with contextlib.ExitStack() as stack:
        for layer in layers:  # innermost guard's last, on top, as when the guards were entered
            stack.enter_context(layer)
        return func.redispatch(keys & _BELOW_PYTHON, *args, **kwargs)


def _kind(func: Any) -> str:
    if _is_composite(func):
        return _COMPOSITE
    return _PLAIN if getattr(func, "namespace", "aten") in _BUILTIN_NAMESPACES else _CUSTOM


def _is_composite(func: Any) -> bool:
    """Whether an op has a composite kernel. Ops that are not in the dispatcher's registry
    (``prim.layout``, which a jagged nested tensor's ``.to()`` calls) have none."""
    try:
        return bool(
            torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
        )
    except RuntimeError:  # "operator prim::layout does not exist"
        return False


def run_under(
    layer: DispatchLayer, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    """``func(*args, **kwargs)`` with ``layer`` pushed: how the function layer runs a call it
    inspects. Dynamo, tracing the function layer inside a ``torch.compile`` region, breaks the
    graph at this call and runs it as it is, with no warning: torch 2.14's dynamo would
    otherwise step into ``TorchDispatchMode.__enter__`` and warn, on the program's stderr, about
    a pybind builtin it cannot trace (earlier ones refused the ``with`` itself, silently)."""
    with layer:
        return func(*args, **kwargs)


# What ``torch.compiler.disable`` marks a function with; dynamo does not inline a function that
# carries it (torch 2.4 and later). Set here on torchplace's own function: torch is untouched.
run_under._torchdynamo_disable = True  # type: ignore[attr-defined]


@functools.cache
def _not_compiled_by_dynamo(code: CodeType) -> None:
    """Have dynamo run ``code`` as it is, never compile it as a frame of its own.

    A call the function layer inspects runs under this layer outside any graph (dynamo breaks
    the graph there), so torch calls ``__torch_dispatch__`` once per aten op while
    ``torch.compile`` watches new frames: dynamo would try to compile it for each, recompile up
    to its limit, and warn about torchplace's code on the program's stderr. Torch before 2.6
    has no per-code strategy; there the program sees that warning. Done once, by the first
    layer made (importing the guard changes nothing in torch).
    """
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )

        set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT))
    except (ImportError, AttributeError, TypeError):  # a torch without it, or with another form
        return


# -------------------------------------------------------------------------------------------
# copies
# -------------------------------------------------------------------------------------------
def copy_direction(src: torch.device, dst: torch.device) -> str:
    """``h2d``, ``d2h`` or ``d2d``, by device type (``meta`` counts as a device)."""
    if src.type == "cpu":
        return "h2d"
    if dst.type == "cpu":
        return "d2h"
    return "d2d"


#: A ``non_blocking=True`` host-to-device copy from pageable memory: torch does not wait for the
#: stream (no sync), but the copy is staged by the driver and the call returns after staging.
_PAGEABLE_H2D: Final = (
    "non_blocking=True from pageable host memory is not asynchronous: the driver stages the "
    "data and the call returns after staging; pin the source (tensor.pin_memory() or "
    "DataLoader(pin_memory=True))"
)


def is_pinned(t: Tensor) -> bool:
    try:
        return bool(t.is_pinned())
    except RuntimeError:  # no accelerator backend to ask
        return False


def nbytes(t: Tensor) -> int:
    """The bytes a copy of ``t`` moves."""
    return int(t.numel()) * int(t.element_size())


def _crossing_bytes(
    direction: str, src_t: Tensor, numel: int, dst_dtype: torch.dtype, non_blocking: bool
) -> int:
    """The bytes a copy sends across: one element per destination element (a broadcasting
    ``copy_`` expands its source first), of the dtype they cross in. Like torch's CUDA copy
    kernel, a blocking host-to-device copy converts on the host and a ``non_blocking``
    device-to-host copy on the device before the copy; any other converts after it."""
    converted_first = (direction == "h2d" and not non_blocking) or (
        direction == "d2h" and non_blocking
    )
    dtype = dst_dtype if converted_first else src_t.dtype
    if src_t.layout != torch.strided:
        stored = _stored_bytes(src_t, dtype)
        if stored is not None:
            return stored
    return numel * dtype.itemsize


#: How to reach the index tensors of each sparse layout (the values are ``values()``).
_SPARSE_INDICES: Final = {
    torch.sparse_coo: ("_indices",),
    torch.sparse_csr: ("crow_indices", "col_indices"),
    torch.sparse_bsr: ("crow_indices", "col_indices"),
    torch.sparse_csc: ("ccol_indices", "row_indices"),
    torch.sparse_bsc: ("ccol_indices", "row_indices"),
}


def _stored_bytes(t: Tensor, dtype: torch.dtype) -> int | None:
    """What a copy of a sparse or jagged nested tensor sends: its index tensors (a nested
    tensor's offsets) and its stored values (in ``dtype``), not its dense size; None for a
    layout without them."""
    if t.layout == torch.jagged:
        # a jagged nested tensor: its values, then its offsets (and lengths), each copied with a
        # .to() of its own
        metadata = (getattr(t, "_offsets", None), getattr(t, "_lengths", None))
        values = getattr(t, "_values", None)
        if not isinstance(values, Tensor):
            return None
        return values.numel() * dtype.itemsize + sum(
            nbytes(m) for m in metadata if isinstance(m, Tensor)
        )
    names = _SPARSE_INDICES.get(t.layout)
    if names is None:
        return None
    values = t._values() if t.layout == torch.sparse_coo else t.values()
    return sum(nbytes(getattr(t, name)()) for name in names) + values.numel() * dtype.itemsize


def _record_copy(
    owner: Guard,
    op: str,
    src_t: Tensor,
    dst: torch.device,
    non_blocking: bool,
    *,
    numel: int,
    dst_dtype: torch.dtype,
) -> str | None:
    """Record a copy of ``src_t`` to ``numel`` elements of ``dst_dtype`` on ``dst`` (transfer,
    pageable source, blocking sync); the direction, or None when both sides are the same device
    (not a crossing)."""
    src = src_t.device
    dst = canonical_device(dst)  # .to("cuda") names no index; the copy goes to cuda:N
    if src == dst:
        return None
    direction = copy_direction(src, dst)
    size = _crossing_bytes(direction, src_t, numel, dst_dtype, non_blocking)
    owner._transfer(direction, op, size, src, dst, non_blocking)
    if direction == "h2d" and non_blocking and not is_pinned(src_t):
        owner._emit("pageable_non_blocking", op, detail=_PAGEABLE_H2D)
    # torch returns before any memcpy (so before any wait) when there is no element to copy
    if not non_blocking and direction in BLOCKING_COPY and src_t.numel() > 0:
        owner._sync(op, BLOCKING_COPY[direction])
    return direction


def _pageable_d2h(owner: Guard, op: str, detail: str) -> None:
    owner._emit("pageable_non_blocking", op, detail=detail)
    owner._sync(op, "device-to-host copy into pageable memory")


def _to_copy(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    src_t, dst = args[0], kwargs.get("device")
    if dst is None or not isinstance(src_t, Tensor):
        return func(*args, **kwargs)
    op = op_name(func)
    non_blocking = bool(kwargs.get("non_blocking", False))
    dtype = kwargs.get("dtype") or src_t.dtype
    direction = _record_copy(
        owner, op, src_t, torch.device(dst), non_blocking, numel=src_t.numel(), dst_dtype=dtype
    )
    out = func(*args, **kwargs)
    if direction == "d2h" and non_blocking and not is_pinned(out):
        _pageable_d2h(owner, op, "non_blocking=True into pageable host memory runs synchronously")
    return out


def _copy_(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    dst_t, src_t = args[0], args[1]
    if not (isinstance(dst_t, Tensor) and isinstance(src_t, Tensor)):
        return func(*args, **kwargs)
    op = op_name(func)
    non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    direction = _record_copy(
        owner, op, src_t, dst_t.device, non_blocking, numel=dst_t.numel(), dst_dtype=dst_t.dtype
    )
    if direction == "d2h" and non_blocking and not is_pinned(dst_t):
        _pageable_d2h(
            owner,
            op,
            "non_blocking=True into pageable host memory runs synchronously; "
            "copy into a pinned buffer",
        )
    return func(*args, **kwargs)


_DISPATCH_HANDLERS: Final[dict[Any, Handler]] = {
    torch.ops.aten._to_copy.default: _to_copy,
    torch.ops.aten.copy_.default: _copy_,
    **sync_handlers(),
}
