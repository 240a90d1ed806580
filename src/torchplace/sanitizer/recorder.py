"""The guard itself: a torch-function front door and a torch-dispatch inspector, per thread.

How it works, and why it is cheap:

* A :class:`~torch.overrides.TorchFunctionMode` sees every torch call the user's Python code
  makes (``F.linear``, ``Tensor.item``, ``x[mask]``, ``torch.tensor(..., device=...)``). Calls
  known to be *pure device compute* (matmuls, pointwise ops, views, norms, ...) take the fast
  path: a cheap same-device check of their tensor operands, then the call itself.
* Every other call (copies, ``.item()``, indexing with tensors, unknown functions) runs with a
  :class:`~torch.utils._python_dispatch.TorchDispatchMode` pushed for its duration, which sees
  the aten ops it decomposes into: ``_to_copy``/``copy_`` (direction, bytes, pinned or pageable),
  ``_local_scalar_dense``, ``nonzero``, boolean-mask ``index``, ...
* API-level syncs (``Tensor.item``, ``.tolist()``, ``.numpy()``, ``bool(t)``, and printing:
  ``print(t)``, ``repr(t)``, ``f"{t}"``) are recorded once, at the function layer, under their
  user-facing name; the aten ops they become are then not counted again (torch hides a print's
  many small reads from dispatch modes anyway). The bytes a ``.tolist()`` moves are still
  recorded as a D2H transfer.
* ``torch.cuda.synchronize`` (and ``torch.accelerator.synchronize``, ``Stream``/``Event``
  ``synchronize``) are plain Python functions that no mode sees: while any guard is active they
  are wrapped, and the wrapper records only for guards active on the calling thread.
* A stack is captured only when something is recorded, by walking ``sys._getframe`` up to the
  first frame outside torch and torchplace.

Syncs are recorded only for tensors on a non-CPU device: reading a CPU tensor on the host
stalls nothing. A blocking copy between the host and a device, in either direction, is a sync as
well as a transfer (on CUDA every such copy goes through ``at::cuda::memcpy_and_sync``, which
waits for the stream); a ``non_blocking=True`` host-to-device copy is not (from pageable memory it
is flagged as ``pageable_non_blocking`` instead). Device-to-device copies are never syncs. The
``meta`` device counts as a device, so CPU-only tests can stand it in for an accelerator.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import sysconfig
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any, Final

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import torchplace
from torchplace.errors import ConfigError, GuardViolation
from torchplace.placement import canonical_device
from torchplace.sanitizer.events import KINDS, TRANSFER_KINDS, Event, GuardWarning, Operand, Site
from torchplace.sanitizer.report import DEFAULT_MAX_EVENTS, MODES, GuardReport, _site_matches

__all__ = ["Guard", "guard"]

# -------------------------------------------------------------------------------------------
# Where the user's code is
# -------------------------------------------------------------------------------------------
_INTERNAL_PREFIXES: Final = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(torchplace.__file__) + os.sep,
    "<frozen ",
)
_STDLIB: Final = os.path.normcase(sysconfig.get_paths()["stdlib"]) + os.sep
_internal_files: dict[str, bool] = {}
_UNKNOWN_SITE: Final = Site("<unknown>", 0, "<unknown>")


def _is_internal(filename: str) -> bool:
    """torch, torchplace and the standard library (``copy``, ``contextlib``, ...) are not the
    user's code; third-party packages are."""
    internal = _internal_files.get(filename)
    if internal is None:
        normalized = os.path.normcase(filename)
        internal = filename.startswith(_INTERNAL_PREFIXES) or (
            normalized.startswith(_STDLIB)
            and "site-packages" not in normalized
            and "dist-packages" not in normalized
        )
        _internal_files[filename] = internal
    return internal


