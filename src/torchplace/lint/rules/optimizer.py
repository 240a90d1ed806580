"""TPL8xx: training setup order (an optimizer must see the parameters where they will live).

The optimizer and the move may sit in one function, or in two: a helper that builds the
optimizer from its ``model`` argument, or from the parameters it is handed (a caller in the file
or in a module that imports the helper passing ``model.set_train_params(lr)``), called before
the caller moves what it passed; or a class whose ``__init__`` (or a method called before another) builds it from
``self.model.parameters()`` while another method moves ``self.model``.
"""

from __future__ import annotations

import ast
import os
import re

from torchplace.lint.base import Context, Family, Rule, call_name, names_in, walk_body
from torchplace.lint.base import keyword as keyword_of
from torchplace.lint.nodes import parameter_defaults, walk
from torchplace.lint.provenance import file_facts
from torchplace.lint.provenance.callers import scoped_call_sites, siblings, text_of
from torchplace.lint.resolver import dotted_name
from torchplace.lint.rules.facts import moves_to_device

__all__ = ["FAMILY"]

OPTIMIZER_BEFORE_MOVE = Rule(
    "TPL801", "optimizer-before-move", "optimizer built from `model.parameters()` before `.to()`"
)


def _call(call: ast.Call, ctx: Context) -> None:
    name = ctx.call_qualname(call) or _default_class(call, ctx)
    if name is not None and not name.startswith("torch.") and _project_optimizer(call, ctx):
        name = "torch.optim.Optimizer"  # the project's own, `class OpenAIAdam(Optimizer)`
    if name is not None and not name.startswith("torch.") and _library_optimizer(name):
        name = "torch.optim.Optimizer"  # `adabelief_pytorch.AdaBelief`, a `torch.optim` subclass
    if name is None or not name.startswith("torch.optim."):
        return
    last = name.rsplit(".", 1)[-1]
    if not last[:1].isupper() or "lr_scheduler" in name or "swa_utils" in name:
        return
    if _cuda_by_default(ctx):
        return  # `torch.set_default_tensor_type("torch.cuda.FloatTensor")`: born on the GPU
    model = _parameters_owner(call, ctx)
    if model is None:
        _handed_parameters(call, ctx)
        return
    scope = ctx.function_scope() or ctx.scope
    own_body = getattr(scope.node, "body", None)
    if _moved_before(model, own_body, ctx):
        return  # a later `model.to(device)` moves it again: a no-op for the optimizer
    names = {model}  # the model, and the names it is handed to (`self.model = model`)
    for block, index in reversed(ctx.stmt_path):
        for stmt in block[index + 1 :]:
            move = next((m for n in names if (m := _move_of(stmt, n, ctx)) is not None), None)
            if move is not None and _rebound_before(stmt, move, model):
                return  # `for k in ...: model = Net(); model.to(device)`: another model
            if move is not None and _unused_after(call, move, own_body, ctx):
                return  # trained before the move (`model.to("cpu")` to deploy it)
            if move is not None:
                ctx.report(
                    OPTIMIZER_BEFORE_MOVE.code,
                    call,
                    f"optimizer built from `{model}.parameters()` before `{_moved(move)}` is "
                    f"moved on line {move.lineno}: move the model first, then build the optimizer",
                )
                return
            if _rebinds(stmt, model):
                return  # `model = Net()`: what is moved later is another model
            names -= {n for n in names if n != model and _rebinds(stmt, n)}
            names |= _aliases(stmt, names)
        if block is own_body:
            break  # later statements of an enclosing scope run at another time
    if isinstance(own_body, list):
        _across_functions(call, model, scope.node, ctx)
    if model == "self" or model.startswith("self."):
        _moved_by_makers(call, model, ctx)


