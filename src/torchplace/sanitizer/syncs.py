"""Sync detection: every way the host can wait for a device, and why it does.

* API-level reads of device data (``Tensor.item``, ``.tolist()``, ``bool(t)``, printing):
  :data:`FUNCTION_SYNCS`, recorded by the function layer under their user-facing name.
* Blocking copies between the host and a device: :data:`BLOCKING_COPY`, the reason the
  dispatch layer records with each one.
* aten ops whose result size depends on device data (``nonzero``, boolean-mask indexing,
  ``unique``, ...), torch.linalg's solvers that read their error codes on the host, and ops
  whose kernel reads device data on the host where no dispatch mode sees it (a device tensor
  as ``masked_fill``'s value or ``linspace``'s ends; ``isin`` of many test
  elements, ``matrix_exp``, ``ctc_loss`` on CUDA, a dense tensor made sparse):
  :func:`sync_handlers`, the dispatch layer's handlers for them.
* Composite calls that take a syncing path only when no dispatch mode is active (smoothed,
  weighted ``cross_entropy``): :data:`MODE_HIDDEN_SYNCS`, recorded by the function layer from
  the call's arguments.
* ``torch.cuda.synchronize`` and friends are plain Python functions that no mode sees: while
  any guard is active they are wrapped (:func:`install_sync_wrappers`), and the wrapper records
  only for the guards active on the calling thread (:func:`active_guards`).

Syncs are recorded only for tensors on a non-CPU device: reading a CPU tensor on the host
stalls nothing.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import torch
from torch import Tensor

from torchplace.sanitizer.calls import op_name
from torchplace.sanitizer.mixed import check_op, maybe_mixed

if TYPE_CHECKING:
    from torchplace.sanitizer.recorder import Guard

__all__ = [
    "BLOCKING_COPY",
    "FACTORY_READ",
    "FUNCTION_SYNCS",
    "INDEX_LIST_COPY",
    "MODE_HIDDEN_SYNCS",
    "Handler",
    "active_guards",
    "install_sync_wrappers",
    "remove_sync_wrappers",
    "sync_handlers",
]

#: An aten-op handler of the dispatch layer: ``(guard, op, args, kwargs) -> result``.
Handler = Callable[["Guard", Any, Sequence[Any], Mapping[str, Any]], Any]

_READ_ON_HOST: Final = "a device value read on the host"
#: Printing reads the values with many small device reads that torch hides from dispatch modes
#: (``torch._tensor_str`` disables them): the guard records the print as one sync, by its name.
_PRINTED: Final = "printing a device tensor reads its values on the host"

#: API calls that read device data on the host (a sync when the tensor is not on the CPU and
#: holds data): the name to record, and why it syncs.
FUNCTION_SYNCS: Final[dict[Any, tuple[str, str]]] = {
    **{
        getattr(Tensor, name): (f"Tensor.{name}", _READ_ON_HOST)
        for name in (
            "item",
            "tolist",
            "numpy",
            "__array__",
            "__bool__",
            "__int__",
            "__float__",
            "__complex__",
            "__index__",
        )
        if hasattr(Tensor, name)
    },
    # print(t), str(t), repr(t) and f"{t}" (any dim), f"{loss:.3f}" (0-dim)
    Tensor.__repr__: ("Tensor.__repr__", _PRINTED),
    Tensor.__format__: ("Tensor.__format__", _PRINTED),
}

_SMOOTHED_MEAN: Final = (
    "cross_entropy with label_smoothing, class weights and the mean reduction selects the"
    " targets' weights with masked_select (data-dependent size); torch takes another path while"
    " any dispatch mode is active, so this is recorded from the call's arguments"
)


def _cross_entropy_selects(args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether ``F.cross_entropy`` takes its ``masked_select`` path (``LossNLL.cpp``,
    ``cross_entropy_loss_label_smoothing``): class-index targets, ``label_smoothing > 0``,
    a weight and the mean reduction. Torch picks the path only when no dispatch mode is
    active (``isTensorSubclassLike``), which the guard's own layer always is."""

    def arg(index: int, name: str, default: Any) -> Any:
        return args[index] if len(args) > index else kwargs.get(name, default)

    logits, target, weight = arg(0, "input", None), arg(1, "target", None), arg(2, "weight", None)
    size_average, reduce = arg(3, "size_average", None), arg(5, "reduce", None)
    reduction = arg(6, "reduction", "mean")
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce, emit_warning=False)
    return (
        isinstance(logits, Tensor)
        and logits.device.type != "cpu"
        and isinstance(target, Tensor)
        and target.numel() > 0
        and target.shape != logits.shape
        and isinstance(weight, Tensor)
        and reduction == "mean"
        and float(arg(7, "label_smoothing", 0.0)) > 0.0
    )


