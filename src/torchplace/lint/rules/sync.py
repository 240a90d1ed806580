"""TPL2xx: host syncs inside loops (pitfall 11: every step reads the device back)."""

from __future__ import annotations

import ast

from torchplace.lint.base import Context, Family, Rule
from torchplace.lint.rules.facts import (
    TIMERS,
    in_periodic_branch,
    in_test,
    is_device_bound_loop,
)

__all__ = ["FAMILY"]

SYNC_IN_LOOP = Rule(
    "TPL201", "sync-in-loop", "`.item()`/`.tolist()`/`.cpu()`/`.numpy()` in a device loop"
)
SYNCHRONIZE_IN_LOOP = Rule(
    "TPL202", "synchronize-in-loop", "`torch.cuda.synchronize()` inside a loop"
)

_READS = frozenset({"item", "tolist", "cpu", "numpy"})


def _call(call: ast.Call, ctx: Context) -> None:
    loops = ctx.loops()
    if not loops:
        return
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in _READS and not call.args:
        if ctx.qualname(func) is not None:  # np.something.item: a module path, not a tensor
            return
        if id(call) in ctx.claimed:  # the inner `.cpu()` of `x.cpu().numpy()`: one finding
            return
        inner = func.value
        while isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute):
            if inner.func.attr in _READS or inner.func.attr == "detach":
                ctx.claimed.add(id(inner))
            inner = inner.func.value
        if in_test(ctx) or in_periodic_branch(ctx):
            return
        if _times_each_step(loops[-1], ctx):
            return  # a profiling loop: it waits for the device on purpose
        if any(is_device_bound_loop(loop, ctx) for loop in loops):
            ctx.report(
                SYNC_IN_LOOP.code,
                call,
                f"`.{func.attr}()` inside a loop that runs device work: the host waits for "
                "the device on every step; keep results on the device and read them once "
                "after the loop",
            )
        return
    name = ctx.call_qualname(call)
    if name in {"torch.cuda.synchronize", "torch.accelerator.synchronize"}:
        if any(_times_each_step(loop, ctx) for loop in loops) or in_test(ctx):
            return  # timing each step, or a test making failures surface at the right step
        ctx.report(
            SYNCHRONIZE_IN_LOOP.code,
            call,
            f"`{name}()` inside a loop stalls the host on every step; synchronize once "
            "after the loop (or record CUDA events)",
        )


def _times_each_step(loop: ast.AST, ctx: Context) -> bool:
    """A loop that reads a timer each step synchronizes on purpose, to time each step."""
    body: list[ast.AST] = (
        [*loop.body, *([loop.test] if isinstance(loop, ast.While) else [])]
        if isinstance(loop, (ast.For, ast.AsyncFor, ast.While))
        else [loop]
    )
    for stmt in body:
        for sub in ast.walk(stmt):
            if isinstance(sub, ast.Call):
                name = ctx.call_qualname(sub)
                if name in TIMERS or (
                    isinstance(sub.func, ast.Attribute)
                    and sub.func.attr in {"elapsed_time", "record", "perf_counter", "time"}
                ):
                    return True
                if isinstance(sub.func, ast.Name) and "time" in sub.func.id.lower():
                    return True  # a project's own clock helper (time_sync(), timer())
    return False


FAMILY = Family(
    rules=(SYNC_IN_LOOP, SYNCHRONIZE_IN_LOOP),
    checks=((ast.Call, _call, (SYNC_IN_LOOP.code, SYNCHRONIZE_IN_LOOP.code)),),
    triggers=(".item(", ".tolist(", ".cpu(", ".numpy(", "synchronize"),
)
