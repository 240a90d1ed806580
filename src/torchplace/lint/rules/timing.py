"""TPL3xx: timing device work with a host clock (pitfall 7: kernels are asynchronous)."""

from __future__ import annotations

import ast

from torchplace.lint.base import Context, Family, Rule, Scope, call_name, keyword
from torchplace.lint.rules.facts import DEVICE_STRING, SYNC_CALLS, TIMERS, moves_to_device

__all__ = ["FAMILY"]

UNSYNCED_TIMING = Rule(
    "TPL301", "unsynchronized-timing", "host clock around device work without a synchronize"
)

_NOT_WORK = frozenset({"print", "len", "range", "append", "info", "debug", "warning", "format"})


def _assign(node: ast.Assign, ctx: Context) -> None:
    if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
        return
    value = node.value
    if not isinstance(value, ast.Call) or value.args or value.keywords:
        return
    clock = ctx.call_qualname(value)
    if clock not in TIMERS or not ctx.stmt_path:
        return
    start = node.targets[0].id
    block, index = ctx.stmt_path[-1]
    region = _until_read(block[index + 1 :], start, ctx)
    if region is None:
        return  # no end read in this block: cannot tell what is timed
    placed = _device_names(ctx.function_scope() or ctx.scope, ctx)
    if not placed:
        return
    calls = [sub for node in region for sub in ast.walk(node) if isinstance(sub, ast.Call)]
    if any(_syncs(call, ctx) or _whole_run(call) for call in calls):
        return
    if not any(_uses(call, placed, ctx) for call in calls if call_name(call) not in _NOT_WORK):
        return
    ctx.report(
        UNSYNCED_TIMING.code,
        value,
        f"`{clock}()` times device work without a synchronize: kernels run asynchronously, so "
        "this measures the launch, not the work; call `torch.cuda.synchronize()` before each "
        "clock read or time with CUDA events",
    )


def _until_read(block: list[ast.stmt], start: str, ctx: Context) -> list[ast.AST] | None:
    """The code that runs between the clock's start and its first read, in program order.

    A loop whose body reads the clock first thing (``for batch in loader:
    data_time.update(time.time() - end)``) times only its header and the statements before
    that read on the first pass; later passes are timed from the loop's own restart of the
    clock. ``None`` when the block never reads the clock."""
    region: list[ast.AST] = []
    for stmt in block:
        if not (_reads_elapsed(stmt, start) or _reads_clock(stmt, ctx)):
            region.append(stmt)
            continue
        if isinstance(stmt, (ast.For, ast.AsyncFor)) and not _reads_clock(stmt.iter, ctx):
            inner = _until_read(stmt.body, start, ctx)
            if inner is not None:
                return [*region, stmt.iter, *inner]
        elif isinstance(stmt, ast.While) and not _reads_clock(stmt.test, ctx):
            inner = _until_read(stmt.body, start, ctx)
            if inner is not None:
                return [*region, stmt.test, *inner]
        region.append(stmt)
        return region  # the stop: `end = time.time()` or `time.time() - t0`
    return None


_RUN_WORDS = ("train", "epoch", "evaluate", "fit", "validate")


def _whole_run(call: ast.Call) -> bool:
    """``train_one_epoch(...)``, ``evaluate(...)``: the clock times a whole run of steps, which
    read their results back as they go; the total is wall time, not a kernel launch."""
    name = call_name(call) or ""
    return any(word in name.lower() for word in _RUN_WORDS)


def _is_clock(call: ast.Call, ctx: Context) -> bool:
    return ctx.call_qualname(call) in TIMERS


def _reads_clock(stmt: ast.AST, ctx: Context) -> bool:
    return any(isinstance(sub, ast.Call) and _is_clock(sub, ctx) for sub in ast.walk(stmt))


def _reads_elapsed(stmt: ast.stmt, start: str) -> bool:
    for sub in ast.walk(stmt):
        if (
            isinstance(sub, ast.BinOp)
            and isinstance(sub.op, ast.Sub)
            and isinstance(sub.right, ast.Name)
            and sub.right.id == start
        ):
            return True
    return False


def _syncs(call: ast.Call, ctx: Context) -> bool:
    name = call_name(call)
    if name in SYNC_CALLS or name == "Event":
        return True
    if name is not None and "sync" in name.lower():
        return True  # a project's own helper: sync(), device_sync(), time_sync()
    qualname = ctx.call_qualname(call)
    return qualname is not None and "synchronize" in qualname


def _uses(call: ast.Call, placed: set[str], ctx: Context) -> bool:
    """The call computes with a tensor or module this function put on an accelerator:
    ``model(x)``, ``fn(x)``, ``torch.mm(x, w)`` or ``x.matmul(w)``, with ``x``/``model``
    placed. (``helper.prepare(model)`` and other methods of unplaced objects may well be
    host work: silent.)"""
    func = call.func
    if isinstance(func, ast.Name):
        if func.id in placed:
            return True
        operands: list[ast.AST] = [*call.args, *(kw.value for kw in call.keywords)]
    elif isinstance(func, ast.Attribute):
        root = func.value
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in placed:
            return True
        name = ctx.qualname(func)
        if name is None or not name.startswith("torch.") or name.startswith("torch.cuda."):
            return False
        operands = [*call.args, *(kw.value for kw in call.keywords)]
    else:
        return False
    return any(isinstance(n, ast.Name) and n.id in placed for op in operands for n in ast.walk(op))


def _device_names(scope: Scope, ctx: Context) -> set[str]:
    """Names this function binds to something it placed on an accelerator.

    ``x = x.cuda()``, ``x = batch.to("cuda:0")``, ``y = torch.ones(3, device="cuda")``, and
    modules moved in place (``model.cuda()``, ``model.to(device)`` as a statement).
    """
    cached: set[str] | None = scope.cache.get("device-names")
    if cached is not None:
        return cached
    names: set[str] = set()
    for sub in ast.walk(scope.node):
        if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call):
            if _places(sub.value, ctx):
                names.update(t.id for t in sub.targets if isinstance(t, ast.Name))
        elif isinstance(sub, ast.Expr) and isinstance(sub.value, ast.Call):
            call = sub.value
            if (
                _places(call, ctx)
                and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name)
            ):
                names.add(call.func.value.id)
    scope.cache["device-names"] = names
    return names


def _places(call: ast.Call, ctx: Context) -> bool:
    name = call_name(call)
    if name == "cuda":
        return True
    if name == "to" and moves_to_device(call, ctx):
        first = call.args[0] if call.args else None
        return not (isinstance(first, ast.Constant) and first.value == "cpu")
    device = getattr(keyword(call, "device"), "value", None)
    return (
        isinstance(device, ast.Constant)
        and isinstance(device.value, str)
        and DEVICE_STRING.fullmatch(device.value) is not None
    )


FAMILY = Family(
    rules=(UNSYNCED_TIMING,),
    checks=((ast.Assign, _assign, (UNSYNCED_TIMING.code,)),),
    triggers=(),
)
