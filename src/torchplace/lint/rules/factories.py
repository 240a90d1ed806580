"""TPL103 (placement family): a tensor factory on a module's ``forward`` path, or in any
function where it is built to match a tensor parameter (``dtype=x.dtype``, or combined with
``x``), that allocates on the default device whatever the input's device.

A factory is left alone when it is given ``device=``/``out=``, draws a host scalar
(``torch.rand(1)``), builds a 0-dim or empty tensor, is read back or tested on the host, is
moved to a device in the statements after it, or sits in a test (a stand-in model runs where
the test does).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping

from torchplace.lint.base import (
    Context,
    Rule,
    Scope,
    call_name,
    has_star_kwargs,
    keyword,
    names_in,
)
from torchplace.lint.nodes import own_nodes, subscripted, walk
from torchplace.lint.provenance.files import file_facts
from torchplace.lint.provenance.values import (
    _device_helper,
    _is_cpu,
    _passes_device,
    moves_to_device,
)
from torchplace.lint.resolver import dotted_name
from torchplace.lint.rules.factory_match import (
    COMBINERS,
    HOST_CASTS,
    _cpu_path,
    matched_to_parameter,
    meets_device_tensor,
)
from torchplace.lint.rules.facts import (
    FACTORIES,
    cpu_only_program,
    cpu_only_script_class,
    in_test,
    main_test,
)

__all__ = ["FACTORY", "check_factory"]

FACTORY = Rule(
    "TPL103",
    "factory-without-device",
    "tensor factory without `device=` in `forward` or built to match a tensor parameter",
)


# Base-class methods that call the subclass's hooks: PyTorch Geometric's
# ``MessagePassing.propagate`` runs ``message``, ``aggregate`` and ``update`` on the inputs.
_DISPATCHERS = {
    "propagate": ("message", "aggregate", "update", "message_and_aggregate"),
    "edge_updater": ("edge_update",),
}


def _forward_reachable(cls: Scope) -> set[str]:
    """``forward`` and the methods it calls through ``self.name(...)``, transitively (also
    the hooks a base-class dispatcher such as ``self.propagate(...)`` calls)."""
    cached: set[str] | None = cls.cache.get("forward-reachable")
    if cached is not None:
        return cached
    assert isinstance(cls.node, ast.ClassDef)
    methods = _class_methods(cls.node)
    module = cls.parent.node if cls.parent is not None else None
    # methods another module of the file runs from its `forward` on an instance it holds
    held = _holder_calls(cls.parent).get(cls.node.name, set()) if cls.parent else set()
    entries = sorted(held & set(methods))
    if "forward" in methods:
        reached = _self_reachable(methods, ["forward", *entries])
    else:  # a hook the `forward` of a base class of the file calls: `self._forward(x, y)`
        hooks = _inherited_hooks(cls.node, module, depth=0)
        reached = _self_reachable(methods, sorted((hooks & set(methods)) | set(entries)))
    cls.cache["forward-reachable"] = reached
    return reached


def _class_methods(node: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The methods a class body defines, by name."""
    return {
        item.name: item
        for item in node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def _holder_calls(module: Scope) -> dict[str, set[str]]:
    """Per class of the file, the names another class with a ``forward`` calls, on its forward
    path, on an instance of it that it holds: ``self.GridGenerator = GridGenerator(F, size)``
    in ``TPS_SpatialTransformerNetwork.__init__``, then ``self.GridGenerator.build_P_prime(c)``
    in its ``forward``; the method runs on every forward of the model that holds it. Read once
    per file (cached on its scope)."""
    cached: dict[str, set[str]] | None = module.cache.get("holder-calls")
    if cached is not None:
        return cached
    found: dict[str, set[str]] = {}
    for other in getattr(module.node, "body", []):
        if not isinstance(other, ast.ClassDef):
            continue
        methods = _class_methods(other)
        if "forward" not in methods:
            continue
        holders: dict[str, set[str]] = {}  # self.attr = Cls(...): attr -> the classes
        for node in walk(other):
            if not (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id != other.name
            ):
                continue
            for target in node.targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    holders.setdefault(target.attr, set()).add(node.value.func.id)
        if not holders:
            continue
        for name in _self_reachable(methods, ["forward"]):
            for sub in walk(methods[name]):
                if (
                    isinstance(sub, ast.Call)
                    and isinstance(sub.func, ast.Attribute)
                    and isinstance(sub.func.value, ast.Attribute)
                    and sub.func.value.attr in holders
                    and isinstance(sub.func.value.value, ast.Name)
                    and sub.func.value.value.id == "self"
                ):
                    for held in holders[sub.func.value.attr]:
                        found.setdefault(held, set()).add(sub.func.attr)
    module.cache["holder-calls"] = found
    return found


def _self_reachable(methods: Mapping[str, ast.AST], start: list[str]) -> set[str]:
    """``start`` and the methods of ``methods`` they call through ``self.name(...)``,
    transitively (also the hooks of a base-class dispatcher)."""
    reached: set[str] = set()
    todo = list(start)
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        for called in _self_calls(methods[name]):
            if called in methods:
                todo.append(called)
            elif called in _DISPATCHERS:
                todo.extend(h for h in _DISPATCHERS[called] if h in methods)
    return reached


def _self_calls(node: ast.AST) -> Iterator[str]:
    """The names ``node`` calls as ``self.name(...)``."""
    for sub in walk(node):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and isinstance(sub.func.value, ast.Name)
            and sub.func.value.id == "self"
        ):
            yield sub.func.attr


def _inherited_hooks(cls: ast.ClassDef, module: ast.AST | None, depth: int) -> set[str]:
    """The names a ``forward`` of a base class of the same file (two classes up at most)
    calls on ``self``, directly or through that base's own methods: a template method
    (``LossFunction.forward`` running ``self._forward(prediction, target)``) whose hooks the
    subclass implements."""
    if depth > 1 or module is None:
        return set()
    classes = {
        node.name: node for node in getattr(module, "body", []) if isinstance(node, ast.ClassDef)
    }
    found: set[str] = set()
    for base in cls.bases:
        node = classes.get(base.id) if isinstance(base, ast.Name) else None
        if node is None or node is cls:
            continue
        methods = _class_methods(node)
        if "forward" not in methods:
            found |= _inherited_hooks(node, module, depth + 1)
            continue
        for name in _self_reachable(methods, ["forward"]):
            found.update(_self_calls(methods[name]))
    return found


