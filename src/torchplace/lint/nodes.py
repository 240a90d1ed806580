"""Fast walks over syntax trees: what the rules use instead of ``ast.walk``.

``ast.walk`` goes through two generators per node and visits the context and operator
singletons (``Load``, ``Store``, ``Add``) and every string field on the way: about a third of
its nodes and half its time go to things no rule looks at. These walks read only the fields
that can hold statements or expressions, from one table per node type, and never yield
``None``. They visit nodes in the order of what they replace, so a rule's first match stays
the same.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

_T = TypeVar("_T")

__all__ = [
    "BLOCKS",
    "FIELDS",
    "assigned",
    "children",
    "forget",
    "isinstance_test",
    "own_nodes",
    "parameter_defaults",
    "parse_module",
    "self_attribute",
    "statements",
    "store_targets",
    "subscripted",
    "subtree",
    "walk",
    "walk_body",
]

# Fields that never hold a statement or an expression: names, flags, numbers, and the
# ``ctx``/``op`` singletons.
_SCALARS = frozenset(
    {
        "arg",
        "asname",
        "attr",
        "conversion",
        "ctx",
        "id",
        "is_async",
        "kind",
        "kwd_attrs",
        "level",
        "lineno",
        "module",
        "name",
        "op",
        "ops",
        "rest",
        "simple",
        "tag",
        "type_comment",
    }
)
# Node types whose remaining fields hold plain values (a constant, a list of names).
_LEAVES = frozenset({"Constant", "Global", "MatchSingleton", "Name", "Nonlocal"})
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
# Imports, definitions and the statements that hold blocks: a pass over statements looks into
# these; every other statement is simple (no statement inside, nothing imported or defined).
BLOCKS = frozenset(
    getattr(ast, name)
    for name in (
        *("Import", "ImportFrom", "FunctionDef", "AsyncFunctionDef", "ClassDef", "For"),
        *("AsyncFor", "While", "If", "With", "AsyncWith", "Try", "TryStar", "Match"),
    )
    if hasattr(ast, name)
)
# own_nodes() and subtree() of each node walked since the last forget(), by id: the node is
# kept with its result, so its id cannot be taken by a new node while the entry lives.
_OWN: dict[int, tuple[ast.AST, tuple[ast.AST, ...]]] = {}
_SUBTREES: dict[int, tuple[ast.AST, tuple[ast.AST, ...]]] = {}
_KEPT: dict[tuple[str, int], tuple[ast.AST, Any]] = {}


class _FieldTable(dict[type[ast.AST], tuple[str, ...]]):
    """Node type -> its child-holding fields, in order (filled on first sight of a type)."""

    def __missing__(self, kind: type[ast.AST]) -> tuple[str, ...]:
        if kind.__name__ in _LEAVES:
            fields: tuple[str, ...] = ()
        else:
            fields = tuple(name for name in kind._fields if name not in _SCALARS)
        self[kind] = fields
        return fields


# Node type -> the fields that may hold statements or expressions, in order.
FIELDS = _FieldTable()


def isinstance_test(test: ast.expr) -> tuple[str, list[ast.expr]] | None:
    """``isinstance(name, kind)`` or ``isinstance(name, (k1, k2))``: the name tested and its
    kinds; None for any other expression (an attribute tested, a ``type()`` comparison)."""
    if not (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == "isinstance"
        and len(test.args) == 2
        and isinstance(test.args[0], ast.Name)
    ):
        return None
    kinds = test.args[1]
    return test.args[0].id, kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]


def children(node: ast.AST) -> list[ast.AST]:
    """The statements and expressions directly inside ``node``, in source order (as
    ``ast.iter_child_nodes``)."""
    found: list[ast.AST] = []
    for name in FIELDS[node.__class__]:
        value = getattr(node, name, None)
        if value.__class__ is list:
            found.extend(item for item in value if item is not None)
        elif value is not None:
            found.append(value)
    return found


def walk(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and every statement and expression inside it, breadth first (as ``ast.walk``)."""
    todo: deque[ast.AST | None] = deque([node])
    pop, push, extend, table = todo.popleft, todo.append, todo.extend, FIELDS
    while todo:
        sub = pop()
        if sub is None:  # a `**x` entry of a dict literal, a keyword-only argument's default
            continue
        yield sub
        for name in table[sub.__class__]:
            value = getattr(sub, name, None)
            if value.__class__ is list:
                extend(value)
            elif value is not None:
                push(value)


# walk_body's loop repeats walk's with a stack in place of the queue: the two orders are those
# of what they replaced, and a shared helper would cost a call per node on the hottest path.
def walk_body(body: Sequence[ast.AST]) -> Iterator[ast.AST]:
    """Every node of ``body``, last statement first, each before what it holds (depth first);
    a nested function, class or lambda is yielded but not entered."""
    todo: list[ast.AST | None] = list(body)
    pop, push, extend, table = todo.pop, todo.append, todo.extend, FIELDS
    while todo:
        sub = pop()
        if sub is None:
            continue
        yield sub
        if isinstance(sub, _SCOPES):
            continue
        for name in table[sub.__class__]:
            value = getattr(sub, name, None)
            if value.__class__ is list:
                extend(value)
            elif value is not None:
                push(value)


def statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of ``body`` and of the blocks inside it (nested definitions too),
    never an expression: the cheap way to find assignments, imports or definitions."""
    todo: list[ast.stmt] = list(body)
    pop, extend = todo.pop, todo.extend
    while todo:
        stmt = pop()
        yield stmt
        if stmt.__class__ not in BLOCKS:
            continue
        for name in ("body", "orelse", "finalbody"):
            block = getattr(stmt, name, None)
            if block:
                extend(block)
        for part in getattr(stmt, "handlers", None) or getattr(stmt, "cases", None) or ():
            extend(part.body)


def own_nodes(owner: ast.AST) -> tuple[ast.AST, ...]:
    """:func:`walk_body` of ``owner``'s body (a function's, a class's, a block's), walked once
    and kept until :func:`forget`: many rules read the same function's nodes."""
    hit = _OWN.get(id(owner))
    if hit is not None and hit[0] is owner:
        return hit[1]
    body = getattr(owner, "body", None)
    found = tuple(walk_body(body)) if type(body) is list else ()
    _OWN[id(owner)] = (owner, found)
    return found


def store_targets(node: ast.AST) -> list[ast.expr]:
    """The targets an assignment statement stores to (``a = b = v``, ``a += v``, ``a: T = v``);
    none for anything else."""
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return []


def assigned(owner: ast.AST) -> dict[str, list[ast.expr]]:
    """What each plain name of ``owner``'s body (a function's, a module's) is assigned with
    ``name = value``, in source order (``a = b = v`` and unpacking left out)."""
    bound: dict[str, list[ast.expr]] = {}
    for node in own_nodes(owner):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                bound.setdefault(target.id, []).append(node.value)
    return bound


def subtree(node: ast.AST) -> tuple[ast.AST, ...]:
    """:func:`walk` of ``node``, walked once and kept until :func:`forget` (a function that
    rules search again and again)."""
    hit = _SUBTREES.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    found = tuple(walk(node))
    _SUBTREES[id(node)] = (node, found)
    return found


def kept(kind: str, node: ast.AST, compute: Callable[[ast.AST], _T]) -> _T:
    """``compute(node)``, computed once per ``node`` and ``kind`` and kept until
    :func:`forget`: a file's checks ask the same of one node many times (a script of 2,000
    loads asked its module's bindings once per pair of them). Callers must not change it."""
    key = (kind, id(node))
    hit = _KEPT.get(key)
    if hit is not None and hit[0] is node:
        return cast("_T", hit[1])
    value = compute(node)
    _KEPT[key] = (node, value)
    return value


def parameter_defaults(function: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, ast.expr]:
    """Each parameter of ``function`` that has a default -> that default (positional and
    keyword-only alike)."""
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    given = positional[len(positional) - len(args.defaults) :]
    found = {a.arg: d for a, d in zip(given, args.defaults, strict=True)}
    found.update(
        {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None}
    )
    return found


def self_attribute(node: ast.AST) -> str | None:
    """``x`` of ``self.x``; None for anything else."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return node.attr
    return None


def last_assignment(
    scope: ast.AST, line: int, target: Callable[[ast.expr], bool]
) -> ast.Assign | ast.AugAssign | ast.AnnAssign | None:
    """The last statement of ``scope``'s own body before ``line`` that assigns a target
    ``target`` accepts (``param.hint = torch.cat(...)``, ``self.w = np.transpose(...)``)."""
    found: ast.Assign | ast.AugAssign | ast.AnnAssign | None = None
    for sub in own_nodes(scope):
        if not isinstance(sub, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or sub.lineno >= line:
            continue
        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
        if any(target(t) for t in targets) and (found is None or sub.lineno > found.lineno):
            found = sub
    return found


def subscripted(node: ast.expr) -> ast.expr:
    """What ``node`` indexes into: ``buf`` of ``buf[i, :n]`` (also ``buf[i][j]``); ``node``
    itself when it is no subscript."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node


def forget() -> None:
    """Drop what :func:`own_nodes`, :func:`subtree` and :func:`kept` kept (the engine calls
    it once a file is done)."""
    _OWN.clear()
    _SUBTREES.clear()
    _KEPT.clear()


def parse_module(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """``source`` parsed; code from before Python 3.7, where ``async`` was a plain name
    (PyTorch 0.3's ``x.cuda(async=True)``), is parsed with that grammar when the current one
    refuses it. The current grammar's error is raised when neither takes it."""
    try:
        return ast.parse(source, filename=filename)
    except SyntaxError as exc:
        try:
            return ast.parse(source, filename=filename, feature_version=(3, 6))
        except SyntaxError:
            raise exc from None
