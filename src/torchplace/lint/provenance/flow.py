"""Where values live through one function: :class:`Flow` walks a function's statements in
order, binding each name to the :class:`~.values.Fact` of its value, and evaluates an expression
at a line from those bindings.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import replace
from types import EllipsisType
from typing import TYPE_CHECKING

from torchplace.lint.nodes import isinstance_test, own_nodes, statements, walk
from torchplace.lint.provenance.values import (
    _COMPS,
    _FACTORIES,
    _FOLLOW_CALLS,
    _FUNCTIONS,
    _HOST_CALLS,
    _HOST_ROOTS,
    HOST_ATTRS,
    HOST_METHODS,
    METADATA_ATTRS,
    Fact,
    _any_device,
    _decodes_text,
    _device_helper,
    _device_target,
    _either,
    _is_cpu,
    _is_move_call,
    _iterates_items,
    _join,
    _many,
    _moved_by,
    _one,
    _passes_device,
    _ran,
    _short,
    _target_names,
    closure_step,
    cpu_names,
    in_place_helper,
    inherited_cpu_names,
    is_text,
    iterates_keys,
    looks_up_keys,
    moved_in_place,
    moves_to_device,
    names_host_result,
    reads_learning_rate,
)
from torchplace.lint.resolver import dotted_name

if TYPE_CHECKING:
    from torchplace.lint.provenance.files import FileFacts

#: see :data:`~.callers.MOVED_SELF` (callers builds on this module: the name is repeated)
MOVED_SELF = "<moved self>"

__all__ = ["TORCH_QUERIES", "Flow", "encodes_text", "zip_pairs"]

Lookup = Callable[[str], "Fact | None"]


def _skipped_keys(test: ast.expr, key: str, one: type, many: type) -> set[str]:
    """The string keys ``test`` compares ``key`` with by ``one`` (``k != "meta"``) or finds
    in a literal collection by ``many`` (``k not in ("meta", "id")``); a prefix the key is
    tested for (``not k.startswith("name")`` around a move, ``k.startswith("name")`` before a
    ``continue``) as ``"name*"``."""
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    probe = test.operand if isinstance(test, ast.UnaryOp) and negated else test
    if (
        isinstance(probe, ast.Call)
        and isinstance(probe.func, ast.Attribute)
        and probe.func.attr == "startswith"
        and isinstance(probe.func.value, ast.Name)
        and probe.func.value.id == key
        and len(probe.args) == 1
        and isinstance(probe.args[0], ast.Constant)
        and isinstance(probe.args[0].value, str)
        and negated == (one is ast.NotEq)  # skipped: moved when not, or left when it is
    ):
        return {probe.args[0].value + "*"}
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.left, ast.Name)
        and test.left.id == key
    ):
        return set()
    other = test.comparators[0]
    if isinstance(test.ops[0], one):
        values = [other]
    elif isinstance(test.ops[0], many) and isinstance(other, (ast.Tuple, ast.List, ast.Set)):
        values = other.elts
    else:
        return set()
    return {v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)}


def _kept_key(key: str, kept: frozenset[str]) -> bool:
    """``key`` is one of the ``kept`` keys, or starts with a kept prefix (``"name*"``)."""
    return key in kept or any(k.endswith("*") and key.startswith(k[:-1]) for k in kept)


def _moved_through(call: ast.Call) -> str:
    name = dotted_name(call.func) or "a helper"
    return f"moved by the transfer helper `{name}(...)` at line {call.lineno}"


class Flow:
    """Facts of one scope's names: ``bindings[name]`` lists ``(line, fact)`` in source order."""

    __slots__ = (
        "apart",
        "bindings",
        "cpu",
        "facts",
        "guards",
        "loops",
        "node",
        "seeds",
        "state",
        "walking",
    )

    def __init__(self, facts: FileFacts, node: ast.AST, seeds: dict[str, Fact]) -> None:
        self.facts = facts
        self.node = node
        self.seeds = seeds
        self.state: dict[str, Fact | None] = dict(seeds)
        self.bindings: dict[str, list[tuple[int, Fact | None]]] = {}
        # `(first, last)` line spans of an `if` body and of its `else`: neither sees the other
        self.apart: list[tuple[tuple[int, int], tuple[int, int]]] = []
        # `(first, last)` lines of each loop: a binding late in its body reaches the next step
        # (a set: a loop's body is walked twice, and so are the loops nested in it)
        self.loops: set[tuple[int, int]] = set()
        # names the scope binds only to the CPU (`eval_device = "cpu"`), found on first use
        self.cpu: frozenset[str] | None = None
        # per block being walked: for each `if` test (by its text), the names an `if` of that
        # test rebound, as `name -> (line, after the if, after its body, after its else)`
        self.guards: list[dict[str, dict[str, _Guarded]]] = []
        # the `for` statements enclosing the statement being walked, innermost last
        self.walking: list[ast.For | ast.AsyncFor] = []

    def to_cpu(self, call: ast.Call) -> bool:
        """``.to("cpu")``, ``.to(cpu_device)``, or ``.to(eval_device)`` where the scope binds
        ``eval_device`` only to ``"cpu"`` (:meth:`cpu_target`)."""
        return self.cpu_target(_device_target(call))

    def cpu_target(self, target: ast.expr | None) -> bool:
        """``"cpu"``, ``cpu_device``, or a name the scope binds only to the CPU, also one the
        module binds so that the scope leaves alone (``device = "cpu"`` of a CPU script)."""
        if _is_cpu(target):
            return True
        if not isinstance(target, ast.Name):
            return False
        if self.cpu is None:
            self.cpu = cpu_names(self.node) | inherited_cpu_names(self.node, self.facts.tree)
        return target.id in self.cpu

    # -- the in-order pass ------------------------------------------------------------------
    def run(self) -> None:
        body = getattr(self.node, "body", [])
        self.block(body)

    def block(self, body: list[ast.stmt]) -> None:
        self.guards.append({})
        try:
            for stmt in body:
                try:
                    self.stmt(stmt)
                except RecursionError:
                    # an absurdly nested expression (a generated 2,000-term sum): what this
                    # statement binds stays unknown, and the statements after it are read
                    continue
        finally:
            self.guards.pop()

    def bind(self, target: ast.expr, fact: Fact | None, line: int, value: ast.expr | None) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            elts = value.elts if isinstance(value, (ast.Tuple, ast.List)) else None
            parts = (
                self.returned_parts(value, len(target.elts))
                if elts is None and isinstance(value, ast.Call)
                else None
            )
            for index, elt in enumerate(target.elts):
                if elts is not None and len(elts) == len(target.elts):
                    self.bind(elt, self.eval(elts[index], self.current), line, elts[index])
                elif parts is not None:
                    part = parts[index]
                    self.bind(elt, fact if isinstance(part, EllipsisType) else part, line, None)
                else:
                    self.bind(elt, fact, line, None)
            return
        if isinstance(target, ast.Starred):
            self.bind(target.value, fact, line, value)
            return
        name = dotted_name(target)
        if name is None:
            return
        if fact is not None:
            direct = isinstance(value, ast.Call) and fact.move is not None and _is_move_call(value)
            source = _short(self.facts.segment(value)) if value is not None else fact.source
            fact = replace(fact, source=source, name=name, direct=direct)
        self.state[name] = fact
        self.bindings.setdefault(name, []).append((line, fact))

    def returned_parts(self, call: ast.Call, count: int) -> list[Fact | EllipsisType | None] | None:
        """``model, optimizer, epoch = load_checkpoint(path, model, optimizer)``: the fact of
        each element of the tuple that the project's one function of that name (or the
        method of the class, ``self._parse_batch(batch)``) returns (``return model, optimizer,
        epoch`` in every ``return``), so that the host epoch is not taken for the device model
        beside it. A returned parameter follows the argument given for it; an element the
        callee's own flow puts on the device is ``...`` (the call's fact as a whole), as is one
        a method's flow cannot place; one a function's flow cannot place is None."""
        func = call.func
        if any(isinstance(a, ast.Starred) for a in call.args):
            return None
        method = None
        if isinstance(func, ast.Name):
            callees = self.facts.callees(func.id, self.facts.qualname(func))
        else:  # `self._parse_batch(batch)`: a method of the class
            method = self.facts.local_def(func, self.node)
            callees = [] if method is None else [(self.facts, method)]
        if len(callees) != 1:
            return None
        owner, callee = callees[0]
        returns = [n for n in own_nodes(callee) if isinstance(n, ast.Return)]
        values = [r.value for r in returns]
        if not values or not all(isinstance(v, ast.Tuple) and len(v.elts) == count for v in values):
            return None
        params = [a.arg for a in [*callee.args.posonlyargs, *callee.args.args]]
        if not isinstance(func, ast.Name):
            params = params[1:]  # `self`
        given: dict[str, ast.expr] = dict(zip(params, call.args, strict=False))
        given.update({kw.arg: kw.value for kw in call.keywords if kw.arg is not None})
        rebound = {
            name
            for node in own_nodes(callee)
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            for name in _target_names(target)
        }
        parts: list[Fact | EllipsisType | None] = []
        for index in range(count):
            elements = [v.elts[index] for v in values if isinstance(v, ast.Tuple)]
            names = {e.id for e in elements if isinstance(e, ast.Name)}
            if len(names) == 1 and len(elements) == len(values):
                (name,) = names
                if name in given and name not in rebound:
                    parts.append(self.eval(given[name], self.current))
                    continue
            # `return None, None` on a failure path: no tensor, where the others say
            found = [owner.fact(e, callee) for e in elements if not isinstance(e, ast.Constant)]
            if found and all(f is not None and f.where == "host" for f in found):
                parts.append(Fact("host", f"{callee.name}(...)[{index}]"))
            elif any(f is not None and f.on_device for f in found) or method is not None:
                # a method's element made from what it is given (DeepCTR's `self._get_emb(X)`
                # of a moved `X`) goes where the call's fact as a whole says
                parts.append(...)
            else:
                parts.append(None)  # nothing in the callee says where it lives
        return parts

    def current(self, name: str) -> Fact | None:
        if name in self.state:
            return self.state[name]
        return self.facts.outer_fact(self.node, name)

    def stmt(self, node: ast.stmt) -> None:
        # an assignment binds once its value is computed: a read of the old value on a later
        # line of the same statement (`loss, n = (\n loss.item(), ...)`) does not see it
        end = node.end_lineno or node.lineno
        if isinstance(node, ast.Assign):
            fact = self.eval(node.value, self.current)
            for target in node.targets:
                self.bind(target, fact, end, node.value)
                container = moved_in_place(target, node.value) or self.moved_entry(target, node)
                if container is not None and fact is not None and fact.on_device:
                    # `batch[key] = batch[key].to(device)`: the mapping now holds device items
                    held = replace(fact, kept=self.kept_keys(target, node))
                    self.bind(container, held, end, node.value)
                    if (walked := self.walked_list(container)) is not None:
                        self.bind(walked, held, end, node.value)  # and so does each of its list
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self.bind(node.target, self.eval(node.value, self.current), end, node.value)
        elif isinstance(node, ast.AugAssign):
            self.aug_assign(node)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            call = node.value
            func = call.func
            # `model.to(device)` / `model.cuda()` as a statement moves a module in place.
            if (
                isinstance(func, ast.Attribute)
                and _is_move_call(call)
                and moves_to_device(call, self.facts.qualname)
                and dotted_name(func.value) is not None
                and not self.to_cpu(call)
            ):
                self.bind(func.value, self.facts.move_fact(call, func.value), node.lineno, call)
            elif (moved := in_place_helper(call)) is not None:
                batch, device = moved
                what = f"`{batch.id}` moved to `{_short(self.facts.segment(device), 24)}`"
                fact = Fact("device", _short(self.facts.segment(call)), f"{what} at line {end}")
                self.bind(batch, fact, end, call)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self.for_loop(node)
        elif isinstance(node, ast.While):
            self.loops.add((node.lineno, node.end_lineno or node.lineno))
            for attempt in range(2):
                before = dict(self.state)
                self.block(node.body)
                if attempt == 0 and self.state == before:
                    break  # nothing carried over (see for_loop)
            self.block(node.orelse)
        elif isinstance(node, ast.If):
            self.branches(node)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, None, node.lineno, None)
            self.block(node.body)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            self.block(node.body)  # type: ignore[attr-defined]
            for handler in node.handlers:  # type: ignore[attr-defined]
                self.block(handler.body)
            self.block(node.orelse)  # type: ignore[attr-defined]
            self.block(node.finalbody)  # type: ignore[attr-defined]
        elif isinstance(node, ast.Match):
            for case in node.cases:
                self.block(case.body)
        elif isinstance(node, (_FUNCTIONS, ast.ClassDef)):
            self.state[node.name] = None

    def branches(self, node: ast.If) -> None:
        """``if``/``else``: each branch starts from the state before it. A name on the device
        on one path stays on the device after the statement, even where the other path moved
        it to the host (``if device == "mps": x = x.cpu()``): the code runs on a device. Unless
        the test asks where that name lives (``if x.is_cuda: x = x.cpu()``): then the path that
        leaves it alone holds it where the other path puts it, and the rebinding decides."""
        inspected = _inspects_device(node.test)
        if node.orelse:
            self.apart.append((_span(node.body), _span(node.orelse)))
        before = dict(self.state)
        key = _guard_key(node.test, self.facts.qualname)
        on_body, on_else = self.correlated(node, key, before)
        self.state = {**before, **on_body}
        self.block(node.body)
        after_body = self.state
        self.state = {**before, **on_else}
        self.block(node.orelse)
        after_else = self.state
        self.state = merged = dict(after_else)
        line = node.end_lineno or node.lineno
        for name in after_body.keys() | after_else.keys():
            one = after_body.get(name)
            other = after_else[name] if name in after_else else before.get(name)
            if one is other:
                continue
            else_bound = name in after_else and (
                name not in before or after_else[name] is not before[name]
            )
            linear = other if else_bound or name not in after_body else one
            device = next((f for f in (one, other) if f is not None and f.on_device), None)
            fact = device if device is not None else linear
            body_bound = name in after_body and (
                name not in before or after_body[name] is not before[name]
            )
            if name in inspected and body_bound != else_bound:
                fact = one if body_bound else other
            merged[name] = fact
            if fact is not self.bindings.get(name, [(0, None)])[-1][1]:
                self.bindings.setdefault(name, []).append((line, fact))
        if key is not None:
            guarded = self.guards[-1].setdefault(key, {}) if self.guards else {}
            for name in merged:
                body_fact, else_fact = after_body.get(name), after_else.get(name)
                if body_fact is not else_fact:
                    guarded[name] = (line, merged[name], body_fact, else_fact)

    def correlated(
        self, node: ast.If, key: str | None, before: dict[str, Fact | None]
    ) -> tuple[dict[str, Fact | None], dict[str, Fact | None]]:
        """The names an earlier ``if`` of the same test, in the same block, rebound, with what
        its body and its ``else`` left them as, when neither they nor the test's names have
        been rebound since: ``if gpu: x = torch.tensor(x).cuda()`` / ``else: x =
        torch.tensor(x)``, then ``if gpu: x = x.cpu()`` leaves ``x`` on the host on both paths
        (the second body runs only where the first did), and a third ``if gpu: x.cpu()`` copies
        a host tensor. The starting state of each branch, and a binding at its start for the
        reads in it."""
        guarded = self.guards[-1].get(key, {}) if key is not None and self.guards else {}
        on_body: dict[str, Fact | None] = {}
        on_else: dict[str, Fact | None] = {}
        tested = {n for sub in walk(node.test) if (n := dotted_name(sub)) is not None}
        for name, (line, merged, body_fact, else_fact) in guarded.items():
            if name not in before or before[name] is not merged:
                continue  # rebound since
            if any(
                line <= bound < node.lineno
                for test_name in tested
                for bound, _ in self.bindings.get(test_name, ())
            ):
                continue  # the test may now say otherwise
            on_body[name], on_else[name] = body_fact, else_fact
        body_first = _span(node.body)[0]
        else_first = node.orelse[0].lineno - 1 if node.orelse else 0
        for name in on_body:
            if body_first > node.lineno:
                self.bindings.setdefault(name, []).append((node.lineno, on_body[name]))
            if else_first > _span(node.body)[1]:
                self.bindings.setdefault(name, []).append((else_first, on_else[name]))
        return on_body, on_else

    def moved_entry(self, target: ast.expr, node: ast.Assign) -> ast.expr | None:
        """The mapping of ``t[k] = v.to(device)`` in ``for k, v in t.items():``: each entry
        replaced by its own move, as ``t[k] = t[k].to(device)`` does."""
        value = node.value
        if not (
            isinstance(target, ast.Subscript)
            and isinstance(target.slice, ast.Name)
            and isinstance(value, ast.Call)
            and _is_move_call(value)
            and isinstance(value.func, ast.Attribute)
            and isinstance(value.func.value, ast.Name)
        ):
            return None
        container = dotted_name(target.value)
        if container is None:
            return None
        for loop in reversed(self.walking):
            pair, items = loop.target, loop.iter
            if (
                _iterates_items(items)
                and isinstance(items, ast.Call)
                and isinstance(items.func, ast.Attribute)
                and dotted_name(items.func.value) == container
                and isinstance(pair, ast.Tuple)
                and len(pair.elts) == 2
                and [dotted_name(e) for e in pair.elts] == [target.slice.id, value.func.value.id]
            ):
                return target.value
        return None

    def walked_list(self, container: ast.expr) -> ast.Name | None:
        """The list an enclosing ``for t in targets:`` walks when ``container`` is its ``t``:
        moving each dict's entries in place moves what the list holds."""
        if not isinstance(container, ast.Name):
            return None
        for loop in reversed(self.walking):
            if isinstance(loop.target, ast.Name) and loop.target.id == container.id:
                return loop.iter if isinstance(loop.iter, ast.Name) else None
        return None

    def kept_keys(self, target: ast.expr, move: ast.stmt) -> frozenset[str]:
        """The keys the loop moving ``container[k]`` in place skips (an ``if k != "meta":``
        around the move, or ``if k in ("meta", "id"): continue`` before it)."""
        key = target.slice if isinstance(target, ast.Subscript) else None
        if not isinstance(key, ast.Name):
            return frozenset()
        skipped: set[str] = set()
        for sub in walk(self.node):
            if isinstance(sub, ast.If) and move in sub.body:
                skipped |= _skipped_keys(sub.test, key.id, ast.NotEq, ast.NotIn)
            elif isinstance(sub, (ast.For, ast.AsyncFor)) and any(
                move is inner for stmt in sub.body for inner in walk(stmt)
            ):
                for stmt in sub.body:
                    if isinstance(stmt, ast.If) and isinstance(stmt.body[-1], ast.Continue):
                        skipped |= _skipped_keys(stmt.test, key.id, ast.Eq, ast.In)
        return frozenset(skipped)

    def aug_assign(self, node: ast.AugAssign) -> None:
        """``x += y``: a host value that gains a device term moves to the device."""
        old = (
            self.eval(node.target, self.current)
            if not isinstance(node.target, ast.Subscript)
            else None
        )
        new = self.eval(node.value, self.current)
        fact = _join(old, new) if old is not None else new
        if old is not None and old.where == "host" and new is not None and new.on_device:
            fact = new
        self.bind(node.target, fact, node.end_lineno or node.lineno, node.value)

    def for_loop(self, node: ast.For | ast.AsyncFor) -> None:
        self.loops.add((node.lineno, node.end_lineno or node.lineno))
        iter_fact = self.eval(node.iter, self.current)
        if iter_fact is None and (self.facts.moves_some(node) or self.casts_some(node)):
            # A batch loop moves some of its items: the others stay on the host.
            iter_fact = Fact("host", "a batch item that is never moved")
        # `for name in subset: subset[name]`: a mapping's keys, never a tensor's rows
        keys = looks_up_keys(node, self.node)
        for attempt in range(2):  # twice: values carried from one step to the next
            before = dict(self.state)
            if keys:
                self.bind(node.target, Fact("host", "key"), node.lineno, None)
            else:
                self.bind_loop_target(node.target, node.iter, iter_fact, node.lineno)
            self.walking.append(node)
            try:
                self.block(node.body)
            finally:
                self.walking.pop()
            if attempt == 0 and self.state == before:
                break  # nothing carried over: a second pass finds the same (and nested loops
                # would each double the work)
        self.block(node.orelse)

    def casts_some(self, node: ast.For | ast.AsyncFor) -> bool:
        """The loop moves one of its own targets by a cast to a CUDA tensor type bound before
        it (``imgs = imgs.type(Tensor)`` with ``Tensor = torch.cuda.FloatTensor``)."""
        targets = set(_target_names(node.target))
        return any(
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == "type"
            and isinstance(sub.func.value, ast.Name)
            and sub.func.value.id in targets
            and len(sub.args) == 1
            and (fact := self.eval(sub.args[0], self.current)) is not None
            and fact.on_device
            for stmt in node.body
            for sub in walk(stmt)
        )

    def bind_loop_target(
        self, target: ast.expr, iterable: ast.expr, fact: Fact | None, line: int
    ) -> None:
        # `for i, c in list(enumerate(boxes))`: a copy of what it wraps, step for step
        while (
            isinstance(iterable, ast.Call)
            and dotted_name(iterable.func) in _PASS_THROUGH
            and len(iterable.args) == 1
            and isinstance(iterable.args[0], ast.Call)
        ):
            iterable = iterable.args[0]
        # `for i, (x, y) in enumerate(loader)`: the counter is a host int.
        if (
            isinstance(iterable, ast.Call)
            and isinstance(iterable.func, ast.Name)
            and iterable.func.id == "enumerate"
            and isinstance(target, ast.Tuple)
            and len(target.elts) == 2
        ):
            self.bind(target.elts[0], Fact("host", "enumerate"), line, None)
            if iterable.args and zip_pairs(iterable.args[0], target.elts[1]) is not None:
                # `for i, (image, seed) in enumerate(zip(images, seeds))`: as zip's own
                self.bind_loop_target(target.elts[1], iterable.args[0], fact, line)
                return
            self.bind(target.elts[1], fact, line, None)
            return
        if iterates_keys(iterable, self.node):
            # `for name in subset` with `subset = {n: full[n] for n in names}`: the keys
            self.bind(target, Fact("host", "key"), line, None)
            return
        zipped = zip_pairs(iterable, target)
        if zipped is not None:
            # `for image, name in zip(images, names)`: each name follows its own sequence.
            for elt, seq in zipped:
                self.bind(elt, _one(self.eval(seq, self.current)), line, None)
            return
        if (
            fact is not None
            and fact.on_device
            and _iterates_items(iterable)
            and isinstance(target, ast.Tuple)
            and len(target.elts) == 2
        ):
            # `for k, v in batch.items()`: keys are strings, values follow the mapping.
            self.bind(target.elts[0], Fact("host", "key"), line, None)
            self.bind(target.elts[1], fact, line, None)
            return
        self.bind(target, _one(fact), line, None)

    # -- expressions ------------------------------------------------------------------------
    def eval(self, node: ast.expr, lookup: Lookup) -> Fact | None:
        facts = self.facts
        if isinstance(node, ast.Name):
            return lookup(node.id)
        if isinstance(node, ast.Constant):
            return Fact("host", repr(node.value)[:20])
        if isinstance(node, ast.JoinedStr):
            return Fact("host", "f-string")
        if isinstance(node, ast.Attribute):
            if node.attr in HOST_ATTRS:
                return Fact("host", node.attr)
            if node.attr in METADATA_ATTRS and dotted_name(node.value) != "self":
                return Fact("host", "metadata")
            if node.attr == "param_groups":  # an optimizer's hyperparameters: `group["lr"]`
                return Fact("host", "optimizer hyperparameters")
            name = dotted_name(node)
            if name is not None:
                fact = lookup(name)
                if fact is not None:
                    return fact
                if name.startswith("self."):
                    found = facts.self_attr_fact(self.node, name)
                    moved = self.seeds.get(MOVED_SELF)
                    if found is None and moved is not None and moved.on_device:
                        owned = name.split(".")[1]
                        if facts.registered_tensor(self.node, owned):
                            return Fact("device", name, moved.move, "self")  # moved with it
                    return found
            qualname = facts.qualname(node)
            if qualname is not None:
                return _cuda_type(qualname, node.lineno)  # torch.float16, np.pi: a constant
            return self.eval(node.value, lookup)
        if isinstance(node, ast.Subscript):
            found = self.eval(node.value, lookup)
            if (
                found is not None
                and found.kept
                and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)
                and _kept_key(node.slice.value, found.kept)
            ):
                return Fact("host", "an item the loop that moves the others skips")
            # `parts[rank::n]` of a list of tensors is still a list; `parts[0]` is one of them
            return found if isinstance(node.slice, ast.Slice) else _one(found)
        if isinstance(node, ast.Starred):
            return self.eval(node.value, lookup)
        if isinstance(node, ast.Await):
            return self.eval(node.value, lookup)
        if isinstance(node, ast.NamedExpr):
            fact = self.eval(node.value, lookup)
            self.bind(node.target, fact, node.lineno, node.value)
            return fact
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Div) and _a_path(node.left, self.facts):
                return Fact("host", "a path")  # `Path(out) / name`: a path, whatever `name` is
            if is_text(node):
                return Fact("host", "text")  # `"%g %ss, " % (n, name)`: a string
            return _join(self.eval(node.left, lookup), self.eval(node.right, lookup))
        if isinstance(node, ast.UnaryOp):
            return self.eval(node.operand, lookup)
        if isinstance(node, ast.Compare):
            if all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
                return Fact("host", "identity test")  # `targets is None`: a Python bool
            fact = self.eval(node.left, lookup)
            for other in node.comparators:
                fact = _join(fact, self.eval(other, lookup))
            if fact is not None and not fact.on_device:
                return Fact("host", "comparison")
            return fact
        if isinstance(node, ast.IfExp):
            orelse = (
                Fact("host", ast.unparse(node.orelse))
                if _not_a_tensor_there(node)
                else self.eval(node.orelse, lookup)
            )
            return _either(self.eval(node.body, lookup), orelse)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return _many(_any_device([self.eval(elt, lookup) for elt in node.elts]))
        if isinstance(node, ast.Dict):
            return _any_device([self.eval(v, lookup) for v in node.values if v is not None])
        if isinstance(node, _COMPS):
            found = self.comprehension(node, lookup)
            return found if isinstance(node, ast.DictComp) else _many(found)
        if isinstance(node, ast.Call):
            return self.call(node, lookup)
        return None

    def comprehension(self, node: ast.expr, lookup: Lookup) -> Fact | None:
        assert isinstance(node, _COMPS)
        inner = self.comp_lookup(node, lookup)
        if isinstance(node, ast.DictComp):
            return self.eval(node.value, inner)
        return self.eval(node.elt, inner)

    def comp_lookup(self, node: ast.expr, lookup: Lookup) -> Lookup:
        """A lookup that also knows the names a comprehension binds: each target follows
        what its generator iterates (an ``enumerate`` counter and a ``.items()`` key are host
        values, ``zip`` targets follow their own sequences)."""
        assert isinstance(node, _COMPS)
        local: dict[str, Fact | None] = {}

        def inner(name: str) -> Fact | None:
            return local[name] if name in local else lookup(name)

        for gen in node.generators:
            target = gen.target
            iterable = gen.iter
            zipped = zip_pairs(iterable, target)
            if zipped is not None:
                for elt, seq in zipped:
                    for name in _target_names(elt):
                        local[name] = _one(self.eval(seq, inner))
                continue
            if (
                isinstance(iterable, ast.Call)
                and isinstance(iterable.func, ast.Name)
                and iterable.func.id == "enumerate"
                and iterable.args
                and isinstance(target, ast.Tuple)
                and len(target.elts) == 2
            ):
                for name in _target_names(target.elts[0]):
                    local[name] = Fact("host", "enumerate")
                fact = _one(self.eval(iterable.args[0], inner))
                for name in _target_names(target.elts[1]):
                    local[name] = fact
                continue
            if iterates_keys(iterable, self.node):
                for name in _target_names(target):
                    local[name] = Fact("host", "key")
                continue
            fact = self.eval(iterable, inner)
            items = _iterates_items(iterable)
            targets = target.elts if isinstance(target, ast.Tuple) else [target]
            for index, elt in enumerate(targets):
                for name in _target_names(elt):
                    if items and index == 0 and len(targets) == 2:
                        local[name] = Fact("host", "key")
                    else:
                        local[name] = _one(fact)
        return inner

    def call(self, node: ast.Call, lookup: Lookup) -> Fact | None:
        facts = self.facts
        func = node.func
        args = [*node.args, *(kw.value for kw in node.keywords)]
        if encodes_text(node):
            return Fact("host", f"tokenizer output `{_short(facts.segment(func), 32)}`")
        if isinstance(func, ast.Attribute):
            method = func.attr
            if _is_move_call(node):
                if self.to_cpu(node):
                    return Fact("host", _short(facts.segment(node)), copy=True)
                if moves_to_device(node, facts.qualname):
                    return facts.move_fact(node, func.value)
                return self.eval(func.value, lookup)  # .to(torch.float16)
            qualname = facts.qualname(func)
            if qualname is not None:
                fact = self.torch_call(node, qualname, args, lookup)
                if fact is not None or not self.unknown_function(qualname):
                    return fact
                # `shared.model(input_ids=tokens)`: no function of that name is known in
                # the module; an object it holds (a model loaded into a settings module),
                # called as any object is below
            if closure_step(node, facts.defs):
                return None  # `optimizer.step(closure)`: what the closure returns, the loss
            if method in HOST_METHODS or isinstance(func.value, (ast.Constant, ast.JoinedStr)):
                # also `"_".join(xs)`: a string's methods; `x.cpu()` and `.numpy()` are copies
                return Fact("host", method, copy=method in _HOST_COPIES)
            if facts.moves_argument(node, self.node):  # `self.to_var(x)`: a transfer helper
                return Fact("device", _short(facts.segment(node)), _moved_through(node))
            if method == "prepare" and _accelerator(func.value):
                # `model, opt, loader = accelerator.prepare(model, opt, loader)`: Accelerate
                # places the model and hands back loaders whose batches are on its device
                what = _short(facts.segment(node), 32)
                return Fact("device", what, f"moved by `{what}` (Accelerate)")
            if reads_learning_rate(func):
                return Fact("host", f"a learning rate from `{_short(facts.segment(func), 32)}`")
            if _decodes_text(func):
                return Fact("host", f"text from `{_short(facts.segment(func), 32)}`")
            if _numpy_alias(func) and lookup("np") is None and lookup("numpy") is None:
                return Fact("host", _short(facts.segment(func), 32))  # `np` from a star import
            made = facts.method_returns_device(func, self.node)
            if made is not None:  # `x, y = self._parse_batch(batch)`, moving what it returns
                return made
            if _dataset_method(func) and not _device_helper(method, args):
                # `eval_dataset.evaluation(detections, path)`: a dataset scores on the host
                return Fact("host", f"`{_short(facts.segment(func), 32)}` of a dataset")
            receiver = self.eval(func.value, lookup)
            if receiver is not None and receiver.on_device:
                if facts.method_returns_host(func.value, method, self.node):
                    return Fact("host", f"{method}()")  # `model.get_step()`: `.item()` inside
                return _many(receiver) if method in _SPLITS else receiver
            arg_facts = [self.eval(arg, lookup) for arg in args]
            found = _any_device(arg_facts)
            if found is not None and found.on_device:
                if facts.method_returns_host(func.value, method, self.node):
                    return Fact("host", f"{method}()")  # a helper that hands back NumPy
                return _many(found) if self.runs_heads(func) else found
            if receiver is not None and receiver.where == "host":
                # a tensor method of a host copy is a host tensor too (`x.cpu().squeeze(0)`),
                # whose arithmetic stays there; a Python number's (`.item()`) may meet anything
                kept = receiver.copy and method not in {"item", "tolist"}
                return Fact("host", method, copy=kept)
            if _device_helper(method, args) or _passes_device(node):
                return Fact("device", _short(facts.segment(node)), _moved_by(node))
            return None
        if isinstance(func, ast.Name):
            name = func.id
            qualname = facts.qualname(func)
            if qualname == "typing.cast" and len(node.args) == 2:
                return self.eval(node.args[1], lookup)  # cast(T, v) is v, whatever T names
            if qualname == "transformers.pipeline":
                # `pipe = pipeline(task, device=0)`: what it answers is Python data (labels,
                # scores, text), post-processed on the host, wherever its model runs
                return Fact("host", "a `transformers.pipeline`, which answers in Python data")
            if qualname is not None and qualname.split(".")[0] in {"torch", *_HOST_ROOTS}:
                return self.torch_call(node, qualname, args, lookup)
            if name in _HOST_CALLS or (names_host_result(name) and not _passes_device(node)):
                return Fact("host", name)  # not a loader built for the device, given `device=`
            called = lookup(name)
            if called is not None and called.on_device:  # a moved model, run
                if _preprocessor_of_loader(func, called):
                    return Fact("host", f"preprocessor output `{_short(facts.segment(func), 32)}`")
                return Fact("device", _short(facts.segment(node)), _ran(called), called.name)
            if facts.returns_host(name) or name in facts.host_lambdas(self.node):
                return Fact("host", name)  # also when device values go in (``-> int``)
            made = facts.returns_device(name, qualname)
            if made is not None:  # `model = load_model(cfg)`, which returns `Net().cuda()`
                return made
            if facts.moves_argument(node, self.node):  # `to_var(x)`: a transfer helper
                return Fact("device", _short(facts.segment(node)), _moved_through(node))
            if facts.plain_instance(node, name, qualname):
                # `restorer = TrainingRestorer(cfg, model, optimizer)`: an object of a class of
                # the linted tree that is no module; its attributes (a step count) are its own
                return None
            arg_facts = [self.eval(arg, lookup) for arg in args]
            found = _any_device(arg_facts)
            if found is not None and found.on_device:
                if self.returns_own(node, name, qualname, arg_facts):
                    return None  # `evaluate(model, ...)` returning its meters' averages
                return found
            if (
                name in _FOLLOW_CALLS
                and arg_facts
                and all(f is not None and f.where == "host" for f in arg_facts)
            ):
                return Fact("host", name)
            if _device_helper(name, args) or _passes_device(node):
                return Fact("device", _short(facts.segment(node)), _moved_by(node))
            return None
        called = self.eval(func, lookup)
        if called is not None and called.on_device:
            if _preprocessor_of_loader(func, called):
                # `txt_processors["eval"](text)`: one of the preprocessors a loader handed
                # back beside its model, given the device; it prepares inputs on the host
                return Fact("host", f"preprocessor output `{_short(facts.segment(func), 32)}`")
            return Fact("device", _short(facts.segment(node)), _ran(called), called.name)
        if _registry_call(func, facts) or (
            isinstance(func, ast.Subscript) and isinstance(func.value, ast.Attribute)
        ):
            # `loss_registry[config.model.type](model, x, t, e, b)`: one of the file's functions
            # picked from a dict display, or a module an object keeps in a dict
            # (ParallelWaveGAN's `self.criterion["mel"](y_, y)`), run on the device values it
            # is given
            found = _any_device([self.eval(arg, lookup) for arg in args])
            return found if found is not None and found.on_device else None
        return None

    def runs_heads(self, func: ast.Attribute) -> bool:
        """``self.net(images)``, with ``self.net = YoloBody(...)`` in the method's class and
        a ``forward`` of that class whose every ``return`` is a tuple display (``return out0,
        out1, out2``): the call hands back one whole tensor per head, not one tensor."""
        if not (isinstance(func.value, ast.Name) and func.value.id == "self"):
            return False
        cls = self.facts.parent.get(id(self.node))
        if not isinstance(cls, ast.ClassDef):
            return False
        for sub in statements(cls.body):
            if not (
                isinstance(sub, ast.Assign)
                and isinstance(sub.value, ast.Call)
                and any(dotted_name(t) == f"self.{func.attr}" for t in sub.targets)
            ):
                continue
            call = sub.value
            while isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Call):
                call = call.func.value  # `Body().cuda().eval()`
            made = self.facts.class_def(call.func)
            if made is None:
                continue  # `self.net = nn.DataParallel(self.net)`: a wrapper of what was built
            forward = next(
                (f for f in made[1].body if isinstance(f, ast.FunctionDef) and f.name == "forward"),
                None,
            )
            return forward is not None and _returns_tuples(forward)
        return False

    def returns_own(
        self, node: ast.Call, name: str, qualname: str | None, arg_facts: list[Fact | None]
    ) -> bool:
        """``node`` calls functions of the linted code (this file's, or one imported from a
        module file beside it) none of which hands back the device values it is given."""
        callees = self.facts.callees(name, qualname)
        if not callees:
            return False
        for owner, callee in callees:
            params = [a.arg for a in [*callee.args.posonlyargs, *callee.args.args]]
            seeds: dict[str, Fact] = {}
            for param, fact in zip(params, arg_facts[: len(node.args)], strict=False):
                if fact is not None and fact.on_device:
                    seeds[param] = fact
            for kw, fact in zip(node.keywords, arg_facts[len(node.args) :], strict=True):
                if kw.arg is not None and fact is not None and fact.on_device:
                    seeds[kw.arg] = fact
            if any(isinstance(arg, ast.Starred) for arg in node.args) or any(
                kw.arg is None for kw in node.keywords
            ):
                return False  # `f(*args)`, `f(**kw)`: which parameter gets what is unknown
            if not seeds or owner.returns_arguments(callee, seeds):
                return False
        return True

    def project_call(
        self, node: ast.Call, qualname: str, args: list[ast.expr], lookup: Lookup
    ) -> Fact | None:
        """``utils.post_processing(img, output)``: a function of an imported module of the
        linted tree hands back the device values it is given, unless none of its returns
        does (YOLOv4's post-processing returns NumPy boxes). Other modules: unknown."""
        name = qualname.rpartition(".")[2]
        callees = self.facts.callees(name, qualname)
        if not callees or all(_returns_tuples(callee) for _, callee in callees):
            # `name, args, opt = train_util.get_optimizer(args, params)`: which of the values
            # holds what it was given is not followed; the names are not all device values
            return None
        arg_facts = [self.eval(arg, lookup) for arg in args]
        found = _any_device(arg_facts)
        if found is None or not found.on_device:
            return None
        return None if self.returns_own(node, name, qualname, arg_facts) else found

    def unknown_function(self, qualname: str) -> bool:
        """``shared.model``: an attribute of an imported module that is neither torch's, nor
        a host library's, nor a function the linted tree defines there."""
        top = qualname.split(".")[0]
        if top == "torch" or top in _HOST_ROOTS or qualname.startswith(_TENSOR_IN_TENSOR_OUT):
            return False
        return not self.facts.callees(qualname.rpartition(".")[2], qualname)

    def torch_call(
        self, node: ast.Call, qualname: str, args: list[ast.expr], lookup: Lookup
    ) -> Fact | None:
        root, _, last = qualname.rpartition(".")
        top = qualname.split(".")[0]
        if top in _HOST_ROOTS:
            if qualname in _NUMPY_DISPATCH and args:
                handed = self.eval(args[0], lookup)
                if handed is not None and handed.on_device:
                    return handed  # `np.squeeze(t)` runs `t.squeeze()`: a tensor, where `t` is
            return Fact("host", qualname)
        if qualname.startswith(_TENSOR_IN_TENSOR_OUT) and args:
            # `torchvision.utils.make_grid(images)`, `torchvision.ops.nms(boxes, scores, t)`:
            # computed where the first tensor it is given lives
            handed = self.eval(args[0], lookup)
            return handed if handed is not None and handed.on_device else None
        if top != "torch":
            return self.project_call(node, qualname, args, lookup)
        if (
            qualname == "torch.Size"
            or (root == "torch" and last in TORCH_QUERIES)
            or qualname.startswith("torch.utils.benchmark.")
        ):
            # a shape, `torch.Size([*lead, *spec.shape])`: ints; a benchmark `Timer`, whatever
            # its `globals=` hold, measures on the host (`timer.blocked_autorange()`)
            return Fact("host", qualname)
        if last == "DataLoader" and _collates_to_device(node, self.node):
            return Fact(
                "device",
                _short(self.facts.segment(node)),
                f"placed by its `collate_fn` at line {node.lineno}",
            )
        if qualname == "torch.load":
            where = next((kw.value for kw in node.keywords if kw.arg == "map_location"), None)
            if where is None and len(node.args) > 1:
                where = node.args[1]
            if _is_cpu(where) or _keeps_storage(where):  # `map_location="cpu"`: host tensors
                return Fact("host", _short(self.facts.segment(node)))
        device = next((kw.value for kw in node.keywords if kw.arg == "device"), None)
        if root == "torch.cuda" and last.endswith("Tensor") and device is None:
            # `torch.cuda.FloatTensor(n)`: a legacy constructor of the current CUDA device
            return Fact(
                "device",
                _short(self.facts.segment(node)),
                f"created on the current CUDA device at line {node.lineno}",
            )
        if last in _FACTORIES or root == "torch.cuda" or last == "device":
            if device is not None and not self.cpu_target(device):
                if isinstance(device, ast.Attribute) and device.attr == "device":
                    fact = self.eval(device.value, lookup)  # device=x.device: follows x
                    if fact is not None:
                        return fact
                return Fact(
                    "device",
                    _short(self.facts.segment(node)),
                    f"created on `{_short(self.facts.segment(device), 24)}` at line {node.lineno}",
                )
            if last.endswith("_like") and node.args:
                return self.eval(node.args[0], lookup)
            if last in _FACTORIES:
                return Fact("host", _short(self.facts.segment(node)))
            return None
        facts = [self.eval(arg, lookup) for arg in args]
        found = _any_device(facts) if facts else None
        if found is None and facts and facts[0] is not None and node.args:
            # `torch.kthvalue(rand_vals, k)` of a host tensor: the op runs where its tensor
            # is, whatever the other arguments (a size, a count) turn out to be
            found = facts[0]
        if (found is None or not found.on_device) and last in _GRAD_NORMS and node.args:
            ran = self.ran_on_device(node.args[0])
            return ran if ran is not None else found
        return _many(found) if last in _SPLITS and root == "torch" else found

    def ran_on_device(self, params: ast.expr) -> Fact | None:
        """``clip_grad_norm_(model.parameters(), ...)`` in a function that runs ``model`` on
        device inputs (``loss = model(**batch)``, the batch moved by a helper): the norm of
        gradients that live where the module ran, whatever placed it."""
        if not (
            isinstance(params, ast.Call)
            and isinstance(params.func, ast.Attribute)
            and params.func.attr == "parameters"
        ):
            return None
        owner = dotted_name(params.func.value)
        if owner is None:
            return None
        for sub in own_nodes(self.node):
            if not (isinstance(sub, ast.Call) and dotted_name(sub.func) == owner):
                continue
            lookup = self.at(sub.lineno)
            for arg in [*sub.args, *(kw.value for kw in sub.keywords)]:
                value = arg.value if isinstance(arg, ast.Starred) else arg
                fact = self.eval(value, lookup)
                if fact is not None and fact.on_device:
                    return Fact("device", f"{owner}'s gradient norm", _ran(fact))
        return None

    # -- queries ----------------------------------------------------------------------------
    def at(self, line: int) -> Lookup:
        """A lookup of names as bound before ``line`` (else as bound anywhere: loop-carried)."""

        def lookup(name: str) -> Fact | None:
            found = self.bindings.get(name)
            if not found:
                if name in self.seeds:
                    return self.seeds[name]
                return self.facts.outer_fact(self.node, name)
            best: Fact | None = None
            seen = False
            best_line = 0
            for bound_line, fact in found:
                if bound_line < line and not self.exclusive(bound_line, line):
                    best, seen, best_line = fact, True, bound_line
            if not seen and name in self.seeds and name in _parameters(self.node):
                # `lengths = lengths.cpu()` of a device argument: the read sees the argument,
                # unless a later binding in a loop around it reaches it from the previous step
                return self.carried(found, 0, line) or self.seeds[name]
            last = found[-1][1]
            if not seen and name in _parameters(self.node) and last is not None and last.on_device:
                # `label = torch.tensor([label]).to(device)`: the argument, before its move
                return self.carried(found, 0, line)
            if not seen:
                return found[-1][1]
            if best is None or not best.on_device:
                carried = self.carried(found, best_line, line)
                if carried is not None:
                    return carried
            return best

        return lookup

    def carried(self, found: list[tuple[int, Fact | None]], before: int, line: int) -> Fact | None:
        """A device value that a binding later in a loop around ``line`` leaves for the next
        step, when the binding that reaches ``line`` in order (at ``before``) is outside that
        loop: ``history = None`` before a decoding loop, then ``history = token`` at its end,
        reaches the reads at the top of the loop from the second step on."""
        for first, last in sorted(self.loops, key=lambda span: span[1] - span[0]):
            if not first < line <= last:
                continue
            if first <= before:
                return None  # bound inside this loop, before `line`: each step starts there
            later = [f for bound, f in found if line <= bound <= last]
            if later and later[-1] is not None and later[-1].on_device:
                return later[-1]
        return None

    def exclusive(self, bound: int, line: int) -> bool:
        """A binding at line ``bound`` in an ``if`` body cannot reach ``line`` in its ``else``
        (``if isinstance(v, Tensor): v = v.to(device)`` / ``else: float(v)``)."""
        return any(
            body[0] <= bound <= body[1] and other[0] <= line <= other[1]
            for body, other in self.apart
        )


