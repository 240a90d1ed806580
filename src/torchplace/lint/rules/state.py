"""TPL5xx: module state that ``nn.Module.to()`` cannot see (pitfall 12): tensors and modules in
plain containers, and tensors kept as plain attributes."""

from __future__ import annotations

import ast

from torchplace.lint.base import Context, Family, Rule, Scope, call_name
from torchplace.lint.nodes import (
    isinstance_test,
    last_assignment,
    own_nodes,
    self_attribute,
    store_targets,
    subscripted,
    walk,
)
from torchplace.lint.provenance.callers import mentioning, text_of
from torchplace.lint.provenance.files import FileFacts, facts_for_file, file_facts
from torchplace.lint.provenance.loops import counter_names
from torchplace.lint.provenance.values import moves_to_device
from torchplace.lint.resolver import dotted_name
from torchplace.lint.rules.factories import _empty_shape, _number_annotation
from torchplace.lint.rules.facts import (
    FACTORIES,
    FROM_ELEMENTS,
    TENSOR_FUNCTIONS,
    TENSOR_METHODS,
    in_test,
    is_module_expr,
    is_tensor_annotation,
    is_tensor_expr,
    returns_none_test,
)
from torchplace.lint.rules.module_helpers import (
    PLACEMENT_API,
    class_methods,
    construction_helpers,
    self_calls,
)
from torchplace.lint.rules.stateless import stateless_module

__all__ = ["FAMILY"]

PLAIN_CONTAINER = Rule(
    "TPL501",
    "tensor-in-plain-container",
    "tensors or modules kept in a plain list/dict attribute, or a tensor as a plain attribute",
)

_CONTAINERS = (ast.List, ast.Tuple, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
_PARAMETERS = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter"})


def _held(node: ast.expr, ctx: Context, scope: Scope) -> str | None:
    """``"tensors"``/``"modules"`` when ``node`` certainly builds a tensor or module."""
    if not isinstance(node, ast.Call):
        return None
    if ctx.call_qualname(node) in _PARAMETERS or is_tensor_expr(node, ctx, scope):
        return "tensors"
    inner = node  # `nn.Parameter(torch.zeros(d)).requires_grad_(flag)`: the parameter itself
    while (
        isinstance(inner.func, ast.Attribute)
        and inner.func.attr in _MODULE_RETURNS_ITSELF
        and isinstance(inner.func.value, ast.Call)
    ):
        inner = inner.func.value
        if ctx.call_qualname(inner) in _PARAMETERS:
            return "tensors"
    # `nn.Linear(d, n).cuda()`: placing and casting a module hand back the module itself
    while (
        isinstance(node.func, ast.Attribute)
        and node.func.attr in _MODULE_RETURNS_ITSELF
        and isinstance(node.func.value, ast.Call)
    ):
        node = node.func.value
    if is_module_expr(node, ctx) and not stateless_module(node, ctx):
        return "modules"  # not a pooling or activation layer: `.to()` loses nothing of those
    return None


_MODULE_RETURNS_ITSELF = frozenset(
    {"cuda", "to", "half", "float", "double", "bfloat16", "train", "eval", "requires_grad_"}
)


def _elements(container: ast.expr) -> list[ast.expr]:
    """The element expressions of a container display or comprehension."""
    if isinstance(container, ast.Dict):
        return [v for v in container.values if v is not None]
    if isinstance(container, (ast.List, ast.Tuple, ast.Set)):
        return list(container.elts)
    if isinstance(container, ast.DictComp):
        return [container.value]
    if isinstance(container, (ast.ListComp, ast.SetComp)):
        return [container.elt]
    return []


def _repeated(value: ast.expr) -> ast.expr:
    """The display a list repeated with ``*`` repeats (``[torch.zeros(1)] * self.nl``, also
    ``n * [...]``): the same kind of container; anything else as it is."""
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult):
        for side in (value.left, value.right):
            if isinstance(side, (ast.List, ast.Tuple)) and side.elts:
                return side
    return value


def _contents(container: ast.expr, ctx: Context, scope: Scope) -> str | None:
    for element in _elements(container):
        held = _held(element, ctx, scope)
        if held is not None:
            return held
    return None


def _empty_container(value: ast.expr) -> bool:
    """``[]``, ``{}``, ``list()``, ``dict()`` (also ``dict(k=v)``: filled later by key)."""
    if isinstance(value, (ast.List, ast.Dict)):
        return not (value.keys if isinstance(value, ast.Dict) else value.elts)
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id in {"list", "dict"}
        and not value.args
    )


def _advice(held: str) -> str:
    return (
        "use `nn.ParameterList`/`ParameterDict` or `register_buffer`"
        if held == "tensors"
        else "use `nn.ModuleList`/`nn.ModuleDict`"
    )


def _assign(node: ast.Assign, ctx: Context) -> None:
    method = ctx.method_of_module()
    if method is None or method.cls is None or len(node.targets) != 1:
        return
    if method.cls.module_base_elsewhere:
        return  # a base class of another file may register or move what it holds
    if in_test(ctx):
        return  # a test's stand-in module runs where the test puts it, never moved or saved
    target = node.targets[0]
    attr = self_attribute(target)
    value = node.value
    if (
        isinstance(value, ast.Call)
        and value.args
        and ctx.call_qualname(value) == "torch.autograd.Variable"
    ):
        value = value.args[0]  # `Variable(torch.Tensor(b, c), requires_grad=True)`: the tensor
    plain: set[str] = method.cls.cache.setdefault("plain-containers", set())
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
        # `self.grid_x, self.grid_y = [], []`: each attribute set to an empty container
        if len(target.elts) == len(value.elts):
            plain.update(
                name
                for element, part in zip(target.elts, value.elts, strict=True)
                if (name := self_attribute(element)) is not None and _empty_container(part)
            )
        return
    if attr is not None:
        if _empty_container(value):
            plain.add(attr)
        elif (
            _plain_tensor(value, ctx, method, attr, node.lineno)
            and not _filled_placeholder(value, ctx, method, attr)
            and not _scalar_lookup(value, ctx, method, attr)
        ):
            _report_attribute(ctx, node, method.cls, attr)
        elif isinstance(value := _repeated(value), _CONTAINERS):
            held = _contents(value, ctx, method)
            if held is None and _constructs(method):
                held = _named_tensors(value, ctx, method, node.lineno)
            if held == "tensors" and _pass_state(value, ctx, method):
                return  # `self.hidden = (h0, c0)` rebuilt by each forward pass: per-call state
            if (
                held is not None
                and not _scratch_placeholders(value, ctx, method, attr)
                and not (held == "tensors" and _placed_cache(method.cls, attr, method.name, ctx))
            ):
                _report(ctx, node, method.cls, attr, held)
        elif _registering(value, ctx):
            plain.discard(attr)
        return
    # self.cache[key] = torch.zeros(...)
    if isinstance(target, ast.Subscript):
        attr = self_attribute(target.value)
        if attr in plain:
            held = _held(value, ctx, method)
            if held is not None:
                _report(ctx, node, method.cls, attr, held)


def _ann_assign(node: ast.AnnAssign, ctx: Context) -> None:
    """``self.w: Optional[Tensor] = torch.zeros(3)``: as the assignment without its type."""
    if node.value is not None and self_attribute(node.target) is not None:
        _assign(ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node), ctx)


