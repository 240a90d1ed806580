"""TPL6xx: CUDA-only calls that run where no CUDA device may exist."""

from __future__ import annotations

import ast
import itertools

from torchplace.lint.base import Context, Family, Rule, Scope, call_name
from torchplace.lint.nodes import walk
from torchplace.lint.resolver import dotted_name
from torchplace.lint.rules.facts import CUDA_ONLY, in_test, main_test, mentions

__all__ = ["FAMILY"]

UNGUARDED = Rule("TPL601", "unguarded-cuda-call", "CUDA-only call outside an availability check")

_EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)
_SKIP_WORDS = ("skip", "exit")


def _call(call: ast.Call, ctx: Context) -> None:
    name = ctx.call_qualname(call)
    if name not in CUDA_ONLY or not _entry_point(ctx) or _guarded(call, ctx):
        return
    if _after_cuda_only(call, ctx):
        return
    ctx.report(
        UNGUARDED.code,
        call,
        f"`{name}()` raises where CUDA is not available (CPU-only build, hidden GPUs, another "
        "backend); check `torch.cuda.is_available()` first or take the device as a parameter",
    )


def _entry_point(ctx: Context) -> bool:
    """Code no caller can have checked for: module level, ``main()`` and ``test_*()``.

    Inside any other function the caller may own the check (a CUDA-only code path called
    only for CUDA devices), which cannot be seen statically: stay silent there.
    """
    scope = ctx.function_scope()
    while scope is not None:
        if scope.name == "main" or (scope.name.startswith("test") and _test_entry(scope, ctx)):
            return True
        parent = scope.parent
        while parent is not None and parent.kind != "function":
            parent = parent.parent
        if parent is None:
            return False
        scope = parent
    return True


def _test_entry(scope: Scope, ctx: Context) -> bool:
    """A ``test*`` function a runner or a script starts: a module-level one, or a method of
    test code (a ``unittest`` case). A GUI's ``test_step`` method is called by its own class's
    loop, which may own the check."""
    return scope.parent is None or scope.parent.kind != "class" or in_test(ctx)