def user_site() -> Site:
    """The innermost frame on this thread's stack that is neither torch nor torchplace code."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and _is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return _UNKNOWN_SITE
    return Site(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


# -------------------------------------------------------------------------------------------
# What is worth looking at
# -------------------------------------------------------------------------------------------
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
sum mean std var amax amin argmax argmin max min norm view view_as reshape reshape_as permute
transpose t contiguous flatten unflatten unsqueeze squeeze expand expand_as repeat narrow chunk
split unbind clone detach detach_ float half double bfloat16 int long bool type_as masked_fill
masked_fill_ fill_ zero_ cumsum sort topk gather scatter scatter_ scatter_add_ index_select eq
ne lt le gt ge logical_and logical_or logical_not any all size dim numel stride is_contiguous
element_size nelement data_ptr requires_grad_ retain_grad new_zeros new_ones new_empty new_full
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
argmin max min reshape flatten permute transpose t squeeze unsqueeze chunk split narrow
zeros_like ones_like empty_like full_like rand_like randn_like einsum layer_norm group_norm
batch_norm dropout conv1d conv2d conv3d embedding topk sort gather index_select masked_fill eq
ne gt lt ge le logical_and logical_or logical_not maximum minimum erf sin cos cumsum flip roll
tril triu outer dot zeros ones empty full arange rand randn randint linspace eye softplus
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


def _build_pure() -> frozenset[Any]:
    pure = _resolve(Tensor, _PURE_TENSOR_METHODS)
    for name in _PURE_TENSOR_PROPERTIES:
        prop = getattr(Tensor, name, None)
        getter = getattr(prop, "__get__", None)
        if getter is not None:
            pure.add(getter)
    pure |= _resolve(torch, _PURE_TORCH_FUNCTIONS)
    pure |= _resolve(torch.nn.functional, _PURE_FUNCTIONAL)
    return frozenset(pure)


#: Calls that only compute on the device their operands are on: no copy, no sync.
_PURE: Final = _build_pure()

_READ_ON_HOST: Final = "a device value read on the host"
#: Printing reads the values with many small device reads that torch hides from dispatch modes
#: (``torch._tensor_str`` disables them): the guard records the print as one sync, by its name.
_PRINTED: Final = "printing a device tensor reads its values on the host"

#: API calls that read device data on the host (a sync when the tensor is not on the CPU and
#: holds data): the name to record, and why it syncs.
_FUNCTION_SYNCS: Final[dict[Any, tuple[str, str]]] = {
    **{
        getattr(Tensor, name): (f"Tensor.{name}", _READ_ON_HOST)
        for name in ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__")
        if hasattr(Tensor, name)
    },
    # print(t), str(t), repr(t) and f"{t}" (any dim), f"{loss:.3f}" (0-dim)
    Tensor.__repr__: ("Tensor.__repr__", _PRINTED),
    Tensor.__format__: ("Tensor.__format__", _PRINTED),
}

#: Factories that copy host data (lists, numbers, NumPy arrays) to the target device.
_DATA_FACTORIES: Final[dict[Any, str]] = {
    **{getattr(torch, n): f"torch.{n}" for n in ("tensor", "as_tensor", "asarray")},
    Tensor.new_tensor: "Tensor.new_tensor",
}

_GETITEM: Final = frozenset({Tensor.__getitem__})
_SEQUENCES: Final = (list, tuple)
_NO_KWARGS: Final[Mapping[str, Any]] = {}
_PLAIN_INDEX_TYPES: Final = (int, bool, type(None), type(Ellipsis))


def _plain_index(index: Any) -> bool:
    """True when indexing cannot involve a tensor (ints, slices of ints, None, ...)."""
    items = index if type(index) is tuple else (index,)
    for item in items:
        if type(item) is slice:
            if not all(type(v) in _PLAIN_INDEX_TYPES for v in (item.start, item.stop, item.step)):
                return False
        elif type(item) not in _PLAIN_INDEX_TYPES:
            return False
    return True


def _maybe_mixed(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
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


def _is_cpu_scalar(t: Tensor) -> bool:
    return t.dim() == 0 and t.device.type == "cpu"


def _describe(name: str, t: Tensor) -> Operand:
    return Operand(name, tuple(t.shape), str(t.dtype).removeprefix("torch."), str(t.device))


def _mixed_operands(named: Iterable[tuple[str, Any]]) -> tuple[Operand, ...] | None:
    """Every tensor operand, when those that are not CPU scalars sit on 2+ devices."""
    operands: list[Operand] = []
    devices: set[str] = set()
    for name, value in named:
        if isinstance(value, Tensor):
            tensors = [(name, value)]
        elif isinstance(value, (list, tuple)):
            tensors = [(f"{name}[{i}]", v) for i, v in enumerate(value) if isinstance(v, Tensor)]
        else:
            continue
        for label, t in tensors:
            operands.append(_describe(label, t))
            if not _is_cpu_scalar(t):
                devices.add(str(t.device))
    return tuple(operands) if len(devices) > 1 else None


@functools.lru_cache(maxsize=512)
def _parameter_names(func: Callable[..., Any]) -> tuple[str, ...]:
    """Argument names for messages: the Python signature, else the matching aten schema."""
    try:
        return tuple(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        pass
    name = getattr(func, "__name__", "").strip("_")
    packet = getattr(torch.ops.aten, name, None) if name else None
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


@functools.lru_cache(maxsize=512)
def _function_name(func: Callable[..., Any]) -> str:
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


def _op_name(func: Any) -> str:
    name = str(func)
    return name.removesuffix(".default")


def _direction(src: torch.device, dst: torch.device) -> str:
    if src.type == "cpu":
        return "h2d"
    if dst.type == "cpu":
        return "d2h"
    return "d2d"


#: Why a blocking copy between the host and a device is a sync, by direction. On CUDA every one
#: of them goes through ``at::cuda::memcpy_and_sync`` (a ``cudaStreamSynchronize``, and what
#: ``torch.cuda.set_sync_debug_mode`` reports); device-to-device copies are not syncs.
_BLOCKING_COPY: Final = {
    "h2d": "blocking host-to-device copy",
    "d2h": "blocking device-to-host copy",
}

#: A ``non_blocking=True`` host-to-device copy from pageable memory: torch does not wait for the
#: stream (no sync), but the copy is staged by the driver and the call returns after staging.
_PAGEABLE_H2D: Final = (
    "non_blocking=True from pageable host memory is not asynchronous: the driver stages the "
    "data and the call returns after staging; pin the source (tensor.pin_memory() or "
    "DataLoader(pin_memory=True))"
)


def _is_pinned(t: Tensor) -> bool:
    try:
        return bool(t.is_pinned())
    except RuntimeError:  # no accelerator backend to ask
        return False


def _nbytes(t: Tensor) -> int:
    return int(t.numel()) * int(t.element_size())


# -------------------------------------------------------------------------------------------
# The two layers
# -------------------------------------------------------------------------------------------
_composite: dict[Any, bool] = {}


class _DispatchLayer(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Sees the aten ops of every call the function layer does not know to be pure."""

    def __init__(self, owner: Guard) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._owner = owner

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # The default wraps __torch_dispatch__ in a dynamo-disable shim that costs an import of
        # torch._dynamo and a frame per op; the guard never runs under compilation.
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
        composite = _composite.get(func)
        if composite is None:
            composite = _composite[func] = torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), "CompositeImplicitAutograd"
            )
        if composite:
            # Without autograd (inference_mode) composite ops such as aten.to or aten.item
            # reach this mode whole; decompose them under it to see the copies inside.
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if _maybe_mixed(args, kwargs):
            self._owner._check_mixed_op(func, args, kwargs)
        return func(*args, **kwargs)


