"""TPL1xx: transfers and placement (pitfalls 1, 3 and 6 of the article)."""

from __future__ import annotations

import ast
import re

from torchplace.lint.base import (
    Context,
    Family,
    Rule,
    Scope,
    at_method,
    has_star_kwargs,
    keyword,
    names_in,
)
from torchplace.lint.finding import Edit, Fix
from torchplace.lint.rules.facts import (
    DEVICE_STRING,
    FACTORIES,
    device_argument,
    in_test,
    is_module_expr,
    is_tensor_expr,
)

__all__ = ["FAMILY"]

DISCARDED = Rule(
    "TPL101", "discarded-transfer", "result of `.to()`/`.cuda()`/`.cpu()` discarded", "safe"
)
DEVICE_IN_MODULE = Rule(
    "TPL102", "device-in-module", "`.cuda()` or a hard-coded device inside an `nn.Module` method"
)
FACTORY = Rule("TPL103", "factory-without-device", "tensor factory without `device=` in `forward`")
BARE_CUDA = Rule(
    "TPL104", "bare-cuda-device", 'bare `"cuda"` where an index or an injected device belongs'
)


def _chain(node: ast.expr) -> bool:
    """A plain name or attribute chain (``x``, ``self.buf``): safe to assign to."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _discarded(node: ast.Expr, ctx: Context) -> None:
    call = node.value
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
        return
    method = call.func.attr
    if method not in {"to", "cuda", "cpu"}:
        return
    receiver = call.func.value
    if not _chain(receiver) or is_module_expr(receiver, ctx):
        return  # `torch.ones(3).to(d)` alone is written for its side effect, not forgotten
    scope: Scope | None = ctx.function_scope() or ctx.scope
    if not is_tensor_expr(receiver, ctx, scope):
        return
    text = ctx.segment(receiver) or "x"
    fix = None
    if method != "cpu" and "\n" not in text:
        fix = Fix(
            f"assign the result back: `{text} = {text}.{method}(...)`",
            (Edit(node.lineno, node.col_offset, node.lineno, node.col_offset, f"{text} = "),),
        )
    message = (
        f"result of `{text}.{method}(...)` is discarded: it returns a new tensor and leaves "
        f"`{text}` where it was; write `{text} = {text}.{method}(...)`"
    )
    ctx.report(DISCARDED.code, call, message, fix)


def _forward_reachable(cls: Scope) -> set[str]:
    """``forward`` and the methods it calls through ``self.name(...)``, transitively."""
    cached: set[str] | None = cls.cache.get("forward-reachable")
    if cached is not None:
        return cached
    assert isinstance(cls.node, ast.ClassDef)
    methods = {
        item.name: item
        for item in cls.node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    reached: set[str] = set()
    todo = ["forward"] if "forward" in methods else []
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        for sub in ast.walk(methods[name]):
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and isinstance(sub.func.value, ast.Name)
                and sub.func.value.id == "self"
                and sub.func.attr in methods
            ):
                todo.append(sub.func.attr)
    cls.cache["forward-reachable"] = reached
    return reached


def _device_literal(node: ast.expr | None) -> str | None:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and DEVICE_STRING.fullmatch(node.value)
    ):
        return node.value
    return None


_PLACEMENT_API = frozenset({"cuda", "cpu", "to", "to_empty", "_apply", "type", "xpu", "mps"})


def _call(call: ast.Call, ctx: Context) -> None:
    method = ctx.method_of_module()
    if method is not None and method.name in _PLACEMENT_API:
        method = None  # an override of the placement API itself: placing is its job
    func = call.func
    if method is not None and _fallback_path(ctx):
        method = None  # an OOM handler or a device-type branch places on purpose
    if (
        method is not None
        and isinstance(func, ast.Attribute)
        and func.attr == "cuda"
        and ctx.qualname(func) is None  # not torch.cuda itself
    ):
        assert method.cls is not None
        ctx.report(
            DEVICE_IN_MODULE.code,
            at_method(call),
            f"`.cuda()` inside `{method.cls.name}.{method.name}`: the module decides its "
            "own device; follow the input (`x.device`) or register a buffer",
        )
        return
    literal = _device_literal(device_argument(call, ctx))
    if literal is not None:
        if method is not None:
            assert method.cls is not None
            ctx.report(
                DEVICE_IN_MODULE.code,
                call,
                f'hard-coded device "{literal}" inside `{method.cls.name}.{method.name}`: '
                "follow the input (`x.device`) or a registered buffer",
            )
        elif literal == "cuda" and not _has_index(call, ctx) and not _compared(ctx):
            if _rank_code(ctx):
                ctx.report(
                    BARE_CUDA.code,
                    call,
                    'bare "cuda" device in multi-rank code: it means whatever device is current, '
                    "right only if `set_device` ran in this process first (GPU 0 for every rank "
                    "otherwise); use `cuda:{local_rank}` or the device the code was given",
                )
            elif (holder := _model_holder(ctx)) is not None:
                ctx.report(
                    BARE_CUDA.code,
                    call,
                    f'bare "cuda" device in `{holder}`, which holds a model: its tensors land on '
                    "the current GPU wherever the model is (and fail without CUDA); follow the "
                    "model's device (`self.model.device`) instead",
                )
        return
    if (
        isinstance(func, ast.Attribute)
        and func.attr == "add_argument"
        and call.args
        and _rank_code(ctx)
    ):
        _argparse_default(call, ctx)
        return
    name = ctx.call_qualname(call)
    if name in FACTORIES and method is not None:
        _factory(call, ctx, name, method)


def _fallback_path(ctx: Context) -> bool:
    """Inside an ``except`` handler (a CUDA out-of-memory fallback) or a branch on the device
    type (``if device.type == "cpu":``): placement there is the point of the branch."""
    for parent in ctx.parents:
        if isinstance(parent, ast.ExceptHandler):
            return True
        if isinstance(parent, ast.If) and any(
            (isinstance(sub, ast.Attribute) and sub.attr == "type")
            or (isinstance(sub, ast.Constant) and sub.value in {"cpu", "cuda"})
            for sub in ast.walk(parent.test)
        ):
            return True
    return False


def _compared(ctx: Context) -> bool:
    """``x.device == torch.device("cuda")``: a test of where something is, not a placement."""
    for parent in reversed(ctx.parents):
        if isinstance(parent, ast.Compare):
            return True
        if isinstance(parent, ast.stmt):
            return False
    return False


def _rank_code(ctx: Context) -> bool:
    """The file runs one process per GPU (reads a rank, builds a process group or DDP) and
    does not pin each rank to one GPU through ``CUDA_VISIBLE_DEVICES``."""
    scope = ctx.scope
    while scope.parent is not None:
        scope = scope.parent
    cached = scope.cache.get("rank-code")
    if cached is None:
        source = ctx.source
        cached = scope.cache["rank-code"] = (
            any(word in source for word in _RANK_WORDS)
            and not _VISIBLE_PER_RANK.search(source)
            and not in_test(ctx)
            and _uses_ranks(scope.node)
        )
    return bool(cached)


_RANK_WORDS = ("LOCAL_RANK", "local_rank", "init_process_group", "DistributedDataParallel")


def _uses_ranks(tree: ast.AST) -> bool:
    """The code (not its docstrings) builds a process group or DDP, or reads a local rank."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in {"init_process_group", "DistributedDataParallel", "DDP"}:
                return True
        elif (isinstance(node, ast.Name) and node.id == "local_rank") or (
            isinstance(node, ast.Attribute) and node.attr == "local_rank"
        ):
            return True
        elif isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and key.value in {"LOCAL_RANK", "RANK"}:
                return True
    return False


