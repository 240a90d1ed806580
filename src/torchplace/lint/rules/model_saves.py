"""Which calls save a checkpoint to a path their caller hands them: a function or method of the
linted code whose ``torch.save`` writes to its parameter (or to a path built from it), followed
a few calls deep through this file, its class's own methods, an instance's ``__call__`` and
the modules of the linted tree it imports.

TPL401 asks this of the calls above a ``torch.load``: Informer's ``early_stopping(vali_loss,
self.model, path)`` runs ``EarlyStopping.__call__``, then ``save_checkpoint``, which writes
``path + '/' + 'checkpoint.pth'``; the ``torch.load(path + '/' + 'checkpoint.pth')`` below it
in the same ``train()`` reads a file of this run, saved where the device exists.
"""

from __future__ import annotations

import ast
import copy
import re

from torchplace.lint.base import bindings
from torchplace.lint.nodes import own_nodes
from torchplace.lint.provenance.files import FileFacts
from torchplace.lint.rules.model_loads import _defined, _imported, _methods

__all__ = ["saved_paths"]

# How many calls deep a save is looked for behind a call (Informer's instance call, its
# `__call__`, then the `save_checkpoint` method that writes).
_DEPTH = 3
_Def = ast.FunctionDef | ast.AsyncFunctionDef
_Callee = tuple[FileFacts, _Def, ast.ClassDef | None, bool]
_Memo = dict[tuple[int, int], list[ast.expr]]
# A parameter named as the file the function saves (`save_path`, `model_save_file`,
# `savepath`) of a function that trains or evaluates a model: the caller hands it the
# checkpoint to write, even where the body leaves the save to be written (an exercise's
# `## TODO: save the model`). A download helper's `save_path` holds a file from elsewhere.
_SAVE_PARAM = re.compile(r"(?:^|_)save_?(?:path|file|to)$")


class _Unknown(Exception):
    """A path built from a name the callee binds itself: not the caller's file."""


def saved_paths(
    call: ast.Call,
    facts: FileFacts,
    scope: ast.AST,
    cls: ast.ClassDef | None,
    memo: _Memo,
    depth: int = _DEPTH,
) -> list[ast.expr]:
    """The paths that running ``call`` (in ``scope``, a function of ``facts``'s file or its
    module) saves with ``torch.save``, in the caller's terms: each callee's save paths with its
    parameters replaced by the arguments ``call`` gives them; a path the callee builds from a
    name of its own is left out. Also each argument given to a parameter named for saving
    (``train(..., save_path)``)."""
    found: list[ast.expr] = []
    for owner, node, owner_cls, bound in _callees(facts, call, scope, cls):
        given = _given(call, node, bound)
        if not given:
            continue
        local = bindings(node)
        # a parameter the callee rebinds (`dest = "other.pt"`) no longer holds the argument
        kept = {k: v for k, v in given.items() if local.get(k, [None]) == [None]}
        for path in _own_saves(owner, node, owner_cls, depth, memo):
            try:
                found.append(_Substitute(kept, set(local)).visit(copy.deepcopy(path)))
            except _Unknown:
                continue
        if _runs_a_model(node):
            found += [v for name, v in kept.items() if _SAVE_PARAM.search(name.lower())]
    return found


# Calls that train or evaluate a model (`model.train()`, `loss.backward()`, `optimizer.step()`).
_RUNS_MODEL = frozenset({"train", "eval", "backward", "step"})


def _runs_a_model(node: _Def) -> bool:
    """``node`` trains or evaluates a model itself: a training loop that is given where to
    save its checkpoint."""
    return any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr in _RUNS_MODEL
        and not sub.args
        for sub in own_nodes(node)
    )


