"""Module helpers: functions of a file, outside any class, that only the methods of the file's
``nn.Module`` classes call (a reader's ``get_loss(start_logits, ...)`` called from its
``forward``). They compute for the module, so a placement they hard-code is the module's own:
TPL102 reports a ``.cuda()`` there as it does in a method."""

from __future__ import annotations

import ast

from torchplace.lint.base import Context, Scope
from torchplace.lint.nodes import own_nodes, walk
from torchplace.lint.provenance.callers import imported_by_siblings
from torchplace.lint.provenance.files import file_facts

__all__ = [
    "PLACEMENT_API",
    "class_methods",
    "construction_helpers",
    "construction_only",
    "module_helper_caller",
    "self_calls",
]


def module_helper_caller(ctx: Context) -> str | None:
    """``Class.method`` of an ``nn.Module`` that calls the function enclosing the node, when
    that function is one of the file's top-level functions and only methods of the file's
    module classes refer to it, or such helpers (never a script, another function or a class
    that is no module, nor a sibling module that imports it); else None."""
    scope = ctx.function_scope()
    if scope is None or scope.parent is None or scope.parent.kind != "module":
        return None
    return _callers(scope.root(), ctx).get(scope.name)


def _callers(root: Scope, ctx: Context) -> dict[str, str]:
    """Per top-level function name, the module method that calls it (directly, or through
    other such helpers: ``get_loss`` calling ``_take_mml``), for the functions that only module
    methods and such helpers refer to. Worked out once per file."""
    cached: dict[str, str] | None = root.cache.get("module-helper-callers")
    if cached is not None:
        return cached
    body: list[ast.stmt] = getattr(root.node, "body", [])
    functions = {
        stmt.name for stmt in body if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    found: dict[str, str] = {}  # called by a module method
    by_function: dict[str, set[str]] = {}  # the functions each function refers to
    elsewhere: set[str] = set()
    for stmt in body:
        if isinstance(stmt, ast.ClassDef) and ctx.resolver.is_module_class(stmt):
            for item in stmt.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for name in _references(item, functions):
                        found.setdefault(name, f"{stmt.name}.{item.name}")
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            by_function[stmt.name] = _references(stmt, functions) - {stmt.name}
        else:
            elsewhere |= _references(stmt, functions)
    result: dict[str, str] = {}
    if not found:
        root.cache["module-helper-callers"] = result
        return result
    candidates = {  # a function a sibling module imports may be handed anything
        name
        for name in functions - elsewhere
        if name in found or any(name in refs for refs in by_function.values())
    }
    candidates -= {name for name in candidates if imported_by_siblings(file_facts(ctx), name)}
    changed = True
    while changed:  # a helper of a helper: reached from a module method through helpers only
        changed = False
        for name in candidates - set(result):
            callers = {f for f, refs in by_function.items() if name in refs}
            if callers - set(result):
                continue
            via = found.get(name) or next((result[f] for f in sorted(callers)), None)
            if via is not None:
                result[name] = via
                changed = True
    root.cache["module-helper-callers"] = result
    return result


def _references(node: ast.AST, functions: set[str]) -> set[str]:
    """The names of ``functions`` that ``node`` reads (calls, or hands on as values)."""
    return {
        sub.id
        for sub in walk(node)
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) and sub.id in functions
    }


def class_methods(cls: Scope) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The methods ``cls`` defines in its own body, by name."""
    assert isinstance(cls.node, ast.ClassDef)
    return {
        item.name: item
        for item in cls.node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def self_calls(node: ast.AST) -> set[str]:
    """The names ``node`` calls as ``self.name(...)`` in its own body."""
    return {
        sub.func.attr
        for sub in own_nodes(node)
        if isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and isinstance(sub.func.value, ast.Name)
        and sub.func.value.id == "self"
    }


def construction_helpers(cls: Scope) -> set[str]:
    """Methods ``__init__`` calls through ``self.name(...)``, directly or through another such
    method (``forward`` and the placement API excluded)."""
    cached: set[str] | None = cls.cache.get("construction-helpers")
    if cached is not None:
        return cached
    methods = class_methods(cls)
    found: set[str] = set()
    todo = [methods["__init__"]] if "__init__" in methods else []
    for _ in range(8):  # a bounded walk: helpers of helpers, a few levels deep
        if not todo:
            break
        called = set().union(*(self_calls(m) for m in todo)) & set(methods)
        called -= found | {"__init__", "forward", "__call__"} | PLACEMENT_API
        found |= called
        todo = [methods[name] for name in called]
    cls.cache["construction-helpers"] = found
    return found


# The placement API a module may override: never a construction helper.
PLACEMENT_API = frozenset({"_apply", "to", "cuda", "cpu", "half", "float", "double", "type"})


def construction_only(method: Scope) -> bool:
    """``method`` is a construction helper (:func:`construction_helpers`) that no other
    method of its class calls: it runs while ``__init__`` builds the module, before anything
    can move it (smplx's ``create_mean_pose``, joined with the CPU buffers just registered)."""
    cls = method.cls
    if cls is None or method.name not in construction_helpers(cls):
        return False
    builders = construction_helpers(cls) | {"__init__"}
    return not any(
        method.name in self_calls(item)
        for name, item in class_methods(cls).items()
        if name not in builders
    )