#: Calls whose C++ reads device data on the host only when no dispatch mode is active: the name
#: to record, why, and whether these arguments take that path.
MODE_HIDDEN_SYNCS: Final[
    dict[Any, tuple[str, str, Callable[[Sequence[Any], Mapping[str, Any]], bool]]]
] = {
    torch.nn.functional.cross_entropy: (
        "F.cross_entropy",
        _SMOOTHED_MEAN,
        _cross_entropy_selects,
    ),
}

#: ``torch.tensor([loss_a, loss_b])``: torch reads every device tensor in the data on the host
#: as a Python scalar, one ``item()`` each, where the dispatch layer cannot see them.
FACTORY_READ: Final = (
    "a device tensor in the data read on the host as a scalar (torch.stack keeps it on the device)"
)

#: ``x[[0, 2]]`` on a device: the list becomes an index tensor copied over with a blocking copy.
INDEX_LIST_COPY: Final = (
    "a Python list in the index is copied to the device with a blocking copy (keep index tensors"
    " on the device)"
)

#: Why a blocking copy between the host and a device is a sync, by direction. On CUDA every one
#: of them goes through ``at::cuda::memcpy_and_sync`` (a ``cudaStreamSynchronize``, and what
#: ``torch.cuda.set_sync_debug_mode`` reports); device-to-device copies are not syncs.
BLOCKING_COPY: Final = {
    "h2d": "blocking host-to-device copy",
    "d2h": "blocking device-to-host copy",
}


#: torch.linalg's solvers read their error codes (or, for eig, the whole input) on the host: every
#: function whose documentation says "synchronizes that device with the CPU" (inv, solve, cholesky,
#: lu_factor, ldl_factor, eigh, eigvalsh, eig, eigvals, svdvals, matrix_rank, pinv, and norms
#: computed through svdvals) reaches one of these ops; the ``*_ex`` variants only with
#: ``check_errors=True``.
_LINALG: Final = (
    "a torch.linalg solver reads its error codes on the host (the *_ex variant, where one"
    " exists, does not unless check_errors=True)"
)


#: The kernels of these ops read a tensor argument on the host with ``.item()``, where no
#: dispatch mode sees it: a sync when that argument is on a device.
_FILL: Final = "a 0-dim device tensor as the fill value is read on the host (value.item())"


_NORMAL_STD: Final = (
    "normal with a tensor std checks std >= 0 on the host (rsample's normal_ does not)"
)


