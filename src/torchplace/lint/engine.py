"""The engine: parse a file once, walk it once, dispatch nodes to the selected rules' checks.

Speed comes from three choices. Parsing is Python's own ``ast`` (C). Statements are walked in a
single pass that keeps the context (scopes, loops, enclosing blocks) the checks need. And the
expressions of a statement are only visited when one of its lines matches a trigger of a
selected rule (one regular expression run over the whole text), since most lines of most files
cannot hold a finding.
"""

from __future__ import annotations

import ast
import bisect
import codecs
import gc
import re
import sys
import tokenize
from collections.abc import Iterable
from functools import lru_cache
from io import BytesIO

from torchplace.lint.base import Check, Context, Scope
from torchplace.lint.finding import Finding, Fix
from torchplace.lint.nodes import BLOCKS, FIELDS, children, forget, parse_module
from torchplace.lint.resolver import Resolver, module_name_for
from torchplace.lint.rules import ALL_RULES, FAMILIES

__all__ = ["decode_source", "lint_bytes", "lint_source"]

_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Za-z]+[0-9]*(?:[\s,]+[A-Za-z]+[0-9]*)*))?", re.I)
_LEAVES = frozenset({ast.Name, ast.Constant})


class _Plan:
    """The dispatch table and trigger pattern for one selection of rules."""

    def __init__(self, selected: frozenset[str]) -> None:
        self.selected = selected
        self.dispatch: dict[type[ast.AST], list[Check]] = {}
        triggers: set[str] = set()
        for family in FAMILIES:
            if not any(rule.code in selected for rule in family.rules):
                continue
            for node_type, check, codes in family.checks:
                if any(code in selected for code in codes):
                    self.dispatch.setdefault(node_type, []).append(check)
            triggers.update(family.triggers)
        # Leaves no selected check looks at: the expression walk does not call into them.
        self.silent = frozenset(kind for kind in _LEAVES if kind not in self.dispatch)
        # Drop literals that contain a shorter one: every hit of theirs is already a hit.
        self.triggers = tuple(
            sorted(t for t in triggers if not any(o != t and o in t for o in triggers))
        )


@lru_cache(maxsize=32)
def _plan(selected: frozenset[str]) -> _Plan:
    return _Plan(selected)


def _char_col(line: str, byte_col: int) -> int:
    """1-based character column of a 0-based UTF-8 byte offset into ``line``."""
    if line.isascii():
        return byte_col + 1
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", "replace")) + 1


def decode_source(raw: bytes) -> str:
    """Decode source bytes as Python does (BOM, PEP 263 cookie, else UTF-8); may raise (a
    cookie naming no known encoding, or another than a UTF-8 BOM: Python cannot read the
    file, whatever its bytes)."""
    encoding, _ = tokenize.detect_encoding(BytesIO(raw).readline)
    if raw.startswith(codecs.BOM_UTF8):
        return raw[3:].decode("utf-8")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        if encoding in {"utf-8", "utf-8-sig"}:
            raise
        return raw.decode(encoding)


# Statements after which the rest of their block never runs.
_EXITS = frozenset({ast.Return, ast.Raise, ast.Continue, ast.Break})


