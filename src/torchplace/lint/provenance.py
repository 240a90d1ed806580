"""Device provenance: which values live on a device, which on the host, which loops step
through batches.

The rules ask three questions of a file, all answered here from evidence in the code:

- **Where does a value live?** :meth:`FileFacts.fact` evaluates an expression at a line of its
  function: a :class:`Fact` says ``"device"`` (a result of ``.to(device)``/``.cuda()``, a
  factory given ``device=``, a call of a moved model, arithmetic, losses and methods of such
  values, a batch that was moved) or ``"host"`` (a Python number, ``.item()``/``.cpu()``
  results, NumPy, a factory without ``device=``), and where it came from. ``None`` means
  nothing in the code says. Moving data to a ``device`` variable is evidence even when that
  variable may hold the CPU at run time: the code is written for a device.
- **Which loop steps through batches?** :meth:`FileFacts.loop_kind` classifies a loop by its
  own statements: ``"batch"`` when it calls ``.backward()``/an optimizer step, moves what it
  iterates to a device, runs a moved model or calls a training step; ``"rows"`` when it iterates
  a device value element by element. A loop whose batch evidence is all inside a nested loop
  (or a called function that has its own batch loop) runs once per epoch.
- **Who runs per batch?** :meth:`FileFacts.per_batch` says whether a function runs once per
  batch (a training-framework step hook, a function called inside a batch loop of the file, or
  one called by such a function) and what its parameters hold at those calls.

Facts are computed on first use for one function at a time and cached; files are read once
per process (:func:`facts_for_file`).
"""

from __future__ import annotations

import ast
import bisect
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from torchplace.lint.base import Context
from torchplace.lint.resolver import Resolver, dotted_name, module_name_for

__all__ = [
    "Fact",
    "FileFacts",
    "LoopKind",
    "PerBatch",
    "facts_for_file",
    "file_facts",
    "is_device_expr",
    "moves_to_device",
    "scope_node",
]

Where = Literal["device", "host"]
LoopKind = Literal["batch", "rows", "items"]
_Lookup = Callable[[str], "Fact | None"]
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_COMPS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)

# Methods whose result lives on the host whatever the receiver (reads, shapes, metadata).
HOST_METHODS = frozenset(
    {
        "item",
        "tolist",
        "numpy",
        "cpu",
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "get_device",
        "data_ptr",
        "element_size",
        "stride",
        "is_contiguous",
        "is_floating_point",
        "storage_offset",
        "keys",
        "train",
        "eval",
        "zero_grad",
        "backward",
        "step",
        "register_buffer",
        "append",
        "extend",
        "update",
        "add_scalar",
        "log",
    }
)
HOST_ATTRS = frozenset(
    {
        "shape",
        "device",
        "dtype",
        "ndim",
        "is_cuda",
        "requires_grad",
        "layout",
        "training",
        "type",
        "index",
        "name",
    }
)
# Builtins and modules whose results live on the host.
_HOST_CALLS = frozenset(
    {"float", "int", "bool", "str", "len", "round", "isinstance", "range", "repr", "print"}
)
_HOST_ROOTS = frozenset({"numpy", "math", "random", "time", "os", "json", "pandas", "PIL"})
_FOLLOW_CALLS = frozenset(
    {"sum", "max", "min", "abs", "list", "tuple", "zip", "enumerate", "reversed", "sorted", "iter"}
)
_FACTORIES = frozenset(
    {
        "zeros",
        "ones",
        "empty",
        "full",
        "arange",
        "tensor",
        "as_tensor",
        "rand",
        "randn",
        "randint",
        "randperm",
        "eye",
        "linspace",
        "logspace",
        "from_numpy",
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
        "rand_like",
        "randn_like",
    }
)
# Methods a training framework calls once per batch, with the batch already on the device.
_STEP_HOOKS = frozenset({"training_step", "validation_step", "test_step", "predict_step"})
# Iterating these yields parameters, buffers or state: a conversion pass, not batches.
_STATE_ITERS = ("state_dict", "parameters", "buffers", "named_", "modules", "children")


@dataclass(frozen=True, slots=True)
class Fact:
    """Where a value lives, and why we think so.

    ``name`` is the variable it was read from (if any), ``source`` the text it was computed
    from, ``move`` the evidence at its root (``"`data` moved to `device` at line 41"``), and
    ``direct`` whether ``source`` is that move itself.
    """

    where: Where
    source: str
    move: str | None = None
    name: str | None = None
    direct: bool = False
    many: bool = False  # a list or tuple of such values (iterating it yields one each)

    @property
    def on_device(self) -> bool:
        return self.where == "device"

    @property
    def moved(self) -> bool:
        """On the device by a move, a factory given a device, or a run of a moved model (not
        only because a device was passed to some helper)."""
        return self.on_device and self.move is not None and not self.move.startswith("placed by")

    def describe(self) -> str:
        """``"`loss` comes from `model(data)`, `model` moved to `device` at line 58"``."""
        if self.name is not None and self.direct and self.move is not None:
            return self.move
        subject = f"`{self.name}` comes from `{self.source}`" if self.name else f"`{self.source}`"
        if self.move is None:
            return subject + (" is on the device" if not self.name else "")
        return f"{subject}, {self.move}" if self.name else f"{subject}: {self.move}"


