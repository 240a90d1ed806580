"""TPL7xx: pinned memory and asynchronous copies (pitfalls 8 and 9)."""

from __future__ import annotations

import ast
import re

from torchplace.lint.base import (
    Context,
    Family,
    Rule,
    Scope,
    call_name,
    has_star_kwargs,
    keyword,
    names_in,
)
from torchplace.lint.nodes import own_nodes, walk
from torchplace.lint.provenance import file_facts, scope_node
from torchplace.lint.resolver import dotted_name
from torchplace.lint.rules.facts import FACTORIES, is_device_bound_loop

__all__ = ["FAMILY"]

PAGEABLE_NON_BLOCKING = Rule(
    "TPL701", "non-blocking-from-pageable", "`non_blocking=True` copy from unpinned memory"
)
PIN_IN_LOOP = Rule("TPL702", "pin-memory-in-loop", "`.pin_memory()` inside a device loop")

_DATALOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "zip", "islice", "track"})
_PROGRESS_WORDS = ("log", "progress", "tqdm", "track", "meter", "metric")
_MOVING_WORDS = ("prefetch", "pin", "device", "cuda", "gpu", "prepare", "to_")


def _names_progress(name: str) -> bool:
    """A wrapper named for progress or logging, not for moving or pinning batches."""
    lowered = name.lower()
    return any(w in lowered for w in _PROGRESS_WORDS) and not any(
        w in lowered for w in _MOVING_WORDS
    )


def _call(call: ast.Call, ctx: Context) -> None:
    func = call.func
    if not isinstance(func, ast.Attribute):
        return
    if func.attr == "pin_memory" and not call.args:
        loops = ctx.loops()
        if loops and any(is_device_bound_loop(loop, ctx) for loop in loops):
            ctx.report(
                PIN_IN_LOOP.code,
                call,
                "`.pin_memory()` inside a loop allocates page-locked memory on every step; pin "
                "once: `DataLoader(pin_memory=True)` or a reused pinned staging buffer",
            )
        return
    if func.attr not in {"to", "cuda"}:
        return
    flag = keyword(call, "non_blocking")
    if flag is None or not (isinstance(flag.value, ast.Constant) and flag.value.value is True):
        return
    target = call.args[0] if call.args else getattr(keyword(call, "device"), "value", None)
    if isinstance(target, ast.Constant) and target.value == "cpu":
        return
    scope: Scope = ctx.function_scope() or ctx.scope
    copied = _unconverted(func.value)  # `x.float().cuda(non_blocking=True)`: `x` converted
    if isinstance(copied, ast.Call):  # torch.from_numpy(a).to(d, non_blocking=True)
        source = _fresh_pageable(copied, ctx)
    else:
        root = _root_name(copied)
        if root is None:
            return
        source = _unpinned_source(root, ctx, scope, call.lineno)
    if source is not None:
        ctx.report(
            PAGEABLE_NON_BLOCKING.code,
            call,
            f"`non_blocking=True` from pageable memory ({source}): the copy cannot overlap "
            "and runs synchronously; pin the source (`pin_memory=True`) or drop the flag",
        )


def _unconverted(node: ast.expr) -> ast.expr:
    """What a chain of host conversions and reshapes starts from (``x`` of
    ``x.float().contiguous()``): each allocates pageable memory again, pinned or not."""
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and (node.func.attr in _PAGEABLE_METHODS or _dtype_only(node))
    ):
        node = node.func.value
    return node


def _fresh_pageable(call: ast.Call, ctx: Context) -> str | None:
    qualname = ctx.call_qualname(call)
    if not _allocates_pageable(call, qualname, ctx):
        return None
    return f"`{qualname}(...)` returns pageable memory"


# Joins that allocate their result where their inputs are: new pageable memory on the host.
_JOINS = frozenset(
    {"torch.cat", "torch.concat", "torch.concatenate", "torch.stack", "torch.hstack"}
    | {"torch.vstack"}
)