def _own_saves(
    facts: FileFacts, node: _Def, cls: ast.ClassDef | None, depth: int, memo: _Memo
) -> list[ast.expr]:
    """The paths ``node`` saves to, in its own terms: its own ``torch.save`` calls, and those
    of the functions it calls (``depth`` levels), with its arguments put in."""
    key = (id(node), depth)
    if key in memo:
        return memo[key]
    memo[key] = []  # recursion: nothing (yet) known
    found: list[ast.expr] = []
    calls = [sub for sub in own_nodes(node) if isinstance(sub, ast.Call)]
    for call in calls:
        if facts.qualname(call.func) == "torch.save":
            path = call.args[1] if len(call.args) > 1 else None
            path = next((k.value for k in call.keywords if k.arg == "f"), path)
            if path is not None:
                found.append(path)
        elif depth > 1:
            found += saved_paths(call, facts, node, cls, memo, depth - 1)
    memo[key] = found
    return found


def _callees(
    facts: FileFacts, call: ast.Call, scope: ast.AST, cls: ast.ClassDef | None
) -> list[_Callee]:
    """The functions of the linted code ``call`` runs, each with whether it is a method bound
    to its instance (its first parameter not given by the call): a function of the file or
    imported from the tree, a class's ``__init__``, a method of ``cls`` called on ``self``, or
    ``__call__`` (or a method) of an instance ``scope`` builds from such a class
    (``early_stopping = EarlyStopping(patience=7)``, then ``early_stopping(loss, model, path)``)."""
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        if func.value.id == "self":
            methods = [m for m in _methods(cls) if m.name == func.attr] if cls else []
            return [(facts, m, cls, True) for m in methods]
        instance = _instance_class(facts, func.value.id, scope)
        if instance is not None:
            return _class_method(facts, instance, func.attr)
    if isinstance(func, ast.Name):
        if facts.top_level(func.id) is not None:
            return [(f, n, c, c is not None) for f, n, c in _defined(facts, func.id)]
        instance = _instance_class(facts, func.id, scope)
        if instance is not None:
            return _class_method(facts, instance, "__call__")
    qualname = facts.qualname(func)
    if qualname is None:
        return []
    return [(f, n, c, c is not None) for f, n, c in _imported(facts.path, qualname, 0)]


def _instance_class(facts: FileFacts, name: str, scope: ast.AST) -> ast.expr | None:
    """The class ``name`` is an instance of: ``scope`` binds it once, to a call of a class
    (``early_stopping = EarlyStopping(...)``); the callee expression, else None."""
    values = bindings(scope).get(name, [])
    if len(values) != 1 or not isinstance(values[0], ast.Call):
        return None
    return values[0].func


def _class_method(facts: FileFacts, func: ast.expr, method: str) -> list[_Callee]:
    if isinstance(func, ast.Name) and isinstance(facts.top_level(func.id), ast.ClassDef):
        found = _defined(facts, func.id, method)
    else:
        qualname = facts.qualname(func)
        found = _imported(facts.path, qualname, 0, method) if qualname is not None else []
    return [(f, n, c, True) for f, n, c in found if c is not None]


def _given(call: ast.Call, node: _Def, bound: bool) -> dict[str, ast.expr]:
    """Each parameter of ``node`` that ``call`` gives an argument, with that argument."""
    params = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
    if bound:
        params = params[1:]
    given: dict[str, ast.expr] = {}
    for name, arg in zip(params, call.args, strict=False):
        if isinstance(arg, ast.Starred):
            break
        given[name] = arg
    named = {*params, *(a.arg for a in node.args.kwonlyargs)}
    given.update({k.arg: k.value for k in call.keywords if k.arg in named})
    return given


class _Substitute(ast.NodeTransformer):
    """A callee's path with its parameters replaced by the caller's arguments."""

    def __init__(self, given: dict[str, ast.expr], local: set[str]) -> None:
        self.given = given
        self.local = local

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id in self.given:
            return copy.deepcopy(self.given[node.id])
        if node.id in self.local:
            raise _Unknown(node.id)
        return node  # a module's name (`os`), the same in the caller
