"""Function-mode recording: the front door every torch call from Python goes through.

:class:`FunctionLayer` is a :class:`~torch.overrides.TorchFunctionMode` active for the whole
guarded block. It sees every torch call the user's code makes (``F.linear``, ``Tensor.item``,
``x[mask]``, ``torch.tensor(..., device=...)``):

* calls known to be pure device compute (:data:`~torchplace.sanitizer.calls.PURE`) take the
  fast path: a cheap same-device check of their operands, then the call itself; so do sizes
  and factories (:data:`~torchplace.sanitizer.calls.SIZED`, ``x.view(n)``, ``torch.arange(n)``)
  unless a size is a device tensor, which torch reads on the host;
* every other call runs with the guard's
  :class:`~torchplace.sanitizer.dispatch_mode.DispatchLayer` pushed for its duration;
* API-level syncs (``Tensor.item``, ``.tolist()``, ``bool(t)``, printing) are recorded once,
  here, under their user-facing name, and the aten ops they become are not counted again
  (torch hides a print's many small reads from dispatch modes anyway). The bytes a
  ``.tolist()`` moves are still recorded as a D2H transfer;
* factories that copy host data onto a device (``torch.tensor(data, device=...)``) are recorded
  as an H2D copy when torch does the copy out of the dispatch layer's sight.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from torchplace.sanitizer.calls import (
    DATA_FACTORIES,
    GETITEM,
    INDEXING,
    NO_KWARGS,
    OTHER_NOT_AN_OPERAND,
    PURE,
    SCALAR_PARAMS,
    SEQUENCES,
    SIZED,
    function_name,
    index_lists,
    plain_index,
    reads_device_scalar,
    reads_device_value,
)
from torchplace.sanitizer.dispatch_mode import nbytes, run_under
from torchplace.sanitizer.mixed import check_call, maybe_mixed, subclass_decides
from torchplace.sanitizer.syncs import (
    BLOCKING_COPY,
    FACTORY_READ,
    FUNCTION_SYNCS,
    INDEX_LIST_COPY,
    MODE_HIDDEN_SYNCS,
)

if TYPE_CHECKING:
    from torchplace.sanitizer.recorder import Guard

__all__ = ["FunctionLayer"]


class FunctionLayer(TorchFunctionMode):
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
        if func in PURE:
            # the fast path: pure device compute; only look for operands on two devices (a
            # lone positional operand that is not a list or tuple names one device at most)
            if (kwargs or len(args) > 1 or (args and type(args[0]) in SEQUENCES)) and maybe_mixed(
                args, kwargs or NO_KWARGS
            ):
                # x.type_as(y) copies; x.view_as(y) is a view
                return self._mixed_call(
                    func, args, kwargs or NO_KWARGS, func in OTHER_NOT_AN_OPERAND
                )
            return func(*args, **kwargs) if kwargs else func(*args)
        scalars = SCALAR_PARAMS.get(func)
        if scalars is not None and not reads_device_scalar(args, kwargs or NO_KWARGS, scalars):
            # numbers from the host: pure device compute, as above
            if maybe_mixed(args, kwargs or NO_KWARGS):
                return self._mixed_call(func, args, kwargs or NO_KWARGS)
            return func(*args, **kwargs) if kwargs else func(*args)
        start = SIZED.get(func)
        if start is not None and not reads_device_value(args, start, kwargs or NO_KWARGS):
            # sizes and fill values from the host: pure
            return func(*args, **kwargs) if kwargs else func(*args)
        kwargs = kwargs or NO_KWARGS
        if func in GETITEM and plain_index(args[1]):
            return func(*args, **kwargs)
        return self._inspected_call(func, args, kwargs)

    def _mixed_call(
        self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any], inspect: bool = False
    ) -> Any:
        """A pure call whose tensor operands name two devices: recorded here, unless a tensor
        subclass among them decides what the call does (:func:`subclass_decides`) or one of
        them is no operand (``inspect``); those run under the dispatch layer, which judges the
        aten ops the call becomes."""
        if inspect or subclass_decides(args, kwargs):
            return self._inspected_call(func, args, kwargs)
        check_call(self._owner, func, args, kwargs)
        return func(*args, **kwargs)

    def _inspected_call(self, func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Run a call that is not pure compute under the dispatch layer."""
        owner = self._owner
        if not owner._live[0]:
            # the layer of a watched thread that outlived its guard: torch offers no way to take
            # it off that thread's stack, so it only passes calls through until the thread ends
            return func(*args, **kwargs)
        api = FUNCTION_SYNCS.get(func)
        if api is not None:
            t = args[0] if args else None
            # an empty tensor has nothing to read: torch copies or reads nothing, so no sync
            if isinstance(t, Tensor) and t.device.type != "cpu" and t.numel() > 0:
                owner._sync(*api)
                owner._suppress_syncs += 1
                try:
                    return run_under(owner._dispatch, func, args, kwargs)
                finally:
                    owner._suppress_syncs -= 1
        if func in INDEXING and len(args) > 1:
            _record_index_copies(owner, func, args[0], args[1])
        hidden = MODE_HIDDEN_SYNCS.get(func)
        if hidden is not None and hidden[2](args, kwargs):
            owner._sync(hidden[0], hidden[1])
        factory = DATA_FACTORIES.get(func)
        data = None
        if factory is not None:
            data = _factory_data(factory, args, kwargs)
            # torch reads each device tensor inside the data on the host, as a Python scalar (an
            # item() each, hidden from the dispatch layer): one sync per tensor
            for _ in range(_device_scalars(data)):
                owner._sync(factory, FACTORY_READ)
        seen, mixed = owner._transfers_seen, owner._mixed_seen
        try:
            out = run_under(owner._dispatch, func, args, kwargs)
        except (RuntimeError, ValueError) as exc:
            # torch refused the call before any aten op the dispatch layer saw (a composite
            # such as torch.quantile checks its operands' devices itself, the attention of a
            # CausalBias mask with a ValueError): name the operands
            if (
                owner._mixed_seen == mixed
                and not isinstance(exc, NotImplementedError)  # no kernel: not about devices
                and maybe_mixed(args, kwargs)
            ):
                check_call(owner, func, args, kwargs)
            raise
        if (
            factory is not None
            and isinstance(out, Tensor)
            and out.device.type != "cpu"
            and owner._transfers_seen == seen
        ):
            _record_factory_copy(owner, factory, data, out)
        return out


