"""The rule API: what a rule declares, and the context its checks read while the engine walks.

A rule family (one module under ``rules/``) exports a :class:`Family`: its :class:`Rule`
declarations, the node types its checks want, and trigger patterns. The engine walks each file
once; it only looks inside statements whose lines match a trigger of a selected rule, and calls
each check for the node types it asked for. Checks never walk the whole file themselves: when
they need more (the assignments of a name, the body of a loop) they ask the context, which
computes it lazily and caches it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from torchplace.lint.finding import Fix
from torchplace.lint.nodes import kept, own_nodes, walk, walk_body
from torchplace.lint.resolver import Resolver

__all__ = [
    "Check",
    "Context",
    "Family",
    "FixSafety",
    "Rule",
    "Scope",
    "assigned_name",
    "at_method",
    "bindings",
    "call_name",
    "has_star_kwargs",
    "keyword",
    "loop_items",
    "names_in",
    "unpacked_pairs",
    "walk_body",
]

FixSafety = Literal["safe", "none"]


@dataclass(frozen=True)
class Rule:
    """One rule: a unique ``TPL###`` code, a kebab-case name and a one-line summary."""

    code: str
    name: str
    summary: str
    fix: FixSafety = "none"


Check = Callable[[Any, "Context"], None]


@dataclass(frozen=True)
class Family:
    """A rule family: its rules, the ``(node type, check, codes)`` it hooks, its triggers.

    Checks on statement types run on every such statement (cheap: no walk). Checks on
    expression types run inside a statement only when one of its lines contains one of the
    ``triggers`` literals of a selected rule.
    """

    rules: tuple[Rule, ...]
    checks: tuple[tuple[type[ast.AST], Check, tuple[str, ...]], ...]
    triggers: tuple[str, ...]


class Scope:
    """A module, class or function body being walked."""

    __slots__ = (
        "cache",
        "cls",
        "is_module_class",
        "kind",
        "loops",
        "module_base_elsewhere",
        "name",
        "node",
        "parent",
    )

    def __init__(
        self,
        kind: Literal["module", "class", "function"],
        node: ast.AST,
        name: str,
        parent: Scope | None,
        *,
        is_module_class: bool = False,
        module_base_elsewhere: bool = False,
    ) -> None:
        self.kind = kind
        self.node = node
        self.name = name
        self.parent = parent
        self.is_module_class = is_module_class
        # A module class only through a class another file of the linted tree defines (which
        # may register or move attributes itself: ``add_state``, buffers, its own ``_apply``).
        self.module_base_elsewhere = module_base_elsewhere
        # For a function directly inside a class: that class's scope.
        self.cls: Scope | None = parent if parent is not None and parent.kind == "class" else None
        self.loops: list[ast.AST] = []
        self.cache: dict[str, Any] = {}

    def root(self) -> Scope:
        """The file's module scope, where per-file facts are cached."""
        scope = self
        while scope.parent is not None:
            scope = scope.parent
        return scope