def _allocates_pageable(call: ast.Call, qualname: str | None, ctx: Context) -> bool:
    """``call`` builds a new host tensor in pageable memory: a factory or ``torch.from_numpy``
    without ``pin_memory=``/``device=``, or a join (``torch.cat(crops)``) of tensors not known
    to be on the device (a join of host tensors is never pinned, whatever its inputs were)."""
    if has_star_kwargs(call) or keyword(call, "pin_memory") or keyword(call, "device"):
        return False
    if qualname in FACTORIES or qualname == "torch.from_numpy":
        return True
    if qualname not in _JOINS or not call.args:
        return False
    facts, scope = file_facts(ctx), scope_node(ctx)
    joined = call.args[0]
    parts = joined.elts if isinstance(joined, (ast.List, ast.Tuple)) else [joined]
    return not any(
        (fact := facts.fact(part, scope)) is not None and fact.on_device for part in parts
    )


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _unpinned_source(name: str, ctx: Context, scope: Scope, line: int) -> str | None:
    # (a) a batch from a DataLoader without pin_memory=True.
    for loop in reversed(ctx.loops()):
        if not isinstance(loop, (ast.For, ast.AsyncFor)):
            continue
        targets = _batch_targets(loop)
        if name not in targets and not _derived(name, targets, loop):
            continue
        loader = _loader_call(loop.iter, ctx, scope)
        if loader is None:
            return None
        pin = keyword(loader, "pin_memory")
        if has_star_kwargs(loader):
            return None
        if pin is None or (isinstance(pin.value, ast.Constant) and pin.value.value is False):
            return f"the DataLoader on line {loader.lineno} has no `pin_memory=True`"
        return None
    # (b) a tensor built right here by a factory without pin_memory=True: the binding that
    # reaches the copy (the nearest one above it), through reshapes and dtype conversions of
    # the same name, which allocate pageable memory again.
    values = _rebindings(ctx, scope).get(name)
    if not values or any(value is None for value in values):
        return None
    bound = [value for value in values if value is not None]
    if any(_pins(value) for value in bound):
        return None
    value = _reaching(bound, line)
    while (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and (value.func.attr in _PAGEABLE_METHODS or _dtype_only(value))
        and isinstance(value.func.value, ast.Name)
        and value.func.value.id == name
    ):
        value = _reaching(bound, value.lineno)
    if not isinstance(value, ast.Call):
        return None
    if not _allocates_pageable(value, ctx.call_qualname(value), ctx):
        return None
    return f"`{name}` is created on line {value.lineno} without `pin_memory=True`"


# Methods whose result is a new host tensor (or a view of one) in pageable memory.
_PAGEABLE_METHODS = frozenset(
    {
        "reshape",
        "view",
        "flatten",
        "permute",
        "transpose",
        "contiguous",
        "unsqueeze",
        "squeeze",
        "float",
        "half",
        "double",
        "long",
        "int",
        "bool",
        "clone",
        "t",
        "expand",
    }
)


