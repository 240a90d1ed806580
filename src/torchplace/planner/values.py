"""The values a forward reads on ``meta``: those of tensors made from its inputs alone.

``meta`` tensors have no values, but a model's own code often branches on its inputs':
transformers' padding check (``attention_mask.sum() == attention_mask.numel()`` before it skips
the mask), a mask turned into indices (``nonzero``, boolean indexing), a length read with
``.item()``. Each integer or boolean input of at most :data:`LIMIT` elements is traced with the
value ``--verify`` runs it with, kept beside its ``meta`` tensor; an operator whose tensors all
have a value (or that takes none, as ``torch.arange(n, device=x.device)``) computes its
result's on the CPU as well, while it is small. A parameter has no value (it is on ``meta``),
so what is computed from the weights is not followed, nor are float inputs (data, whose values
the planner would make up); a buffer the model makes from Python data has its own
(:func:`built`). Where the ``meta`` kernel cannot run (``.item()``, an
output whose shape depends on values), the result comes from the values: the number itself, or
``meta`` tensors of the shape and strides the CPU's kernel gave; a copy to the host (``.tolist()``,
``.cpu()``) is the value itself. A tensor the forward makes from Python data on ``meta``
(``torch.tensor([[1, 4, 4]], device=x.device)``: an image grid beside the ids) keeps that data
as its value (:func:`constants`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = [
    "LIMIT",
    "Values",
    "built",
    "constants",
    "fails_with_data",
    "forget_weights",
    "give",
    "value_of",
]

#: the most elements a value is kept for (16 MiB of float32): masks, ids, lengths, timesteps
LIMIT = 1 << 22

_VALUE = "_torchplace_value"
_NONE: Any = object()  # an argument without a value


def value_of(t: torch.Tensor) -> torch.Tensor | None:
    """``t``'s value: its own where it is not on ``meta`` (a Python number made a tensor)."""
    if t.device.type != "meta":
        return t
    return getattr(t, _VALUE, None)


def give(t: torch.Tensor, value: torch.Tensor | None) -> None:
    """Keep ``value`` beside ``t`` (where it is ``t``'s shape and dtype)."""
    if value is not None and value.shape == t.shape and value.dtype == t.dtype:
        setattr(t, _VALUE, value)


@contextlib.contextmanager
def constants() -> Iterator[None]:
    """Tensors made from Python data on ``meta`` (``torch.tensor``, ``torch.as_tensor``,
    ``Tensor.new_tensor``) keep that data as their value: the copy happens inside the factory,
    unseen by the trace's dispatch mode, so a grid or a shape table made so
    (``torch.tensor([[1, 4, 4]], device=x.device)``) and read with ``.tolist()`` failed. The
    factories are wrapped for the trace (a ``TorchFunctionMode`` would turn off the fast paths
    that check for one: ``nn.MultiheadAttention``'s)."""
    import torch

    made = {"tensor": torch.tensor, "as_tensor": torch.as_tensor}
    method = torch.Tensor.new_tensor

    def factory(make: Any) -> Any:
        def kept(data: Any, *args: Any, **kwargs: Any) -> Any:
            out = make(data, *args, **kwargs)
            _keep_data(out, data)
            return out

        return kept

    def new_tensor(self: torch.Tensor, data: Any, *args: Any, **kwargs: Any) -> Any:
        out = method(self, data, *args, **kwargs)
        _keep_data(out, data)
        return out

    for name, make in made.items():
        setattr(torch, name, factory(make))
    torch.Tensor.new_tensor = new_tensor  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        for name, make in made.items():
            setattr(torch, name, make)
        torch.Tensor.new_tensor = method  # type: ignore[method-assign]


