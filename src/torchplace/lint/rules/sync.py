"""TPL2xx: host syncs inside loops (pitfall 11: every step reads the device back).

Built on :mod:`torchplace.lint.provenance`: a read is reported when it runs once per batch (in
a loop that steps through batches, a loop over a device tensor's rows, or a function called
from such a loop) and what it reads is on the device, or (for the explicit reads
``.item()``/``.tolist()``/``.cpu()``/``.numpy()`` in a batch loop) not provably on the host.
"""

from __future__ import annotations

import ast

from torchplace.lint.base import Context, Family, Rule
from torchplace.lint.provenance import Fact, FileFacts, file_facts, scope_node
from torchplace.lint.rules.facts import TIMERS, in_periodic_branch, in_test

__all__ = ["FAMILY"]

SYNC_IN_LOOP = Rule(
    "TPL201", "sync-in-loop", "host read of a device value (`.item()`, `float()`, ...) per batch"
)
SYNCHRONIZE_IN_LOOP = Rule(
    "TPL202", "synchronize-in-loop", "`torch.cuda.synchronize()` inside a loop"
)

_READS = frozenset({"item", "tolist", "cpu", "numpy"})
_CASTS = frozenset({"float", "int", "bool"})
_PRINTS = frozenset({"print"})


def _call(call: ast.Call, ctx: Context) -> None:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in _READS and not call.args:
        if ctx.qualname(func) is not None:  # np.something.item: a module path, not a tensor
            return
        if id(call) in ctx.claimed:  # the inner `.cpu()` of `x.cpu().numpy()`: one finding
            return
        inner = func.value
        while isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute):
            if inner.func.attr not in _READS and inner.func.attr != "detach":
                break
            ctx.claimed.add(id(inner))
            inner = inner.func.value
        _check(call, inner, f"`.{func.attr}()`", ctx, explicit=True)
        return
    if isinstance(func, ast.Name) and func.id in _CASTS and len(call.args) == 1:
        arg = call.args[0]
        if not _is_read(arg) and ctx.qualname(func) is None:
            _check(call, arg, f"`{func.id}()`", ctx, explicit=False)
        return
    if isinstance(func, ast.Name) and func.id in _PRINTS or (
        isinstance(func, ast.Attribute) and func.attr == "format" and call.args
    ):
        for sub in call.args:
            if isinstance(sub, ast.JoinedStr):
                ctx.claimed.add(id(sub))
        values = [a for a in call.args if not isinstance(a, (ast.Constant, ast.JoinedStr))]
        values += [v.value for a in call.args if isinstance(a, ast.JoinedStr)
                   for v in a.values if isinstance(v, ast.FormattedValue)]
        what = "`print()`" if isinstance(func, ast.Name) else "`str.format()`"
        _check_many(call, values, what, ctx)
        return
    name = ctx.call_qualname(call)
    if name in {"torch.cuda.synchronize", "torch.accelerator.synchronize"}:
        loops = ctx.loops()
        if not loops or any(_times_each_step(loop, ctx) for loop in loops) or in_test(ctx):
            return  # timing each step, or a test making failures surface at the right step
        ctx.report(
            SYNCHRONIZE_IN_LOOP.code,
            call,
            f"`{name}()` inside a loop stalls the host on every step; synchronize once "
            "after the loop (or record CUDA events)",
        )


def _joined(node: ast.JoinedStr, ctx: Context) -> None:
    if id(node) in ctx.claimed:
        return
    values = [v.value for v in node.values if isinstance(v, ast.FormattedValue)]
    _check_many(node, values, "an f-string", ctx)


def _is_read(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _READS
    )


def _check_many(node: ast.AST, values: list[ast.expr], what: str, ctx: Context) -> None:
    for value in values:
        if _is_read(value) or isinstance(value, ast.Constant):
            continue
        if _check(node, value, what, ctx, explicit=False):
            return


def _per_step(ctx: Context, facts: FileFacts, scope: ast.AST) -> tuple[str, int, str] | None:
    """``(kind, line, evidence)`` of the innermost enclosing loop that runs per batch or row."""
    for loop in reversed(ctx.loops()):
        kind = facts.loop_kind(loop, scope)
        if kind is not None:
            return kind[0], getattr(loop, "lineno", 0), kind[1]
    return None


