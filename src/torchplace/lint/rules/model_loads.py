"""Which calls load a model: the loaders themselves (``torch.load``, ``from_pretrained``, ...),
and the functions and classes of the linted code that run one when called (a constructor that
loads its weights, a helper that builds such an object), followed a few calls deep through
this file, its class's own methods and the modules of the linted tree it imports.

TPL403 asks this of a call inside a request handler or a loop: ``GFPGANer(...)`` in a
``predict()`` handler reloads the weights its ``__init__`` reads on every request.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

from torchplace.lint.nodes import own_nodes, subtree
from torchplace.lint.provenance.files import FileFacts, facts_for_file
from torchplace.lint.resolver import dotted_name, module_file

__all__ = [
    "LOADERS",
    "Load",
    "call_targets",
    "in_tree",
    "is_loader",
    "load_behind",
    "not_loaded_yet",
    "read_as_arrays",
]

LOADERS = frozenset(
    {
        "torch.load",
        "torch.jit.load",
        "torch.export.load",
        "torch.hub.load",
        "safetensors.torch.load_file",
        "safetensors.torch.load_model",
    }
)
# How many calls deep a load is looked for behind a call (a constructor, then the helper it
# calls, then that helper's own helper).
_DEPTH = 3
_Def = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True, slots=True)
class Load:
    """A load found behind a call: what loads (``torch.load``), in which function, where."""

    what: str
    where: str  # ``GFPGANer.__init__``
    path: str
    line: int

    def describe(self) -> str:
        return f"`{self.what}` in `{self.where}` at {os.path.basename(self.path)}:{self.line}"


def is_loader(call: ast.Call, qualname: str | None) -> str | None:
    """The name of the loader ``call`` is (``torch.load``, ``AutoModel.from_pretrained``)."""
    if qualname in LOADERS:
        return qualname
    if isinstance(call.func, ast.Attribute) and call.func.attr == "from_pretrained":
        return f"{dotted_name(call.func.value) or '...'}.from_pretrained"
    return None


def load_behind(
    call: ast.Call,
    facts: FileFacts,
    memo: dict[tuple[int, int], Load | None],
    cls: ast.ClassDef | None = None,
) -> Load | None:
    """The load that calling ``call``'s function or class runs, when it is code of the linted
    tree (this file's, or imported from a module file of the tree; with ``cls``, also a method
    of that class called on ``self``), else None. ``memo`` keeps what each function was found
    to load (by node and depth) for the next call."""
    for owner, node, owner_cls in call_targets(facts, call.func, cls):
        found = _loads(owner, node, owner_cls, _DEPTH, memo)
        if found is not None:
            return found
    return None


def call_targets(
    facts: FileFacts, func: ast.expr, cls: ast.ClassDef | None = None
) -> list[tuple[FileFacts, _Def, ast.ClassDef | None]]:
    """The functions a call of ``func`` runs: a function of the file or of an imported module,
    the ``__init__`` of a class (constructing it), or a method of ``cls`` (``self.f(...)``)."""
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
    ):
        return [(facts, m, cls) for m in _methods(cls) if m.name == func.attr] if cls else []
    qualname = facts.qualname(func)
    if qualname is not None:
        return _imported(facts.path, qualname, 0)
    if isinstance(func, ast.Name):
        return _defined(facts, func.id)
    return []


def _defined(
    facts: FileFacts, name: str, method: str = "__init__"
) -> list[tuple[FileFacts, _Def, ast.ClassDef | None]]:
    """A module-level function ``name`` of ``facts``'s file, or the constructor of its class
    (with ``method``, that method of the class instead: ``__call__`` of an instance called)."""
    node = facts.top_level(name)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [(facts, node, None)]
    if isinstance(node, ast.ClassDef):
        return [(facts, m, node) for m in _methods(node) if m.name == method]
    return []


def in_tree(path: str, qualname: str) -> bool:
    """``module.name``, imported by the file at ``path``, comes from a module file of the
    linted tree (not from torch or another installed package)."""
    module = qualname.rpartition(".")[0]
    if not module or module.split(".")[0] in {"torch", "typing", "builtins"}:
        return False
    return module_file(path, module) is not None


def _imported(
    path: str, qualname: str, depth: int, method: str = "__init__"
) -> list[tuple[FileFacts, _Def, ast.ClassDef | None]]:
    """``module.name`` as imported by the file at ``path``: found in the module file of the
    linted tree, also through a package ``__init__`` that re-exports it (by name or ``*``)."""
    module, _, name = qualname.rpartition(".")
    if depth > 2 or not in_tree(path, qualname):
        return []
    found = module_file(path, module)
    other = facts_for_file(found) if found is not None else None
    if other is None:
        return []
    direct = _defined(other, name, method)
    if direct:
        return direct
    again = other.resolver.names.get(name)
    if again is not None:
        return _imported(other.path, again, depth + 1, method)
    for star in other.resolver.stars:
        through = _imported(other.path, f"{star}.{name}", depth + 1, method)
        if through:
            return through
    return []


def _methods(cls: ast.ClassDef) -> list[_Def]:
    return [m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _loads(
    facts: FileFacts,
    node: _Def,
    cls: ast.ClassDef | None,
    depth: int,
    memo: dict[tuple[int, int], Load | None],
) -> Load | None:
    """A load ``node`` runs itself, or through the calls it makes (``depth`` levels)."""
    key = (id(node), depth)
    if key not in memo:
        memo[key] = None  # recursion: not (yet) known to load
        memo[key] = _search(facts, node, cls, depth, memo)
    return memo[key]


def _search(
    facts: FileFacts,
    node: _Def,
    cls: ast.ClassDef | None,
    depth: int,
    memo: dict[tuple[int, int], Load | None],
) -> Load | None:
    """:func:`_loads` for a function not looked at before: its own loaders first, then the
    functions and constructors of the linted tree it calls."""
    once = _memoised(node)
    calls = [sub for sub in own_nodes(node) if isinstance(sub, ast.Call) and id(sub) not in once]
    where = f"{cls.name}.{node.name}" if cls is not None else node.name
    arrays = read_as_arrays(node)
    if node.name != "__init__" and any(facts.qualname(c.func) == "torch.save" for c in calls):
        return None  # load, change, `torch.save`: a checkpoint converted (merged, compressed)
    for call in calls:
        what = is_loader(call, facts.qualname(call.func))
        if what is not None and id(call) not in arrays and not _reads_given_bytes(call, node):
            return Load(what, where, facts.path, call.lineno)
    if depth <= 1:
        return None
    for call in calls:
        for owner, callee, owner_cls in call_targets(facts, call.func, cls):
            found = _loads(owner, callee, owner_cls, depth - 1, memo)
            if found is not None:
                return found
    return None


# Calls that read a tensor back as host data, and the views and copies on the way there.
_ARRAY_READS = frozenset({"numpy", "tolist"})
_ON_THE_WAY = frozenset({"cpu", "detach", "float", "double", "long", "int", "squeeze"})


def read_as_arrays(node: ast.AST) -> set[int]:
    """The ids of the calls under ``node`` whose result is read straight back as an array
    (``torch.load(path).numpy()``, also through ``.cpu()``/``.detach()``/``.float()``): a
    saved tensor loaded as data (ImageBind's point clouds), never a model, whose weights
    have no ``.numpy()``."""
    found: set[int] = set()
    for sub in subtree(node):
        if not (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr in _ARRAY_READS
        ):
            continue
        inner = sub.func.value
        while (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and inner.func.attr in _ON_THE_WAY
        ):
            inner = inner.func.value
        if isinstance(inner, ast.Call):
            found.add(id(inner))
    return found


def _reads_given_bytes(call: ast.Call, node: _Def) -> bool:
    """``torch.load(io.BytesIO(buffer))``, also through a name bound to the buffer, with
    ``buffer`` a parameter of ``node``: it unpickles the bytes of a message the caller hands
    it (lerobot's ``bytes_to_transitions(buffer)``), a new one every call, not a model file."""
    source = (
        call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "f"), None)
    )
    values: list[ast.expr] = [] if source is None else [source]
    if isinstance(source, ast.Name):
        values = [
            sub.value
            for sub in own_nodes(node)
            if isinstance(sub, ast.Assign)
            and len(sub.targets) == 1
            and isinstance(sub.targets[0], ast.Name)
            and sub.targets[0].id == source.id
        ]
    params = {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}
    return bool(values) and all(
        isinstance(value, ast.Call)
        and (dotted_name(value.func) or "").rpartition(".")[2] == "BytesIO"
        and len(value.args) == 1
        and isinstance(value.args[0], ast.Name)
        and value.args[0].id in params
        for value in values
    )