_TENSOR_KINDS = frozenset({"pt", "np"})
#: NumPy functions that, handed a tensor, call the tensor's own method of that name and hand
#: back a tensor where it lives (``np.squeeze(t)`` is ``t.squeeze()``), not a host array
_NUMPY_DISPATCH = frozenset(
    {"numpy.squeeze", "numpy.reshape", "numpy.transpose", "numpy.round", "numpy.argmax"}
)


def _collates_to_device(loader: ast.Call, scope: ast.AST) -> bool:
    """A ``DataLoader`` whose ``collate_fn`` puts each batch on the device: a partial given
    the device, ``functools.partial(make_batch, device="cuda:0")``, or a lambda that moves
    what it collates, ``lambda b: to_device(collate(b), device)``, also through the one name
    ``scope`` binds to either."""
    value = next((kw.value for kw in loader.keywords if kw.arg == "collate_fn"), None)
    if isinstance(value, ast.Name):
        bound = [
            node.value
            for node in own_nodes(scope)
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == value.id for t in node.targets)
        ]
        value = bound[0] if len(bound) == 1 else None
    if isinstance(value, ast.Call):
        name = dotted_name(value.func) or ""
        return name.rpartition(".")[2] == "partial" and _passes_device(value)
    if isinstance(value, ast.Lambda):
        return any(
            isinstance(sub, ast.Call)
            and (
                (moves_to_device(sub) and not _is_cpu(_device_target(sub)))
                or _passes_device(sub)
                or _device_helper(dotted_name(sub.func) or "", sub.args)
            )
            for sub in walk(value.body)
        )
    return False