def _cuda_by_default(ctx: Context) -> bool:
    """The file makes CUDA torch's default device (``torch.set_default_tensor_type(
    "torch.cuda.FloatTensor")``, YOLACT's and SSD's scripts; ``torch.set_default_device(
    "cuda")``): the model's parameters are created on the GPU, so an optimizer built before
    a ``.cuda()`` already holds them there."""
    root = ctx.scope.root()
    cached = root.cache.get("tpl801-cuda-default")
    if cached is None:
        cached = root.cache["tpl801-cuda-default"] = any(
            isinstance(node, ast.Call)
            and ctx.call_qualname(node) in _DEFAULT_SETTERS
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).startswith(("torch.cuda.", "cuda"))
            for node in walk(root.node)
        )
    return bool(cached)


_DEFAULT_SETTERS = frozenset({"torch.set_default_tensor_type", "torch.set_default_device"})


def _project_optimizer(call: ast.Call, ctx: Context) -> bool:
    """``call`` builds a class of the linted tree (of this file, or imported from a module of
    it) that derives from a ``torch.optim`` class (``class OpenAIAdam(Optimizer)``)."""
    facts = file_facts(ctx)
    func = call.func
    cls = facts.defs_class(func.id) if isinstance(func, ast.Name) else None
    owner = facts
    if cls is None:
        module, _, name = (ctx.call_qualname(call) or "").rpartition(".")
        other = facts.module_facts(module) if module else None
        found = other.defs_class(name) if other is not None else None
        if other is None or found is None:
            return False
        cls, owner = found, other
    return any((owner.qualname(base) or "").startswith("torch.optim.") for base in cls.bases)


def _moved_by_makers(call: ast.Call, model: str, ctx: Context) -> None:
    """An optimizer a module builds over its own parameters in ``__init__`` (BigGAN's
    ``self.optim = optim.Adam(params=self.parameters())``; also over a submodule's,
    ``Adam(self.actor.parameters())``, which moves with it) while code of the linted tree moves
    each new instance (``G = model.Generator(**config).to(device)``): the optimizer is built
    before the move, whoever moves it. Not when ``__init__`` moves ``self`` first."""
    method = ctx.method_of_module()
    if method is None or method.name != "__init__" or method.cls is None:
        return
    line = call.lineno
    if any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and call_name(sub) in {"to", "cuda"}
        and dotted_name(sub.func.value) == "self"
        and sub.lineno < line
        for sub in walk(method.node)
    ):
        return
    where = _moved_after_made(method.cls.name, ctx.path)
    if where is not None:
        ctx.report(
            OPTIMIZER_BEFORE_MOVE.code,
            call,
            f"optimizer built from `{model}.parameters()` in `{method.cls.name}.__init__`, before "
            f"{where} moves the new module: build the optimizer after the move",
        )


def _moved_after_made(cls: str, path: str) -> str | None:
    """Where a file beside ``path`` (or ``path`` itself) makes an instance of ``cls`` and moves
    it in the same expression (``Generator(**config).to(device)``, ``.cuda()``, also with the
    arguments over several lines)."""
    # the call's arguments, also over lines, with calls of their own two deep:
    # `Agent(\n dim,\n lr = f(x),\n).to(device)`
    made = rf"\b{re.escape(cls)}\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)\s*\."
    pattern = re.compile(rf"{made}(cuda)\(|{made}(to)\([^)\n]*(?:device|cuda|gpu|dev\b)")
    if not os.path.isfile(path):
        return None
    here = os.path.abspath(path)
    for other in (here, *siblings(os.path.dirname(here))):
        text = text_of(other)
        found = pattern.search(text) if text else None
        if text is not None and found is not None:
            line = text.count("\n", 0, found.start()) + 1
            method = found.group(1) or found.group(2)
            return f"`{cls}(...).{method}(...)` ({os.path.basename(other)}, line {line})"
    return None


_FUNCTION = (ast.FunctionDef, ast.AsyncFunctionDef)


