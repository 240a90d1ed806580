"""TPL3xx: timing device work with a host clock (pitfall 7: kernels are asynchronous)."""

from __future__ import annotations

import ast

from torchplace.lint.base import Context, Family, Rule, Scope, call_name, keyword
from torchplace.lint.provenance import is_device_expr
from torchplace.lint.provenance.values import _is_cpu
from torchplace.lint.rules.facts import (
    CASTS,
    DEVICE_STRING,
    SYNC_CALLS,
    TIMERS,
    moves_to_device,
)

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
    found = _until_read(block[index + 1 :], start, ctx)
    if found is None:
        return  # no end read in this block: cannot tell what is timed
    region, rest = found
    if _limits(region[-1], start):
        return  # `if time.time() - t > time_limit: break`: a timeout, not a measurement
    placed = _device_names(ctx.function_scope() or ctx.scope, ctx)
    if not placed:
        return
    if not _times_work(region, placed, ctx):
        later = [] if _restarts(region[-1], start, ctx) else _later_reads(rest, start, ctx)
        if not (later and _times_work(region + later, placed, ctx)):
            return  # nor do the later reads of the same start (the batch time after the data time)
    ctx.report(
        UNSYNCED_TIMING.code,
        value,
        f"`{clock}()` times device work without a synchronize: kernels run asynchronously, so "
        "this measures the launch, not the work; call `torch.cuda.synchronize()` before each "
        "clock read or time with CUDA events",
    )


def _times_work(region: list[ast.AST], placed: set[str], ctx: Context) -> bool:
    """The region runs device work and nothing in it waits for the device."""
    calls = [sub for node in region for sub in ast.walk(node) if isinstance(sub, ast.Call)]
    if any(_syncs(call, ctx) or _reads_back(call, placed) or _whole_run(call) for call in calls):
        return False
    return any(_uses(call, placed, ctx) for call in calls if call_name(call) not in _NOT_WORK)


Found = tuple[list[ast.AST], list[ast.stmt]]


def _until_read(block: list[ast.stmt], start: str, ctx: Context) -> Found | None:
    """The code that runs between the clock's start and its first read, in program order, and
    the statements after that read in its block.

    A loop whose body reads the clock first thing (``for batch in loader:
    data_time.update(time.time() - end)``) times only its header and the statements before
    that read on the first pass; later passes are timed from the loop's own restart of the
    clock. ``None`` when the block never reads the clock."""
    region: list[ast.AST] = []
    for position, stmt in enumerate(block):
        if not (_reads_elapsed(stmt, start) or _reads_clock(stmt, ctx)):
            region.append(stmt)
            continue
        if isinstance(stmt, (ast.For, ast.AsyncFor)) and not _reads_clock(stmt.iter, ctx):
            inner = _until_read(stmt.body, start, ctx)
            if inner is not None:
                return [*region, stmt.iter, *inner[0]], inner[1]
        elif isinstance(stmt, ast.While) and not _reads_clock(stmt.test, ctx):
            inner = _until_read(stmt.body, start, ctx)
            if inner is not None:
                return [*region, stmt.test, *inner[0]], inner[1]
        region.append(stmt)
        return region, block[position + 1 :]  # the stop: `end = time.time()` or `... - t0`
    return None


def _later_reads(rest: list[ast.stmt], start: str, ctx: Context) -> list[ast.AST]:
    """The statements up to the last read of the same start before the clock restarts:
    ``batch_time.update(time.time() - end)`` after ``data_time.update(time.time() - end)``
    times the whole step, from the same ``end``."""
    taken: list[ast.AST] = []
    last = 0
    for stmt in rest:
        if _restarts(stmt, start, ctx):
            break
        taken.append(stmt)
        if _reads_elapsed(stmt, start):
            last = len(taken)
    return taken[:last]


def _restarts(stmt: ast.AST, start: str, ctx: Context) -> bool:
    """``end = time.time()``: the clock starts again under the same name."""
    return (
        isinstance(stmt, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == start for t in stmt.targets)
        and isinstance(stmt.value, ast.Call)
        and _is_clock(stmt.value, ctx)
    )