# Calls that step through what they wrap unchanged: `list(enumerate(x))`, `tqdm(zip(a, b))`.
_PASS_THROUGH = frozenset({"list", "tuple", "tqdm", "tqdm.tqdm"})


def _parameters(node: ast.AST) -> frozenset[str]:
    """The names a function's parameters bind (none for a module or a class)."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return frozenset()
    args = node.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
    return frozenset(a.arg for a in every if a is not None)


def _preprocessor_of_loader(func: ast.expr, called: Fact) -> bool:
    """``txt_processors["eval"](text)``, ``tokenizer(text)``: a value named as a tokenizer or a
    processor (also one entry of a dict of them), known to be on the device only because a
    loader given the device handed it back beside the model (``model, vis_processors,
    txt_processors = load_model_and_preprocess(name, device=device)``). Preprocessors work on
    the host; a module the code itself moved stays a model, whatever its name."""
    if called.move is None or not called.move.startswith("placed by"):
        return False
    while isinstance(func, ast.Subscript):
        func = func.value
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    lowered = name.lower()
    return any(word in lowered for word in ("tokenizer", "processor"))


#: torch functions that answer from a tensor's metadata or types, on the host
#: (``torch.numel(layer.weight)``, ``torch.is_tensor(x)``): no device value comes back
TORCH_QUERIES = frozenset(
    {"numel", "is_tensor", "is_floating_point", "is_complex", "is_storage", "typename"}
    | {"get_device", "result_type", "promote_types", "can_cast", "is_same_size"}
)


def encodes_text(call: ast.Call) -> bool:
    """``tokenizer(texts, return_tensors="pt")``, ``self.processing_class(text=...,
    return_tensors="pt")``: a tokenizer or processor builds its tensors on the host; only a
    ``.to(device)`` of the result (a separate call) moves them."""
    return any(
        kw.arg == "return_tensors"
        and isinstance(kw.value, ast.Constant)
        and kw.value.value in _TENSOR_KINDS
        for kw in call.keywords
    ) and not any(kw.arg == "device" for kw in call.keywords)


def _dataset_method(func: ast.Attribute) -> bool:
    """``eval_dataset.dataset.evaluation(...)``, ``self.val_dataset.evaluate(...)``: a scoring
    method of an object named as a dataset, which scores on the host (its ``transform_batch``
    may move the batch)."""
    owner = (dotted_name(func.value) or "").rsplit(".", 1)[-1].lower()
    return owner.endswith(("dataset", "_ds")) and func.attr.startswith(_SCORING)


# What a dataset's scoring methods are named for (not `transform_batch`, which may move).
_SCORING = ("eval", "score", "compute_metric", "metric")


def _returns_tuples(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Every ``return`` of ``function`` hands back a tuple display of several values."""
    returns = [r.value for r in own_nodes(function) if isinstance(r, ast.Return)]
    return bool(returns) and all(
        isinstance(value, ast.Tuple) and len(value.elts) > 1 for value in returns
    )


