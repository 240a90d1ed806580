"""TPL5xx: module state that ``nn.Module.to()`` cannot see (pitfall 12): tensors and modules in
plain containers, and tensors kept as plain attributes."""

from __future__ import annotations

import ast

from torchplace.lint.base import Context, Family, Rule, Scope
from torchplace.lint.rules.facts import FACTORIES, is_module_expr, is_tensor_expr

__all__ = ["FAMILY"]

PLAIN_CONTAINER = Rule(
    "TPL501",
    "tensor-in-plain-container",
    "tensors or modules kept in a plain list/dict attribute, or a tensor as a plain attribute",
)

_CONTAINERS = (ast.List, ast.Tuple, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
_PARAMETERS = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter"})


def _self_attr(node: ast.AST) -> str | None:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return node.attr
    return None


def _held(node: ast.expr, ctx: Context, scope: Scope) -> str | None:
    """``"tensors"``/``"modules"`` when ``node`` certainly builds a tensor or module."""
    if not isinstance(node, ast.Call):
        return None
    if ctx.call_qualname(node) in _PARAMETERS or is_tensor_expr(node, ctx, scope):
        return "tensors"
    if is_module_expr(node, ctx):
        return "modules"
    return None


def _contents(container: ast.expr, ctx: Context, scope: Scope) -> str | None:
    elements: list[ast.expr]
    if isinstance(container, ast.Dict):
        elements = [v for v in container.values if v is not None]
    elif isinstance(container, (ast.List, ast.Tuple, ast.Set)):
        elements = list(container.elts)
    elif isinstance(container, ast.DictComp):
        elements = [container.value]
    elif isinstance(container, (ast.ListComp, ast.SetComp)):
        elements = [container.elt]
    else:
        return None
    for element in elements:
        held = _held(element, ctx, scope)
        if held is not None:
            return held
    return None


def _advice(held: str) -> str:
    return (
        "use `nn.ParameterList`/`ParameterDict` or `register_buffer`"
        if held == "tensors"
        else "use `nn.ModuleList`/`nn.ModuleDict`"
    )


def _assign(node: ast.Assign, ctx: Context) -> None:
    method = ctx.method_of_module()
    if method is None or method.cls is None or len(node.targets) != 1:
        return
    target = node.targets[0]
    attr = _self_attr(target)
    value = node.value
    plain: set[str] = method.cls.cache.setdefault("plain-containers", set())
    if attr is not None:
        if _plain_tensor(value, ctx, method, attr):
            _report_attribute(ctx, node, method.cls, attr)
        elif isinstance(value, _CONTAINERS):
            if isinstance(value, (ast.List, ast.Dict, ast.Set)) and not (
                value.keys if isinstance(value, ast.Dict) else value.elts
            ):
                plain.add(attr)
                return
            held = _contents(value, ctx, method)
            if held is not None:
                _report(ctx, node, method.cls, attr, held)
        elif (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id in {"list", "dict"}
            and not value.args
        ):
            plain.add(attr)
        return
    # self.cache[key] = torch.zeros(...)
    if isinstance(target, ast.Subscript):
        attr = _self_attr(target.value)
        if attr in plain:
            held = _held(value, ctx, method)
            if held is not None:
                _report(ctx, node, method.cls, attr, held)


def _expr(node: ast.Expr, ctx: Context) -> None:
    call = node.value
    if not isinstance(call, ast.Call):
        return
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in {"append", "insert", "extend"}:
        return
    attr = _self_attr(func.value)
    if attr is None or not call.args:
        return
    method = ctx.method_of_module()
    if method is None or method.cls is None:
        return
    if attr not in method.cls.cache.get("plain-containers", ()):
        return
    value = call.args[-1]
    held = _contents(value, ctx, method) if func.attr == "extend" else _held(value, ctx, method)
    if held is not None:
        _report(ctx, call, method.cls, attr, held)


# Methods that take over placement: a class that overrides one moves its own plain tensors.
_PLACEMENT_OVERRIDES = frozenset({"_apply", "to", "cuda", "cpu"})


def _plain_tensor(value: ast.expr, ctx: Context, method: Scope, attr: str) -> bool:
    """``self.cache = torch.zeros(n, d)`` in ``__init__``: a tensor of more than one element
    kept as a plain attribute, which ``.to()`` leaves behind, used by the other methods
    without being moved there first."""
    if method.name != "__init__" or method.cls is None or not isinstance(value, ast.Call):
        return False
    name = ctx.call_qualname(value)
    if name not in FACTORIES or _single_value(value, name):
        return False
    cls = method.cls
    return not (_overrides_placement(cls) or _moved_where_used(cls, attr))


def _single_value(call: ast.Call, name: str) -> bool:
    """``torch.tensor(0.5)``, ``torch.tensor(x)`` of a number: 0-dim, it mixes with tensors
    on any device (only ``torch.tensor`` of a literal list or a name may hold more)."""
    if name != "torch.tensor" or not call.args:
        return False
    return not isinstance(call.args[0], (ast.List, ast.Tuple, ast.ListComp, ast.Name, ast.Call))


def _overrides_placement(cls: Scope) -> bool:
    assert isinstance(cls.node, ast.ClassDef)
    return any(
        isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
        and item.name in _PLACEMENT_OVERRIDES
        for item in cls.node.body
    )


def _moved_where_used(cls: Scope, attr: str) -> bool:
    """Every read of ``self.<attr>`` outside ``__init__`` places it first
    (``self.mean.to(x.device)``, ``self.table[t].to(x)``), or nothing reads it."""
    assert isinstance(cls.node, ast.ClassDef)
    reads = 0
    for item in cls.node.body:
        if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) or item.name == "__init__":
            continue
        placed: set[int] = set()
        for sub in ast.walk(item):
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in {"to", "cuda", "type_as"}
            ):
                placed |= {id(n) for n in ast.walk(sub.func.value)}
        for sub in ast.walk(item):
            if (
                isinstance(sub, ast.Attribute)
                and _self_attr(sub) == attr
                and isinstance(sub.ctx, ast.Load)
                and id(sub) not in placed
            ):
                reads += 1
    return reads == 0