def _checked_call(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """Run ``func`` after the mixed-device check the dispatch layer makes for unhandled ops:
    every handler here ends with it (``equal(a, b)`` and ``solve(A, B)`` take two operands)."""
    if maybe_mixed(args, kwargs):
        check_op(owner, func, args, kwargs)
    return func(*args, **kwargs)


def _sync_handler(why: str) -> Handler:
    def handler(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        t = args[0] if args else None
        if isinstance(t, Tensor) and t.device.type != "cpu":
            owner._sync(op_name(func), why)
        return _checked_call(owner, func, args, kwargs)

    return handler


def _index_handler(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    t, indices = args[0], args[1]
    if (
        isinstance(t, Tensor)
        and t.device.type != "cpu"
        and any(isinstance(i, Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)
    ):
        owner._sync(op_name(func), "boolean-mask indexing (the result size needs a nonzero)")
    return _checked_call(owner, func, args, kwargs)


def _checked_ex(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    t = args[0]
    if kwargs.get("check_errors") and isinstance(t, Tensor) and t.device.type != "cpu":
        owner._sync(op_name(func), _LINALG)
    return _checked_call(owner, func, args, kwargs)


def _histc(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    t = args[0]
    low = args[2] if len(args) > 2 else kwargs.get("min", 0)
    high = args[3] if len(args) > 3 else kwargs.get("max", 0)
    if isinstance(t, Tensor) and t.device.type != "cpu" and t.numel() and low == high:
        owner._sync(op_name(func), "histc without a range reads the data's min and max on the host")
    return _checked_call(owner, func, args, kwargs)


def _reads_argument(index: int, name: str, why: str) -> Handler:
    """A handler for an op whose kernel reads one tensor argument on the host (``.item()``):
    a sync when that argument is on a device (a CPU value is read without waiting)."""

    def handler(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        value = args[index] if len(args) > index else kwargs.get(name)
        if isinstance(value, Tensor) and value.device.type != "cpu" and value.numel():
            owner._sync(op_name(func), why)
        return _checked_call(owner, func, args, kwargs)

    return handler


def _range_from_tensors(
    owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    ends = (
        args[0] if args else kwargs.get("start"),
        args[1] if len(args) > 1 else kwargs.get("end"),
    )
    if any(isinstance(t, Tensor) and t.device.type != "cpu" for t in ends):
        owner._sync(op_name(func), "linspace/logspace read a device start or end on the host")
    return _checked_call(owner, func, args, kwargs)


def _isin(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    elements, test = args[0], args[1]
    assume_unique = args[2] if len(args) > 2 else kwargs.get("assume_unique", False)
    tensor = elements if isinstance(elements, Tensor) else test
    n = elements.numel() if isinstance(elements, Tensor) else 1
    # torch's heuristic (from numpy): below the threshold every pair is compared on the
    # device; above it the sorting path calls unique() on both inputs unless assume_unique
    if (
        isinstance(tensor, Tensor)
        and tensor.device.type != "cpu"
        and n
        and not assume_unique
        and isinstance(test, Tensor)
        and test.numel() >= int(10.0 * n**0.145)
    ):
        owner._sync(
            op_name(func), "isin of many test elements calls unique() (data-dependent size)"
        )
    return _checked_call(owner, func, args, kwargs)


def _matrix_exp(owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    a = args[0]
    if isinstance(a, Tensor) and a.device.type != "cpu" and a.numel() and a.size(-1) > 1:
        owner._sync(
            op_name(func), "matrix_exp copies the matrices' norms to the host to pick its degree"
        )
    return _checked_call(owner, func, args, kwargs)


def _dense_to_sparse(
    owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    t = args[0]
    if isinstance(t, Tensor) and t.device.type != "cpu" and t.layout == torch.strided:
        owner._sync(op_name(func), "a dense tensor made sparse calls nonzero (data-dependent size)")
    return _checked_call(owner, func, args, kwargs)


def _repeat_interleave(
    owner: Guard, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> Any:
    t = args[0]
    if isinstance(t, Tensor) and t.device.type != "cpu" and kwargs.get("output_size") is None:
        owner._sync(op_name(func), "repeat_interleave without output_size")
    return _checked_call(owner, func, args, kwargs)


def sync_handlers() -> dict[Any, Handler]:
    """The dispatch layer's handlers for the aten ops that sync."""
    aten = torch.ops.aten
    handlers: dict[Any, Handler] = {
        aten._local_scalar_dense.default: _sync_handler(_READ_ON_HOST),
        aten.nonzero.default: _sync_handler("nonzero (the result size depends on the data)"),
        aten.masked_select.default: _sync_handler("masked_select (data-dependent size)"),
        aten.equal.default: _sync_handler("equal (a Python bool computed from device data)"),
        aten.allclose.default: _sync_handler("allclose (a Python bool computed from device data)"),
        aten.histc.default: _histc,
        aten.index.Tensor: _index_handler,
        aten.index_put_.default: _index_handler,
        aten.index_put.default: _index_handler,
        aten._index_put_impl_.default: _index_handler,
        aten.repeat_interleave.Tensor: _repeat_interleave,
        aten.repeat_interleave.self_Tensor: _repeat_interleave,
        # CUDA's kernel copies the lengths to the device with blocking copies (memcpy_and_sync)
        aten._ctc_loss.default: _sync_handler(
            "ctc_loss copies the lengths to the device with blocking host-to-device copies"
        ),
    }
    by_name: dict[str, Handler] = {
        **{
            name: _sync_handler(f"{name} (data-dependent size)")
            for name in ("_unique2", "unique_dim", "unique_consecutive", "_unique", "bincount")
        },
        **dict.fromkeys(
            ("_linalg_check_errors", "_linalg_eigh", "_linalg_svd", "linalg_eig", "linalg_pinv"),
            _sync_handler(_LINALG),
        ),
        **dict.fromkeys(("linspace", "logspace"), _range_from_tensors),
        **dict.fromkeys(("masked_fill", "masked_fill_"), _reads_argument(2, "value", _FILL)),
        **dict.fromkeys(("index_fill", "index_fill_"), _reads_argument(3, "value", _FILL)),
        "isin": _isin,
        # torch.normal(mean, std) with a tensor std checks std >= 0 on the host
        # (CHECK_NORMAL_TENSOR_STD: std.min().ge(0).item()): Normal(loc, scale).sample()
        **{
            f"normal.{overload}": _reads_argument(1, "std", _NORMAL_STD)
            for overload in (
                "float_Tensor",
                "float_Tensor_out",
                "Tensor_Tensor",
                "Tensor_Tensor_out",
            )
        },
        # nn.TransformerEncoder's nested-tensor fast path (eval, src_key_padding_mask): a bool
        # computed from the mask, then sizes read from it
        "_nested_tensor_from_mask_left_aligned": _sync_handler(
            "_nested_tensor_from_mask_left_aligned (a Python bool computed from device data)"
        ),
        "_nested_tensor_from_mask": _sync_handler(
            "_nested_tensor_from_mask reads the sequence lengths from the mask on the host"
        ),
        "linalg_matrix_exp": _matrix_exp,
        "cholesky_inverse": _sync_handler("cholesky_inverse reads its error codes on the host"),
        **dict.fromkeys(
            ("_to_sparse", "_to_sparse_csr", "_to_sparse_csc", "_to_sparse_bsr", "_to_sparse_bsc"),
            _dense_to_sparse,
        ),
        **dict.fromkeys(
            (
                "linalg_inv_ex",
                "linalg_cholesky_ex",
                "_linalg_solve_ex",
                "linalg_lu_factor_ex",
                "linalg_ldl_factor_ex",
            ),
            _checked_ex,
        ),
    }
    for name, handler in by_name.items():  # "op" for every overload, "op.overload" for one
        name, _, only = name.partition(".")
        packet = getattr(aten, name, None)
        for overload in packet.overloads() if packet is not None else ():
            if overload == only or not only:
                handlers[getattr(packet, overload)] = handler
    return handlers


# -------------------------------------------------------------------------------------------
# torch.cuda.synchronize and friends (plain Python: no mode sees them)
# -------------------------------------------------------------------------------------------
_state = threading.local()
_patch_lock = threading.Lock()
_patch_users = 0
_patched: list[tuple[Any, str, Any]] = []


def active_guards() -> list[Guard]:
    """The guards active on this thread, innermost last (each :class:`Guard` joins on entry)."""
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
            for owner in reversed(active_guards()):
                owner._sync(name, "explicit synchronization")
            return original(*args, **kwargs)
        finally:
            _state.in_sync = False

    wrapper.__torchplace_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _wrap_storage_copy(original: Callable[..., Any]) -> Callable[..., Any]:
    """``UntypedStorage.copy_``: the copy behind ``torch.save`` of device tensors
    (``storage.cpu()``), ``torch.load(map_location=...)`` and ``storage.cuda()``. No torch
    function is called, so no dispatch layer is pushed: push those of the guards active on this
    thread for the copy (one not already active), whose ``aten.copy_`` handler records it."""

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        guards = active_guards()
        if not guards:
            return original(self, *args, **kwargs)
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        stack = _get_current_dispatch_mode_stack()
        with contextlib.ExitStack() as layers:
            # the handler's own call of the op must not come back through a function layer,
            # whose dispatch layer would record the copy a second time
            layers.enter_context(torch._C.DisableTorchFunction())
            for owner in guards:
                if owner._live[0] and not any(mode is owner._dispatch for mode in stack):
                    layers.enter_context(owner._dispatch)
            return original(self, *args, **kwargs)

    wrapper.__torchplace_original__ = original  # type: ignore[attr-defined]
    return wrapper


def install_sync_wrappers() -> None:
    """Wrap the explicit syncs and storage copies; counted, so nested and concurrent guards
    wrap them once."""
    global _patch_users
    with _patch_lock:
        if _patch_users == 0:
            for owner_obj, attr, name in _sync_targets():
                original = getattr(owner_obj, attr)
                _patched.append((owner_obj, attr, original))
                setattr(owner_obj, attr, _wrap_sync(original, name))
            storage_copy = torch.UntypedStorage.__dict__.get("copy_")
            original = torch.UntypedStorage.copy_
            _patched.append((torch.UntypedStorage, "copy_", storage_copy))
            torch.UntypedStorage.copy_ = _wrap_storage_copy(original)  # type: ignore[method-assign]
        _patch_users += 1


def remove_sync_wrappers() -> None:
    """Undo :func:`install_sync_wrappers` when the last active guard exits."""
    global _patch_users
    with _patch_lock:
        _patch_users -= 1
        if _patch_users == 0:
            while _patched:
                owner_obj, attr, original = _patched.pop()
                if original is None:  # inherited: remove the wrapper to uncover it again
                    delattr(owner_obj, attr)
                else:
                    setattr(owner_obj, attr, original)