class _FunctionLayer(TorchFunctionMode):
    """The front door: every torch call from Python comes here first."""

    def __init__(self, owner: Guard) -> None:
        super().__init__()
        self._owner = owner

    def __torch_function__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        if func in _PURE:
            # the fast path: pure device compute; only look for operands on two devices (a
            # lone positional operand that is not a list or tuple names one device at most)
            if (kwargs or len(args) > 1 or (args and type(args[0]) in _SEQUENCES)) and _maybe_mixed(
                args, kwargs or _NO_KWARGS
            ):
                self._owner._check_mixed_call(func, args, kwargs or _NO_KWARGS)
            return func(*args, **kwargs) if kwargs else func(*args)
        kwargs = kwargs or _NO_KWARGS
        if func in _GETITEM and _plain_index(args[1]):
            return func(*args, **kwargs)
        return self._owner._inspected_call(func, args, kwargs)


# -------------------------------------------------------------------------------------------
# aten handlers (dispatch layer)
# -------------------------------------------------------------------------------------------
_Handler = Callable[["Guard", Any, Sequence[Any], Mapping[str, Any]], Any]


def _record_copy(
    owner: Guard, op: str, src_t: Tensor, dst: torch.device, non_blocking: bool
) -> str | None:
    """Record a copy of ``src_t`` to ``dst`` (transfer, pageable source, blocking sync); the
    direction, or None when both sides are the same device (not a crossing)."""
    src = src_t.device
    dst = canonical_device(dst)  # .to("cuda") names no index; the copy goes to cuda:N
    if src == dst:
        return None
    direction = _direction(src, dst)
    owner._transfer(direction, op, _nbytes(src_t), src, dst, non_blocking)
    if direction == "h2d" and non_blocking and not _is_pinned(src_t):
        owner._emit("pageable_non_blocking", op, detail=_PAGEABLE_H2D)
    # torch returns before any memcpy (so before any wait) when there is no element to copy
    if not non_blocking and direction in _BLOCKING_COPY and src_t.numel() > 0:
        owner._sync(op, _BLOCKING_COPY[direction])
    return direction