# `z.split(batch_gpu)`, `x.chunk(n)`: a tuple of whole tensors, a few per batch, not its rows.
_SPLITS = frozenset({"split", "chunk", "tensor_split"})
#: torch functions that hand back the norm of the gradients of the parameters they are given
_GRAD_NORMS = frozenset({"clip_grad_norm_", "clip_grad_norm", "get_total_norm"})
# Methods that copy a tensor to the host as a tensor or an array (not as Python numbers:
# `loss.item() * scale` may be a device tensor again)
_HOST_COPIES = frozenset({"cpu", "numpy"})


_PATHS = frozenset({"pathlib.Path", "pathlib.PurePath", "pathlib.PosixPath", "pathlib.WindowsPath"})


def _a_path(node: ast.expr, facts: FileFacts) -> bool:
    """``Path(root)``, also divided on (``Path(root) / "a"``): a ``pathlib`` path."""
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        node = node.left
    return isinstance(node, ast.Call) and facts.qualname(node.func) in _PATHS


def _keeps_storage(node: ast.expr | None) -> bool:
    """``map_location=lambda storage, loc: storage``: each storage stays where it was
    deserialized, on the CPU."""
    return (
        isinstance(node, ast.Lambda)
        and bool(node.args.args)
        and isinstance(node.body, ast.Name)
        and node.body.id == node.args.args[0].arg
    )