class _Walker:
    """One pass over a module's statements, visiting hot expressions with the context kept."""

    def __init__(self, ctx: Context, plan: _Plan, hot: list[int]) -> None:
        self.ctx = ctx
        self.dispatch = plan.dispatch
        self.hot = hot
        self.silent = plan.silent

    def is_hot(self, first: int, last: int) -> bool:
        hot = self.hot
        i = bisect.bisect_left(hot, first)
        return i < len(hot) and hot[i] <= last

    def block(self, body: list[ast.stmt]) -> None:
        path = self.ctx.stmt_path
        for index, stmt in enumerate(body):
            path.append((body, index))
            try:
                self.stmt(stmt)
            finally:
                path.pop()
            if stmt.__class__ in _EXITS:
                break  # what follows in the block never runs: nothing there is checked

    def exprs(self, nodes: Iterable[ast.AST | None]) -> None:
        for node in nodes:
            if node is not None and self.is_hot(
                node.lineno,  # type: ignore[attr-defined]
                node.end_lineno or node.lineno,  # type: ignore[attr-defined]
            ):
                self.expr(node)

    def _checks(self, node: ast.AST) -> None:
        checks = self.dispatch.get(type(node))
        if checks:
            for check in checks:
                check(node, self.ctx)

    def stmt(self, node: ast.stmt) -> None:
        kind = node.__class__
        if kind in BLOCKS:
            self._compound(node, kind)
            return
        # A simple statement: its own checks always (they are cheap), its expressions if hot.
        ctx = self.ctx
        checks = self.dispatch.get(kind)
        if checks:
            for check in checks:
                check(node, ctx)
        # is_hot(), inlined: this runs once per simple statement, the walk's hottest path
        hot = self.hot
        i = bisect.bisect_left(hot, node.lineno)
        if i == len(hot) or hot[i] > (node.end_lineno or node.lineno):
            return
        parents = ctx.parents
        depth, loops = len(parents), ctx.scope.loops
        looping = len(loops)
        parents.append(node)
        try:
            for child in children(node):
                self.expr(child)
        except RecursionError:  # absurdly nested expression: stay silent on it
            del loops[looping:]
        del parents[depth:]

    def _compound(self, node: ast.stmt, kind: type) -> None:
        """An import, a definition, or a statement holding blocks."""
        ctx = self.ctx
        if kind is ast.Import:
            ctx.resolver.add_import(node)  # type: ignore[arg-type]
            return
        if kind is ast.ImportFrom:
            ctx.resolver.add_import_from(node)  # type: ignore[arg-type]
            return
        parents = ctx.parents
        if kind in _FUNCTIONS or kind is ast.ClassDef:
            self._definition(node)
            return
        if kind in _LOOPS:
            self._loop(node, kind)
            return
        if kind is ast.If:
            test = node.test  # type: ignore[attr-defined]
            if self.is_hot(test.lineno, test.end_lineno or test.lineno):
                self._checks(node)  # checks of the test as a whole (what it tests for truth)
            parents.append(node)
            self.exprs([test])
            self.block(node.body)  # type: ignore[attr-defined]
            self.block(node.orelse)  # type: ignore[attr-defined]
            parents.pop()
            return
        if kind is ast.With or kind is ast.AsyncWith:
            parents.append(node)
            for item in node.items:  # type: ignore[attr-defined]
                self.exprs([item.context_expr, item.optional_vars])
            self.block(node.body)  # type: ignore[attr-defined]
            parents.pop()
            return
        if kind is ast.Match:
            parents.append(node)
            self.exprs([node.subject])  # type: ignore[attr-defined]
            for case in node.cases:  # type: ignore[attr-defined]
                self.exprs([case.guard])
                self.block(case.body)
            parents.pop()
            return
        self._try(node)  # `try` or `try`/`except*`

    def _loop(self, node: ast.stmt, kind: type) -> None:
        """A ``for``/``while``: its checks if its header is hot, then its body as a loop."""
        ctx = self.ctx
        parents = ctx.parents
        header = node.iter if kind is not ast.While else node.test  # type: ignore[attr-defined]
        if self.is_hot(node.lineno, header.end_lineno or node.lineno):
            self._checks(node)
        parents.append(node)
        if kind is ast.While:
            ctx.scope.loops.append(node)
            self.exprs([header])
        else:
            self.exprs([header])
            ctx.scope.loops.append(node)
            self.exprs([node.target])  # type: ignore[attr-defined]
        self.block(node.body)  # type: ignore[attr-defined]
        ctx.scope.loops.pop()
        self.block(node.orelse)  # type: ignore[attr-defined]
        parents.pop()

    def _try(self, node: ast.stmt) -> None:
        parents = self.ctx.parents
        parents.append(node)
        self.block(node.body)  # type: ignore[attr-defined]
        for handler in node.handlers:  # type: ignore[attr-defined]
            parents.append(handler)
            self.exprs([handler.type])
            self.block(handler.body)
            parents.pop()
        self.block(node.orelse)  # type: ignore[attr-defined]
        self.block(node.finalbody)  # type: ignore[attr-defined]
        parents.pop()

    def _definition(self, node: ast.stmt) -> None:
        ctx = self.ctx
        is_class = isinstance(node, ast.ClassDef)
        assert isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        self.exprs(node.decorator_list)
        if is_class:
            assert isinstance(node, ast.ClassDef)
            self.exprs([*node.bases, *(kw.value for kw in node.keywords)])
            resolver = ctx.resolver
            module_class = resolver.is_module_class(node)
            elsewhere = (
                not module_class
                and resolver.module is not None
                and resolver.is_module_class_elsewhere(node, ctx.path)
            )
            if module_class or elsewhere:
                resolver.local_module_classes.add(node.name)
            if elsewhere:
                resolver.elsewhere_module_classes.add(node.name)
            scope = Scope(
                "class",
                node,
                node.name,
                ctx.scope,
                is_module_class=module_class or elsewhere,
                module_base_elsewhere=elsewhere or resolver.has_state_base(node),
            )
        else:
            assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            args = node.args
            self.exprs([*args.defaults, *args.kw_defaults])
            scope = Scope("function", node, node.name, ctx.scope)
        if self.is_hot(node.lineno, node.body[0].lineno - 1 if node.body else node.lineno):
            self._checks(node)
        outer = ctx.scope
        ctx.scope = scope
        ctx.parents.append(node)
        try:
            self.block(node.body)
        finally:
            ctx.parents.pop()
            ctx.scope = outer

    def expr(self, node: ast.AST) -> None:
        kind = type(node)
        checks = self.dispatch.get(kind)
        ctx = self.ctx
        if checks:
            for check in checks:
                check(node, ctx)
        if kind in _LEAVES:
            return
        parents = ctx.parents
        parents.append(node)
        if isinstance(node, _COMPREHENSIONS):
            generators = node.generators
            self.expr(generators[0].iter)
            loops = ctx.scope.loops
            loops.append(node)
            for index, gen in enumerate(generators):
                if index:
                    self.expr(gen.iter)
                self.expr(gen.target)
                for cond in gen.ifs:
                    self.expr(cond)
            if isinstance(node, ast.DictComp):
                self.expr(node.key)
                self.expr(node.value)
            else:
                self.expr(node.elt)
            loops.pop()
        else:
            silent = self.silent
            for name in FIELDS[kind]:
                child = getattr(node, name, None)
                if child is None or child.__class__ in silent:
                    continue
                if child.__class__ is list:
                    for item in child:
                        if item is not None and item.__class__ not in silent:
                            self.expr(item)
                else:
                    self.expr(child)
        parents.pop()