def _scratch_placeholders(value: ast.expr, ctx: Context, method: Scope, attr: str) -> bool:
    """``self._features = {layer: torch.empty(0) for layer in layers}``: empty placeholders
    (no values to move or save) that no other method reads, or that each method reading them
    first rebinds whole (a per-call scratch space the hooks fill). Not a cache kept across
    calls, ``self.grid = [torch.empty(0)] * n`` filled by ``self.grid[i] = ...`` in
    ``forward``."""
    elements = _elements(value)
    if not elements or not all(
        isinstance(e, ast.Call)
        and (name := ctx.call_qualname(e)) is not None
        and _empty_shape(e, name)
        for e in elements
    ):
        return False
    assert method.cls is not None
    for item in class_methods(method.cls).values():
        if item is method.node:
            continue
        reads = rebinds = False
        for sub in walk(item):
            if isinstance(sub, ast.Attribute) and self_attribute(sub) == attr:
                reads = reads or isinstance(sub.ctx, ast.Load)
            if isinstance(sub, ast.Assign) and any(self_attribute(t) == attr for t in sub.targets):
                rebinds = True
        if reads and not rebinds:
            return False
    return True


def _filled_placeholder(value: ast.expr, ctx: Context, method: Scope, attr: str) -> bool:
    """``self._encoded = torch.empty(0)`` that a callback of the class rebinds whole, from
    values other than its own (a forward hook's ``self._encoded = self.projector(out)``,
    registered as ``register_forward_hook(self._hook)`` and called by no method of the class):
    an empty placeholder, no values to move or save, replaced by what each call computes. Not
    a cache a method of the class rebuilds when it must (``if n > self.pe.shape[1]:
    self._build(n, x)`` in ``forward``: kept across calls, left behind by ``.to()``), nor one
    grown from itself, ``self.cache = torch.cat([self.cache, x])``."""
    if not (
        isinstance(value, ast.Call)
        and (name := ctx.call_qualname(value)) is not None
        and _empty_shape(value, name)
    ):
        return False
    assert method.cls is not None
    methods = class_methods(method.cls)
    called = {name for item in methods.values() for name in self_calls(item)}
    filled = False
    for item in methods.values():
        if item is method.node:
            continue
        if item.name in called:
            if any(self_attribute(t) == attr for sub in walk(item) for t in store_targets(sub)):
                return False  # rebuilt by the class's own code: a cache kept across calls
            continue
        for sub in walk(item):
            if isinstance(sub, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                if not any(self_attribute(t) == attr for t in targets):
                    continue
                if isinstance(sub, ast.AugAssign) or sub.value is None:
                    return False
                if any(
                    isinstance(n, ast.Attribute) and self_attribute(n) == attr
                    for n in walk(sub.value)
                ):
                    return False  # grown from itself: a cache kept across calls
                filled = True
    return filled


# Factories whose result is one-dimensional whatever their arguments.
_ONE_DIM = frozenset({"torch.linspace", "torch.logspace", "torch.arange"})


def _one_dimensional(call: ast.Call, ctx: Context) -> bool:
    """``torch.linspace(a, b, n)``, or a table of numbers, ``torch.FloatTensor([w / 2**s for s
    in range(n)])``: a constructor of a flat list display or comprehension."""
    name = ctx.call_qualname(call)
    if name in _ONE_DIM:
        return True
    if name not in FROM_ELEMENTS or len(call.args) != 1:
        return False
    table = call.args[0]
    if isinstance(table, ast.ListComp):
        return not isinstance(table.elt, (ast.List, ast.Tuple, ast.ListComp))
    return isinstance(table, ast.List) and not any(
        isinstance(e, (ast.List, ast.Tuple, ast.ListComp, ast.Starred)) for e in table.elts
    )


def _scalar_lookup(value: ast.expr, ctx: Context, method: Scope, attr: str) -> bool:
    """``self.temps = torch.linspace(a, b, n)`` that other methods read only as one element
    picked by an integer, ``self.temps[epoch]`` with ``epoch: int | None``: a 0-dim value,
    which mixes with a tensor on any device. Not one indexed by a tensor of steps
    (``self.betas[t]`` with ``t`` unannotated): that index may live on the GPU."""
    if not isinstance(value, ast.Call) or not _one_dimensional(value, ctx):
        return False
    assert method.cls is not None
    picked = False
    for item in class_methods(method.cls).values():
        if item is method.node:
            continue
        params = item.args
        ints = {
            a.arg
            for a in [*params.posonlyargs, *params.args, *params.kwonlyargs]
            if _number_annotation(a.annotation)
        } | {name for sub in walk(item) if isinstance(sub, ast.For) for name in counter_names(sub)}
        subscripted: set[int] = set()
        for sub in walk(item):
            if isinstance(sub, ast.Subscript) and self_attribute(sub.value) == attr:
                index = sub.slice
                if isinstance(sub.ctx, ast.Load) and (
                    (isinstance(index, ast.Name) and index.id in ints)
                    or (isinstance(index, ast.Constant) and isinstance(index.value, int))
                ):
                    subscripted.add(id(sub.value))
                    picked = True
                else:
                    return False
        for sub in walk(item):
            if (
                isinstance(sub, ast.Attribute)
                and self_attribute(sub) == attr
                and id(sub) not in subscripted
            ):
                return False  # read whole, or rebound: not only a lookup of elements
    return picked


_REGISTERING = frozenset({"ModuleDict", "ModuleList", "ParameterDict", "ParameterList"})
_MODULE_CONTAINERS = frozenset({"ModuleDict", "ModuleList", "Sequential"})


def _is_parameter(value: ast.expr, ctx: Context) -> bool:
    return isinstance(value, ast.Call) and ctx.call_qualname(value) in _PARAMETERS


def _registering(value: ast.expr, ctx: Context) -> bool:
    """``self.node_embeds = nn.ModuleDict()``: a container that registers what it holds. In
    DGL's ``DistEmbedLayer`` one branch keeps ``DistEmbedding``s in a plain ``{}`` and the
    others rebind the attribute to a ``ModuleDict`` before storing ``nn.Embedding``s in it."""
    if not isinstance(value, ast.Call):
        return False
    name = ctx.call_qualname(value) or ""
    return name.startswith("torch.nn.") and name.rsplit(".", 1)[-1] in _REGISTERING


def _module_container(value: ast.Call, ctx: Context) -> bool:
    """``nn.ModuleList(...)``, ``nn.ModuleDict(...)``, ``nn.Sequential(...)``: a container
    that registers the very modules it is given (a ``ParameterList`` wraps plain tensors in
    new ``Parameter`` objects, leaving the originals behind)."""
    name = ctx.call_qualname(value) or ""
    return name.startswith("torch.nn.") and name.rsplit(".", 1)[-1] in _MODULE_CONTAINERS


def _expr(node: ast.Expr, ctx: Context) -> None:
    call = node.value
    if not isinstance(call, ast.Call):
        return
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in {"append", "insert", "extend"}:
        return
    attr = self_attribute(func.value)
    if attr is None or not call.args:
        return
    method = ctx.method_of_module()
    if method is None or method.cls is None or method.cls.module_base_elsewhere:
        return
    if attr not in method.cls.cache.get("plain-containers", ()) or in_test(ctx):
        return
    value = call.args[-1]
    if _host_copy(value):
        return  # `self._feats.append(x.cpu())`: a host buffer on purpose, gathered later
    if isinstance(value, ast.Name) and _registered_here(value.id, method):
        return  # `self.add_module(f"qf{i}", q_net)`, then `self.q_networks.append(q_net)`
    held = _contents(value, ctx, method) if func.attr == "extend" else _held(value, ctx, method)
    if held is None and func.attr != "extend" and isinstance(value, ast.Name):
        held = _bound_to(value.id, ctx, method)
    if held is not None:
        _report(ctx, call, method.cls, attr, held)


def _registered_here(name: str, method: Scope) -> bool:
    """The method registers what ``name`` holds itself (``add_module``, ``register_module``,
    ``register_buffer``, ``register_parameter``): a list of it only aliases the registered."""
    return any(
        _is_register(sub)
        and isinstance(sub, ast.Call)
        and any(isinstance(arg, ast.Name) and arg.id == name for arg in sub.args[1:])
        for sub in walk(method.node)
    )


def _bound_to(name: str, ctx: Context, method: Scope) -> str | None:
    """What a local name holds when the method binds it only to tensors (or only to modules)
    it builds, none of them a host copy: ``grid_x = torch.arange(n).repeat(b, 1).to(device)``,
    then ``self.grid_x.append(grid_x)``."""
    values = ctx.scope_bindings(method).get(name) or []
    if not values or any(v is None or _host_copy(v) for v in values):
        return None
    kinds = {_held(v, ctx, method) for v in values if v is not None}
    return kinds.pop() if len(kinds) == 1 else None


# Methods that keep a tensor's values and its device: `x.cpu().detach()` is still a host copy.
_KEEPS_PLACE = frozenset({"detach", "clone", "contiguous", "float", "half", "double", "long"})


def _host_copy(node: ast.expr) -> bool:
    """``x.cpu()`` (also ``x.detach().cpu()``, ``x.cpu().float()``): a copy made on the host on
    purpose, which ``.to()`` must not move (features kept for a k-NN pass after the epoch)."""
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _KEEPS_PLACE
    ):
        node = node.func.value
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "cpu"
        and not node.args
        and not node.keywords
    )