def _default_class(call: ast.Call, ctx: Context) -> str | None:
    """``optimizer_fn(self.model.parameters(), **kw)`` with ``optimizer_fn=torch.optim.Adam``
    a parameter of the enclosing function, or ``optimizer_cls(unet.parameters())`` with
    ``optimizer_cls`` bound to ``torch.optim.AdamW`` (or, in another branch, to another
    library's optimizer class, ``bnb.optim.AdamW8bit``): the ``torch.optim`` class it names,
    when every value the name may hold is an optimizer class (a caller may hand another; it
    is built the same way)."""
    if not isinstance(call.func, ast.Name):
        return None
    scope = ctx.function_scope() or ctx.scope
    name = call.func.id
    values = list(ctx.scope_bindings(scope).get(name, []))
    if isinstance(scope.node, _FUNCTION) and _is_parameter(scope.node, name):
        values.remove(None)
        values.append(_default(scope.node, name))
    if not values or any(value is None for value in values):
        return None
    classes = [ctx.qualname(value) for value in values if value is not None]
    if not all(qual is not None and _optimizer_class(qual) for qual in classes):
        return None
    return next((q for q in classes if q is not None and q.startswith("torch.optim.")), None)


def _optimizer_class(qualname: str) -> bool:
    """``torch.optim.AdamW``, ``bitsandbytes.optim.AdamW8bit``: a class of an ``optim`` package."""
    parts = qualname.split(".")
    return len(parts) > 2 and "optim" in parts[:-1] and parts[-1][:1].isupper()


# Optimizers other libraries publish, all `torch.optim.Optimizer` subclasses; with the names
# of torch's own that libraries publish again (`from transformers import AdamW`).
_LIBRARY_OPTIMIZERS = frozenset(
    {"AdaBelief", "Lion", "Adafactor", "Lamb", "LAMB", "RAdam", "Ranger", "Adan", "SophiaG"}
    | {"Prodigy", "NovoGrad", "Shampoo", "LARS", "FusedAdam", "FusedLAMB", "FusedSGD"}
    | {"Adam", "AdamW", "SGD", "Adagrad", "Adamax", "NAdam", "RMSprop", "AdamP", "SGDP"}
)


def _library_optimizer(qualname: str) -> bool:
    """``adabelief_pytorch.AdaBelief``, ``lion_pytorch.Lion``, ``apex.optimizers.FusedAdam``,
    ``transformers.optimization.Adafactor``, ``transformers.AdamW``: an optimizer class of an
    installed library (by its module's name, or by a name the field gives its optimizers)."""
    module, _, last = qualname.rpartition(".")
    named = any(part in {"optimizers", "optimization"} for part in module.split("."))
    return (
        _optimizer_class(qualname) or (named and last[:1].isupper()) or last in _LIBRARY_OPTIMIZERS
    )