def _hot_lines(text: str, triggers: tuple[str, ...]) -> list[int]:
    """Sorted numbers of the lines holding a trigger literal.

    Each pass over the text is C (``str.find``, or a regular expression that starts with one
    character): literals that share their rarest character are found together, in one pass
    that stops at that character only and looks around it; a literal alone is found with
    ``str.find``."""
    positions: list[int] = []
    append = positions.append
    groups, alone = _search_plan(triggers)
    for pattern in groups:
        for match in pattern.finditer(text):
            append(match.start())
    find = text.find
    for literal, leads in alone:
        index = find(literal)
        while index != -1:
            if leads is None or (index and text[index - 1] in leads):
                append(index)
            index = find(literal, index + 1)
    if not positions:
        return []
    positions.sort()
    lines: list[int] = []
    count = text.count
    line, pos = 1, 0
    for start in positions:
        line += count("\n", pos, start)
        pos = start
        if not lines or lines[-1] != line:
            lines.append(line)
    return lines


# Characters of Python source, most common first (counted over real projects' code): a
# literal is found from its rarest one.
_COMMON = " etasroinl\n_dpmcf.u,hg=)(\":bv-ykxw'1[]0#z2"


def _rarity(char: str) -> int:
    rank = _COMMON.find(char)
    return len(_COMMON) if rank == -1 else rank