def _numpy_alias(func: ast.Attribute) -> bool:
    """``np.ceil``, ``numpy.linalg.norm``: NumPy under its usual names, when the file gets it
    through a star import (``from utils import *``) the resolver cannot follow."""
    root: ast.expr = func
    while isinstance(root, ast.Attribute):
        root = root.value
    return isinstance(root, ast.Name) and root.id in {"np", "numpy"}


def _not_a_tensor_there(node: ast.IfExp) -> bool:
    """``v.item() if isinstance(v, torch.Tensor) else v``: the ``else`` hands back ``v`` only
    when it is not a tensor (a Python number), whatever ``v`` was bound to."""
    tested, orelse = isinstance_test(node.test), node.orelse
    return (
        isinstance(orelse, ast.Name)
        and tested is not None
        and tested[0] == orelse.id
        and any(
            (isinstance(sub, ast.Name) and sub.id == "Tensor")
            or (isinstance(sub, ast.Attribute) and sub.attr == "Tensor")
            for kind in tested[1]
            for sub in walk(kind)
        )
    )


def _cuda_type(qualname: str, line: int) -> Fact | None:
    """``torch.cuda.HalfTensor``: a CUDA tensor type, which ``x.type(T)`` casts *and moves* to
    (``x.type(T)`` then follows it as an argument does). Other module constants: nothing."""
    module, _, last = qualname.rpartition(".")
    if module == "torch.cuda" and last.endswith("Tensor"):
        return Fact("device", qualname, f"cast to the CUDA type `{qualname}` at line {line}")
    return None