def _is_parameter(node: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
    args = node.args
    return any(a.arg == name for a in [*args.posonlyargs, *args.args, *args.kwonlyargs])


def _default(node: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> ast.expr | None:
    """The default value of parameter ``name``, if any."""
    return parameter_defaults(node).get(name)


def _moved_before(model: str, own_body: object, ctx: Context) -> bool:
    """The statements that run before the optimizer's leave ``model`` on the device: MONAI's
    notebook builds ``model = SwinUNETR(...).to(device)``, then the optimizer, and only after
    training reloads the weights and calls ``model.to(device)`` again."""
    moved: bool | None = False if "." in model or _is_given(model, own_body, ctx) else None
    for block, index in ctx.stmt_path[_own_start(own_body, ctx) :]:
        moved = _moved_after(block[:index], model, ctx, moved)
    return moved is True


def _moved_after(
    stmts: list[ast.stmt], model: str, ctx: Context, moved: bool | None
) -> bool | None:
    """Whether ``model`` is on the device after ``stmts`` run, from ``moved`` before them
    (``None``: not bound yet, a path that cannot reach a use of it). An ``if`` that binds
    the model in its branches counts by each path through it: PDEBench's ``if dimensions ==
    4: model = FNO1d(...).to(device)``, ``elif dimensions == 5: model = FNO2d(...).to(device)``
    leaves a moved model on every path that binds one."""
    for stmt in stmts:
        value = stmt.value if isinstance(stmt, ast.Assign) else None
        if isinstance(stmt, ast.If) and any(_rebinds(sub, model) for sub in walk_body([stmt])):
            paths = [_moved_after(branch, model, ctx, moved) for branch in (stmt.body, stmt.orelse)]
            bound = [path for path in paths if path is not None]
            moved = all(bound) if bound else None
        elif _rebinds(stmt, model):
            moved = (
                isinstance(value, ast.Call)
                and call_name(value) in {"to", "cuda"}
                and moves_to_device(value, ctx)
            )
        elif moved is None and any(_rebinds(sub, model) for sub in walk_body([stmt])):
            # bound inside a `with`, `try` or loop: taken as bound, moved only if moved there
            moved = _move_of(stmt, model, ctx) is not None
        elif _move_of(stmt, model, ctx) is not None:
            moved = True
    return moved


def _is_given(model: str, own_body: object, ctx: Context) -> bool:
    """``model`` may hold a value before the statements on the way to the optimizer bind it:
    a parameter of the function, or a name it declares ``global``/``nonlocal``. A name the
    function (or a script) only binds itself is unbound before that: a path through an
    ``if`` that does not bind it cannot reach the optimizer."""
    if not isinstance(own_body, list):
        return True
    scope = ctx.function_scope()
    if scope is None or not isinstance(scope.node, _FUNCTION):
        return False
    declared = (
        name
        for stmt in walk_body(own_body)
        if isinstance(stmt, (ast.Global, ast.Nonlocal))
        for name in stmt.names
    )
    return _is_parameter(scope.node, model) or model in declared


def _own_start(own_body: object, ctx: Context) -> int:
    """Where the enclosing function's own body starts in the statement path."""
    for position, (block, _) in enumerate(ctx.stmt_path):
        if block is own_body:
            return position
    return 0


def _unused_after(call: ast.Call, move: ast.Call, body: object, ctx: Context) -> bool:
    """The optimizer ``call`` builds, bound to a plain name, is not read from ``move`` on
    (or its name holds another optimizer by then): the move cannot leave it stale. Unknown
    uses (an attribute, an argument) count as reads."""
    block, index = ctx.stmt_path[-1]
    stmt = block[index]
    if not (
        isinstance(body, list)
        and isinstance(stmt, ast.Assign)
        and stmt.value is call
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
    ):
        return False
    name = stmt.targets[0].id
    nodes = list(walk_body(body))
    # rebound on every path to the move: by a statement of the optimizer's own block (one in
    # a branch, `else: optimizer = checkpoint["optimizer"]`, may not run)
    rebound = any(
        later.lineno <= move.lineno and _rebinds(later, name) for later in block[index + 1 :]
    )
    # a function defined in the body may read it as a global whenever it is called
    defined = [sub for n in nodes if isinstance(n, _SCOPES) for sub in walk(n)]
    read = any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
        for n in [*(n for n in nodes if getattr(n, "lineno", 0) >= move.lineno), *defined]
    )
    return rebound or not (read or any(_stores(n, name) for n in nodes))


def _stores(stmt: ast.AST, name: str) -> bool:
    """``stmt`` keeps ``name`` where later code may reach it: ``self.optimizer = optimizer``,
    ``return model, optimizer``, ``trainer = Trainer(model, optimizer)`` (an object that may
    hold it); a call it is only handed to, ``train(model, optimizer)``, does not count."""
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Return)) or stmt.value is None:
        return False
    return any(isinstance(n, ast.Name) and n.id == name for n in walk(stmt.value))


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _across_functions(call: ast.Call, model: str, function: ast.AST, ctx: Context) -> None:
    """The move happens in another function, after this one built the optimizer."""
    if not isinstance(function, _FUNCTION):
        return
    found = _moved_by_caller(model, function, ctx)
    if found is None and model.startswith("self."):
        found = _moved_by_method(model, function, ctx)
    if found is not None:
        move, how = found
        ctx.report(
            OPTIMIZER_BEFORE_MOVE.code,
            call,
            f"optimizer built from `{model}.parameters()` in `{function.name}()`, but {how} "
            f"moves it afterwards on line {move.lineno}: move the model first, then build the "
            "optimizer",
        )


