"""TPL7xx: pinned memory and asynchronous copies (pitfalls 8 and 9)."""

from __future__ import annotations

import ast

from torchplace.lint.base import (
    Context,
    Family,
    Rule,
    Scope,
    has_star_kwargs,
    keyword,
    names_in,
)
from torchplace.lint.rules.facts import FACTORIES, is_device_bound_loop

__all__ = ["FAMILY"]

PAGEABLE_NON_BLOCKING = Rule(
    "TPL701", "non-blocking-from-pageable", "`non_blocking=True` copy from unpinned memory"
)
PIN_IN_LOOP = Rule("TPL702", "pin-memory-in-loop", "`.pin_memory()` inside a device loop")

_DATALOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "zip"})


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
    if isinstance(func.value, ast.Call):  # torch.from_numpy(a).to(d, non_blocking=True)
        source = _fresh_pageable(func.value, ctx)
    else:
        root = _root_name(func.value)
        if root is None:
            return
        source = _unpinned_source(root, ctx, scope)
    if source is not None:
        ctx.report(
            PAGEABLE_NON_BLOCKING.code,
            call,
            f"`non_blocking=True` from pageable memory ({source}): the copy cannot overlap "
            "and runs synchronously; pin the source (`pin_memory=True`) or drop the flag",
        )


def _fresh_pageable(call: ast.Call, ctx: Context) -> str | None:
    qualname = ctx.call_qualname(call)
    if qualname not in FACTORIES and qualname != "torch.from_numpy":
        return None
    if has_star_kwargs(call) or keyword(call, "pin_memory") or keyword(call, "device"):
        return None
    return f"`{qualname}(...)` returns pageable memory"


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _unpinned_source(name: str, ctx: Context, scope: Scope) -> str | None:
    # (a) a batch from a DataLoader without pin_memory=True.
    for loop in reversed(ctx.loops()):
        if not isinstance(loop, (ast.For, ast.AsyncFor)):
            continue
        targets = names_in(loop.target)
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
    # (b) a tensor built right here by a factory without pin_memory=True.
    values = ctx.scope_bindings(scope).get(name)
    if not values or any(value is None for value in values):
        return None
    for value in values:
        if not isinstance(value, ast.Call) or has_star_kwargs(value):
            return None
        qualname = ctx.call_qualname(value)
        if qualname not in FACTORIES and qualname != "torch.from_numpy":
            return None
        pin = keyword(value, "pin_memory")
        if pin is not None or keyword(value, "device") is not None:
            return None
    return f"`{name}` is created on line {values[0].lineno} without `pin_memory=True`"  # type: ignore[union-attr]


def _derived(name: str, targets: set[str], loop: ast.For | ast.AsyncFor) -> bool:
    """``x, y = batch`` inside the loop: ``x`` comes from the loop target."""
    for stmt in loop.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(n, ast.Name) and n.id == name for t in stmt.targets for n in ast.walk(t)
        ):
            return bool(names_in(stmt.value) & targets)
    return False


def _loader_call(node: ast.expr, ctx: Context, scope: Scope) -> ast.Call | None:
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id not in _WRAPPERS or not node.args:
            break
        node = node.args[0]
    if isinstance(node, ast.Name):
        values = ctx.scope_bindings(scope).get(node.id)
        if not values or len(values) != 1 or values[0] is None:
            return None
        node = values[0]
    if isinstance(node, ast.Call) and ctx.call_qualname(node) in _DATALOADERS:
        return node
    return None


FAMILY = Family(
    rules=(PAGEABLE_NON_BLOCKING, PIN_IN_LOOP),
    checks=((ast.Call, _call, (PAGEABLE_NON_BLOCKING.code, PIN_IN_LOOP.code)),),
    triggers=("non_blocking", ".pin_memory("),
)