_VISIBLE_PER_RANK = re.compile(r"""environ\[\s*["']CUDA_VISIBLE_DEVICES["']\s*\]\s*=""")


def _argparse_default(call: ast.Call, ctx: Context) -> None:
    """``parser.add_argument("--device", default="cuda")`` in a multi-rank script."""
    flag = call.args[0]
    if not (isinstance(flag, ast.Constant) and isinstance(flag.value, str)):
        return
    if "device" not in flag.value or flag.value.endswith("type"):
        return
    default = keyword(call, "default")
    if default is not None and _device_literal(default.value) == "cuda":
        ctx.report(
            BARE_CUDA.code,
            default.value,
            f'`{flag.value}` defaults to bare "cuda" in multi-rank code: every rank gets the '
            "current device, right only if `set_device` ran first; default to "
            "`cuda:{local_rank}` or derive the device from the rank",
        )


def _model_holder(ctx: Context) -> str | None:
    """The class of the enclosing method when it keeps a model (``self.model = model``) and is
    not itself an ``nn.Module`` (TPL102 covers those) nor CUDA-specific by name."""
    scope = ctx.function_scope()
    if scope is None or scope.cls is None or scope.cls.is_module_class:
        return None
    cls = scope.cls
    cached = cls.cache.get("model-holder")
    if cached is None:
        assert isinstance(cls.node, ast.ClassDef)
        holds = any(
            isinstance(sub, ast.Assign)
            and any(
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
                and t.attr in {"model", "net", "module"}
                for t in sub.targets
            )
            for item in cls.node.body
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "__init__"
            for sub in ast.walk(item)
        )
        cached = cls.cache["model-holder"] = holds and not _cuda_specific(ctx, cls.name)
    return cls.name if cached else None