def _handed_parameters(call: ast.Call, ctx: Context) -> None:
    """A helper builds the optimizer from the parameters it is handed (``def
    create_optimizer(name, train_params, lr): optim.SGD(train_params, ...)``), and a caller, in
    the file or in a module that imports it, hands it a model's parameters (``train_params =
    model.set_train_params(lr)``) and moves that model afterwards."""
    scope = ctx.function_scope()
    function = scope.node if scope is not None else None
    if not isinstance(function, _FUNCTION) or (scope is not None and scope.cls is not None):
        return
    params = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
    given = call.args[0] if call.args else getattr(keyword_of(call, "params"), "value", None)
    if not isinstance(given, ast.Name) or given.id not in params:
        return
    for caller, site in scoped_call_sites(file_facts(ctx), function):
        passed = _argument(site, given.id, params, False)
        body = getattr(caller, "body", None)
        if passed is None or not isinstance(body, list):
            continue
        names = names_in(passed) if isinstance(passed, ast.Name) else set()
        model = _owner(passed) or (_collected_owner(body, names) if names else None)
        if model is None or _moved_before_site(body, site, model, ctx):
            continue  # on the device already when the optimizer is built
        move = _move_after(caller, site, model, ctx)
        if move is not None:
            ctx.report(
                OPTIMIZER_BEFORE_MOVE.code,
                call,
                f"optimizer built in `{function.name}()` from the parameters of `{model}` that "
                f"a caller (line {site.lineno}) hands it, but that caller moves `{model}` "
                f"afterwards on line {move.lineno}: move the model first, then build the "
                "optimizer",
            )
            return


def _moved_before_site(body: list[ast.stmt], site: ast.Call, model: str, ctx: Context) -> bool:
    """``model`` is moved in ``body`` before ``site``, and not rebound between the move and
    the call."""
    moves = [
        c.lineno
        for c in _own_calls(body)
        if c.lineno < site.lineno
        and isinstance(c.func, ast.Attribute)
        and call_name(c) in {"to", "cuda"}
        and _holds(dotted_name(_past_modes(c.func.value)), model)
        and moves_to_device(c, ctx)
    ]
    if not moves:
        return False
    return not any(
        isinstance(stmt, ast.stmt)
        and max(moves) < stmt.lineno < site.lineno
        and _rebinds(stmt, model)
        for stmt in walk_body(body)
    )


def _moved_by_caller(
    model: str, function: ast.FunctionDef | ast.AsyncFunctionDef, ctx: Context
) -> tuple[ast.Call, str] | None:
    """``setup(model)`` builds the optimizer from its argument; the caller moves it later."""
    params = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
    keywords = {a.arg for a in function.args.kwonlyargs} | set(params)
    if model not in keywords:
        return None
    method = bool(params) and params[0] in ("self", "cls")
    facts = file_facts(ctx)
    sites = [(scope, site) for scope, site, _loops in facts.calls_of(function.name)]
    if not method:  # and in the modules of the linted tree that import it
        seen = {id(site) for _, site in sites}
        sites += [p for p in scoped_call_sites(facts, function) if id(p[1]) not in seen]
    for scope, site in sites:
        passed = _argument(site, model, params, method)
        name = dotted_name(passed) if passed is not None else None
        body = getattr(scope, "body", None)
        if (
            name is not None
            and isinstance(body, list)
            and _moved_before_site(body, site, name, ctx)
        ):
            continue  # on the device already when it is handed over: a later move is a no-op
        move = _move_after(scope, site, name, ctx) if name is not None else None
        if move is not None:
            return move, f"its caller (line {site.lineno}) passes `{name}` and"
    return None


