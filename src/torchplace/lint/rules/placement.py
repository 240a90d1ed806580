"""TPL1xx: transfers and placement (pitfalls 1, 3 and 6 of the article)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

from torchplace.lint.base import (
    Context,
    Family,
    Rule,
    Scope,
    at_method,
    call_name,
    keyword,
    names_in,
)
from torchplace.lint.finding import Edit, Fix
from torchplace.lint.nodes import kept, last_assignment, own_nodes, self_attribute, walk
from torchplace.lint.provenance.loops import calls_backward
from torchplace.lint.resolver import dotted_name, is_autograd_function
from torchplace.lint.rules.factories import FACTORY, _self_calls, check_factory
from torchplace.lint.rules.facts import (
    DEVICE_STRING,
    FACTORIES,
    PLACEMENT_API,
    device_argument,
    in_test,
    is_module_expr,
    is_tensor_annotation,
    is_tensor_expr,
)
from torchplace.lint.rules.module_helpers import module_helper_caller

__all__ = ["FAMILY"]

DISCARDED = Rule(
    "TPL101", "discarded-transfer", "result of `.to()`/`.cuda()`/`.cpu()` discarded", "safe"
)
DEVICE_IN_MODULE = Rule(
    "TPL102", "device-in-module", "`.cuda()` or a hard-coded device inside an `nn.Module` method"
)
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
    while _converts(receiver):  # `x.to(dtype).to(device)`: the chain's copy of `x`, discarded
        receiver = receiver.func.value  # type: ignore[attr-defined]
    if not _chain(receiver) or is_module_expr(receiver, ctx):
        return  # `torch.ones(3).to(d)` alone is written for its side effect, not forgotten
    scope: Scope | None = ctx.function_scope() or ctx.scope
    tensor = (
        is_tensor_expr(receiver, ctx, scope)
        or _tensor_only(receiver, ctx, scope)
        or _bound_to_tensor_before(receiver, node, ctx, scope)
        or _reduced_in_place(receiver, ctx, scope)
    )
    attribute = None if tensor else _tensor_attribute(receiver, ctx)
    if not tensor and attribute is None:
        return
    text = ctx.segment(receiver) or "x"
    if attribute == "parameter":
        # `self.w = self.w.to(d)` would assign a plain tensor over a registered parameter
        ctx.report(
            DISCARDED.code,
            call,
            f"result of `{text}.{method}(...)` is discarded: it returns a new tensor and leaves "
            f"the parameter `{text}` as it was; convert its data in place (`{text}.data = "
            f"{text}.data.{method}(...)`) or move the module",
        )
        return
    if _trainable_leaf(receiver, ctx, scope):
        # `w = w.to(d)` would make `w` a copy computed from the leaf: an optimizer refuses it
        ctx.report(
            DISCARDED.code,
            call,
            f"result of `{text}.{method}(...)` is discarded: it returns a new tensor and leaves "
            f"`{text}` where it was; `{text}` requires grad, so create it on the device "
            f"instead (`device=...` where it is made): a moved copy is not a leaf tensor an "
            "optimizer can train",
        )
        return
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


# Methods only a tensor has (not an `nn.Module`, which has `float`/`half`/`to`, nor a NumPy
# array, which has `reshape`/`transpose`/`squeeze`): what they return is a tensor.
_TENSOR_ONLY_METHODS = frozenset(
    {"detach", "bool", "long", "int", "masked_fill", "unsqueeze", "permute", "contiguous"}
)


def _converts(node: ast.expr) -> bool:
    """``x.to(dtype)``, ``x.cuda()``, ``x.float()``: a copy of ``x`` converted."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"to", "cuda", "cpu", "float", "half", "double", "bfloat16"}
    )


def _bound_to_tensor_before(
    receiver: ast.expr, node: ast.stmt, ctx: Context, scope: Scope | None
) -> bool:
    """``param.hint``, an attribute of another object the function itself set last, before
    ``node``, to a tensor (``param.hint = torch.cat([param.hint, mask], dim=1)``)."""
    name = dotted_name(receiver)
    if scope is None or name is None or "." not in name or name.startswith("self."):
        return False
    last = last_assignment(scope.node, node.lineno, lambda t: dotted_name(t) == name)
    return isinstance(last, ast.Assign) and is_tensor_expr(last.value, ctx, scope)


# torch.distributed collectives that write their result into the tensor they are given
_IN_PLACE_COLLECTIVES = frozenset({"all_reduce", "broadcast", "reduce", "recv", "irecv"})


def _reduced_in_place(receiver: ast.expr, ctx: Context, scope: Scope | None) -> bool:
    """``receiver`` is a name the function hands to a collective that writes into it
    (``dist.all_reduce(v_on_cuda, async_op=True)``, fairscale's sharded grad scaler): a
    tensor, whose ``.cpu()`` as a statement copies the reduced value nowhere."""
    if not isinstance(receiver, ast.Name) or scope is None:
        return False
    for sub in walk(scope.node):
        if isinstance(sub, ast.Call) and sub.args and dotted_name(sub.args[0]) == receiver.id:
            module, _, name = (ctx.call_qualname(sub) or "").rpartition(".")
            if module.startswith("torch.distributed") and name in _IN_PLACE_COLLECTIVES:
                return True
    return False


def _tensor_only(receiver: ast.expr, ctx: Context, scope: Scope | None) -> bool:
    """``receiver`` is a name every binding of which is the result of a method only a tensor
    has (``encoded = output.last_hidden_state.detach()``, ``mask = mask[..., None].bool()``)."""
    if not isinstance(receiver, ast.Name) or scope is None:
        return False
    values = ctx.scope_bindings(scope).get(receiver.id) or []
    return bool(values) and all(
        isinstance(v, ast.Call)
        and isinstance(v.func, ast.Attribute)
        and v.func.attr in _TENSOR_ONLY_METHODS
        for v in values
    )


def _tensor_attribute(receiver: ast.expr, ctx: Context) -> str | None:
    """``"tensor"`` for ``self.probs`` whose every binding in its class is a tensor factory
    (``None`` aside), ``"parameter"`` when one is an ``nn.Parameter``:
    ``self.probs.to(device)`` as a statement moves nothing (a module attribute would move in
    place: those are bound to modules)."""
    scope = ctx.function_scope()
    attr = self_attribute(receiver)
    if attr is None or scope is None or scope.cls is None:
        return None
    values: list[tuple[ast.expr, ast.AST]] = [
        (sub.value, method)
        for method in scope.cls.node.body  # type: ignore[attr-defined]
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef))
        for sub in walk(method)
        if isinstance(sub, (ast.Assign, ast.AnnAssign))
        and sub.value is not None
        and any(
            self_attribute(t) == attr
            for t in (sub.targets if isinstance(sub, ast.Assign) else [sub.target])
        )
    ]
    made = [
        (v, m)
        for v, m in values
        if not (isinstance(v, ast.Constant) and v.value is None) and not _converted_self(v, attr)
    ]
    kinds = {_makes_tensor(v, ctx) or _tensor_parameter(v, m, ctx) for v, m in made}
    if not made or None in kinds:
        return None
    return "parameter" if "parameter" in kinds else "tensor"


def _converted_self(value: ast.expr, attr: str) -> bool:
    """``self.bias.to(self.device)``: the attribute's own value moved or cast, whatever it is."""
    while _converts(value):
        value = value.func.value  # type: ignore[attr-defined]
    return self_attribute(value) == attr and isinstance(value, ast.Attribute)


def _tensor_parameter(value: ast.expr, method: ast.AST, ctx: Context) -> str | None:
    """``"tensor"`` for ``self.bias = bias`` in a method taking ``bias: Optional[torch.Tensor]``
    (torchao's AWQ observer): what the attribute holds is a tensor (or None)."""
    if not isinstance(value, ast.Name) or not isinstance(
        method, ast.FunctionDef | ast.AsyncFunctionDef
    ):
        return None
    args = method.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
        if arg.arg == value.id and arg.annotation is not None:
            return "tensor" if is_tensor_annotation(arg.annotation, ctx, optional=True) else None
    return None