def _defaults(node: ast.FunctionDef | ast.AsyncFunctionDef, ctx: Context) -> None:
    """``def f(device="cuda")``: the device should be injected, not defaulted to CUDA."""
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    with_defaults = positional[len(positional) - len(args.defaults) :]
    pairs = list(zip(with_defaults, args.defaults, strict=True))
    pairs += [
        (arg, d) for arg, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None
    ]
    if _cuda_specific(ctx, node.name):
        return
    for arg, default in pairs:
        if "device" not in arg.arg or arg.arg.endswith("type"):
            continue  # device_type="cuda" names a backend, which is right
        value: ast.expr | None = default
        if isinstance(default, ast.Call) and ctx.call_qualname(default) == "torch.device":
            value = default.args[0] if len(default.args) == 1 and not default.keywords else None
        if (
            isinstance(value, ast.Constant)
            and value.value == "cuda"
            and (_places_with(node, arg.arg, ctx) or _stored_and_placed(node, arg.arg, ctx))
        ):
            ctx.report(
                BARE_CUDA.code,
                default,
                f'parameter `{arg.arg}` defaults to bare "cuda": callers without CUDA fail '
                "by default and the GPU is whichever is current; default to None and resolve "
                "it, or require the device",
            )


_CUDA_WORDS = (
    "cuda",
    "gpu",
    "nccl",
    "triton",
    "cutlass",
    "cudnn",
    "cublas",
    "nvmath",
    "tensorrt",
    "nvtx",
    "rng",
)


def _cuda_specific(ctx: Context, name: str) -> bool:
    """Code whose file, class or function name says it is CUDA-only (CUDA is its contract)."""
    path = ctx.path.replace("\\", "/").lower()
    names = [name, *(s.name for s in _scopes(ctx))]
    return any(word in path for word in _CUDA_WORDS) or any(
        word in n.lower() for n in names for word in _CUDA_WORDS
    )


def _scopes(ctx: Context) -> list[Scope]:
    out: list[Scope] = []
    scope: Scope | None = ctx.scope
    while scope is not None:
        out.append(scope)
        scope = scope.parent
    return out