# The method that takes over placement: a class that overrides ``_apply`` moves its own plain
# tensors. Overriding ``to``/``cuda``/``cpu`` does not: a parent's ``.to()`` reaches its
# children through ``_apply``, never through their ``to``, and ``.half()``/``.cuda()`` bypass it.
_PLACEMENT_OVERRIDES = frozenset({"_apply"})


def _constructs(method: Scope) -> bool:
    """``__init__``, or a method ``__init__`` calls through ``self.name(...)`` (a builder such
    as ``self.init_states(x)``, ``self._build_cache(n)``): code that runs at construction."""
    return method.name == "__init__" or (
        method.cls is not None and method.name in construction_helpers(method.cls)
    )


# torch functions of a tensor argument that return a new tensor on the argument's device.
_TENSOR_OF_ARGS = TENSOR_FUNCTIONS | frozenset(
    f"torch.{name}"
    for name in (
        "cumprod",
        "cumsum",
        "outer",
        "polar",
        "exp",
        "log",
        "sin",
        "cos",
        "sqrt",
        "pow",
        "complex",
        "view_as_complex",
        "view_as_real",
        "tril",
        "triu",
        "flip",
        "repeat_interleave",
    )
)


def _plain_tensor(value: ast.expr, ctx: Context, method: Scope, attr: str, line: int) -> bool:
    """``self.cache = torch.zeros(n, d)`` at construction (``__init__`` or a builder it
    calls, or a set-up method callers run before ``forward``): a tensor of more than one
    element kept as a plain attribute, which ``.to()`` leaves behind, used by the other
    methods without being moved there first. The tensor may come from a factory, a name bound
    to one, a parameter annotated ``Tensor``, or a function of the file (or a method of the
    class) that returns one."""
    if method.cls is None:
        return False
    cls = method.cls
    if not (_constructs(method) or _sets_up_forward(method, attr, ctx)):
        return False
    earlier = _self_bound_before(method.node, attr, line)
    if (
        earlier is not None
        and any(
            isinstance(sub, ast.Attribute) and sub.attr == attr and dotted_name(sub.value) == "self"
            for sub in walk(value)
        )
        and not any(
            isinstance(sub, ast.Call) and call_name(sub) in {"cuda", "to"} for sub in walk(value)
        )
        and _builds_tensor(earlier, ctx, method.node, earlier.lineno, cls)
    ):
        # `self.bands = self.bands * 2`: reported where the tensor was first kept (a move,
        # `self.w = torch.FloatTensor(self.w).cuda()`, is reported where it places)
        return False
    if not _builds_tensor(value, ctx, method.node, line, cls):
        return False
    if _made_host_later(method.node, attr, line):
        return False
    return not (
        _overrides_placement(cls)
        or _moved_where_used(cls, attr, method.name, facts=file_facts(ctx))
    )


_HOST_METHODS = frozenset({"tolist", "numpy", "item"})
_HOST_CALLS = frozenset({"float", "int", "list", "tuple", "np.array", "np.asarray", "numpy.array"})


def _made_host_later(function: ast.AST, attr: str, line: int) -> bool:
    """A later statement of the builder's own body, run whatever the branches before it,
    rebinds the attribute to a host copy of itself (``self.freq_bands =
    self.freq_bands.numpy().tolist()``): what the other methods read is a Python list, no
    tensor."""
    for stmt in getattr(function, "body", []):
        if stmt.lineno <= line or not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
            continue
        if self_attribute(stmt.targets[0]) != attr:
            continue
        value = stmt.value
        if not (
            isinstance(value, ast.Call) and any(self_attribute(n) == attr for n in walk(value))
        ):
            return False
        if isinstance(value.func, ast.Attribute) and value.func.attr in _HOST_METHODS:
            return True
        return call_name(value) in _HOST_CALLS
    return False


def _forward_methods(cls: Scope) -> set[str]:
    """``forward`` (or ``__call__``) and the methods it calls through ``self.name(...)``,
    directly or through another such method: the code of each call of the module."""
    cached: set[str] | None = cls.cache.get("forward-methods")
    if cached is not None:
        return cached
    methods = class_methods(cls)
    found: set[str] = {name for name in ("forward", "__call__") if name in methods}
    todo = [methods[name] for name in found]
    for _ in range(8):  # a bounded walk, as for the construction helpers
        if not todo:
            break
        called = set().union(*(self_calls(m) for m in todo)) & set(methods)
        called -= found | {"__init__"}
        found |= called
        todo = [methods[name] for name in called]
    cls.cache["forward-methods"] = found
    return found


def _sets_up_forward(method: Scope, attr: str, ctx: Context) -> bool:
    """A set-up method that callers run between construction and the forward passes
    (``model.setup_caches(n)``, never called from ``forward``) and whose tensor ``forward``
    reads: state the module keeps from call to call, as if built at construction. The
    placement API (``to``, ``_apply``, ...) is not one."""
    cls = method.cls
    if cls is None or method.name in PLACEMENT_API or method.name in {"__init__"}:
        return False
    forward = _forward_methods(cls)
    if not forward or method.name in forward:
        return False  # rebuilt by the forward pass itself, from its inputs
    if _run_by_outer_forward(method, ctx):
        return False  # rebuilt by the forward pass of the module that holds this one
    methods = class_methods(cls)
    return any(
        isinstance(sub, ast.Attribute)
        and self_attribute(sub) == attr
        and isinstance(sub.ctx, ast.Load)
        for name in forward
        for sub in walk(methods[name])
    )


def _pass_state(value: ast.expr, ctx: Context, method: Scope) -> bool:
    """A container of tensors (no ``nn.Parameter``) that a method run on every forward pass
    stores, outside construction: ``forward`` and its helpers, or a method the forward pass of
    another module of the file runs on the module it holds (``self.decoder.init_state(bs)``):
    an RNN's ``(h, c)`` state, rebuilt per call, that ``.to()``, ``state_dict()`` and
    ``parameters()`` have no reason to see."""
    cls = method.cls
    if cls is None or _constructs(method) or method.name in PLACEMENT_API:
        return False
    if any(
        isinstance(element, ast.Call) and ctx.call_qualname(element) in _PARAMETERS
        for element in _elements(value)
    ):
        return False  # parameters made per call are never trained: reported
    return method.name in _forward_methods(cls) or _run_by_outer_forward(method, ctx)