def _dtype_only(call: ast.Call) -> bool:
    """``x.to(dtype=torch.int32)``, ``x.to(torch.float16)``: a conversion on the host, not a
    move (no device, no other tensor to follow)."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "to"):
        return False
    if any(kw.arg not in {"dtype", "copy", "memory_format"} for kw in call.keywords):
        return False
    if len(call.args) > 1:
        return False
    if call.args:
        arg = call.args[0]
        name = dotted_name(arg)
        return (
            name is not None
            and name.startswith("torch.")
            and _DTYPE.fullmatch(name[6:]) is not None
        )
    return keyword(call, "dtype") is not None


_DTYPE = re.compile(r"(u?int\d*|float\d*|half|double|long|short|bool|bfloat16|complex\d*)")


def _rebindings(ctx: Context, scope: Scope) -> dict[str, list[ast.expr | None]]:
    """:meth:`Context.scope_bindings` without the stores into a name's elements or
    attributes (``mask[i, j] = 1`` fills the tensor, it does not rebind ``mask``)."""
    cached: dict[str, list[ast.expr | None]] | None = scope.cache.get("rebindings")
    if cached is not None:
        return cached
    found = {name: list(values) for name, values in ctx.scope_bindings(scope).items()}
    stores: dict[str, int] = {}
    for sub in own_nodes(scope.node):
        if isinstance(sub, ast.Assign):
            for target in sub.targets:
                if isinstance(target, (ast.Subscript, ast.Attribute)):
                    for name in names_in(target):
                        stores[name] = stores.get(name, 0) + 1
    for name, count in stores.items():
        values = found.get(name, [])
        for _ in range(count):
            if None in values:
                values.remove(None)
    scope.cache["rebindings"] = found
    return found


def _reaching(values: list[ast.expr], line: int) -> ast.expr | None:
    """The binding written last above ``line`` (the one that reaches it in straight code)."""
    above = [value for value in values if value.lineno < line]
    return max(above, key=lambda v: (v.lineno, v.col_offset)) if above else None


def _pins(value: ast.expr) -> bool:
    """``x.pin_memory()`` or a factory given ``pin_memory=...``: the name may be pinned."""
    for sub in walk(value):
        if isinstance(sub, ast.Call) and (
            keyword(sub, "pin_memory") is not None
            or (isinstance(sub.func, ast.Attribute) and sub.func.attr == "pin_memory")
        ):
            return True
    return False


def _derived(name: str, targets: set[str], loop: ast.For | ast.AsyncFor) -> bool:
    """``x, y = batch`` inside the loop: ``x`` comes from the loop target."""
    for stmt in loop.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(n, ast.Name) and n.id == name for t in stmt.targets for n in walk(t)
        ):
            return bool(names_in(stmt.value) & targets)
    return False


def _batch_targets(loop: ast.For | ast.AsyncFor) -> set[str]:
    """The names a loop binds to what its first sequence yields: all its targets, but only
    the first element's in ``for (x, y), line in zip(loader, lines)`` (also under ``tqdm``)."""
    node = loop.iter
    while isinstance(node, ast.Call) and node.args and call_name(node) not in {"zip", "enumerate"}:
        node = node.args[0]
    target = loop.target
    if (
        isinstance(node, ast.Call)
        and call_name(node) == "zip"
        and isinstance(target, ast.Tuple)
        and len(target.elts) == len(node.args)
    ):
        return names_in(target.elts[0])
    return names_in(target)


def _loader_call(node: ast.expr, ctx: Context, scope: Scope) -> ast.Call | None:
    while isinstance(node, ast.Call) and node.args:
        # enumerate(loader), tqdm(loader), metric_logger.log_every(loader, 10): what the
        # loop gets is the loader's batches, as they were loaded
        name = call_name(node)
        if name is None or not (name in _WRAPPERS or _names_progress(name)):
            break
        node = node.args[0]
    if isinstance(node, ast.Name):
        values = ctx.scope_bindings(scope).get(node.id)
        if not values or len(values) != 1 or values[0] is None:
            return None
        node = values[0]
    if isinstance(node, ast.Call) and ctx.call_qualname(node) in _DATALOADERS:
        return node
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return _helper_loader(node.func.id, ctx)
    return None


def _helper_loader(name: str, ctx: Context) -> ast.Call | None:
    """The ``DataLoader(...)`` a module-level function of this file builds and returns
    (``def create_data_loader(...): loader = DataLoader(...); return loader``), when its
    only ``return`` hands back that loader."""
    root = ctx.scope.root()
    body = getattr(root.node, "body", [])
    helper = next(
        (
            n
            for n in body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
        ),
        None,
    )
    if helper is None:
        return None
    returns = [n for n in own_nodes(helper) if isinstance(n, ast.Return)]
    if len(returns) != 1 or returns[0].value is None:
        return None
    value: ast.expr = returns[0].value
    if isinstance(value, ast.Name):
        bound = [
            n.value
            for n in own_nodes(helper)
            if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == value.id for t in n.targets)
        ]
        if len(bound) != 1:
            return None
        value = bound[0]
    if isinstance(value, ast.Call) and ctx.call_qualname(value) in _DATALOADERS:
        return value
    return None


FAMILY = Family(
    rules=(PAGEABLE_NON_BLOCKING, PIN_IN_LOOP),
    checks=((ast.Call, _call, (PAGEABLE_NON_BLOCKING.code, PIN_IN_LOOP.code)),),
    triggers=("non_blocking", ".pin_memory("),
)