def _guarded(call: ast.Call, ctx: Context) -> bool:
    path = ctx.path.replace("\\", "/")
    # The CUDA API's own implementation runs on CUDA by contract.
    if "/cuda/" in path:
        return True
    if ctx.function_scope() is None and _cuda_module(path):
        return True  # module-level code of a backend module, imported for that backend only
    path_nodes = [*ctx.parents, call]
    for parent, child in itertools.pairwise(path_nodes):
        if isinstance(parent, (ast.If, ast.While, ast.IfExp)):
            # the test guards its branches, not itself: `if torch.cuda.current_device() == 0:`
            if child is not parent.test and mentions(parent.test):
                return True
        elif isinstance(parent, ast.BoolOp):
            # `is_available() and current_device() == 0`: only the operands before it
            before = parent.values[: parent.values.index(child)] if child in parent.values else []
            if any(mentions(value) for value in before):
                return True
        elif isinstance(parent, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            # `[get_device_name(d.index) for d in devices if d.type == "cuda"]`: the filter
            tests = [test for gen in parent.generators for test in gen.ifs]
            if any(mentions(test, ("cuda", "gpu", "is_available")) for test in tests):
                return True
        elif isinstance(parent, (ast.Try, ast.ExceptHandler)) or type(parent).__name__ == "TryStar":
            # Errors handled (or the call sits in the handler of a failed attempt).
            if not isinstance(parent, ast.ExceptHandler) and not getattr(parent, "handlers", None):
                continue
            return True
        elif isinstance(parent, (ast.With, ast.AsyncWith)):
            # with contextlib.suppress(RuntimeError): / with pytest.raises(...):
            if any(
                isinstance(item.context_expr, ast.Call)
                and mentions(item.context_expr.func, ("suppress", "raises", "skip"))
                for item in parent.items
            ):
                return True
        elif isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if mentions(ast.Name(id=parent.name), ("cuda", "gpu", "nccl", "device")):
                return True
            if any(mentions(d) for d in parent.decorator_list):
                return True
    # An earlier early exit or assertion: `if not torch.cuda.is_available(): return`; or an
    # earlier statement that already needs CUDA (`device = "cuda"`, `model.cuda()`).
    module = ctx.scope.root().node
    for block, index in ctx.stmt_path:
        for stmt in block[:index]:
            if _is_guard_statement(stmt) or _pins_cuda(stmt) or _calls_pinning(stmt, module):
                return True
            if _pins_on_every_path(stmt):
                return True
            if _cuda_only_statement(stmt, ctx):
                return True  # an earlier CUDA-only call raises first: that one is reported
    if _main_called_on_cuda(ctx, module):
        return True
    # Or an NCCL process group starts next (`torch.cuda.set_device(rank)`, then
    # `init_process_group(backend="nccl")`, maybe after a log line or `device =
    # torch.device("cuda", rank)`): NCCL runs on CUDA only, and the device pick is its
    # per-rank set-up, so the script is CUDA-only by design.
    if ctx.stmt_path:
        block, index = ctx.stmt_path[-1]
        if _pins_cuda(block[index]):
            # the call's own statement needs CUDA too (mmseg's `MMDistributedDataParallel(
            # model.cuda(), device_ids=[torch.cuda.current_device()])`): a check would only
            # change which of its calls raises
            return True
        return _nccl_next(block[index + 1 :])
    return False


# Calls a statement between a device pick and its NCCL group may make: a device named, a log
# line, a setting read.
_SETUP_CALLS = frozenset(
    {"device", "print", "info", "debug", "warning", "log", "int", "str", "getenv", "get"}
    | {"format", "current_device", "device_count"}
)


def _nccl_next(after: list[ast.stmt]) -> bool:
    """The statements after a call start an NCCL process group, after at most three set-up
    statements (bindings or log lines that call nothing but :data:`_SETUP_CALLS`)."""
    for stmt in after[:4]:
        if _starts_nccl(stmt):
            return True
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Expr)):
            return False
        if any(
            isinstance(sub, ast.Call) and call_name(sub) not in _SETUP_CALLS for sub in walk(stmt)
        ):
            return False
    return False


def _calls_pinning(stmt: ast.stmt, module: ast.AST) -> bool:
    """A statement that calls a function of the file whose own body needs CUDA on every path
    (airbench's ``model = make_net()``, whose body runs ``net = net.half().cuda()``), or builds
    a class of the file whose ``__init__`` does: CUDA is needed before the next line runs."""
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Expr)) or stmt.value is None:
        return False
    if not isinstance(module, ast.Module):
        return False
    called = {
        sub.func.id
        for sub in walk(stmt.value)
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name)
    }
    for node in module.body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name not in called:
            continue
        body = node.body
        if isinstance(node, ast.ClassDef):
            inits = [f for f in body if isinstance(f, ast.FunctionDef) and f.name == "__init__"]
            body = inits[0].body if inits else []
        if any(_pins_cuda(inner) for inner in body):
            return True
    return False


def _main_called_on_cuda(ctx: Context, module: ast.AST) -> bool:
    """Inside ``main()``: every call of ``main`` in the file's own top-level code comes after
    a statement that needs CUDA (airbench's ``model = CifarNet().cuda()``, then ``main(run,
    model)`` under ``if __name__ == "__main__":``): the script is CUDA-only before ``main``
    runs. A ``main`` the file never calls (an entry point named elsewhere) is still checked."""
    scope = ctx.function_scope()
    while scope is not None and scope.parent is not None and scope.parent.kind == "function":
        scope = scope.parent  # `stop_timer()` nested in `main`
    at_top = scope is not None and scope.parent is not None and scope.parent.kind == "module"
    if not at_top or scope is None or scope.name != "main" or not isinstance(module, ast.Module):
        return False
    calls: list[bool] = []

    def visit(body: list[ast.stmt], pinned: bool) -> None:
        for stmt in body:
            if main_test(stmt) is not None:
                assert isinstance(stmt, ast.If)
                visit(stmt.body, pinned)
                continue
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if any(_calls_main(sub) for sub in walk(stmt)):
                calls.append(pinned)
            pinned = pinned or _pins_cuda(stmt) or _calls_pinning(stmt, module)

    visit(module.body, False)
    return bool(calls) and all(calls)