def _run_by_outer_forward(method: Scope, ctx: Context) -> bool:
    """Another ``nn.Module`` class of the file calls ``method`` on a module it holds from its
    own ``forward`` (``self.decoder.init_state(bs)`` in ``ASR.forward``): each pass rebuilds
    what the method stores."""
    root = ctx.scope.root()
    names: set[str] | None = root.cache.get("outer-forward-calls")
    if names is None:
        names = set()
        for node in walk(root.node):
            if not (isinstance(node, ast.ClassDef) and ctx.resolver.is_module_class(node)):
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in {"forward", "__call__"}:
                    names |= _held_module_calls(item)
        root.cache["outer-forward-calls"] = names
    return method.name in names


def _held_module_calls(function: ast.FunctionDef) -> set[str]:
    """The methods ``function`` calls on an attribute of ``self``: ``init_state`` of
    ``self.decoder.init_state(bs)``."""
    return {
        sub.func.attr
        for sub in own_nodes(function)
        if isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and self_attribute(sub.func.value) is not None
    }


def _builds_tensor(
    value: ast.expr,
    ctx: Context,
    function: ast.AST,
    line: int,
    cls: Scope | None,
    depth: int = 0,
) -> bool:
    """Whether ``value``, evaluated at ``line`` of ``function``, is certainly a new tensor of
    more than one element (a factory, a torch function of one, a tensor method of one)."""
    if depth > _MAX_DEPTH:
        return False
    if isinstance(value, ast.Name):
        bound = _bound_before(function, value.id, line)
        if isinstance(bound, ast.expr):
            return _builds_tensor(bound, ctx, function, bound.lineno, cls, depth + 1)
        if bound == "parameter":  # a tensor handed to the constructor (not to a setter)
            return (
                getattr(function, "name", None) == "__init__"
                and _tensor_parameter(function, value.id, ctx)
                and not (cls is not None and _built_per_call(cls, ctx))
            )
        return False
    if isinstance(value, ast.Attribute) and dotted_name(value.value) == "self":
        # `self.coord_x = self.indice.repeat(n, 1)` after `self.indice = torch.arange(n)`
        earlier = _self_bound_before(function, value.attr, line)
        return earlier is not None and _builds_tensor(
            earlier, ctx, function, earlier.lineno, cls, depth + 1
        )
    if isinstance(value, ast.Attribute) and value.attr in _TENSOR_VIEWS:  # `freqs_cis.real`
        return _builds_tensor(value.value, ctx, function, line, cls, depth + 1)
    if isinstance(value, ast.Subscript) and _keeps_elements(value.slice):
        # `torch.tensor(means, device=d)[None, :, None, None]`: a view of all of it
        return _builds_tensor(value.value, ctx, function, line, cls, depth)
    if isinstance(value, ast.BinOp):  # `2 ** torch.linspace(0, n - 1, n)`: the same shape
        return any(
            _builds_tensor(side, ctx, function, line, cls, depth + 1)
            for side in (value.left, value.right)
        )
    if isinstance(value, ast.UnaryOp):  # `-torch.arange(n)`
        return _builds_tensor(value.operand, ctx, function, line, cls, depth + 1)
    if isinstance(value, ast.IfExp):  # `torch.tensor(mean) if mean else None`
        # `nn.Parameter(w) if train else w * torch.ones(1, d)`: the other branch's tensor
        branches = [
            b for b in (value.body, value.orelse) if not _is_none(b) and not _is_parameter(b, ctx)
        ]
        return bool(branches) and all(
            _builds_tensor(b, ctx, function, line, cls, depth) for b in branches
        )
    if not isinstance(value, ast.Call):
        return False
    name = ctx.call_qualname(value)
    if name in FACTORIES:
        if depth > 0 and _of_number(value, name, function, ctx):
            return False
        if _number_parameter(value, name, function):
            return False  # `torch.tensor(drop_rate)` with `drop_rate: float`: 0-dim
        if name == "torch.tensor" and value.args and _module_number(value.args[0], function, ctx):
            return False  # `torch.tensor(np.log(init_alpha))` with `init_alpha = 0.01`: 0-dim
        if (
            name == "torch.tensor"
            and value.args
            and _self_array(value.args[0], function, line, ctx)
        ):
            return True  # `self.w = np.eye(n).reshape(...)`, then `torch.tensor(self.w)`
        return not _single_value(value, name)
    if name in _FROM_ARRAY and value.args and _literal_array(value.args[0], ctx):
        return True  # `torch.from_numpy(np.array([0, 0, 0, 0]).astype(np.float32))`
    if name == "torch.from_numpy" and value.args:
        return True  # `torch.from_numpy(node_features.astype(np.float32))`: a whole array
    if name in _TENSOR_OF_ARGS:
        args = [*value.args, *(kw.value for kw in value.keywords)]
        # `torch.stack([re, im], -1)`: the elements of a list or tuple argument count too
        args += [
            elt
            for arg in map(_repeated, value.args)  # `torch.stack([t] * 2)` as `[t, t]`
            if isinstance(arg, (ast.List, ast.Tuple))
            for elt in arg.elts
        ]
        return any(_builds_tensor(arg, ctx, function, line, cls, depth + 1) for arg in args)
    func = value.func
    if isinstance(func, ast.Attribute) and func.attr in _TENSOR_CHAIN:
        if _per_channel(value, ctx):
            return True
        return _builds_tensor(func.value, ctx, function, line, cls, depth + 1)
    callee = _local_function(value, ctx, cls)
    return callee is not None and _returns_tensor(callee, ctx, cls, depth + 1)


def _keeps_elements(index: ast.expr) -> bool:
    """An index of slices, ``None`` and ``...`` only (``[None, :]``, ``[::2]``): a view that
    keeps every dimension, not one element (``[0]`` may be a single number)."""
    parts = index.elts if isinstance(index, ast.Tuple) else [index]
    return all(
        isinstance(part, ast.Slice)
        or (isinstance(part, ast.Constant) and (part.value is None or part.value is Ellipsis))
        for part in parts
    )


# torch functions that wrap a NumPy array as a tensor of its shape
_FROM_ARRAY = frozenset({"torch.from_numpy", "torch.as_tensor"})
# NumPy methods that keep an array's number of elements (a cast, a copy)
_ARRAY_KEEPS = frozenset({"astype", "copy", "reshape", "squeeze", "flatten", "ravel"})


# NumPy functions that build an array of more than one value from a shape or arrays
_ARRAY_BUILDERS = frozenset(
    {"eye", "identity", "zeros", "ones", "full", "arange", "linspace", "stack", "concatenate"}
    | {"transpose", "tile", "outer", "kron", "diag", "vstack", "hstack"}
)


def _past_array_keeps(node: ast.expr, ctx: Context) -> ast.expr:
    """The array a chain of NumPy methods that keep its elements starts from: ``np.eye(n)`` of
    ``np.eye(n).reshape(...).astype(np.float32)``."""
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _ARRAY_KEEPS
        and ctx.call_qualname(node) is None
    ):
        node = node.func.value
    return node


def _numpy_array(node: ast.expr, ctx: Context) -> bool:
    """``np.eye(49).reshape((7, 7, 1, 49))``, ``np.stack(rows)``: a NumPy array built from a
    shape or from arrays (cast or reshaped), never a single number."""
    node = _past_array_keeps(node, ctx)
    if not isinstance(node, ast.Call):
        return False
    name = ctx.call_qualname(node) or ""
    return name.startswith("numpy.") and name.rpartition(".")[2] in _ARRAY_BUILDERS


def _self_array(node: ast.expr, function: ast.AST, line: int, ctx: Context) -> bool:
    """``self.w``, last set before ``line`` in ``function``'s own body to a NumPy array built
    from a shape or from arrays (``self.w = np.transpose(self.w, (3, 2, 0, 1))``)."""
    attr = self_attribute(node)
    if attr is None:
        return False
    last = last_assignment(function, line, lambda t: self_attribute(t) == attr)
    return isinstance(last, ast.Assign) and _numpy_array(last.value, ctx)