@lru_cache(maxsize=64)
def _search_plan(
    triggers: tuple[str, ...],
) -> tuple[tuple[re.Pattern[str], ...], tuple[tuple[str, str | None], ...]]:
    """The patterns of literals found together, and each other literal with the characters
    allowed right before it (None: any). Literals that differ only in their first character
    (``" int("``, ``"(int("``) are one literal, their tail, with those characters before."""
    plain = set(triggers)
    tails: dict[str, set[str]] = {}
    for literal in triggers:
        if len(literal) > 4 and literal[0] != "\n":
            tails.setdefault(literal[1:], set()).add(literal[0])
    literals: list[tuple[str, str | None]] = []
    for tail, firsts in tails.items():
        if len(firsts) > 1 and tail not in plain:
            literals.append((tail, "".join(sorted(firsts))))
            plain -= {first + tail for first in firsts}
    literals.extend((literal, None) for literal in sorted(plain))
    by_anchor: dict[str, list[tuple[str, str | None, int]]] = {}
    alone: list[tuple[str, str | None]] = []
    for literal, leads in sorted(literals):
        if "\n" in literal:
            alone.append((literal, leads))
            continue
        at = max(range(len(literal)), key=lambda i: _rarity(literal[i]))
        by_anchor.setdefault(literal[at], []).append((literal, leads, at))
    for anchor, members in list(by_anchor.items()):  # a literal alone joins a group it can
        literal, leads, _ = members[0]
        shared = [c for c in literal if c != anchor and len(by_anchor.get(c, ())) > 1]
        if len(members) == 1 and shared:
            del by_anchor[anchor]
            by_anchor[shared[0]].append((literal, leads, literal.index(shared[0])))
    groups: list[re.Pattern[str]] = []
    for anchor, members in sorted(by_anchor.items()):
        if len(members) == 1:
            alone.append(members[0][:2])
            continue
        around = "|".join(_around(literal, leads, at) for literal, leads, at in members)
        groups.append(re.compile(f"{re.escape(anchor)}(?:{around})"))
    return tuple(groups), tuple(alone)


def _around(literal: str, leads: str | None, at: int) -> str:
    """What must come before and after the anchor ``literal[at]``, as lookarounds."""
    lead = f"[{re.escape(leads)}]" if leads else ""
    after = literal[at + 1 :]
    ahead = f"(?={re.escape(after)})" if after else ""
    return f"(?<={lead}{re.escape(literal[: at + 1])}){ahead}"


def _suppressed(line_text: str, code: str) -> bool:
    if "noqa" not in line_text.lower():
        return False
    for match in _NOQA.finditer(line_text):
        if _in_string(line_text, match.start()):
            continue  # a marker inside a string literal is text, not a comment
        codes = match.group("codes")
        if codes is None:
            return True
        for item in re.split(r"[\s,]+", codes.strip()):
            if item and code.upper().startswith(item.upper()):
                return True
    return False


def _in_string(line_text: str, at: int) -> bool:
    """Position ``at`` of a line lies inside a string literal opened on that line (quotes
    counted from the line's start, backslash escapes skipped): a ``#`` there starts no comment."""
    quote = ""
    index = 0
    while index < at:
        char = line_text[index]
        if quote:
            if char == "\\":
                index += 1
            elif line_text.startswith(quote, index):
                index += len(quote) - 1
                quote = ""
        elif char in "'\"":
            triple = char * 3
            quote = triple if line_text.startswith(triple, index) else char
            index += len(quote) - 1
        elif char == "#":
            return False  # a comment began before: what follows is in it
        index += 1
    return bool(quote)


def lint_source(
    source: str,
    path: str = "<string>",
    *,
    select: Iterable[str] | None = None,
    raw: bytes | None = None,
    module: str | None = None,
    is_package: bool = False,
) -> list[Finding]:
    """Lint one file's text; return its findings sorted by position.

    ``select`` is the set of rule codes to run (default: all). ``module`` is the file's dotted
    module name, used for relative imports (default: none, so they stay unresolved;
    :func:`lint_bytes` derives it from ``path``).
    """
    selected = frozenset(ALL_RULES) if select is None else frozenset(select)
    plan = _plan(selected)
    try:
        tree = parse_module(raw if raw is not None else source, filename=path)
    except (SyntaxError, ValueError) as exc:
        if "TPL000" not in selected:
            return []
        line = getattr(exc, "lineno", None) or 1
        col = getattr(exc, "offset", None) or 1
        return [Finding(path, line, max(col, 1), "TPL000", syntax_message(exc))]
    except (RecursionError, MemoryError) as exc:
        if "TPL000" not in selected:
            return []
        return [Finding(path, 1, 1, "TPL000", f"cannot parse: {type(exc).__name__}")]
    return _lint_tree(tree, source, path, plan, module, is_package)