# `pin_memory`: a pinned buffer is host memory on purpose, a staging area for copies.
_HOST_READS = frozenset(
    {"item", "tolist", "numpy", "cpu", "to", "cuda", "type_as", "type", "pin_memory"}
)
_PLACERS = frozenset({"to", "cuda", "type_as"})
_DRAWS = frozenset(
    {"torch.rand", "torch.randn", "torch.randint", "torch.empty", "torch.zeros", "torch.randperm"}
)
# In-place random fills: `torch.Tensor(1).uniform_(0, p)` is a draw, as `torch.rand(1)` is.
_RANDOM_FILLS = frozenset(
    {"uniform_", "normal_", "random_", "bernoulli_", "exponential_", "geometric_", "cauchy_"}
)


def _takes_tensor(method: Scope) -> bool:
    """Whether a method has a parameter (besides ``self``) that may be a tensor."""
    node = method.node
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
    for arg in args[1:] if args and args[0].arg in {"self", "cls"} else args:
        annotation = arg.annotation
        if annotation is None:
            return True
        text = ast.dump(annotation)
        if "Tensor" in text or "Any" in text:
            return True
    return node.args.vararg is not None


def _static(method: Scope) -> bool:
    node = method.node
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    return any(
        isinstance(d, ast.Name) and d.id in {"staticmethod", "classmethod"}
        for d in node.decorator_list
    )


_SCALAR_CALLS = frozenset({"len", "int", "float", "round", "max", "min", "abs", "sum"})
_SCALAR_METHODS = frozenset({"size", "item", "dim", "numel", "sqrt", "log"})


def _scalar_draw(call: ast.Call, name: str) -> bool:
    """``torch.rand(1)``, ``torch.randint(0, n, (1,))``: a host-side random scalar."""
    if name not in _DRAWS:
        return False
    size = keyword(call, "size")
    if size is not None:
        shape: ast.expr | None = size.value
    elif name == "torch.randint":
        shape = call.args[-1] if call.args else None
    else:
        shape = call.args[0] if len(call.args) == 1 else None
    if isinstance(shape, (ast.Tuple, ast.List)) and len(shape.elts) == 1:
        shape = shape.elts[0]
    if isinstance(shape, (ast.Tuple, ast.List)) and not shape.elts:
        # torch.rand([]), torch.randint(0, n, ()): a 0-dim draw
        return name != "torch.randint" or len(call.args) >= 2 or size is not None
    if isinstance(shape, ast.Constant) and shape.value == 0 and name != "torch.randint":
        return True  # torch.empty([0]): an empty placeholder
    return (
        isinstance(shape, ast.Constant)
        and shape.value == 1
        and (name != "torch.randint" or len(call.args) >= 2 or size is not None)
    )


def _filled_draw(call: ast.Call, name: str, ctx: Context) -> bool:
    """``torch.Tensor(1).uniform_(0, p)[0]``: one element filled at random in place, the
    legacy spelling of a host-side random scalar."""
    parent = ctx.parents[-1] if ctx.parents else None
    return (
        isinstance(parent, ast.Attribute)
        and parent.value is call
        and parent.attr in _RANDOM_FILLS
        and _scalar_draw(call, "torch.zeros" if name in _SHAPED else name)
    )


# Factories whose positional integers are a shape (``torch.Tensor(n)`` is n elements too).
_SHAPED = frozenset({"torch.empty", "torch.zeros", "torch.ones", "torch.Tensor"})


def _empty_shape(call: ast.Call, name: str) -> bool:
    """``torch.empty(0, 0)``, ``torch.zeros((0, 4))``, ``torch.Tensor(0)``: a shape with a
    literal ``0`` holds no element, an empty placeholder (a missing input's default, a freed
    buffer) that meets no tensor's values. A legacy ``torch.Tensor((0,))`` is data, not a
    shape. A bare ``torch.Tensor()`` holds no element either (shape ``(0,)``)."""
    if name not in _SHAPED or (call.keywords and name == "torch.Tensor"):
        return False
    if name == "torch.Tensor" and not call.args:
        return True  # `tuple([torch.Tensor()] * n)`: empty stand-ins for an unused input
    dims: list[ast.expr] = list(call.args)
    size = keyword(call, "size")
    if size is not None:
        dims = [size.value]
    if len(dims) == 1 and isinstance(dims[0], (ast.Tuple, ast.List)) and name != "torch.Tensor":
        dims = list(dims[0].elts)
    return any(isinstance(d, ast.Constant) and d.value == 0 for d in dims) and all(
        isinstance(d, (ast.Constant, ast.Name, ast.Attribute, ast.Subscript, ast.Call))
        and not (isinstance(d, ast.Constant) and not isinstance(d.value, int))
        for d in dims
    )


def _scalar_tensor(call: ast.Call, name: str) -> bool:
    """``torch.tensor(2.0)`` is 0-dim (mixes with any device) and ``torch.tensor([])`` empty
    (``torch.Tensor([...])`` likewise; ``torch.Tensor(n)`` is a size, never a value)."""
    if name not in {"torch.tensor", "torch.Tensor"} or not call.args:
        return False
    data = call.args[0]
    if isinstance(data, (ast.List, ast.Tuple)):
        return len(data.elts) <= 1 and all(isinstance(e, ast.Constant) for e in data.elts)
    if name == "torch.Tensor":
        return False  # torch.Tensor(n) is n uninitialised elements, not the number n
    if isinstance(data, ast.Call):
        func = data.func
        if isinstance(func, ast.Name):
            return func.id in _SCALAR_CALLS
        # x.size(-1), x.numel(), math.sqrt(d): a Python number
        return (
            isinstance(func, ast.Attribute)
            and func.attr in _SCALAR_METHODS
            and (func.attr != "size" or bool(data.args))
        )
    return not isinstance(data, (ast.ListComp, ast.Name, ast.Subscript, ast.Starred))


def _sized_data(call: ast.Call, ctx: Context) -> bool:
    """``torch.tensor(self.quantiles)`` where the function also takes ``len(self.quantiles)``
    or iterates it: the data is a sequence, so the tensor is no 0-dim one."""
    scope = ctx.function_scope()
    text = dotted_name(call.args[0]) if call.args else None
    if scope is None or text is None or "." not in text:
        return False
    for sub in walk(scope.node):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Name)
            and sub.func.id == "len"
            and len(sub.args) == 1
            and dotted_name(sub.args[0]) == text
        ):
            return True
        if isinstance(sub, (ast.For, ast.comprehension)) and dotted_name(sub.iter) == text:
            return True
    return False