def _argument(site: ast.Call, param: str, params: list[str], method: bool) -> ast.expr | None:
    for kw in site.keywords:
        if kw.arg == param:
            return kw.value
    if param not in params:
        return None
    index = params.index(param) - (1 if method and isinstance(site.func, ast.Attribute) else 0)
    if 0 <= index < len(site.args) and not isinstance(site.args[index], ast.Starred):
        return site.args[index]
    return None


def _moved_by_method(
    model: str, function: ast.FunctionDef | ast.AsyncFunctionDef, ctx: Context
) -> tuple[ast.Call, str] | None:
    """A method builds the optimizer from ``self.model``; another method of the class moves it
    and runs later: after ``__init__``, or called after the builder by the same code."""
    scope = ctx.function_scope()
    cls = scope.cls.node if scope is not None and scope.cls is not None else None
    if not isinstance(cls, ast.ClassDef):
        return None
    for other in cls.body:
        if not isinstance(other, _FUNCTION) or other is function:
            continue
        move = _first_move(other.body, model, ctx, after=0)
        if move is None or not _runs_after(function, other, ctx):
            continue
        return move, f"`{other.name}()` of the same class"
    return None


def _runs_after(
    builder: ast.FunctionDef | ast.AsyncFunctionDef,
    mover: ast.FunctionDef | ast.AsyncFunctionDef,
    ctx: Context,
) -> bool:
    if builder.name == "__init__":
        calls = [c for c in _own_calls(builder.body) if _calls_self(c, mover.name)]
        return not calls  # the constructor does not move first itself
    facts = file_facts(ctx)
    built = {(id(scope), site.lineno) for scope, site, _ in facts.calls_of(builder.name)}
    for scope, site, _ in facts.calls_of(mover.name):
        if any(key == id(scope) and line < site.lineno for key, line in built):
            return True
    return False


def _calls_self(call: ast.Call, name: str) -> bool:
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr == name
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
    )


def _move_after(scope: ast.AST, site: ast.Call, name: str, ctx: Context) -> ast.Call | None:
    body = getattr(scope, "body", None)
    if not isinstance(body, list):
        return None
    return _first_move(body, name, ctx, after=site.end_lineno or site.lineno)


def _first_move(body: list[ast.stmt], model: str, ctx: Context, *, after: int) -> ast.Call | None:
    moves = [
        c
        for c in _own_calls(body)
        if c.lineno > after
        and isinstance(c.func, ast.Attribute)
        and call_name(c) in {"to", "cuda"}
        and _holds(dotted_name(_past_modes(c.func.value)), model)
        and moves_to_device(c, ctx)
    ]
    if not moves:
        return None
    move = min(moves, key=lambda c: (c.lineno, c.col_offset))
    if any(
        isinstance(stmt, ast.stmt) and after < stmt.lineno < move.lineno and _rebinds(stmt, model)
        for stmt in walk_body(body)
    ):
        return None  # `model = FSDP(build())` in between: the move is of another model
    return move


def _rebound_before(stmt: ast.stmt, move: ast.Call, model: str) -> bool:
    """Inside the compound ``stmt``, a statement of the block that leads to ``move`` binds
    ``model`` to another model before it (``for mod in range(n): model = Net()``, then
    ``model.to(device)``): what the move moves is that model, every time."""
    for node in walk(stmt):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for position, inner in enumerate(block):
                if not (inner.lineno <= move.lineno <= (inner.end_lineno or inner.lineno)):
                    continue
                if any(_rebinds(earlier, model) for earlier in block[:position]):
                    return True
    return False