def _makes_tensor(value: ast.expr, ctx: Context) -> str | None:
    """``"tensor"`` for a tensor factory, ``"parameter"`` for ``nn.Parameter(...)``, maybe
    placed or cast after (``torch.zeros(k).cuda()``); None for anything else."""
    while (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in {"to", "cuda", "float", "half", "long", "int", "double", "bool"}
        and ctx.qualname(value.func) is None
    ):
        value = value.func.value
    if not isinstance(value, ast.Call):
        return None
    name = ctx.call_qualname(value) or ""
    if name.endswith(("nn.Parameter", "nn.parameter.Parameter")):
        return "parameter"
    return "tensor" if name in FACTORIES else None


def _trainable_leaf(receiver: ast.expr, ctx: Context, scope: Scope | None) -> bool:
    """``w`` bound to a tensor made to require grad (``torch.zeros(3, requires_grad=True)``,
    ``...requires_grad_()``, ``nn.Parameter(...)``) or set to (``w.requires_grad = True``)."""
    if not isinstance(receiver, ast.Name) or scope is None:
        return False
    for value in ctx.scope_bindings(scope).get(receiver.id, []):
        for sub in walk(value) if value is not None else ():
            if not isinstance(sub, ast.Call):
                continue
            flag = keyword(sub, "requires_grad")
            if flag is not None and not (
                isinstance(flag.value, ast.Constant) and flag.value.value is False
            ):
                return True
            if call_name(sub) in {"requires_grad_", "Parameter"}:
                return True
    return any(
        isinstance(sub, ast.Assign)
        and any(
            isinstance(t, ast.Attribute)
            and t.attr == "requires_grad"
            and isinstance(t.value, ast.Name)
            and t.value.id == receiver.id
            for t in sub.targets
        )
        for sub in own_nodes(scope.node)
    )


def _cuda_type_cast(call: ast.Call, ctx: Context) -> bool:
    """``x.type(torch.cuda.DoubleTensor)`` (also ``"torch.cuda.DoubleTensor"``): a cast to a
    CUDA tensor type moves the data to the current CUDA device, as ``.cuda()`` does."""
    if call_name(call) != "type" or len(call.args) != 1:
        return False
    given = call.args[0]
    name = given.value if isinstance(given, ast.Constant) else ctx.qualname(given)
    return isinstance(name, str) and name.startswith("torch.cuda.") and name.endswith("Tensor")


def _autograd_step(ctx: Context) -> Scope | None:
    """``forward`` or ``backward`` of a ``torch.autograd.Function`` subclass (ShakeDrop's
    ``torch.cuda.FloatTensor(n).uniform_()``): a model's own operation, run inside a module's
    ``forward`` on its inputs, which places as a module's method would."""
    scope = ctx.function_scope()
    if scope is None or scope.name not in {"forward", "backward"} or scope.cls is None:
        return None
    cls = scope.cls.node
    return (
        scope if isinstance(cls, ast.ClassDef) and is_autograd_function(cls, ctx.qualname) else None
    )


def _current_cuda(node: ast.expr | None, ctx: Context) -> str | None:
    """``torch.cuda.current_device()`` as a device (Megatron's ``device=
    torch.cuda.current_device()``): the current CUDA device, whatever the module's is."""
    if isinstance(node, ast.Call) and ctx.call_qualname(node) == "torch.cuda.current_device":
        return "torch.cuda.current_device()"
    return None


def _device_literal(node: ast.expr | None) -> str | None:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and DEVICE_STRING.fullmatch(node.value)
    ):
        return node.value
    return None


def _call(call: ast.Call, ctx: Context) -> None:
    method = ctx.method_of_module()
    if method is not None and (method.name in PLACEMENT_API or _places_by_name(method.name)):
        method = None  # the placement API itself, or a method named for it: placing is its job
    if method is not None and _outside_static(method):
        method = None  # a function the class only hosts: callers hand it their model and data
    if method is not None and _moves_given_batch(call, method):
        method = None  # a training step the module hosts moves the batch it is handed
    if method is None:
        method = _autograd_step(ctx)  # a model's own op: its `forward`/`backward` as a module's
    if method is not None and in_test(ctx):
        method = None  # a test's stand-in module runs where the test puts it
    func = call.func
    if method is not None and _fallback_path(ctx):
        method = None  # an OOM handler or a device-type branch places on purpose
    if (
        method is not None
        and isinstance(func, ast.Attribute)
        and (
            (func.attr == "cuda" and ctx.qualname(func) is None)  # not torch.cuda itself
            or _cuda_type_cast(call, ctx)
        )
        and not _follows_tensor(call, ctx)
        and not _caller_device(call, method)
    ):
        assert method.cls is not None
        assert isinstance(func, ast.Attribute)
        what = "`.cuda()`" if func.attr == "cuda" else f"`.type({ctx.segment(call.args[0])})`"
        ctx.report(
            DEVICE_IN_MODULE.code,
            at_method(call),
            f"{what} inside `{method.cls.name}.{method.name}`: the module decides its "
            "own device; follow the input (`x.device`) or register a buffer",
        )
        return
    if method is None and _helper_cuda(call, ctx):
        return
    if (
        method is None
        and isinstance(func, ast.Attribute)
        and func.attr == "cuda"
        and not call.args
        and keyword(call, "device") is None
        and ctx.qualname(func) is None  # not torch.cuda itself
        and _rank_code(ctx)
        and _unpinned_setup(ctx)
        and not _single_process_branch(ctx)
    ):
        ctx.report(
            BARE_CUDA.code,
            call,
            "bare `.cuda()` in multi-rank code that never calls `torch.cuda.set_device`: it "
            "places on the current device, GPU 0 in every rank; call "
            "`torch.cuda.set_device(local_rank)` first or pass the index (`.cuda(local_rank)`)",
        )
        return
    if method is not None and (legacy := _cuda_tensor_type(call, ctx)) is not None:
        assert method.cls is not None
        ctx.report(
            DEVICE_IN_MODULE.code,
            call,
            f"`{legacy}(...)` inside `{method.cls.name}.{method.name}` allocates on the current "
            "CUDA device: follow the input (`x.new_zeros(...)`, `device=x.device`)",
        )
        return
    argument = device_argument(call, ctx)
    literal = _device_literal(argument)
    held = _one_binding(argument, method, ctx) if method is not None else argument
    if literal is None and method is not None:
        literal = _availability_choice(held) or _current_cuda(argument, ctx)
    if literal is not None and not _queried(call, ctx):
        if method is not None and not _load_location_only(call, method.node, ctx):
            assert method.cls is not None
            chosen = " (chosen by what the machine has)" if isinstance(held, ast.IfExp) else ""
            what = f"`{literal}`" if literal.startswith("torch.") else f'"{literal}"'
            ctx.report(
                DEVICE_IN_MODULE.code,
                # through a name: where the choice is made
                held if held is not None and _chosen_in(held, argument, method) else call,
                f"hard-coded device {what}{chosen} inside `{method.cls.name}.{method.name}`: "
                "follow the input (`x.device`) or a registered buffer",
            )
        elif method is None and _helper_device(call, literal, ctx):
            return
        bare = _device_literal(argument) == "cuda"
        if bare and not _has_index(call, ctx) and not _compared(ctx):
            if (
                _rank_code(ctx)
                and not _single_process_branch(ctx)
                and not _parameter_default(call, ctx)
            ):
                ctx.report(
                    BARE_CUDA.code,
                    call,
                    'bare "cuda" device in multi-rank code: it means whatever device is current, '
                    "right only if `set_device` ran in this process first (GPU 0 for every rank "
                    "otherwise); use `cuda:{local_rank}` or the device the code was given",
                )
            elif (
                method is None
                and (holder := _model_holder(ctx)) is not None
                and not _cpu_alternative(call, ctx)
            ):
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
    if name in FACTORIES and not _fallback_path(ctx):
        # an autograd Function's `forward` is handed numbers beside tensors (`slope`): its
        # factories are checked as any function's, not as a module's `forward`
        module = (
            method if method is not None and method.cls and method.cls.is_module_class else None
        )
        check_factory(call, ctx, name, module)


# also GPU memory (`low_vram_shift`, swapping submodules in and out)
_GPU_WORDS = frozenset({"gpu", "cuda", "vram"})