def _report_attribute(ctx: Context, node: ast.AST, cls: Scope, attr: str) -> None:
    if attr in _registered_later(cls) or attr in _registered_by_name(cls):
        return
    ctx.report(
        PLAIN_CONTAINER.code,
        node,
        f"`{cls.name}.{attr}` keeps a tensor as a plain attribute: `.to()` leaves it on the "
        "device it was built on and `state_dict()` does not save it; use `register_buffer` "
        "(`persistent=False` for a cache)",
    )


def _registered_by_name(cls: Scope) -> set[str]:
    """Attributes passed to a registration call by value or by name
    (``self.register_buffer("mask", self.mask)``, ``setattr(self, "mask", ...)``)."""
    found: set[str] = set()
    for sub in ast.walk(cls.node):
        if isinstance(sub, ast.Call) and _is_register(sub):
            for arg in sub.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.add(arg.value)
                found |= {_self_attr(n) or "" for n in ast.walk(arg)} - {""}
    return found


_REGISTER = frozenset(
    {"add_module", "register_module", "register_buffer", "register_parameter", "setattr"}
)


def _is_register(call: ast.AST) -> bool:
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    return (isinstance(func, ast.Attribute) and func.attr in _REGISTER) or (
        isinstance(func, ast.Name) and func.id in _REGISTER
    )


def _registered_later(cls: Scope) -> set[str]:
    """Attributes the class registers after all: ``self.x = nn.ModuleList(self.x)``,
    ``for i, m in enumerate(self.x): self.add_module(str(i), m)``, or each element as it is
    added (``self.add_module(name, self.x[-1])``)."""
    cached: set[str] | None = cls.cache.get("registered-later")
    if cached is not None:
        return cached
    found: set[str] = set()
    for sub in ast.walk(cls.node):
        if isinstance(sub, ast.Call) and _is_register(sub):
            for arg in sub.args[1:]:
                attr = _self_attr(arg.value) if isinstance(arg, ast.Subscript) else None
                if attr is not None:
                    found.add(attr)
        if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call):
            for target in sub.targets:
                attr = _self_attr(target)
                if attr is not None and any(
                    _self_attr(n) == attr for arg in sub.value.args for n in ast.walk(arg)
                ):
                    found.add(attr)
        elif isinstance(sub, (ast.For, ast.AsyncFor)):
            iterated = {_self_attr(n) for n in ast.walk(sub.iter)} - {None}
            if iterated and any(_is_register(n) for stmt in sub.body for n in ast.walk(stmt)):
                found.update(a for a in iterated if a is not None)
    cls.cache["registered-later"] = found
    return found


def _report(ctx: Context, node: ast.AST, cls: Scope, attr: str, held: str) -> None:
    if attr in _registered_later(cls):
        return
    ctx.report(
        PLAIN_CONTAINER.code,
        node,
        f"`{cls.name}.{attr}` keeps {held} in a plain Python container: `.to()`, `state_dict()` "
        f"and `parameters()` do not see them; {_advice(held)}",
    )


FAMILY = Family(
    rules=(PLAIN_CONTAINER,),
    checks=(
        (ast.Assign, _assign, (PLAIN_CONTAINER.code,)),
        (ast.Expr, _expr, (PLAIN_CONTAINER.code,)),
    ),
    triggers=(),
)