@contextlib.contextmanager
def built() -> Iterator[None]:
    """While a factory builds the model on ``meta``: tensors made from Python data keep it as
    their value (:func:`constants`), and so does what is computed from such values alone, so
    that a buffer the model makes for itself has the value its code gave it (Encodec's
    ``padding_total = kernel_size - stride``, made from ``torch.tensor(...)`` in ``__init__``
    and read in forward to size its padding). An operator none of whose tensors has a value
    is not followed (a weight's ``torch.empty`` is not made on the CPU as well), and one that
    writes into a tensor with a value without giving it one takes it away (a checkpoint
    loaded over it)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    values = Values()

    class Following(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if any(_has_value(t) for t in tree_flatten((args, kwargs))[0]):
                values.follow(func, args, kwargs, out)
            return out

    with constants(), Following():  # type: ignore[no-untyped-call]
        yield


def forget_weights(module: torch.nn.Module) -> None:
    """Take away the values :func:`built` gave the parameters: weights are loaded or trained
    over what the code made, so the plan follows none computed from them; a buffer keeps its
    own."""
    for t in module.parameters():
        _forget(t)


def _has_value(leaf: Any) -> bool:
    import torch

    return isinstance(leaf, torch.Tensor) and leaf.is_meta and value_of(leaf) is not None


def _keep_data(out: Any, data: Any) -> None:
    """``out``'s value: ``data`` on the CPU, where ``out`` is a small ``meta`` tensor and
    ``data`` holds no tensor (one on ``meta`` has no value to give)."""
    import torch
    from torch.utils._pytree import tree_flatten

    if not isinstance(out, torch.Tensor) or out.device.type != "meta" or out.numel() > LIMIT:
        return
    if any(isinstance(leaf, torch.Tensor) for leaf in tree_flatten(data)[0]):
        return
    try:
        value = torch.as_tensor(data, dtype=out.dtype, device="cpu")
    except (TypeError, ValueError, RuntimeError):  # values are a help, never a reason to fail
        return
    give(out, value)


def _forget(t: torch.Tensor) -> None:
    if hasattr(t, _VALUE):
        delattr(t, _VALUE)


class Values:
    """What :class:`~torchplace.planner.trace._Recorder` asks of values, one forward's worth."""

    def __init__(self) -> None:
        self.stale: set[int] = set()  # storages written by an operator without values

    def fresh(self, key: int) -> None:
        """A new storage at ``key`` (one freed may have had it)."""
        self.stale.discard(key)

    def _valued(self, value: Any) -> Any:
        """``value`` with each tensor its value and ``meta`` the CPU; ``_NONE`` where one has
        none."""
        import torch
        from torch.utils._pytree import tree_flatten, tree_unflatten

        leaves, spec = tree_flatten(value)
        out = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                if int(leaf.untyped_storage()._cdata) in self.stale:
                    return _NONE
                leaf = value_of(leaf)
                if leaf is None:
                    return _NONE
            elif isinstance(leaf, torch.device) and leaf.type == "meta":
                leaf = torch.device("cpu")
            out.append(leaf)
        return tree_unflatten(out, spec)

    def follow(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """After ``func`` ran on ``meta``: its outputs' values, where its operands have them
        and the outputs are small; an operand it wrote without values loses its own."""
        import torch
        from torch.utils._pytree import tree_flatten

        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if outs and all(t.device.type != "meta" for t in outs):
            # it ran on real tensors (the CPU's, made without ``device=``): their values are
            # their own, and running it again would apply an in-place one twice (BEiT's
            # ``relative_coords[:, :, 0] *= 2 * w - 1``, kept in an ``lru_cache`` the run
            # ``--verify`` makes then reads: "index 300 is out of bounds for dimension 0")
            return
        valued = None
        # a random draw is not followed: drawn on the CPU it would advance the caller's
        # generator, which planning leaves as it was
        seeded = torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())
        if outs and not seeded and sum(t.numel() for t in outs) <= LIMIT:
            valued = self._valued((args, kwargs))
        if valued is None or valued is _NONE:
            for t in _written(func, args, kwargs):
                _forget(t)
                self.stale.add(int(t.untyped_storage()._cdata))
            return
        try:
            computed = func(*valued[0], **valued[1])
        except Exception:  # values are a help, never a reason to fail
            for t in _written(func, args, kwargs):
                _forget(t)
            return
        results = [v for v in tree_flatten(computed)[0] if isinstance(v, torch.Tensor)]
        for t, v in zip(outs, results, strict=False):
            give(t, v)

    def instead(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``func``'s result where its ``meta`` kernel cannot run (it reads values): computed
        from the operands' values, its tensors ``meta`` ones beside their values; ``None``
        where an operand has no value: ``NotImplemented`` (the caller raises what ``meta``
        raised)."""
        import torch
        from torch.utils._pytree import tree_flatten, tree_map

        valued = self._valued((args, kwargs))
        if valued is _NONE:
            return NotImplemented
        try:
            computed = func(*valued[0], **valued[1])
        except Exception:  # the caller raises what meta raised
            return NotImplemented
        if _to_host(func, kwargs):  # a copy off ``meta`` (.tolist(), .cpu()): the value
            return computed
        # an operator that returns an operand (an in-place one) returns that operand
        operands = {
            id(value_of(t)): t
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor)
        }

        def meta(v: Any) -> Any:
            if not isinstance(v, torch.Tensor):
                return v
            if id(v) in operands:
                return operands[id(v)]
            t = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
            give(t, v)
            return t

        return tree_map(meta, computed)


def fails_with_data(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
    """Whether ``func``, which ``meta`` could not run, fails on the CPU too, given zeros laid
    out as its operands are: then the shapes the forward made are at fault (a declared input
    of the wrong size: ``a and b must have same reduction dim``), not values that ``meta``
    lacks. None when its operands are too large to re-run (over :data:`LIMIT` elements in
    all): not known."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes
    from torch.utils._pytree import tree_flatten, tree_map

    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    if not tensors:
        return False
    if sum(t.numel() for t in tensors) > LIMIT:
        return None

    def zeros(v: Any) -> Any:
        if isinstance(v, torch.device) and v.type == "meta":
            return torch.device("cpu")
        if not isinstance(v, torch.Tensor) or v.device.type != "meta":
            return v
        size = 1 + sum((n - 1) * s for n, s in zip(v.shape, v.stride(), strict=True))
        size = size if all(v.shape) else 0
        return torch.zeros(size, dtype=v.dtype).as_strided(v.shape, v.stride())

    with _disable_current_modes():
        try:
            real = tree_map(zeros, (args, kwargs))
        except (RuntimeError, TypeError, ValueError):  # no stand-in: say nothing more
            return False
        try:
            func(*real[0], **real[1])
        except Exception as exc:  # a failure with data is the forward's own, but a kernel
            return "not implemented for" not in str(exc)  # the CPU lacks (float16's) is not
    return False


def _to_host(func: Any, kwargs: dict[str, Any]) -> bool:
    """Whether ``func`` copies a tensor off ``meta``, to another device (``Tensor.tolist``
    and ``.cpu()`` run ``aten._to_copy`` to the CPU): its result is the value, not a
    ``meta`` tensor."""
    import torch

    device = kwargs.get("device")
    named = func._overloadpacket.__name__ == "_to_copy"
    return named and device is not None and torch.device(device).type != "meta"


def _written(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors ``func`` writes into (an in-place or ``out=`` operator's)."""
    import torch

    written: list[torch.Tensor] = []
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable:  # most operators write nothing in place
        return written
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = kwargs.get(arg.name) if arg.kwarg_only or i >= len(args) else args[i]
        if isinstance(value, torch.Tensor):
            written.append(value)
        elif isinstance(value, list | tuple):
            written += [t for t in value if isinstance(t, torch.Tensor)]
    return written