def _helper_cuda(call: ast.Call, ctx: Context) -> bool:
    """``torch.zeros(n).cuda()`` in a function of the file that only an ``nn.Module``'s
    methods call (a reader's ``get_loss``, called from its ``forward``): the module's own
    placement, reported as in a method (not in tests, an OOM handler or a device-type
    branch, nor a function named for the GPU or given the device)."""
    func = call.func
    if not (
        isinstance(func, ast.Attribute)
        and func.attr == "cuda"
        and ctx.qualname(func) is None  # not torch.cuda itself
    ):
        return False
    helper = _module_helper(call, ctx)
    if helper is None or _follows_tensor(call, ctx):
        return False
    caller, scope = helper
    ctx.report(
        DEVICE_IN_MODULE.code,
        at_method(call),
        f"`.cuda()` inside `{scope.name}`, which `{caller}` calls: the module decides its "
        "own device; follow the input (`x.device`)",
    )
    return True


def _module_helper(call: ast.Call, ctx: Context) -> tuple[str, Scope] | None:
    """``(caller, function)`` when the call sits in a function of the file that only an
    ``nn.Module``'s methods call, placing on its own (not a test, an OOM handler or a
    device-type branch, nor a function named for the GPU or given the device)."""
    caller = module_helper_caller(ctx)
    scope = ctx.function_scope()
    if caller is None or scope is None or _places_by_name(scope.name):
        return None
    if in_test(ctx) or _fallback_path(ctx) or _caller_device(call, scope):
        return None
    return caller, scope


def _helper_device(call: ast.Call, literal: str, ctx: Context) -> bool:
    """``device = torch.device("cuda")`` in a function of the file that only an
    ``nn.Module``'s methods call (DGCNN's ``get_graph_feature``, called from ``forward``): the
    module's own placement, as :func:`_helper_cuda` reports for ``.cuda()``."""
    helper = _module_helper(call, ctx)
    if helper is None:
        return False
    caller, scope = helper
    what = f"`{literal}`" if literal.startswith("torch.") else f'"{literal}"'
    ctx.report(
        DEVICE_IN_MODULE.code,
        call,
        f"hard-coded device {what} inside `{scope.name}`, which `{caller}` calls: the module "
        "decides its own device; follow the input (`x.device`)",
    )
    return True


def _places_by_name(name: str) -> bool:
    """``one_unet_in_gpu``, ``to_gpu``, ``move_to_cuda``: a method whose name says it puts the
    module (or part of it) on the GPU, which callers run on purpose, for CUDA only; also one
    that puts it there to wrap it per rank (``to_ddp``; not ``_batch_shuffle_ddp``) or spreads
    it over the GPUs (``parallelize``, transformers' model parallelism, and its undoing)."""
    words = set(name.lower().strip("_").split("_"))
    spread = bool({"parallelize", "deparallelize"} & words)  # transformers' model parallelism
    return bool(_GPU_WORDS & words) or spread or ("ddp" in words and bool({"to", "wrap"} & words))


