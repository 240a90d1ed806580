"""The provenance of one file: :class:`FileFacts` indexes a parsed module once and answers the
rules' questions (where a value lives, what kind a loop is, whether a function runs per batch),
caching each answer; :func:`file_facts` builds it once per linted file.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import lru_cache

from torchplace.lint.base import Context, bindings
from torchplace.lint.nodes import BLOCKS, assigned, own_nodes, parse_module, statements, walk
from torchplace.lint.provenance import cycles
from torchplace.lint.provenance.callers import _RUN_METHODS, PerBatch, calls_in, find_per_batch
from torchplace.lint.provenance.flow import Flow
from torchplace.lint.provenance.forward import module_forward
from torchplace.lint.provenance.given import given_seeds
from torchplace.lint.provenance.loops import classify, moves_some
from torchplace.lint.provenance.values import (
    _FUNCTIONS,
    Fact,
    LoopKind,
    _cut,
    _device_target,
    _is_move_call,
    _places_self,
    _plainly_host,
    _short,
    moves_to_device,
)
from torchplace.lint.resolver import (
    Resolver,
    dotted_name,
    imported_module_class,
    is_module_base,
    module_name_for,
)
from torchplace.lint.sources import read_neighbour

__all__ = ["FileFacts", "facts_for_file", "file_facts", "scope_node", "unchain"]


def _registered_names(cls: ast.ClassDef) -> frozenset[str]:
    """The attributes ``cls`` registers as buffers (``self.register_buffer("step", ...)``) or
    binds to parameters (``self.step = nn.Parameter(...)``)."""
    found: set[str] = set()
    for node in walk(cls):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "register_buffer"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and (dotted_name(node.value.func) or "").rpartition(".")[2] == "Parameter"
        ):
            found.update(
                t.attr
                for t in node.targets
                if isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
            )
    return frozenset(found)


def _set_by_setters(
    cls: ast.ClassDef, numpy_value: Callable[[ast.expr, ast.AST, int], bool]
) -> dict[str, Fact]:
    """``self.<name>`` set through a setter method of the class that moves what it sets:
    latent diffusion's samplers define ``register_buffer(self, name, attr)`` as ``attr =
    attr.to(torch.device("cuda"))``, then ``setattr(self, name, attr)``, so
    ``self.register_buffer("ddim_alphas", alphas)`` puts ``self.ddim_alphas`` on the device.
    A setter that moves only tensors (``if type(attr) == torch.Tensor:``) leaves a NumPy array
    (``numpy_value`` of the value, at the setter's call) where it is: not a device value."""
    setters = {
        item.name: item
        for item in cls.body
        if isinstance(item, ast.FunctionDef) and _moves_then_sets(item)
    }
    found: dict[str, Fact] = {}
    if not setters:
        return found
    for method in cls.body:
        if not isinstance(method, _FUNCTIONS):
            continue
        for sub in walk(method):
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and isinstance(sub.func.value, ast.Name)
                and sub.func.value.id == "self"
                and sub.func.attr in setters
                and len(sub.args) >= 2
                and isinstance(sub.args[0], ast.Constant)
                and isinstance(sub.args[0].value, str)
            ):
                setter = setters[sub.func.attr]
                if _moves_tensors_only(setter) and numpy_value(sub.args[1], method, sub.lineno):
                    continue
                key = f"self.{sub.args[0].value}"
                move = f"moved to the device by `self.{setter.name}` (line {setter.lineno})"
                found.setdefault(key, Fact("device", key, move))
    return found


def _moves_tensors_only(setter: ast.FunctionDef) -> bool:
    """The setter's move sits under a test that its value is a tensor (``if type(attr) ==
    torch.Tensor:``, ``if isinstance(attr, torch.Tensor):``)."""
    value = setter.args.args[2].arg
    return any(
        isinstance(sub, ast.If)
        and any(isinstance(n, ast.Name) and n.id == value for n in ast.walk(sub.test))
        and "Tensor" in ast.unparse(sub.test)
        for sub in walk(setter)
    )


_NUMPY_BUILDS = frozenset({"numpy.asarray", "numpy.array"})


def _moves_then_sets(method: ast.FunctionDef) -> bool:
    """``def register_buffer(self, name, attr):`` that rebinds ``attr`` moved to a device
    (``attr = attr.to(torch.device("cuda"))``) and stores it with ``setattr(self, name,
    attr)``."""
    params = [a.arg for a in method.args.args]
    if len(params) < 3:
        return False
    name, value = params[1], params[2]
    sets = moves = False
    for sub in walk(method):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Name)
            and sub.func.id == "setattr"
            and len(sub.args) == 3
            and [dotted_name(a) for a in sub.args] == ["self", name, value]
        ):
            sets = True
        if (
            isinstance(sub, ast.Assign)
            and [dotted_name(t) for t in sub.targets] == [value]
            and isinstance(sub.value, ast.Call)
            and isinstance(sub.value.func, ast.Attribute)
            and sub.value.func.attr in {"to", "cuda"}
            and dotted_name(sub.value.func.value) == value
            and moves_to_device(sub.value)
        ):
            moves = True
    return sets and moves