_ADVICE = "keep it on the device and read it once after the loop (or every N steps)"


def _check(
    node: ast.AST, receiver: ast.expr, what: str, ctx: Context, *, explicit: bool
) -> bool:
    """Report ``what`` (a read of ``receiver``) if it runs per batch on a device value."""
    if in_test(ctx) or in_periodic_branch(ctx):
        return False
    loops = ctx.loops()
    if loops and _times_each_step(loops[-1], ctx):
        return False  # a profiling loop: it waits for the device on purpose
    facts = file_facts(ctx)
    scope = scope_node(ctx)
    fact = facts.fact(receiver, scope)
    if fact is not None and fact.where == "host":
        return False
    text = _text(receiver, ctx)
    step = _per_step(ctx, facts, scope) if loops else None
    if step is not None:
        kind, line, evidence = step
        if fact is None and (not explicit or kind != "batch"):
            return False
        if kind == "rows":
            where = f"in the loop at line {line}, once per row of a device tensor,"
        else:
            where = f"in the batch loop at line {line}"
        cause = fact.describe() if fact is not None else evidence
        ctx.report(
            SYNC_IN_LOOP.code,
            node,
            f"{what} of `{text}` {where} makes the host wait for the device on every step "
            f"({cause}); {_ADVICE}",
        )
        return True
    callers = facts.per_batch_callers(scope)
    if not callers:
        return False
    seeds: dict[str, Fact] = {}
    for site in callers:
        for param, arg in site.args.items():
            if arg.on_device:
                seeds.setdefault(param, arg)
    fact = facts.fact(receiver, scope, seeds) if seeds else fact
    if fact is None or not fact.on_device:
        return False
    site = callers[0]
    ctx.report(
        SYNC_IN_LOOP.code,
        node,
        f"{what} of `{text}` runs once per batch (`{getattr(scope, 'name', '?')}` is called in "
        f"the batch loop of `{site.caller}`, line {site.line}) and makes the host wait for the "
        f"device ({fact.describe()}); {_ADVICE}",
    )
    return True


def _text(node: ast.AST, ctx: Context) -> str:
    text = " ".join((ctx.segment(node) or "the value").split())
    return text if len(text) <= 40 else text[:37] + "..."


def _times_each_step(loop: ast.AST, ctx: Context) -> bool:
    """A loop that reads a timer each step synchronizes on purpose, to time each step."""
    key = f"times-each-step:{id(loop)}"
    cached = ctx.scope.cache.get(key)
    if cached is not None:
        return bool(cached)
    body: list[ast.AST] = (
        [*loop.body, *([loop.test] if isinstance(loop, ast.While) else [])]
        if isinstance(loop, (ast.For, ast.AsyncFor, ast.While))
        else [loop]
    )
    result = False
    for stmt in body:
        for sub in ast.walk(stmt):
            if isinstance(sub, ast.Call):
                name = ctx.call_qualname(sub)
                if name in TIMERS or (
                    isinstance(sub.func, ast.Attribute)
                    and sub.func.attr in {"elapsed_time", "record", "perf_counter", "time"}
                ):
                    result = True
                elif isinstance(sub.func, ast.Name) and "time" in sub.func.id.lower():
                    result = True  # a project's own clock helper (time_sync(), timer())
            if result:
                break
        if result:
            break
    ctx.scope.cache[key] = result
    return result


FAMILY = Family(
    rules=(SYNC_IN_LOOP, SYNCHRONIZE_IN_LOOP),
    checks=(
        (ast.Call, _call, (SYNC_IN_LOOP.code, SYNCHRONIZE_IN_LOOP.code)),
        (ast.JoinedStr, _joined, (SYNC_IN_LOOP.code,)),
    ),
    triggers=(
        ".item(",
        ".tolist(",
        ".cpu(",
        ".numpy(",
        "synchronize",
        "float(",
        "int(",
        "bool(",
        "print(",
        ".format(",
        'f"',
        "f'",
    ),
)