def _memoised(node: _Def) -> set[int]:
    """Calls under a test that nothing is loaded yet (``if self.model is None:``,
    ``if not hasattr(self, "net"):``, ``if key not in self.cache:``): a lazy load that runs
    on the first call only."""
    once: set[int] = set()
    for sub in own_nodes(node):
        if isinstance(sub, ast.If) and not_loaded_yet(sub.test):
            once.update(id(c) for c in own_nodes(sub) if isinstance(c, ast.Call))
    return once


def not_loaded_yet(test: ast.expr) -> bool:
    """``if self.model is None:`` (or ``== None``), ``if cache[name] is None:``, ``if key not
    in cache:``, ``if not hasattr(self, "net"):``: a test that holds until something is
    loaded; also ``if model is None or name != current_name:``, a cache that reloads only when
    the choice changes."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return any(not_loaded_yet(value) for value in test.values) and all(
            not_loaded_yet(value) or _changed(value) for value in test.values
        )
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return isinstance(test.operand, (ast.Name, ast.Attribute)) or (
            isinstance(test.operand, ast.Call)
            and isinstance(test.operand.func, ast.Name)
            and test.operand.func.id == "hasattr"
        )
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, right = test.ops[0], test.comparators[0]
        if isinstance(op, (ast.Is, ast.Eq)):  # `model == None`: the same test, spelled loosely
            return isinstance(right, ast.Constant) and right.value is None
        return isinstance(op, ast.NotIn)
    return False


def _changed(test: ast.expr) -> bool:
    """``name != current_name``: a test that the choice differs from what is loaded."""
    return (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.NotEq, ast.IsNot))
    )