def _calls_main(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "main"


def _starts_nccl(stmt: ast.stmt) -> bool:
    value = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
    return isinstance(value, ast.Call) and _nccl_group(value)


def _cuda_only_statement(stmt: ast.stmt, ctx: Context) -> bool:
    """A statement that is a CUDA-only call, run unconditionally (``torch.cuda.synchronize()``
    above a second one in the same loop body), also bound to a name (``start =
    torch.cuda.Event(enable_timing=True)`` above ``end = ...``): the code needs CUDA once it
    has run."""
    value = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign)) else None
    # `starter, ender = torch.cuda.Event(...), torch.cuda.Event(...)`: hlb-CIFAR10's timers
    values = value.elts if isinstance(value, ast.Tuple) else [value]
    return any(isinstance(v, ast.Call) and ctx.call_qualname(v) in CUDA_ONLY for v in values)


def _after_cuda_only(call: ast.Call, ctx: Context) -> bool:
    """``call`` is a later element of a tuple whose earlier element is a CUDA-only call
    (the second ``torch.cuda.Event(...)`` of ``a, b = Event(...), Event(...)``): the first
    raises before it runs, and is the one reported."""
    parent = ctx.parents[-1] if ctx.parents else None
    if not isinstance(parent, ast.Tuple) or call not in parent.elts:
        return False
    return any(
        isinstance(v, ast.Call) and ctx.call_qualname(v) in CUDA_ONLY
        for v in parent.elts[: parent.elts.index(call)]
    )


def _pins_on_every_path(stmt: ast.stmt) -> bool:
    """An ``if`` whose every arm needs CUDA (TransFuser's ``device =
    torch.device("cuda:{}".format(local_rank))`` under both ``if`` and ``else``), or a ``try``
    whose body and every handler do."""
    if isinstance(stmt, ast.If) and stmt.orelse:
        arms = [stmt.body, stmt.orelse]
    elif isinstance(stmt, ast.Try) and stmt.handlers:
        # `try: dist.init_process_group("nccl")` / `except KeyError: init_process_group(
        # backend="nccl", ...)` (arcface_torch's launcher): NCCL whichever way it starts
        arms = [stmt.body, *(handler.body for handler in stmt.handlers)]
    else:
        return False
    return all(any(_pins_cuda(sub) or _pins_on_every_path(sub) for sub in arm) for arm in arms)


def _pins_cuda(stmt: ast.stmt) -> bool:
    """A statement that runs unconditionally and needs CUDA: ``device = "cuda"``,
    ``model.cuda()``, ``pipe.to("cuda")``, ``Fabric(accelerator="cuda")``,
    ``from_pretrained(p, device_map="cuda")``. The script is CUDA-only before the
    call runs; a check there would not let it run anywhere else."""
    if isinstance(stmt, ast.Assign) and _is_cuda(stmt.value):
        return True
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Expr)) or stmt.value is None:
        return False
    for sub in walk(stmt.value):
        if not isinstance(sub, ast.Call):
            continue
        if isinstance(sub.func, ast.Attribute) and sub.func.attr == "cuda":
            return True
        move = isinstance(sub.func, ast.Attribute) and sub.func.attr == "to" and sub.args
        if move and _is_cuda_place(sub.args[0]):  # `pipe = Pipeline.from_pretrained(p).to("cuda")`
            return True
        if any(kw.arg in _CUDA_KEYWORDS and _is_cuda_place(kw.value) for kw in sub.keywords):
            return True
        if _nccl_group(sub):
            return True
    return False


# Keywords that place on the device they name (a Hugging Face loader's
# `from_pretrained(p, device_map="cuda")` loads the weights there).
_CUDA_KEYWORDS = frozenset({"accelerator", "device", "device_map"})