def _number_tensor(call: ast.Call, name: str, ctx: Context) -> bool:
    """``torch.tensor(mask_value)`` with ``mask_value`` bound only to Python numbers in the
    function (RecBole's ``mask_value = -np.inf`` or ``0.0``, then ``output.masked_fill(mask,
    value=torch.tensor(mask_value))``): a 0-dim tensor, which mixes with any device."""
    scope = ctx.function_scope()
    if name != "torch.tensor" or len(call.args) != 1 or scope is None:
        return False
    data = call.args[0]
    if not isinstance(data, ast.Name):
        return False
    params = getattr(scope.node, "args", None)
    param = next(
        (
            a
            for a in (
                [*params.posonlyargs, *params.args, *params.kwonlyargs]
                if isinstance(params, ast.arguments)
                else []
            )
            if a.arg == data.id
        ),
        None,
    )
    if param is not None and not _number_annotation(param.annotation):
        return False  # a parameter holds what the callers hand it
    values = [
        sub.value
        for sub in walk(scope.node)
        if isinstance(sub, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        and any(
            isinstance(t, ast.Name) and t.id == data.id
            for t in (sub.targets if isinstance(sub, ast.Assign) else [sub.target])
        )
    ]
    if param is not None:  # `temp: Optional[float]`: a number, unless rebound to another
        return all(v is not None and _python_number(v) for v in values)
    return bool(values) and all(v is not None and _python_number(v) for v in values)


_NUMBER_TYPES = frozenset({"float", "int"})


def _number_annotation(node: ast.expr | None) -> bool:
    """``float``, ``int``, ``Optional[float]``, ``float | None``: a Python number (or None)."""
    if isinstance(node, ast.Name):
        return node.id in _NUMBER_TYPES
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in _NUMBER_TYPES
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [node.left, node.right]
        plain = [s for s in sides if not (isinstance(s, ast.Constant) and s.value is None)]
        return bool(plain) and all(_number_annotation(s) for s in plain)
    if isinstance(node, ast.Subscript) and isinstance(node.value, (ast.Name, ast.Attribute)):
        outer = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
        return outer == "Optional" and _number_annotation(node.slice)
    return False


def _python_number(node: ast.expr) -> bool:
    """``0.0``, ``-1e9``, ``-np.inf``, ``math.pi``, ``float("inf")``: a Python number."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.Attribute):
        return node.attr in {"inf", "nan", "pi", "e"} and isinstance(node.value, ast.Name)
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"float", "int"}
        and all(isinstance(a, ast.Constant) for a in node.args)
    )


_CLAMPS = frozenset({"clamp", "clamp_", "clip", "clip_"})


def _clamp_bound(call: ast.Call, ctx: Context) -> bool:
    """``torch.clamp(x, max=torch.log(torch.tensor(100.0)))``: a tensor bound of ``clamp``
    must be on ``x``'s device (since torch 1.12), 0-dim or not; a 0-dim tensor mixes with any
    device only as an operand of arithmetic."""
    inner: ast.AST = call
    for outer in reversed(ctx.parents):
        if isinstance(outer, ast.Call):
            func = outer.func
            is_clamp = isinstance(func, ast.Attribute) and func.attr in _CLAMPS
            if is_clamp and inner is not func:
                # torch.clamp(x, lo, hi): x is the first argument; x.clamp(lo, hi): the receiver
                own = ctx.qualname(func) is not None
                return not (own and outer.args and outer.args[0] is inner)
        elif not isinstance(outer, (ast.expr, ast.keyword)) or isinstance(outer, ast.Lambda):
            return False
        inner = outer
    return False


def _stored_into_element(call: ast.Call, ctx: Context) -> bool:
    """``grid[:, :, 1] = torch.arange(w).repeat(h) * step + ox``: the factory's values, through
    host arithmetic and method calls on them, are written into elements of another tensor,
    which copies them to that tensor's device (the target's own allocation decides where).
    Not when the arithmetic takes a parameter of the function (``* video[0]``: the input may be
    on the device, and a host tensor cannot meet it)."""
    scope = ctx.function_scope()
    func = scope.node if scope is not None else None
    params = (
        {a.arg for a in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs)}
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
        else set()
    ) - {"self"}
    node: ast.AST = call
    for parent in reversed(ctx.parents):
        if isinstance(parent, ast.Assign):
            return parent.value is node and all(
                isinstance(target, ast.Subscript) for target in parent.targets
            )
        if isinstance(parent, ast.BinOp):
            other = parent.right if parent.left is node else parent.left
            if names_in(other) & params:
                return False
        elif not (
            isinstance(parent, ast.UnaryOp)
            or (isinstance(parent, ast.Attribute) and parent.value is node)
            or (isinstance(parent, ast.Call) and parent.func is node)
        ):
            return False
        node = parent
    return False


def _moved_later(call: ast.Call, ctx: Context) -> bool:
    """``t = torch.zeros(n)`` and, in the statements after it, ``t`` (or a value built
    from it) goes through ``.to(...)``/``.cuda()``: placed, only later."""
    if not ctx.stmt_path:
        return False
    block, index = ctx.stmt_path[-1]
    stmt = block[index]
    names: set[str] = set()
    if isinstance(stmt, ast.Assign):  # t = torch.arange(n).float() * 2, self.mask = ...
        if not any(sub is call for sub in walk(stmt.value)):
            return False  # `out[torch.arange(b), idx] = v`: an index of the target, not stored
        names = {name for t in stmt.targets for name in _refs(subscripted(t))}
    elif (  # parts.append(torch.arange(n))
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr in {"append", "extend"}
    ):
        names = names_in(stmt.value.func.value)
    names.discard("self")
    if not names:
        return False
    scope = ctx.function_scope()
    own_body = getattr(scope.node, "body", None) if scope is not None else None
    return _moved_after(ctx.stmt_path, names, own_body, placers=_placing_functions(ctx))


def _placing_functions(ctx: Context) -> frozenset[str]:
    """The functions of the file that hand back their first argument moved (or as it is on
    the CPU path): PyTorchZeroToAll's ``create_variable(tensor)``."""
    root = ctx.scope.root()
    cached: frozenset[str] | None = root.cache.get("placing-functions")
    if cached is None:
        facts = file_facts(ctx)
        cached = root.cache["placing-functions"] = frozenset(
            name
            for name, found in facts.defs.items()
            if found and all(_returns_moved_parameter(node) for node in found)
        )
    return cached