def _moves_given_batch(call: ast.Call, method: Scope) -> bool:
    """``data["crops"].cuda(non_blocking=True)`` in a training step a module hosts (a method
    that runs ``.backward()``, itself or through a method of its class, DINOv3's
    ``forward_backward``): the batch its caller hands it is moved, not the module placed."""
    func = call.func
    node = method.node
    if not isinstance(func, ast.Attribute) or not isinstance(
        node, (ast.FunctionDef, ast.AsyncFunctionDef)
    ):
        return False
    root = func.value
    while isinstance(root, (ast.Subscript, ast.Attribute)):
        root = root.value
    params = {a.arg for a in [*node.args.posonlyargs, *node.args.args][1:]}
    if not (isinstance(root, ast.Name) and root.id in params):
        return False
    cls = method.cls.node if method.cls is not None else None
    helpers = {
        item.name: item
        for item in (cls.body if isinstance(cls, ast.ClassDef) else [])
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    return any(
        calls_backward(item)
        for item in [node, *(helpers.get(name) for name in _self_calls(node))]
        if item is not None
    )


def _outside_static(method: Scope) -> bool:
    """A ``@staticmethod`` that no method of its class calls (``KGEModel.train_step(model,
    optimizer, it, args)`` from a script): a training or test step the class hosts, given the
    model, not code of the module's own computation."""
    node = method.node
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or method.cls is None:
        return False
    if not any(dotted_name(d) == "staticmethod" for d in node.decorator_list):
        return False
    return not any(
        isinstance(sub, ast.Attribute) and sub.attr == method.name for sub in walk(method.cls.node)
    )


def _one_binding(node: ast.expr | None, method: Scope, ctx: Context) -> ast.expr | None:
    """What a name bound once in ``method`` holds (``DEVICE = "cuda" if ... else "cpu"``, then
    ``image.to(DEVICE)``), or, for a name the method does not bind, the machine's choice a
    module global is bound to once (``device = torch.device("cuda" if ... else "cpu")`` at the
    top of the file, then ``torch.arange(t, device=device)`` in ``forward``); anything else as
    it is."""
    if not isinstance(node, ast.Name):
        return node
    values = ctx.scope_bindings(method).get(node.id)
    if values is None:
        root = method
        while root.parent is not None:
            root = root.parent
        values = [_unwrapped_device(value) for value in ctx.scope_bindings(root).get(node.id, [])]
        if len(values) == 1 and _availability_choice(values[0]) is not None:
            return values[0]
        return _statement_choice(node.id, root.node) or node
    if len(values) == 1 and values[0] is not None:
        return values[0]
    return node


def _chosen_in(held: ast.expr | None, argument: ast.expr | None, method: Scope) -> bool:
    """The method binds a name to the machine's choice it places with: reported where the
    choice is made (a module global's is reported at each placement that reads it)."""
    return (
        held is not argument
        and isinstance(held, ast.IfExp)
        and any(sub is held for sub in walk(method.node))
    )


def _statement_choice(name: str, module: ast.AST) -> ast.expr | None:
    """The statement form of the machine's choice at the top of a file, ``device =
    torch.device("cpu")`` then ``if torch.cuda.is_available(): device =
    torch.device("cuda:0")`` (PPO-PyTorch), as the ``"cuda:0" if ... else "cpu"`` it spells."""
    cpu: ast.expr | None = None
    chosen: ast.IfExp | None = None
    for stmt in getattr(module, "body", []):
        if _assigns(stmt, name):
            assert isinstance(stmt, ast.Assign)
            named = _device_named(stmt.value)
            if cpu is not None or named is None or named.value != "cpu":
                return None
            cpu = stmt.value
        elif isinstance(stmt, ast.If) and any(_assigns(sub, name) for sub in stmt.body):
            picks = [sub for sub in stmt.body if _assigns(sub, name)]
            if chosen is not None or len(picks) != 1 or not _asks_machine(stmt.test):
                return None
            assert isinstance(picks[0], ast.Assign)
            picked = _device_named(picks[0].value)
            if picked is None:
                return None
            chosen = ast.IfExp(test=stmt.test, body=picked, orelse=ast.Constant("cpu"))
            ast.copy_location(chosen, picks[0].value)
    return chosen if cpu is not None and _availability_choice(chosen) is not None else None


def _device_named(node: ast.expr) -> ast.Constant | None:
    """``"cuda:0"`` of ``torch.device("cuda:0")`` or of the string itself."""
    if isinstance(node, ast.Call) and dotted_name(node.func) in {"torch.device", "device"}:
        node = node.args[0] if len(node.args) == 1 else node
    return node if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _assigns(stmt: ast.stmt, name: str) -> bool:
    return isinstance(stmt, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == name for t in stmt.targets
    )


def _asks_machine(test: ast.expr) -> bool:
    """``torch.cuda.is_available()`` (or MPS's) somewhere in the test."""
    return any(isinstance(sub, ast.Attribute) and sub.attr == "is_available" for sub in walk(test))


def _unwrapped_device(node: ast.expr | None) -> ast.expr | None:
    """The choice inside ``torch.device("cuda" if ... else "cpu")``; anything else as it is."""
    if (
        isinstance(node, ast.Call)
        and dotted_name(node.func) in {"torch.device", "device"}
        and len(node.args) == 1
        and isinstance(node.args[0], ast.IfExp)
    ):
        return node.args[0]
    return node


def _availability_choice(node: ast.expr | None) -> str | None:
    """The accelerator of ``"cuda" if torch.cuda.is_available() else "cpu"`` (also a chain,
    ``"cuda" if ... else "mps" if ... else "cpu"``): inside a module, a choice by what the
    machine has, not by where the module's input lives."""
    if not isinstance(node, ast.IfExp):
        return None
    arms: list[ast.expr] = []
    while isinstance(node, ast.IfExp):
        if _asks_where(node.test):
            return None  # `"cuda" if x.is_cuda else "cpu"`: where the input is
        arms.append(node.body)
        node = node.orelse
    arms.append(node)
    if not any(isinstance(arm, ast.Constant) and arm.value == "cpu" for arm in arms):
        return None
    return next((lit for arm in arms if (lit := _device_literal(arm)) is not None), None)


def _asks_where(test: ast.expr) -> bool:
    """``x.is_cuda``, ``x.device.type == "cuda"``: a question about where a tensor is, not
    about the machine or a setting (``torch.cuda.is_available()``, ``args.cpu``)."""
    return any(
        isinstance(sub, ast.Attribute) and sub.attr in {"is_cuda", "is_mps", "device"}
        for sub in walk(test)
    )


def _cuda_tensor_type(call: ast.Call, ctx: Context) -> str | None:
    """``torch.cuda.FloatTensor(n)``: the legacy CUDA constructors allocate on the current
    CUDA device, a placement as hard-coded as ``.cuda()``."""
    name = ctx.call_qualname(call)
    module, _, last = (name or "").rpartition(".")
    return name if module == "torch.cuda" and last.endswith("Tensor") else None


def _caller_device(call: ast.Call, method: Scope) -> bool:
    """``model.cuda(cuda_device)`` with ``cuda_device`` a parameter of the method: the caller
    chooses the device (a loader's ``cuda_device=-1`` argument), the module does not; so
    with an element of one, ``self.module.cuda(device_ids[0])`` in a ``DataParallel``
    wrapper given ``device_ids`` (CenterNet's ``_DataParallel.__init__``)."""
    target = call.args[0] if call.args else getattr(keyword(call, "device"), "value", None)
    if isinstance(target, ast.Subscript):
        target = target.value
    if isinstance(target, ast.Attribute) and target.attr in _GIVEN_DEVICES:
        return True  # `self.device_ids[0]`, `self.output_device`: what the wrapper was given
    if not isinstance(target, ast.Name):
        return False
    node = method.node
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
    return any(arg.arg == target.id for arg in params) or _walks_given_devices(node, target.id)


# What a data-parallel wrapper holds of the devices it was given.
_GIVEN_DEVICES = frozenset({"device_ids", "output_device"})


def _walks_given_devices(function: ast.AST, name: str) -> bool:
    """``name`` is a loop's or a comprehension's target over the devices a data-parallel
    wrapper was given (``for input, device in zip(inputs, self.device_ids)``: scattering)."""
    for node in walk(function):
        pairs: list[tuple[ast.expr, ast.expr]] = []
        if isinstance(node, (ast.For, ast.AsyncFor)):
            pairs.append((node.target, node.iter))
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            pairs += [(gen.target, gen.iter) for gen in node.generators]
        for target, iterable in pairs:
            if name in names_in(target) and any(
                isinstance(sub, ast.Attribute) and sub.attr in _GIVEN_DEVICES
                for sub in walk(iterable)
            ):
                return True
    return False


def _follows_tensor(call: ast.Call, ctx: Context) -> bool:
    """``w.cuda(x.device)``: onto the device of a tensor that is already there, also through
    a name bound to one in the function (``device = weight.device``, then ``w.cuda(device)``)."""
    target = call.args[0] if call.args else getattr(keyword(call, "device"), "value", None)
    if isinstance(target, ast.Name):
        scope = ctx.function_scope()
        values = ctx.scope_bindings(scope).get(target.id, []) if scope is not None else []
        return bool(values) and all(_is_device_of(value) for value in values)
    return _is_device_of(target)


def _is_device_of(node: ast.expr | None) -> bool:
    """``x.device``, or ``x.get_device()``, the index of the GPU a tensor is on."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get_device"
        and not node.args
    ):
        return True
    return isinstance(node, ast.Attribute) and node.attr == "device"


_QUERIES = ("get_", "mem_get_info", "max_memory", "memory_", "is_", "can_", "utilization")


def _queried(call: ast.Call, ctx: Context) -> bool:
    """``torch.cuda.get_device_properties(torch.device("cuda"))`` or
    ``get_device_properties(device="cuda")``: the device is asked about, nothing is placed."""
    if _is_query(call, ctx):
        return True
    for parent in reversed(ctx.parents):
        if isinstance(parent, ast.Call):
            return _is_query(parent, ctx)
        if isinstance(parent, ast.stmt):
            return False
    return False


def _load_location_only(call: ast.Call, method: ast.AST, ctx: Context) -> bool:
    """A device that only says where ``torch.load`` puts a checkpoint the method copies into
    the module with ``load_state_dict`` (Swin-Unet's ``load_from``: ``device = "cuda" if
    torch.cuda.is_available() else "cpu"``, then ``torch.load(path, map_location=device)``):
    the copies land wherever the module's own tensors are, so nothing of the module is placed.
    The device as ``map_location=`` itself, or a local name bound to it whose every read is."""
    if not any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "load_state_dict"
        for sub in walk(method)
    ):
        return False
    locations = {
        id(kw.value)
        for sub in walk(method)
        if isinstance(sub, ast.Call) and (ctx.call_qualname(sub) or "") == "torch.load"
        for kw in sub.keywords
        if kw.arg == "map_location"
    }
    parents = list(reversed(ctx.parents))
    # the device call itself, or the conditional expression that chooses it
    value: ast.AST = parents[0] if parents and isinstance(parents[0], ast.IfExp) else call
    if id(value) in locations:
        return True
    bound = next((p for p in parents if isinstance(p, ast.stmt)), None)
    if not (
        isinstance(bound, ast.Assign)
        and bound.value is value
        and len(bound.targets) == 1
        and isinstance(bound.targets[0], ast.Name)
    ):
        return False
    name = bound.targets[0].id
    reads = [
        sub
        for sub in walk(method)
        if isinstance(sub, ast.Name) and sub.id == name and isinstance(sub.ctx, ast.Load)
    ]
    return bool(reads) and all(id(read) in locations for read in reads)


def _is_query(call: ast.Call, ctx: Context) -> bool:
    name = ctx.call_qualname(call) or ""
    return name.startswith("torch.cuda.") and name.rsplit(".", 1)[-1].startswith(_QUERIES)


def _cpu_alternative(call: ast.Call, ctx: Context) -> bool:
    """The body of an ``if`` whose ``else`` (or an ``elif`` of it) names the CPU:
    ``if self.cuda: self.device = torch.device("cuda")`` ... ``else:
    self.device = torch.device("cpu")``, the statement form of the ``"cuda" if ... else
    "cpu"`` fallback; also the body of ``if torch.cuda.is_available() and not self.nogpu:``,
    whose implicit alternative leaves the model and its inputs on the CPU; and the expression
    itself spelled with devices, ``torch.device("cuda") if ... else torch.device("cpu")`` (or
    the CPU first, ``torch.device("cpu") if args.cpu else torch.device("cuda")``)."""
    node: ast.AST = call
    for parent in reversed(ctx.parents):
        if isinstance(parent, ast.IfExp) and node in (parent.body, parent.orelse):
            other = parent.orelse if node is parent.body else parent.body
            if any(isinstance(sub, ast.Constant) and sub.value == "cpu" for sub in walk(other)):
                # `torch.device("cuda") if ... else torch.device("cpu")`, also the CPU first:
                # `torch.device("cpu") if args.cpu else torch.device("cuda")`
                return True
        if (
            isinstance(parent, ast.If)
            and any(node is stmt for stmt in parent.body)
            and (
                any(
                    isinstance(sub, ast.Constant) and sub.value == "cpu"
                    for stmt in parent.orelse
                    for sub in walk(stmt)
                )
                or _tests_availability(parent.test, ctx)
            )
        ):
            return True
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            break
        node = parent
    return False


def _tests_availability(test: ast.expr, ctx: Context) -> bool:
    """``torch.cuda.is_available()``, alone or as a term of an ``and``."""
    return any(
        isinstance(term, ast.Call) and ctx.call_qualname(term) == "torch.cuda.is_available"
        for term in _conjuncts(test)
    )


def _fallback_path(ctx: Context) -> bool:
    """Inside an ``except`` handler (a CUDA out-of-memory fallback) or a branch on the device
    type (``if device.type == "cpu":``): placement there is the point of the branch."""
    parents = ctx.parents
    if _discarded_probe(parents):
        return True
    for index, parent in enumerate(parents):
        if isinstance(parent, ast.ExceptHandler):
            return True
        if isinstance(parent, ast.If) and _device_type_test(parent.test, ctx):
            child = parents[index + 1] if index + 1 < len(parents) else None
            if child is not None and _in_orelse(parent, child) and _asks_cuda(parent.test):
                continue  # the `else` of `if x.is_cuda:`: the value is not on CUDA there
            return True
    return False


def _discarded_probe(parents: list[ast.AST]) -> bool:
    """In a ``try`` body, tensors built only to see whether a kernel runs, the result thrown
    away: ``_ = xformers.ops.memory_efficient_attention(torch.randn(..., device="cuda"), ...)``,
    also through a name only such statements read (``q = torch.randn(..., device="cuda")``,
    then ``_ = op(q, q, q)``). Nothing of the module is placed."""
    stmts = [p for p in parents if isinstance(p, ast.stmt)]
    if not stmts or not isinstance(stmts[-1], ast.Assign) or len(stmts[-1].targets) != 1:
        return False
    stmt, target = stmts[-1], stmts[-1].targets[0]
    if not isinstance(target, ast.Name):
        return False
    tries = [t for t in stmts if isinstance(t, ast.Try)]
    if not tries or not any(stmt in walk(t) for t in tries[-1].body):
        return False
    if target.id == "_":
        # not `_ = self.buf.copy_(...)`, which writes into the module
        return not any(isinstance(sub, ast.Name) and sub.id == "self" for sub in walk(stmt))
    scope = next(
        (p for p in reversed(parents) if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef))),
        tries[-1],
    )
    uses = [
        sub
        for sub in walk(scope)
        if isinstance(sub, ast.Name) and sub.id == target.id and isinstance(sub.ctx, ast.Load)
    ]
    readers = [
        r
        for s in tries[-1].body
        for r in walk(s)
        if isinstance(r, ast.Assign)
        and len(r.targets) == 1
        and isinstance(r.targets[0], ast.Name)
        and r.targets[0].id == "_"
    ]
    read = [
        sub
        for r in readers
        for sub in walk(r.value)
        if isinstance(sub, ast.Name) and sub.id == target.id
    ]
    return bool(read) and len(read) == len(uses)


def _in_orelse(branch: ast.If, child: ast.AST) -> bool:
    return any(child is stmt for stmt in branch.orelse)


def _asks_cuda(test: ast.expr) -> bool:
    """``x.is_cuda``, ``x.device.type == "cuda"``, ``x.type() == "torch.cuda.HalfTensor"``: a
    test that holds when the value is on CUDA (its ``else`` runs for CPU values too); also
    ``isinstance(out.data, torch.cuda.FloatTensor)`` (a tuple of CUDA tensor types too)."""
    if isinstance(test, ast.Attribute):
        return test.attr == "is_cuda"
    if (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == "isinstance"
        and len(test.args) == 2
    ):
        kinds = test.args[1].elts if isinstance(test.args[1], ast.Tuple) else [test.args[1]]
        names = [dotted_name(kind) or "" for kind in kinds]
        return bool(names) and all(
            name.startswith("torch.cuda.") and name.endswith("Tensor") for name in names
        )
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    if not isinstance(test.ops[0], (ast.Eq, ast.Is)):
        return False
    sides = [test.left, *test.comparators]
    return any(
        isinstance(side, ast.Constant)
        and isinstance(side.value, str)
        and ("cuda" in side.value.split(".") or side.value.startswith("cuda"))
        for side in sides
    )


# Attributes that ask what kind of device a value is on: `device.type`, a tensor's `x.is_cuda`.
_BACKEND_QUERIES = frozenset({"type", "is_cuda", "is_cpu", "is_mps", "is_xpu"})


def _device_type_test(test: ast.expr, ctx: Context, follow: bool = True) -> bool:
    """``device.type == "cpu"``, ``x.device.type == "mps"``, ``x.is_cuda``, a comparison with
    an accelerator's name in any case (``if self.args.accelerator.upper() == "GPU":``,
    Lightning's spelling), ``isinstance(x, torch.cuda.FloatTensor)``, or a name the function
    binds only to such a test (``is_mps = x.device.type == "mps"``, then ``if is_mps:``)."""
    if _asks_cuda(test):
        return True
    for sub in walk(test):
        if (isinstance(sub, ast.Attribute) and sub.attr in _BACKEND_QUERIES) or (
            isinstance(sub, ast.Constant) and sub.value in {"cpu", "cuda"}
        ):
            return True
        if isinstance(sub, ast.Compare) and any(
            isinstance(side, ast.Constant)
            and isinstance(side.value, str)
            and side.value.lower() in _ACCELERATOR_NAMES
            for side in [sub.left, *sub.comparators]
        ):
            return True
    if _names_cpu_setting(test):
        return True
    if not follow or not isinstance(test, ast.Name):
        return False
    scope = ctx.function_scope()
    values = ctx.scope_bindings(scope).get(test.id, []) if scope is not None else []
    return bool(values) and all(
        value is not None and _device_type_test(value, ctx, follow=False) for value in values
    )


def _names_cpu_setting(test: ast.expr) -> bool:
    """``if neox_args.use_cpu_initialization:``, ``if not args.cpu:``: a setting named for the
    CPU, whose other branch is the accelerator's path on purpose."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
    return isinstance(name, str) and "cpu" in name.lower().split("_")


# Names of a device type or an accelerator, compared in any case (`"GPU"`, `"cpu"`).
_ACCELERATOR_NAMES = frozenset({"cpu", "cuda", "gpu", "mps"})


# Words of a name for the distributed mode of a script (`args.distributed`, `enable_fsdp`).
_DISTRIBUTED_WORDS = frozenset({"distributed", "ddp", "fsdp", "dist", "multiprocessing"})


def _single_process_branch(ctx: Context) -> bool:
    """Code that runs only when the script is not distributed: the ``else`` of ``if
    cfg.enable_fsdp:`` (also through ``elif``), or the body of ``if not args.distributed:``
    or of ``if single_device:`` (alone or in an ``and``). One process: the current device is the only one it uses."""
    for index, parent in enumerate(ctx.parents[:-1]):
        if not isinstance(parent, ast.If):
            continue
        child = ctx.parents[index + 1]
        if any(child is stmt for stmt in parent.orelse) and (
            _names_distributed(parent.test)
            or _sets_up_group(parent.body)
            or _no_rank(parent.test, negated=True)
        ):
            return True
        if any(child is stmt for stmt in parent.body) and any(
            (
                isinstance(term, ast.UnaryOp)
                and isinstance(term.op, ast.Not)
                and _names_distributed(term.operand)
            )
            or _names_single_process(term)
            or _no_rank(term)
            for term in _conjuncts(parent.test)
        ):
            return True
    return False


def _no_rank(test: ast.expr, *, negated: bool = False) -> bool:
    """``args.local_rank == -1`` (``negated``: ``local_rank != -1``): the launcher gave the
    process no rank, the one-process run of Hugging Face's and DeepSpeed's scripts."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    name = (dotted_name(test.left) or "").rpartition(".")[2]
    right = test.comparators[0]
    minus_one = (
        isinstance(right, ast.UnaryOp)
        and isinstance(right.op, ast.USub)
        and isinstance(right.operand, ast.Constant)
        and right.operand.value == 1
    )
    op = ast.NotEq if negated else ast.Eq
    return name in {"local_rank", "rank"} and minus_one and isinstance(test.ops[0], op)


# Words that, with "single", name a one-process mode: `single_device`, `args.single_gpu`.
_ONE_PROCESS_WORDS = frozenset({"device", "gpu", "process", "proc", "rank", "worker"})


def _names_single_process(test: ast.expr) -> bool:
    """``if single_device:`` (lm-evaluation-harness, after ruling out accelerate and model
    parallelism), ``if args.single_gpu:``: a flag for the one-process mode, by its words."""
    words = _flag_words(test)
    return "single" in words and bool(words & _ONE_PROCESS_WORDS)


def _sets_up_group(body: list[ast.stmt]) -> bool:
    """The branch starts the process group itself: MONAI's ``if multi_gpu_flag:
    dist.init_process_group(...)``, then ``else: device = torch.device("cuda")``, whose ``else``
    runs one process, whatever the flag is called."""
    return any(
        isinstance(sub, ast.Call)
        and (dotted_name(sub.func) or "").rsplit(".", 1)[-1] == "init_process_group"
        for stmt in body
        for sub in walk(stmt)
    )


def _parameter_default(call: ast.Call, ctx: Context) -> bool:
    """``def __init__(self, plans, device: torch.device = torch.device("cuda")):`` in nnU-Net's
    multi-rank trainer, which then picks ``torch.device(type="cuda", index=self.local_rank)``:
    a default places nothing by itself; the parameter-default check reports it where the
    parameter places tensors as given."""
    if not ctx.stmt_path:
        return False
    block, index = ctx.stmt_path[-1]
    func = block[index]
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    defaults = [*func.args.defaults, *func.args.kw_defaults]
    return any(sub is call for default in defaults if default is not None for sub in walk(default))


def _conjuncts(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return test.values
    return [test]


def _names_distributed(test: ast.expr) -> bool:
    """``args.distributed``, ``cfg.enable_fsdp``, ``ddp``: a flag for the distributed mode
    (by the words of its name: ``args.distance`` is no such flag)."""
    return bool(_flag_words(test) & _DISTRIBUTED_WORDS)


def _flag_words(test: ast.expr) -> set[str]:
    """The words of the last name of a flag (``cfg.enable_fsdp`` -> ``enable``, ``fsdp``)."""
    name = dotted_name(test)
    return set(name.rsplit(".", 1)[-1].lower().split("_")) if name is not None else set()


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
    scope = ctx.scope.root()
    cached = scope.cache.get("rank-code")
    if cached is None:
        source = ctx.source
        cached = scope.cache["rank-code"] = (
            not _VISIBLE_PER_RANK.search(source)
            and not in_test(ctx)
            and (
                (any(word in source for word in _RANK_WORDS) and _uses_ranks(scope.node))
                or _calls_collective(scope.node, ctx)
            )
            and not _one_process_group(scope.node, source)
        )
    return bool(cached)


def _one_process_group(tree: ast.AST, source: str) -> bool:
    """The file sets up a process group of one rank, unconditionally (a statement of the
    module or of a function's own body): ``os.environ["WORLD_SIZE"] = "1"`` or
    ``init_process_group(..., world_size=1)``, as a tutorial or notebook does that uses the
    distributed API in a single process. The one process owns the current device. A default
    under ``if "WORLD_SIZE" not in os.environ:`` is no such set-up."""
    if "WORLD_SIZE" not in source and "world_size" not in source:
        return False
    for owner in walk(tree):
        if not isinstance(owner, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for stmt in owner.body:
            if isinstance(stmt, ast.Assign) and _one(stmt.value) and _sets_world_size(stmt):
                return True
            call = stmt.value if isinstance(stmt, ast.Expr) else None
            if isinstance(call, ast.Call) and call_name(call) == "init_process_group":
                size = keyword(call, "world_size")
                if size is not None and _one(size.value):
                    return True
    return False


def _sets_world_size(stmt: ast.Assign) -> bool:
    """``os.environ["WORLD_SIZE"] = ...``."""
    return any(
        isinstance(t, ast.Subscript)
        and isinstance(t.slice, ast.Constant)
        and t.slice.value == "WORLD_SIZE"
        for t in stmt.targets
    )


def _one(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value in {1, "1"}


def _unpinned_setup(ctx: Context) -> bool:
    """The file sets up the ranks itself (calls ``init_process_group``) and never picks a GPU
    per rank (no ``torch.cuda.set_device(...)`` nor a helper named for setting the device, no
    ``with torch.cuda.device(...)``): a bare
    ``.cuda()`` there lands on GPU 0 in every rank. A file whose set-up is a helper elsewhere
    (``utils.init_distributed_mode(args)``) may pick the GPU there, and is left alone."""
    scope = ctx.scope.root()
    cached = scope.cache.get("unpinned-setup")
    if cached is None:
        inits = picks = False
        for node in walk(scope.node):
            if isinstance(node, ast.Call):
                name = call_name(node)
                inits = inits or name == "init_process_group"
                # `torch.cuda.set_device(r)`, or a helper named for it, ClassyVision's
                # `set_cuda_device_index(local_rank)`
                picks = picks or bool(name and name.startswith("set") and "device" in name)
                picks = picks or (
                    isinstance(node.func, ast.Attribute)
                    and ctx.qualname(node.func) == "torch.cuda.device"
                )
        cached = scope.cache["unpinned-setup"] = inits and not picks
    return bool(cached)


# `torch.distributed` calls that move tensors between ranks: every rank runs the code around
# them, with whatever device is current in its process.
_COLLECTIVES = frozenset(
    {
        "all_gather",
        "all_gather_into_tensor",
        "all_reduce",
        "all_to_all",
        "all_to_all_single",
        "broadcast",
        "gather",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "scatter",
        # the object collectives pickle through tensors on the current device too
        "broadcast_object_list",
        "all_gather_object",
        "gather_object",
        "scatter_object_list",
    }
)


def _calls_collective(tree: ast.AST, ctx: Context) -> bool:
    """The file runs a tensor collective of ``torch.distributed`` (``dist.all_gather``; also
    its autograd twins, ``torch.distributed.nn.all_reduce``, DeepSpeed's ``deepspeed.comm``,
    or a project's own wrapper module named ``distributed``, ``nanotron.distributed``): a
    helper of multi-rank code, whose rank set-up (``set_device``) is in another file."""
    if not any(word in ctx.source for word in ("all_", "broadcast", "reduce", "_object")):
        return False
    for node in walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = ctx.qualname(node.func) or ""
            module, _, last = name.rpartition(".")
            if last in _COLLECTIVES and _collective_module(module):
                return True
    return False


def _collective_module(module: str) -> bool:
    return (
        module in {"torch.distributed", "deepspeed.comm"}
        or module.startswith("torch.distributed.nn")
        or module.endswith(".distributed")
    )


_RANK_WORDS = (
    "LOCAL_RANK",
    "local_rank",
    "init_process_group",
    "DistributedDataParallel",
    "Accelerator",
)


def _uses_ranks(tree: ast.AST) -> bool:
    """The code (not its docstrings) builds a process group or DDP, or reads a local rank
    (not a name only ever set to a number, BitNet's ``local_rank = 0``)."""
    fixed = _fixed_local_rank(tree)
    for node in walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            # an Accelerate `Accelerator`: `accelerate launch` runs its script on every rank
            if name in {"init_process_group", "DistributedDataParallel", "DDP", "Accelerator"}:
                return True
        elif (isinstance(node, ast.Name) and node.id == "local_rank" and not fixed) or (
            isinstance(node, ast.Attribute) and node.attr == "local_rank"
        ):
            return True
        elif isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and key.value in {"LOCAL_RANK", "RANK"}:
                return True
    return False


def _fixed_local_rank(tree: ast.AST) -> bool:
    """Every binding of the name ``local_rank`` sets it to an integer literal (no parameter,
    loop or unpacking binds it): one process on a fixed GPU."""
    stores: set[int] = set()
    literal: set[int] = set()
    for node in walk(tree):
        if isinstance(node, ast.arg) and node.arg == "local_rank":
            return False
        if (
            isinstance(node, ast.Name)
            and node.id == "local_rank"
            and isinstance(node.ctx, ast.Store)
        ):
            stores.add(id(node))
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and type(node.value.value) is int
        ):
            literal |= {id(t) for t in node.targets}
    return bool(stores) and stores <= literal


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


# Serving frameworks' predictor bases -> the method they call once to load the model.
_SERVING_HOOKS = {"BasePredictor": "setup", "BaseHandler": "initialize", "LitAPI": "setup"}


def _serving_hook(cls: ast.ClassDef) -> str | None:
    """The set-up hook of a serving framework's predictor class: Cog's ``BasePredictor.setup``,
    TorchServe's ``BaseHandler.initialize``, LitServe's ``LitAPI.setup``, a Triton Python
    backend's ``TritonPythonModel.initialize``."""
    if cls.name == "TritonPythonModel":
        return "initialize"
    for base in cls.bases:
        name = (dotted_name(base) or "").rpartition(".")[2]
        if name in _SERVING_HOOKS:
            return _SERVING_HOOKS[name]
    return None


def _model_holder(ctx: Context) -> str | None:
    """The class of the enclosing method when it keeps a model (``self.model = model``, also
    private: ``self._model``, or named for one, ``self.prop_net``) and is not itself an ``nn.Module`` (TPL102 covers those) nor
    CUDA-specific by name."""
    scope = ctx.function_scope()
    if scope is None or scope.cls is None or scope.cls.is_module_class or in_test(ctx):
        return None
    cls = scope.cls
    cached = cls.cache.get("model-holder")
    if cached is None:
        assert isinstance(cls.node, ast.ClassDef)
        methods = {
            item.name: item
            for item in cls.node.body
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        init = methods.get("__init__")
        # `__init__` and the set-up methods it calls, `self.init_model()`; and the hook a
        # serving framework calls once to load the model (Cog's `BasePredictor.setup`)
        setup = [init] if init is not None else []
        hook = _serving_hook(cls.node)
        if hook is not None and hook in methods:
            setup.append(methods[hook])
        setup += [
            methods[sub.func.attr]
            for sub in (walk(init) if init is not None else ())
            if isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and dotted_name(sub.func.value) == "self"
            and sub.func.attr in methods
        ]
        holds = any(
            isinstance(sub, ast.Assign)
            and any(
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
                and (
                    t.attr.lstrip("_") in {"model", "net", "module"}
                    or t.attr.endswith(("_model", "_net"))  # STCN's `self.prop_net`
                    or (t.attr.lstrip("_") in {"pipe", "pipeline"} and _builds_pipeline(sub.value))
                )
                for t in sub.targets
            )
            for item in setup
            for sub in walk(item)
        ) or any(
            # a diffusers pipeline holds its models through `self.register_modules(unet=...)`
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == "register_modules"
            and dotted_name(sub.func.value) == "self"
            and sub.keywords
            for item in setup
            for sub in walk(item)
        )
        holds = holds or any(_moves_to_given(method) for method in methods.values())
        cached = cls.cache["model-holder"] = holds and not _cuda_specific(ctx, cls.name)
    return cls.name if cached else None


def _builds_pipeline(value: ast.expr) -> bool:
    """``StableDiffusionPipeline.from_pretrained(...)``, ``VideoUpscalePipeline(...)``,
    ``pipe.to(device)``: a model pipeline, not a renderer's settings (``edict({...})``)."""
    if not isinstance(value, ast.Call):
        return False
    name = call_name(value) or ""
    return name in {"to", "from_pretrained", "from_single_file"} or name.endswith("Pipeline")


def _moves_to_given(method: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A placement method of the class's own, ``def to_device(self, s="cuda:0")`` moving what
    it holds with ``.to(s)`` (FoundationPose's estimator): the class lets its caller choose
    the device, which a bare ``"cuda"`` in its other methods ignores."""
    if method.name not in {"to", "to_device", "set_device", "move_to"}:
        return False
    params = {a.arg for a in [*method.args.posonlyargs, *method.args.args][1:]}
    return any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "to"
        and any(isinstance(a, ast.Name) and a.id in params for a in sub.args)
        for sub in walk(method)
    )


def _defaults(node: ast.FunctionDef | ast.AsyncFunctionDef, ctx: Context) -> None:
    """``def f(device="cuda")``: the device should be injected, not defaulted to CUDA."""
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    with_defaults = positional[len(positional) - len(args.defaults) :]
    pairs = list(zip(with_defaults, args.defaults, strict=True))
    pairs += [
        (arg, d) for arg, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None
    ]
    if _cuda_specific(ctx, node.name) or in_test(ctx):
        return  # CUDA is the code's contract, or a test's own choice of device
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
            and not _stored_compared(node, arg.arg, ctx)
            and not _cpu_when_unavailable(node, arg.arg)
            # `fire.Fire(run)`: a command line's default, as an argparse one is (see below)
            and (_rank_code(ctx) or not _command_line(node, arg.arg, ctx))
        ):
            ctx.report(
                BARE_CUDA.code,
                default,
                f'parameter `{arg.arg}` defaults to bare "cuda": callers without CUDA fail '
                "by default and the GPU is whichever is current; default to None and resolve "
                "it, or require the device",
            )


_CLI_RUNNERS = frozenset({"fire.Fire", "typer.run", "jsonargparse.CLI", "jsonargparse.auto_cli"})


def _command_line(func: ast.FunctionDef | ast.AsyncFunctionDef, name: str, ctx: Context) -> bool:
    """Parameter ``name`` of ``func`` is a command line's flag: ``func`` is handed to
    ``fire.Fire(run)`` (also ``typer.run``, jsonargparse's ``CLI``), or is a typer command,
    whose parameters are all flags, or a click command with an option for it
    (``@click.option("--device", ...)``; a parameter no option sets keeps its default)."""
    decorators = [d.func if isinstance(d, ast.Call) else d for d in func.decorator_list]
    if any((ctx.qualname(d) or "").startswith("click.") for d in decorators):
        flag = "--" + name.replace("_", "-")
        return any(
            (ctx.call_qualname(d) or "") in {"click.option", "click.argument"}
            and any(
                isinstance(a, ast.Constant) and a.value in {name, flag, "--" + name} for a in d.args
            )
            for d in func.decorator_list
            if isinstance(d, ast.Call)
        )
    if any((dotted_name(d) or "").endswith(".command") for d in decorators):
        return True  # typer's `@app.command()`
    handed = kept(
        "cli-runs",
        ctx.scope.root().node,
        lambda module: frozenset(
            a.id
            for sub in walk(module)
            if isinstance(sub, ast.Call) and (ctx.call_qualname(sub) or "") in _CLI_RUNNERS
            for a in sub.args
            if isinstance(a, ast.Name)
        ),
    )
    return func.name in handed


def _cpu_when_unavailable(func: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
    """The function rebinds the parameter to the CPU under a test of CUDA's availability:
    PatchTST's ``def load(self, fname, device="cuda"):`` starts with ``if not
    torch.cuda.is_available(): device = "cpu"``, the statement form of the ``"cuda" if
    torch.cuda.is_available() else "cpu"`` fallback."""
    for branch in walk(func):
        if not isinstance(branch, ast.If) or not any(
            isinstance(sub, ast.Attribute) and sub.attr == "is_available"
            for sub in walk(branch.test)
        ):
            continue
        for stmt in [*branch.body, *branch.orelse]:
            if (
                isinstance(stmt, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
                and any(isinstance(s, ast.Constant) and s.value == "cpu" for s in walk(stmt.value))
            ):
                return True
    return False


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
    """The parameter is used to place tensors (``device=name``, ``.to(name)``, also spelled
    ``device=str(name)``, as a safetensors load takes it) and never compared (a compared
    ``"cuda"`` is a backend name, such as ``device_type``)."""
    places = False
    for sub in walk(func):
        if isinstance(sub, ast.Compare):
            if _compares_as_name(sub, lambda n: isinstance(n, ast.Name) and n.id == name):
                return False
        elif isinstance(sub, ast.Call):
            target = device_argument(sub, ctx)
            if (
                isinstance(target, ast.Call)
                and isinstance(target.func, ast.Name)
                and target.func.id == "str"
                and len(target.args) == 1
                and not target.keywords
            ):
                target = target.args[0]  # `load_file(path, device=str(device))`
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
    stored = _stored(func, name) if ctx.scope.kind == "class" else set()
    for sub in walk(ctx.scope.node) if stored else ():
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


def _stored_compared(func: ast.FunctionDef | ast.AsyncFunctionDef, name: str, ctx: Context) -> bool:
    """``__init__`` stores the parameter (``self.device = device``) and a method of the class
    compares it (``if self.device == "cuda":``): a backend name, as a compared parameter is;
    or the function only hands the parameter on, as the same keyword, to such a class of its
    file (``PrefetchLoader(loader, device=device)``)."""
    if ctx.scope.kind == "class":
        return _compared_by_class(ctx.scope.node, func, name)
    handed = [
        sub
        for sub in walk(func)
        if isinstance(sub, ast.Call)
        and any(isinstance(kw.value, ast.Name) and kw.value.id == name for kw in sub.keywords)
    ]
    module = ctx.scope.root().node
    classes = {c.name: c for c in getattr(module, "body", []) if isinstance(c, ast.ClassDef)}
    return bool(handed) and all(
        isinstance(call.func, ast.Name)
        and (cls := classes.get(call.func.id)) is not None
        and (init := _init_of(cls)) is not None
        and all(
            _compared_by_class(cls, init, kw.arg)
            for kw in call.keywords
            if kw.arg is not None and isinstance(kw.value, ast.Name) and kw.value.id == name
        )
        for call in handed
    )


def _init_of(cls: ast.ClassDef) -> ast.FunctionDef | None:
    return next(
        (f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None
    )


def _compared_by_class(
    cls: ast.AST, init: ast.FunctionDef | ast.AsyncFunctionDef, name: str
) -> bool:
    """``init`` (``__init__`` of ``cls``) stores its parameter ``name`` on ``self``, and a
    method of the class compares that attribute as a name (``self.device == "cuda"``)."""
    stored = _stored(init, name)
    return bool(stored) and any(
        isinstance(sub, ast.Compare)
        and _compares_as_name(sub, lambda n: isinstance(n, ast.Attribute) and n.attr in stored)
        for sub in walk(cls)
    )


def _stored(func: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> set[str]:
    """The attributes of ``self`` that ``func``, an ``__init__``, binds to its parameter."""
    if func.name != "__init__":
        return set()
    return {
        attr
        for sub in walk(func)
        if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Name) and sub.value.id == name
        for target in sub.targets
        if (attr := self_attribute(target)) is not None
    }


def _compares_as_name(compare: ast.Compare, is_param: Callable[[ast.AST], bool]) -> bool:
    """The parameter itself is compared (``device == "cuda"``: a backend name), not only its
    ``.type`` (``device.type == "cuda"`` asks what kind of device a ``torch.device`` is)."""
    queried = {
        id(sub.value)
        for sub in walk(compare)
        if isinstance(sub, ast.Attribute) and sub.attr == "type" and is_param(sub.value)
    }
    if _against_cpu(compare):
        return False  # `if self.device == "cpu":` asks about a device, not a backend's name
    return any(is_param(sub) and id(sub) not in queried for sub in walk(compare))


def _against_cpu(compare: ast.Compare) -> bool:
    """A comparison of two operands, one of them the literal ``"cpu"``."""
    operands = [compare.left, *compare.comparators]
    return len(operands) == 2 and any(
        isinstance(o, ast.Constant) and o.value == "cpu" for o in operands
    )


def _bound_cuda(node: ast.Assign, ctx: Context) -> None:
    """``device = "cuda"`` in multi-rank code (StyleGAN2's ``train.py`` under ``if __name__
    == "__main__":``), the name's only binding in its scope, which then places tensors
    (``Generator(...).to(device)``): every such placement is a bare ``"cuda"``."""
    if len(node.targets) == 1 and self_attribute(node.targets[0]) is not None:
        _bound_attribute_cuda(node, ctx)
        return
    if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
        return
    if _device_literal(node.value) != "cuda" or not _rank_code(ctx):
        return
    if _single_process_branch(ctx) or ctx.method_of_module() is not None:
        return
    name = node.targets[0].id
    scope = ctx.function_scope() or ctx.scope.root()
    if len(ctx.scope_bindings(scope).get(name) or []) != 1:
        return
    places = False
    for sub in walk(scope.node):
        if isinstance(sub, ast.Compare) and any(
            isinstance(side, ast.Name) and side.id == name for side in (sub.left, *sub.comparators)
        ):
            return  # `if device == "cuda":` names a backend
        if isinstance(sub, ast.Call):
            target = device_argument(sub, ctx)
            places = places or (isinstance(target, ast.Name) and target.id == name)
    if places:
        ctx.report(
            BARE_CUDA.code,
            node.value,
            f'`{name}` is bound to bare "cuda" in multi-rank code and places tensors: each '
            "rank gets the current device, right only if `set_device` ran first; use "
            "`cuda:{local_rank}` or derive the device from the rank",
        )


def _bound_attribute_cuda(node: ast.Assign, ctx: Context) -> None:
    """``self.device = "cuda"`` in a class that holds a model, the attribute's only binding in
    the class, which then places (``UNet.from_pretrained(...).to(self.device)``): each such
    placement is a bare ``"cuda"`` in a model holder, as ``.to("cuda")`` there is."""
    attr = self_attribute(node.targets[0])
    if attr is None or _device_literal(node.value) != "cuda" or _under_branch(ctx):
        return
    holder = _model_holder(ctx)
    scope = ctx.function_scope()
    if holder is None or scope is None or scope.cls is None:
        return
    cls = scope.cls.node
    bindings = [
        sub
        for sub in walk(cls)
        if isinstance(sub, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        for target in (sub.targets if isinstance(sub, ast.Assign) else [sub.target])
        if self_attribute(target) == attr
    ]
    if len(bindings) != 1:
        return
    places = False
    for sub in walk(cls):
        if isinstance(sub, ast.Compare) and any(
            self_attribute(side) == attr for side in (sub.left, *sub.comparators)
        ):
            return  # `if self.device == "cuda":` names a backend
        if isinstance(sub, ast.Call):
            target = device_argument(sub, ctx)
            places = places or (target is not None and self_attribute(target) == attr)
    if places:
        ctx.report(
            BARE_CUDA.code,
            node.value,
            f'`self.{attr}` is bound to bare "cuda" in `{holder}`, which holds a model, and '
            "places with it: its tensors land on the current GPU wherever the model is (and "
            "fail without CUDA); take the device as a parameter or follow the model's",
        )


def _under_branch(ctx: Context) -> bool:
    """Inside an ``if``, a conditional expression or a ``try``: the binding may be one arm of a
    choice (``if cuda: self.device = "cuda"`` ... ``else: self.device = "cpu"``) or a
    fallback, not the class's one device."""
    return any(isinstance(p, (ast.If, ast.IfExp, ast.ExceptHandler, ast.Try)) for p in ctx.parents)


def _has_index(call: ast.Call, ctx: Context) -> bool:
    """``torch.device("cuda", 0)`` names an index in its second argument."""
    return ctx.call_qualname(call) == "torch.device" and (
        len(call.args) > 1 or keyword(call, "index") is not None
    )


FAMILY = Family(
    rules=(DISCARDED, DEVICE_IN_MODULE, FACTORY, BARE_CUDA),
    checks=(
        (ast.Expr, _discarded, (DISCARDED.code,)),
        (ast.FunctionDef, _defaults, (BARE_CUDA.code,)),
        (ast.AsyncFunctionDef, _defaults, (BARE_CUDA.code,)),
        (ast.Assign, _bound_cuda, (BARE_CUDA.code,)),
        (ast.Call, _call, (DEVICE_IN_MODULE.code, FACTORY.code, BARE_CUDA.code)),
    ),
    triggers=(
        ".to(",
        ".cuda(",
        ".cpu(",
        "cuda",
        *(f"{quote}{device}" for quote in "\"'" for device in ("mps", "xpu", "hpu", "npu")),
        *("zeros(", "ones(", "empty", "full(", "arange(", "tensor(", "Tensor(", "rand", "eye("),
        "space(",
        "_indices(",
    ),
)