def _rebinds(stmt: ast.AST, model: str) -> bool:
    """``model = Net()``: the name now holds another model (``model = DDP(model)`` wraps the
    same parameters, so it does not count)."""
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
        return False
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    flat = [e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])]
    names = {name for t in flat if _holds(name := dotted_name(t), model)}
    return bool(names) and not any(
        dotted_name(sub) in names for sub in walk(stmt.value) if isinstance(sub, ast.expr)
    )


def _aliases(stmt: ast.stmt, names: set[str]) -> set[str]:
    """The names ``stmt`` binds to one of ``names`` as it is: ``self.model = model``, also
    element by element (``self.model, self.optimizer = model, optimizer``)."""
    if not isinstance(stmt, ast.Assign):
        return set()
    pairs: list[tuple[ast.expr, ast.expr]] = []
    for target in stmt.targets:
        if isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Tuple):
            pairs += zip(target.elts, stmt.value.elts, strict=False)
        else:
            pairs.append((target, stmt.value))
    return {
        alias
        for target, value in pairs
        if dotted_name(value) in names and (alias := dotted_name(target)) is not None
    }


def _moved(move: ast.Call) -> str:
    func = move.func
    return (_receiver(func.value) if isinstance(func, ast.Attribute) else None) or "the model"


def _past_modes(node: ast.expr) -> ast.expr:
    """``model`` of ``model.train()`` or ``model.eval().half()``: the module a chain of mode
    and dtype settings returns, whose move (``model.train().to(device)``) moves it."""
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _MODE_SETTERS
    ):
        node = node.func.value
    return node


_MODE_SETTERS = frozenset({"train", "eval", "requires_grad_", "float", "half", "bfloat16"})


def _holds(moved: str | None, model: str) -> bool:
    """Moving ``moved`` moves ``model``: the same module, or one it holds as a submodule
    (``model.to(device)`` moves ``model.backbone``, whose parameters an optimizer got)."""
    return moved is not None and (moved == model or model.startswith(moved + "."))


def _own_calls(body: list[ast.stmt]) -> list[ast.Call]:
    """The calls of a body, not those of functions, classes or lambdas defined in it."""
    return [node for node in walk_body(body) if isinstance(node, ast.Call)]


def _parameters_owner(call: ast.Call, ctx: Context) -> str | None:
    """The model whose parameters the optimizer gets: directly (``model.parameters()``), or
    through lists this function fills from them (``params = [p for p in model.parameters()]``,
    ``for n, p in model.named_parameters(): decay.append(p)``, then ``SGD([{"params": decay}])``).
    """
    names: set[str] = set()
    for arg in [*call.args, *(kw.value for kw in call.keywords if kw.arg == "params")]:
        for sub in walk(arg):
            owner = _owner(sub)
            if owner is not None:
                return owner
            if isinstance(sub, ast.Name):
                names.add(sub.id)
    scope = ctx.function_scope() or ctx.scope  # also a script's own statements
    body = getattr(scope.node, "body", None)
    return _collected_owner(body, names) if isinstance(body, list) and names else None