def _places_with(func: ast.FunctionDef | ast.AsyncFunctionDef, name: str, ctx: Context) -> bool:
    """The parameter is used to place tensors (``device=name``, ``.to(name)``) and never
    compared (a compared ``"cuda"`` is a backend name, such as ``device_type``)."""
    places = False
    for sub in ast.walk(func):
        if isinstance(sub, ast.Compare):
            if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(sub)):
                return False
        elif isinstance(sub, ast.Call):
            target = device_argument(sub, ctx)
            if isinstance(target, ast.Name) and target.id == name:
                places = True
            elif (
                isinstance(sub.func, ast.Name)
                and sub.func.id == "getattr"
                and any(isinstance(a, ast.Name) and a.id == name for a in sub.args)
            ):
                return False
    return places


def _stored_and_placed(
    func: ast.FunctionDef | ast.AsyncFunctionDef, name: str, ctx: Context
) -> bool:
    """``def __init__(self, device="cuda"): self.device = device`` and a method of the class
    places with ``self.device``: the default decides where the class's tensors go."""
    cls = ctx.scope
    if cls.kind != "class" or func.name != "__init__":
        return False
    stored = {
        target.attr
        for sub in ast.walk(func)
        if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Name) and sub.value.id == name
        for target in sub.targets
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    }
    if not stored:
        return False
    for sub in ast.walk(cls.node):
        if isinstance(sub, ast.Compare) and any(
            isinstance(n, ast.Attribute) and n.attr in stored for n in ast.walk(sub)
        ):
            return False
    for sub in ast.walk(cls.node):
        if isinstance(sub, ast.Call):
            target = device_argument(sub, ctx)
            if (
                isinstance(target, ast.Attribute)
                and target.attr in stored
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                return True
    return False


def _has_index(call: ast.Call, ctx: Context) -> bool:
    """``torch.device("cuda", 0)`` names an index in its second argument."""
    return ctx.call_qualname(call) == "torch.device" and (
        len(call.args) > 1 or keyword(call, "index") is not None
    )


_HOST_READS = frozenset({"item", "tolist", "numpy", "cpu", "to", "cuda", "type_as", "type"})
_HOST_CASTS = frozenset({"int", "float", "bool", "round", "len", "range"})
_DRAWS = frozenset(
    {"torch.rand", "torch.randn", "torch.randint", "torch.empty", "torch.zeros", "torch.randperm"}
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
    if isinstance(shape, (ast.Tuple, ast.List)) and not shape.elts and name != "torch.randint":
        return True  # torch.rand([]): a 0-dim draw
    if isinstance(shape, ast.Constant) and shape.value == 0 and name != "torch.randint":
        return True  # torch.empty([0]): an empty placeholder
    return (
        isinstance(shape, ast.Constant)
        and shape.value == 1
        and (name != "torch.randint" or len(call.args) >= 2 or size is not None)
    )


def _scalar_tensor(call: ast.Call, name: str) -> bool:
    """``torch.tensor(2.0)`` is 0-dim (mixes with any device) and ``torch.tensor([])`` empty."""
    if name != "torch.tensor" or not call.args:
        return False
    data = call.args[0]
    if isinstance(data, (ast.List, ast.Tuple)):
        return len(data.elts) <= 1 and all(isinstance(e, ast.Constant) for e in data.elts)
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


def _moved_later(call: ast.Call, ctx: Context) -> bool:
    """``t = torch.zeros(n)`` and, in the statements after it, ``t`` (or a value built
    from it) goes through ``.to(...)``/``.cuda()``: placed, only later."""
    if not ctx.stmt_path:
        return False
    block, index = ctx.stmt_path[-1]
    stmt = block[index]
    names: set[str] = set()
    if isinstance(stmt, ast.Assign):  # t = torch.arange(n).float() * 2
        names = {name for t in stmt.targets for name in names_in(t)}
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
    for block, index in reversed(ctx.stmt_path):
        for later in block[index + 1 :]:
            if _moves_any(later, names):
                return True
            if isinstance(later, ast.Assign) and names_in(later.value) & names:
                names |= {name for t in later.targets for name in names_in(t)}
            elif (  # grids.append(grid): the list now holds it
                isinstance(later, ast.Expr)
                and isinstance(later.value, ast.Call)
                and isinstance(later.value.func, ast.Attribute)
                and later.value.func.attr in {"append", "extend"}
                and any(names_in(arg) & names for arg in later.value.args)
            ):
                names |= names_in(later.value.func.value) - {"self"}
        if block is own_body:
            break
    return False


def _moves_any(stmt: ast.stmt, names: set[str]) -> bool:
    for sub in ast.walk(stmt):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr in {"to", "cuda", "type_as", "type"}
            and (sub.func.attr != "type" or bool(sub.args))
            and names_in(sub.func.value) & names
        ):
            return True
    return False


def _used_on_host(call: ast.Call, ctx: Context) -> bool:
    """The result is read back, cast to a Python number, placed right away, or tested."""
    node: ast.AST = call
    for parent in reversed(ctx.parents):
        if isinstance(parent, ast.Dict) and node in parent.values:
            return True  # a value of a log dict: a number to report, never combined
        if isinstance(parent, ast.Attribute) and parent.value is node:
            if parent.attr in _HOST_READS:
                return True
        elif isinstance(parent, ast.Call):
            if node is not parent.func:
                return isinstance(parent.func, ast.Name) and parent.func.id in _HOST_CASTS
        elif isinstance(parent, (ast.If, ast.While, ast.IfExp)):
            test = parent.test
            return _inside(call, test)
        elif isinstance(parent, ast.stmt):
            return False
        node = parent
    return False


def _copied_to_global(call: ast.Call, ctx: Context) -> bool:
    """The factory's chain ends in ``.to(<global>)`` within its statement."""
    node: ast.AST = call
    for parent in reversed(ctx.parents):
        if isinstance(parent, ast.stmt):
            return False
        if isinstance(parent, ast.Attribute) and parent.value is node and _to_global(parent, ctx):
            return True
        if isinstance(parent, ast.Call) and node is not parent.func:
            return False
        node = parent
    return False


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


def _factory(call: ast.Call, ctx: Context, name: str, method: Scope) -> None:
    assert method.cls is not None
    if method.name not in _forward_reachable(method.cls):
        return
    if method.name != "forward" and (not _takes_tensor(method) or _static(method)):
        return  # a helper given no tensor, or a static one, leaves placement to its caller
    if keyword(call, "device") is not None or keyword(call, "out") is not None:
        return
    if has_star_kwargs(call) or _scalar_draw(call, name) or _scalar_tensor(call, name):
        return
    if not _copied_to_global(call, ctx) and (_used_on_host(call, ctx) or _moved_later(call, ctx)):
        return
    short = name.removeprefix("torch.")
    where = f"{method.cls.name}.{method.name}"
    ctx.report(
        FACTORY.code,
        call,
        f"`torch.{short}(...)` in `{where}` allocates on the default device (the CPU) whatever "
        f"the input's device; pass `device=x.device` or use `torch.{short}_like` / `x.new_{short}`"
        if short in {"zeros", "ones", "empty", "full"}
        else f"`torch.{short}(...)` in `{where}` allocates on the default device (the CPU) "
        "whatever the input's device; pass `device=x.device`",
    )


FAMILY = Family(
    rules=(DISCARDED, DEVICE_IN_MODULE, FACTORY, BARE_CUDA),
    checks=(
        (ast.Expr, _discarded, (DISCARDED.code,)),
        (ast.FunctionDef, _defaults, (BARE_CUDA.code,)),
        (ast.AsyncFunctionDef, _defaults, (BARE_CUDA.code,)),
        (ast.Call, _call, (DEVICE_IN_MODULE.code, FACTORY.code, BARE_CUDA.code)),
    ),
    triggers=(
        ".to(",
        ".cuda(",
        ".cpu(",
        "cuda",
        *(f"{quote}{device}" for quote in "\"'" for device in ("mps", "xpu", "hpu", "npu")),
        *("zeros(", "ones(", "empty", "full(", "arange(", "tensor(", "rand", "eye(", "space("),
        "_indices(",
    ),
)
