"""What callers hand a function: a parameter every call of a module-level function binds to a
device value holds one inside it, wherever those calls run (``validate(model, ...)`` called
every N steps with the model ``train`` moved: ``model(x)`` in ``validate``'s loop runs on the
device). Calls are those of the function's file and of the sibling modules that import it, and
each argument is judged by its caller's own code (:meth:`~.files.FileFacts.own_fact`), one level
up: the callers' callers are not walked, so no answer waits on another in a cycle.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchplace.lint.provenance.callers import _imported_as, _importers
from torchplace.lint.provenance.values import Fact

if TYPE_CHECKING:
    from torchplace.lint.provenance.files import FileFacts

__all__ = ["given_seeds"]

_Function = ast.FunctionDef | ast.AsyncFunctionDef
_Site = tuple["FileFacts", ast.AST, ast.Call]


def given_seeds(facts: FileFacts, function: _Function) -> dict[str, Fact]:
    """The parameters of ``function`` that every one of its calls binds to a device value
    (none when a call unpacks ``*args``/``**kwargs``, or nothing calls it)."""
    sites = _sites(facts, function)
    if not sites or any(_unpacks(call) for _, _, call in sites):
        return {}
    agreed: dict[str, Fact] | None = None
    for callers, scope, call in sites:
        found = {
            param: fact
            for param, arg in _bound(call, function).items()
            if (fact := callers.own_fact(arg, scope)) is not None and fact.on_device
        }
        agreed = found if agreed is None else {k: v for k, v in agreed.items() if k in found}
        if not agreed:
            return {}
    return agreed or {}


def _sites(facts: FileFacts, function: _Function) -> list[_Site]:
    """The calls of a module-level ``function``: in its file (not from itself), and in the
    sibling modules that import it."""
    if facts.parent.get(id(function)) is not facts.tree:
        return []
    found: list[_Site] = [
        (facts, scope, call)
        for scope, call, _ in facts.calls_of(function.name)
        if scope is not function and facts.local_def(call.func, scope) is function
    ]
    for others, stem in _importers(facts, function.name):
        found += [
            (others, scope, call)
            for scope, call, _ in others.calls_of(function.name)
            if _imported_as(others, call.func, f"{stem}.{function.name}")
        ]
    return found


def _bound(call: ast.Call, function: _Function) -> dict[str, ast.expr]:
    """The arguments of ``call`` by the parameter of ``function`` they bind."""
    params = [a.arg for a in [*function.args.posonlyargs, *function.args.args]]
    found = dict(zip(params, call.args, strict=False))
    found.update({kw.arg: kw.value for kw in call.keywords if kw.arg is not None})
    return found


def _unpacks(call: ast.Call) -> bool:
    return any(isinstance(a, ast.Starred) for a in call.args) or any(
        kw.arg is None for kw in call.keywords
    )