# The containers of layers: iterating one yields the submodules a forward pass runs in turn.
_LAYER_CONTAINERS = frozenset({"torch.nn.Sequential", "torch.nn.ModuleList", "torch.nn.ModuleDict"})


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
        self._drop_shadowed(tree.body)
        self._flows: dict[int, Flow] = {}
        self._given: dict[int, dict[str, Fact]] = {}
        self._own_flows: dict[int, Flow] = {}
        self._own_running: dict[int, Flow] = {}
        self._host_lambdas: dict[int, frozenset[str]] = {}
        self._returns_own_device: dict[str, Fact | None] = {}
        self._loop_kinds: dict[int, tuple[LoopKind, str] | None] = {}
        self._calls: dict[str, list[tuple[ast.AST, ast.Call, tuple[ast.AST, ...]]]] = {}
        #: per function: the answer and the depth it was found at (a "no" found deep in a
        #: chain of callers, out of depth, may be a "yes" asked directly)
        self._per_batch: dict[int, tuple[PerBatch | None, int]] = {}
        self._forwards: dict[int, PerBatch | None] = {}
        self._self_attrs: dict[int, dict[str, Fact]] = {}
        self._returns_host: dict[str, bool] = {}
        self._returns_device: dict[str, Fact | None] = {}
        self._method_device_facts: dict[int, Fact | None] = {}
        self._returns_args: dict[tuple[int, frozenset[str]], bool] = {}
        self._method_host: dict[tuple[int, str, str], bool] = {}
        self._moves: dict[int, bool] = {}
        self._registered: dict[int, frozenset[str]] = {}
        # names bound to new instances of a class, by (class, import path): see callers
        self.instances: dict[tuple[int, str | None], frozenset[str]] = {}
        self._assigned_calls: dict[str, list[ast.Assign]] = {}
        self._text: str | None = None
        self._top: dict[str, ast.AST] | None = None
        self._layer_lists: frozenset[str] | None = None

    def _index(self, body: list[ast.stmt], owner: ast.AST) -> None:
        """Imports, functions by name, and the def or class enclosing each def or class:
        one pass over statements (expressions are never entered)."""
        for node in body:
            if type(node) not in BLOCKS:
                continue  # a simple statement: nothing to index, no block inside
            if isinstance(node, ast.Import):
                self.resolver.add_import(node)
            elif isinstance(node, ast.ImportFrom):
                self.resolver.add_import_from(node)
            elif isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
                self.parent[id(node)] = owner
                if isinstance(node, _FUNCTIONS):
                    self.defs.setdefault(node.name, []).append(node)
                else:
                    self._module_class(node)
                self._index(node.body, node)
            else:
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    inner = getattr(node, field, None)
                    if inner:
                        for item in inner:
                            if isinstance(item, (ast.ExceptHandler, ast.match_case)):
                                self._index(item.body, owner)
                        self._index([i for i in inner if isinstance(i, ast.stmt)], owner)

    def _drop_shadowed(self, body: list[ast.stmt]) -> None:
        """A function the module's own statements define twice runs as its last definition
        (PointWeb's second ``model_fn_decorator``): the earlier one is dead code."""
        seen: dict[str, ast.AST] = {}
        for node in body:
            if isinstance(node, _FUNCTIONS):
                earlier = seen.get(node.name)
                if earlier is not None:  # and the functions nested in it
                    for dead in walk(earlier):
                        if isinstance(dead, _FUNCTIONS) and dead.name in self.defs:
                            self.defs[dead.name] = [
                                d for d in self.defs[dead.name] if d is not dead
                            ]
                seen[node.name] = node

    def _module_class(self, node: ast.ClassDef) -> None:
        """Know ``node`` for a module class, as the rules' walk does, so that a class derived
        from it (``class RelAttn(RelMultiHeadAttn)``) is one too."""
        resolver = self.resolver
        if resolver.is_module_class(node):
            resolver.local_module_classes.add(node.name)
        elif resolver.module is not None and resolver.is_module_class_elsewhere(node, self.path):
            resolver.local_module_classes.add(node.name)
            resolver.elsewhere_module_classes.add(node.name)

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
    def flow(self, node: ast.AST, seeds: dict[str, Fact] | None = None) -> Flow:
        """The flow of a function (or the module), computed once (seeded flows are not cached),
        with the device values its every caller hands it (:func:`~.given.given_seeds`)."""
        if seeds:
            flow = Flow(self, node, {**self.given(node), **seeds})
            flow.run()
            return flow
        cached = self._flows.get(id(node))
        if cached is not None:
            return cached

        def compute() -> Flow:
            flow = Flow(self, node, self.given(node))
            flow.run()
            return flow

        # being computed (recursion through outer facts): a flow that knows nothing
        return cycles.answer(self._flows, id(node), compute, lambda: Flow(self, node, {}))

    def own_fact(self, node: ast.expr, scope: ast.AST) -> Fact | None:
        """Where ``node`` lives by its function's own code alone, not what its callers hand
        it: what a call hands on, found without walking up the callers again."""
        key = id(scope)
        flow = self._own_flows.get(key)
        if flow is None:

            def compute() -> Flow:
                running = self._own_running[key] = Flow(self, scope, {})
                try:
                    running.run()
                finally:
                    del self._own_running[key]
                return running

            # asked while it runs: what it knows so far
            flow = cycles.answer(self._own_flows, key, compute, lambda: self._own_running[key])
        return flow.eval(node, flow.at(getattr(node, "lineno", 0)))

    def given(self, node: ast.AST) -> dict[str, Fact]:
        """The parameters of a module-level function that all its callers bind to device
        values, found once per function (a cycle through the callers reads as none)."""
        if not isinstance(node, _FUNCTIONS):
            return {}
        cached = self._given.get(id(node))
        if cached is not None:
            return cached
        return cycles.answer(self._given, id(node), lambda: given_seeds(self, node), dict)

    def outer_fact(self, node: ast.AST, name: str) -> Fact | None:
        """A name a function reads but does not bind: for a function nested in another, the
        enclosing function's binding where the ``def`` stands (a closure: Latent Diffusion's
        ``get_x_prev_and_pred_x0`` reading ``alphas`` of ``p_sample_plms``), else the module's
        final binding of it."""
        if isinstance(node, ast.Module):
            return None
        if "." in name:
            return None
        owner = self.parent.get(id(node))
        if isinstance(owner, _FUNCTIONS):
            enclosing = self.flow(owner)
            if name in enclosing.bindings or name in enclosing.seeds:
                return enclosing.at(getattr(node, "lineno", 0))(name)
        module = self.flow(self.tree)
        found = module.bindings.get(name)
        return found[-1][1] if found else None

    def fact(
        self,
        node: ast.expr,
        scope: ast.AST,
        seeds: dict[str, Fact] | None = None,
        comps: tuple[ast.expr, ...] = (),
    ) -> Fact | None:
        """Where ``node`` lives, evaluated at its line inside ``scope`` (a function or module),
        inside the comprehensions ``comps`` (outermost first) when it sits in their body."""
        flow = self.flow(scope, seeds)
        lookup = flow.at(getattr(node, "lineno", 0))
        for comp in comps:
            lookup = flow.comp_lookup(comp, lookup)
        return flow.eval(node, lookup)

    def self_attr_fact(self, method: ast.AST, name: str) -> Fact | None:
        """``self.model`` in a method: device when any method of the class moves it."""
        cls = self.parent.get(id(method))
        if not isinstance(cls, ast.ClassDef):
            return None
        attrs = self._self_attrs.get(id(cls))
        if attrs is None:
            # what a setter sets needs no flow: known before the flows that read it are made
            attrs = self._self_attrs[id(cls)] = _set_by_setters(cls, self._numpy_value)
            for item in cls.body:
                if isinstance(item, _FUNCTIONS) and self._may_place(item) and _places_self(item):
                    for key, bound in self.flow(item).bindings.items():
                        if key.startswith("self.") and key not in attrs:
                            device = [f for _, f in bound if f is not None and f.on_device]
                            if device:
                                attrs[key] = device[0]
        return attrs.get(name)

    def _numpy_value(self, value: ast.expr, scope: ast.AST, line: int) -> bool:
        """``value``, read at ``line`` of ``scope``, is a NumPy array by construction:
        ``np.asarray(...)`` or ``np.array(...)``, or a name whose last binding before that
        line is such, or that element of what a function of the linted code returns
        (``sigmas, alphas, alphas_prev = make_ddim_sampling_parameters(...)`` whose
        ``alphas_prev = np.asarray(...)``)."""
        if isinstance(value, ast.Call):
            return self.qualname(value.func) in _NUMPY_BUILDS
        if not isinstance(value, ast.Name):
            return False
        bound = sorted(
            (node.lineno, node.targets[0], node.value)
            for node in own_nodes(scope)
            if isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and node.lineno < line
            and value.id in {n.id for n in ast.walk(node.targets[0]) if isinstance(n, ast.Name)}
        )
        return bool(bound) and self._numpy_bound(value.id, *bound[-1][1:])

    def _numpy_bound(self, name: str, target: ast.expr, made: ast.expr) -> bool:
        if isinstance(target, ast.Name):
            return isinstance(made, ast.Call) and self.qualname(made.func) in _NUMPY_BUILDS
        if not (isinstance(target, ast.Tuple) and isinstance(made, ast.Call)):
            return False
        names = [e.id if isinstance(e, ast.Name) else None for e in target.elts]
        if name not in names:
            return False  # bound inside a nested unpacking: not followed
        index = names.index(name)
        found = self.function_def(made.func)
        if found is None:
            return False
        facts, function = found
        returns = [r.value for r in own_nodes(function) if isinstance(r, ast.Return)]
        return bool(returns) and all(
            isinstance(r, ast.Tuple)
            and len(r.elts) == len(names)
            and facts._numpy_value(r.elts[index], function, r.lineno)
            for r in returns
        )

    def function_def(
        self, func: ast.expr
    ) -> tuple[FileFacts, ast.FunctionDef | ast.AsyncFunctionDef] | None:
        """The module-level function of the linted code that ``func`` names: this file's
        own, or one imported from a module file of the tree."""
        if isinstance(func, ast.Name) and self.defs.get(func.id):
            own = self.defs[func.id][0]
            return (self, own) if self.parent.get(id(own)) is self.tree else None
        qualname = self.qualname(func)
        module, _, name = (qualname or "").rpartition(".")
        other = self.module_facts(module) if module else None
        if other is None or other is self or not other.defs.get(name):
            return None
        found = other.defs[name][0]
        return (other, found) if other.parent.get(id(found)) is other.tree else None

    def moves_argument(self, call: ast.Call, scope: ast.AST) -> bool:
        """``self.to_var(x)`` in a method, or ``to_var(x)``, running a transfer helper of the
        class or of the linted code: every definition the call runs hands back its first
        parameter moved to a device (``return Variable(arg).cuda(self.gpu)``), or as given on
        the path without CUDA (``else: return Variable(arg)``)."""
        func = call.func
        if not call.args or isinstance(call.args[0], ast.Starred):
            return False
        if isinstance(func, ast.Attribute):
            cls = self.parent.get(id(scope))
            if not (
                isinstance(func.value, ast.Name)
                and func.value.id == "self"
                and isinstance(cls, ast.ClassDef)
            ):
                return False
            found = [i for i in cls.body if isinstance(i, _FUNCTIONS) and i.name == func.attr]
        elif isinstance(func, ast.Name):
            found = [node for _, node in self.callees(func.id, self.qualname(func))]
        else:
            return False
        return bool(found) and all(_hands_back_moved(node) for node in found)

    def registered_tensor(self, method: ast.AST, attr: str) -> bool:
        """``self.<attr>`` is a buffer or parameter of the method's module class
        (``self.register_buffer("step", ...)``, ``self.step = nn.Parameter(...)``): a tensor
        that moves with the module. The class's registered names are found once."""
        cls = self.parent.get(id(method))
        if not isinstance(cls, ast.ClassDef):
            return False
        names = self._registered.get(id(cls))
        if names is None:
            names = self._registered[id(cls)] = _registered_names(cls)
        return attr in names

    def release(self) -> None:
        """Drop every cache: flows point back here, and a cycle would keep the file's whole
        tree alive until the cyclic collector, which a big run pays for again and again."""
        for value in vars(self).values():
            if isinstance(value, dict):
                value.clear()

    def _may_place(self, method: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        """Whether a method's text mentions a move or a device at all (cheaper than its tree)."""
        text = "\n".join(self.lines[method.lineno - 1 : method.end_lineno])
        return ".to(" in text or ".cuda(" in text or "device" in text

    def moves_some(self, loop: ast.For | ast.AsyncFor) -> bool:
        """:func:`~.loops.moves_some`, once per loop."""
        key = id(loop)
        cached = self._moves.get(key)
        if cached is None:
            cached = self._moves[key] = moves_some(loop)
        return cached

    def returns_host(self, name: str) -> bool:
        """A function of this file whose every ``return`` gives a host value (``loss.item()``),
        or whose return annotation says so (``-> int``)."""
        cached = self._returns_host.get(name)
        if cached is not None:
            return cached
        self._returns_host[name] = False
        result = False
        for node in self.defs.get(name, []):
            if _host_annotation(node.returns):
                result = True
                continue
            returns = [r for r in own_nodes(node) if isinstance(r, ast.Return)]
            values = [r.value for r in returns if r.value is not None]
            result = bool(values) and all(_plainly_host(v) for v in values)
        self._returns_host[name] = result
        return result

    def method_returns_host(self, receiver: ast.expr, method: str, scope: ast.AST) -> bool:
        """``model.get_step()`` where every binding of ``model`` in ``scope`` makes an instance
        of a class of the linted code (``model = Tacotron(...).to(device)``) whose method of that
        name hands back only host values (``return self.step.item()``, ``-> int``): a moved
        model's method may still answer with a Python number. Also ``self.helper.method()``
        in a method whose class binds ``self.helper`` so in any of its methods."""
        if isinstance(receiver, ast.Name):
            name, home = receiver.id, scope
        elif (
            isinstance(receiver, ast.Attribute)
            and isinstance(receiver.value, ast.Name)
            and receiver.value.id == "self"
            and isinstance(self.parent.get(id(scope)), ast.ClassDef)
        ):
            # `self.bbox_util.non_max_suppression(...)`, with `self.bbox_util = DecodeBox(...)`
            name, home = f"self.{receiver.attr}", self.parent[id(scope)]
        else:
            return False
        key = (id(home), name, method)
        cached = self._method_host.get(key)
        if cached is not None:
            return cached
        self._method_host[key] = False  # recursion: assume it does not
        values = [
            (self, v) for v in _assigned_to(own_nodes(scope) if home is scope else walk(home), name)
        ]
        if not values and home is scope and isinstance(scope, _FUNCTIONS):
            # `def train(model: WaveRNN, ...)`: a parameter of a class of the linted code
            annotated = self._annotated_class(scope, name)
            if annotated is not None:
                owner, cls = annotated
                values_host = owner._class_method_host(cls, method, 0)
                self._method_host[key] = values_host
                return values_host
        if not values and isinstance(home, ast.ClassDef):
            # bound in a base class's `__init__`, of this file or of a module beside it
            for base in home.bases:
                found_base = self.class_def(base)
                if found_base is not None:
                    facts, parent = found_base
                    values += [(facts, v) for v in _assigned_to(walk(parent), name)]
        result = False
        for facts, value in _alternatives(values):
            while (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr in _MODULE_CHAINS
            ):
                value = value.func.value
            if dotted_name(value) == name:
                continue  # `model = model` after a chain: the same instance
            unwrapped = _unwrapped(value)
            if unwrapped is not None:  # `raw_model = model.module if ddp else model`
                if facts is self and self.method_returns_host(unwrapped, method, scope):
                    result = True
                    continue
                result = False
                break
            if not isinstance(value, ast.Call):
                result = False
                break
            if any(dotted_name(a) == name for a in value.args):
                continue  # `model = DataParallel(model)`: the same model, wrapped
            found = facts.class_def(value.func) or facts.class_of_constructor(value.func)
            if found is None:
                result = False
                break
            owner, cls = found
            result = owner._class_method_host(cls, method, 0)
            if not result:
                break
        self._method_host[key] = result
        return result

    def _annotated_class(
        self, scope: ast.FunctionDef | ast.AsyncFunctionDef, name: str
    ) -> tuple[FileFacts, ast.ClassDef] | None:
        """The class of the linted code that parameter ``name`` of ``scope`` is annotated with
        (``model: WaveRNN``, or the forward reference ``"WaveRNN"``)."""
        args = scope.args
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
            if arg.arg != name or arg.annotation is None:
                continue
            annotation = arg.annotation
            if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
                try:
                    annotation = ast.parse(annotation.value, mode="eval").body
                except SyntaxError:
                    return None
            return self.class_def(annotation)
        return None

    def _class_method_host(self, cls: ast.ClassDef, method: str, depth: int) -> bool:
        for item in cls.body:
            if isinstance(item, _FUNCTIONS) and item.name == method:
                if any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list):
                    return False
                if _host_annotation(item.returns):
                    return True
                returns = [r for r in own_nodes(item) if isinstance(r, ast.Return)]
                values = [r.value for r in returns if r.value is not None]
                return (
                    bool(values)
                    and len(values) == len(returns)
                    and all(_plainly_host(v) or _converted_in_place(item, v) for v in values)
                ) or _python_arithmetic(item, cls)
        if depth >= 2:
            return False
        for base in cls.bases:
            found = self.class_def(base)
            if found is not None:
                owner, parent = found
                return owner._class_method_host(parent, method, depth + 1)
        return False

    def class_of_constructor(self, func: ast.expr) -> tuple[FileFacts, ast.ClassDef] | None:
        """The class of the linted code whose ``@classmethod`` ``func`` calls: what
        ``GPT.from_pretrained(name)`` makes is taken for a ``GPT``."""
        if not isinstance(func, ast.Attribute):
            return None
        found = self.class_def(func.value)
        if found is None:
            return None
        for item in found[1].body:
            if isinstance(item, _FUNCTIONS) and item.name == func.attr:
                classmethod = any(dotted_name(d) == "classmethod" for d in item.decorator_list)
                return found if classmethod else None
        return None

    def class_def(self, func: ast.expr) -> tuple[FileFacts, ast.ClassDef] | None:
        """The class of the linted code that ``func`` names: this file's own, or one imported
        from a module file of the tree (``from synthesizer.models.tacotron import Tacotron``)."""
        if isinstance(func, ast.Name):
            own = self.defs_class(func.id)
            if own is not None:
                return self, own
        qualname = self.qualname(func)
        if qualname is None:
            return None
        module, _, name = qualname.rpartition(".")
        other = self.module_facts(module)
        cls = None if other is None else other.defs_class(name)
        return None if other is None or cls is None else (other, cls)

    def module_facts(self, module: str) -> FileFacts | None:
        """The facts of the module file that the dotted ``module`` names in the linted tree,
        looked for in this file's folder, then in the folders of its packages, also under a
        ``src/`` folder there (the src layout: ``examples/evaluate.py`` importing
        ``lerobot.policies.utils`` from ``src/lerobot/policies/utils.py``); None when there is
        none (or it cannot be read)."""
        if not module or not os.path.isfile(self.path):
            return None
        parts = module.split(".")
        directory = os.path.dirname(os.path.abspath(self.path))
        for _ in range(len(parts) + 2):  # the file's folder, then the folders of its packages
            for candidate in (
                os.path.join(directory, *parts) + ".py",
                os.path.join(directory, *parts, "__init__.py"),
                os.path.join(directory, "src", *parts) + ".py",
                os.path.join(directory, "src", *parts, "__init__.py"),
            ):
                if os.path.isfile(candidate):
                    return facts_for_file(candidate)
            directory = os.path.dirname(directory)
        return None

    def returns_device(self, name: str, qualname: str | None = None) -> Fact | None:
        """The one function of this file by that name whose every ``return`` hands back a
        device value it makes itself (``model = Net().cuda()``, then ``return model``); with
        ``qualname`` (``utils.get_network``), that function of the module of the linted tree
        that the call imports it from."""
        if qualname is not None:
            module, _, function = qualname.rpartition(".")
            other = self.module_facts(module) if module else None
            if other is None or other is self or not other.returns_names(function):
                return None  # a tuple's elements, or an object built there, are not followed
            made = other.returns_own_device(function)
            if made is None or made.move is None or ".py" in made.move:
                return made
            return replace(made, move=f"{made.move} of {os.path.basename(other.path)}")
        if name in self._returns_device:
            return self._returns_device[name]
        return cycles.answer(
            self._returns_device,
            name,
            lambda: self._returned_device(name),
            lambda: None,  # recursion: assume it does not
        )

    def host_lambdas(self, scope: ast.AST) -> frozenset[str]:
        """The names ``scope`` binds only to lambdas whose body is plainly a host value
        (``count = lambda m: f"{sum(p.numel() for p in m.parameters()) / 1e6:.2f}"``)."""
        found = self._host_lambdas.get(id(scope))
        if found is None:
            found = self._host_lambdas[id(scope)] = frozenset(
                name
                for name, values in bindings(scope).items()
                if all(isinstance(v, ast.Lambda) and _plainly_host(v.body) for v in values)
            )
        return found

    def returns_names(self, name: str) -> bool:
        """Every ``return`` of the functions of this file by that name hands back a name or a
        move (``return net``, ``return model.cuda()``): not a tuple (``return model,
        tokenizer``), nor an object it builds (``return Report(model, ...)``)."""
        values = [
            sub.value
            for node in self.defs.get(name, [])
            for sub in own_nodes(node)
            if isinstance(sub, ast.Return)
        ]
        return bool(values) and all(
            isinstance(v, ast.Name) or (isinstance(v, ast.Call) and _is_move_call(v))
            for v in values
        )

    def returns_own_device(self, name: str) -> Fact | None:
        """:meth:`returns_device` by the function's own code alone (what its callers hand it
        is not asked), for a call from another module; a function that names no move or
        device is not walked."""
        if name in self._returns_own_device:
            return self._returns_own_device[name]
        defs = self.defs.get(name, [])
        if len(defs) != 1 or not self._may_place(defs[0]):
            self._returns_own_device[name] = None
            return None
        return cycles.answer(
            self._returns_own_device,
            name,
            lambda: self._returned_device(name, own=True),
            lambda: None,
        )

    def method_returns_device(self, func: ast.expr, scope: ast.AST) -> Fact | None:
        """``self._parse_batch(batch)`` in a method, running a method of its class whose every
        ``return`` hands back a device value it makes, or a tuple holding one (ParallelWaveGAN's
        ``return x, y`` of ``inputs.to(self.device)``, ``targets.to(self.device)``)."""
        if not (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
        ):
            return None
        callee = self.local_def(func, scope)
        if callee is None:
            return None
        key = id(callee)
        if key in self._method_device_facts:
            return self._method_device_facts[key]
        return cycles.answer(
            self._method_device_facts, key, lambda: self._method_device(callee), lambda: None
        )

    def _method_device(self, callee: ast.FunctionDef | ast.AsyncFunctionDef) -> Fact | None:
        returns = [r.value for r in own_nodes(callee) if isinstance(r, ast.Return)]
        if not returns or any(v is None for v in returns):
            return None
        first: Fact | None = None
        for value in returns:
            assert value is not None
            elements = value.elts if isinstance(value, ast.Tuple) else [value]
            found = next(
                (f for e in elements if (f := self.fact(e, callee)) is not None and f.on_device),
                None,
            )
            if found is None:
                return None
            first = first or found
        assert first is not None
        return Fact("device", f"self.{callee.name}(...)", first.move, first.name)

    def _returned_device(self, name: str, *, own: bool = False) -> Fact | None:
        defs = self.defs.get(name, [])
        if len(defs) != 1:
            return None
        node = defs[0]
        returns = [r for r in own_nodes(node) if isinstance(r, ast.Return)]
        values = [r.value for r in returns if r.value is not None]
        if not values or len(values) != len(returns):
            return None
        found = [self.own_fact(v, node) if own else self.fact(v, node) for v in values]
        first = found[0]
        if first is None or not all(f is not None and f.on_device for f in found):
            return None
        return Fact("device", f"{name}(...)", first.move, first.name)

    def callees(
        self, name: str, qualname: str | None
    ) -> list[tuple[FileFacts, ast.FunctionDef | ast.AsyncFunctionDef]]:
        """The definitions a call of ``name`` runs: this file's functions of that name, or the
        function ``from module import name`` names in a module file of the linted tree, or
        one a star import brings in (``from .detect import *``, then ``detect(net, img)``)."""
        if qualname is None:
            own = [(self, node) for node in self.defs.get(name, [])]
            for star in [] if own else self.resolver.stars:
                other = self.module_facts(star)
                if other is not None and other is not self and name in other.defs:
                    return [(other, node) for node in other.defs[name]]
            return own
        module, _, function = qualname.rpartition(".")
        other = self.module_facts(module)
        return [] if other is None else [(other, node) for node in other.defs.get(function, [])]

    def returns_arguments(
        self, callee: ast.FunctionDef | ast.AsyncFunctionDef, seeds: dict[str, Fact]
    ) -> bool:
        """Whether ``callee`` may hand back the device values it is given (``seeds``, by
        parameter): a return reads a device value, or reads a name that a device value is
        stored into (``outs.append(model(x))``, ``result["y"] = y``). A function that returns
        its own meters (``return meter.avg``) gives host numbers even from a device model."""
        key = (id(callee), frozenset(seeds))
        cached = self._returns_args.get(key)
        if cached is not None:
            return cached
        return cycles.answer(
            self._returns_args,
            key,
            lambda: self._returned_arguments(callee, seeds),
            lambda: True,  # recursion: assume it may
        )

    def _returned_arguments(
        self, callee: ast.FunctionDef | ast.AsyncFunctionDef, seeds: dict[str, Fact]
    ) -> bool:
        flow = self.flow(callee, seeds)
        nodes = own_nodes(callee)
        values = [n.value for n in nodes if isinstance(n, ast.Return) and n.value is not None]
        read = {n.id for v in values for n in walk(v) if isinstance(n, ast.Name)}
        # `return utils.post_processing(img, output)`: an imported module's function, called,
        # not a container the function stores device values into
        read -= set(self.resolver.names) - set(bindings(callee))
        result = not values or any(
            (fact := flow.eval(v, flow.at(v.lineno))) is not None and fact.on_device for v in values
        )
        return result or any(_stores_device(n, read, flow) for n in nodes)

    # -- loops ------------------------------------------------------------------------------
    def loop_kind(self, loop: ast.AST, scope: ast.AST) -> tuple[LoopKind, str] | None:
        """``("batch"|"rows", evidence)`` for a loop of ``scope``, or None (once per epoch,
        or nothing says it touches a device)."""
        key = id(loop)
        if key in self._loop_kinds:
            return self._loop_kinds[key]
        return cycles.answer(
            self._loop_kinds, key, lambda: classify(self, loop, scope), lambda: None
        )

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

    def assigned_calls(self, name: str) -> list[ast.Assign]:
        """The assignments of the file whose value calls ``name`` (``x = name(...)``, also
        ``x = module.name(...)``), indexed in one pass over the statements."""
        index = self._assigned_calls
        if not index:
            index[""] = []  # indexed, even when nothing is found
            for node in statements(self.tree.body):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                    func = constructed(node.value)
                    called = func.attr if isinstance(func, ast.Attribute) else None
                    called = func.id if isinstance(func, ast.Name) else called
                    if called:
                        index.setdefault(called, []).append(node)
        return index.get(name, [])

    def top_level(self, name: str) -> ast.AST | None:
        """The first module-level function or class of this file named ``name``."""
        if self._top is None:
            self._top = {}
            for node in self.tree.body:
                if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
                    self._top.setdefault(node.name, node)
        return self._top.get(name)

    def plain_instance(self, call: ast.Call, name: str, qualname: str | None) -> bool:
        """``call`` constructs an object of a plain class of the linted tree (no base but
        ``object``, no decorator, none of :data:`_NOT_PLAIN`: ClipBERT's
        ``TrainingRestorer(cfg, model, optimizer)``): an object holding its own state, not a
        tensor or a model to run."""
        if qualname is None:
            found = self.top_level(name)
        else:
            module, _, attr = qualname.rpartition(".")
            other = self.module_facts(module) if module else None
            found = None if other is None or other is self else other.top_level(attr)
        if not isinstance(found, ast.ClassDef) or found.decorator_list:
            return False
        if any(not (isinstance(b, ast.Name) and b.id == "object") for b in found.bases):
            return False  # a base of elsewhere may make it a module, or a tensor subclass
        return not any(
            isinstance(item, _FUNCTIONS) and item.name in _NOT_PLAIN for item in found.body
        )

    def builds_module(self, node: ast.expr, depth: int = 0) -> bool:
        """``node`` constructs an ``nn.Module``: a torch module class (``nn.Linear(4, n)``), a
        class of this file that derives from one (``BaseNetwork(act_fn=fn)``), or one that a
        module of the linted tree defines, imported by name or by a star import (PFLlib's
        ``from flcore.trainmodel.models import *``, then ``FedAvgCNN(...)``); also a model
        builder: a ``torchvision.models`` function (``resnet18(num_classes=n)``) or a function
        of the linted tree whose every ``return`` builds one (``def resnet10(**kw): return
        ResNet(BasicBlock, [1, 1, 1, 1], **kw)``)."""
        if not isinstance(node, ast.Call):
            return False
        name = self.qualname(node.func)
        if name is not None and (is_module_base(name) or _torchvision_builder(name)):
            return True
        cls = self.defs_class(node.func.id) if isinstance(node.func, ast.Name) else None
        if cls is not None:
            return self.resolver.is_module_class(cls)
        if name is not None and imported_module_class(self.path, name):
            return True
        if name is None and isinstance(node.func, ast.Name):
            star = (f"{module}.{node.func.id}" for module in self.resolver.stars)
            if any(imported_module_class(self.path, qualname) for qualname in star):
                return True
        return depth < 2 and self._builder(node, name, depth)

    def _builder(self, call: ast.Call, qualname: str | None, depth: int) -> bool:
        """``call`` runs one function of this file or of the linted tree whose every
        ``return`` builds a module."""
        called = dotted_name(call.func)
        if called is None or (qualname is None and "." in called):
            return False
        callees = self.callees(called.rsplit(".", 1)[-1], qualname)
        if len(callees) != 1:
            return False
        other, function = callees[0]
        nodes = own_nodes(function)
        returns = [r.value for r in nodes if isinstance(r, ast.Return)]
        values: list[ast.expr | None] = []
        for value in returns:  # `model = AlexNet(**kw)`, ..., `return model`
            if isinstance(value, ast.Name):
                values += [
                    n.value
                    for n in nodes
                    if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == value.id for t in n.targets)
                ] or [None]
            else:
                values.append(value)
        return bool(values) and all(
            v is not None and other.builds_module(v, depth + 1) for v in values
        )

    @property
    def layer_lists(self) -> frozenset[str]:
        """Attributes the file's classes set to a container of layers (``self.layers =
        nn.Sequential(...)``, ``nn.ModuleList``, ``nn.ModuleDict``): iterating one walks a
        model's layers, not batches."""
        if self._layer_lists is None:
            self._layer_lists = frozenset(
                target.attr
                for node in walk(self.tree)
                if isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and self.qualname(node.value.func) in _LAYER_CONTAINERS
                for target in node.targets
                if isinstance(target, ast.Attribute)
            )
        return self._layer_lists

    def defs_class(self, name: str) -> ast.ClassDef | None:
        """The module-level class of this file named ``name``."""
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        return None

    # -- calls across functions -------------------------------------------------------------
    def per_batch(self, function: ast.AST, depth: int = 0) -> PerBatch | None:
        """Whether ``function`` runs once per batch, and the device facts of its parameters.

        A training-framework hook (``training_step``, ...: the framework moves ``batch``), a
        function called inside a batch loop of this file or of a sibling module that imports
        it, or one called by such a function; asked of itself (``depth`` 0), also a module's
        ``forward`` that none of those runs (:func:`~.forward.module_forward`).
        """
        if not isinstance(function, _FUNCTIONS) or depth > 4:
            return None
        found = self._per_batch_at(function, depth)
        if found is None and depth <= 1 and function.name == "forward":
            # a module's `forward` that no caller in sight runs; asked one call down too, for
            # the helpers it calls, which count what it hands them at those calls
            key = id(function)
            if key not in self._forwards:
                made = module_forward(self, function)
                self._forwards[key] = (
                    None if made is None else PerBatch(made[0], made[1], False, forward=made[2])
                )
            found = self._forwards[key]
        return found

    def _per_batch_at(
        self, function: ast.FunctionDef | ast.AsyncFunctionDef, depth: int
    ) -> PerBatch | None:
        if depth == 4 and function.name not in _RUN_METHODS:
            return None  # a model's `forward` the batch loop runs is one hop more
        key = id(function)
        cached = self._per_batch.get(key)
        if cached is not None and (
            (cached[0] is not None and not cached[0].far) or cached[1] <= depth
        ):
            return cached[0]  # a result found far down may be nearer from here
        return cycles.answer(
            self._per_batch,
            key,
            lambda: find_per_batch(self, function, depth),
            lambda: None,  # a cycle reads as "no"
            lambda result: (result, depth),
        )

    def calls_of(self, name: str) -> list[tuple[ast.AST, ast.Call, tuple[ast.AST, ...]]]:
        """:func:`~.callers.calls_in`, once per name."""
        cached = self._calls.get(name)
        if cached is None:
            cached = self._calls[name] = calls_in(self, name)
        return cached

    def arg_facts(
        self,
        call: ast.Call,
        callee: ast.FunctionDef | ast.AsyncFunctionDef,
        scope: ast.AST,
        seeds: dict[str, Fact] | None = None,
        *,
        bound: bool = False,
    ) -> dict[str, Fact]:
        """The facts of the arguments of ``call``, by the parameter of ``callee`` they bind
        (``bound``: a call on an instance, ``model(x)`` for ``forward``, passes ``self``)."""
        params = [a.arg for a in [*callee.args.posonlyargs, *callee.args.args]]
        if (
            params
            and params[0] in {"self", "cls"}
            and (bound or isinstance(call.func, ast.Attribute))
        ):
            params = params[1:]
        out: dict[str, Fact] = {}
        for param, arg in zip(params, call.args, strict=False):
            fact = self.fact(arg, scope, seeds)
            if fact is not None:
                out[param] = fact
        named = {*params, *(a.arg for a in callee.args.kwonlyargs)}
        gathered = callee.args.kwarg.arg if callee.args.kwarg is not None else None
        for kw in call.keywords:
            fact = self.fact(kw.value, scope, seeds)
            if fact is None:
                continue
            if kw.arg is not None and (kw.arg in named or gathered is None):
                out[kw.arg] = fact
            elif gathered is not None and fact.on_device:
                # `meter.update(loss=loss, **losses)` into `def update(self, **kwargs)`: the
                # mapping the function gathers holds the device values it was handed
                out.setdefault(gathered, fact)
        return out