def _literal_array(node: ast.expr, ctx: Context) -> bool:
    """``np.array([0.1, 0.1, 0.2, 0.2])`` (also ``np.asarray``, cast or copied:
    ``.astype(np.float32)``): an array of a literal sequence of more than one element."""
    node = _past_array_keeps(node, ctx)
    if not isinstance(node, ast.Call) or not node.args:
        return False
    if ctx.call_qualname(node) not in {"numpy.array", "numpy.asarray"}:
        return False
    first = node.args[0]
    return isinstance(first, (ast.List, ast.Tuple)) and len(first.elts) > 1


def _per_channel(call: ast.Call, ctx: Context) -> bool:
    """``torch.tensor(mean).view(-1, 1, 1)``: values shaped into a ``-1`` dimension, one per
    channel, so more than one whatever the name holds."""
    assert isinstance(call.func, ast.Attribute)
    if call.func.attr not in {"view", "reshape"} or not isinstance(call.func.value, ast.Call):
        return False
    spread = any(isinstance(arg, ast.UnaryOp) and ast.unparse(arg) == "-1" for arg in call.args)
    return spread and ctx.call_qualname(call.func.value) in {"torch.tensor", "torch.Tensor"}


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


# How far `_builds_tensor` follows names, calls and arguments: a rotary table built through a
# helper (`torch.stack([f.real, f.imag])` of `torch.polar(...)` of `torch.outer(t, freqs)`)
# is a dozen steps from the factory at its root.
_MAX_DEPTH = 12
# Attributes of a tensor that are tensors of the same device (a view or a transpose).
_TENSOR_VIEWS = frozenset({"real", "imag", "T", "mT", "H", "mH"})

# Methods of a tensor that return a tensor built from it on the same device (cast, reshaped,
# computed elementwise): the project's list of tensor methods, less the ones that move it to
# the host, and a few more.
_TENSOR_CHAIN = (TENSOR_METHODS - {"cpu", "pin_memory"}) | {
    "fill_",
    "fill_diagonal_",
    "masked_fill_",
    "zero_",
    "triu_",
    "tril_",
    "expand",
    "repeat",
    "clamp",
    "clamp_",
    "exp",
    "sin",
    "cos",
}


def _of_number(call: ast.Call, name: str, function: ast.AST, ctx: Context) -> bool:
    """``torch.tensor(n)`` of a name not known to hold a sequence (``torch.tensor(attn_dim)``
    is 0-dim): only a name bound to a literal sequence or a parameter annotated as one
    (``levels: list[int]``) is taken for more than one element."""
    if name != "torch.tensor" or not call.args or not isinstance(call.args[0], ast.Name):
        return False
    arg = call.args[0]
    bound = _bound_before(function, arg.id, call.lineno)
    if isinstance(bound, (ast.List, ast.Tuple, ast.ListComp)):
        return False
    if isinstance(bound, ast.expr) and _numpy_array(bound, ctx):
        return False  # `w = np.eye(n).reshape(...)`, then `torch.tensor(w)`: an array
    if bound == "parameter":
        args = getattr(function, "args", None)
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if args else []:
            if a.arg == arg.id and a.annotation is not None:
                text = ast.unparse(a.annotation).lower()
                return not any(k in text for k in ("list", "sequence", "tuple", "iterable"))
    return True


_NUMBER_TYPES = frozenset({"float", "int", "bool"})


def _number_parameter(call: ast.Call, name: str, function: ast.AST) -> bool:
    """``torch.tensor(p)`` of a parameter never rebound before the call and annotated as a
    number (``drop_rate: float``, also ``Optional[float]``), or unannotated with a number as
    its default (``p=0.2``): a 0-dim tensor, which mixes with tensors on any device."""
    if name != "torch.tensor" or not call.args or not isinstance(call.args[0], ast.Name):
        return False
    if _bound_before(function, call.args[0].id, call.lineno) != "parameter":
        return False
    arg, default = _parameter(function, call.args[0].id)
    if arg is None:
        return False
    if _narrowed_to_number(function, call, arg.arg):
        return True
    if arg.annotation is not None:
        words = {n.id for n in walk(arg.annotation) if isinstance(n, ast.Name)}
        words |= {
            n.value
            for n in walk(arg.annotation)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
        return bool(words) and words <= _NUMBER_TYPES | {"Optional", "None"}
    return (
        isinstance(default, ast.Constant)
        and isinstance(default.value, (int, float))
        and not isinstance(default.value, bool)
    )


def _narrowed_to_number(function: ast.AST, call: ast.Call, name: str) -> bool:
    """The call sits in the body of ``if isinstance(name, float):`` (or ``int``, ``bool``, a
    tuple of them): whatever the annotation allows, there ``name`` is a Python number."""
    for node in walk(function):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Call)):
            continue
        tested = isinstance_test(node.test)
        if tested is None or tested[0] != name:
            continue
        kinds = tested[1]
        numbers = all(isinstance(k, ast.Name) and k.id in _NUMBER_TYPES for k in kinds)
        if numbers and any(sub is call for stmt in node.body for sub in walk(stmt)):
            return True
    return False


# NumPy functions that turn one number into one number (``np.ones(n)`` makes an array).
_NUMPY_OF_NUMBER = frozenset(
    {"log", "log2", "log10", "log1p", "exp", "sqrt", "abs", "float32", "float64", "int64"}
)


def _module_number(
    node: ast.expr, function: ast.AST, ctx: Context, seen: frozenset[str] = frozenset()
) -> bool:
    """``node`` is a number by the module's own constants: a name the function does not bind
    and the module binds only to number literals (``clip_rho_threshold = 1.0`` at the top of
    minimalRL's ``vtrace.py``), arithmetic of such, or a ``math``/NumPy function of one
    (``np.log(init_alpha)``). ``torch.tensor`` of it is 0-dim."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    parts: list[ast.expr] = []
    if isinstance(node, ast.UnaryOp):
        parts = [node.operand]
    elif isinstance(node, ast.BinOp):
        parts = [node.left, node.right]
    elif isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
        module, _, name = (ctx.call_qualname(node) or "").rpartition(".")
        if module == "math" or (module == "numpy" and name in _NUMPY_OF_NUMBER):
            parts = node.args
    elif isinstance(node, ast.Name) and node.id not in seen and not _binds(function, node.id):
        seen = seen | {node.id}
        values = ctx.scope_bindings(ctx.scope.root()).get(node.id, [])
        if None in values:
            return False
        parts = [value for value in values if value is not None]
    return bool(parts) and all(_module_number(part, function, ctx, seen) for part in parts)


def _binds(function: ast.AST, name: str) -> bool:
    """``function`` binds ``name`` itself: a parameter, or a store in its own body."""
    if _bound_before(function, name, 10**9) == "parameter":
        return True
    return any(
        isinstance(sub, ast.Name) and sub.id == name and not isinstance(sub.ctx, ast.Load)
        for sub in own_nodes(function)
    )


def _parameter(function: ast.AST, name: str) -> tuple[ast.arg | None, ast.expr | None]:
    """The parameter ``name`` of ``function`` and its default (None when it has none)."""
    args = getattr(function, "args", None)
    if not isinstance(args, ast.arguments):
        return None, None
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    pairs = list(zip(positional, [*defaults, *args.defaults], strict=True))
    pairs += list(zip(args.kwonlyargs, args.kw_defaults, strict=True))
    for arg, default in pairs:
        if arg.arg == name:
            return arg, default
    return None, None


def _bound_before(function: ast.AST, name: str, line: int) -> ast.expr | str | None:
    """The value last assigned to ``name`` in ``function``'s own body before ``line``;
    ``"parameter"`` when nothing was (a parameter of the function); None when unknown (a
    loop target, a tuple unpacking, ...). An augmented assignment keeps what was bound."""
    last: tuple[int, ast.expr | None] | None = None
    for sub in own_nodes(function):
        sub_line = getattr(sub, "lineno", line)
        if sub_line >= line or (last is not None and sub_line <= last[0]):
            continue
        if isinstance(sub, ast.Assign):
            for target in sub.targets:
                if isinstance(target, ast.Name) and target.id == name:
                    last = (sub_line, sub.value)
                elif isinstance(base := subscripted(target), ast.Name) and base.id == name:
                    continue  # `mask[i, j] = 0`: an element written, the tensor kept
                elif name in {n.id for n in walk(target) if isinstance(n, ast.Name)}:
                    last = (sub_line, None)
        elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
            if sub.target.id == name:
                last = (sub_line, sub.value)
        elif isinstance(sub, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.NamedExpr)):
            bound = (
                [item.optional_vars for item in sub.items if item.optional_vars is not None]
                if isinstance(sub, (ast.With, ast.AsyncWith))
                else [sub.target]
            )
            if any(name in {n.id for n in walk(b) if isinstance(n, ast.Name)} for b in bound):
                last = (sub_line, None)
    if last is not None:
        return last[1]
    args = getattr(function, "args", None)
    if isinstance(args, ast.arguments) and any(
        a.arg == name for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]
    ):
        return "parameter"
    return None


def _self_bound_before(function: ast.AST, attr: str, line: int) -> ast.expr | None:
    """The value the function's own body last assigns to ``self.<attr>`` before ``line``."""
    last: ast.expr | None = None
    for sub in own_nodes(function):
        if isinstance(sub, ast.Assign) and sub.lineno < line and len(sub.targets) == 1:
            target = sub.targets[0]
            if (
                isinstance(target, ast.Attribute)
                and target.attr == attr
                and dotted_name(target.value) == "self"
                and (last is None or sub.lineno > last.lineno)
            ):
                last = sub.value
    return last