#: ``(line, after the if, after its body, after its else)`` of a name an ``if`` rebound
_Guarded = tuple[int, "Fact | None", "Fact | None", "Fact | None"]

# Calls whose answer does not change while a function runs: a test of them repeats itself.
_STEADY_QUERIES = frozenset(
    {"torch.cuda.is_available", "torch.backends.mps.is_available", "torch.xpu.is_available"}
)


def _guard_key(test: ast.expr, qualname: Callable[[ast.expr], str | None]) -> str | None:
    """The text of an ``if`` test that says the same on each evaluation while nothing it
    names is rebound (names, attributes, constants, ``not``, ``and``/``or``, comparisons,
    ``torch.cuda.is_available()``); None for one that calls or indexes anything else."""
    for sub in walk(test):
        if isinstance(sub, ast.Call):
            if sub.args or sub.keywords or qualname(sub.func) not in _STEADY_QUERIES:
                return None
        elif not isinstance(
            sub,
            (
                ast.Name,
                ast.Attribute,
                ast.Constant,
                ast.UnaryOp,
                ast.BoolOp,
                ast.Compare,
                ast.expr_context,
                ast.boolop,
                ast.unaryop,
                ast.cmpop,
            ),
        ):
            return None
    return ast.dump(test)


def _span(body: list[ast.stmt]) -> tuple[int, int]:
    return body[0].lineno, body[-1].end_lineno or body[-1].lineno