def _moved_after(
    stmt_path: list[tuple[list[ast.stmt], int]],
    names: set[str],
    own_body: object,
    always: bool = False,
    placers: frozenset[str] = frozenset(),
) -> bool:
    """In the statements after the innermost one of ``stmt_path`` (also after the blocks
    holding it, up to the function's own body), ``names`` (or a value built from them) go
    through ``.to(...)``/``.cuda()``; with ``always``, only by plain statements of those
    blocks, not under a branch (``if self.cuda: y = y.type_as(x)`` may leave it behind)."""
    names = set(names)
    for block, index in reversed(stmt_path):
        for later in block[index + 1 :]:
            if always:
                if isinstance(later, (ast.Assign, ast.AugAssign, ast.Expr, ast.Return)):
                    if _moves_any(later, names, placers):
                        return True
                    names |= _holders(later, names)
                continue
            if _moves_any(later, names, placers):
                return True
            inner = _in_order(later)  # also into a later loop's body, twice: carried
            for stmt in inner * (2 if len(inner) > 1 else 1):
                names |= _holders(stmt, names)
            if _moves_any(later, names, placers):
                return True
        if block is own_body:
            break
    return False


def _holders(stmt: ast.stmt, names: set[str]) -> set[str]:
    """The names ``stmt`` binds to a value built from ``names`` (``t2 = t * 2``), or the
    list it collects one of them into (``grids.append(grid)``)."""
    if isinstance(stmt, ast.Assign) and _refs(stmt.value) & names:
        return {name for t in stmt.targets for name in _refs(t)} - {"self"}
    if (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute)
        and stmt.value.func.attr in {"append", "extend"}
        and any(names_in(arg) & names for arg in stmt.value.args)
    ):
        return names_in(stmt.value.func.value) - {"self"}
    return set()


def _in_order(stmt: ast.stmt) -> list[ast.stmt]:
    """``stmt`` and the statements nested in its blocks (a loop's, an ``if``'s), in source
    order; not into nested functions or classes."""
    out = [stmt]
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return out
    for field in ("body", "orelse", "finalbody"):
        for inner in getattr(stmt, field, None) or []:
            out += _in_order(inner)
    for handler in getattr(stmt, "handlers", None) or []:
        for inner in handler.body:
            out += _in_order(inner)
    return out


def _placed_by_callers(call: ast.Call, ctx: Context, method: Scope | None) -> bool:
    """The method returns the factory's tensor (``weights = torch.zeros(...)``, filled, then
    ``return weights``) and every call of it in its class places the result right away,
    ``self._get_weights(lens).to(attn.device)``: placed, by the caller. A call in ``__init__``
    builds with the module, on the CPU, and moves with it (SwinIR's ``attn_mask =
    self.calculate_mask(self.input_resolution)``, registered as a buffer, beside
    ``self.calculate_mask(x_size).to(x.device)`` in ``forward``)."""
    if method is None or method.cls is None or not ctx.stmt_path:
        return False
    block, index = ctx.stmt_path[-1]
    stmt = block[index]
    if isinstance(stmt, ast.Return):
        names = {"<returned>"}
    elif isinstance(stmt, ast.Assign):
        names = {name for t in stmt.targets for name in _refs(t)} - {"self"}
    else:
        return False
    if "<returned>" not in names and not _returns_any(method.node, names):
        return False
    calls = [
        sub
        for item in getattr(method.cls.node, "body", [])
        if not (isinstance(item, ast.FunctionDef) and item.name == "__init__")
        for sub in walk(item)
        if isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == method.name
        and isinstance(sub.func.value, ast.Name)
        and sub.func.value.id == "self"
    ]
    placed = {
        id(sub.value)
        for sub in walk(method.cls.node)
        if isinstance(sub, ast.Attribute) and sub.attr in {"to", "cuda", "type_as"}
    }
    stored = method.cls.cache.get("stored-then-placed")
    if stored is None:
        stored = method.cls.cache["stored-then-placed"] = _stored_then_placed(method.cls.node)
    placed |= stored
    return bool(calls) and all(
        id(sub) in placed or _result_placed(sub, method.cls.node, set()) for sub in calls
    )


def _statement_paths(
    block: list[ast.stmt], path: list[tuple[list[ast.stmt], int]]
) -> Iterator[list[tuple[list[ast.stmt], int]]]:
    """The path of blocks to each statement nested in ``block`` (not into nested functions
    or classes), the innermost last."""
    for index, stmt in enumerate(block):
        here = [*path, (block, index)]
        yield here
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if inner:
                yield from _statement_paths(inner, here)
        for handler in getattr(stmt, "handlers", None) or []:
            yield from _statement_paths(handler.body, here)


def _result_placed(call: ast.Call, cls: ast.AST, seen: set[str]) -> bool:
    """The result of ``self.helper(...)`` (``call``, in a method of ``cls`` other than
    ``__init__``) is placed by the method it is called in: bound to a name that is moved
    later there, ``weighting = self.delta_border(h, w)``, clipped, then
    ``weighting.view(...).to(device)``; or handed back, directly or through names built from
    it, by a method whose every call in the class is placed so (latent diffusion's
    ``arr = self.meshgrid(h, w) / corner`` in ``delta_border``)."""
    for item in getattr(cls, "body", []):
        if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if item.name == "__init__":
            continue
        for path in _statement_paths(item.body, []):
            block, index = path[-1]
            stmt = block[index]
            if not isinstance(stmt, (ast.Assign, ast.Return)):
                continue
            if stmt.value is None or not any(sub is call for sub in walk(stmt.value)):
                continue
            if isinstance(stmt, ast.Assign):
                names = {name for t in stmt.targets for name in _refs(t)} - {"self"}
                if not names:
                    return False
                if _moved_after(path, names, item.body, always=True):
                    return True
                if not _returns_any(item, names):
                    return False
            if item.name in seen or len(seen) > 3:
                return False
            callers = [
                sub
                for other in getattr(cls, "body", [])
                if not (isinstance(other, ast.FunctionDef) and other.name == "__init__")
                for sub in walk(other)
                if isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr == item.name
                and isinstance(sub.func.value, ast.Name)
                and sub.func.value.id == "self"
            ]
            placed = {
                id(sub.value)
                for sub in walk(cls)
                if isinstance(sub, ast.Attribute) and sub.attr in {"to", "cuda", "type_as"}
            }
            return bool(callers) and all(
                id(sub) in placed or _result_placed(sub, cls, seen | {item.name}) for sub in callers
            )
    return False