def _tensor_parameter(function: ast.AST, name: str, ctx: Context) -> bool:
    """A parameter annotated ``Tensor`` (or ``Optional[Tensor]``, ``Tensor | None``): the
    caller hands over a tensor, and storing it as is keeps it out of ``.to()``."""
    args = getattr(function, "args", None)
    if not isinstance(args, ast.arguments):
        return False
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
        if arg.arg == name and arg.annotation is not None:
            return is_tensor_annotation(arg.annotation, ctx, optional=True)
    return False


def _built_per_call(cls: Scope, ctx: Context) -> bool:
    """The file builds the class inside a function other than an ``__init__``
    (``sampler = ImportanceRaySampler(ts, weights)`` in a render step): a temporary made from
    the caller's tensors, never moved or saved, not a submodule."""
    cached: bool | None = cls.cache.get("built-per-call")
    if cached is not None:
        return cached
    found = False
    scope: Scope | None = ctx.scope
    while scope is not None and scope.kind != "module":
        scope = scope.parent
    if scope is not None:
        for node in walk(scope.node):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if node.name == "__init__":
                continue
            if any(
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Name)
                and sub.func.id == cls.name
                for sub in own_nodes(node)
            ):
                found = True
                break
    cls.cache["built-per-call"] = found
    return found