# Attributes and methods that say where a tensor lives (`x.is_cuda`, `x.device.type`).
_DEVICE_QUERIES = frozenset({"device", "is_cuda", "is_cpu", "is_mps", "is_xpu", "get_device"})


def _inspects_device(test: ast.expr) -> set[str]:
    """The names whose own device a branch test asks about (``x.is_cuda``,
    ``x.device.type != "cpu"``, ``x.get_device() >= 0``)."""
    return {
        sub.value.id
        for sub in walk(test)
        if isinstance(sub, ast.Attribute)
        and sub.attr in _DEVICE_QUERIES
        and isinstance(sub.value, ast.Name)
    }


def zip_pairs(iterable: ast.expr, target: ast.expr) -> list[tuple[ast.expr, ast.expr]] | None:
    """``for a, b in zip(xs, ys)``: each target with the sequence it comes from (one target
    per sequence, no ``*`` on either side), else None. Also ``for name, m in (("VAE", vae),
    ("VAR", var))``: each target with the column of the rows it takes."""
    rows = _display_rows(iterable, target)
    if rows is not None:
        return rows
    if not (
        isinstance(iterable, ast.Call)
        and isinstance(iterable.func, ast.Name)
        and iterable.func.id == "zip"
        and isinstance(target, ast.Tuple)
        and len(target.elts) == len(iterable.args)
    ):
        return None
    pairs = list(zip(target.elts, iterable.args, strict=True))
    if any(isinstance(n, ast.Starred) for pair in pairs for n in pair):
        return None
    return pairs