@lru_cache(maxsize=64)
def _parsed(path: str, mtime: float) -> FileFacts | None:
    raw = read_neighbour(path)
    if raw is None:
        return None
    try:
        tree = parse_module(raw, filename=path)
        text = raw.decode("utf-8", "replace")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return FileFacts(tree, re.split(r"\r\n|\r|\n", text), path)


def facts_for_file(path: str) -> FileFacts | None:
    """The provenance of another file of the linted package (parsed once per process)."""
    try:
        mtime = os.path.getmtime(path)
    except OSError:
        return None
    return _parsed(os.path.abspath(path), mtime)


# torchvision's model families, each a package of builder functions.
_TORCHVISION_FAMILIES = frozenset(
    {"detection", "optical_flow", "quantization", "segmentation", "video"}
)
# Functions of those packages that hand back something else than a model.
_TORCHVISION_LOOKUPS = frozenset({"get_model_weights", "get_weight", "list_models"})


def _torchvision_builder(qualname: str) -> bool:
    """``torchvision.models.resnet18``, ``torchvision.models.detection.fasterrcnn_resnet50_fpn``:
    a public function of ``torchvision.models`` or of one of its model families (not a helper
    of a family's inner module, ``detection.rpn.concat_box_prediction_layers``), which builds
    a model (its classes start with a capital)."""
    parts = qualname.split(".")
    name = parts[-1]
    return (
        parts[:2] == ["torchvision", "models"]
        and (len(parts) == 3 or (len(parts) == 4 and parts[2] in _TORCHVISION_FAMILIES))
        and name[:1].islower()
        and name not in _TORCHVISION_LOOKUPS
    )