def _nccl_group(call: ast.Call) -> bool:
    """``dist.init_process_group(backend="nccl")``: NCCL runs on CUDA devices only."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name != "init_process_group":
        return False
    backend = next((kw.value for kw in call.keywords if kw.arg == "backend"), None)
    if backend is None and call.args:
        backend = call.args[0]
    return _is_nccl(backend) or _defaults_to_nccl(backend)


def _is_nccl(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value == "nccl"


def _defaults_to_nccl(node: ast.expr | None) -> bool:
    """``kwargs.get("backend", "nccl")``, ``getattr(args, "backend", "nccl")``: a setting whose
    default is NCCL, so the script is written for CUDA (another backend is a deliberate
    override)."""
    if not isinstance(node, ast.Call) or node.keywords:
        return False
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "get" and len(node.args) == 2:
        return _is_nccl(node.args[1])
    if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) == 3:
        return _is_nccl(node.args[2])
    return False


def _is_cuda(node: ast.expr) -> bool:
    """``"cuda"``, ``"cuda:0"``, ``f"cuda:{rank}"``, ``"cuda:{}".format(rank)``,
    ``torch.device("cuda")``."""
    if isinstance(node, ast.Call) and len(node.args) >= 1:
        func = node.func
        if (isinstance(func, ast.Attribute) and func.attr == "device") or (
            isinstance(func, ast.Name) and func.id == "device"
        ):
            node = node.args[0]
    if isinstance(node, ast.JoinedStr) and node.values:  # f"cuda:{rank}": a CUDA index
        node = node.values[0]
        return (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("cuda:")
        )
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
    ):
        node = node.func.value  # "cuda:{}".format(rank)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
        node = node.left  # "cuda:%d" % rank, "cuda:" + str(rank)
        return isinstance(node, ast.Constant) and str(node.value).startswith("cuda:")
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value == "cuda" or node.value.startswith("cuda:"))
    )


def _is_cuda_place(node: ast.expr) -> bool:
    """Where ``.to(...)`` or ``device=`` places: a CUDA device, or a bare index, which torch
    reads as a CUDA device (``input_ids.to(0)`` is ``cuda:0``; ``model.to(cfg.rank)``, a
    process's rank, is one too)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return True
    name = (dotted_name(node) or "").rsplit(".", 1)[-1].lower()
    if name in {"rank", "local_rank", "gpu", "gpu_id", "device_id"}:
        return True
    return _is_cuda(node)


_BACKEND_WORDS = frozenset({"cuda", "rocm", "hip", "nccl", "cudnn", "cublas", "cutlass"})


def _cuda_module(path: str) -> bool:
    """A module named for a CUDA backend (``attention/cuda.py``, ``rocm_ops.py``): the package
    imports it only where that backend exists, so its module-level code needs no check."""
    stem = path.rsplit("/", 1)[-1].removesuffix(".py").lower()
    return bool(_BACKEND_WORDS & set(stem.replace("-", "_").split("_")))


def _is_guard_statement(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Assert):
        return mentions(stmt.test)
    if isinstance(stmt, ast.If) and mentions(stmt.test):
        # `if not torch.cuda.is_available(): return`, also the other way round, `if
        # torch.cuda.is_available(): device = "cuda"` with `else: print(...); return`
        return any(_exits(branch[-1]) for branch in (stmt.body, stmt.orelse) if branch)
    if isinstance(stmt, ast.Assign):
        # pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), ...)
        return any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets
        ) and mentions(stmt.value)
    return False


def _exits(last: ast.stmt) -> bool:
    """A branch's last statement leaves (``return``, ``raise``, ...) or skips
    (``pytest.skip(...)``, ``sys.exit()``)."""
    if isinstance(last, _EXITS):
        return True
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        return mentions(last.value.func, _SKIP_WORDS)
    return False


FAMILY = Family(
    rules=(UNGUARDED,),
    checks=((ast.Call, _call, (UNGUARDED.code,)),),
    triggers=(
        *("get_device_", "current_device", "set_device", "mem_get_info", "synchronize"),
        *("memory_", "_stream(", "Stream", "Event", "CUDAGraph"),
    ),
)