def _pageable_d2h(owner: Guard, op: str, detail: str) -> None:
    owner._emit("pageable_non_blocking", op, detail=detail)
    owner._sync(op, "device-to-host copy into pageable memory")


def _to_copy(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    src_t, dst = args[0], kwargs.get("device")
    if dst is None or not isinstance(src_t, Tensor):
        return func(*args, **kwargs)
    op = _op_name(func)
    non_blocking = bool(kwargs.get("non_blocking", False))
    direction = _record_copy(owner, op, src_t, torch.device(dst), non_blocking)
    out = func(*args, **kwargs)
    if direction == "d2h" and non_blocking and not _is_pinned(out):
        _pageable_d2h(owner, op, "non_blocking=True into pageable host memory runs synchronously")
    return out


def _copy_(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    dst_t, src_t = args[0], args[1]
    if not (isinstance(dst_t, Tensor) and isinstance(src_t, Tensor)):
        return func(*args, **kwargs)
    op = _op_name(func)
    non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    direction = _record_copy(owner, op, src_t, dst_t.device, non_blocking)
    if direction == "d2h" and non_blocking and not _is_pinned(dst_t):
        _pageable_d2h(
            owner,
            op,
            "non_blocking=True into pageable host memory runs synchronously; "
            "copy into a pinned buffer",
        )
    return func(*args, **kwargs)


def _sync_handler(why: str) -> _Handler:
    def handler(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        t = args[0] if args else None
        if isinstance(t, Tensor) and t.device.type != "cpu":
            owner._sync(_op_name(func), why)
        return func(*args, **kwargs)

    return handler


def _index_handler(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    t, indices = args[0], args[1]
    if (
        isinstance(t, Tensor)
        and t.device.type != "cpu"
        and any(isinstance(i, Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)
    ):
        owner._sync(_op_name(func), "boolean-mask indexing (the result size needs a nonzero)")
    if _maybe_mixed(args, kwargs):
        owner._check_mixed_op(func, args, kwargs)
    return func(*args, **kwargs)


def _repeat_interleave(
    owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    t = args[0]
    if isinstance(t, Tensor) and t.device.type != "cpu" and kwargs.get("output_size") is None:
        owner._sync(_op_name(func), "repeat_interleave without output_size")
    return func(*args, **kwargs)


def _build_handlers() -> dict[Any, _Handler]:
    aten = torch.ops.aten
    handlers: dict[Any, _Handler] = {
        aten._to_copy.default: _to_copy,
        aten.copy_.default: _copy_,
        aten._local_scalar_dense.default: _sync_handler(_READ_ON_HOST),
        aten.nonzero.default: _sync_handler("nonzero (the result size depends on the data)"),
        aten.masked_select.default: _sync_handler("masked_select (data-dependent size)"),
        aten.equal.default: _sync_handler("equal (a Python bool computed from device data)"),
        aten.index.Tensor: _index_handler,
        aten.index_put_.default: _index_handler,
        aten.index_put.default: _index_handler,
        aten._index_put_impl_.default: _index_handler,
        aten.repeat_interleave.Tensor: _repeat_interleave,
        aten.repeat_interleave.self_Tensor: _repeat_interleave,
    }
    for name in ("_unique2", "unique_dim", "unique_consecutive", "_unique", "bincount"):
        packet = getattr(aten, name, None)
        overload = getattr(packet, "default", None) if packet is not None else None
        if overload is not None:
            handlers[overload] = _sync_handler(f"{name} (data-dependent size)")
    return handlers


_DISPATCH_HANDLERS: Final = _build_handlers()

# -------------------------------------------------------------------------------------------
# torch.cuda.synchronize and friends (plain Python: no mode sees them)
# -------------------------------------------------------------------------------------------
_state = threading.local()
_patch_lock = threading.Lock()
_patch_users = 0
_patched: list[tuple[Any, str, Any]] = []


def _active_guards() -> list[Guard]:
    guards: list[Guard] | None = getattr(_state, "guards", None)
    if guards is None:
        guards = _state.guards = []
    return guards


def _sync_targets() -> list[tuple[Any, str, str]]:
    targets: list[tuple[Any, str, str]] = [(torch.cuda, "synchronize", "torch.cuda.synchronize")]
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "synchronize"):
        targets.append((accelerator, "synchronize", "torch.accelerator.synchronize"))
    for cls_name in ("Stream", "Event"):
        cls = getattr(torch.cuda, cls_name, None)
        if cls is not None and "synchronize" in vars(cls):
            targets.append((cls, "synchronize", f"torch.cuda.{cls_name}.synchronize"))
    return targets


def _wrap_sync(original: Callable[..., Any], name: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(_state, "in_sync", False):
            return original(*args, **kwargs)
        _state.in_sync = True
        try:
            for owner in reversed(_active_guards()):
                owner._sync(name, "explicit synchronization")
            return original(*args, **kwargs)
        finally:
            _state.in_sync = False

    wrapper.__torchplace_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _install_sync_wrappers() -> None:
    global _patch_users
    with _patch_lock:
        if _patch_users == 0:
            for owner_obj, attr, name in _sync_targets():
                original = getattr(owner_obj, attr)
                _patched.append((owner_obj, attr, original))
                setattr(owner_obj, attr, _wrap_sync(original, name))
        _patch_users += 1


def _remove_sync_wrappers() -> None:
    global _patch_users
    with _patch_lock:
        _patch_users -= 1
        if _patch_users == 0:
            while _patched:
                owner_obj, attr, original = _patched.pop()
                setattr(owner_obj, attr, original)


# -------------------------------------------------------------------------------------------
# The public context manager
# -------------------------------------------------------------------------------------------
def _parse_allow(allow: Iterable[str] | str | None) -> tuple[frozenset[str], tuple[str, ...]]:
    if allow is None:
        return frozenset(), ()
    items = (allow,) if isinstance(allow, str) else tuple(allow)
    kinds: set[str] = set()
    sites: list[str] = []
    for item in items:
        if not isinstance(item, str) or not item:
            raise ConfigError(
                f"allow entries must be non-empty strings (an event kind or 'file.py:LINE'), "
                f"got {item!r}"
            )
        if item in KINDS:
            kinds.add(item)
        elif item == "transfer":
            kinds |= TRANSFER_KINDS
        elif ".py" in item or ":" in item or "/" in item or item.startswith("<"):
            sites.append(item)
        else:
            raise ConfigError(
                f"allow entry {item!r} is neither an event kind ({', '.join(KINDS)}, transfer) "
                "nor a source location like 'train.py' or 'train.py:42'"
            )
    return frozenset(kinds), tuple(sites)


class Guard:
    """Records device crossings and host syncs on the thread that enters it.

    Use it through :func:`guard`; entering returns the :class:`GuardReport` that fills up
    while the block runs. A guard can be entered again after it exits (events accumulate in the
    same report) but not twice at once.
    """

    def __init__(
        self,
        mode: str = "record",
        *,
        allow: Iterable[str] | str | None = None,
        max_events: int = DEFAULT_MAX_EVENTS,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"guard mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.allow_kinds, self.allow_sites = _parse_allow(allow)
        self.report = GuardReport(mode, max_events=max_events)
        self._function = _FunctionLayer(self)
        self._dispatch = _DispatchLayer(self)
        self._suppress_syncs = 0
        self._transfers_seen = 0
        self._warned: set[tuple[Site, str]] = set()
        self._thread: int | None = None

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> GuardReport:
        if self._thread is not None:
            raise ConfigError("this guard is already active; create another torchplace.guard()")
        self._thread = threading.get_ident()
        _install_sync_wrappers()
        _active_guards().append(self)
        self._function.__enter__()  # type: ignore[no-untyped-call]
        return self.report

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._function.__exit__(exc_type, exc, tb)  # type: ignore[no-untyped-call]
        finally:
            guards = _active_guards()
            if self in guards:
                guards.remove(self)
            _remove_sync_wrappers()
            self._thread = None

    def __repr__(self) -> str:
        return f"Guard(mode={self.mode!r}, events={len(self.report)})"

    # -- calls the function layer hands over ----------------------------------------------------
    def _inspected_call(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        api = _FUNCTION_SYNCS.get(func)
        if api is not None:
            t = args[0] if args else None
            # an empty tensor has nothing to read: torch copies or reads nothing, so no sync
            if isinstance(t, Tensor) and t.device.type != "cpu" and t.numel() > 0:
                self._sync(*api)
                self._suppress_syncs += 1
                try:
                    with self._dispatch:
                        return func(*args, **kwargs)
                finally:
                    self._suppress_syncs -= 1
        factory = _DATA_FACTORIES.get(func)
        seen = self._transfers_seen
        with self._dispatch:
            out = func(*args, **kwargs)
        if (
            factory is not None
            and isinstance(out, Tensor)
            and out.device.type != "cpu"
            and self._transfers_seen == seen
        ):
            # torch builds host data on the CPU, then copies it over with the Python dispatch
            # key excluded (or, for meta, not at all): record the copy here unless the dispatch
            # layer saw it already (tensor data, or a torch that lets the mode see it)
            position = 1 if factory == "Tensor.new_tensor" else 0
            data = args[position] if len(args) > position else kwargs.get("data")
            if not isinstance(data, Tensor):
                self._transfer(
                    "h2d", factory, _nbytes(out), torch.device("cpu"), out.device, False, after=True
                )
                # torch's own copy is a blocking one (non_blocking=False): a sync on CUDA,
                # unless there is no element to copy
                if out.numel() > 0:
                    self._sync(factory, _BLOCKING_COPY["h2d"])
        return out

    def _check_mixed_call(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        self._check_mixed(_function_name(func), _named_args(_parameter_names(func), args, kwargs))

    def _check_mixed_op(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        names = [a.name for a in func._schema.arguments]  # an aten op names its operands
        self._check_mixed(_op_name(func), _named_args(names, args, kwargs))

    def _check_mixed(self, op: str, named: list[tuple[str, Any]]) -> None:
        operands = _mixed_operands(named)
        if operands is not None:
            devices = sorted({o.device for o in operands})
            self._emit(
                "mixed_device",
                op,
                detail=f"operands on {', '.join(devices)}",
                operands=operands,
            )

    # -- recording -----------------------------------------------------------------------------
    def _transfer(
        self,
        direction: str,
        op: str,
        nbytes: int,
        src: torch.device,
        dst: torch.device,
        non_blocking: bool,
        *,
        after: bool = False,
    ) -> None:
        self._transfers_seen += 1
        detail = "non_blocking=True" if non_blocking else ""
        if after:
            detail = "copied from host data inside the factory"
        self._emit(direction, op, nbytes=nbytes, src=str(src), dst=str(dst), detail=detail)

    def _sync(self, op: str, why: str) -> None:
        if self._suppress_syncs:
            return
        self._emit("sync", op, detail=why)

    def _emit(
        self,
        kind: str,
        op: str,
        *,
        nbytes: int = 0,
        src: str | None = None,
        dst: str | None = None,
        detail: str = "",
        operands: tuple[Operand, ...] = (),
    ) -> None:
        if kind in self.allow_kinds:
            return
        site = user_site()
        if self.allow_sites and any(_site_matches(site, p) for p in self.allow_sites):
            return
        event = Event(kind, site, op, nbytes, src, dst, detail, operands)
        self.report.add(event)
        if self.mode == "warn":
            key = (site, kind)
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn_explicit(
                    f"torchplace guard: {event.describe()}",
                    GuardWarning,
                    site.filename,
                    site.lineno,
                )
        elif self.mode == "raise":
            raise GuardViolation(
                f"{event.describe()}\n(torchplace guard in mode='raise'; to permit it pass "
                f"allow=[{kind!r}] or allow=[{site.short!r}])"
            )


def guard(
    mode: str = "record",
    *,
    allow: Iterable[str] | str | None = None,
    max_events: int = DEFAULT_MAX_EVENTS,
) -> Guard:
    """Watch the current thread for device crossings and host syncs.

    ``mode``: ``"record"`` (default) only records; ``"warn"`` also issues a
    :class:`~torchplace.sanitizer.events.GuardWarning` once per new (line, kind), pointing at the
    line; ``"raise"`` raises :class:`~torchplace.errors.GuardViolation` at the op, before it runs.
    ``allow``: event kinds (``"h2d"``, ``"d2h"``, ``"d2d"``, ``"transfer"``, ``"sync"``,
    ``"pageable_non_blocking"``, ``"mixed_device"``) and/or source locations (``"train.py"``,
    ``"train.py:42"``, ``"train.py:42:step"``) whose events are ignored entirely.
    ``max_events``: how many events the report keeps one by one (counts and bytes go on).

    ::

        with torchplace.guard() as report:
            answer = model(batch.to(device)).argmax(-1).cpu().tolist()
        print(report.h2d_bytes, len(report.syncs))
        print(report)  # a table: line, kind, count, bytes
    """
    return Guard(mode, allow=allow, max_events=max_events)