def file_facts(ctx: Context) -> FileFacts:
    """The provenance of the file a check is looking at (built on first use, then cached)."""
    scope = ctx.scope.root()
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
    return ctx.scope.root().node


def unchain(call: ast.Call) -> ast.Call:
    """The constructor call under ``.to(device)``, ``.cuda()``, ``.eval()``, ...: ``Net(cfg)``
    in ``Net(cfg).to(device).eval()``."""
    while (
        isinstance(call.func, ast.Attribute)
        and call.func.attr in _MODULE_CHAINS
        and isinstance(call.func.value, ast.Call)
    ):
        call = call.func.value
    return call


def constructed(call: ast.Call) -> ast.expr:
    """What a call that makes an instance names: ``Net`` in ``Net(cfg).to(device)`` and in
    ``Net.from_pretrained(path)`` (a pretrained model class's constructor)."""
    func = unchain(call).func
    if isinstance(func, ast.Attribute) and func.attr in _CLASS_CONSTRUCTORS:
        return func.value
    return func


#: class methods that build an instance of their class (Hugging Face's model loaders)
_CLASS_CONSTRUCTORS = frozenset({"from_pretrained", "from_config"})

#: calls on a module that hand back the same module: `Net().to(device).eval()`
_MODULE_CHAINS = frozenset(
    {
        "to",
        "cuda",
        "cpu",
        "eval",
        "train",
        "half",
        "float",
        "double",
        "bfloat16",
        "requires_grad_",
        "share_memory",
    }
)

