"""TPL8xx: training setup order (an optimizer must see the parameters where they will live)."""

from __future__ import annotations

import ast

from torchplace.lint.base import Context, Family, Rule, call_name
from torchplace.lint.resolver import dotted_name
from torchplace.lint.rules.facts import moves_to_device

__all__ = ["FAMILY"]

OPTIMIZER_BEFORE_MOVE = Rule(
    "TPL801", "optimizer-before-move", "optimizer built from `model.parameters()` before `.to()`"
)


def _call(call: ast.Call, ctx: Context) -> None:
    name = ctx.call_qualname(call)
    if name is None or not name.startswith("torch.optim."):
        return
    last = name.rsplit(".", 1)[-1]
    if not last[:1].isupper() or "lr_scheduler" in name or "swa_utils" in name:
        return
    model = _parameters_owner(call, ctx)
    if model is None:
        return
    scope = ctx.function_scope() or ctx.scope
    own_body = getattr(scope.node, "body", None)
    for block, index in reversed(ctx.stmt_path):
        for stmt in block[index + 1 :]:
            move = _move_of(stmt, model, ctx)
            if move is not None:
                ctx.report(
                    OPTIMIZER_BEFORE_MOVE.code,
                    call,
                    f"optimizer built from `{model}.parameters()` before `{model}` is moved on "
                    f"line {move.lineno}: move the model first, then build the optimizer",
                )
                return
        if block is own_body:
            break  # later statements of an enclosing scope run at another time


def _parameters_owner(call: ast.Call, ctx: Context) -> str | None:
    for arg in [*call.args, *(kw.value for kw in call.keywords if kw.arg == "params")]:
        for sub in ast.walk(arg):
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in {"parameters", "named_parameters"}
            ):
                return dotted_name(sub.func.value)
    return None


def _move_of(stmt: ast.stmt, model: str, ctx: Context) -> ast.Call | None:
    for sub in ast.walk(stmt):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and call_name(sub) in {"to", "cuda"}
            and moves_to_device(sub, ctx)
            and dotted_name(sub.func.value) == model
        ):
            return sub
    return None


FAMILY = Family(
    rules=(OPTIMIZER_BEFORE_MOVE,),
    checks=((ast.Call, _call, (OPTIMIZER_BEFORE_MOVE.code,)),),
    triggers=("parameters(",),
)