def _stored_then_placed(cls: ast.AST) -> set[int]:
    """The calls whose result a statement stores (``self.weights =
    self.get_embedding(n)``, also as the last statement of an ``if``) and the statement that
    runs next places through that name (``self.weights =
    self.weights.type_as(self._float_tensor)``)."""
    out: set[int] = set()

    def visit(block: list[ast.stmt], then: ast.stmt | None) -> None:
        for index, stmt in enumerate(block):
            after = block[index + 1] if index + 1 < len(block) else then
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
                names = {n for t in stmt.targets for n in _refs(t)} - {"self"}
                if names and after is not None and _moves_any(after, names):
                    out.add(id(stmt.value))
            elif isinstance(stmt, (ast.If, ast.With)):
                for field in ("body", "orelse"):
                    visit(getattr(stmt, field, []), after)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(stmt.body, None)

    if isinstance(cls, ast.ClassDef):
        visit(cls.body, None)
    return out


def _bounds_slices(call: ast.Call, ctx: Context) -> bool:
    """The statement binds a name to the factory's tensor (through torch functions of it) and
    the function uses that name only to bound Python slices: walked by a ``for`` whose item
    (or a name it is copied to) bounds slices, as in DINO's and SwAV's multi-crop wrapper,
    ``idx_crops = torch.cumsum(torch.unique_consecutive(torch.tensor([inp.shape[-1] for inp
    in x]), return_counts=True)[1], 0)``, then ``for end_idx in idx_crops:
    torch.cat(x[start_idx:end_idx])``: host bookkeeping, meant to stay on the CPU. Its elements
    count as such bookkeeping too where they are read as Python numbers (:func:`_host_element`):
    a layer-drop draw ``keep = torch.rand(n)``, then ``if keep[i] > p:``, and so does the
    tensor read back whole (DiffusionDet's ``times = torch.linspace(...)``, then
    ``list(reversed(times.int().tolist()))``)."""
    scope = ctx.function_scope()
    if scope is None or not ctx.stmt_path:
        return False
    block, index = ctx.stmt_path[-1]
    stmt = block[index]
    if not (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
    ):
        return False
    parents = {id(sub): node for node in walk(scope.node) for sub in ast.iter_child_nodes(node)}
    uses: dict[str, list[ast.Name]] = {}
    for sub in walk(scope.node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
            uses.setdefault(sub.id, []).append(sub)
    bound = stmt.targets[0].id
    until = _rebound(block[index + 1 :], bound)  # `times = list(times.tolist())`: a new value
    uses[bound] = [use for use in uses.get(bound, []) if use.lineno <= until]
    todo, seen, bounds = [(bound, True)], set(), False
    while todo:
        name, whole = todo.pop()  # `whole`: the tensor itself, which a loop may walk
        if name in seen:
            continue
        seen.add(name)
        for use in uses.get(name, []):
            parent = parents.get(id(use))
            if isinstance(parent, ast.Slice):
                bounds = True
            elif isinstance(parent, ast.Subscript) and parent.value is use:
                if not _host_element(parent, parents):  # `keep[i]` in `if keep[i] > p:`
                    return False
                bounds = True
            elif isinstance(parent, ast.Assign) and parent.value is use:
                todo += [(t.id, whole) for t in parent.targets if isinstance(t, ast.Name)]
            elif whole and isinstance(parent, ast.For) and parent.iter is use:
                if not isinstance(parent.target, ast.Name):
                    return False
                todo.append((parent.target.id, False))
            elif whole and (zipped := _zipped_item(use, parent, parents)) is not None:
                todo.append((zipped, False))  # `for block, drop in zip(blocks, to_drop)`
            elif not whole and _truth_test(use, parent, parents):
                bounds = True  # `[b for b, drop in zip(blocks, to_drop) if not drop]`
            elif _read_back(use, parents):
                bounds = True  # `times.int().tolist()`
            elif whole or not isinstance(parent, ast.Compare):  # `if start_idx == 0:`
                return False
    return bounds


def _rebound(block: list[ast.stmt], name: str) -> float:
    """The last line of the first statement of ``block`` that binds ``name`` anew: later
    reads of the name read that value (infinity where none does)."""
    for stmt in block:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in stmt.targets
        ):
            return stmt.end_lineno or stmt.lineno
    return float("inf")


def _read_back(use: ast.Name, parents: dict[int, ast.AST]) -> bool:
    """``times.int().tolist()``: tensor methods of ``use`` (none of them a move) that end in
    a read to the host, so what the host gets is Python numbers or an array."""
    node: ast.AST = use
    parent = parents.get(id(node))
    while isinstance(parent, ast.Attribute) and parent.value is node:
        call = parents.get(id(parent))
        if not isinstance(call, ast.Call) or call.func is not parent or parent.attr in _MOVES:
            return False
        if parent.attr in {"tolist", "item", "numpy"}:
            return True
        node, parent = call, parents.get(id(call))
    return False


_MOVES = _PLACERS | {"type", "pin_memory"}


def _zipped_item(use: ast.Name, parent: ast.AST | None, parents: dict[int, ast.AST]) -> str | None:
    """The name a loop or comprehension binds to the elements of ``use`` it walks through
    ``zip(...)``: ``drop`` of ``for block, drop in zip(self.blocks, to_drop)``."""
    if not (
        isinstance(parent, ast.Call)
        and isinstance(parent.func, ast.Name)
        and parent.func.id == "zip"
        and use in parent.args
    ):
        return None
    loop = parents.get(id(parent))
    if not isinstance(loop, (ast.For, ast.comprehension)) or loop.iter is not parent:
        return None
    target = loop.target
    index = parent.args.index(use)
    if not (isinstance(target, ast.Tuple) and len(target.elts) == len(parent.args)):
        return None
    item = target.elts[index]
    return item.id if isinstance(item, ast.Name) else None


def _truth_test(use: ast.Name, parent: ast.AST | None, parents: dict[int, ast.AST]) -> bool:
    """``use`` (or ``not use``) is the test of an ``if``, a comprehension's filter or a
    conditional expression: read as a Python bool."""
    node: ast.AST = use
    if isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not):
        node, parent = parent, parents.get(id(parent))
    if isinstance(parent, ast.comprehension):
        return any(test is node for test in parent.ifs)
    return isinstance(parent, (ast.If, ast.IfExp, ast.While)) and parent.test is node


# Calls that take an element as a Python number: a cast, a count of steps.
_NUMBER_USES = frozenset({"int", "float", "bool", "round", "range"})