def _local_function(
    call: ast.Call, ctx: Context, cls: Scope | None
) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The definition a call reaches in this file: ``self.name(...)`` a method of ``cls``,
    ``name(...)`` a function at the module level."""
    func = call.func
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
        and cls is not None
    ):
        return class_methods(cls).get(func.attr)
    if isinstance(func, ast.Name):
        scope: Scope | None = ctx.scope
        while scope is not None and scope.kind != "module":
            scope = scope.parent
        if scope is None:
            return None
        for item in getattr(scope.node, "body", []):
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == func.id:
                return item
    return None


def _returns_tensor(
    function: ast.FunctionDef | ast.AsyncFunctionDef,
    ctx: Context,
    cls: Scope | None,
    depth: int,
) -> bool:
    """Every ``return`` of ``function`` (one at least) hands back a tensor it built."""
    returns = [
        sub for sub in own_nodes(function) if isinstance(sub, ast.Return) and sub.value is not None
    ]
    return bool(returns) and all(
        r.value is not None and _builds_tensor(r.value, ctx, function, r.lineno, cls, depth)
        for r in returns
    )


def _named_tensors(value: ast.expr, ctx: Context, method: Scope, line: int) -> str | None:
    """``self.flags = {"weights": weights}`` at construction, ``weights`` a ``Tensor``
    parameter or a name bound to a factory: a plain container of tensors all the same."""
    if isinstance(value, ast.Dict):
        elements = [v for v in value.values if v is not None]
    elif isinstance(value, (ast.List, ast.Tuple, ast.Set)):
        elements = list(value.elts)
    else:
        return None
    for element in elements:
        if isinstance(element, ast.Name) and _builds_tensor(
            element, ctx, method.node, line, method.cls
        ):
            return "tensors"
    return None


def _single_value(call: ast.Call, name: str) -> bool:
    """``torch.tensor(0.5)``, ``torch.tensor(x)`` of a number: 0-dim, it mixes with tensors
    on any device (only ``torch.tensor`` of a literal list or a name may hold more)."""
    if name != "torch.tensor" or not call.args:
        return False
    data = call.args[0]
    if isinstance(data, ast.BinOp) and any(
        isinstance(side, (ast.List, ast.ListComp)) for side in (data.left, data.right)
    ):
        return False  # torch.tensor([1] + sizes[:-1]): a list joined to another
    return not isinstance(data, (ast.List, ast.Tuple, ast.ListComp, ast.Name, ast.Call))


def _overrides_placement(cls: Scope) -> bool:
    assert isinstance(cls.node, ast.ClassDef)
    return any(
        isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
        and item.name in _PLACEMENT_OVERRIDES
        for item in cls.node.body
    )


def _placed_cache(cls: Scope, attr: str, builder: str, ctx: Context) -> bool:
    """A container of tensors (YOLO's ``self.grid = [torch.zeros(1)] * nl``) that other
    methods read, placing every element they read (``self.grid[i].to(x[i].device)``)."""
    assert isinstance(cls.node, ast.ClassDef)
    read = any(
        isinstance(sub, ast.Attribute) and self_attribute(sub) == attr
        for item in cls.node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
        and item.name not in {"__init__", builder}
        for sub in walk(item)
    )
    return read and _moved_where_used(cls, attr, builder, listed=True, facts=file_facts(ctx))


def _moved_where_used(
    cls: Scope,
    attr: str,
    builder: str = "__init__",
    *,
    listed: bool = False,
    facts: FileFacts,
) -> bool:
    """Every read of ``self.<attr>`` outside ``__init__`` (and the builder that set it)
    places it first (``self.mean.to(x.device)``, ``self.table[t].to(x)``), or nothing
    reads it. ``listed``: the attribute is a Python list, whose element stores
    (``self.grid[i] = ...``) replace an element, not write into a tensor. ``facts``: the file's,
    to tell a call that only asks whether its argument is set (``exists(self.mask)``)."""
    assert isinstance(cls.node, ast.ClassDef)
    reads = 0
    methods = [
        item
        for item in cls.node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
        and item.name not in {"__init__", builder}
    ]
    # a setting no other method rebinds or updates, read back only as a Python number
    # (`self.pos_weight.item()` in a config record): it never meets the device's data
    constant = not any(
        isinstance(sub, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        and any(
            self_attribute(t) == attr
            for t in (sub.targets if isinstance(sub, ast.Assign) else [sub.target])
        )
        for item in methods
        for sub in walk(item)
    )
    after_placing = _called_after_placing(methods, attr)
    placers = _placing_methods(cls.node, attr)
    for item in methods:
        if item.name in after_placing:
            continue  # a helper the placing method calls once it has placed the attribute
        placed: set[int] = set()
        # `self.x = self.x.to(x.device)`, or a call of a method that does so
        # (`self.extend_pe(x)`): from there on, the method reads it placed
        placed_from = min(_placing_line(item, attr), _first_call(item, placers))
        for sub in walk(item):
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in {"to", "cuda", "type_as"}
                and (sub.func.attr != "to" or moves_to_device(sub))  # not `.to(t.dtype)`: a cast
            ):
                # the attribute moved, or a view of it (`self.table[t].to(x)`), or an arm of
                # a choice moved (`(self.feats if given is None else given).to(x.device)`);
                # not a result computed from it, `torch.where(m, self.y, z).to(d)`: that ran
                # where it was
                base = _chain_base(sub.func.value)
                arms = (base.body, base.orelse) if isinstance(base, ast.IfExp) else (base,)
                placed |= {id(_chain_base(arm)) for arm in arms}
            if isinstance(sub, ast.Compare) and all(
                isinstance(op, (ast.Is, ast.IsNot)) for op in sub.ops
            ):
                # `if self.k_cache is None:` asks whether the cache is set, reading no tensor
                placed |= {id(n) for n in (sub.left, *sub.comparators)}
            if (
                isinstance(sub, ast.Call)
                and len(sub.args) == 1
                and self_attribute(sub.args[0]) == attr
                and _says_none(sub, facts)
            ):
                placed.add(id(sub.args[0]))  # `if exists(self.mask):` asks the same
            if isinstance(sub, ast.Attribute) and sub.attr in _METADATA:
                placed.add(id(sub.value))  # `self.freqs_cis.shape[0]` in an assert: no data
                if isinstance(sub.value, ast.Subscript):
                    placed.add(id(sub.value.value))  # `self.grid[i].shape`: an element's
            if (
                listed
                and isinstance(sub, ast.Assign)
                and isinstance(target := sub.targets[0], ast.Subscript)
            ):
                placed.add(id(target.value))  # `self.grid[i] = ...` replaces a list's element
            receiver = _type_name_receiver(sub)
            if receiver is not None:
                # `if self.alpha.type() != x.type():` compares type names, reading no data
                placed.add(id(receiver))
            if (
                constant
                and isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in {"item", "tolist"}
                and not sub.args
            ):
                placed.add(id(sub.func.value))  # `self.pos_weight.item()`: a number
            if isinstance(sub, ast.IfExp) and _none_branch(sub, attr) is not None:
                placed.add(id(_none_branch(sub, attr)))  # `self.w if self.w is None else ...`
        placed |= _placed_through_alias(item, attr, placed)
        for sub in walk(item):
            if (
                isinstance(sub, ast.Attribute)
                and self_attribute(sub) == attr
                and isinstance(sub.ctx, ast.Load)
                and id(sub) not in placed
                and sub.lineno < placed_from
            ):
                reads += 1
    return reads == 0


def _says_none(call: ast.Call, facts: FileFacts) -> bool:
    """``call`` runs a function of the file, or one imported from a module of the linted tree,
    that only says whether its one argument is ``None`` (``exists(self.mask)`` with ``def
    exists(val): return val is not None``)."""
    found = facts.function_def(call.func)
    return found is not None and returns_none_test(found[1], (ast.Is, ast.IsNot))


def _placing_line(item: ast.AST, attr: str) -> float:
    """The first line where ``item`` rebinds ``self.<attr>`` placed (``self.x =
    self.x.to(x.device)``); infinity when it never does."""
    return min(
        (
            sub.lineno
            for sub in walk(item)
            if isinstance(sub, ast.Assign)
            and any(self_attribute(t) == attr for t in sub.targets)
            and any(_places_attr(n, attr) for n in walk(sub.value))
        ),
        default=float("inf"),
    )


def _placing_methods(cls: ast.ClassDef, attr: str) -> set[str]:
    """The methods of ``cls`` other than ``__init__`` that rebind ``self.<attr>`` placed
    (VALL-E-X's ``extend_pe(x)``: ``self.pe = self.pe.to(dtype=x.dtype, device=x.device)``)."""
    return {
        item.name
        for item in cls.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
        and item.name != "__init__"
        and _placing_line(item, attr) < float("inf")
    }


def _first_call(item: ast.AST, names: set[str]) -> float:
    """The first line where ``item`` calls ``self.<name>(...)`` for one of ``names``."""
    return min(
        (
            sub.lineno
            for sub in walk(item)
            if isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and isinstance(sub.func.value, ast.Name)
            and sub.func.value.id == "self"
            and sub.func.attr in names
        ),
        default=float("inf"),
    )


def _called_after_placing(
    methods: list[ast.FunctionDef | ast.AsyncFunctionDef], attr: str
) -> set[str]:
    """The methods called (``self.helper(...)``) only from methods that rebind ``self.<attr>``
    placed above the call (faster-rcnn's ``forward`` runs ``self.BBOX_NORMALIZE_MEANS =
    self.BBOX_NORMALIZE_MEANS.type_as(gt_boxes)``, then ``self._sample_rois_pytorch(...)``,
    which reads it): they read it placed."""
    placing = {
        item.name: line for item in methods if (line := _placing_line(item, attr)) < float("inf")
    }
    if not placing:
        return set()
    # each `self.name(...)` call: (the calling method, whether it comes after the placing)
    sites: dict[str, list[tuple[str, bool]]] = {}
    for item in methods:
        for sub in walk(item):
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and isinstance(sub.func.value, ast.Name)
                and sub.func.value.id == "self"
            ):
                after = item.name in placing and placing[item.name] < sub.lineno
                sites.setdefault(sub.func.attr, []).append((item.name, after))
    found: set[str] = set()
    grew = True
    while grew:  # also the helpers such a helper calls, and only it
        grew = False
        for name, calls in sites.items():
            if name not in found and all(after or caller in found for caller, after in calls):
                found.add(name)
                grew = True
    return found


def _placed_through_alias(item: ast.AST, attr: str, placed: set[int]) -> set[int]:
    """The reads of ``self.<attr>`` bound to a local name whose next use rebinds it placed
    (Point-BERT's ``seed = self.folding_seed.unsqueeze(2).expand(...)``, then ``seed =
    seed.reshape(...).to(x.device)``): the method works on a placed copy (``placed``: the
    nodes already known to be placed)."""
    found: set[int] = set()
    for sub in walk(item):
        if not (
            isinstance(sub, ast.Assign)
            and len(sub.targets) == 1
            and isinstance(sub.targets[0], ast.Name)
        ):
            continue
        reads = [
            n
            for n in walk(sub.value)
            if isinstance(n, ast.Attribute)
            and self_attribute(n) == attr
            and isinstance(n.ctx, ast.Load)
        ]
        if not reads or self_attribute(_chain_base(sub.value)) != attr:
            continue  # `Gamma(self.alpha, self.beta).sample(n)`: computed where it lives
        name = sub.targets[0].id
        first = _next_use(item, name, sub.end_lineno or sub.lineno)
        if first is None or id(first) not in placed:
            continue
        if any(
            isinstance(other, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in other.targets)
            and any(n is first for n in walk(other.value))
            for other in walk(item)
        ):
            found.update(id(n) for n in reads)
    return found


def _chain_base(node: ast.expr) -> ast.expr:
    """What a chain of methods and subscripts starts from: ``self.seed`` of
    ``self.seed.unsqueeze(2).expand(b, -1)[0]``, a view or copy of it."""
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            node = node.func.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return node


def _next_use(item: ast.AST, name: str, after: int) -> ast.Name | None:
    """The first read of ``name``'s data in ``item`` on a line after ``after``: a question
    about its metadata (GPT-J's ``if embed_positions.device != position_ids.device:``) reads
    none."""
    asked = {
        id(n.value) for n in walk(item) if isinstance(n, ast.Attribute) and n.attr in _METADATA
    }
    uses = [
        n
        for n in walk(item)
        if isinstance(n, ast.Name)
        and n.id == name
        and isinstance(n.ctx, ast.Load)
        and n.lineno > after
        and id(n) not in asked
    ]
    return min(uses, key=lambda n: (n.lineno, n.col_offset), default=None)


def _none_branch(node: ast.IfExp, attr: str) -> ast.expr | None:
    """The branch of ``self.w if self.w is None else f(self.w)`` (or ``... if self.w is not
    None else self.w``) that hands back ``self.<attr>`` only where it is ``None``."""
    test = node.test
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Is, ast.IsNot))
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
        and self_attribute(test.left) == attr
    ):
        return None
    branch = node.body if isinstance(test.ops[0], ast.Is) else node.orelse
    return branch if self_attribute(branch) == attr else None


