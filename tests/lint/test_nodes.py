"""The fast tree walks visit what ``ast``'s own walks visit, in the same order."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from torchplace.lint import nodes

_SKIPPED = (ast.expr_context, ast.operator, ast.boolop, ast.unaryop, ast.cmpop)

_SOURCE = """
import os, torch as t
from a.b import c as d
x: int = 1
def f(a, *b, c=None, d=2, **e):
    global g
    y = {**e, "k": [i async for i in a if i]} if a else lambda q: q + 1
    for i, (j, k) in enumerate(b):
        try:
            z = t.zeros(i)[j:k, ...]
        except (ValueError, KeyError) as err:
            raise RuntimeError(f"{err!r:>{k}}") from err
        else:
            del z
        finally:
            pass
    while not a or b:
        a -= 1
    with open(c) as fh, open(d):
        match fh:
            case [1, *rest] if rest: pass
            case {"a": 1, **kw}: pass
            case t.Tensor(x=0) | None: pass
            case _: pass
    class Inner(Base, metaclass=M):
        def m(self): return (yield from self)
    return y
async def h():
    async with a as b:
        await b
    assert x, "msg"
"""


def _trees() -> list[ast.Module]:
    here = Path(nodes.__file__).parent
    return [ast.parse(_SOURCE)] + [ast.parse(p.read_text()) for p in sorted(here.rglob("*.py"))]


def test_walk_is_ast_walk_without_contexts_and_operators() -> None:
    for tree in _trees():
        expected = [n for n in ast.walk(tree) if not isinstance(n, _SKIPPED)]
        assert list(nodes.walk(tree)) == expected


def test_children_is_iter_child_nodes_without_contexts_and_operators() -> None:
    for node in ast.walk(ast.parse(_SOURCE)):
        expected = [n for n in ast.iter_child_nodes(node) if not isinstance(n, _SKIPPED)]
        assert nodes.children(node) == expected


def _reference_walk_body(body: list[ast.stmt]) -> list[ast.AST]:
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(body)
    while todo:
        sub = todo.pop()
        out.append(sub)
        if not isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(sub))
    return [n for n in out if not isinstance(n, _SKIPPED)]


def test_walk_body_keeps_order_and_stops_at_nested_scopes() -> None:
    tree = ast.parse(_SOURCE)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            assert list(nodes.walk_body(body)) == _reference_walk_body(body)
    function = tree.body[3]
    assert isinstance(function, ast.FunctionDef)
    inner = [n for n in nodes.walk_body(function.body) if isinstance(n, ast.ClassDef)]
    assert [n.name for n in inner] == ["Inner"]
    assert not any(
        isinstance(n, ast.FunctionDef) and n.name == "m" for n in nodes.walk_body(function.body)
    )


def test_own_nodes_is_walked_once_until_forget() -> None:
    tree = ast.parse(_SOURCE)
    function = tree.body[3]
    first = nodes.own_nodes(function)
    assert list(first) == list(nodes.walk_body(function.body))  # type: ignore[attr-defined]
    assert nodes.own_nodes(function) is first
    nodes.forget()
    again = nodes.own_nodes(function)
    assert again == first
    assert again is not first
    assert nodes.own_nodes(ast.parse("x").body[0]) == ()  # no body: nothing inside


@pytest.mark.parametrize("tree", _trees()[:3])
def test_statements_finds_every_statement(tree: ast.Module) -> None:
    expected = {id(n) for n in ast.walk(tree) if isinstance(n, ast.stmt)}
    found = [id(n) for n in nodes.statements(tree.body)]
    assert len(found) == len(set(found))
    assert set(found) == expected


def test_parameter_defaults_pairs_positional_and_keyword_only_parameters() -> None:
    func = ast.parse("def f(a, /, b, c=1, *args, d, e=None, **kw): pass").body[0]
    assert isinstance(func, ast.FunctionDef)
    found = {name: ast.unparse(value) for name, value in nodes.parameter_defaults(func).items()}
    assert found == {"c": "1", "e": "None"}


def test_last_assignment_is_the_latest_before_the_line_in_the_own_body() -> None:
    source = (
        "def f(p, m):\n"
        "    p.hint = m\n"
        "    p.hint += 1\n"
        "    def g():\n"
        "        p.hint = 0\n"
        "    p.hint.to(m)\n"
        "    p.hint = None\n"
    )
    function = ast.parse(source).body[0]

    def is_hint(target: ast.expr) -> bool:
        return ast.unparse(target) == "p.hint"

    found = nodes.last_assignment(function, 6, is_hint)
    assert isinstance(found, ast.AugAssign)
    assert found.lineno == 3
    assert nodes.last_assignment(function, 2, is_hint) is None
