"""Project helpers that read their argument back to the host: ``to_cpu(x)``.

A helper of the linted code whose every ``return`` hands back its first parameter copied to
the host (``def to_cpu(tensor): return tensor.detach().cpu()``, also a module's lambda,
``to_np = lambda x: x.data.cpu().numpy()``) is the read itself at each of its call sites, in
its own file or in a module that imports it (``from .utils import to_cpu``).
"""

from __future__ import annotations

import ast
import re

from torchplace.lint.base import Context
from torchplace.lint.nodes import own_nodes
from torchplace.lint.provenance import file_facts

__all__ = ["helper_read"]

# The copies to the host a helper's chain must hold, and the reads it may name as its own.
_COPIES = frozenset({"cpu", "item", "tolist"})
_READS = frozenset({*_COPIES, "numpy"})
# The methods a helper's chain may take on the way (`.detach()`, `.float()`).
_PASSES = frozenset({*_READS, "detach", "float", "clone", "contiguous"})
# The names such a helper goes by, and the lines the sync rules read for them (`cpu(`).
_NAMED_FOR_READ = re.compile(r"cpu|numpy|(?:^|_|2)np(?:_|$)", re.IGNORECASE)
# Libraries whose functions are never the project's helpers (`torch.from_numpy(a)`).
_LIBRARIES = frozenset({"torch", "numpy", "np", "cupy", "jax", "tensorflow"})


def helper_read(call: ast.Call, ctx: Context) -> str | None:
    """The last read (``"cpu"``, ``"numpy"``, ...) of the project helper ``call`` invokes, when
    it is such a helper; else None."""
    if not call.args or isinstance(call.args[0], ast.Starred):
        return None
    func = call.func
    called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    if not _NAMED_FOR_READ.search(called):
        return None  # only a helper named for its copy (`to_cpu`, `tensor2numpy`) is looked up
    facts = file_facts(ctx)
    node: ast.AST | None = None
    if isinstance(func, ast.Name):
        node = facts.top_level(func.id) or _top_lambda(facts.tree, func.id)
    if node is None:
        qualname = ctx.call_qualname(call)
        module, _, name = (qualname or "").rpartition(".")
        if module.split(".")[0] in _LIBRARIES:
            return None  # `torch.from_numpy(a)`: not a helper of the project
        other = facts.module_facts(module) if module else None
        node = other.top_level(name) if other is not None else None
    if isinstance(node, ast.Lambda):
        params = [*node.args.posonlyargs, *node.args.args]
        return _chain_read(node.body, params[0].arg) if params else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return _reads_first_param(node)


def _top_lambda(tree: ast.Module, name: str) -> ast.Lambda | None:
    """``to_np = lambda x: x.data.cpu().numpy()``: a lambda the module binds ``name`` to, its
    only module-level binding."""
    found = [
        stmt.value
        for stmt in tree.body
        if isinstance(stmt, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
    ]
    return found[0] if len(found) == 1 and isinstance(found[0], ast.Lambda) else None


def _reads_first_param(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The read every ``return`` of ``function`` makes of its first parameter, if each does."""
    params = [*function.args.posonlyargs, *function.args.args]
    if not params or params[0].arg in {"self", "cls"}:
        return None
    first = params[0].arg
    returns = [r.value for r in own_nodes(function) if isinstance(r, ast.Return)]
    if not returns:
        return None
    last: str | None = None
    for value in returns:
        read = _chain_read(value, first)
        if read is None:
            return None
        last = read
    return last


def _chain_read(value: ast.expr | None, param: str) -> str | None:
    """``tensor.detach().cpu().numpy()`` of ``param``: the chain's last read (``"numpy"``),
    when it copies to the host (a ``.cpu()``, ``.item()`` or ``.tolist()`` on the way)."""
    methods: list[str] = []
    node = value
    while isinstance(node, ast.Call) and not node.args and not node.keywords:
        if not isinstance(node.func, ast.Attribute) or node.func.attr not in _PASSES:
            return None
        methods.append(node.func.attr)
        node = node.func.value
        if isinstance(node, ast.Attribute) and node.attr == "data":
            node = node.value
    if not isinstance(node, ast.Name) or node.id != param:
        return None
    if not _COPIES & set(methods):
        return None
    return next(method for method in methods if method in _READS)