def syntax_message(exc: Exception) -> str:
    """A ``TPL000`` message: the parser's, and the Python whose grammar it is (a file written
    for a newer one, ``type X = ...`` read by 3.11, fails here and runs there)."""
    message = getattr(exc, "msg", None) or str(exc)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return f"syntax error: {message} (as Python {version} parses it)"


# array frameworks whose files, when they never import torch, hold none of PyTorch's pitfalls
_OTHER_FRAMEWORKS = frozenset({"mxnet", "tensorflow", "jax", "paddle", "mindspore", "oneflow"})


def _other_framework(tree: ast.Module, source: str) -> bool:
    """The file imports another array framework and never torch: DGL's
    ``examples/mxnet/gcn/train.py`` (``import mxnet as mx``, ``g = g.to(ctx)``, then
    ``loss.asscalar()`` in its epoch loop) runs MXNet, whose values no rule here describes."""
    if not any(name in source for name in _OTHER_FRAMEWORKS):
        return False  # most files: no walk of the whole tree
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".", 1)[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".", 1)[0])
    return "torch" not in roots and bool(roots & _OTHER_FRAMEWORKS)


def _lint_tree(
    tree: ast.Module, source: str, path: str, plan: _Plan, module: str | None, is_package: bool
) -> list[Finding]:
    if not plan.dispatch or _other_framework(tree, source):
        return []
    # line numbers count `\n`: a lone `\r` ends a line too (Python's, and Context.lines())
    text = source.replace("\r\n", "\n").replace("\r", "\n") if "\r" in source else source
    hot = _hot_lines(text, plan.triggers)
    found: list[tuple[str, ast.AST, str, Fix | None]] = []

    selected = plan.selected

    def report(code: str, node: ast.AST, message: str, fix: Fix | None) -> None:
        if code in selected:
            found.append((code, node, message, fix))

    resolver = Resolver(module, is_package=is_package)
    ctx = Context(path=path, source=source, resolver=resolver, report_fn=report)
    ctx.scope = Scope("module", tree, "<module>", None)
    _Walker(ctx, plan, hot).block(tree.body)
    for cached in ctx.scope.cache.values():  # per-file analyses: break their cycles now
        release = getattr(cached, "release", None)
        if release is not None:
            release()
    ctx.scope.cache.clear()
    forget()
    if not found:
        return []
    lines = ctx.lines()
    findings: set[Finding] = set()
    for code, node, message, fix in found:
        line = getattr(node, "lineno", 1)
        text = lines[line - 1] if line <= len(lines) else ""
        if _suppressed(text, code):
            continue
        end_line = getattr(node, "end_lineno", None) or line
        end_text = lines[end_line - 1] if end_line <= len(lines) else ""
        findings.add(
            Finding(
                path,
                line,
                _char_col(text, getattr(node, "col_offset", 0)),
                code,
                message,
                end_line,
                _char_col(end_text, getattr(node, "end_col_offset", None) or 0),
                fix,
            )
        )
    return sorted(findings)


def lint_bytes(
    raw: bytes, path: str, *, select: Iterable[str] | None = None, resolve_module: bool = True
) -> list[Finding]:
    """Lint a file's raw bytes: undecodable text is a ``TPL001`` finding, never an exception."""
    selected = frozenset(ALL_RULES) if select is None else frozenset(select)
    try:
        source = decode_source(raw)
    except (UnicodeDecodeError, LookupError, SyntaxError) as exc:
        if "TPL001" not in selected:
            return []
        return [Finding(path, 1, 1, "TPL001", f"cannot decode file: {exc}")]
    module, is_package = module_name_for(path) if resolve_module else (None, False)
    # Parsing allocates millions of objects; the cyclic collector only slows that down.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return lint_source(
            source, path, select=selected, raw=raw, module=module, is_package=is_package
        )
    finally:
        if enabled:
            gc.enable()