def _record_index_copies(owner: Guard, func: Any, t: Any, index: Any) -> None:
    """``x[[0, 2]]`` on a device: torch turns each list in the index into an index tensor on
    the CPU and copies it to ``x``'s device with a blocking copy that no mode sees."""
    if not isinstance(t, Tensor) or t.device.type == "cpu":
        return
    for size in index_lists(index):
        op = function_name(func)
        owner._transfer("h2d", op, size, torch.device("cpu"), t.device, False)
        if size:
            owner._sync(op, INDEX_LIST_COPY)


def _factory_data(factory: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    position = 1 if factory == "Tensor.new_tensor" else 0
    return args[position] if len(args) > position else kwargs.get("data")


def _device_scalars(data: Any) -> int:
    """How many device tensors a list or tuple of data holds (at any depth) that torch reads
    as scalars (one element each; torch refuses any other before reading it)."""
    if type(data) not in SEQUENCES:
        return 0
    kinds = set(map(type, data))  # at C speed: a list of numbers is not walked in Python
    if not any(k in SEQUENCES or issubclass(k, Tensor) for k in kinds):
        return 0
    count = 0
    for item in data:
        if isinstance(item, Tensor):
            count += item.device.type != "cpu" and item.numel() == 1
        else:
            count += _device_scalars(item)
    return count


def _record_factory_copy(owner: Guard, factory: str, data: Any, out: Tensor) -> None:
    """torch builds host data on the CPU, then copies it over with the Python dispatch key
    excluded (or, for meta, not at all): record the copy here, since the dispatch layer did not
    see it (tensor data, or a torch that lets the mode see it, is recorded there)."""
    if isinstance(data, Tensor):
        return
    owner._transfer("h2d", factory, nbytes(out), torch.device("cpu"), out.device, False, after=True)
    # torch's own copy is a blocking one (non_blocking=False): a sync on CUDA, unless there is
    # no element to copy
    if out.numel() > 0:
        owner._sync(factory, BLOCKING_COPY["h2d"])