# A whole run of steps (which reads results back as it goes: losses, each generated token for
# its stop check), or a load of weights, whose copies from host memory the host waits for.
_RUN_WORDS = (
    "train",
    "epoch",
    "evaluate",
    "fit",
    "validate",
    "generate",
    "load_checkpoint",
    "load_state",
    "load_weights",
    "load_model",
)


def _whole_run(call: ast.Call) -> bool:
    """``train_one_epoch(...)``, ``evaluate(...)``, ``generate(model, prompt)``: the clock times
    a whole run of steps, which read their results back as they go (a decoder reads each token
    to check for a stop); ``load_checkpoint(...)`` copies from host memory, which the host waits
    for. The total is wall time, not a kernel launch. A step (``train_step(batch)``) is not a
    run."""
    name = (call_name(call) or "").lower()
    if "step" in name or "batch" in name:
        return False  # `train_step(batch)`, `train_batch(x)`: one step's launches
    return any(word in name for word in _RUN_WORDS)


def _is_clock(call: ast.Call, ctx: Context) -> bool:
    return ctx.call_qualname(call) in TIMERS


def _reads_clock(stmt: ast.AST, ctx: Context) -> bool:
    return any(isinstance(sub, ast.Call) and _is_clock(sub, ctx) for sub in ast.walk(stmt))


def _limits(stop: ast.AST, start: str) -> bool:
    """The first read compares the elapsed time with a limit (a time-out guard)."""
    return any(
        isinstance(sub, ast.Compare)
        and any(_reads_elapsed(side, start) for side in [sub.left, *sub.comparators])
        for sub in ast.walk(stop)
    )


def _reads_elapsed(stmt: ast.AST, start: str) -> bool:
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


def _reads_back(call: ast.Call, placed: set[str]) -> bool:
    """``int(pred[0] == labels[i])``, ``float(loss)``: a cast of a value computed from a placed
    tensor copies it to the host, which waits for the device's queued work."""
    func = call.func
    if not (isinstance(func, ast.Name) and func.id in CASTS and len(call.args) == 1):
        return False
    return any(isinstance(n, ast.Name) and n.id in placed for n in ast.walk(call.args[0]))


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

    ``x = x.cuda()``, ``x = batch.to("cuda:0")``, ``y = torch.ones(3, device="cuda")``, what a
    call is told to build on or move to a device variable (``y = torch.ones(3, device=device)``,
    ``batch = task.prepare_batch(batch, device=device)``), and modules moved in place
    (``model.cuda()``, ``model.to(device)`` as a statement).
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
                _places(call, ctx, told=False)
                and isinstance(call.func, ast.Attribute)
                and isinstance(call.func.value, ast.Name)
            ):
                names.add(call.func.value.id)
    scope.cache["device-names"] = names
    return names


def _places(call: ast.Call, ctx: Context, *, told: bool = True) -> bool:
    """A move (``.cuda()``, ``.to(device)``), a call given an accelerator (``device="cuda"``),
    or, with ``told``, one given a device variable (``device=device``) to build or put its
    result on (as a statement, ``model.set_cache(device=d)`` does not move ``model``)."""
    name = call_name(call)
    if name == "cuda":
        return True
    if name == "to" and moves_to_device(call, ctx):
        first = call.args[0] if call.args else None
        return not (isinstance(first, ast.Constant) and first.value == "cpu")
    device = getattr(keyword(call, "device"), "value", None)
    if isinstance(device, ast.Constant):
        return isinstance(device.value, str) and DEVICE_STRING.fullmatch(device.value) is not None
    return told and device is not None and is_device_expr(device) and not _is_cpu(device)


FAMILY = Family(
    rules=(UNSYNCED_TIMING,),
    checks=((ast.Assign, _assign, (UNSYNCED_TIMING.code,)),),
    triggers=(),
)