#: return annotations that say a function hands back a host value, whatever its arguments
_HOST_TYPES = frozenset({"int", "float", "bool", "str", "bytes", "complex", "None"})


def _stores_device(node: ast.AST, names: set[str], flow: Flow) -> bool:
    """``names`` gain a device value at ``node``: a method call on one of them with a device
    argument (``outs.append(y)``), or a store into one (``out["y"] = y``, ``out.y = y``)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        root: ast.expr = node.func.value
        values = [*node.args, *(kw.value for kw in node.keywords)]
    elif isinstance(node, (ast.Assign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        stores = [t for t in targets if isinstance(t, (ast.Subscript, ast.Attribute))]
        if not stores:
            return False
        root, values = stores[0], [node.value]
    else:
        return False
    while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
        root = root.func if isinstance(root, ast.Call) else root.value
    if not (isinstance(root, ast.Name) and root.id in names):
        return False
    lookup = flow.at(getattr(node, "lineno", 0))
    return any((fact := flow.eval(v, lookup)) is not None and fact.on_device for v in values)


#: containers an annotation may name around host types (``list[float]``, ``Sequence[int]``)
_HOST_CONTAINERS = frozenset(
    {"list", "tuple", "dict", "set", "List", "Tuple", "Dict", "Set", "Sequence", "Optional"}
    | {"Iterable", "Mapping", "Iterator"}
)


#: methods that make an object run a model (``__call__``, ``forward``), stand for another
#: (``__new__``) or hand out what it holds (SAM's ``MaskData["masks"]``, ``__iter__``)
_NOT_PLAIN = frozenset({"__call__", "forward", "__new__", "__getitem__", "__iter__", "__getattr__"})


def _host_annotation(annotation: ast.expr | None) -> bool:
    """``-> int``, ``-> float``, ``-> "str"``, ``-> list[float]``, ``-> tuple[int, ...]``,
    ``-> Sequence[float]``."""
    if isinstance(annotation, ast.Constant):
        if annotation.value is None:
            return True
        if isinstance(annotation.value, str):
            return annotation.value in _HOST_TYPES
        return annotation.value is Ellipsis
    if isinstance(annotation, ast.Name):
        return annotation.id in _HOST_TYPES
    if isinstance(annotation, ast.Subscript):
        container = annotation.value
        name = container.attr if isinstance(container, ast.Attribute) else None
        name = container.id if isinstance(container, ast.Name) else name
        if name not in _HOST_CONTAINERS:
            return False
        inner = annotation.slice
        parts = inner.elts if isinstance(inner, ast.Tuple) else [inner]
        return all(_host_annotation(part) for part in parts)
    return False


def _assigned_to(nodes: Iterable[ast.AST], name: str) -> list[ast.expr]:
    """The values ``nodes`` assign to ``name`` (``model`` or ``self.helper``)."""
    return [
        node.value
        for node in nodes
        if isinstance(node, ast.Assign) and any(dotted_name(t) == name for t in node.targets)
    ]


def _alternatives(
    values: list[tuple[FileFacts, ast.expr]],
) -> list[tuple[FileFacts, ast.expr]]:
    """Each binding's value, a conditional expression's two branches apart (``model.module if
    ddp else model``)."""
    out: list[tuple[FileFacts, ast.expr]] = []
    for facts, value in values:
        if isinstance(value, ast.IfExp):
            out += _alternatives([(facts, value.body), (facts, value.orelse)])
        else:
            out.append((facts, value))
    return out


#: what a wrapper keeps the model it wraps in: ``DistributedDataParallel``'s and
#: ``DataParallel``'s ``.module``, ``torch.compile``'s ``._orig_mod``
_WRAPPED = frozenset({"module", "_orig_mod"})


def _unwrapped(value: ast.expr) -> ast.Name | None:
    """The name a binding refers to the same model through: ``model`` itself, or what a
    wrapper holds (``model.module``)."""
    if isinstance(value, ast.Attribute) and value.attr in _WRAPPED:
        value = value.value
    return value if isinstance(value, ast.Name) else None


#: calls a method may make and still compute a Python number: builtins and a tensor's sizes
_NUMBER_CALLS = frozenset({"sum", "len", "float", "int", "round", "min", "max", "abs"})
_SIZE_METHODS = frozenset({"numel", "parameters", "named_parameters", "dim", "size"})


def _python_arithmetic(
    function: ast.FunctionDef | ast.AsyncFunctionDef, cls: ast.ClassDef, depth: int = 0
) -> bool:
    """A method that only counts and does arithmetic (nanoGPT's ``estimate_mfu``: ``N =
    self.get_num_params()``, a ``sum(p.numel() for p in self.parameters())``, then ``mfu =
    flops_achieved / flops_promised``, ``return mfu``): it calls no torch function and runs no
    module, only builtins, a tensor's sizes and methods of its class that are such methods
    too, and each ``return`` hands back arithmetic (or a local bound only to arithmetic),
    never an attribute or a parameter as it is. What it answers is a number."""
    for node in own_nodes(function):
        if isinstance(node, ast.Call) and not _counts(node.func, cls, depth):
            return False
        if isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await)):
            return False
    bound = assigned(function)
    returns = [r.value for r in own_nodes(function) if isinstance(r, ast.Return)]
    return bool(returns) and all(
        value is not None and _arithmetic(value, bound, 0) for value in returns
    )


def _counts(func: ast.expr, cls: ast.ClassDef, depth: int) -> bool:
    """A call a counting method may make: a builtin of numbers, a tensor's sizes, or a method
    of its own class that only counts (``self.get_num_params()``)."""
    if isinstance(func, ast.Name):
        return func.id in _NUMBER_CALLS
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr in _SIZE_METHODS:
        return True
    if not (isinstance(func.value, ast.Name) and func.value.id == "self") or depth >= 2:
        return False
    own = [i for i in cls.body if isinstance(i, _FUNCTIONS) and i.name == func.attr]
    return len(own) == 1 and _python_arithmetic(own[0], cls, depth + 1)


def _arithmetic(value: ast.expr, bound: dict[str, list[ast.expr]], depth: int) -> bool:
    if isinstance(value, (ast.BinOp, ast.Constant)):
        return True
    if isinstance(value, ast.UnaryOp):
        return _arithmetic(value.operand, bound, depth)
    if isinstance(value, ast.Call):  # `sum(...)`, `self.get_num_params()`: counts
        return isinstance(value.func, ast.Name) or (
            isinstance(value.func, ast.Attribute)
            and value.func.attr not in {"parameters", "named_parameters"}
        )
    if isinstance(value, ast.Name) and value.id in bound and depth < 4:
        return all(_arithmetic(v, bound, depth + 1) for v in bound[value.id])
    return False


def _converted_in_place(function: ast.AST, value: ast.expr) -> bool:
    """``return output`` of a list whose elements the function converts to NumPy or Python
    data in place, ``output[i] = output[i].cpu().numpy()`` (a detector's NMS that gathers its
    detections on the device, then hands back arrays), with no whole element stored after
    the conversion."""
    if not isinstance(value, ast.Name):
        return False
    stores = [
        node
        for node in walk(function)
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Subscript)
        and isinstance(node.targets[0].value, ast.Name)
        and node.targets[0].value.id == value.id
    ]
    converted = [
        node.lineno
        for node in stores
        if _plainly_host(node.value) and dotted_name(_chain_base(node.value)) == value.id
    ]
    return bool(converted) and all(node.lineno <= max(converted) for node in stores)


def _chain_base(node: ast.expr) -> ast.expr:
    """``output`` of ``output[i].cpu().numpy()``."""
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _hands_back_moved(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Every ``return`` of ``func`` hands back its first parameter (``self`` and ``cls`` aside)
    moved to a device, or as given, and at least one moves it; a ``Variable(...)`` wrapper
    around the parameter is the parameter."""
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
    if params and params[0] in {"self", "cls"}:
        params = params[1:]
    if not params:
        return False
    first = params[0]

    def given(node: ast.expr) -> bool:
        if (
            isinstance(node, ast.Call)
            and (dotted_name(node.func) or "").rpartition(".")[2] == "Variable"
            and node.args
        ):
            node = node.args[0]
        return isinstance(node, ast.Name) and node.id == first

    values = [r.value for r in own_nodes(func) if isinstance(r, ast.Return)]
    moved = [
        v
        for v in values
        if isinstance(v, ast.Call)
        and isinstance(v.func, ast.Attribute)
        and v.func.attr in {"to", "cuda"}
        and given(v.func.value)
        and not any(_is_cpu_text(a) for a in [*v.args, *(k.value for k in v.keywords)])
    ]
    as_given = [v for v in values if v is not None and given(v)]
    return bool(moved) and len(moved) + len(as_given) == len(values)


def _is_cpu_text(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and "cpu" in node.value