def _host_element(element: ast.Subscript, parents: dict[int, ast.AST]) -> bool:
    """``keep[i]`` (through arithmetic, ``int(w * r[0])``) used as a Python number: a slice
    bound, a comparison tested by an ``if``/``while``/``assert`` or a conditional expression,
    a cast or ``range``, or a ``size=`` of a factory: the host reads it, never a tensor."""
    node: ast.AST = element
    parent = parents.get(id(node))
    while isinstance(parent, (ast.BinOp, ast.UnaryOp)):
        node, parent = parent, parents.get(id(parent))
    if isinstance(parent, ast.Slice):
        return True
    if isinstance(parent, ast.Call) and node in parent.args:
        return isinstance(parent.func, ast.Name) and parent.func.id in _NUMBER_USES
    if isinstance(parent, ast.Tuple):  # size=(n[i],)
        node, parent = parent, parents.get(id(parent))
    if isinstance(parent, ast.keyword):
        return parent.arg == "size"
    if not isinstance(parent, ast.Compare):
        return False
    node, parent = parent, parents.get(id(parent))
    while isinstance(parent, (ast.BoolOp, ast.UnaryOp)):
        node, parent = parent, parents.get(id(parent))
    return isinstance(parent, (ast.If, ast.While, ast.IfExp, ast.Assert)) and parent.test is node


def _returns_any(function: ast.AST, names: set[str]) -> bool:
    """A ``return`` of ``function`` hands back one of ``names`` or a value assigned from them."""
    held = set(names)
    for sub in walk(function):
        if isinstance(sub, ast.Assign) and _refs(sub.value) & held:
            held |= {name for t in sub.targets for name in _refs(t)} - {"self"}
    return any(
        isinstance(sub, ast.Return) and sub.value is not None and bool(_refs(sub.value) & held)
        for sub in walk(function)
    )


def _moves_any(stmt: ast.stmt, names: set[str], placers: frozenset[str] = frozenset()) -> bool:
    """``t.to(x)``, ``t.cuda()``, or a transfer helper handed ``t``: ``self._to_device(ids)``
    (a ``to_device`` of the owner, private or not), ``move_to_cuda(t)``, a function of the
    file that returns its first argument moved (``placers``); also element by element,
    through the target of a comprehension over them: ``[s.to(d) for s in t]``."""
    names = names | {
        name
        for sub in walk(stmt)
        if isinstance(sub, ast.comprehension) and _refs(sub.iter) & names
        for name in names_in(sub.target)
    }
    for sub in walk(stmt):
        if not isinstance(sub, ast.Call):
            continue
        if (
            isinstance(sub.func, ast.Attribute)
            and sub.func.attr in {"to", "cuda", "type_as", "type"}
            and (sub.func.attr != "type" or bool(sub.args))
            and (sub.func.attr != "to" or moves_to_device(sub))  # not a cast, `.to(x.dtype)`
            and _refs(sub.func.value) & names
        ):
            return True
        name = call_name(sub)
        if (
            name is not None
            and _device_helper(name.lstrip("_"), sub.args)
            and any(_refs(arg) & names for arg in sub.args)
        ):
            return True
        if (
            isinstance(sub.func, ast.Name)
            and sub.func.id in placers
            and sub.args
            and _refs(sub.args[0]) & names
        ):
            return True
    return False


def _refs(node: ast.AST) -> set[str]:
    """The plain names and attribute paths read in ``node`` (``self._mask`` as well as
    ``self``): a factory stored on an attribute, ``self._mask = torch.triu(...)``, is placed
    by a later ``self._mask = self._mask.to(x)`` as a local name would be."""
    paths = {dotted_name(n) for n in walk(node) if isinstance(n, ast.Attribute)}
    return names_in(node) | {path for path in paths if path is not None}


def _used_on_host(call: ast.Call, ctx: Context) -> bool:
    """The result is read back, cast to a Python number, placed right away (also by a call
    it is handed to together with a device: ``_pin_and_move(torch.tensor(s), x.device)``),
    pinned (a host staging buffer: ``torch.empty(n, pin_memory=True)``,
    ``torch.empty(n).pin_memory()``), or tested."""
    pinned = keyword(call, "pin_memory")
    if pinned is not None and isinstance(pinned.value, ast.Constant) and pinned.value.value:
        return True
    node: ast.AST = call
    index = False  # the factory is an index, `m[torch.arange(b)]`: what is placed is `m`'s
    for parent in reversed(ctx.parents):
        if isinstance(parent, ast.Dict) and node in parent.values:
            return True  # a value of a log dict: a number to report, never combined
        if isinstance(parent, ast.Subscript) and parent.slice is node:
            index = True
        if isinstance(parent, ast.Attribute) and parent.value is node:
            if parent.attr == "to" and _cast_only(parent, ctx):
                pass  # `torch.ones(n).to(x.dtype)`: a cast, still on the host; what then?
            elif parent.attr in _HOST_READS:
                # `mask[torch.arange(b)].to(device)` with `mask` on the device already: the
                # host index is copied over before the (idle) move
                return not (index and parent.attr in _PLACERS and meets_device_tensor(call, ctx))
        elif isinstance(parent, ast.Call):
            if _reduces(parent, node, ctx):
                pass  # `torch.sum(torch.tensor(padding)) != 0`: as `.sum()` of it
            elif _wraps(parent, node, ctx):
                pass  # `Variable(torch.ones(n)).cuda()`: the legacy wrapper is the tensor
            elif node is not parent.func and not _combines(parent, ctx):
                if _passes_device(parent):  # _pin_and_move(torch.tensor(s), x.device): placed
                    return True
                if parent.args and node is parent.args[0] and _places_argument(parent, ctx):
                    return True
                return isinstance(parent.func, ast.Name) and parent.func.id in HOST_CASTS
        elif isinstance(parent, (ast.If, ast.While, ast.IfExp)):
            if _inside(call, parent.test):
                return True
            if not isinstance(parent, ast.IfExp):
                return False
            # `torch.ones(n) if keep else torch.zeros(n)`: a branch's value is the expression's
        elif isinstance(parent, ast.stmt):
            return False
        node = parent
    return False


_REDUCTIONS = frozenset({"sum", "any", "all", "max", "min", "mean", "prod", "count_nonzero"})


def _wraps(call: ast.Call, node: ast.AST, ctx: Context) -> bool:
    """``Variable(node)``: autograd's legacy wrapper, which returns the tensor it is given."""
    return (
        bool(call.args)
        and call.args[0] is node
        and ctx.call_qualname(call)
        in {"torch.autograd.Variable", "torch.autograd.variable.Variable"}
    )


def _cast_only(attribute: ast.Attribute, ctx: Context) -> bool:
    """The ``.to`` of ``attribute`` is called with a dtype alone (``.to(x.dtype)``,
    ``.to(torch.float16)``): a cast that leaves the tensor where it is."""
    call = next((p for p in ctx.parents if isinstance(p, ast.Call) and p.func is attribute), None)
    return call is not None and not moves_to_device(call, ctx.qualname)