# Libraries whose functions compute a tensor where the tensors they are given live.
_TENSOR_IN_TENSOR_OUT = ("torchvision.utils.make_grid", "torchvision.ops.")


def _registry_call(func: ast.expr, facts: FileFacts) -> bool:
    """``registry[key]`` with ``registry`` bound at the module's top level, once, to a dict
    display whose every value names a function of the file (``loss_registry = {"simple":
    noise_estimation_loss}``), or imported from a module of the linted tree that does."""
    if not (isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name)):
        return False
    name = func.value.id
    qualname = facts.qualname(func.value)
    if qualname is not None and "." in qualname:
        # `from functions.losses import loss_registry`: the registry of that module
        module, _, name = qualname.rpartition(".")
        other = facts.module_facts(module)
        if other is None or other is facts:
            return False
        facts = other
    values = [
        stmt.value
        for stmt in facts.tree.body
        if isinstance(stmt, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
    ]
    if len(values) != 1 or not isinstance(values[0], ast.Dict) or not values[0].values:
        return False
    return all(isinstance(v, ast.Name) and v.id in facts.defs for v in values[0].values)


def _display_rows(iterable: ast.expr, target: ast.expr) -> list[tuple[ast.expr, ast.expr]] | None:
    """A tuple or list display of tuple displays as wide as the target, each target paired
    with a display of its column (no ``*`` anywhere)."""
    if not (
        isinstance(iterable, (ast.Tuple, ast.List))
        and iterable.elts
        and isinstance(target, ast.Tuple)
        and not any(isinstance(elt, ast.Starred) for elt in target.elts)
        and all(
            isinstance(row, ast.Tuple)
            and len(row.elts) == len(target.elts)
            and not any(isinstance(elt, ast.Starred) for elt in row.elts)
            for row in iterable.elts
        )
    ):
        return None
    rows = [row.elts for row in iterable.elts if isinstance(row, ast.Tuple)]
    columns = [
        ast.copy_location(ast.Tuple(elts=list(column), ctx=ast.Load()), iterable)
        for column in zip(*rows, strict=True)
    ]
    return list(zip(target.elts, columns, strict=True))


def _accelerator(node: ast.expr) -> bool:
    """``accelerator``, ``self.accelerator``, ``accel``: a name for an Accelerate accelerator."""
    last = (dotted_name(node) or "").rpartition(".")[2].lower()
    return "accelerator" in last or last == "accel"