def _short(text: str | None, limit: int = 48) -> str:
    text = " ".join((text or "?").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def moves_to_device(call: ast.Call, qualname: object = None) -> bool:
    """Whether a ``.to(...)``/``.cuda(...)`` call changes device (not only the dtype).

    ``qualname`` resolves an expression to its imported dotted name (a callable), so that
    ``.to(torch.float16)`` reads as a dtype.
    """
    func = call.func
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr == "cuda":
        return True
    if func.attr != "to":
        return False
    if any(kw.arg == "device" for kw in call.keywords):
        return True
    if not call.args:
        return False
    first = call.args[0]
    name = qualname(first) if callable(qualname) else dotted_name(first)
    if isinstance(name, str) and name.startswith("torch.") and not name.startswith("torch.device"):
        return False  # torch.float16 and friends: a dtype
    if isinstance(first, ast.Attribute) and "dtype" in first.attr:
        return False
    if isinstance(first, ast.Name) and "dtype" in first.id:
        return False
    return not (isinstance(first, ast.Constant) and not isinstance(first.value, str))


def _device_target(call: ast.Call) -> ast.expr | None:
    if call.args:
        return call.args[0]
    for kw in call.keywords:
        if kw.arg == "device":
            return kw.value
    return None


def _is_cpu(node: ast.expr | None) -> bool:
    if isinstance(node, ast.Constant):
        return node.value == "cpu"
    if isinstance(node, ast.Call) and node.args:  # torch.device("cpu")
        return _is_cpu(node.args[0])
    return False


def is_device_expr(node: ast.expr) -> bool:
    """A name that holds a device by what it is called: ``device``, ``args.device``, ``rank``."""
    text = dotted_name(node)
    if text is None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value.split(":")[0] in {"cuda", "mps", "xpu", "hpu", "npu"}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            return node.func.attr in {"device", "current_device", "dev", "get_device"}
        return False
    last = text.rsplit(".", 1)[-1].lower()
    return "device" in last or last in {"gpu", "rank", "local_rank", "gpu_id", "dev"}


class _Flow:
    """Facts of one scope's names: ``bindings[name]`` lists ``(line, fact)`` in source order."""

    __slots__ = ("bindings", "facts", "node", "seeds", "state")

    def __init__(self, facts: FileFacts, node: ast.AST, seeds: dict[str, Fact]) -> None:
        self.facts = facts
        self.node = node
        self.seeds = seeds
        self.state: dict[str, Fact | None] = dict(seeds)
        self.bindings: dict[str, list[tuple[int, Fact | None]]] = {}

    # -- the in-order pass ------------------------------------------------------------------
    def run(self) -> None:
        body = getattr(self.node, "body", [])
        self.block(body)

    def block(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self.stmt(stmt)

    def bind(self, target: ast.expr, fact: Fact | None, line: int, value: ast.expr | None) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            elts = value.elts if isinstance(value, (ast.Tuple, ast.List)) else None
            for index, elt in enumerate(target.elts):
                if elts is not None and len(elts) == len(target.elts):
                    self.bind(elt, self.eval(elts[index], self.current), line, elts[index])
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
            fact = Fact(
                fact.where,
                _short(self.facts.segment(value)) if value is not None else fact.source,
                fact.move,
                name,
                direct,
                fact.many,
            )
        self.state[name] = fact
        self.bindings.setdefault(name, []).append((line, fact))

    def current(self, name: str) -> Fact | None:
        if name in self.state:
            return self.state[name]
        return self.facts.outer_fact(self.node, name)

    def stmt(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Assign):
            fact = self.eval(node.value, self.current)
            for target in node.targets:
                self.bind(target, fact, node.lineno, node.value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self.bind(node.target, self.eval(node.value, self.current), node.lineno, node.value)
        elif isinstance(node, ast.AugAssign):
            old = (
                self.eval(node.target, self.current)
                if not isinstance(node.target, ast.Subscript)
                else None
            )
            new = self.eval(node.value, self.current)
            fact = _join(old, new) if old is not None else new
            if old is not None and old.where == "host" and new is not None and new.on_device:
                fact = new
            self.bind(node.target, fact, node.lineno, node.value)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            call = node.value
            func = call.func
            # `model.to(device)` / `model.cuda()` as a statement moves a module in place.
            if (
                isinstance(func, ast.Attribute)
                and _is_move_call(call)
                and moves_to_device(call, self.facts.qualname)
                and dotted_name(func.value) is not None
                and not _is_cpu(_device_target(call))
            ):
                self.bind(func.value, self.facts.move_fact(call, func.value), node.lineno, call)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            iter_fact = self.eval(node.iter, self.current)
            if iter_fact is None and self.facts.moves_some(node):
                # A batch loop moves some of its items: the others stay on the host.
                iter_fact = Fact("host", "a batch item that is never moved")
            for _ in range(2):  # twice: values carried from one step to the next
                self.bind_loop_target(node.target, node.iter, iter_fact, node.lineno)
                self.block(node.body)
            self.block(node.orelse)
        elif isinstance(node, ast.While):
            for _ in range(2):
                self.block(node.body)
            self.block(node.orelse)
        elif isinstance(node, ast.If):
            self.block(node.body)
            self.block(node.orelse)
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

    def bind_loop_target(
        self, target: ast.expr, iterable: ast.expr, fact: Fact | None, line: int
    ) -> None:
        # `for i, (x, y) in enumerate(loader)`: the counter is a host int.
        if (
            isinstance(iterable, ast.Call)
            and isinstance(iterable.func, ast.Name)
            and iterable.func.id == "enumerate"
            and isinstance(target, ast.Tuple)
            and len(target.elts) == 2
        ):
            self.bind(target.elts[0], Fact("host", "enumerate"), line, None)
            self.bind(target.elts[1], fact, line, None)
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
    def eval(self, node: ast.expr, lookup: _Lookup) -> Fact | None:
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
            name = dotted_name(node)
            if name is not None:
                fact = lookup(name)
                if fact is not None:
                    return fact
                if name.startswith("self."):
                    return facts.self_attr_fact(self.node, name)
            if facts.qualname(node) is not None:
                return None  # torch.float16, np.pi: a module constant
            return self.eval(node.value, lookup)
        if isinstance(node, ast.Subscript):
            return _one(self.eval(node.value, lookup))
        if isinstance(node, ast.Starred):
            return self.eval(node.value, lookup)
        if isinstance(node, ast.Await):
            return self.eval(node.value, lookup)
        if isinstance(node, ast.NamedExpr):
            fact = self.eval(node.value, lookup)
            self.bind(node.target, fact, node.lineno, node.value)
            return fact
        if isinstance(node, ast.BinOp):
            return _join(self.eval(node.left, lookup), self.eval(node.right, lookup))
        if isinstance(node, ast.UnaryOp):
            return self.eval(node.operand, lookup)
        if isinstance(node, ast.Compare):
            fact = self.eval(node.left, lookup)
            for other in node.comparators:
                fact = _join(fact, self.eval(other, lookup))
            if fact is not None and not fact.on_device:
                return Fact("host", "comparison")
            return fact
        if isinstance(node, ast.IfExp):
            return _either(self.eval(node.body, lookup), self.eval(node.orelse, lookup))
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

    def comprehension(self, node: ast.expr, lookup: _Lookup) -> Fact | None:
        assert isinstance(node, _COMPS)
        local: dict[str, Fact | None] = {}

        def inner(name: str) -> Fact | None:
            return local[name] if name in local else lookup(name)

        for gen in node.generators:
            fact = self.eval(gen.iter, inner)
            items = _iterates_items(gen.iter)
            targets = gen.target.elts if isinstance(gen.target, ast.Tuple) else [gen.target]
            for index, target in enumerate(targets):
                for name in _target_names(target):
                    if items and index == 0 and len(targets) == 2:
                        local[name] = Fact("host", "key")
                    else:
                        local[name] = _one(fact)
        if isinstance(node, ast.DictComp):
            return self.eval(node.value, inner)
        return self.eval(node.elt, inner)

    def call(self, node: ast.Call, lookup: _Lookup) -> Fact | None:
        facts = self.facts
        func = node.func
        args = [*node.args, *(kw.value for kw in node.keywords)]
        if isinstance(func, ast.Attribute):
            method = func.attr
            if _is_move_call(node):
                if _is_cpu(_device_target(node)):
                    return Fact("host", _short(facts.segment(node)))
                if moves_to_device(node, facts.qualname):
                    return facts.move_fact(node, func.value)
                return self.eval(func.value, lookup)  # .to(torch.float16)
            qualname = facts.qualname(func)
            if qualname is not None:
                return self.torch_call(node, qualname, args, lookup)
            if method in HOST_METHODS:
                return Fact("host", method)
            receiver = self.eval(func.value, lookup)
            if receiver is not None and receiver.on_device:
                return receiver
            arg_facts = [self.eval(arg, lookup) for arg in args]
            found = _any_device(arg_facts)
            if found is not None and found.on_device:
                return found
            if receiver is not None and receiver.where == "host":
                return Fact("host", method)
            if _device_helper(method, args) or _passes_device(node):
                return Fact("device", _short(facts.segment(node)), _moved_by(node, facts))
            return None
        if isinstance(func, ast.Name):
            name = func.id
            qualname = facts.qualname(func)
            if qualname is not None and qualname.split(".")[0] in {"torch", *_HOST_ROOTS}:
                return self.torch_call(node, qualname, args, lookup)
            if name in _HOST_CALLS:
                return Fact("host", name)
            called = lookup(name)
            if called is not None and called.on_device:  # a moved model, run
                return Fact("device", _short(facts.segment(node)), _ran(called), called.name)
            arg_facts = [self.eval(arg, lookup) for arg in args]
            found = _any_device(arg_facts)
            if found is not None and found.on_device:
                return found
            if (
                name in _FOLLOW_CALLS
                and arg_facts
                and all(f is not None and f.where == "host" for f in arg_facts)
            ):
                return Fact("host", name)
            if facts.returns_host(name):
                return Fact("host", name)
            if _device_helper(name, args) or _passes_device(node):
                return Fact("device", _short(facts.segment(node)), _moved_by(node, facts))
            return None
        called = self.eval(func, lookup)
        if called is not None and called.on_device:
            return Fact("device", _short(facts.segment(node)), _ran(called), called.name)
        return None

    def torch_call(
        self, node: ast.Call, qualname: str, args: list[ast.expr], lookup: _Lookup
    ) -> Fact | None:
        root, _, last = qualname.rpartition(".")
        top = qualname.split(".")[0]
        if top in _HOST_ROOTS:
            return Fact("host", qualname)
        if top != "torch":
            return None
        device = next((kw.value for kw in node.keywords if kw.arg == "device"), None)
        if last in _FACTORIES or root == "torch.cuda" or last == "device":
            if device is not None and not _is_cpu(device):
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
        return _any_device(facts) if facts else None

    # -- queries ----------------------------------------------------------------------------
    def at(self, line: int) -> _Lookup:
        """A lookup of names as bound before ``line`` (else as bound anywhere: loop-carried)."""

        def lookup(name: str) -> Fact | None:
            found = self.bindings.get(name)
            if not found:
                if name in self.seeds:
                    return self.seeds[name]
                return self.facts.outer_fact(self.node, name)
            best: Fact | None = None
            seen = False
            for bound_line, fact in found:
                if bound_line < line:
                    best, seen = fact, True
            return best if seen else found[-1][1]

        return lookup


def _target_names(target: ast.expr) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _places_self(method: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A method that may put a ``self.`` attribute on a device: it moves, runs or builds on
    a device somewhere (checked on the statements' text-free structure, no flow needed)."""
    for sub in ast.walk(method):
        if isinstance(sub, ast.Call):
            func = sub.func
            if isinstance(func, ast.Attribute) and func.attr in {"to", "cuda"}:
                return True
            if any(kw.arg == "device" for kw in sub.keywords):
                return True
    return False


def _plainly_host(value: ast.expr) -> bool:
    """``loss.item()``, ``float(x)``, ``x.tolist()``, a literal: host, whatever ``x`` is."""
    if isinstance(value, ast.Constant):
        return True
    if isinstance(value, (ast.Tuple, ast.List)):
        return bool(value.elts) and all(_plainly_host(e) for e in value.elts)
    if isinstance(value, ast.BinOp):
        return _plainly_host(value.left) and _plainly_host(value.right)
    if isinstance(value, ast.Call):
        func = value.func
        if isinstance(func, ast.Attribute):
            return func.attr in {"item", "tolist", "numpy"}
        return isinstance(func, ast.Name) and func.id in {"float", "int", "bool", "len", "str"}
    return False


def _moves_some(loop: ast.For | ast.AsyncFor) -> bool:
    """The loop moves one of its own targets to a device (``x = x.to(device)``)."""
    targets = set(_target_names(loop.target))
    for stmt in loop.body:
        for sub in ast.walk(stmt):
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in {"to", "cuda"}
                and isinstance(sub.func.value, ast.Name)
                and sub.func.value.id in targets
            ):
                return True
    return False


def _iterates_items(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "items"
    )


def _is_move_call(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr in {"to", "cuda"}


def _device_helper(name: str, args: list[ast.expr]) -> bool:
    """``to_device(batch, device)``, ``move_to_cuda(x)``: a project's own transfer helper."""
    lowered = name.lower()
    if not any(word in lowered for word in ("device", "cuda", "gpu")):
        return False
    if lowered.startswith(("get_", "is_", "set_", "init", "setup")) or "cpu" in lowered:
        return False
    return bool(args) and (
        "cuda" in lowered or "gpu" in lowered or any(is_device_expr(arg) for arg in args)
    )


def _ran(model: Fact) -> str | None:
    """The evidence for the output of running a model that is on the device."""
    if model.move is not None and model.move.startswith("placed by"):
        return f"the model was {model.move}"
    return model.move


def _passes_device(call: ast.Call) -> bool:
    """``make_steps(n, device)``, ``sample(shape, device=dev)``: built where it is told."""
    name = (dotted_name(call.func) or "").rsplit(".", 1)[-1].lower()
    if name.startswith(("get_device", "is_", "set_", "init", "setup", "print", "log")):
        return False
    if "cpu" in name or name in {"device", "dev", "str", "repr", "print"}:
        return False
    return any(kw.arg == "device" and not _is_cpu(kw.value) for kw in call.keywords) or any(
        _names_device(arg) for arg in call.args
    )


def _names_device(node: ast.expr) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr in {"dev", "device"} and not node.args
    text = dotted_name(node)
    if text is None:
        return False
    last = text.rsplit(".", 1)[-1].lower()
    return last == "dev" or ("device" in last and not last.endswith(("type", "s", "_id")))


def _moved_by(call: ast.Call, facts: FileFacts) -> str:
    name = dotted_name(call.func) or "a helper"
    return f"placed by `{name}(...)` at line {call.lineno}"


def _many(fact: Fact | None) -> Fact | None:
    if fact is None or fact.many:
        return fact
    return Fact(fact.where, fact.source, fact.move, fact.name, fact.direct, True)


def _one(fact: Fact | None) -> Fact | None:
    if fact is None or not fact.many:
        return fact
    return Fact(fact.where, fact.source, fact.move, fact.name, fact.direct, False)


def _join(a: Fact | None, b: Fact | None) -> Fact | None:
    if a is not None and a.on_device:
        return a
    if b is not None and b.on_device:
        return b
    if a is not None and b is not None:
        return a
    return None


def _either(a: Fact | None, b: Fact | None) -> Fact | None:
    if a is not None and a.on_device:
        return a
    if b is not None and b.on_device:
        return b
    return a if a is not None and b is not None else None


def _any_device(facts: list[Fact | None]) -> Fact | None:
    for fact in facts:
        if fact is not None and fact.on_device:
            return fact
    if facts and all(f is not None for f in facts):
        return facts[0]
    return None


@dataclass(frozen=True, slots=True)
class PerBatch:
    """A function that runs once per batch: why, what its parameters hold, whether it is part
    of a training step (a loop that calls ``.backward()``)."""

    how: str
    seeds: dict[str, Fact]
    trains: bool


class FileFacts:
    """Provenance for one parsed file: flows per function, loop kinds, per-batch callers."""

    def __init__(self, tree: ast.Module, source_lines: list[str], path: str) -> None:
        self.tree = tree
        self.lines = source_lines
        self.path = path
        module, is_package = module_name_for(path) if os.path.isfile(path) else (None, False)
        self.resolver = Resolver(module, is_package=is_package)
        self.defs: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        self.parent: dict[int, ast.AST] = {}
        self._index(tree.body, tree)
        self._flows: dict[int, _Flow | None] = {}
        self._loop_kinds: dict[int, tuple[LoopKind, str] | None] = {}
        self._calls: dict[str, list[tuple[ast.AST, ast.Call, tuple[ast.AST, ...]]]] = {}
        self._per_batch: dict[int, PerBatch | None] = {}
        self._self_attrs: dict[int, dict[str, Fact]] = {}
        self._returns_host: dict[str, bool] = {}
        self._moves: dict[int, bool] = {}
        self._text: str | None = None

    def _index(self, body: list[ast.stmt], owner: ast.AST) -> None:
        """Imports, functions by name, and the def or class enclosing each def or class:
        one pass over statements (expressions are never entered)."""
        for node in body:
            if isinstance(node, ast.Import):
                self.resolver.add_import(node)
            elif isinstance(node, ast.ImportFrom):
                self.resolver.add_import_from(node)
            elif isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
                self.parent[id(node)] = owner
                if isinstance(node, _FUNCTIONS):
                    self.defs.setdefault(node.name, []).append(node)
                self._index(node.body, node)
                continue
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                inner = getattr(node, field, None)
                if inner:
                    for item in inner:
                        if isinstance(item, (ast.ExceptHandler, ast.match_case)):
                            self._index(item.body, owner)
                    self._index([i for i in inner if isinstance(i, ast.stmt)], owner)

    # -- text and names ---------------------------------------------------------------------
    def segment(self, node: ast.AST | None) -> str:
        if node is None:
            return "?"
        first, last = getattr(node, "lineno", 0), getattr(node, "end_lineno", 0)
        col, end = getattr(node, "col_offset", 0), getattr(node, "end_col_offset", 0)
        if not first or first > len(self.lines):
            return "?"
        if first == last:
            return _cut(self.lines[first - 1], col, end)
        return _cut(self.lines[first - 1], col, None) + " ..."

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = "\n".join(self.lines)
        return self._text

    def qualname(self, node: ast.AST) -> str | None:
        return self.resolver.qualname(node)

    def move_fact(self, call: ast.Call, receiver: ast.expr) -> Fact:
        target = _device_target(call)
        where = f"`{_short(self.segment(target), 24)}`" if target is not None else "the GPU"
        what = _short(self.segment(receiver), 24)
        return Fact(
            "device", _short(self.segment(call)), f"`{what}` moved to {where} at line {call.lineno}"
        )

    # -- flows ------------------------------------------------------------------------------
    def flow(self, node: ast.AST, seeds: dict[str, Fact] | None = None) -> _Flow:
        """The flow of a function (or the module), computed once (seeded flows are not cached)."""
        if seeds:
            flow = _Flow(self, node, seeds)
            flow.run()
            return flow
        key = id(node)
        cached = self._flows.get(key)
        if cached is not None:
            return cached
        if key in self._flows:  # being computed (recursion through outer facts)
            return _Flow(self, node, {})
        self._flows[key] = None
        flow = _Flow(self, node, {})
        flow.run()
        self._flows[key] = flow
        return flow

    def scope_of(self, node: ast.AST) -> ast.AST:
        return self.parent.get(id(node), self.tree)

    def outer_fact(self, node: ast.AST, name: str) -> Fact | None:
        """A name a function reads but does not bind: the module's final binding of it."""
        if isinstance(node, ast.Module):
            return None
        if "." in name:
            return None
        module = self.flow(self.tree)
        found = module.bindings.get(name)
        return found[-1][1] if found else None

    def fact(
        self, node: ast.expr, scope: ast.AST, seeds: dict[str, Fact] | None = None
    ) -> Fact | None:
        """Where ``node`` lives, evaluated at its line inside ``scope`` (a function or module)."""
        flow = self.flow(scope, seeds)
        return flow.eval(node, flow.at(getattr(node, "lineno", 0)))

    def self_attr_fact(self, method: ast.AST, name: str) -> Fact | None:
        """``self.model`` in a method: device when any method of the class moves it."""
        cls = self.parent.get(id(method))
        if not isinstance(cls, ast.ClassDef):
            return None
        attrs = self._self_attrs.get(id(cls))
        if attrs is None:
            attrs = self._self_attrs[id(cls)] = {}
            for item in cls.body:
                if isinstance(item, _FUNCTIONS) and _places_self(item):
                    for key, bound in self.flow(item).bindings.items():
                        if key.startswith("self.") and key not in attrs:
                            device = [f for _, f in bound if f is not None and f.on_device]
                            if device:
                                attrs[key] = device[0]
        return attrs.get(name)

    def moves_some(self, loop: ast.For | ast.AsyncFor) -> bool:
        """:func:`_moves_some`, once per loop."""
        key = id(loop)
        cached = self._moves.get(key)
        if cached is None:
            cached = self._moves[key] = _moves_some(loop)
        return cached

    def returns_host(self, name: str) -> bool:
        """A function of this file whose every ``return`` gives a host value (``loss.item()``)."""
        cached = self._returns_host.get(name)
        if cached is not None:
            return cached
        self._returns_host[name] = False
        result = False
        for node in self.defs.get(name, []):
            returns = [r for r in _own_nodes(node.body) if isinstance(r, ast.Return)]
            values = [r.value for r in returns if r.value is not None]
            result = bool(values) and all(_plainly_host(v) for v in values)
        self._returns_host[name] = result
        return result

    # -- loops ------------------------------------------------------------------------------
    def loop_kind(self, loop: ast.AST, scope: ast.AST) -> tuple[LoopKind, str] | None:
        """``("batch"|"rows", evidence)`` for a loop of ``scope``, or None (once per epoch,
        or nothing says it touches a device)."""
        key = id(loop)
        if key in self._loop_kinds:
            return self._loop_kinds[key]
        self._loop_kinds[key] = None
        result = self._classify(loop, scope)
        self._loop_kinds[key] = result
        return result

    def _classify(self, loop: ast.AST, scope: ast.AST) -> tuple[LoopKind, str] | None:
        if isinstance(loop, (ast.For, ast.AsyncFor)):
            iters = [loop.iter]
            body: list[ast.AST] = list(loop.body)
            targets = set(_target_names(loop.target))
        elif isinstance(loop, ast.While):
            iters, body, targets = [], list(loop.body), set()
        elif isinstance(loop, _COMPS):
            iters = [g.iter for g in loop.generators]
            body = [loop.elt] if not isinstance(loop, ast.DictComp) else [loop.key, loop.value]
            targets = {n for g in loop.generators for n in _target_names(g.target)}
        else:
            return None
        for it in iters:
            fact = self.fact(it, scope)
            if fact is not None and fact.on_device:
                return (
                    "items" if fact.many else "rows",
                    f"it iterates `{_short(self.segment(it), 32)}` on the device: "
                    + (fact.describe()),
                )
        if any(word in self.segment(it) for it in iters for word in _STATE_ITERS):
            return None  # a pass over parameters or a state dict: conversion, not batches
        state_iter = False
        own, nested = _split_own(body)
        if isinstance(loop, ast.While):
            targets = {
                name
                for node in own
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                for name in _target_names(t)
            }
        derived = _derived(own, targets)
        nested_batch = any(self.loop_kind(sub, scope) is not None for sub in nested)
        step = None
        for node in own:
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "backward":
                return "batch", "it calls `.backward()` on every step"
            if (
                isinstance(func, ast.Attribute)
                and name in {"step", "zero_grad"}
                and not node.args
                and "sched" not in self.segment(func.value).lower()
            ):
                return "batch", f"it calls `{_short(self.segment(func), 32)}()` on every step"
            if (
                not state_iter
                and derived
                and (
                    (
                        _is_move_call(node)
                        and moves_to_device(node, self.qualname)
                        and not _is_cpu(_device_target(node))
                    )
                    or (name is not None and _device_helper(name, node.args))
                )
            ):
                moved: ast.expr | None = None
                if isinstance(func, ast.Attribute) and _is_move_call(node):
                    moved = func.value
                elif node.args:
                    moved = node.args[0]
                if moved is not None and _names(moved) & derived:
                    what = _short(self.segment(moved), 24)
                    its = "what it iterates" if iters else "what it reads"
                    return "batch", f"it moves {its} to a device (`{what}`, line {node.lineno})"
            if step is None and not nested_batch and name is not None:
                step = self._step_call(node, scope)
        if step is None and not nested_batch and iters:
            step = self._updates_device(own, loop, scope)
        return step

    def _updates_device(
        self, own: list[ast.AST], loop: ast.AST, scope: ast.AST
    ) -> tuple[LoopKind, str] | None:
        """The loop recomputes a device value from its items or its own previous value."""
        targets = (
            set(_target_names(loop.target)) if isinstance(loop, (ast.For, ast.AsyncFor)) else set()
        )
        for node in own:
            if not isinstance(node, (ast.Assign, ast.AugAssign)):
                continue
            value = node.value
            bound = {
                n
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                for n in _target_names(t)
            }
            if not (_names(value) & (targets | bound)) or isinstance(node, ast.AugAssign):
                continue
            fact = self.fact(value, scope)
            if fact is not None and fact.on_device and fact.move is not None:
                what = _short(self.segment(value), 32)
                return "batch", f"it computes `{what}` on the device every step ({fact.describe()})"
        return None

    def _step_call(self, call: ast.Call, scope: ast.AST) -> tuple[LoopKind, str] | None:
        """A call that runs device work per step: a moved model, or a training step function."""
        func = call.func
        runs = isinstance(func, ast.Name) or (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
        )  # `model(x)`, `self.model(x)`; `model.state_dict()` is a method, not a run
        if runs and not self.qualname(func):
            fact = self.fact(func, scope)
            if fact is not None and fact.on_device and _names(func) - {"self"}:
                name = _short(self.segment(func), 24)
                return "batch", f"it runs `{name}` on every step ({fact.describe()})"
        callee = self.local_def(func, scope)
        if callee is not None and _is_step_function(callee):
            return "batch", f"it calls the training step `{callee.name}` on every step"
        return None

    def local_def(
        self, func: ast.expr, scope: ast.AST
    ) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        """The function of this file a call invokes: ``f(...)`` or ``self.f(...)``."""
        if isinstance(func, ast.Name):
            found = self.defs.get(func.id)
            return found[0] if found else None
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
        ):
            cls = self.parent.get(id(scope))
            if isinstance(cls, ast.ClassDef):
                for item in cls.body:
                    if isinstance(item, _FUNCTIONS) and item.name == func.attr:
                        return item
        return None

    # -- calls across functions -------------------------------------------------------------
    def per_batch(self, function: ast.AST, depth: int = 0) -> PerBatch | None:
        """Whether ``function`` runs once per batch, and the device facts of its parameters.

        A training-framework hook (``training_step``, ...: the framework moves ``batch``), a
        function called inside a batch loop of this file or of a sibling module that imports
        it, or one called by such a function.
        """
        if not isinstance(function, _FUNCTIONS) or depth > 3:
            return None
        key = id(function)
        if key in self._per_batch:
            return self._per_batch[key]
        self._per_batch[key] = None  # a cycle reads as "no"
        result: PerBatch | None = None
        if function.name in _STEP_HOOKS:
            params = [a.arg for a in function.args.args]
            seeds = {}
            if len(params) > 1:
                seeds[params[1]] = Fact(
                    "device", params[1], "moved to the device by the training framework"
                )
            how = f"`{function.name}` runs once per batch (a training-framework hook)"
            result = PerBatch(how, seeds, function.name == "training_step")
        else:
            if self.text.count(function.name + "(") > 1:
                result = self._from_callers(function, depth, self, None)
            if result is None and depth == 0 and self.parent.get(id(function)) is self.tree:
                result = self._from_importers(function)
            if result is not None and _has_own_batch_loop(function):
                result = None
        self._per_batch[key] = result
        return result

    def _from_importers(self, function: ast.FunctionDef | ast.AsyncFunctionDef) -> PerBatch | None:
        """Calls of a module-level function from sibling modules (``utils.f(...)``)."""
        if not os.path.isfile(self.path):
            return None
        here = os.path.abspath(self.path)
        directory, filename = os.path.split(here)
        stem = filename[:-3]
        wanted = f"{stem}.{function.name}"
        for other in _siblings(directory):
            if other == here:
                continue
            text = _text_of(other)
            if text is None or function.name + "(" not in text or stem not in text:
                continue
            facts = facts_for_file(other)
            if facts is None:
                continue
            found = facts._from_callers(function, 1, facts, wanted)
            if found is not None:
                return found
        return None

    def _from_callers(
        self,
        function: ast.FunctionDef | ast.AsyncFunctionDef,
        depth: int,
        callers: FileFacts,
        qualified: str | None,
    ) -> PerBatch | None:
        how: str | None = None
        trains = False
        seeds: dict[str, Fact] = {}
        for scope, call, loops in callers._calls_of(function.name):
            if scope is function:
                continue
            if qualified is None:
                if callers.local_def(call.func, scope) is not function:
                    continue
            elif not (callers.qualname(call.func) or "").endswith(qualified):
                continue
            outer: dict[str, Fact] | None = None
            batch = [
                loop
                for loop in loops
                if (k := callers.loop_kind(loop, scope)) is not None and k[0] == "batch"
            ]
            caller = getattr(scope, "name", "<module>")
            where_file = "" if callers is self else f" of {os.path.basename(callers.path)}"
            if batch:
                outer = {}
                trains = trains or any(_calls_backward(loop) for loop in batch)
                where = (
                    f"`{function.name}` is called in the batch loop of `{caller}`{where_file} "
                    f"(line {call.lineno})"
                )
            else:
                above = callers.per_batch(scope, depth + 1)
                if above is None:
                    continue
                outer = above.seeds
                trains = trains or above.trains
                where = (
                    f"`{function.name}` is called by `{caller}`{where_file} (line {call.lineno}), "
                    "which runs once per batch"
                )
            how = how or where
            for param, fact in callers._arg_facts(call, function, scope, outer).items():
                if fact.on_device:
                    seeds.setdefault(param, fact)
        return PerBatch(how, seeds, trains) if how is not None else None

    def _calls_of(self, name: str) -> list[tuple[ast.AST, ast.Call, tuple[ast.AST, ...]]]:
        """Calls of ``name(...)``/``x.name(...)``: ``[(scope, call, enclosing loops)]``.

        Found from the text first: only statements whose lines hold ``name(`` are entered.
        """
        cached = self._calls.get(name)
        if cached is not None:
            return cached
        needle = name + "("
        hits: list[int] = []
        for number, line in enumerate(self.lines, 1):
            if needle in line and "def " + needle not in line:
                hits.append(number)
        found: list[tuple[ast.AST, ast.Call, tuple[ast.AST, ...]]] = []
        if hits:
            self._find_calls(self.tree.body, self.tree, (), name, hits, found)
        self._calls[name] = found
        return found

    def _find_calls(
        self,
        body: list[ast.stmt],
        scope: ast.AST,
        loops: tuple[ast.AST, ...],
        name: str,
        hits: list[int],
        found: list[tuple[ast.AST, ast.Call, tuple[ast.AST, ...]]],
    ) -> None:
        for stmt in body:
            first, last = stmt.lineno, stmt.end_lineno or stmt.lineno
            i = bisect.bisect_left(hits, first)
            if i == len(hits) or hits[i] > last:
                continue
            if isinstance(stmt, _FUNCTIONS):
                self._find_calls(stmt.body, stmt, (), name, hits, found)
                continue
            if isinstance(stmt, ast.ClassDef):
                self._find_calls(stmt.body, scope, (), name, hits, found)
                continue
            inner = (*loops, stmt) if isinstance(stmt, _LOOPS) else loops
            nested = False
            for field in ("body", "orelse", "finalbody"):
                block = getattr(stmt, field, None)
                if block and isinstance(block[0], ast.stmt):
                    nested = True
                    self._find_calls(
                        block, scope, inner if field == "body" else loops, name, hits, found
                    )
            for handler in getattr(stmt, "handlers", []):
                self._find_calls(handler.body, scope, loops, name, hits, found)
            for case in getattr(stmt, "cases", []):
                self._find_calls(case.body, scope, loops, name, hits, found)
            heads: list[ast.AST] = (
                [stmt]
                if not nested
                else [
                    getattr(stmt, f)
                    for f in ("test", "iter", "items", "subject")
                    if getattr(stmt, f, None)
                ]
            )
            for head in heads:
                for sub in (
                    ast.walk(head)
                    if isinstance(head, ast.AST)
                    else [n for item in head for n in ast.walk(item)]
                ):
                    if isinstance(sub, ast.Call):
                        func = sub.func
                        called = (
                            func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                        )
                        if called == name:
                            found.append((scope, sub, loops))

    def _arg_facts(
        self,
        call: ast.Call,
        callee: ast.FunctionDef | ast.AsyncFunctionDef,
        scope: ast.AST,
        seeds: dict[str, Fact] | None = None,
    ) -> dict[str, Fact]:
        params = [a.arg for a in [*callee.args.posonlyargs, *callee.args.args]]
        if params and params[0] in {"self", "cls"} and isinstance(call.func, ast.Attribute):
            params = params[1:]
        out: dict[str, Fact] = {}
        for param, arg in zip(params, call.args, strict=False):
            fact = self.fact(arg, scope, seeds)
            if fact is not None:
                out[param] = fact
        for kw in call.keywords:
            if kw.arg is not None:
                fact = self.fact(kw.value, scope, seeds)
                if fact is not None:
                    out[kw.arg] = fact
        return out


def _cut(line: str, start: int, end: int | None) -> str:
    if line.isascii():
        return line[start:end]
    return line.encode("utf-8")[start:end].decode("utf-8", "replace")


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _own_nodes(body: list[ast.stmt]) -> list[ast.AST]:
    """Nodes of a body, not entering nested functions or classes."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(body)
    while todo:
        sub = todo.pop()
        out.append(sub)
        if isinstance(sub, _SCOPES):
            continue
        todo.extend(ast.iter_child_nodes(sub))
    return out


def _split_own(body: list[ast.AST]) -> tuple[list[ast.AST], list[ast.AST]]:
    """A loop body's own nodes (not inside nested loops or scopes), and its nested loops."""
    own: list[ast.AST] = []
    nested: list[ast.AST] = []
    todo = list(reversed(body))
    while todo:
        sub = todo.pop()
        if isinstance(sub, _LOOPS):
            nested.append(sub)
            continue
        own.append(sub)
        if isinstance(sub, _SCOPES):
            continue
        todo.extend(reversed(list(ast.iter_child_nodes(sub))))
    return own, nested


def _derived(own: list[ast.AST], targets: set[str]) -> set[str]:
    """Names computed from a loop's items in its own body (``batch`` -> ``x, y = batch``)."""
    derived = set(targets)
    for _ in range(2):
        for node in own:
            if isinstance(node, ast.Assign) and _names(node.value) & derived:
                for target in node.targets:
                    derived |= set(_target_names(target))
            elif isinstance(node, _COMPS):
                for gen in node.generators:
                    if _names(gen.iter) & derived:
                        derived |= set(_target_names(gen.target))
    return derived


def _own_loops(body: list[ast.stmt]) -> list[ast.AST]:
    return [n for n in _own_nodes(body) if isinstance(n, _LOOPS)]


def _is_step_function(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A training step: calls ``.backward()`` or an optimizer step, outside any loop of its own."""
    own, _ = _split_own(list(node.body))
    return any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "backward"
        for sub in own
    )


def _has_own_batch_loop(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A function that iterates a loader itself (an epoch function, not a step)."""
    _, nested = _split_own(list(node.body))
    for loop in nested:
        if isinstance(loop, (ast.For, ast.AsyncFor)) and any(
            isinstance(sub, (ast.Name, ast.Attribute))
            and any(
                w in (sub.id if isinstance(sub, ast.Name) else sub.attr).lower()
                for w in _BATCH_WORDS
            )
            for sub in ast.walk(loop.iter)
        ):
            return True
        for stmt in loop.body:  # type: ignore[attr-defined]
            for sub in ast.walk(stmt):
                if (
                    isinstance(sub, ast.Call)
                    and isinstance(sub.func, ast.Attribute)
                    and sub.func.attr in {"backward", "to", "cuda"}
                ):
                    return True
    return False


_BATCH_WORDS = ("loader", "dataset", "batch")


def _calls_backward(loop: ast.AST) -> bool:
    return any(isinstance(sub, ast.Attribute) and sub.attr == "backward" for sub in ast.walk(loop))


# Directories with more modules than this are libraries: their callers are not searched.
_MAX_SIBLINGS = 40


@lru_cache(maxsize=256)
def _siblings(directory: str) -> tuple[str, ...]:
    """The modules next to a file and one folder up (where its importers usually are), if
    there are few."""
    found: list[str] = []
    places = [directory, os.path.dirname(directory)]
    for place in places:
        try:
            names = sorted(os.listdir(place))
        except OSError:
            continue
        found.extend(os.path.join(place, n) for n in names if n.endswith(".py"))
        if len(found) > _MAX_SIBLINGS:
            return ()
    return tuple(found)


@lru_cache(maxsize=256)
def _text_of(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


@lru_cache(maxsize=64)
def _parsed(path: str, mtime: float) -> FileFacts | None:
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
        tree = ast.parse(raw, filename=path)
        text = raw.decode("utf-8", "replace")
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    import re

    return FileFacts(tree, re.split(r"\r\n|\r|\n", text), path)


def facts_for_file(path: str) -> FileFacts | None:
    """The provenance of another file of the linted package (parsed once per process)."""
    try:
        mtime = os.path.getmtime(path)
    except OSError:
        return None
    return _parsed(os.path.abspath(path), mtime)


def file_facts(ctx: Context) -> FileFacts:
    """The provenance of the file a check is looking at (built on first use, then cached)."""
    scope = ctx.scope
    while scope.parent is not None:
        scope = scope.parent
    cached = scope.cache.get("provenance")
    if cached is None:
        assert isinstance(scope.node, ast.Module)
        cached = scope.cache["provenance"] = FileFacts(scope.node, ctx.lines(), ctx.path)
    assert isinstance(cached, FileFacts)
    return cached


def scope_node(ctx: Context) -> ast.AST:
    """The function a check is inside, or the module."""
    scope = ctx.function_scope()
    if scope is not None:
        return scope.node
    outer = ctx.scope
    while outer.parent is not None:
        outer = outer.parent
    return outer.node