def _reduces(call: ast.Call, node: ast.AST, ctx: Context) -> bool:
    """``torch.sum(node)``: a torch reduction of the factory, its first argument."""
    name = ctx.call_qualname(call) or ""
    return (
        bool(call.args)
        and call.args[0] is node
        and name.startswith("torch.")
        and name.rpartition(".")[2] in _REDUCTIONS
    )


def _places_argument(call: ast.Call, ctx: Context) -> bool:
    """``cuda(torch.zeros(n, h))`` in DGL's JTNN, with the project's ``def cuda(x):`` returning
    ``x.to(torch.device("cuda"))`` when CUDA is available and ``x`` as it is otherwise: every
    definition the call runs hands back its first parameter moved, or unmoved on the CPU path,
    so the factory is placed right away."""
    if not isinstance(call.func, ast.Name):
        return False
    facts = file_facts(ctx)
    found = facts.callees(call.func.id, facts.qualname(call.func))
    return bool(found) and all(_returns_moved_parameter(node) for _, node in found)


def _returns_moved_parameter(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    params = [*func.args.posonlyargs, *func.args.args]
    if not params:
        return False
    first = params[0].arg
    values = [
        _unwrapped(r.value)
        for r in own_nodes(func)
        if isinstance(r, ast.Return) and r.value is not None
    ]
    moved = [
        v
        for v in values
        if isinstance(v, ast.Call)
        and isinstance(v.func, ast.Attribute)
        and v.func.attr in {"to", "cuda"}
        and isinstance(v.func.value, ast.Name)
        and v.func.value.id == first
        and not any(isinstance(a, ast.Constant) and a.value == "cpu" for a in v.args)
    ]
    as_given = [v for v in values if isinstance(v, ast.Name) and v.id == first]
    return bool(moved) and len(moved) + len(as_given) == len(values)


def _unwrapped(value: ast.expr) -> ast.expr:
    """The tensor of ``Variable(t)``, autograd's legacy wrapper (``return Variable(t.cuda())``
    in PyTorchZeroToAll's ``create_variable``); else ``value``."""
    if (
        isinstance(value, ast.Call)
        and len(value.args) == 1
        and (dotted_name(value.func) or "").rpartition(".")[2] == "Variable"
    ):
        return value.args[0]
    return value


def _copied_to_global(call: ast.Call, ctx: Context) -> bool:
    """The factory's chain ends in ``.to(<global>)`` within its statement."""
    node: ast.AST = call
    for parent in reversed(ctx.parents):
        if isinstance(parent, ast.stmt):
            return False
        if isinstance(parent, ast.Attribute) and parent.value is node and _to_global(parent, ctx):
            return True
        if isinstance(parent, ast.Call) and node is not parent.func and not _combines(parent, ctx):
            return False
        node = parent
    return False


def _combines(call: ast.Call, ctx: Context) -> bool:
    """``torch.cat([torch.ones(n), torch.zeros(m)])``: the factory's tensor is part of the
    result, so the result's placement (``.to(x.device)``) places it too; so does an
    element-wise function of it (a sinusoidal embedding's ``torch.exp(-c * torch.arange(0,
    half) / half).to(device=t.device)``), and a copy of it (``torch.Tensor(torch.zeros(n))``)."""
    return ctx.call_qualname(call) in COMBINERS | _ELEMENTWISE | _SAMPLERS | _COPIES or (
        _on_host_factory(call, ctx)
    )


def _on_host_factory(call: ast.Call, ctx: Context) -> bool:
    """``torch.zeros(n, n).masked_fill(torch.tril(torch.ones(n, n)) == 0, -inf)``: a method
    of another factory's tensor, built without a device, takes the factory's as an operand;
    the two run together on the CPU and go where the result is placed."""
    receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
    while isinstance(receiver, (ast.Call, ast.Attribute)):
        if isinstance(receiver, ast.Call) and ctx.call_qualname(receiver) in FACTORIES:
            return keyword(receiver, "device") is None
        receiver = receiver.func if isinstance(receiver, ast.Call) else receiver.value
    return False


# torch constructors that copy their tensor argument: `torch.Tensor(torch.zeros(n))` is the
# factory's tensor again, placed where the copy is placed
_COPIES = frozenset({"torch.Tensor", "torch.as_tensor", "torch.tensor"})


# torch functions that compute element by element from their one tensor argument
_ELEMENTWISE = frozenset(
    f"torch.{name}"
    for name in (
        "exp",
        "exp2",
        "log",
        "log2",
        "sqrt",
        "rsqrt",
        "sin",
        "cos",
        "pow",
        "sigmoid",
        "tril",
        "triu",
    )
)

# torch functions that draw samples from the parameters in their tensor argument, on its
# device: `float(torch._sample_dirichlet(torch.tensor([a, a]))[0])` (torchvision's mixup)
# reads a host draw back as a Python number
_SAMPLERS = frozenset(
    f"torch.{name}"
    for name in (
        "_sample_dirichlet",
        "_standard_gamma",
        "bernoulli",
        "binomial",
        "multinomial",
        "normal",
        "poisson",
    )
)


def _to_global(attr: ast.Attribute, ctx: Context) -> bool:
    """``torch.zeros(n).to(device)`` with ``device`` a module-level global: allocated on the
    CPU and copied on every call, to a device that ignores the input's."""
    if attr.attr not in {"to", "cuda"}:
        return False
    call = next(
        (p for p in reversed(ctx.parents) if isinstance(p, ast.Call) and p.func is attr), None
    )
    if call is None or not call.args or not isinstance(call.args[0], ast.Name):
        return False
    name = call.args[0].id
    scope = ctx.function_scope()
    return scope is not None and name not in ctx.scope_bindings(scope)  # a global


def _inside(node: ast.expr, outer: ast.expr) -> bool:
    start = (node.lineno, node.col_offset)
    return (outer.lineno, outer.col_offset) <= start and (
        node.end_lineno or 0,
        node.end_col_offset or 0,
    ) <= (outer.end_lineno or 0, outer.end_col_offset or 0)


def _smoke_check(ctx: Context) -> bool:
    """The module is defined under ``if __name__ == "__main__":``: a stand-in of the file's
    quick check, which runs where that check builds its inputs (as a test's does)."""
    return any(
        test is not None
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
        for block, index in ctx.stmt_path
        for test in [main_test(block[index])]
    )


def check_factory(call: ast.Call, ctx: Context, name: str, method: Scope | None) -> None:
    """TPL103 for a call of the factory ``name``: on the ``forward`` path of an ``nn.Module``
    (``method``), or in any function where it is built to match a tensor parameter."""
    if in_test(ctx) or _smoke_check(ctx):
        return
    if keyword(call, "device") is not None or keyword(call, "out") is not None:
        return
    if has_star_kwargs(call) or _scalar_draw(call, name) or _empty_shape(call, name):
        return
    if _filled_draw(call, name, ctx):
        return
    if (
        (_scalar_tensor(call, name) and not _sized_data(call, ctx))
        or _number_tensor(call, name, ctx)
    ) and not _clamp_bound(call, ctx):
        return
    short = name.removeprefix("torch.")
    if _on_forward_path(method):
        assert method is not None
        assert method.cls is not None
        if not _copied_to_global(call, ctx) and (
            _used_on_host(call, ctx)
            or (
                (_moved_later(call, ctx) or _stored_into_element(call, ctx))
                and not meets_device_tensor(call, ctx)
            )
            or _placed_by_callers(call, ctx, method)
            or _bounds_slices(call, ctx)
            or _ctc_lengths(call, ctx)
            or _cpu_path(call, method)
            or _works_on_host(method)
            or _collates(method, ctx)
            or cpu_only_script_class(method.cls, ctx)
        ):
            return
        where = f"{method.cls.name}.{method.name}"
        ctx.report(
            FACTORY.code,
            call,
            f"`torch.{short}(...)` in `{where}` allocates on the default device (the CPU) "
            "whatever the input's device; pass `device=x.device` or use "
            f"`torch.{short}_like` / `x.new_{short}`"
            if short in {"zeros", "ones", "empty", "full"}
            else f"`torch.{short}(...)` in `{where}` allocates on the default device (the CPU) "
            "whatever the input's device; pass `device=x.device`",
        )
        return
    if _used_on_host(call, ctx) or (_moved_later(call, ctx) and not meets_device_tensor(call, ctx)):
        return
    if cpu_only_program(ctx):
        return  # a CPU script's own helpers are handed CPU tensors
    match = matched_to_parameter(call, ctx)
    if match is None:
        return
    scope, param, how = match
    where = _where(scope)
    ctx.report(
        FACTORY.code,
        call,
        f"`torch.{short}(...)` in `{where}` {how} `{param}` but allocates on the default device "
        f"(the CPU) whatever `{param}`'s device; pass `device={param}.device`",
    )


_CTC_LENGTHS = frozenset({"input_lengths", "target_lengths"})


def _ctc_lengths(call: ast.Call, ctx: Context) -> bool:
    """The lengths a CTC loss takes (``F.ctc_loss(probs, targets, input_lengths,
    target_lengths)``, also through arithmetic, ``t * torch.ones(b)``, or a name bound to it
    once): CTC reads its lengths on the host, where cuDNN needs them."""
    node: ast.AST = call
    for parent in reversed(ctx.parents):
        if isinstance(parent, ast.BinOp):
            node = parent
            continue
        if isinstance(parent, ast.Call):
            return _ctc_length_argument(parent, node)
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
            target = parent.targets[0]
            scope = ctx.function_scope()
            if not isinstance(target, ast.Name) or scope is None:
                return False
            uses = [
                (sub, arg)
                for sub in walk(scope.node)
                if isinstance(sub, ast.Call)
                for arg in [*sub.args, *(kw.value for kw in sub.keywords)]
                if isinstance(arg, ast.Name) and arg.id == target.id
            ]
            return bool(uses) and all(_ctc_length_argument(sub, arg) for sub, arg in uses)
        return False
    return False


def _ctc_length_argument(call: ast.Call, node: ast.AST) -> bool:
    """``node`` is the third or fourth argument, or a lengths keyword, of a CTC loss call
    (``F.ctc_loss``, ``self.ctc_loss``, ``ctc_criterion``: a name with ``ctc`` in it)."""
    if "ctc" not in (call_name(call) or "").lower():
        return False
    return any(arg is node for arg in call.args[2:4]) or any(
        kw.value is node and kw.arg in _CTC_LENGTHS for kw in call.keywords
    )


def _works_on_host(method: Scope) -> bool:
    """A helper of ``forward`` that brings the data it is given to the host to work there
    (a detector's target assignment: ``batch_target = batch_target.cpu()``, also
    ``anchors = self.anchors.to("cpu")``, then anchors matched with ``torch.zeros(...)`` and
    ``torch.FloatTensor(...)``, the results placed by the caller, ``y_true.type_as(x)``): its
    factories are host work on purpose."""
    if method.name == "forward":
        return False
    cached = method.cache.get("works-on-host")
    if cached is None:
        cached = method.cache["works-on-host"] = any(
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and _host_copy_of(node.value, node.targets[0].id)
            for node in walk(method.node)
        )
    return bool(cached)


def _host_copy_of(value: ast.expr, name: str) -> bool:
    """``name.cpu()``, ``name.to("cpu")`` or ``self.name.to(torch.device("cpu"))``: a host
    copy of what ``name`` held, or of the attribute it is named for."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)):
        return False
    if value.func.attr != "cpu" and not (value.func.attr == "to" and _to_cpu(value)):
        return False
    source = value.func.value
    if isinstance(source, ast.Attribute) and source.attr == name:
        return True  # `anchors = self.anchors.to("cpu")`
    return _root_name(source) == name


def _to_cpu(call: ast.Call) -> bool:
    """``.to("cpu")``, ``.to(device="cpu")``, ``.to(torch.device("cpu"))``."""
    target = call.args[0] if call.args else getattr(keyword(call, "device"), "value", None)
    return _is_cpu(target)


def _collates(method: Scope, ctx: Context) -> bool:
    """A module that is a collate function by its name or its base's (``class
    PairCollateFunction(nn.Module)`` handed to ``DataLoader(collate_fn=...)``): its
    ``forward`` builds each batch from the dataset's items in the loader, on the host."""
    cls = method.cls
    if cls is None or not isinstance(cls.node, ast.ClassDef):
        return False
    names = [cls.name, *(ctx.segment(base) or "" for base in cls.node.bases)]
    return any("collat" in name.lower() for name in names)


def _root_name(node: ast.expr) -> str | None:
    """``t`` of ``t``, ``t.detach()``, ``t[0].data``."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _on_forward_path(method: Scope | None) -> bool:
    """``method`` is ``forward`` or a non-static method given a tensor that it reaches."""
    if method is None or method.cls is None:
        return False
    if method.name not in _forward_reachable(method.cls):
        return False
    return method.name == "forward" or (_takes_tensor(method) and not _static(method))


def _where(scope: Scope) -> str:
    return f"{scope.cls.name}.{scope.name}" if scope.cls is not None else scope.name