def _owner(node: ast.AST) -> str | None:
    """``model`` of ``model.parameters()`` or ``model.named_parameters()``, or of a model's
    own method named for what it hands out (``model.get_1x_lr_params()``,
    ``net.trainable_parameters()``); ``self.nets`` of ``self.nets[name].parameters()``."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and _names_parameters(node.func.attr)
    ):
        held = node.func.value
        while isinstance(held, ast.Subscript):
            held = held.value  # `self.nets[net].parameters()`: a module the dict holds
        return dotted_name(held)
    return None


def _names_parameters(method: str) -> bool:
    words = method.lower().split("_")
    return method in {"parameters", "named_parameters"} or (
        len(words) > 1 and words[-1] in {"params", "parameters"}
    )


def _collected_owner(body: list[ast.stmt], names: set[str]) -> str | None:
    """The model whose parameters the lists ``names`` are built or filled from in ``body``,
    also through the lists they are put in (``groups = [{"params": decay}]``)."""
    nodes = list(walk_body(body))
    for _ in range(3):
        wanted = set(names)
        for sub in nodes:
            if isinstance(sub, ast.Assign) and any(names_in(t) & wanted for t in sub.targets):
                source: ast.AST = sub.value
            elif isinstance(sub, (ast.For, ast.AsyncFor)) and _appends_to(sub.body, wanted):
                walked = _walked_model(sub, nodes)
                if walked is not None:
                    return walked
                source = sub.iter
            else:
                continue
            owner = next((o for n in walk(source) if (o := _owner(n)) is not None), None)
            if owner is not None:
                return owner
            names |= names_in(source)
    return None


def _walked_model(loop: ast.For | ast.AsyncFor, nodes: list[ast.AST]) -> str | None:
    """``for module in [model.layer0, model.layer4]: groups.append(dict(params=
    module.parameters()))`` (also over a name bound to that list): the model whose submodules
    the loop walks, when its body hands out the walked module's parameters."""
    if not isinstance(loop.target, ast.Name):
        return None
    walked = loop.target.id
    if not any(_owner(n) == walked for n in walk_body(loop.body)):
        return None
    lists: list[ast.expr] = [loop.iter]
    if isinstance(loop.iter, ast.Name):  # bound in each branch that picks the model
        name = loop.iter.id
        lists = [
            sub.value
            for sub in nodes
            if isinstance(sub, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in sub.targets)
        ]
    roots: set[str | None] = set()
    for listed in lists:
        if not isinstance(listed, (ast.List, ast.Tuple)) or not listed.elts:
            return None
        roots |= {
            dotted_name(e.value) if isinstance(e, ast.Attribute) else None for e in listed.elts
        }
    return roots.pop() if len(roots) == 1 else None


def _appends_to(body: list[ast.stmt], names: set[str]) -> bool:
    """The loop's body fills one of ``names``: ``decay.append(p)``, ``groups.extend(...)``,
    or ``params += [{"params": [p], "lr": lr}]`` (a group per parameter)."""
    return any(
        (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr in {"append", "extend"}
            and isinstance(sub.func.value, ast.Name)
            and sub.func.value.id in names
        )
        or (
            isinstance(sub, ast.AugAssign)
            and isinstance(sub.op, ast.Add)
            and isinstance(sub.target, ast.Name)
            and sub.target.id in names
        )
        for sub in walk_body(body)
    )


def _move_of(stmt: ast.stmt, model: str, ctx: Context) -> ast.Call | None:
    """The first move of ``model`` that running ``stmt`` makes: not one in a function it
    defines (``def predict(model, x): model.to(device)`` moves its own parameter, when
    called)."""
    moves = [
        sub
        for sub in walk_body([stmt])
        if isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and call_name(sub) in {"to", "cuda"}
        and moves_to_device(sub, ctx)
        and _holds(_receiver(sub.func.value), model)
    ]
    return min(moves, key=lambda c: (c.lineno, c.col_offset), default=None)


def _receiver(node: ast.expr) -> str | None:
    """What a move moves: ``model`` of ``model.cuda()``, also of a data-parallel wrapper built
    around it there, ``nn.DataParallel(model).cuda()`` (the wrapper holds the same
    parameters)."""
    if isinstance(node, ast.Call) and node.args and "DataParallel" in (call_name(node) or ""):
        return dotted_name(node.args[0])
    return dotted_name(_past_modes(node))


FAMILY = Family(
    rules=(OPTIMIZER_BEFORE_MOVE,),
    checks=((ast.Call, _call, (OPTIMIZER_BEFORE_MOVE.code,)),),
    # a class imported from `torch.optim` is called by its bare name, often on a list of
    # parameters bound earlier (`Adam(generator_params)`)
    triggers=(
        "parameters(",
        "optim.",
        "Adam",
        "SGD(",
        "RMSprop(",
        "Adagrad(",
        "Adadelta(",
        "LBFGS(",
        "ASGD(",
        "Rprop(",
    ),
)