# What a tensor answers about itself without its data: open_lm's rotary embedding asserts on
# `self.freqs_cis.shape[0]`, then moves it with `self.freqs_cis = self.freqs_cis.to(q.device)`.
_METADATA = frozenset({"shape", "dtype", "ndim", "device", "is_cuda", "size", "dim"})


def _type_name_receiver(node: ast.AST) -> ast.expr | None:
    """``x`` of ``x.type()`` with no arguments, which answers the tensor's type name
    (``"torch.cuda.FloatTensor"``), not its data; ``x.type(torch.cuda.FloatTensor)`` casts
    and is not this."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "type"
        and not node.args
        and not node.keywords
    ):
        return node.func.value
    return None


def _places_attr(node: ast.AST, attr: str) -> bool:
    """``self.<attr>.to(...)`` (``.cuda()``, ``.type_as(...)``)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"to", "cuda", "type_as"}
        and any(self_attribute(n) == attr for n in walk(node.func.value))
    )


def _report_attribute(ctx: Context, node: ast.AST, cls: Scope, attr: str) -> None:
    if attr in _registered_later(cls, ctx) or attr in _registered_by_name(cls):
        return
    if attr in _mapped_by_apply(ctx):
        return
    ctx.report(
        PLAIN_CONTAINER.code,
        node,
        f"`{cls.name}.{attr}` keeps a tensor as a plain attribute: `.to()` leaves it on the "
        "device it was built on and `state_dict()` does not save it; use `register_buffer` "
        "(`persistent=False` for a cache)",
    )


def _mapped_by_apply(ctx: Context) -> frozenset[str]:
    """Attributes an ``_apply`` override of the file reassigns on a module it holds (a model
    whose ``_apply`` does ``m.grid = list(map(fn, m.grid))`` for its ``Detect`` head): every
    ``.to()``/``.half()`` of the model moves them too."""
    root = ctx.scope.root()
    cached: frozenset[str] | None = root.cache.get("mapped-by-apply")
    if cached is None:
        trees = [root.node]
        for other in mentioning(ctx.path):  # YOLOv6's `Model._apply` in yolo.py, for its head's
            text = text_of(other)
            facts = facts_for_file(other) if text is not None and "def _apply" in text else None
            if facts is not None:
                trees.append(facts.tree)
        cached = root.cache["mapped-by-apply"] = frozenset(
            target.attr
            for tree in trees
            for sub in walk(tree)
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name == "_apply"
            for stmt in own_nodes(sub)
            if isinstance(stmt, ast.Assign)
            for target in stmt.targets
            if isinstance(target, ast.Attribute)
        )
    return cached


def _registered_by_name(cls: Scope) -> set[str]:
    """Attributes passed to a registration call by value or by name
    (``self.register_buffer("mask", self.mask)``, ``setattr(self, "mask", ...)``)."""
    found: set[str] = set()
    for sub in walk(cls.node):
        if isinstance(sub, ast.Call) and _is_register(sub):
            for arg in sub.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.add(arg.value)
                found |= {self_attribute(n) or "" for n in walk(arg)} - {""}
    return found


_REGISTER = frozenset(
    {"add_module", "register_module", "register_buffer", "register_parameter", "setattr"}
)


def _is_register(call: ast.AST) -> bool:
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    return (isinstance(func, ast.Attribute) and func.attr in _REGISTER) or (
        isinstance(func, ast.Name) and func.id in _REGISTER
    )


def _registered_later(cls: Scope, ctx: Context) -> set[str]:
    """Attributes the class registers after all: ``self.x = nn.ModuleList(self.x)``,
    ``for i, m in enumerate(self.x): self.add_module(str(i), m)``, or each element as it is
    added (``self.add_module(name, self.x[-1])``). Also the modules of a plain container
    handed to a module container stored under another attribute (monodepth2's
    ``self.net = nn.ModuleList(list(self.convs.values()))``): the same modules, registered
    there, move and save with the module."""
    cached: set[str] | None = cls.cache.get("registered-later")
    if cached is not None:
        return cached
    found: set[str] = set()
    branched = _in_branches(cls.node)
    for sub in walk(cls.node):
        if isinstance(sub, ast.Call) and _is_register(sub):
            for arg in sub.args[1:]:
                attr = self_attribute(arg.value) if isinstance(arg, ast.Subscript) else None
                if attr is not None:
                    found.add(attr)
        if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call):
            if _computes(sub.value, ctx):
                continue  # `self.w = np.transpose(self.w, ...)`: an array, not a registration
            held = {self_attribute(n) for arg in sub.value.args for n in walk(arg)} - {None}
            for target in sub.targets:
                attr = self_attribute(target)
                if attr is not None and attr in held and id(sub) not in branched:
                    found.add(attr)
                elif attr is not None and _module_container(sub.value, ctx):
                    found.update(a for a in held if a is not None)
        elif isinstance(sub, (ast.For, ast.AsyncFor)):
            iterated = {self_attribute(n) for n in walk(sub.iter)} - {None}
            if iterated and any(_is_register(n) for stmt in sub.body for n in walk(stmt)):
                found.update(a for a in iterated if a is not None)
    cls.cache["registered-later"] = found
    return found


def _computes(call: ast.Call, ctx: Context) -> bool:
    """A NumPy function (``np.transpose(w, ...)``): it computes an array from its arguments
    and registers nothing."""
    return (ctx.call_qualname(call) or "").startswith("numpy.")


def _in_branches(cls: ast.AST) -> set[int]:
    """The statements of the class's methods that run on one branch of an ``if`` only: ``if
    self.learn_logvar: self.logvar = nn.Parameter(self.logvar)`` registers the tensor on
    that branch, and leaves it a plain attribute on the other."""
    found: set[int] = set()
    for method in cls.body if isinstance(cls, ast.ClassDef) else []:
        for node in walk(method):
            if isinstance(node, ast.If):
                found.update(id(sub) for stmt in (*node.body, *node.orelse) for sub in walk(stmt))
    return found


def _report(ctx: Context, node: ast.AST, cls: Scope, attr: str, held: str) -> None:
    if attr in _registered_later(cls, ctx) or attr in _mapped_by_apply(ctx):
        return
    ctx.report(
        PLAIN_CONTAINER.code,
        node,
        f"`{cls.name}.{attr}` keeps {held} in a plain Python container: `.to()`, `state_dict()` "
        f"and `parameters()` do not see them; {_advice(held)}",
    )


FAMILY = Family(
    rules=(PLAIN_CONTAINER,),
    checks=(
        (ast.Assign, _assign, (PLAIN_CONTAINER.code,)),
        (ast.AnnAssign, _ann_assign, (PLAIN_CONTAINER.code,)),
        (ast.Expr, _expr, (PLAIN_CONTAINER.code,)),
    ),
    triggers=(),
)