def keyword(call: ast.Call, name: str) -> ast.keyword | None:
    """The keyword argument ``name`` of ``call``, if written."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw
    return None


def has_star_kwargs(call: ast.Call) -> bool:
    """Whether ``call`` passes ``**mapping`` (anything may then hide inside)."""
    return any(kw.arg is None for kw in call.keywords)


def call_name(call: ast.Call) -> str | None:
    """The attribute or plain name a call invokes: ``x.to(...)`` -> ``"to"``."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def at_method(call: ast.Call) -> ast.AST:
    """Where to report ``x.method()``: the call itself, or, when a chain spans lines, a node
    placed at ``.method`` (the line a reader looks for)."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return call
    end_line = func.end_lineno or call.lineno
    if end_line == call.lineno:
        return call
    spot = ast.Name(id=func.attr)
    spot.lineno = spot.end_lineno = end_line
    spot.end_col_offset = func.end_col_offset or 0
    spot.col_offset = max(spot.end_col_offset - len(func.attr) - 1, 0)
    return spot


def bindings(node: ast.AST) -> dict[str, list[ast.expr | None]]:
    """Every name bound in ``node``'s own body (a function's parameters too) -> the values
    assigned to it (None where it is not one plain value: a loop's target, an unpacking, an
    augmented assignment, an import); found once per node (see :func:`~.nodes.kept`)."""
    return kept("bindings", node, _bindings)


def _bindings(node: ast.AST) -> dict[str, list[ast.expr | None]]:
    found: dict[str, list[ast.expr | None]] = {}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            found.setdefault(arg.arg, []).append(None)
        for extra in (args.vararg, args.kwarg):
            if extra is not None:
                found.setdefault(extra.arg, []).append(None)
    for sub in own_nodes(node):
        if sub.__class__ not in _BINDS:
            continue
        if isinstance(sub, ast.Assign):
            for target in sub.targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append(sub.value)
                elif (pairs := unpacked_pairs(target, sub.value)) is not None:
                    # `feat, label = head[i], target[i].long()`: each name takes its element
                    for elt, value in pairs:
                        if isinstance(elt, ast.Name):
                            found.setdefault(elt.id, []).append(value)
                        else:
                            for name in names_in(elt):
                                found.setdefault(name, []).append(None)
                else:
                    # `ends[tmp:tmp + n] = v` changes `ends`, not the names of its index
                    stored = target.value if isinstance(target, ast.Subscript) else target
                    for name in names_in(stored):
                        found.setdefault(name, []).append(None)
        elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
            found.setdefault(sub.target.id, []).append(sub.value)
        elif isinstance(sub, (ast.AugAssign, ast.For, ast.AsyncFor)):
            for name in names_in(sub.target):
                found.setdefault(name, []).append(None)
        elif isinstance(sub, ast.withitem) and sub.optional_vars is not None:
            for name in names_in(sub.optional_vars):
                found.setdefault(name, []).append(None)
        elif isinstance(sub, ast.NamedExpr):
            found.setdefault(sub.target.id, []).append(sub.value)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            for alias in sub.names:
                found.setdefault((alias.asname or alias.name).split(".")[0], []).append(None)
    return found


def unpacked_pairs(target: ast.expr, value: ast.expr) -> list[tuple[ast.expr, ast.expr]] | None:
    """``a, b = x, y``: each target with its element of the display unpacked into as many
    targets, none starred; None for any other assignment."""
    if not (isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List))):
        return None
    targets, values = target.elts, value.elts
    if len(targets) != len(values) or any(isinstance(e, ast.Starred) for e in (*targets, *values)):
        return None
    return list(zip(targets, values, strict=True))


def assigned_name(stmt: ast.AST | None, value: ast.AST) -> str | None:
    """The one plain name ``stmt`` binds to ``value`` (``tmp = value``), else None."""
    if (
        isinstance(stmt, ast.Assign)
        and stmt.value is value
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
    ):
        return stmt.targets[0].id
    return None


def names_in(node: ast.AST) -> set[str]:
    """Every plain name read anywhere inside ``node``."""
    return {n.id for n in walk(node) if isinstance(n, ast.Name)}


def loop_items(
    loop: ast.For | ast.AsyncFor | ast.While, taken: Callable[[ast.expr], bool]
) -> tuple[set[str], list[ast.AST]]:
    """The names a loop binds to the item it takes each turn (its target, and the names
    assigned a value ``taken`` accepts in its body: ``x = next(it)``, ``m = models.pop()``),
    with every node of its body."""
    nodes = [sub for stmt in loop.body for sub in walk(stmt)]
    items = set() if isinstance(loop, ast.While) else names_in(loop.target)
    for sub in nodes:
        if isinstance(sub, ast.Assign) and taken(sub.value):
            items |= {name for target in sub.targets for name in names_in(target)}
    return items, nodes


@dataclass
class Context:
    """What a check can see: the file, the resolver, the enclosing scopes, loops and blocks."""

    path: str
    source: str
    resolver: Resolver
    report_fn: Callable[[str, ast.AST, str, Fix | None], None]
    scope: Scope = field(init=False)
    # Enclosing nodes, statements and expressions, outermost first (not the node itself).
    parents: list[ast.AST] = field(default_factory=list)
    # For each enclosing statement list: (the list, index of the statement being walked).
    stmt_path: list[tuple[list[ast.stmt], int]] = field(default_factory=list)
    # Calls a check already handled as part of a larger pattern (by id), to stay silent on.
    claimed: set[int] = field(default_factory=set)
    _qualnames: dict[int, str | None] = field(default_factory=dict)
    _lines: list[str] | None = None

    def report(self, code: str, node: ast.AST, message: str, fix: Fix | None = None) -> None:
        """Record a finding at ``node``'s start."""
        self.report_fn(code, node, message, fix)

    def qualname(self, node: ast.AST) -> str | None:
        """The dotted name ``node`` refers to through the file's imports (cached)."""
        key = id(node)
        try:
            return self._qualnames[key]
        except KeyError:
            value = self._qualnames[key] = self.resolver.qualname(node)
            return value

    def call_qualname(self, call: ast.Call) -> str | None:
        """The dotted name a call's function resolves to (``t.zeros`` -> ``torch.zeros``)."""
        return self.qualname(call.func)

    def function_scope(self) -> Scope | None:
        """The innermost enclosing function scope, if any."""
        scope: Scope | None = self.scope
        while scope is not None and scope.kind != "function":
            scope = scope.parent
        return scope

    def method_of_module(self) -> Scope | None:
        """The innermost enclosing function if it is a method of an ``nn.Module`` subclass."""
        scope = self.function_scope()
        if scope is not None and scope.cls is not None and scope.cls.is_module_class:
            return scope
        return None

    def loops(self) -> list[ast.AST]:
        """Loops enclosing the node inside its own function (outermost first)."""
        return self.scope.loops

    def lines(self) -> list[str]:
        """The file's lines as Python's tokenizer counts them (``\\r\\n``, ``\\r`` or ``\\n``),
        without ends (split once, on first use)."""
        if self._lines is None:
            source = self.source
            self._lines = _NEWLINE.split(source) if "\r" in source else source.split("\n")
        return self._lines

    def segment(self, node: ast.AST) -> str | None:
        """The source text of ``node`` (lines joined with ``\\n``)."""
        first = getattr(node, "lineno", None)
        last = getattr(node, "end_lineno", None)
        col = getattr(node, "col_offset", None)
        end_col = getattr(node, "end_col_offset", None)
        if first is None or last is None or col is None or end_col is None:
            return None
        lines = self.lines()
        if last > len(lines):
            return None
        if first == last:
            return _cut(lines[first - 1], col, end_col)
        parts = [_cut(lines[first - 1], col, None)]
        parts.extend(lines[first : last - 1])
        parts.append(_cut(lines[last - 1], 0, end_col))
        return "\n".join(parts)

    def scope_bindings(self, scope: Scope) -> dict[str, list[ast.expr | None]]:
        """Every name bound in ``scope``'s own body -> the values assigned (None: not plain)."""
        cached: dict[str, list[ast.expr | None]] | None = scope.cache.get("bindings")
        if cached is None:
            cached = scope.cache["bindings"] = bindings(scope.node)
        return cached

    def param_annotation(self, scope: Scope, name: str) -> ast.expr | None:
        """The annotation of parameter ``name`` of a function scope, if any."""
        node = scope.node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if arg.arg == name:
                return arg.annotation
        return None


_NEWLINE = re.compile(r"\r\n|\r|\n")
# The nodes that bind names, for Context.scope_bindings.
_BINDS = frozenset(
    {
        *(ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor, ast.withitem),
        *(ast.NamedExpr, ast.Import, ast.ImportFrom),
    }
)


def _cut(line: str, start: int, end: int | None) -> str:
    """``line[start:end]`` in UTF-8 byte offsets."""
    if line.isascii():
        return line[start:end]
    return line.encode("utf-8")[start:end].decode("utf-8", "replace")
