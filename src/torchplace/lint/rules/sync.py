"""TPL2xx: host syncs inside loops (pitfall 11: every step reads the device back).

Built on :mod:`torchplace.lint.provenance`: a read is reported when it runs once per batch (in
a loop that steps through batches, a loop over a device tensor's rows, or a function called
from such a loop) and what it reads is on the device, or (for the explicit reads
``.item()``/``.tolist()``/``.cpu()``/``.numpy()`` in a batch loop) not provably on the host.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

from torchplace.lint.base import (
    Context,
    Family,
    Rule,
    Scope,
    assigned_name,
    at_method,
    bindings,
    call_name,
    keyword,
    loop_items,
    names_in,
)
from torchplace.lint.nodes import (
    isinstance_test,
    kept,
    own_nodes,
    parameter_defaults,
    statements,
    store_targets,
    subscripted,
    subtree,
    walk,
    walk_body,
)
from torchplace.lint.provenance import Fact, FileFacts, PerBatch, file_facts, scope_node
from torchplace.lint.provenance.callers import (
    MOVED_SELF,
    call_words,
    decode_hook,
    engine_step,
    imported_by_siblings,
    openmmlab_step,
)
from torchplace.lint.provenance.flow import TORCH_QUERIES, zip_pairs
from torchplace.lint.provenance.loops import (
    _accumulates,
    _few_constants,
    _gathered_into,
    _gathers_host_values,
    _model_root,
    _parts,
    _stores_entries,
    _walks_ranks,
    calls_backward,
    counter_names,
    feeds_back,
    indexed_row,
    narrowed_to_list,
    rare_test,
    single_pass,
    step_parts,
)
from torchplace.lint.provenance.values import (
    HOST_METHODS,
    _device_target,
    _is_cpu,
    _passes_device,
    is_text,
)
from torchplace.lint.resolver import dotted_name, is_module_base
from torchplace.lint.rules.facts import (
    CASTS,
    FROM_ELEMENTS,
    TENSOR_METHODS,
    TIMERS,
    _over_loader,
    copies_to_cpu,
    cpu_only_program,
    in_device_kernel,
    in_periodic_branch,
    in_test,
    is_env_step,
    is_tensor_expr,
    names_no_device,
    old_loss_read,
)
from torchplace.lint.rules.read_helpers import helper_read

__all__ = ["FAMILY"]

SYNC_IN_LOOP = Rule(
    "TPL201", "sync-in-loop", "host read of a device value (`.item()`, `float()`, ...) per batch"
)
SYNCHRONIZE_IN_LOOP = Rule(
    "TPL202", "synchronize-in-loop", "`torch.cuda.synchronize()` inside a loop"
)

_READS = frozenset({"item", "tolist", "cpu", "numpy"})
# `math` functions convert a tensor argument with `float()`: a host read like the casts; NumPy's
# scalar tests convert it with `__array__` (a copy to the host, refused for a CUDA tensor).
_MATH_READS = frozenset(
    (
        *(
            f"math.{name}"
            for name in (
                *("isnan", "isinf", "isfinite", "sqrt", "log", "log10", "log2", "log1p"),
                *("exp", "expm1", "floor", "ceil", "fabs", "sin", "cos", "tan", "atan"),
            )
        ),
        *(f"numpy.{name}" for name in ("isnan", "isinf", "isfinite")),
    )
)
_PRINTS = frozenset({"print"})
# `str(loss)`, `repr(x)`: the text of a tensor's values, read like a print
_STRINGS = frozenset({"str", "repr"})
_COMPS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_BULK = frozenset({"cpu", "numpy", "tolist"})
# Calls that write results out: a read feeding them is the program's output, not a stall.
# `pool.submit(f, x.cpu())` hands the copy to a worker process: it leaves as output too, as
# `msg.stream_token(tokenizer.decode(t.tolist()))` streams it to a chat client.
_OUTPUT_WORDS = (
    "save",
    "write",
    "imsave",
    "savez",
    "fromarray",
    "dump",
    "send",
    "submit",
    "stream",
    "imshow",  # `cv2.imshow("image", flow_image)`: a demo's frame shown, its output
    # TensorBoard's images and videos, `writer.add_image("input", make_grid(x.cpu()))`: what a
    # loop that trains nothing logs (in training the copy is reported as any other)
    "add_image",
    "add_video",
)


def _host_copy(call: ast.Call, ctx: Context, *, chained: bool = False) -> str | None:
    """The read ``call`` makes by its method: ``.item()``, ``.tolist()``, ``.cpu()``,
    ``.numpy()``; in a chain of them, ``.to("cpu")`` (also to a name bound only to the CPU)
    reads as ``.cpu()`` (``target.to("cpu").numpy()``). Alone it is left to the rules on moves:
    detectors' result objects have ``.to`` and no ``.cpu``, and move their outputs so
    (``[o.to(cpu_device) for o in output]``, collected as the evaluation's input)."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    if func.attr in _READS and not call.args:
        return func.attr
    detached = _is_detach(func.value)  # `loss.detach().to("cpu")`: a tensor's own copy
    if (chained or detached) and func.attr == "to" and (call.args or call.keywords):
        return "cpu" if copies_to_cpu(call, ctx) else None
    if func.attr == "detach" and not call.args and isinstance(func.value, ast.Call):
        # `loss.to("cpu").detach()`: the copy's result is a tensor, the copy a read
        return "cpu" if _host_copy(func.value, ctx, chained=True) == "cpu" else None
    return None


def _is_detach(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "detach"
        and not node.args
    )


def _call(call: ast.Call, ctx: Context) -> None:
    func = call.func
    copy = _host_copy(call, ctx)
    if copy is not None:
        assert isinstance(func, ast.Attribute)
        if ctx.qualname(func) is not None:  # np.something.item: a module path, not a tensor
            return
        if id(call) in ctx.claimed:  # the inner `.cpu()` of `x.cpu().numpy()`: one finding
            return
        inner = func.value
        while isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute):
            if inner.func.attr != "detach" and _host_copy(inner, ctx, chained=True) is None:
                break
            ctx.claimed.add(id(inner))
            inner = inner.func.value
        if isinstance(inner, ast.Call) and helper_read(inner, ctx) is not None:
            ctx.claimed.add(id(inner))  # `to_cpu(loss).item()`: one finding, the outer read
        if copy == "cpu" and inner is func.value and _runs_as_module(inner, ctx):
            return  # `layer.cpu()` of a layer the function runs: a module moved back, no read
        if copy == "cpu" and inner is func.value and _moved_in_place(call, inner, ctx):
            return  # `model.cpu()` as a statement: a module offloaded in place, no read
        if copy == "cpu" and inner is func.value and _parked_back(call, ctx):
            return  # `acts[i] = [a.cpu() for a in acts[i]]` after their `.cuda()`: offloaded
        if copy == "numpy" and keyword(call, "force") is None and not _moves(func.value):
            return  # `x.float().numpy()` raises for a device tensor: `x` is on the host
        what = f"`.{copy}()`" if func.attr in _READS else '`.to("cpu")`'
        _check(at_method(call), inner, what, ctx, explicit=True, bulk=copy in _BULK, read=call)
        return
    counted = _unique_counted(call, ctx)
    if counted is not None:
        what = "the size of a data-dependent result (the host waits to learn it)"
        _check(call, counted, what, ctx, explicit=True, read=call)
        return
    bound = _clamp_bound_beside_number(call, ctx)
    if bound is not None:
        what = "a `clamp` bound beside a Python number (made one: `.item()`)"
        _check(call, bound, what, ctx, explicit=False)
        return
    if isinstance(func, ast.Attribute) and func.attr == "narrow" and len(call.args) == 3:
        # `x.narrow(0, 0, n)` with `n` an element of a device tensor: `__index__`, a read
        for bound in call.args[1:]:
            if (
                isinstance(bound, (ast.Subscript, ast.Name))
                and not _host_syntax(bound)
                and _check(bound, bound, "a `narrow` bound", ctx, explicit=False)
            ):
                return
        return
    if (
        isinstance(func, ast.Attribute)
        and func.attr == "get_scale"
        and not call.args
        and _grad_scaler(func.value, ctx)
    ):
        # `scaler.get_scale()` reads the scale tensor back with `.item()`; it lives where the
        # loss the scaler scales does (`scaler.scale(loss).backward()` in the same function)
        scaled = _scaled_loss(func.value, ctx)
        receiver = scaled if scaled is not None else func.value
        _check(
            call, receiver, "`GradScaler.get_scale()` for the scale", ctx, explicit=True, read=call
        )
        return
    read = helper_read(call, ctx) if isinstance(func, (ast.Name, ast.Attribute)) else None
    if read is not None:
        if id(call) not in ctx.claimed:
            # `to_cpu(x)` of a project helper returning `x.detach().cpu()`: the read is here
            what = f"`{ctx.segment(func)}()` (which returns `.{read}()` of its argument)"
            _check(call, call.args[0], what, ctx, explicit=True, bulk=read in _BULK, read=call)
        return
    # a list of 0-dim device tensors is read to the host one element at a time (also by the
    # tensor methods that build a new tensor from data, `scores.new([x[0] for x in beams])`)
    from_elements = ctx.call_qualname(call) in FROM_ELEMENTS or (
        isinstance(func, ast.Attribute)
        and func.attr in {"new", "new_tensor"}
        and ctx.qualname(func) is None
    )
    if len(call.args) == 1 and from_elements:
        for element in _elements(call.args[0], ctx):  # each 0-dim tensor read to the host
            if _module_setting(element, ctx):
                continue  # `torch.tensor([model.blank])`: an integer setting of a model
            if _check(call, element, f"`{ctx.segment(func)}()` of a list", ctx, explicit=False):
                return
        return
    what = f"a size given to `{ctx.segment(func)}()` (made a Python number)"
    if any(_check(call, size, what, ctx, explicit=False) for size in _size_arguments(call, ctx)):
        return
    fill = _fill_value(call, ctx)
    if fill is not None:
        what = f"the fill value of `{ctx.segment(func)}()` (a Python number: `.item()`)"
        _check(call, fill, what, ctx, explicit=False)
        return
    # Python's own all/any tests the elements of its one argument, and min/max compares them
    # (or its arguments) with `<`: each a `bool()` of a device result
    over_elements = {"all", "any"} | ({"min", "max"} if not call.keywords else set())
    if isinstance(func, ast.Name) and func.id in over_elements and len(call.args) == 1:
        if ctx.qualname(func) is None and not isinstance(call.args[0], _COMPS):
            _check(call, call.args[0], f"`{func.id}()` over the elements", ctx, explicit=False)
        elif ctx.qualname(func) is None and _tests_each_parameter(call.args[0], ctx):
            # `any(not p.grad.isfinite().all() for p in self.model_params)`: one read per parameter
            what = f"`{func.id}()` over a test of each parameter"
            _check(call, call.args[0], what, ctx, explicit=True)
        elif ctx.qualname(func) is None:
            # `any(torch.isnan(l) for l in (g_loss, d_loss))`: a test of each listed tensor
            what = f"`{func.id}()` over a torch test"
            if not _check_many(call, _tested_elements(call.args[0], ctx), what, ctx):
                # `all([p == a for p, a in zip(preds, answers)])`: each row of `preds` compared
                what = f"`{func.id}()` over comparisons of the rows"
                _check_many(call, _compared_rows(call.args[0]), what, ctx)
        return
    if (
        isinstance(func, ast.Name)
        and func.id in {"min", "max"}
        and len(call.args) > 1
        and not call.keywords
        and ctx.qualname(func) is None
    ):
        # not a field of another object (`max(params.max_seqlen, n)`): an int beside the
        # object's tensors, as often as one of them
        compared = [arg for arg in call.args if not _foreign_field(arg)]
        _check_many(call, compared, f"`{func.id}()` comparison", ctx)
        return
    if isinstance(func, ast.Name) and func.id in CASTS and len(call.args) == 1:
        arg = call.args[0]
        if not _is_read(arg) and ctx.qualname(func) is None:
            _check(call, arg, f"`{func.id}()`", ctx, explicit=False)
        return
    if (
        isinstance(func, ast.Name)
        and func.id in _STRINGS
        and len(call.args) == 1
        and not call.keywords
        and ctx.qualname(func) is None
    ):
        arg = call.args[0]
        if not _is_read(arg) and not isinstance(arg, (ast.Constant, ast.JoinedStr)):
            _check_many(call, [arg], f"`{func.id}()`", ctx)  # text of the values, as print
        return
    if isinstance(func, ast.Attribute) and func.attr == "add_scalar":
        # TensorBoard's `writer.add_scalar(tag, value, step)` converts a tensor `value` with
        # `.item()`: a read like `float(value)` (a Python number is no read at all)
        given = keyword(call, "scalar_value")
        value = call.args[1] if len(call.args) >= 2 else (given.value if given else None)
        if value is not None and not _is_read(value):
            _check(call, value, "`add_scalar()`", ctx, explicit=False)
        return
    if isinstance(func, ast.Attribute) and func.attr == "add_scalars":
        # `writer.add_scalars("loss", {"train": loss}, step)`: each value as `add_scalar`'s
        given = keyword(call, "tag_scalar_dict")
        table = call.args[1] if len(call.args) >= 2 else (given.value if given else None)
        if isinstance(table, ast.Dict):
            _check_many(call, list(table.values), "`add_scalars()`", ctx)
        return
    if isinstance(func, ast.Attribute) and func.attr in _TENSORBOARD_COPIES:
        # `writer.add_histogram(tag, values, step)`, `add_image(tag, img)`: TensorBoard copies
        # the whole tensor to NumPy (`make_np`: `.cpu().numpy()`)
        keyword_name, index = _TENSORBOARD_COPIES[func.attr]
        given = keyword(call, keyword_name)
        value = call.args[index] if len(call.args) > index else (given.value if given else None)
        if func.attr.startswith("add_image") and not _trains(ctx):
            return  # samples logged as a loop that trains nothing makes them: its output
        if value is not None and not _is_read(value):
            _check(call, value, f"`{func.attr}()`", ctx, explicit=False, bulk=True)
        return
    if len(call.args) == 1 and ctx.call_qualname(call) in _MATH_READS:
        arg = call.args[0]
        if not _is_read(arg):
            _check(call, arg, f"`{ctx.segment(func)}()`", ctx, explicit=False)
        return
    if (isinstance(func, ast.Name) and func.id in _PRINTS) or (
        isinstance(func, ast.Attribute) and func.attr == "format" and call.args
    ):
        for sub in call.args:
            if isinstance(sub, ast.JoinedStr):
                ctx.claimed.add(id(sub))
        values = [a for a in call.args if not isinstance(a, (ast.Constant, ast.JoinedStr))]
        pieces = [
            (v.value, a.lineno != a.end_lineno)
            for a in call.args
            if isinstance(a, ast.JoinedStr)
            for v in a.values
            if isinstance(v, ast.FormattedValue)
        ]
        what = "`print()`" if isinstance(func, ast.Name) else "`str.format()`"
        # an f-string split over lines is reported where its value is, as `_joined` does
        split = [v for v, spread in pieces if spread and not _names_a_model(v, ctx)]
        if any(not _is_read(v) and _check(v, v, what, ctx, explicit=False) for v in split):
            return
        values += [v for v, spread in pieces if not spread]
        values = [v for v in values if not (_names_a_model(v, ctx) or _holds_module(v, ctx))]
        _check_many(call, values, what, ctx)
        return
    name = ctx.call_qualname(call)
    if name in {"torch.cuda.synchronize", "torch.accelerator.synchronize"}:
        loops = ctx.loops()
        if not loops or any(_times_each_step(loop, ctx) for loop in loops) or in_test(ctx):
            return  # timing each step, or a test making failures surface at the right step
        if _warms_up(loops[-1], ctx):
            return  # the warm-up of a benchmark whose next loop times each step
        if in_periodic_branch(ctx):
            return  # `if step % log_every == 0:`: once every N steps, not every step
        if all(_not_a_step(loop, call) for loop in loops):
            return  # `for device in devices: synchronize(device)`: each device once
        ctx.report(
            SYNCHRONIZE_IN_LOOP.code,
            call,
            f"`{name}()` inside a loop stalls the host on every step; synchronize once "
            "after the loop (or record CUDA events)",
        )


# torch functions whose result has a size the data decides: the host waits to learn it
_DATA_SIZED = frozenset({"unique", "unique_consecutive", "nonzero", "argwhere", "masked_select"})
_CLAMPS = frozenset({"clamp", "clamp_", "clip", "clip_"})


def _number(node: ast.expr | None) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    )


def _clamp_bound_beside_number(call: ast.Call, ctx: Context) -> ast.expr | None:
    """The tensor bound of ``x.clamp(0, t.max())`` (or ``min=0, max=t``): with one bound a
    Python number, PyTorch takes the number overload and turns the other into one with
    ``.item()``. Two tensor bounds, or one alone, stay on the device."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in _CLAMPS:
        return None
    args = list(call.args)
    if ctx.call_qualname(call) in {"torch.clamp", "torch.clip"}:
        args = args[1:]
    elif ctx.qualname(func) is not None:
        return None  # `np.clip(a, 0, m)`: NumPy's
    given = {kw.arg: kw.value for kw in call.keywords if kw.arg in {"min", "max"}}
    low = args[0] if args else given.get("min")
    high = args[1] if len(args) > 1 else given.get("max")
    if _number(low) and high is not None and not _number(high):
        return high
    if _number(high) and low is not None and not _number(low):
        return low
    return None


def _unique_counted(call: ast.Call, ctx: Context) -> ast.expr | None:
    """The tensor whose data-dependent part ``call`` counts: its distinct values,
    ``x.unique().numel()``, ``len(torch.unique(x))``; its nonzero entries, ``x.nonzero().size(0)``
    (also ``argwhere``, ``masked_select``); what a boolean mask selects,
    ``x[select == 1].nelement()``. The result's size depends on the data, so the host waits
    for the device to learn it (the count is what the code reads)."""
    func = call.func
    if isinstance(func, ast.Attribute) and (
        func.attr in {"numel", "nelement"} or (func.attr == "size" and call.args)
    ):
        inner = func.value
    elif isinstance(func, ast.Name) and func.id == "len" and len(call.args) == 1:
        if ctx.qualname(func) is not None:
            return None
        inner = call.args[0]
    else:
        return None
    return _data_sized(_sized_value(inner), ctx)


# views that keep a tensor's size: `x.nonzero().squeeze(-1).numel()` counts as much
_SIZE_KEEPING = frozenset({"squeeze", "flatten", "view", "reshape", "contiguous", "long", "t"})


def _sized_value(node: ast.expr) -> ast.expr:
    """What a size-keeping view (``x.nonzero().squeeze(-1)``) views. A name bound to such a
    result is not followed: the host waited where it was made, and its size is then known."""
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _SIZE_KEEPING
    ):
        node = node.func.value
    return node


def _data_sized(inner: ast.expr, ctx: Context) -> ast.expr | None:
    """The tensor ``inner`` selects from, where ``inner`` is a result whose size the data
    decides (``x.nonzero()``, ``torch.unique(x)``, ``x[mask == 1]``), else None."""
    if (
        isinstance(inner, ast.Subscript)
        and isinstance(inner.slice, ast.Compare)
        and len(inner.slice.ops) == 1
    ):
        return inner.value  # `x[select == 1].nelement()`: a boolean mask's selection
    if not isinstance(inner, ast.Call) or not isinstance(inner.func, ast.Attribute):
        return None
    if inner.func.attr not in _DATA_SIZED:
        return None
    if ctx.call_qualname(inner) in {f"torch.{name}" for name in _DATA_SIZED}:
        return inner.args[0] if inner.args else None
    if ctx.qualname(inner.func) is not None:
        return None  # `np.unique(a)`: a host array's distinct values
    return inner.func.value


# TensorBoard writer methods that copy a whole tensor to NumPy: the argument's keyword and
# position.
_TENSORBOARD_COPIES = {
    "add_histogram": ("values", 1),
    "add_image": ("img_tensor", 1),
    "add_images": ("img_tensor", 1),
    "add_embedding": ("mat", 0),
}


def _grad_scaler(receiver: ast.expr, ctx: Context) -> bool:
    """``scaler``, or ``self.scaler``, bound in its function (or the class's methods) to
    ``torch.amp.GradScaler(...)`` (also ``torch.cuda.amp``'s, from its module or the name
    imported)."""
    name = dotted_name(receiver)
    if name is None:
        return False
    scope = ctx.function_scope()
    if name.startswith("self.") and scope is not None:
        owner = file_facts(ctx).parent.get(id(scope.node))
        nodes = walk(owner) if isinstance(owner, ast.ClassDef) else own_nodes(scope.node)
    else:
        nodes = own_nodes(scope.node if scope is not None else ctx.scope.root().node)
    return any(
        isinstance(node, ast.Assign)
        and any(
            isinstance(value, ast.Call) and _names_grad_scaler(ctx.qualname(value.func) or "")
            # also one arm of a choice, `torch.GradScaler() if fp16 else None`
            for value in _alternatives(node.value)
        )
        and any(dotted_name(target) == name for target in node.targets)
        for node in nodes
    )


def _scaled_loss(scaler: ast.expr, ctx: Context) -> ast.expr | None:
    """The loss ``scaler.scale(loss)`` scales in the function, where the scale tensor lives."""
    name = dotted_name(scaler)
    scope = ctx.function_scope()
    if name is None or scope is None:
        return None
    for node in own_nodes(scope.node):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "scale"
            and len(node.args) == 1
            and dotted_name(node.func.value) == name
        ):
            return node.args[0]
    return None


def _names_grad_scaler(qualname: str) -> bool:
    """``torch.amp.GradScaler``, ``torch.cuda.amp.grad_scaler.GradScaler`` (nerfstudio's
    import), FSDP's ``ShardedGradScaler``."""
    return qualname.startswith("torch.") and qualname.rsplit(".", 1)[-1].endswith("GradScaler")


def _names_a_model(value: ast.expr, ctx: Context) -> bool:
    """``print(args.model)`` of a name or attribute that the function (or a script's body)
    binds only to models it builds, in each branch (PFLlib's ``args.model =
    FedAvgCNN(...).to(args.device)``): a module's text lists its layers and reads no tensor."""
    name = dotted_name(value)
    if name is None:
        return False
    scope = ctx.function_scope() or ctx.scope.root()
    values: list[ast.expr] = []
    for sub in own_nodes(scope.node):
        targets: list[ast.expr] = sub.targets if isinstance(sub, ast.Assign) else []
        if isinstance(sub, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
            targets = [sub.target]
        for target in targets:
            if isinstance(sub, ast.Assign) and dotted_name(target) == name:
                values.append(sub.value)
            elif name in {dotted_name(t) for t in _unpacked(target)}:
                return False  # unpacked, stepped or looped over: not one plain model
    facts = file_facts(ctx)
    return bool(values) and all(_model_root(facts, v) for v in values)


def _holds_module(value: ast.expr, ctx: Context) -> bool:
    """``print(layer)`` of a name the function uses as a module (:func:`_module_holders`)."""
    scope = ctx.function_scope()
    return scope is not None and dotted_name(value) in _module_holders(scope.node)


def _unpacked(target: ast.expr) -> list[ast.expr]:
    """The targets an assignment binds: the elements of a tuple or list target, starred too."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for e in target.elts for t in _unpacked(e)]
    return [target.value] if isinstance(target, ast.Starred) else [target]


def _elements(arg: ast.expr, ctx: Context) -> list[ast.expr]:
    """The values ``torch.tensor(arg)`` converts one by one when ``arg`` is plainly a list:
    a display (``torch.tensor([loss_a, loss_b])``), the starred target of an enclosing loop
    (``for *xyxy, conf, cls in reversed(det): torch.tensor(xyxy)``, YOLO's boxes), or a list
    the function starts empty and grows (``labels = []``, ``labels.append(y[i])``, then
    ``torch.tensor(labels)``): what it appends, also as the one element of a display
    (``torch.Tensor([losses])``), a display repeated (``[flag] * arity``), and the element of
    a list comprehension."""
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Mult):
        arg = next((s for s in (arg.left, arg.right) if isinstance(s, (ast.List, ast.Tuple))), arg)
    if isinstance(arg, (ast.List, ast.Tuple)):
        elements = [e.value if isinstance(e, ast.Starred) else e for e in arg.elts]
        if len(elements) == 1 and isinstance(elements[0], ast.Name):
            scope = ctx.function_scope()
            grown = _appended(elements[0], scope.node) if scope is not None else []
            return grown or elements
        return elements
    if isinstance(arg, ast.ListComp):
        return [arg.elt]  # `torch.tensor([mask.sum().float() for _ in range(n)])`
    if not isinstance(arg, ast.Name):
        return []
    for parent in ctx.parents:
        if isinstance(parent, (ast.For, ast.AsyncFor)) and any(
            isinstance(t, ast.Starred) and isinstance(t.value, ast.Name) and t.value.id == arg.id
            for t in walk(parent.target)
        ):
            return [arg]
    scope = ctx.function_scope()
    if scope is None:
        return []
    for value in ctx.scope_bindings(scope).get(arg.id, []):
        if isinstance(value, ast.ListComp) and value.lineno < arg.lineno:
            # `loss_list = [torch.zeros_like(loss) for _ in range(n)]`, filled in place by
            # `dist.all_gather(loss_list, loss)`, then `torch.tensor(loss_list)`
            return [value.elt]
    return _appended(arg, scope.node)


# Methods only a module has: a name they are called on holds a model, not a tensor.
_MODULE_METHODS = frozenset(
    {"eval", "train", "parameters", "named_parameters", "state_dict", "load_state_dict"}
    | {"modules", "named_modules", "children", "zero_grad"}
)


def _module_setting(element: ast.expr, ctx: Context) -> bool:
    """``model.blank`` in ``torch.tensor([model.blank])``: an attribute of a model the code
    runs (``model(x)``) or treats as one (``model.eval()``, ``model.parameters()``), a setting
    such as a token id, read where the module keeps it, not a device tensor of a batch."""
    if not isinstance(element, ast.Attribute):
        return False
    owner = dotted_name(element.value)
    if owner is None or owner == "self":
        return False
    return any(
        isinstance(sub, ast.Call)
        and (
            dotted_name(sub.func) == owner
            or (
                isinstance(sub.func, ast.Attribute)
                and sub.func.attr in _MODULE_METHODS
                and dotted_name(sub.func.value) == owner
            )
        )
        for sub in subtree(scope_node(ctx))
    )


def _appended(name: ast.Name, function: ast.AST) -> list[ast.expr]:
    """What ``function`` appends to ``name`` after its last ``name = []`` above ``name``."""
    starts = [
        sub.lineno
        for sub in walk(function)
        if isinstance(sub, ast.Assign)
        and isinstance(sub.value, ast.List)
        and not sub.value.elts
        and any(isinstance(t, ast.Name) and t.id == name.id for t in sub.targets)
        and sub.lineno < name.lineno
    ]
    if not starts:
        return []
    return [
        sub.args[0]
        for sub in walk(function)
        if isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "append"
        and isinstance(sub.func.value, ast.Name)
        and sub.func.value.id == name.id
        and len(sub.args) == 1
        and max(starts) < sub.lineno < name.lineno
    ]


def _moves(node: ast.expr) -> bool:
    """The chain of calls that ends at ``node`` copies or moves a tensor (``.cpu()``,
    ``.to(...)``, ``.cuda()``) somewhere: what ``.numpy()`` reads may have been on a device."""
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in {"cpu", "to", "cuda"}:
                return True
            node = func
        else:
            node = node.value
    return False


def _not_a_step(loop: ast.AST, call: ast.Call) -> bool:
    """A loop over a literal list (``for t in [a, b]:``), or one that synchronizes the device
    it iterates (``for d in devices: torch.cuda.synchronize(d)``, also by index: ``for i in
    range(torch.cuda.device_count()): torch.cuda.synchronize(f"cuda:{i}")``): a pass over a
    few fixed things or devices, not a step of work."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    if isinstance(loop.iter, (ast.List, ast.Tuple, ast.Set)) or single_pass(loop.iter):
        return True  # also `for _ in range(1):`, lightllm's warm-up before a graph capture
    device = call.args[0] if call.args else getattr(keyword(call, "device"), "value", None)
    if isinstance(device, ast.Call) and call_name(device) == "device" and device.args:
        device = device.args[0]  # torch.device(f"cuda:{i}")
    targets = names_in(loop.target)
    if isinstance(device, ast.JoinedStr):  # f"cuda:{i}"
        parts = [v.value for v in device.values if isinstance(v, ast.FormattedValue)]
        return bool(parts) and all(isinstance(p, ast.Name) and p.id in targets for p in parts)
    if isinstance(device, ast.Subscript):  # devices[i]
        device = device.slice
    return isinstance(device, ast.Name) and device.id in targets


def _joined(node: ast.JoinedStr, ctx: Context) -> None:
    if id(node) in ctx.claimed or not ctx.loops() or _is_key(node, ctx):
        return
    for parent in reversed(ctx.parents):
        if isinstance(parent, (ast.Raise, ast.Assert)):
            return  # an error message: built once, on the way out
        if isinstance(parent, ast.stmt):
            break
    values = [v.value for v in node.values if isinstance(v, ast.FormattedValue)]
    for value in values:
        if _is_read(value) or isinstance(value, ast.Constant):
            continue
        # reported where the value is: an f-string split over lines (implicitly joined) has
        # its own position at its first piece on some Python versions
        if _check(value, value, "an f-string", ctx, explicit=False, read=node):
            return


def _is_key(node: ast.JoinedStr, ctx: Context) -> bool:
    """The f-string is a key (``{f"loss/{phase}_{k}": v for k, v in losses.items()}``,
    ``logs[f"{name}_acc"] = acc``) or an attribute's name: a name built from names, never the
    text of a tensor's values, whatever the provenance says of the names it joins."""
    parent = ctx.parents[-1] if ctx.parents else None
    if isinstance(parent, ast.DictComp):
        return node is parent.key
    if isinstance(parent, ast.Dict):
        return any(key is node for key in parent.keys)
    if (  # the name of an attribute: `getattr(model, f"guidance_encoder_{g}")`
        isinstance(parent, ast.Call)
        and isinstance(parent.func, ast.Name)
        and parent.func.id in _ATTRIBUTE_LOOKUPS
        and len(parent.args) >= 2
        and node is parent.args[1]
    ):
        return True
    return isinstance(parent, ast.Subscript) and node is parent.slice


_ATTRIBUTE_LOOKUPS = frozenset({"getattr", "hasattr", "setattr", "delattr"})


# Fills whose value is a Python number: a tensor given there is read with `.item()`.
_FILLS = {"torch.full": 1, "torch.full_like": 1}
_FILL_METHODS = {"new_full": 1, "fill_": 0}


# Factories whose positional arguments are sizes, ends or counts: torch turns each into a
# Python number (`torch.arange(lengths.max())`, `torch.linspace(0, h - 1, h)`), a read.
_SIZED = frozenset(
    f"torch.{name}"
    for name in (
        *("arange", "linspace", "logspace", "zeros", "ones", "empty", "rand", "randn"),
        *("randint", "eye", "full", "randperm", "tril_indices", "triu_indices"),
    )
)


def _size_arguments(call: ast.Call, ctx: Context) -> list[ast.expr]:
    """The sizes given to a factory (also in a tuple or list: ``torch.zeros((b, n.max()))``)
    or to a tensor method that shapes (``x.view(valid.sum(), -1)``) that are computed values,
    not literals, lengths or shapes; ``torch.full``'s and ``new_full``'s size only."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in _SHAPING and ctx.qualname(func) is None:
        args = call.args[:1] if func.attr == "new_full" else call.args  # `x.view(m.sum(), -1)`
    elif _index_bounds(call, ctx):
        args = call.args  # `range(num_images + 1)`: `__index__` of each bound
    elif ctx.call_qualname(call) not in _SIZED:
        return []
    else:
        args = call.args[:1] if ctx.call_qualname(call) == "torch.full" else call.args
    scope = ctx.function_scope()
    if scope is None:
        return []
    found: list[ast.expr] = []
    for arg in args:
        parts = arg.elts if isinstance(arg, (ast.Tuple, ast.List)) else [arg]
        found.extend(part for part in parts if _element_valued(part, ctx, scope, 0))
    return found


def _index_bounds(call: ast.Call, ctx: Context) -> bool:
    """Python's ``range(...)`` (not a name the file rebinds) or ``random.randrange``/
    ``random.randint``: each bound is made a Python int with ``__index__``."""
    func = call.func
    if isinstance(func, ast.Name) and func.id == "range":
        return ctx.qualname(func) is None and "range" not in ctx.scope_bindings(ctx.scope)
    return ctx.call_qualname(call) in {"random.randrange", "random.randint"}


# Tensor methods given sizes, which they read as Python ints (`x.view(valid.sum(), -1)`).
_SHAPING = frozenset(
    {"view", "reshape", "expand", "repeat", "new_zeros", "new_ones", "new_empty", "new_full"}
)
# Tensor methods whose result is a 0-dim tensor where the tensor is (not a Python number).
_SIZE_REDUCTIONS = frozenset({"max", "min", "sum", "prod", "mean", "amax", "amin", "long", "int"})
_TORCH_SIZE_REDUCTIONS = frozenset(
    f"torch.{name}" for name in ("max", "min", "sum", "prod", "amax", "amin", "count_nonzero")
)


def _element_valued(node: ast.expr, ctx: Context, scope: Scope, depth: int) -> bool:
    """``node`` is, by its syntax, a tensor element or reduction (``lengths.max()``,
    ``counts[i]``, ``h - 1`` of a row's element ``h``), not a setting (``G.z_dim``), a shape or
    what a function returns (``feat, h, w = extract(frame)``): only those are read."""
    if depth > 3 or _host_syntax(node):
        return False
    if isinstance(node, ast.BinOp):
        return any(_element_valued(side, ctx, scope, depth + 1) for side in (node.left, node.right))
    if isinstance(node, ast.Subscript):
        # of a tensor by its name, not of what a call hands back unpacked (`scores, lengths =
        # decoder(x)` may return lists) nor of a container's attribute (`batch.num_nodes[0]`)
        base = node.value
        named = isinstance(base, ast.Name) or (dotted_name(base) or "").startswith("self.")
        return (
            named
            and not isinstance(node.slice, ast.Slice)
            and not _host_syntax(base)
            and not (isinstance(base, ast.Name) and _unpacked_from_call(base.id, scope))
        )
    if isinstance(node, ast.Call):
        func = node.func
        if ctx.call_qualname(node) in _TORCH_SIZE_REDUCTIONS:
            return len(node.args) == 1  # `torch.sum(keep)`, as `keep.sum()`
        return (
            isinstance(func, ast.Attribute)
            and func.attr in _SIZE_REDUCTIONS
            and (ctx.qualname(func) is None)
        )
    if not isinstance(node, ast.Name):
        return False
    if _comprehension_target(node.id, ctx):
        return True  # `[u[:v] for u, v in zip(context, seq_lens)]`: a row's element by name
    values = ctx.scope_bindings(scope).get(node.id)
    if not values:
        return False
    if None in values:  # a loop's target over a tensor's rows, not a parameter
        params = _parameter_names(scope.node)
        return params is not None and node.id not in params and len(values) == 1
    return all(
        value is not None and _element_valued(value, ctx, scope, depth + 1) for value in values
    )


def _comprehension_target(name: str, ctx: Context) -> bool:
    """``name`` is bound by a generator of a comprehension that encloses the node."""
    return any(
        isinstance(parent, _COMPS) and any(name in names_in(g.target) for g in parent.generators)
        for parent in ctx.parents
    )


def _unpacked_from_call(name: str, scope: Scope) -> bool:
    """``name`` is bound in ``scope`` as one of several names unpacked from a call's result
    (``edge_index, _, size = adj.to(device)``): which element is a tensor is unknown."""
    return any(
        isinstance(sub, ast.Assign)
        and isinstance(sub.value, ast.Call)
        and any(isinstance(t, ast.Tuple) and name in names_in(t) for t in sub.targets)
        for sub in own_nodes(scope.node)
    )


def _fill_value(call: ast.Call, ctx: Context) -> ast.expr | None:
    """``torch.full((b, 1, 1, 1), alphas[index], device=device)``: a tensor as the fill value
    (an element, ``torch.tensor(v, device=d)``, a reduction; also of ``full_like`` and
    ``x.new_full``), which torch turns into a Python number, a read of the device each call.
    ``x.fill_(t)`` copies a tensor of ``x``'s device on the device instead: a read only into
    a tensor built on the host (``torch.zeros(n).fill_(t[i])``)."""
    func = call.func
    name = ctx.call_qualname(call)
    if name in _FILLS:
        at, keyword_name = _FILLS[name], "fill_value"
    elif isinstance(func, ast.Attribute) and func.attr in _FILL_METHODS and name is None:
        at, keyword_name = (
            _FILL_METHODS[func.attr],
            "fill_value" if func.attr == "new_full" else "value",
        )
    else:
        return None
    given = keyword(call, keyword_name)
    value = call.args[at] if len(call.args) > at else given.value if given is not None else None
    if isinstance(func, ast.Attribute) and func.attr == "fill_" and not _host_factory(func.value):
        return None
    if isinstance(value, ast.Subscript):
        return None if isinstance(value.slice, ast.Slice) or _host_syntax(value.value) else value
    return value if isinstance(value, (ast.Name, ast.Call, ast.Attribute)) else None


def _host_factory(node: ast.expr) -> bool:
    """``torch.zeros(n)``, ``torch.Tensor(n)``, ``x.new(n)``: a tensor made in the expression
    without a device, on the host."""
    if not isinstance(node, ast.Call) or keyword(node, "device") is not None:
        return False
    name = call_name(node) or ""
    return name in {"zeros", "ones", "empty", "Tensor", "FloatTensor", "LongTensor"}


def _slice(node: ast.Slice, ctx: Context) -> None:
    """``mask[i, :, lengths[i]:] = 0``: an element of a device tensor as a slice bound is
    turned into a Python index (``__index__``), a read of the device, once per row."""
    scope = ctx.function_scope()
    for bound in (node.lower, node.upper):
        if bound is None:
            continue
        # an element (`lengths[i]`), also a row's element by name (`for row, n in zip(rows,
        # lengths): row[:n]`) and arithmetic of one (`mask[:, cur:cur + h * w]`)
        if scope is None or not _element_valued(bound, ctx, scope, 0):
            continue
        if _check(bound, bound, "a slice bound", ctx, explicit=False):
            return


# Lookup tables of a vocabulary or a label set, by their usual names: Python lists (or
# dicts), which turn a tensor index into a Python int (`vocab.itos[i]`, `idx2word[t]`).
_TABLES = re.compile(
    r"(?:^|_)(?:itos|i2w|i2c|(?:idx|id|index|int|ix)_?(?:2|to)_?[a-z]+|class_?names|classes)$",
    re.IGNORECASE,
)


def _table_lookup(node: ast.Subscript, ctx: Context) -> None:
    """``vocab.itos[i]`` with ``i`` an element of a device tensor (``for i in ids:``): a
    Python list indexed by a 0-dim tensor calls ``__index__``, a read of the device per
    element; a tensor indexed so stays on the device."""
    name = dotted_name(node.value)
    index = node.slice
    if (
        isinstance(node.ctx, ast.Load)
        and name is not None
        and _TABLES.search(name.rsplit(".", 1)[-1]) is not None
        and isinstance(index, (ast.Name, ast.Subscript))
    ):
        _check(index, index, f"an index into the Python table `{name}`", ctx, explicit=False)


def _subscript(node: ast.Subscript, ctx: Context) -> None:
    _old_item(node, ctx)
    _table_lookup(node, ctx)
    _array_index(node, ctx)


_NUMPY_FACTORIES = frozenset(
    f"numpy.{name}" for name in ("zeros", "ones", "empty", "full", "zeros_like", "array")
)


def _array_index(node: ast.Subscript, ctx: Context) -> None:
    """``self.matrix[gc, dc] += 1`` with ``self.matrix = np.zeros((nc, nc))`` and ``gc`` an
    element of a device tensor: NumPy turns each tensor index into a Python int
    (``__index__``), a read of the device per element."""
    parent = ctx.parents[-1] if ctx.parents else None
    if not (isinstance(parent, ast.AugAssign) and parent.target is node):
        return  # a count grown in place, `matrix[dc, gc] += 1`
    name = dotted_name(node.value)
    if name is None or not _numpy_array(name, ctx):
        return
    index = node.slice
    for part in index.elts if isinstance(index, ast.Tuple) else [index]:
        if (
            isinstance(part, (ast.Name, ast.Subscript))
            and not _host_syntax(part)
            and _check(part, part, f"an index into the NumPy array `{name}`", ctx, explicit=False)
        ):
            return


def _numpy_array(name: str, ctx: Context) -> bool:
    """``name`` (a local or ``self.<attr>``) is bound only to NumPy factories' results."""
    scope = ctx.function_scope()
    if scope is None:
        return False
    key = f"numpy-array:{name}"
    cached = scope.cache.get(key)
    if cached is None:
        cached = scope.cache[key] = _bound_to_numpy(name, scope, ctx)
    return bool(cached)


def _bound_to_numpy(name: str, scope: Scope, ctx: Context) -> bool:
    """Every assignment to ``name`` in its function (or to ``self.<attr>`` in its class) is a
    NumPy factory's result; a parameter of the function is not."""
    if name.startswith("self.") and name.count(".") == 1 and scope.cls is not None:
        owner = scope.cls.node
    elif "." not in name:
        owner = scope.node
        if name in (_parameter_names(owner) or set()):
            return False
    else:
        return False
    values = [
        sub.value
        for sub in walk(owner)
        if isinstance(sub, ast.Assign) and any(dotted_name(t) == name for t in sub.targets)
    ]
    return bool(values) and all(
        isinstance(value, ast.Call) and ctx.call_qualname(value) in _NUMPY_FACTORIES
        for value in values
    )


def _old_item(node: ast.Subscript, ctx: Context) -> None:
    """``train_loss += loss.data[0]``: a loss read as it was before PyTorch 0.4
    (:func:`~.facts.old_loss_read`); ``top1.update(prec1.data[0], n)`` of an accuracy unpacked
    from ``prec1, prec5 = accuracy(output.data, target, topk=(1, 5))``, also ``prec1[0]`` in a
    function that reads its loss so."""
    loss = old_loss_read(node, ctx)
    if loss is not None:
        _check(node, loss, "`.data[0]` (`.item()` before PyTorch 0.4)", ctx, explicit=True)
        return
    metric = _old_metric(node, ctx)
    if metric is not None:
        index = "`.data[0]`" if isinstance(node.value, ast.Attribute) else "`[0]`"
        what = f"{index} of a one-element accuracy (`.item()` before PyTorch 0.4)"
        _check(node, metric, what, ctx, explicit=True)


def _old_metric(node: ast.Subscript, ctx: Context) -> ast.expr | None:
    """``prec1`` of ``prec1.data[0]``, a name the function unpacks from a call named for
    accuracy (``prec1, prec5 = accuracy(output.data, target, topk=(1, 5))``): indexing the
    one-element result's ``.data`` read its value before PyTorch 0.4. So did ``prec1[0]`` in a
    function written for that PyTorch (it reads a loss's ``.data[0]``); in later code ``acc1[0]``
    is a 0-dim tensor, no read."""
    value = node.value
    data = isinstance(value, ast.Attribute) and value.attr == "data"
    if data:
        value = value.value  # type: ignore[attr-defined]
    if not (
        isinstance(node.ctx, ast.Load)
        and isinstance(value, ast.Name)
        and isinstance(node.slice, ast.Constant)
        and type(node.slice.value) is int
    ):
        return None
    scope = ctx.function_scope()
    if scope is None:
        return None
    names: frozenset[str] | None = scope.cache.get("accuracies")
    if names is None:
        names = scope.cache["accuracies"] = _unpacked_accuracies(scope.node)
    if value.id not in names:
        return None
    if data:
        return value
    old: bool | None = scope.cache.get("old-loss-reads")
    if old is None:
        old = scope.cache["old-loss-reads"] = any(
            isinstance(sub, ast.Subscript) and old_loss_read(sub, ctx) is not None
            for sub in own_nodes(scope.node)
        )
    return value if old else None


def _unpacked_accuracies(function: ast.AST) -> frozenset[str]:
    """The names bound by unpacking a call named for accuracy (``accuracy(...)``,
    ``utils.accuracy(...)``, ``compute_acc(...)``)."""
    found: set[str] = set()
    for sub in own_nodes(function):
        if not (isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call)):
            continue
        called = (call_name(sub.value) or "").lower()
        if "acc" not in called and "prec" not in called:
            continue
        for target in sub.targets:
            if isinstance(target, (ast.Tuple, ast.List)):
                found |= {e.id for e in target.elts if isinstance(e, ast.Name)}
    return frozenset(found)


def _percent(node: ast.BinOp, ctx: Context) -> None:
    """``"loss %g" % loss``, ``("%11.4g" * 3) % (*mloss,)``: ``%`` formatting of a tensor
    reads it, as an f-string does. Reported at the formatted values."""
    if not isinstance(node.op, ast.Mod) or not ctx.loops() or not is_text(node.left):
        return
    right = node.right
    values = right.elts if isinstance(right, ast.Tuple) else [right]
    operands = [v.value if isinstance(v, ast.Starred) else v for v in values]
    _check_many(right, operands, "`%` formatting", ctx)


_TRUTH_OPS = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _compare(node: ast.Compare, ctx: Context) -> None:
    """``if x[i] == 1:``, ``while loss > tol:``, ``[i for i, t in enumerate(ts) if t != end]``,
    ``assert mask.max() <= 1``, ``if eos in tokens:``: a comparison used as a condition is
    ``bool()`` of its result, a read of the device."""
    if all(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
        if _names_key(node.left):
            return  # `if rgb_output_name not in outputs:`: a key of a mapping, not a value
        sides = list(node.comparators)  # `eos in samples[:, 0]`: `Tensor.__contains__` reads
    elif all(isinstance(op, _TRUTH_OPS) for op in node.ops):
        sides = [node.left, *node.comparators]
    else:
        return
    if not ctx.loops() and not any(_torch_operand(s, ctx) for s in sides):
        return  # outside a loop, only a torch call of what a function's callers hand it
    child: ast.AST = node
    for parent in reversed(ctx.parents):
        if isinstance(parent, ast.BoolOp) or (
            isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not)
        ):
            child = parent
            continue
        if isinstance(parent, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            tested = parent.test is child
        elif isinstance(parent, _COMPS):
            tested = any(child is cond for gen in parent.generators for cond in gen.ifs)
        else:
            tested = False
        if any(isinstance(side, ast.Constant) and isinstance(side.value, str) for side in sides):
            return  # `r["label"] == "nsfw"`: a tensor never equals a string, nothing is read
        if tested and any(_repeated_operand(side, ctx) for side in sides):
            _check(node, node, "a condition", ctx, explicit=False)
        return


def _tests_each_parameter(comp: ast.expr, ctx: Context) -> bool:
    """A one-loop comprehension over a model's parameters (``model.parameters()``, or a name
    for them, ``self.model_params``) that tests each with a torch predicate or reduction of it
    or its gradient (``not p.grad.isfinite().all()``, ``torch.isnan(p.grad).any()``)."""
    if not isinstance(comp, (ast.GeneratorExp, ast.ListComp)) or len(comp.generators) != 1:
        return False
    loop = comp.generators[0]
    source = loop.iter.func if isinstance(loop.iter, ast.Call) else loop.iter
    named = (dotted_name(source) or "").rsplit(".", 1)[-1]
    if not isinstance(loop.target, ast.Name) or "param" not in named.lower():
        return False
    elt = comp.elt
    while isinstance(elt, ast.UnaryOp) and isinstance(elt.op, ast.Not):
        elt = elt.operand
    if not (isinstance(elt, ast.Call) and _truth_operand(elt, ctx)):
        return False
    return any(isinstance(sub, ast.Name) and sub.id == loop.target.id for sub in ast.walk(elt))


def _tested_elements(comp: ast.expr, ctx: Context) -> list[ast.expr]:
    """The values a one-loop comprehension over a literal tuple or list tests with a torch
    function of its target (``torch.isnan(l) for l in (g_loss, d_loss)``): each of them."""
    if not isinstance(comp, (ast.GeneratorExp, ast.ListComp)) or len(comp.generators) != 1:
        return []
    loop = comp.generators[0]
    if (
        loop.ifs
        or not isinstance(loop.target, ast.Name)
        or not isinstance(loop.iter, (ast.Tuple, ast.List))
    ):
        return []
    elt = comp.elt
    if not (
        isinstance(elt, ast.Call)
        and (ctx.call_qualname(elt) or "").startswith("torch.")
        and any(isinstance(a, ast.Name) and a.id == loop.target.id for a in elt.args)
    ):
        return []
    return [value for value in loop.iter.elts if isinstance(value, ast.Name)]


def _compared_rows(comp: ast.expr) -> list[ast.expr]:
    """What a one-loop comprehension walks (``preds`` of ``zip(preds, answers)``) when each of
    its elements is a comparison of a row it yields (``pred == answer``): each a ``bool()``."""
    if not isinstance(comp, (ast.GeneratorExp, ast.ListComp)) or len(comp.generators) != 1:
        return []
    loop = comp.generators[0]
    if loop.ifs or not isinstance(comp.elt, ast.Compare):
        return []
    compared = {
        side.id for side in (comp.elt.left, *comp.elt.comparators) if isinstance(side, ast.Name)
    }
    if isinstance(loop.target, ast.Name):
        return [loop.iter] if loop.target.id in compared else []
    pairs = zip_pairs(loop.iter, loop.target) or []
    return [row for name, row in pairs if isinstance(name, ast.Name) and name.id in compared]


def _names_key(node: ast.expr) -> bool:
    """``"rgb"``, ``f"{k}_loss"``, ``output_name``, ``key``: a string or a name for a key, which
    a mapping holds and a tensor never does."""
    if isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str)
    ):
        return True
    name = (dotted_name(node) or "").rsplit(".", 1)[-1].lower()
    return name in {"k", "key", "name"} or name.endswith(("_key", "_name", "_keys", "_names"))


# Tensor methods whose result a condition would read: reductions and elementwise tests.
_TRUTH_METHODS = frozenset(
    {"any", "all", "isnan", "isinf", "isfinite", "eq", "ne", "gt", "lt", "ge", "le", "equal"}
)


def _truth(node: ast.If | ast.IfExp | ast.Assert, ctx: Context) -> None:
    """``if class_acc:``, ``if torch.isnan(loss) or torch.isinf(loss):``, ``x if
    mask.any() else y``, ``assert not x.isnan().any()``: a tensor tested for truth is
    ``bool()`` of it, a read of the device."""
    looping = bool(ctx.loops())
    if not looping and not (_torch_test(node.test, ctx) and _repeated_scope(ctx)):
        return  # outside a loop, only a torch test of what a function's callers hand it
    if looping and _latched(node, ctx):
        return
    for leaf in _tested(node.test):
        if not looping and not (isinstance(leaf, ast.Call) or _torch_operand(leaf, ctx)):
            continue
        # a torch test outside a loop (`if torch.isfinite(grad_norm):` in a training step
        # function) is a tensor's read as plainly as `.item()` is
        explicit = isinstance(leaf, ast.Call)
        if _truth_operand(leaf, ctx) and _check(leaf, leaf, "a truth test", ctx, explicit=explicit):
            return


def _repeated_scope(ctx: Context) -> bool:
    """The function of a torch test outside any loop is called again and again: by name in
    its file (:func:`_called_here`), or once per step of a training loop (``run_step``, which
    a base trainer's loop in another file calls between its `.backward()` and optimizer step)."""
    scope = scope_node(ctx)
    if _called_here(scope, ctx):
        return True
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    found = file_facts(ctx).per_batch(scope)
    return found is not None and found.trains


def _latched(branch: ast.AST, ctx: Context) -> bool:
    """``if use_the_queue or not torch.all(queue[i, -1] == 0): use_the_queue = True``: the
    branch latches the flag its test starts with, and the ``or`` reads no more after it is
    set: the test reads the device on the steps before the first that takes the branch, unless
    the loop sets the flag elsewhere (back to False)."""
    if not (
        isinstance(branch, ast.If)
        and isinstance(branch.test, ast.BoolOp)
        and isinstance(branch.test.op, ast.Or)
        and isinstance(branch.test.values[0], (ast.Name, ast.Attribute))
    ):
        return False
    name = dotted_name(branch.test.values[0])
    sets = [
        stmt
        for stmt in branch.body
        if isinstance(stmt, ast.Assign) and any(dotted_name(t) == name for t in stmt.targets)
    ]
    if name is None or not sets:
        return False
    if not all(isinstance(s.value, ast.Constant) and s.value.value is True for s in sets):
        return False
    return not any(
        sub not in sets and any(dotted_name(t) == name for t in store_targets(sub))
        for sub in walk(ctx.loops()[-1])
    )


def _torch_test(test: ast.expr, ctx: Context) -> bool:
    """A torch predicate or reduction among the operands ``test`` tests for truth (through
    ``and``/``or``/``not``)."""
    if isinstance(test, ast.BoolOp):
        return any(_torch_test(value, ctx) for value in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _torch_test(test.operand, ctx)
    if isinstance(test, ast.Call):
        return _truth_operand(test, ctx)
    return _torch_operand(test, ctx)  # `if self.inited:`, `if n:` with `n = mask.sum()`


def _repeated_operand(side: ast.expr, ctx: Context) -> bool:
    """A tensor operand of a condition that may run once per batch: in a loop, or, in a
    function something calls (a per-batch helper tests what its caller hands it on every call,
    ``if torch.min(y) < -1.0:``), a torch call, a tensor reduction or a buffer of the module."""
    if ctx.loops():
        return _tensor_operand(side, ctx)
    return _torch_operand(side, ctx) and _called_here(scope_node(ctx), ctx)


def _torch_operand(side: ast.expr, ctx: Context) -> bool:
    """A torch call or tensor reduction (:func:`_torch_value`), a name the function binds only
    to such calls (``n = torch.sum(obj_mask)``, then ``if n != 0:``), or a buffer of the
    module (``if self.inited:``): a tensor whatever the callers pass."""
    return (
        _torch_value(side, ctx)
        or _reads_buffer(side, scope_node(ctx), ctx)
        or _bound_to_torch_values(side, ctx)
    )


# Tensor methods that compute a value from the elements (what a condition would then read).
_REDUCTIONS = _TRUTH_METHODS | {"min", "max", "sum", "mean", "norm", "abs", "amax", "amin", "std"}


def _torch_value(node: ast.expr, ctx: Context) -> bool:
    """``torch.min(y)``, ``y.max()``, ``(a == b).all()``: a torch function or a tensor
    reduction, a tensor by its form whatever the callers pass."""
    if not isinstance(node, ast.Call):
        return False
    qualname = ctx.qualname(node.func)
    if qualname is not None:
        return qualname.startswith("torch.") and qualname.rpartition(".")[2] not in TORCH_QUERIES
    if _runs_own_module(node.func, ctx):
        return True
    return isinstance(node.func, ast.Attribute) and node.func.attr in _REDUCTIONS


def _runs_own_module(func: ast.expr, ctx: Context) -> bool:
    """``self.lpips_loss(y_hat, y)`` where the class binds ``self.lpips_loss`` only to modules
    it builds (``LPIPS(net_type="alex").to(self.device).eval()``): a module's output, a tensor."""
    if not (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
    ):
        return False
    scope = ctx.function_scope()
    cls = scope.cls if scope is not None else None
    if cls is None:
        return False
    facts = file_facts(ctx)
    values = [
        node.value
        for node in walk(cls.node)
        if isinstance(node, ast.Assign)
        and any(dotted_name(t) == f"self.{func.attr}" for t in node.targets)
    ]
    return bool(values) and all(_model_root(facts, v) for v in values)


def _tested(test: ast.expr) -> list[ast.expr]:
    """The operands a condition tests for truth on every pass, through ``and``/``or``/``not``;
    those after a rare test joined by ``and`` (``step % 100 == 0 and torch.isnan(loss)``) run
    only when it holds."""
    if isinstance(test, ast.BoolOp):
        leaves: list[ast.expr] = []
        for value in test.values:
            if isinstance(test.op, ast.And) and rare_test(value):
                break
            leaves += _tested(value)
        return leaves
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _tested(test.operand)
    if isinstance(test, ast.BinOp) and isinstance(test.op, (ast.BitOr, ast.BitAnd)):
        # `x.isnan().any() | x.isinf().any()`: the tensor the operands make is tested
        return _tested(test.left) + _tested(test.right)
    return [test]


def _truth_operand(node: ast.expr, ctx: Context) -> bool:
    """A torch predicate or reduction (``torch.isnan(x)``, ``x.isnan().any()``), or a name
    bound only to tensors by their form (``None`` aside: ``acc = ... if labels else None``)."""
    if isinstance(node, ast.Call):
        if _is_read(node):
            return False  # `.item()` and friends: reported as reads themselves
        qualname = ctx.qualname(node.func)
        if qualname is not None:
            head, _, last = qualname.partition(".")
            return head == "torch" and "." not in last and _truth_function(last)
        return isinstance(node.func, ast.Attribute) and node.func.attr in _TRUTH_METHODS | (
            _TESTED_REDUCTIONS
        )
    if isinstance(node, ast.Attribute):
        return _reads_buffer(node, scope_node(ctx), ctx)  # `if self.inited:`
    return isinstance(node, ast.Name) and _bound_to_tensors(node, ctx, arms=True)


# Reductions tested for truth as counts (`if fg_mask.sum():`): `bool()` of the result.
_TESTED_REDUCTIONS = frozenset({"sum", "max", "min", "count_nonzero", "amax", "prod"})


def _alternatives(value: ast.expr | None) -> list[ast.expr | None]:
    """The values a binding may take: both arms of ``a if test else b``."""
    if isinstance(value, ast.IfExp):
        return [*_alternatives(value.body), *_alternatives(value.orelse)]
    return [value]


def _truth_function(name: str) -> bool:
    """``torch.isnan``, ``torch.any``, ``torch.equal``: answers from the values; not
    ``torch.is_grad_enabled`` or ``torch.numel``, which answer on the host."""
    return not name.startswith(("is_", "_")) and name not in TORCH_QUERIES


def _tensor_operand(node: ast.expr, ctx: Context) -> bool:
    """An operand that is a tensor by its form: an element or slice (``x[i]``), a tensor
    method or torch call (``x.mean()``, ``torch.abs(d)``), a name bound only to such values,
    a comprehension target (the comprehension's loop decides whether it walks a device tensor),
    or the target of a ``for`` loop over such an operand's rows. Arithmetic of names and builtins (``i + n * epoch``, ``max(a, b)``) are left
    out: their device facts are guesses, and counters and scores are host numbers."""
    if isinstance(node, ast.Subscript):
        return not _shape_of(node.value)
    if isinstance(node, ast.Call):
        qualname = ctx.qualname(node.func)
        if qualname is not None:
            return qualname.startswith("torch.") and qualname.rpartition(".")[2] not in (
                TORCH_QUERIES
            )
        return (
            isinstance(node.func, ast.Attribute)
            and node.func.attr not in HOST_METHODS
            and not _returns_container(node.func, ctx)
        )
    if not isinstance(node, ast.Name):
        return False
    for parent in ctx.parents:
        if isinstance(parent, _COMPS) and any(
            node.id in names_in(gen.target) for gen in parent.generators
        ):
            return True
        if isinstance(parent, (ast.For, ast.AsyncFor)):
            rows = _rows_walked(parent, node.id)
            if rows is not None:
                # `for mask in ids[0]: if mask == 1:`: a row of a tensor by its form
                return _tensor_operand(rows, ctx)
    return _bound_to_tensors(node, ctx) or _accumulates_tensors(node, ctx)


def _accumulates_tensors(name: ast.Name, ctx: Context) -> bool:
    """``n = 0``, then ``n += done.any().int()``: a number that grows by tensors (the first
    such step makes it one), bound otherwise only to numbers."""
    scope = ctx.function_scope()
    if scope is None:
        return False
    values = ctx.scope_bindings(scope).get(name.id) or []
    if not (
        None in values  # its `+=` steps (or a loop target: those make no step below)
        and all(
            v is None or (isinstance(v, ast.Constant) and isinstance(v.value, (int, float)))
            for v in values
        )
    ):
        return False  # most names: no walk of the function
    steps = [
        sub.value
        for sub in walk(scope.node)
        if isinstance(sub, ast.AugAssign)
        and isinstance(sub.target, ast.Name)
        and sub.target.id == name.id
    ]
    return (
        bool(steps)
        and len(steps) < len(values)  # bound once plainly, else grown in steps
        and all(isinstance(v, (ast.Call, ast.Subscript)) and _tensor_operand(v, ctx) for v in steps)
    )


# Return annotations of a container or a Python value (`-> dict[str, Tensor] | None`).
_CONTAINERS = frozenset(
    {"dict", "list", "tuple", "set", "Dict", "List", "Tuple", "Set", "Mapping", "Sequence"}
    | {"int", "float", "bool", "str", "None"}
)


def _returns_container(func: ast.Attribute, ctx: Context) -> bool:
    """``self._get_output_dict(out)`` with the class's method annotated ``-> dict[str, Tensor]
    | None`` (or ``Optional[list[...]]``): a container, whose truth is its length, or a
    Python value; never a tensor to read."""
    scope = ctx.function_scope()
    if not (isinstance(func.value, ast.Name) and func.value.id == "self"):
        return False
    if scope is None or scope.cls is None or not isinstance(scope.cls.node, ast.ClassDef):
        return False
    for item in scope.cls.node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == func.attr:
            return item.returns is not None and _container_annotation(item.returns)
    return False


def _container_annotation(annotation: ast.expr) -> bool:
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _container_annotation(annotation.left) and _container_annotation(annotation.right)
    if isinstance(annotation, ast.Constant):
        return annotation.value is None
    if isinstance(annotation, ast.Subscript):
        head = dotted_name(annotation.value) or ""
        if head.rpartition(".")[2] == "Optional":
            return _container_annotation(annotation.slice)
        annotation = annotation.value
    name = dotted_name(annotation) or ""
    return name.rpartition(".")[2] in _CONTAINERS


def _rows_walked(loop: ast.For | ast.AsyncFor, name: str) -> ast.expr | None:
    """The sequence whose items ``name`` takes in ``loop``: ``ids[0]`` in ``for m in ids[0]``
    or ``for i, m in enumerate(ids[0])``, and the slice a ``zip`` walks for it (``t_steps[:-1]``
    for ``t_cur`` in ``for t_cur, t_next in zip(t_steps[:-1], t_steps[1:])``: the caller asks
    whether it is a tensor); None for other targets (a zipped name may hold any sequence)."""
    target, seq = loop.target, loop.iter
    if (
        isinstance(seq, ast.Call)
        and isinstance(seq.func, ast.Name)
        and seq.func.id == "enumerate"
        and len(seq.args) == 1
        and isinstance(target, ast.Tuple)
        and len(target.elts) == 2
    ):
        target, seq = target.elts[1], seq.args[0]
    pairs = zip_pairs(seq, target)
    if pairs is not None:
        for elt, arg in pairs:
            if isinstance(elt, ast.Name) and elt.id == name and isinstance(arg, ast.Subscript):
                return arg  # a slice or row of a tensor; a name may hold strings, ids, ...
        return None
    return seq if isinstance(target, ast.Name) and target.id == name else None


def _bound_to_tensors(name: ast.Name, ctx: Context, *, arms: bool = False) -> bool:
    """``name`` is bound in its function only to tensors by their form (elements, tensor
    methods, torch calls); with ``arms``, through both arms of ``a if test else b``, ``None``
    aside."""
    scope = ctx.function_scope()
    if scope is None:
        return False
    values = ctx.scope_bindings(scope).get(name.id) or []
    if arms:
        values = [
            value
            for bound in values
            for value in _alternatives(bound)
            if not (isinstance(value, ast.Constant) and value.value is None)
        ]
    return bool(values) and all(
        isinstance(value, (ast.Subscript, ast.Call)) and _tensor_operand(value, ctx)
        for value in values
    )


def _shape_of(node: ast.expr) -> bool:
    """``x.shape`` or ``x.size()``: metadata the host holds, so ``x.shape[1]`` is an int."""
    if isinstance(node, ast.Call):
        node = node.func
        return isinstance(node, ast.Attribute) and node.attr == "size"
    return isinstance(node, ast.Attribute) and node.attr == "shape"


def _is_read(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _READS
    )


def _foreign_field(node: ast.expr) -> bool:
    """``params.max_seqlen``: an attribute of an object other than ``self``."""
    return isinstance(node, ast.Attribute) and not (
        isinstance(node.value, ast.Name) and node.value.id == "self"
    )


def _check_many(node: ast.AST, values: list[ast.expr], what: str, ctx: Context) -> bool:
    for value in values:
        if _is_read(value) or isinstance(value, ast.Constant):
            continue
        if _check(node, value, what, ctx, explicit=False):
            return True
    return False


def _per_step(ctx: Context, facts: FileFacts, scope: ast.AST) -> tuple[str, int, str] | None:
    """``(kind, line, evidence)`` of the innermost enclosing loop that runs per batch or row."""
    for loop in reversed(ctx.loops()):
        kind = facts.loop_kind(loop, scope)
        if kind is not None:
            return kind[0], getattr(loop, "lineno", 0), kind[1]
    return None


def _row_by_counter(
    receiver: ast.expr,
    comps: tuple[ast.expr, ...],
    ctx: Context,
    facts: FileFacts,
    scope: ast.AST,
    step: tuple[str, int, str] | None,
) -> tuple[str, int, str] | None:
    """``("rows", line, evidence)`` when ``receiver`` is the row of a device tensor that an
    enclosing loop indexes by its counter (``for k in range(n): img = imgs[k].cpu()``), that
    loop inside the step's loop (``step``) or the step's loop itself: a read per row."""
    for loop in reversed(ctx.loops()):
        line = getattr(loop, "lineno", 0)
        evidence = indexed_row(facts, loop, receiver, scope, comps)
        if evidence is not None:
            return "rows", line, evidence
        if step is not None and line == step[1]:
            break
    return None


_ADVICE = "keep it on the device and read it once after the loop (or every N steps)"


_STEP_LOOPS = (
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)


def _exits(ctx: Context, node: ast.AST) -> bool:
    """Inside a branch that leaves the loop (``raise``, ``sys.exit()``, ``break``), or an
    ``except`` handler of the loop's body (a step that failed): runs once, not every step.
    In a function its callers run per batch, outside a loop of its own, a branch that raises
    or exits (``if t[0].item() > n: raise RuntimeError(..., t[0].item())`` in a ``forward``):
    a failed call, not every call (a ``return`` there ends each call)."""
    looping = bool(ctx.loops())
    child = node
    for parent in reversed(ctx.parents):
        if isinstance(parent, _STEP_LOOPS) and not _in_iterable(node, parent):
            return False  # the loop is inside the branch: it runs every row, then leaves
        if isinstance(parent, ast.ExceptHandler) and looping:
            return True
        if isinstance(parent, ast.If) and child is not parent.test:
            # the branch that holds the read, not its sibling (`if done: return` / `else:`)
            in_else = any(child is stmt for stmt in parent.orelse)
            last = (parent.orelse if in_else else parent.body)[-1]
            if isinstance(last, ast.Raise if not looping else (ast.Raise, ast.Break, ast.Return)):
                return True
            if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
                name = getattr(last.value.func, "attr", getattr(last.value.func, "id", ""))
                if name in {"exit", "quit", "_exit", "abort"}:
                    return True
        child = parent
    return False


def _in_iterable(node: ast.AST, loop: ast.AST) -> bool:
    """``node`` is part of what the loop walks, evaluated once before its first turn (``for
    r, n in enumerate(norms.tolist())``), not of its body."""
    if isinstance(loop, (ast.For, ast.AsyncFor)):
        walked: ast.AST = loop.iter
    elif isinstance(loop, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        walked = loop.generators[0].iter
    else:
        return False
    return any(sub is node for sub in walk(walked))


# Predicates true for a value that is not finite; `isfinite` is true for one that is.
_NONFINITE = frozenset({"isnan", "isinf", "isneginf", "isposinf"})
# Where the search for an enclosing failure branch stops: the function (a loop inside the
# branch, `for i in range(n):` over the rows, runs with the failed step, as the branch does).
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _on_failure(ctx: Context, node: ast.AST) -> bool:
    """Inside the branch an ``if`` takes only for a value that is not finite (``if not
    math.isfinite(loss.item()): msg = f"Loss is {loss.item()}"``, ``if torch.isnan(x).any():``,
    the ``else`` of ``if torch.isfinite(x).all():``): a failed step, taken once on the way to
    an abort or a skip, not every step. The test itself still runs every step."""
    child = node
    for parent in reversed(ctx.parents):
        if _after_finite_guard(parent, child):
            return True
        if isinstance(parent, _SCOPES):
            return False
        if isinstance(parent, ast.If) and child is not parent.test:
            holds = _nonfinite_test(parent.test)
            if holds is not None and (child in parent.body) == holds:
                return True
            if child in parent.body and (_warns_out_of_range(parent) or _clamps_and_warns(parent)):
                return True
        child = parent
    return False


_WARNINGS = frozenset({"print", "warn", "warning", "error", "info", "debug", "log"})
_EXTREMES = frozenset({"min", "max", "amin", "amax"})


def _warns_out_of_range(branch: ast.If) -> bool:
    """``if torch.min(y) < -1.1: print("min value is ", torch.min(y))``: a branch taken for a
    value out of its range (an extreme compared with a nonzero bound) that only says so or
    raises; rare, as a failure is."""
    test = branch.test
    tests = test.values if isinstance(test, ast.BoolOp) else [test]
    if not all(
        isinstance(t, ast.Compare)
        and len(t.ops) == 1
        and {_bound_kind(t.left), _bound_kind(t.comparators[0])} == {"extreme", "bound"}
        for t in tests
    ):
        return False
    return all(
        isinstance(stmt, ast.Raise)
        or (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and call_name(stmt.value) in _WARNINGS
        )
        for stmt in branch.body
    )


def _clamps_and_warns(branch: ast.If) -> bool:
    """``if ssim_loss.item() > 1.0: print(f"out-of-range {ssim_loss.item()}")`` then
    ``ssim_loss = torch.tensor(1.0, device=...)``: a value compared with a number, the branch
    saying so and setting it back in range; taken for a broken value, as a failure is."""
    test = branch.test
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Gt, ast.GtE, ast.Lt, ast.LtE))
        and _number(test.comparators[0])
    ):
        return False
    value = test.left
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and not value.args:
        value = value.func.value  # `loss.item() > 1.0`
    compared = dotted_name(value)
    if compared is None:
        return False
    warns = resets = False
    for stmt in branch.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            if call_name(stmt.value) not in _WARNINGS:
                return False
            warns = True
        elif isinstance(stmt, ast.Assign) and [dotted_name(t) for t in stmt.targets] == [compared]:
            resets = True
        else:
            return False
    return warns and resets


def _bound_kind(side: ast.expr) -> str | None:
    """``"extreme"`` for ``torch.min(y)`` or ``y.abs().max()``, ``"bound"`` for a nonzero
    number (``1.1``, ``-1.1``)."""
    if isinstance(side, ast.Call):
        return "extreme" if call_name(side) in _EXTREMES else None
    if isinstance(side, ast.UnaryOp) and isinstance(side.op, ast.USub):
        side = side.operand
    if (
        isinstance(side, ast.Constant)
        and isinstance(side.value, (int, float))
        and not isinstance(side.value, bool)
        and side.value != 0
    ):
        return "bound"
    return None


def _after_finite_guard(parent: ast.AST, child: ast.AST) -> bool:
    """``child`` follows, in a block of ``parent``, a guard that leaves when the value is
    finite (``if torch.isfinite(x).all(): return``, ``if not torch.isnan(x).any():
    continue``): the statements after it run only for a value that is not finite."""
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if not isinstance(block, list) or child not in block:
            continue
        return any(
            isinstance(stmt, ast.If)
            and not stmt.orelse
            and _nonfinite_test(stmt.test) is False
            and isinstance(stmt.body[-1], (ast.Return, ast.Continue))
            for stmt in block[: block.index(child)]
        )
    return False


def _nonfinite_test(test: ast.expr) -> bool | None:
    """True when ``test`` holds only for a value that is not finite (``torch.isnan(x)``, ``not
    math.isfinite(v)``, ``x.isinf().any()``, ``or``/``|`` of such tests, ``and`` with one), False when it holds
    only for a finite one (``torch.isfinite(x).all()``), None when it asks something else."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _nonfinite_test(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp) or (
        isinstance(test, ast.BinOp) and isinstance(test.op, ast.BitOr)
    ):
        values = test.values if isinstance(test, ast.BoolOp) else [test.left, test.right]
        answers = [_nonfinite_test(value) for value in values]
        either = isinstance(test, ast.BinOp) or isinstance(test.op, ast.Or)
        if not either and True in answers:
            # `main and wandb_project is not None and np.isnan(loss)`: holds only with it
            return True
        # also with an outlier bound among them: `torch.isnan(q).any() or q.abs().max() > 1500`
        return (
            True
            if either
            and True in answers
            and all(a is True or _outlier_bound(v) for a, v in zip(answers, values, strict=True))
            else None
        )
    if not isinstance(test, ast.Call):
        return None
    name = call_name(test)
    if name in {"any", "all"} and isinstance(test.func, ast.Attribute) and not test.args:
        return _nonfinite_test(test.func.value)  # `torch.isnan(x).any()`
    if name in _NONFINITE:
        return True
    if name == "isfinite":
        return False
    # a helper named for the test, `if not _tensor_is_finite(loss):`, `if has_nan(x):`
    word = (name or "").replace("_", "").lower()
    if word.endswith(("isfinite", "allfinite")):
        return False
    return True if word.endswith(("hasnan", "hasinf", "anynan", "anyinf")) else None


def _outlier_bound(test: ast.expr) -> bool:
    """A comparison with a nonzero numeric literal that a failed value crosses
    (``x.abs().max() > 1500``): beside a non-finite test, it asks for a broken value too (not
    a sign test, ``x > 0``)."""
    return isinstance(test, ast.Compare) and any(
        isinstance(side, ast.Constant)
        and isinstance(side.value, (int, float))
        and not isinstance(side.value, bool)
        and side.value != 0
        for side in (test.left, *test.comparators)
    )


def _in_assert_message(ctx: Context, node: ast.AST) -> bool:
    """The message of an ``assert`` (``assert x.max() < n, x.max().item()``) is evaluated only
    when the assertion fails: once, on the way out."""
    child = node
    for parent in reversed(ctx.parents):
        if isinstance(parent, ast.Assert):
            return child is parent.msg
        if isinstance(parent, ast.stmt):
            return False
        child = parent
    return False


def _runs_as_module(node: ast.expr, ctx: Context) -> bool:
    """``node`` (a name or ``self.`` attribute) is called in the enclosing function, or in a
    script's own module-level statements (``model = model.cpu()``, then ``HR = model(x)``): a
    module or another callable, whose ``.cpu()`` moves it rather than reading a tensor back.
    Also one the function uses as a module (:func:`_module_holders`), or hands to a parameter
    annotated as one."""
    text = dotted_name(node)
    owner = _owner(ctx)
    if text is None or owner is None:
        return False
    nodes = _owned_nodes(owner)
    if any(isinstance(sub, ast.Call) and dotted_name(sub.func) == text for sub in nodes):
        return True
    return text in _module_holders(owner) or _handed_as_module(text, nodes, ctx)


def _owner(ctx: Context) -> ast.AST | None:
    """The enclosing function, or a script's module (its own statements); None elsewhere."""
    scope = ctx.function_scope()
    if scope is not None:
        return scope.node
    module = ctx.scope.root().node
    return module if isinstance(module, ast.Module) else None


def _owned_nodes(owner: ast.AST) -> list[ast.AST]:
    """Every node of a function, or of a module's own statements (not the file's functions:
    their names are their own); found once per owner."""
    if isinstance(owner, ast.Module):
        return kept("module-statements", owner, _module_statements)
    return kept("function-nodes", owner, lambda f: list(walk(f)))


def _module_statements(module: ast.AST) -> list[ast.AST]:
    return list(walk_body(getattr(module, "body", [])))


def _handed_as_module(text: str, nodes: list[ast.AST], ctx: Context) -> bool:
    """``update_outs(layer, ...)`` where that function of the file annotates the parameter
    it binds ``layer`` to as a module (``layer: nn.Module``)."""
    facts, scope = file_facts(ctx), scope_node(ctx)
    for sub in nodes:
        if not isinstance(sub, ast.Call):
            continue
        at = [i for i, arg in enumerate(sub.args) if dotted_name(arg) == text]
        if not at:
            continue
        called = facts.local_def(sub.func, scope)
        if called is None:
            continue
        params = [*called.args.posonlyargs, *called.args.args]
        if params and params[0].arg in {"self", "cls"} and isinstance(sub.func, ast.Attribute):
            params = params[1:]
        for i in at:
            annotation = params[i].annotation if i < len(params) else None
            if annotation is not None and is_module_base(ctx.qualname(annotation) or ""):
                return True
    return False


#: methods only a module has: a name they are called on holds a module, never a tensor
_MODULE_METHODS = frozenset(
    {"parameters", "named_parameters", "modules", "named_modules", "children"}
    | {"named_children", "buffers", "named_buffers", "load_state_dict", "eval", "train"}
    | {"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook"}
)


def _module_holders(owner: ast.AST) -> frozenset[str]:
    """The names ``owner`` uses as modules: it calls a module's own method on them
    (``for sub in layer.modules():``), or binds them from an item of a container whose items
    it does (``layer = layers[i].to(dev)`` beside ``next(layers[i].parameters())``, the
    container's items named ``layers[]``); found once per owner."""

    def find(node: ast.AST) -> frozenset[str]:
        nodes = _owned_nodes(node)
        found = {
            key
            for sub in nodes
            if isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr in _MODULE_METHODS
            and (key := _item_key(sub.func.value)) is not None
        }
        for sub in nodes:
            if not isinstance(sub, ast.Assign):
                continue
            value = sub.value
            while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
                value = value.func.value  # `layers[i].to(dev)`, `.cuda().half()`
            if isinstance(value, ast.Subscript) and _item_key(value) in found:
                found |= {t for t in map(dotted_name, sub.targets) if t is not None}
        return frozenset(found)

    return kept("module-holders", owner, find)


def _item_key(node: ast.expr) -> str | None:
    """``layers[i]`` as ``layers[]`` (an item of ``layers``), other nodes by their dotted name."""
    if isinstance(node, ast.Subscript):
        root = dotted_name(node.value)
        return None if root is None else f"{root}[]"
    return dotted_name(node)


def _parked_back(call: ast.Call, ctx: Context) -> bool:
    """``acts[i] = tuple([a.cpu() for a in list(acts[i])])`` where the same function also
    brings that slot's tensors to the device, ``acts[i] = tuple([a.cuda() for a in
    list(acts[i])])``: activations offloaded between stages go back to the host slot they
    were fetched from; nothing reads them there (a host copy kept elsewhere is read)."""
    comp = next((p for p in reversed(ctx.parents) if isinstance(p, _ELEMENT_COMPS)), None)
    stmt = next((p for p in reversed(ctx.parents) if isinstance(p, ast.stmt)), None)
    scope = ctx.function_scope()
    if comp is None or comp.elt is not call or scope is None:
        return False
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
        return False
    slot = stmt.targets[0]
    text = ctx.segment(slot) if isinstance(slot, (ast.Subscript, ast.Attribute)) else None
    if text is None or not _walks_slot(comp, text, ctx):
        return False
    return any(
        isinstance(node, ast.Assign)
        and node is not stmt
        and len(node.targets) == 1
        and ctx.segment(node.targets[0]) == text
        and _fetches_slot(node.value, text, ctx)
        for node in walk(scope.node)
    )


# Comprehensions that build one element per item (`[a.cuda() for a in acts[i]]`).
_ELEMENT_COMPS = (ast.ListComp, ast.SetComp, ast.GeneratorExp)


def _fetches_slot(value: ast.expr, text: str, ctx: Context) -> bool:
    """``value`` moves each tensor of the slot written as ``text`` to a device: ``tuple([a.cuda()
    for a in list(acts[i])])``, ``[a.to(device) for a in acts[i]]``."""
    return any(
        isinstance(sub, _ELEMENT_COMPS)
        and isinstance(sub.elt, ast.Call)
        and isinstance(sub.elt.func, ast.Attribute)
        and sub.elt.func.attr in {"cuda", "to"}
        and not any(_is_cpu_arg(arg) for arg in sub.elt.args)
        and _walks_slot(sub, text, ctx)
        for sub in walk(value)
    )


# Builtins that copy an iterable as it is: `list(acts[i])` walks what `acts[i]` holds.
_COPIES = frozenset({"list", "tuple"})


def _walks_slot(comp: ast.AST, text: str, ctx: Context) -> bool:
    """The comprehension walks the slot written as ``text`` (``for a in list(acts[i])``)."""
    if not isinstance(comp, _ELEMENT_COMPS) or len(comp.generators) != 1:
        return False
    it = comp.generators[0].iter
    while isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in _COPIES:
        if len(it.args) != 1:
            return False
        it = it.args[0]
    return ctx.segment(it) == text


def _moved_in_place(call: ast.Call, receiver: ast.expr, ctx: Context) -> bool:
    """``model.cpu()`` as a statement, its result discarded, on a value that is not certainly
    a tensor: a module moved in place (offloaded between stages). A tensor's ``.cpu()`` returns
    a copy, so discarding it is pointless; only a certain tensor is still read back."""
    parent = ctx.parents[-1] if ctx.parents else None
    if not (isinstance(parent, ast.Expr) and parent.value is call):
        return False
    return not is_tensor_expr(receiver, ctx, ctx.function_scope() or ctx.scope)


def _is_output(read: ast.AST, ctx: Context, *, returns: bool = False) -> bool:
    """The read's result is written out: passed to a save/write call, stored on a response
    object, or collected into a list that the function writes out (or, with ``returns``, one
    it returns as it is) later."""
    return _flows_into(read, ctx, _writes, returns=returns, attributes=True, optional=True)


def _decoded_text(value: ast.expr, read: ast.AST) -> bool:
    """``return tokenizer.decode(flat.tolist())``: the copy's token ids decoded to the text a
    helper hands back, the generation's output (not a value computed from the ids)."""
    return (
        isinstance(value, ast.Call)
        and call_name(value) in {"decode", "batch_decode"}
        and len(value.args) >= 1
        and value.args[0] is read
    )


def _decoded_batch(read: ast.AST, ctx: Context) -> bool:
    """A loop over data (requests, chunks of a dataset: not ``range(max_len)``, a stream of
    generated tokens nor ``while``, which step a decoding one token at a time) whose copy of
    each batch's generated ids is decoded into text (``cont_toks_list = cont.tolist()``, then
    ``self.tok_decode(toks)``): the text is what the loop makes, one copy per batch."""
    loop = ctx.loops()[-1]
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    walked = loop.iter
    while isinstance(walked, ast.Call) and call_name(walked) in {"enumerate", "tqdm", "zip"}:
        if not walked.args:
            return False
        walked = walked.args[0]
    if isinstance(walked, ast.Call):
        words = set((call_name(walked) or "").lower().split("_"))
        if "range" in words or words & {"stream", "generate"}:
            return False  # a token a step: `for tok in generate_text_stream(model, ids):`
    if _sent_back(ctx, loop):
        return False  # EasyOCR's probabilities copied, renormalised and moved back
    return _flows_into(read, ctx, _decodes, returns=False, attributes=False, optional=True)


def _sent_back(ctx: Context, loop: ast.AST) -> bool:
    """The names the read's statement binds are bound again, later in the loop, to a value
    moved back to a device (``x = x.cpu().numpy()`` ... ``x = torch.from_numpy(x).to(device)``):
    a round trip through the host, not the loop's output."""
    if not ctx.stmt_path:
        return False
    block, index = ctx.stmt_path[-1]
    stmt = block[index]
    if not isinstance(stmt, ast.Assign):
        return False
    names = {t.id for t in stmt.targets if isinstance(t, ast.Name)}
    return any(
        isinstance(later, ast.Assign)
        and names & {t.id for t in later.targets if isinstance(t, ast.Name)}
        and any(
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr in {"to", "cuda"}
            and not _is_cpu(_device_target(sub))
            for sub in walk(later.value)
        )
        for later in block[index + 1 :]
    )


def _decodes(call: ast.Call) -> bool:
    """``tokenizer.decode(ids)``, ``batch_decode``, ``self.tok_decode(toks)``,
    ``converter.decode_greedy(preds)``: ids to text; not a dataset's ``decode_target(pred)``,
    which colours a segmentation map."""
    name = call_name(call) or ""
    if "decode" not in name.lower().split("_"):
        return False
    func = call.func
    receiver = dotted_name(func.value) if isinstance(func, ast.Attribute) else None
    last = (receiver or "").rsplit(".", 1)[-1].lower()
    return not any(word in last for word in ("dataset", "dst"))


def _steps_environment(read: ast.AST, ctx: Context) -> bool:
    """The read's result is the action handed to an environment (``envs.step(a.cpu().numpy())``,
    or through a name: ``actions = q.argmax(1).cpu().numpy()``, then ``env.step(actions)``): a
    host simulator needs its actions on the host, every step, whatever the loop trains."""
    return _flows_into(read, ctx, is_env_step, returns=False, attributes=False)


def _flows_into(
    read: ast.AST,
    ctx: Context,
    sink: Callable[[ast.Call], bool],
    *,
    returns: bool,
    attributes: bool,
    optional: bool = False,
) -> bool:
    """The read's result reaches a call ``sink`` accepts: as its argument, or through the
    names its statement binds or collects into (and, with ``returns``, a ``return`` of them
    counts; with ``attributes``, so does a store on another object's attribute). With
    ``optional``, sinks only under a branch the read is not in do not count when the read's
    result also feeds another call on every step (see ``_flows_to``)."""
    node = read
    indexes = False  # `eye[y.cpu().numpy()]`: the read picks rows of another value
    for parent in reversed(ctx.parents):
        if isinstance(parent, ast.Call) and node is not parent.func and sink(parent):
            return True
        if isinstance(parent, ast.stmt):
            stmt = parent
            break
        indexes = indexes or (isinstance(parent, ast.Subscript) and node is parent.slice)
        node = parent
    else:
        return False
    if isinstance(stmt, ast.Return) and stmt.value is not None:
        # `return seg.cpu()`: the copy is what the function returns, as `out = seg.cpu()`,
        # then `return out`, is
        return (
            returns
            and not indexes
            and (_carries(stmt.value, set(), read) or _decoded_text(stmt.value, read))
        )
    names: set[str] = set()
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        for target in targets:
            if (
                attributes
                and isinstance(target, ast.Attribute)
                and not (isinstance(target.value, ast.Name) and target.value.id == "self")
            ):
                return True  # response.embeddings = x.cpu().numpy()
            names |= _stored_names(target)
    elif (
        isinstance(stmt, ast.AugAssign)
        and isinstance(stmt.op, ast.Add)
        and isinstance(stmt.target, ast.Name)
        and _carries(stmt.value, set(), read)
    ):
        names.add(stmt.target.id)  # `preds += y.tolist()` collects as `preds.extend(...)` does
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        if isinstance(func, ast.Attribute) and func.attr in {"append", "extend"}:
            root = func.value
            if isinstance(root, ast.Name):
                names.add(root.id)
    if not names:
        return False
    scope = ctx.function_scope()
    body = scope.node if scope is not None else None
    if body is None:
        body = ctx.scope.root().node
    if sink is _writes and any(_file_appender(name, body) for name in names):
        return True  # `npaa.append(x.cpu().numpy())` into `NpyAppendArray(path)`: to disk
    flows = _flows_to(body, names, sink, stmt if optional else None)
    kept = _returned(body, names) or _kept_joined(ctx, body, names)
    return flows or (returns and not indexes and kept)


def _file_appender(name: str, body: ast.AST) -> bool:
    """``name`` is bound in ``body`` only to an object built on a file path, whose
    ``append`` writes to that file: fairseq's ``npaa = NpyAppendArray(save_path + ".npy")``,
    then ``npaa.append(x.cpu().numpy())`` per batch of features (the loop's output, written
    out). A list, a deque or an object built from anything but a path collects in memory."""
    built: list[ast.expr] = []
    for sub in walk(body):
        if isinstance(sub, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in sub.targets
        ):
            built.append(sub.value)
        elif isinstance(sub, (ast.AnnAssign, ast.AugAssign)) and (
            isinstance(sub.target, ast.Name) and sub.target.id == name
        ):
            return False
        elif isinstance(sub, ast.withitem) and (
            isinstance(sub.optional_vars, ast.Name) and sub.optional_vars.id == name
        ):
            built.append(sub.context_expr)
        elif isinstance(sub, (ast.For, ast.comprehension)) and any(
            isinstance(n, ast.Name) and n.id == name for n in walk(sub.target)
        ):
            return False
    return bool(built) and all(_built_on_file(value) for value in built)


# A string that ends as a file name does: `".npy"`, `"feats.h5"`.
_FILE_SUFFIX = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,4}$")


def _built_on_file(value: ast.expr) -> bool:
    """A constructor (a capitalised callee, not ``list``/``deque``) handed a file path: a
    string with a file suffix, or a name or attribute for a path or file."""
    if not isinstance(value, ast.Call):
        return False
    callee = call_name(value) or ""
    if not callee[:1].isupper():
        return False
    for arg in [*value.args, *(k.value for k in value.keywords)]:
        for sub in walk(arg):
            if (
                isinstance(sub, ast.Constant)
                and isinstance(sub.value, str)
                and _FILE_SUFFIX.search(sub.value)
            ):
                return True
            text = (
                sub.id
                if isinstance(sub, ast.Name)
                else sub.attr
                if isinstance(sub, ast.Attribute)
                else ""
            ).lower()
            if "path" in text or "file" in text:
                return True
    return False


def _kept_joined(ctx: Context, body: ast.AST, names: set[str]) -> bool:
    """At a script's top level (a notebook's cells), where nothing returns: the copies joined,
    after the loop, into the name that collected them (``start_logits =
    torch.cat(start_logits).numpy()``, ``forecasts = np.vstack(forecasts)``) are the script's
    result, as a function's ``return`` of them is. In a function: the copies joined by a call
    after its loops, into any name."""
    loops = ctx.loops()
    if not loops:
        return False
    end: int = getattr(loops[0], "end_lineno", None) or 0
    if ctx.function_scope() is not None:
        return _decoded_after(body, _carried(body, names), end)
    if not isinstance(body, ast.Module):
        return False
    return any(
        isinstance(stmt, ast.Assign)
        and stmt.lineno > end
        and any(names_in(target) & names for target in stmt.targets)
        and _carries(_unwrapped(stmt.value), names)
        for stmt in walk_body(body.body)  # also under `if __name__ == "__main__":`
    )


# Words of a call that scores predictions rather than decoding them: `f1_score(targets, preds)`.
_METRIC_WORD = re.compile(r"score|metric|acc|loss|error|precision|recall|auc|f1", re.IGNORECASE)


def _decoded_after(body: ast.AST, carried: set[str], end: int) -> bool:
    """In a function: the copies, joined after its loops, handed alone to one call whose result
    the function returns (``all_outs = torch.cat(all_outs)``, ``text = decoder.decode(all_outs)``,
    ``return text``; ``return self.predict_func(np.vstack(results))``): the inference's output,
    post-processed once. Not a score of them (``f1_score(targets, preds)``: metrics, for which
    the copies could stay on the device), nor statistics never returned."""
    joined: dict[str, int] = {}  # `stacked = np.vstack(parts)` after the loop: its line
    for stmt in walk(body):
        if isinstance(stmt, ast.Assign) and stmt.lineno > end and _joins(stmt.value, carried):
            for target in stmt.targets:
                joined.update(dict.fromkeys(names_in(target), stmt.lineno))
    for call in walk(body):
        if not (
            isinstance(call, ast.Call)
            and getattr(call, "lineno", 0) > end
            and len(call.args) == 1
            and not call.keywords
        ):
            continue
        arg = call.args[0]
        name = call_name(call) or ""
        if not (
            _joins(arg, carried)
            or (isinstance(arg, ast.Name) and joined.get(arg.id, call.lineno) < call.lineno)
        ):
            continue
        if _METRIC_WORD.search(name) or name in _JOINS | _RESHAPES | _HOST_FUNCS:
            continue
        if _returned(body, set(), call):
            return True
    return False


def _joins(value: ast.expr, carried: set[str]) -> bool:
    """``np.vstack(parts)``, ``torch.cat(parts).numpy()``: one array joined from the copies."""
    value = _unwrapped(value)
    return (
        isinstance(value, ast.Call)
        and (call_name(value) or "") in _JOINS
        and any(_carries(arg, carried) for arg in value.args)
    )


def _unwrapped(value: ast.expr) -> ast.expr:
    """``torch.cat(parts).numpy()``, ``np.stack(bits).reshape(-1, 8)``: the joined host
    copies, as an array (in another shape or dtype)."""
    while (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and ((value.func.attr == "numpy" and not value.args) or value.func.attr in _RESHAPES)
    ):
        value = value.func.value
    return value


def _feeds_host_metric(read: ast.AST, ctx: Context) -> bool:
    """``da_metric.addBatch(pred.cpu(), gt.cpu())``, or ``pred = output.cpu().numpy()``, then
    ``pred = np.argmax(pred, axis=1)`` and ``self.evaluator.add_batch(target, pred)`` in the
    same step: the copy updates a metric object of the linted tree that keeps its state in
    NumPy (``self.confusion_matrix = np.zeros(...)``), which needs it on the host every step;
    or a NumPy metric function of scikit-image, scikit-learn or SciPy computes on it."""
    if not ctx.stmt_path:
        return False
    block, index = ctx.stmt_path[-1]
    bound = assigned_name(block[index], read)
    names = {bound} if bound is not None else set()
    for sub in block[index:]:  # the read's statement and those after it in its block
        nodes = list(walk(sub))
        for node in nodes:
            if isinstance(node, ast.Assign) and names & {
                n.id for n in walk(node.value) if isinstance(n, ast.Name)
            }:
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.comprehension) and names & {
                n.id for n in walk(node.iter) if isinstance(n, ast.Name)
            }:  # `[linear_sum_assignment(c[i]) for i, c in enumerate(C.split(sizes, -1))]`
                names |= names_in(node.target)
        for node in nodes:
            if not isinstance(node, ast.Call):
                continue
            given = [*node.args, *(k.value for k in node.keywords)]
            fed = any(
                any(n is read or (isinstance(n, ast.Name) and n.id in names) for n in walk(a))
                for a in given
            )
            if not fed:
                continue
            if isinstance(node.func, ast.Attribute) and _numpy_state(node.func.value, ctx):
                return True
            if (ctx.call_qualname(node) or "").startswith(_HOST_METRICS):
                return True  # `peak_signal_noise_ratio(hr.cpu().numpy(), sr.cpu().numpy())`
            if _host_metric_helper(node, ctx):
                return True  # `estimate_pose(pts0[mask], ...)` running OpenCV's RANSAC
    return False


# Libraries of metrics computed on NumPy arrays (and OpenCV's geometry, which works on them):
# a copy handed to one is read on the host. Speech quality and separation scores (PESQ,
# STOI, mir_eval's) take NumPy audio only.
_HOST_METRICS = (
    *("skimage.metrics.", "sklearn.metrics.", "scipy.stats.", "scipy.spatial."),
    *("scipy.optimize.", "pesq.", "pystoi.", "mir_eval."),
    "cv2.",
)


def _host_metric_helper(call: ast.Call, ctx: Context, *, hops: int = 1) -> bool:
    """``call`` runs a module-level function of the file, or a method of the class on
    ``self``, whose body calls one of those libraries (``estimate_pose(kpts0, kpts1, K0, K1)``
    calling ``cv2.findEssentialMat``), or a helper that does, or makes NumPy arrays of
    tensors (``self.extract_single_image(img)`` doing ``image.cpu().numpy()`` for OpenCV's
    SIFT): host work the copy is for."""
    function = _helper_def(call.func, ctx)
    if function is None:
        return False
    for sub in walk(function):
        if not isinstance(sub, ast.Call):
            continue
        if (ctx.call_qualname(sub) or "").startswith(_HOST_METRICS):
            return True
        if isinstance(sub.func, ast.Attribute) and sub.func.attr == "numpy" and not sub.args:
            return True
        if hops and _host_metric_helper(sub, ctx, hops=hops - 1):
            return True
    return False


def _helper_def(func: ast.expr, ctx: Context) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The module-level function ``helper(...)`` names, or the method ``self.helper(...)``
    names in the enclosing class."""
    found: ast.AST | None = None
    if isinstance(func, ast.Name):
        found = file_facts(ctx).top_level(func.id)
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        cls = next((p for p in reversed(ctx.parents) if isinstance(p, ast.ClassDef)), None)
        if func.value.id == "self" and cls is not None:
            found = next((i for i in cls.body if getattr(i, "name", None) == func.attr), None)
    return found if isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _numpy_state(holder: ast.expr, ctx: Context) -> bool:
    """``holder`` (``evaluator``, ``self.evaluator``) is bound to an instance of a class of the
    linted tree that keeps an attribute in NumPy (``self.hist = np.zeros((n, n))``)."""
    facts = file_facts(ctx)
    name = dotted_name(holder)
    if name is None:
        return False
    if name == "self":  # `self.append(x.cpu().numpy())` in the metric class's own method
        cls = next((p for p in reversed(ctx.parents) if isinstance(p, ast.ClassDef)), None)
        return cls is not None and _keeps_numpy(facts, cls)
    values: list[ast.expr | None] = []
    if "." not in name:
        scope = ctx.function_scope()
        values = list(ctx.scope_bindings(scope).get(name, [])) if scope is not None else []
    elif name.startswith("self.") and name.count(".") == 1:
        cls = next((p for p in reversed(ctx.parents) if isinstance(p, ast.ClassDef)), None)
        for sub in statements(cls.body) if cls is not None else ():
            if isinstance(sub, ast.Assign) and any(dotted_name(t) == name for t in sub.targets):
                values.append(sub.value)
    for value in values:
        if not isinstance(value, ast.Call):
            continue
        found = facts.class_def(value.func)
        if found is None:
            continue
        owner, cls = found
        if _keeps_numpy(owner, cls):
            return True
    return False


def _keeps_numpy(owner: FileFacts, cls: ast.ClassDef) -> bool:
    """A class of the tree that keeps an array in NumPy (``self.hist = np.zeros(...)``), not
    one that runs a statistic through NumPy's math (``self.std = np.sqrt(self.var)``)."""
    return any(
        isinstance(sub, ast.Assign)
        and isinstance(sub.value, ast.Call)
        and (owner.qualname(sub.value.func) or "").removeprefix("numpy.") in _NUMPY_ARRAYS
        and any((dotted_name(t) or "").startswith("self.") for t in sub.targets)
        for sub in statements(cls.body)
    )


# NumPy functions that make or grow an array a metric keeps as its state.
_NUMPY_ARRAYS = frozenset(
    {
        *("zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like"),
        *("full_like", "array", "asarray", "concatenate", "stack", "vstack", "hstack"),
        *("append", "bincount", "histogram", "histogram2d", "arange"),
    }
)


def _fills_store(read: ast.AST, ctx: Context) -> bool:
    """``store.index_copy_(0, i, x.cpu())``, ``ranks[a:b] = x.cpu()``: the copy fills a buffer
    (in place, or a host tensor or array by index), which is the loop's job."""
    node = read
    for parent in reversed(ctx.parents):
        if isinstance(parent, ast.Call) and node is not parent.func:
            func = parent.func
            return isinstance(func, ast.Attribute) and func.attr.endswith("_")
        if isinstance(parent, ast.stmt):
            return (
                _into_host_buffer(parent, node, ctx)
                or _only_fills(parent, node, ctx)
                or _summed_on_host(parent, node, ctx)
            )
        node = parent
    return False


def _summed_on_host(stmt: ast.stmt, value: ast.AST, ctx: Context) -> bool:
    """``h = out.cpu().numpy()``, then NumPy or OpenCV work on it (``h = cv2.resize(h, s)``)
    ending in ``heat_avg += h / n`` into an array the function made on the host before the
    loop (``heat_avg = np.zeros(shape)``): each pass's copy is summed into the host result
    (a multi-scale test), which the loop exists to fill; not gathered into a list."""
    name = assigned_name(stmt, value)
    loops = ctx.loops()
    if name is None or not loops:
        return False
    loop = loops[-1]
    tainted = {name}
    body = list(walk(loop))
    for _ in range(3):
        for sub in body:
            if isinstance(sub, ast.Assign) and _mentions(sub.value, tainted):
                for target in sub.targets:
                    tainted |= _stored_names(target)
    if any(_collector(sub, tainted) for sub in body):
        return False  # `outs.append(h)`: gathered for after the loop
    for sub in body:
        if (
            isinstance(sub, ast.AugAssign)
            and isinstance(sub.op, ast.Add)
            and _mentions(sub.value, tainted)
        ):
            target = subscripted(sub.target)
            if (
                isinstance(target, ast.Name)
                and target.id not in tainted
                and _host_array(target.id, ctx)
            ):
                return True
    return False


_ARRAY_MAKERS = frozenset({"zeros", "zeros_like", "ones", "ones_like", "empty", "full"})


def _host_array(name: str, ctx: Context) -> bool:
    """``name`` is bound in its function only to a NumPy array constructor (``np.zeros(s)``):
    a result array, not a running number (``total = 0``, then ``total += loss``)."""
    function = ctx.function_scope()
    bound = ctx.scope_bindings(function).get(name) if function is not None else None
    values = [v for v in bound or [] if v is not None]  # None: its own `+=` steps
    return bool(values) and all(
        isinstance(v, ast.Call)
        and (ctx.qualname(v.func) or "").startswith("numpy.")
        and (ctx.qualname(v.func) or "").rpartition(".")[2] in _ARRAY_MAKERS
        for v in values
    )


def _only_fills(stmt: ast.stmt, value: ast.AST, ctx: Context) -> bool:
    """``tmp = tmp.cpu()``, then only ``table.index_add_(0, idx, tmp)`` (or ``copy_``) from
    there on: the copy is handed to in-place writes alone, so it fills a buffer on the host
    (a table kept in host memory), as ``store.index_copy_(0, i, x.cpu())`` does."""
    name = assigned_name(stmt, value)
    if name is None:
        return False
    nodes = list(walk(scope_node(ctx)))
    written = {
        id(arg)
        for sub in nodes
        if isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr.endswith("_")
        for arg in sub.args
    } | {  # `feats[i : i + n] = x` into a host tensor or array of the function
        id(sub.value)
        for sub in nodes
        if isinstance(sub, (ast.Assign, ast.AugAssign))
        and isinstance(sub.value, ast.Name)
        and sub.value.id == name
        and _into_host_buffer(sub, sub.value, ctx)
    }
    after = stmt.end_lineno or stmt.lineno
    named = [s for s in nodes if isinstance(s, ast.Name) and s.id == name]
    until = min(  # the next binding of the name: its later reads are of another value
        (s.lineno for s in named if not isinstance(s.ctx, ast.Load) and s.lineno > after),
        default=None,
    )
    # `patch[..., :k] *= 0` writes into the copy itself; `torch.ones_like(patch)` reads its
    # shape: neither hands its values on (a tiled inference masking a patch's border)
    kept = (
        {
            id(sub.value)
            for sub in nodes
            if isinstance(sub, ast.Subscript) and not isinstance(sub.ctx, ast.Load)
        }
        | {
            id(arg)
            for sub in nodes
            if isinstance(sub, ast.Call) and (call_name(sub) or "").endswith("_like")
            for arg in sub.args[:1]
        }
        | {  # `x.shape[0]`, `x.size(0)`: its size, a host value
            id(sub.value)
            for sub in nodes
            if isinstance(sub, ast.Attribute) and sub.attr in {"shape", "size"}
        }
    )
    uses = [
        s
        for s in named
        if isinstance(s.ctx, ast.Load)
        and after < s.lineno
        and (until is None or s.lineno < until)
        and id(s) not in kept
    ]
    return bool(uses) and all(id(use) in written for use in uses)


def _into_host_buffer(stmt: ast.stmt, value: ast.AST, ctx: Context) -> bool:
    """``ranks[start:end] = x.cpu()`` with ``ranks`` a host tensor or array (``torch.empty(n)``,
    ``np.zeros(n)``): the copy lands in the host buffer the function fills; also added in
    place, ``probs[idxs] += p.cpu()`` or ``probs[i][idxs] += ...`` (dropout passes summed into
    a host table)."""
    if isinstance(stmt, ast.AugAssign) and stmt.value is value:
        target: ast.expr = stmt.target
        while isinstance(target, ast.Subscript) and isinstance(target.value, ast.Subscript):
            target = target.value
    elif isinstance(stmt, ast.Assign) and stmt.value is value and len(stmt.targets) == 1:
        target = stmt.targets[0]
    else:
        return False
    if not (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)):
        return False
    if _keyed_cache(target, ctx):
        return True
    fact = file_facts(ctx).fact(target.value, scope_node(ctx))
    return fact is not None and fact.where == "host"


def _keyed_cache(target: ast.Subscript, ctx: Context) -> bool:
    """``embeds[cap] = (pe.cpu(), pooled.cpu())`` in ``for cap in captions:``, with ``embeds``
    bound only to an empty dict: a cache of host copies filled once per key (text embeddings
    precomputed before the training loop of the same function), in a loop that trains
    nothing itself."""
    loops = ctx.loops()
    scope = ctx.function_scope()
    if not (
        loops
        and scope is not None
        and isinstance(loops[-1], (ast.For, ast.AsyncFor))
        and isinstance(target.slice, ast.Name)
        and isinstance(target.value, ast.Name)
        and target.slice.id in names_in(loops[-1].target)
    ):
        return False
    name = target.value.id
    values = [  # its plain bindings (a store by key, `embeds[cap] = ...`, keeps the dict)
        sub.value
        for sub in walk(scope.node)
        if isinstance(sub, (ast.Assign, ast.AnnAssign))
        and any(
            isinstance(t, ast.Name) and t.id == name
            for t in (sub.targets if isinstance(sub, ast.Assign) else [sub.target])
        )
    ]
    return (
        bool(values)
        and all(
            (isinstance(value, ast.Dict) and not value.keys)
            or (isinstance(value, ast.Call) and call_name(value) == "dict" and not value.args)
            for value in values
        )
        and not calls_backward(loops[-1])
        and not any(
            call_name(sub) == "step" for sub in walk(loops[-1]) if isinstance(sub, ast.Call)
        )
    )


def _writes(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    lowered = name.lower()
    if any(word in lowered for word in _OUTPUT_WORDS):
        return True
    if "compute" in lowered:
        # `metric.compute(predictions=preds)`, `compute_errors(gt, pred)`: host copies handed
        # to a host metric; not a model's own `model.compute_itm(...)`, which runs on it
        receiver = dotted_name(func.value) if isinstance(func, ast.Attribute) else None
        return receiver is None or "model" not in receiver.rpartition(".")[2].lower()
    # `queue.put(x)`, `put_nowait`: "put" as a word of its own, not inside `InputPadder`,
    # `compute_output` or `outputs`; and the input handed to another runtime, OpenCV DNN's
    # `net.setInput(blob)`, `set_input_tensor(...)`: NumPy in, whatever the loop does
    words = [w for w in _CAMEL.sub("_", name).lower().split("_") if w]
    return "put" in words or (bool(words) and words[0] in {"set", "feed"} and "input" in words)


_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _flows_to(
    scope: ast.AST,
    names: set[str],
    sink: Callable[[ast.Call], bool],
    read: ast.stmt | None = None,
) -> bool:
    """Values built from ``names`` in ``scope`` reach a call ``sink`` accepts. Given the
    ``read`` statement that binds ``names``: when every such call sits under an ``if`` that
    does not hold ``read`` (``if opts.save_val_results:``) and a call statement outside such
    branches takes the names themselves (``metrics.update(targets, preds)``), the write is
    optional and the copy is made for that call on every step: not the loop's output."""
    tainted = set(names)
    nodes = list(walk(scope))
    lists = _list_names(nodes)
    for _ in range(3):
        for sub in nodes:
            if isinstance(sub, ast.Assign) and _mentions(sub.value, tainted):
                for target in sub.targets:
                    tainted |= _stored_names(target)
            elif (
                isinstance(sub, ast.AugAssign)
                and isinstance(sub.target, ast.Name)
                and _extends_list(sub, lists)
                and _mentions(sub.value, tainted)
            ):
                tainted.add(sub.target.id)  # `results += batch_results`, as `.extend()` does
            elif isinstance(sub, (ast.For, ast.comprehension)) and _mentions(sub.iter, tainted):
                tainted |= {n.id for n in walk(sub.target) if isinstance(n, ast.Name)}
            else:
                tainted |= _collector(sub, tainted)
    takers = [sub for sub in nodes if isinstance(sub, ast.Call) and _takes(sub, tainted)]
    writes = [call for call in takers if sink(call)]
    if sink is _writes:  # `df.to_csv(path)`: the table built from them, written out
        writes += [s for s in nodes if isinstance(s, ast.Call) and _writes_itself(s, tainted)]
    if not writes or read is None:
        return bool(writes)
    optional = _under_other_branches(scope, read)
    if any(id(call) not in optional for call in writes):
        return True
    own = {id(sub) for sub in walk(read)}
    return not any(
        id(stmt.value) not in optional and id(stmt.value) not in own and _consumes(stmt, names)
        for stmt in nodes
        if isinstance(stmt, ast.Expr)
    )


def _list_names(nodes: list[ast.AST]) -> set[str]:
    """Names bound to a list display or comprehension (``results = []``) or to a tensor's
    ``.tolist()``."""
    return {
        target.id
        for sub in nodes
        if isinstance(sub, ast.Assign)
        and (
            isinstance(sub.value, (ast.List, ast.ListComp))
            or (
                isinstance(sub.value, ast.Call)
                and isinstance(sub.value.func, ast.Attribute)
                and sub.value.func.attr == "tolist"
            )
        )
        for target in sub.targets
        if isinstance(target, ast.Name)
    }


def _extends_list(node: ast.AST, lists: set[str]) -> bool:
    """``results += batch_results`` with both sides lists: the items are collected, not
    added up (``total += loss_value`` is arithmetic)."""
    return (
        isinstance(node, ast.AugAssign)
        and isinstance(node.op, ast.Add)
        and isinstance(node.target, ast.Name)
        and node.target.id in lists
        and (
            isinstance(node.value, (ast.List, ast.ListComp))
            or (isinstance(node.value, ast.Name) and node.value.id in lists)
        )
    )


def _writes_itself(call: ast.Call, names: set[str]) -> bool:
    """``df.to_csv(path)``, ``table.save(path)``: a method that writes out the value it is
    called on, one of ``names``."""
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in names
        and func.attr.lower().startswith(("save", "write", "dump", "to_csv", "to_parquet"))
    )


def _stored_names(target: ast.expr) -> set[str]:
    """The names an assignment target stores into: ``results`` of ``results[dstype] = v``,
    not the key ``dstype`` it is stored under (which the value does not reach)."""
    if isinstance(target, ast.Subscript):
        return _stored_names(target.value)
    if isinstance(target, ast.Starred):
        return _stored_names(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return {name for elt in target.elts for name in _stored_names(elt)}
    return {n.id for n in walk(target) if isinstance(n, ast.Name)}


def _takes(call: ast.Call, names: set[str]) -> bool:
    """``call`` is given one of ``names`` (or a value built from it) as an argument."""
    return any(_mentions(arg, names) for arg in [*call.args, *(k.value for k in call.keywords)])


_COLLECTS = frozenset({"append", "extend", "insert"})


def _consumes(stmt: ast.Expr, names: set[str]) -> bool:
    """``metrics.update(targets, preds)`` as a statement: a call that takes the values for its
    own effect (an accumulator, a metric), not to hand on a result; ``len(out)`` in an argument
    asks for a count and takes nothing."""
    call = stmt.value
    if not isinstance(call, ast.Call) or call_name(call) in _COLLECTS:
        return False  # `outputs.append(y)` hands the values on to what the list feeds
    args = [*call.args, *(k.value for k in call.keywords)]
    return any(
        isinstance(sub, ast.Name) and sub.id in names and not _in_len(sub, arg)
        for arg in args
        for sub in walk(arg)
    )


def _in_len(name: ast.Name, root: ast.expr) -> bool:
    return any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Name)
        and sub.func.id == "len"
        and any(n is name for arg in sub.args for n in walk(arg))
        for sub in walk(root)
    )


def _under_other_branches(scope: ast.AST, stmt: ast.stmt) -> set[int]:
    """The ids of the nodes inside an ``if`` of ``scope`` that does not hold ``stmt``: code that
    runs on some steps only, as far as ``stmt`` is concerned."""
    inside: set[int] = set()
    for node in walk(scope):
        if isinstance(node, ast.If) and id(node) not in inside:
            ids = {id(sub) for sub in walk(node)}
            if id(stmt) not in ids:
                inside |= ids
    return inside


# Calls that hand back the same values joined or converted, not something computed from them.
_JOINS = frozenset(
    {"concatenate", "cat", "concat", "stack", "vstack", "hstack", "array", "asarray"}
    | {"tensor", "as_tensor", "from_numpy"}  # `torch.tensor(scores)`: the same values
    | {"Series", "DataFrame"}  # `pd.Series(np.concatenate(preds), index=index)`: labelled
)


# Methods that hand back the same values in another dtype or shape.
_RESHAPES = frozenset({"astype", "reshape", "squeeze", "ravel", "flatten", "copy"})


def _returned(scope: ast.AST, names: set[str], read: ast.AST | None = None) -> bool:
    """The values in ``names`` (or of the expression ``read``) are what the function returns:
    collected (``out.append(v)``), joined (``np.concatenate(out)``), sliced or renamed, then
    returned unchanged. A value computed from them (a score, a decoded text) is a different
    result."""
    carried = _carried(scope, names, read)
    return any(
        isinstance(sub, ast.Return) and sub.value is not None and _carries(sub.value, carried, read)
        for sub in walk(scope)
    )


def _stepping(loops: list[ast.AST]) -> list[ast.AST]:
    """The loops among ``loops`` that step over more than the entries of a mapping converted
    under their own keys (``{k: v.cpu() for k, v in out.items()}``: the whole output, entry by
    entry)."""
    return [loop for loop in loops if not _stores_entries(loop)]


def _carried(scope: ast.AST, names: set[str], read: ast.AST | None = None) -> set[str]:
    """``names`` (and what the expression ``read`` is bound to) and the names that hold their
    values as they are: collected (``out.append(v)``), joined (``np.concatenate(out)``), sliced
    or renamed."""
    carried = set(names)
    nodes = list(walk(scope))
    for _ in range(3):
        for sub in nodes:
            if isinstance(sub, ast.Assign) and _carries(sub.value, carried, read):
                for target in sub.targets:
                    carried |= names_in(target)
            elif isinstance(sub, (ast.For, ast.comprehension)) and _carries(sub.iter, carried):
                carried |= names_in(sub.target)  # `for m in mels: specs.append(m)`: its rows
            else:
                carried |= _collector(sub, carried, _carries) - {"self"}
    return carried


def _carries(node: ast.expr, names: set[str], read: ast.AST | None = None) -> bool:
    """``node`` is one of ``names`` (or the ``read`` itself) as it is: the name, a slice, a
    tuple of them, a join, or one of these in another dtype or shape (``.astype(...)``,
    ``.reshape(...)``)."""
    if node is read:
        return True
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Subscript):  # arr[:n], wav[..., :-50]: trimmed, not picked
        return _only_slices(node.slice) and _carries(node.value, names, read)
    if isinstance(node, ast.Starred):
        return _carries(node.value, names, read)
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(_carries(element, names, read) for element in node.elts)
    if isinstance(node, ast.Dict):  # `return {"wav": np.concatenate(wavs)}`: labelled by key
        return any(_carries(value, names, read) for value in node.values)
    if isinstance(node, ast.DictComp) and _stores_entries(node):
        # `{k: v.detach().cpu() for k, v in results.items()}`: each entry under its own key
        return _carries(node.value, names, read)
    if isinstance(node, ast.IfExp):  # `(specs, attn) if return_attn else specs`
        return _carries(node.body, names, read) or _carries(node.orelse, names, read)
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _RESHAPES:
            return _carries(func.value, names, read)  # np.concatenate(out).astype("float64")
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "numpy"
            and isinstance(func.value, ast.Call)
        ):
            return _carries(func.value, names, read)  # torch.cat(wavs).numpy(): as an array
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in _JOINS and any(_carries(arg, names, read) for arg in node.args)
    return False


def _only_slices(index: ast.expr) -> bool:
    """``[:n]``, ``[..., :-50]``, ``[:, 1:]``: an index that trims every axis it names (a
    slice or ``...`` each), so the value keeps its bulk; ``[0]`` or ``[..., 0]`` picks."""
    parts = index.elts if isinstance(index, ast.Tuple) else [index]
    slices = [part for part in parts if isinstance(part, ast.Slice)]
    rest = [part for part in parts if not isinstance(part, ast.Slice)]
    return bool(slices) and all(
        isinstance(part, ast.Constant) and part.value is Ellipsis for part in rest
    )


def _collector(
    node: ast.AST,
    names: set[str],
    holds: Callable[[ast.expr, set[str]], bool] | None = None,
) -> set[str]:
    """``rows.append(x)`` with ``x`` in ``names`` (by ``holds``: mentioning one of them, by
    default): ``{"rows"}``, the list now holds it."""
    holds = holds or _mentions
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"append", "extend"}
        and any(holds(arg, names) for arg in node.args)
    ):
        return names_in(node.func.value)
    return set()


def _mentions(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in walk(node))


# The forms of a value that a print, f-string, cast or condition reads: names, attributes,
# elements, calls, comparisons and arithmetic of them (`int(bbox[0] / scale)`, whose
# operand is a row of a device tensor); whether it is a device value is asked of the flow.
_READ_FORMS = (ast.Name, ast.Attribute, ast.Subscript, ast.Call, ast.Compare, ast.BinOp)


def _sort_key(call: ast.Call, lam: ast.Lambda) -> bool:
    """``lam`` is the ``key`` of ``sorted``, ``min``, ``max`` or a list's ``sort``."""
    func = call.func
    named = isinstance(func, ast.Name) and func.id in {"sorted", "min", "max"}
    method = isinstance(func, ast.Attribute) and func.attr == "sort" and not call.args
    return (named or method) and any(k.arg == "key" and k.value is lam for k in call.keywords)


def _sorted_items(call: ast.Call) -> ast.expr | None:
    """What a sort key is applied to: ``sorted(items, key=...)``'s items, ``items.sort()``'s."""
    if isinstance(call.func, ast.Attribute):
        return call.func.value
    return call.args[0] if len(call.args) == 1 else None


def _mapped_element(lam: ast.Lambda, receiver: ast.expr, ctx: Context) -> ast.expr | None:
    """What the parameter of a lambda that ``map`` applies right there stands for, when the
    read is of that parameter itself: ``map(lambda t: t.item(), (sigma, sigma_next, gamma))``
    reads each element (the one on the device, if any, of a display), ``map(lambda x:
    x.cpu(), outs)`` each item of ``outs``; the key of a sort, ``min`` or ``max``, which runs
    once per item there too, reads each item, or what it reads of them (``ids.sort(key=lambda
    x: scores[i][x].item())``). None for any other lambda, which runs when something calls
    it (a timer, a callback), not here."""
    args = lam.args
    params = [*args.posonlyargs, *args.args]
    if len(params) != 1 or args.vararg or args.kwarg or args.kwonlyargs:
        return None
    index = next((i for i, p in enumerate(ctx.parents) if p is lam), None)
    call = ctx.parents[index - 1] if index else None
    own = isinstance(receiver, ast.Name) and receiver.id == params[0].arg
    keyed = ctx.parents[index - 2] if index and index > 1 else None
    if isinstance(call, ast.keyword) and isinstance(keyed, ast.Call) and _sort_key(keyed, lam):
        # a key runs once per element, right there: `ids.sort(key=lambda x: out[i][x].item())`
        return _sorted_items(keyed) if own else receiver
    if not own:
        return None
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == "map"
        and len(call.args) == 2
        and call.args[0] is lam
        and not call.keywords
    ):
        return None
    iterable = call.args[1]
    if not isinstance(iterable, (ast.Tuple, ast.List)):
        return iterable
    if not iterable.elts or any(isinstance(e, ast.Starred) for e in iterable.elts):
        return None
    facts = file_facts(ctx)
    scope = scope_node(ctx)
    for element in iterable.elts:
        fact = facts.fact(element, scope)
        if fact is not None and fact.on_device:
            return element
    return iterable.elts[0]


def _check(
    node: ast.AST,
    receiver: ast.expr,
    what: str,
    ctx: Context,
    *,
    explicit: bool,
    bulk: bool = False,
    read: ast.AST | None = None,
) -> bool:
    """Report ``what`` (a read of ``receiver``) if it runs per batch on a device value."""
    lam = next((p for p in reversed(ctx.parents) if isinstance(p, ast.Lambda)), None)
    if lam is not None:
        element = _mapped_element(lam, receiver, ctx)
        if element is None:
            return False  # runs when something calls the lambda (a timer, a callback), not here
        receiver = element
    loops = ctx.loops()
    scope = scope_node(ctx)
    if not loops and not (_called_here(scope, ctx) or (explicit and _module_level(ctx))):
        return False  # not in a loop, nor a function something calls: cannot be per batch
    if not explicit and (
        not isinstance(receiver, _READ_FORMS)
        or _host_syntax(receiver)
        or (
            isinstance(receiver, ast.BinOp)
            and not _arithmetic_of_values(receiver, _stepped_attributes(loops))
        )
        or not (_mentions_device(ctx) or _handed_in(receiver, scope, ctx))
    ):
        return False  # a print/f-string/cast needs a device value, and nothing here makes one
    if in_test(ctx) or _exits(ctx, read or node) or _in_assert_message(ctx, read or node):
        return False
    if in_device_kernel(ctx):
        return False  # a Triton kernel's body runs on the device: it reads nothing back
    if _on_failure(ctx, read or node) or _not_a_tensor_here(receiver, node, ctx):
        return False
    if in_periodic_branch(ctx, node, through=lambda loop: _not_batch(loop, scope, ctx)):
        return False
    facts = file_facts(ctx)
    comps = _enclosing_comps(ctx, node)
    if not explicit and not _moved_value(receiver, scope, comps, ctx, facts):
        return False  # a print/f-string/cast needs a device value, and nothing here makes one
    step = _per_step(ctx, facts, scope) if loops else None
    row = _row_by_counter(receiver, comps, ctx, facts, scope, step) if loops else None
    if row is not None and bulk and not _trains(ctx) and _is_output(read or node, ctx):
        row = None  # `Image.fromarray(imgs[k].cpu().numpy()).save(...)`: each row's file
    step = row or step
    per_batch = None
    if step is None:
        if not (_called_here(scope, ctx) or (explicit and _module_level(ctx))):
            return False
        # before any flow: most functions are not
        per_batch = facts.per_batch(scope)
        if per_batch is None or _walks_gathered_sizes([*loops, *comps], facts, scope):
            return False
    fact = facts.fact(receiver, scope, comps=comps)
    if fact is not None and fact.where == "host" and not _seeded_device(receiver, per_batch, ctx):
        return False
    text = _text(receiver, ctx)
    if fact is None and step is not None and _read_before_its_move(receiver, read or node, ctx):
        return False  # the step moves this value only after the read: it is read on the host
    if fact is None and step is not None and _unmoved_loader_item(receiver, ctx):
        return False  # a part of a loader's batch that nothing moves: host tensors
    if step is not None:
        return _in_loop(node, what, text, fact, step, ctx, explicit=explicit, bulk=bulk, read=read)
    assert per_batch is not None
    fact = facts.fact(receiver, scope, per_batch.seeds, comps) if per_batch.seeds else fact
    if fact is not None and not fact.on_device:
        return False
    if fact is None and not (explicit and (per_batch.trains or per_batch.forward)):
        return False  # outside a training step, an unknown value may well be on the host
    if fact is None and _host_only_file(ctx):
        return False  # a helper of a script that never names a device: its tensors stay there
    if fact is None and _optional_tensor_arm(receiver, node, scope, ctx):
        return False  # `int(n.item()) if isinstance(n, torch.Tensor) else int(n)`
    if per_batch.itself and fact is None and _unplaced_step_value(receiver, read, ctx, bulk=bulk):
        return False
    if bulk and _fills_store(read or node, ctx):
        return False
    if (
        bulk
        and not per_batch.trains
        and not _trains(ctx)
        and _after_own_steps(read or node, scope, facts, ctx)
    ):
        return False  # once per call of a function that runs a whole loop of steps first
    if bulk and not per_batch.trains and not _trains(ctx) and _feeds_host_metric(read or node, ctx):
        return False  # `self.append(x.cpu().numpy())` of a metric that keeps NumPy state
    if explicit and _steps_environment(read or node, ctx):
        return False  # the action a host environment steps on: the loop's output
    if (
        bulk
        and not per_batch.trains
        and not _trains(ctx)
        and not _per_element(ctx, None)
        and _is_output(read or node, ctx, returns=not _stepping(loops))
    ):
        return False  # `save_image(x)` per batch: the copy to the host is the output
    cause = fact.describe() if fact is not None else "a value of the training step"
    ctx.report(
        SYNC_IN_LOOP.code,
        node,
        f"{what} of `{text}` runs once per batch ({per_batch.how}) and makes the host wait "
        f"for the device ({cause}); {_ADVICE}",
    )
    return True


def _after_own_steps(node: ast.AST, scope: ast.AST, facts: FileFacts, ctx: Context) -> bool:
    """A copy in the function's own body after a loop of its own that runs per batch (not
    the micro-batches of one step): FourCastNet's ``autoregressive_inference`` copies its
    forecast to the host once, after stepping the model through every lead time, however
    often a caller runs it."""
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) or ctx.loops():
        return False
    line = getattr(node, "lineno", 0)
    return any(
        isinstance(stmt, (ast.For, ast.AsyncFor, ast.While))
        and stmt.end_lineno is not None
        and stmt.end_lineno < line
        and not _accumulates(stmt)
        and (kind := facts.loop_kind(stmt, scope)) is not None
        and kind[0] == "batch"
        for stmt in own_nodes(scope)
    )


def _unmoved_loader_item(receiver: ast.expr, ctx: Context) -> bool:
    """``gt_obj[i][0].tolist()`` of ``gt_obj = info["gt_obj"]`` and ``info = data["info"]``,
    ``data`` an item of ``for data in test_loader:``: a loader yields host tensors, and nothing
    moves that part of the batch (STCN's evaluation moves only the masks, frame by frame)."""
    name = _root_name(receiver)
    scope = ctx.function_scope() or ctx.scope
    bindings = ctx.scope_bindings(scope)
    chain: list[str] = []
    for _ in range(4):
        if name is None:
            return False
        loop = next(
            (
                parent
                for parent in reversed(ctx.parents)
                if isinstance(parent, (ast.For, ast.AsyncFor)) and name in names_in(parent.target)
            ),
            None,
        )
        if loop is not None:
            return (
                len(bindings.get(name, [])) == 1
                and _over_loader(loop)
                and not _collates_here(loop, bindings)
                and not _moves_any([*chain, name], loop)
            )
        values = bindings.get(name) or []
        if len(values) != 1 or not isinstance(values[0], (ast.Subscript, ast.Attribute)):
            return False
        chain.append(name)
        name = _root_name(values[0])
    return False


def _collates_here(
    loop: ast.For | ast.AsyncFor, bindings: dict[str, list[ast.expr | None]]
) -> bool:
    """The loader the loop walks is built in the function with a ``collate_fn`` of its own,
    which may put the batches on the device."""
    names = {sub.id for sub in walk(loop.iter) if isinstance(sub, ast.Name)}
    return any(
        isinstance(value, ast.Call) and keyword(value, "collate_fn") is not None
        for name in names
        for value in bindings.get(name, [])
    )


def _moves_any(names: list[str], loop: ast.AST) -> bool:
    """Something in ``loop`` moves one of ``names`` (``x.cuda()``, ``x["a"].to(device)``) or
    hands it whole to a helper named for a device (``to_device(info, device)``)."""
    for sub in walk(loop):
        if not isinstance(sub, ast.Call):
            continue
        func = sub.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr in {"cuda", "to"}
            and _root_name(func.value) in names
        ):
            return True
        called = (dotted_name(func) or "").lower()
        if any(word in called for word in ("device", "cuda", "gpu")) and any(
            isinstance(arg, ast.Name) and arg.id in names for arg in sub.args
        ):
            return True
    return False


def _not_a_tensor_here(receiver: ast.expr, node: ast.AST, ctx: Context) -> bool:
    """``int(seq_len)`` in the ``else`` of ``if torch.is_tensor(seq_len):`` (or of
    ``isinstance(seq_len, torch.Tensor)``, or the body of ``if not ...``): whatever the flow
    says it may hold, the name read is a Python value on this branch."""
    root = receiver.args[0] if isinstance(receiver, ast.Call) and receiver.args else receiver
    while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
        root = root.func if isinstance(root, ast.Call) else root.value
    if not isinstance(root, ast.Name):
        return False
    child = node  # the visited node: ctx.parents are its enclosing nodes
    for parent in reversed(ctx.parents):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
            test, negated = parent.test, False
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                test, negated = test.operand, True
            in_body = child is parent.body or (
                isinstance(parent.body, list) and child in parent.body
            )
            if _tests_tensor(test, root.id, ctx):
                return in_body == negated
            if _tests_number(test, root.id):  # `if isinstance(grad_norm, float):`
                return in_body != negated
        child = parent
    return False


_NUMBER_TYPES = frozenset({"float", "int", "bool", "numbers.Number", "numbers.Real"})


def _tests_number(test: ast.expr, name: str) -> bool:
    """``isinstance(name, float)`` (or ``int``, or a tuple of Python number types)."""
    tested = isinstance_test(test)
    return (
        tested is not None
        and tested[0] == name
        and all(dotted_name(kind) in _NUMBER_TYPES for kind in tested[1])
    )


def _optional_tensor_arm(receiver: ast.expr, node: ast.AST, scope: ast.AST, ctx: Context) -> bool:
    """``head = int(skip_head.item()) if isinstance(skip_head, torch.Tensor) else
    int(skip_head)`` of a parameter with a default (``skip_head=None``): the function takes
    a number or a tensor and says so; nothing says its callers hand it a device tensor."""
    root = receiver
    while isinstance(root, ast.Call) and isinstance(root.func, ast.Attribute):
        root = root.func.value
    if not isinstance(root, ast.Name) or not isinstance(
        scope, (ast.FunctionDef, ast.AsyncFunctionDef)
    ):
        return False
    if root.id not in parameter_defaults(scope):
        return False
    child = node
    for parent in reversed(ctx.parents):
        if parent is scope:
            return False
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
            in_body = child is parent.body or (
                isinstance(parent.body, list) and child in parent.body
            )
            if in_body and _tests_tensor(parent.test, root.id, ctx):
                return True
        child = parent
    return False


def _tests_tensor(test: ast.expr, name: str, ctx: Context) -> bool:
    """``torch.is_tensor(name)`` or ``isinstance(name, torch.Tensor)``."""
    tested = isinstance_test(test)
    if tested is not None:
        return tested[0] == name and any(ctx.qualname(kind) == "torch.Tensor" for kind in tested[1])
    return (
        isinstance(test, ast.Call)
        and ctx.qualname(test.func) == "torch.is_tensor"
        and len(test.args) == 1
        and isinstance(test.args[0], ast.Name)
        and test.args[0].id == name
    )


def _seeded_device(receiver: ast.expr, per_batch: PerBatch | None, ctx: Context) -> bool:
    """``lengths = lengths.cpu().numpy()`` in a function of a training step whose callers hand
    it device lengths: read before the function rebinds it, the parameter holds what the
    callers pass. (Outside training, a helper's ``output = output.cpu()`` before drawing or a
    host search is taken for the result it hands back, as the rebinding says.) The same for
    a buffer ``self.count`` made on the host in ``__init__`` of a module its callers moved
    (``self.ema(self.model)`` of a Lightning module's per-batch hook): it lives on the device."""
    if per_batch is None or not per_batch.seeds:
        return False
    sides = [receiver.left, *receiver.comparators] if isinstance(receiver, ast.Compare) else []
    on_self = any((dotted_name(x) or "").startswith("self.") for x in [receiver, *sides])
    if not per_batch.trains and not (MOVED_SELF in per_batch.seeds and on_self):
        return False
    scope = scope_node(ctx)
    found = file_facts(ctx).fact(receiver, scope, per_batch.seeds, _enclosing_comps(ctx, receiver))
    return found is not None and found.on_device


def _read_before_its_move(receiver: ast.expr, read: ast.AST, ctx: Context) -> bool:
    """``speech, lengths = extract(data)``, ``n = lengths.sum().item()``, then ``lengths =
    lengths.to(device)``: the innermost loop binds the read name itself above the read (not by
    a move) and moves it only below, so at the read it still holds this step's host value."""
    root = receiver
    while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
        root = root.func if isinstance(root, ast.Call) else root.value
    loops = ctx.loops()
    line = getattr(read, "lineno", None)
    if not (isinstance(root, ast.Name) and loops and line is not None):
        return False
    name, loop = root.id, loops[-1]
    bound = isinstance(loop, (ast.For, ast.AsyncFor)) and name in names_in(loop.target)
    moved_after = False
    for sub in walk_body(getattr(loop, "body", [])):
        if isinstance(sub, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
            if name in names_in(sub.target):
                return False  # rebound some other way: not worth following
            continue
        if not isinstance(sub, ast.Assign):
            continue
        for target in sub.targets:
            for part, value in _paired(target, sub.value):
                if not (isinstance(part, ast.Name) and part.id == name):
                    if name in names_in(part):
                        return False
                    continue
                if value is not None and _moves_itself(value, name):
                    if sub.lineno <= line:
                        return False  # moved above the read
                    moved_after = True
                elif sub.lineno < line:
                    bound = True
    return bound and moved_after


def _paired(target: ast.expr, value: ast.expr) -> list[tuple[ast.expr, ast.expr | None]]:
    """``a, b = x, y`` as ``(a, x), (b, y)``; a target whose value is not spelled out gets
    None."""
    if isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            return [p for t, v in zip(target.elts, value.elts, strict=True) for p in _paired(t, v)]
        return [(elt, None) for elt in target.elts]
    return [(target, value)]


def _moves_itself(value: ast.expr, name: str) -> bool:
    """``x.to(device)``, ``x.cuda()`` (also ``x.float().to(device)``) of the name ``name``."""
    if not (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in {"to", "cuda"}
        and not any(_is_cpu_arg(arg) for arg in [*value.args, *(k.value for k in value.keywords)])
    ):
        return False
    inner: ast.expr = value.func.value
    while isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute):
        inner = inner.func.value
    return isinstance(inner, ast.Name) and inner.id == name


def _is_cpu_arg(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value == "cpu"


def _per_element(ctx: Context, line: int | None) -> bool:
    """The read sits in a loop nested in the step (the loop at ``line``; ``None``: in any loop
    of a function that runs per batch) that walks the step's rows, classes or detections: one
    copy per element (``for j in range(n): rows.append(out[j].cpu())``), not the step's one
    bulk output. A loop over a few constants (``for key in ("a", "b"):``) does not count, nor
    one that writes each element out itself (``Image.fromarray(img).save(...)`` per image:
    the element's file is the output)."""
    loops = ctx.loops()
    start = 0
    if line is not None:
        found = [i for i, loop in enumerate(loops) if getattr(loop, "lineno", 0) == line]
        if not found:
            return False
        start = found[-1] + 1
    scope = scope_node(ctx)
    facts = file_facts(ctx)

    def walks_parts(loop: ast.AST) -> bool:
        if isinstance(loop, ast.While):
            return True
        if not isinstance(loop, (ast.For, ast.AsyncFor)) or _few_constants(loop.iter, scope):
            return False
        if _walks_ranks(loop.iter):
            return False  # `for src in range(num_gpus):` the same tensor, from each rank
        kind = facts.loop_kind(loop, scope)
        return kind is None or kind[0] != "items"  # a list of whole tensors: bulk copies

    inner = [loop for loop in loops[start:] if walks_parts(loop)]
    if not inner and line is not None and walks_parts(loops[start - 1]):
        # the step loop itself walks the parts of an outer step (`for j in range(classes):`
        # inside the loop over images): its own recomputed slices make it look like a step
        outer = loops[: start - 1]
        if any((kind := facts.loop_kind(loop, scope)) and kind[0] == "batch" for loop in outer):
            inner = [loops[start - 1]]
    if not inner:
        return False
    return not any(isinstance(sub, ast.Call) and _writes(sub) for sub in walk(inner[-1]))


def _feeds_device(loop: ast.AST) -> bool:
    """A loop that moves each input it takes to the device (``for x in batches:``, or
    ``x = next(data)``, then ``model(x.to(device))``): a pipeline from host data to results,
    whose read back of each step's result is that step's output. A decoding loop that feeds
    its own last token back is not one."""
    if not isinstance(loop, (ast.For, ast.AsyncFor, ast.While)):
        return False
    if isinstance(loop, ast.While) and not _while_counter(loop):
        return False
    inputs, nodes = loop_items(loop, _reads_next)
    inputs = set(inputs)
    counter = isinstance(loop, ast.While) or _counts(loop.iter)
    chunks = _chunks(loop, nodes) if counter else set()
    inputs |= chunks
    placed = set(chunks)  # what a call given the device may place as this turn's input
    if not counter or chunks:
        # a loop over data (not `range(n)`, a decoding loop's counter, unless it slices a
        # chunk of data per turn): what it builds from each item (`chars = np.stack([pad(t)
        # for t in batch])`) is that item, prepared
        derived = inputs - _turn_names(loop) if counter else inputs
        for _ in range(3):
            for sub in nodes:
                if isinstance(sub, ast.Assign) and names_in(sub.value) & derived:
                    for target in sub.targets:
                        if isinstance(target, (ast.Name, ast.Tuple)):
                            derived |= names_in(target)
        inputs |= derived
        placed |= derived
    for sub in nodes:  # `{k: v.to(device) for k, v in batch.items()}` moves `batch` itself
        if isinstance(sub, _COMPS):
            for gen in sub.generators:
                if names_in(gen.iter) & inputs:
                    inputs |= names_in(gen.target)
    return any(
        isinstance(sub, ast.Call)
        and (
            (
                isinstance(sub.func, ast.Attribute)
                and sub.func.attr in {"to", "cuda"}
                and not any(isinstance(a, ast.Constant) and a.value == "cpu" for a in sub.args)
                and bool(names_in(sub.func.value) & inputs)
            )
            # `self.tokenize_fn(queries[i : i + bs], device=dev)`: a chunk the call places;
            # `batch = collate(batch, device)`: the item taken, placed by a project's helper,
            # also by keyword, `pipe.encode_prompt(prompt=caption, device=device)`
            or (
                _passes_device(sub)
                and any(
                    names_in(a) & (placed if _helper(sub) else chunks)
                    for a in [*sub.args, *(kw.value for kw in sub.keywords if kw.arg)]
                )
            )
        )
        for sub in nodes
    )


def _helper(call: ast.Call) -> bool:
    """A call of the project's own code, not of ``torch`` (``torch.as_tensor(v, device=d)``
    makes a tensor of a value; it does not prepare a batch)."""
    return not (dotted_name(call.func) or "").startswith("torch.")


def _turn_names(loop: ast.For | ast.AsyncFor | ast.While) -> set[str]:
    """The names that count a loop's turns: its target, or a ``while`` loop's counter."""
    return _while_counter(loop) if isinstance(loop, ast.While) else names_in(loop.target)


def _while_counter(loop: ast.While) -> set[str]:
    """``while i < len(ds):`` with ``i += bs`` in its body (open-instruct's reward scoring,
    which halves ``bs`` on an out-of-memory error): the names of its test the body steps
    forward, a counter over data as ``for i in range(0, n, bs):`` is."""
    stepped = {
        sub.target.id
        for stmt in loop.body
        for sub in walk(stmt)
        if isinstance(sub, ast.AugAssign)
        and isinstance(sub.op, ast.Add)
        and isinstance(sub.target, ast.Name)
    }
    return names_in(loop.test) & stepped


def _chunks(loop: ast.For | ast.AsyncFor | ast.While, nodes: list[ast.AST]) -> set[str]:
    """In ``for i in range(0, len(prompts), bs):``, the names bound to a slice of data the
    loop does not build, starting at the counter (``batch = prompts[i : i + bs]``): a fresh
    chunk of input each turn, not a value fed back; also the data whose slice is handed to a
    call together with the device (``tokenize(queries[i : i + bs], device=dev)``)."""
    counter = _turn_names(loop)
    built = {
        name
        for sub in nodes
        if isinstance(sub, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        for target in (sub.targets if isinstance(sub, ast.Assign) else [sub.target])
        for name in names_in(target)
    }
    found: set[str] = set()
    for sub in nodes:
        if isinstance(sub, ast.Assign) and (
            _fresh_chunk(sub.value, counter, built)
            # `batch = self.tokenize(texts[i : i + bs])`: the chunk, prepared for the model
            or (
                isinstance(sub.value, ast.Call)
                and any(_fresh_chunk(arg, counter, built) for arg in sub.value.args)
            )
        ):
            found |= {name for target in sub.targets for name in names_in(target)}
        elif isinstance(sub, ast.Call) and _passes_device(sub):
            # `self.tokenize_fn(queries[i : i + bs], device=dev)`: a chunk the call places
            found |= {
                name
                for arg in sub.args
                if isinstance(arg, ast.Subscript) and _fresh_chunk(arg, counter, built)
                for name in names_in(arg.value)
            }
    return found


def _fresh_chunk(value: ast.expr, counter: set[str], built: set[str]) -> bool:
    """``prompts[i : i + bs]``: a slice starting at the loop's counter of data the loop does
    not build (also along another axis, ``imtv[:, :, i : i + 5]``); or a list of such windows
    over the counter's range, SyncNet's ``[imtv[:, :, v : v + 5] for v in range(i, i + bs)]``."""
    if isinstance(value, ast.ListComp) and len(value.generators) == 1:
        window = value.generators[0]
        return (
            isinstance(window.iter, ast.Call)
            and call_name(window.iter) == "range"
            and bool(window.iter.args)
            and bool(names_in(window.iter.args[0]) & counter)
            and _fresh_chunk(value.elt, names_in(window.target), built)
        )
    if not isinstance(value, ast.Subscript):
        return False
    if isinstance(value.slice, ast.Subscript) and _fresh_chunk(value.slice, counter, built):
        # `ds[order[i : i + bs]]`: the rows a chunk of an index (a length sort) picks
        picked = names_in(value.value)
        return isinstance(value.value, (ast.Name, ast.Attribute)) and not picked & (built | counter)
    parts = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
    if not any(
        isinstance(part, ast.Slice) and part.lower is not None and names_in(part.lower) & counter
        for part in parts
    ):
        return False
    return isinstance(value.value, (ast.Name, ast.Attribute)) and not names_in(value.value) & (
        built | counter
    )


def _outer_feeds_device(ctx: Context, line: int) -> bool:
    """For a walk over a list of whole tensors (``for part in gathered:``, the loop at
    ``line``): its copies are the output of the step that holds it when that step takes fresh
    input (a loop that moves what it takes, or a sampling loop drawing new noise each time),
    not when it is a step that feeds its own result back (a decoding loop): then each copy is
    one per token."""
    loops = ctx.loops()
    scope = scope_node(ctx)
    facts = file_facts(ctx)
    outer = [loop for loop in loops if getattr(loop, "lineno", 0) < line]
    if not outer:
        walk_loop = next((loop for loop in loops if getattr(loop, "lineno", 0) == line), None)
        # the chunks of one tensor, or the whole tensors a value found to be a list holds
        # (`if isinstance(out, list): out = [o.cpu() for o in out]` in a per-batch helper)
        return walk_loop is not None and (
            _walks_chunks(walk_loop, scope) or narrowed_to_list(walk_loop, scope)
        )
    if any(feeds_back(loop) for loop in outer):
        return False  # no step around it: a walk over the rows of one batch's output
    for loop in reversed(outer):
        kind = facts.loop_kind(loop, scope)
        if kind is not None and kind[0] == "batch":
            return _feeds_device(loop)
    return True


def _walks_chunks(loop: ast.AST, scope: ast.AST) -> bool:
    """``for part in emb.split(64):`` (also through ``tqdm``/``enumerate``, ``torch.split``,
    or a name bound once to a split, or a slice of its chunks, ``parts[rank::num_gpus]``, a
    rank's share): the chunks of one tensor, each a fresh piece of input,
    as a kaggle solution's ``vals += [topk(part @ bank.T).cpu()]``, then ``return
    torch.cat(vals)``: a chunked inference whose copies are its output, not per-row reads."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    iterable = loop.iter
    while isinstance(iterable, ast.Call) and call_name(iterable) in {"enumerate", "tqdm"}:
        if not iterable.args:
            return False
        iterable = iterable.args[0]
    if isinstance(iterable, ast.Subscript) and isinstance(iterable.slice, ast.Slice):
        iterable = iterable.value  # `col_batches[rank::num_gpus]`: some of the chunks
    if isinstance(iterable, ast.Name):
        bound = bindings(scope).get(iterable.id, [])
        if len(bound) != 1 or bound[0] is None:
            return False
        iterable = bound[0]
    if not isinstance(iterable, ast.Call) or call_name(iterable) not in _SPLITS:
        return False
    func = iterable.func
    return isinstance(func, ast.Attribute) and (
        bool(iterable.args) or (isinstance(func.value, ast.Name) and func.value.id == "torch")
    )


_SPLITS = frozenset({"split", "chunk", "tensor_split"})


def _counts(iterable: ast.expr) -> bool:
    """``range(n)``, ``enumerate(range(n))``, ``trange(n)``: a counter, not data."""
    while (
        isinstance(iterable, ast.Call)
        and call_name(iterable) in {"enumerate", "tqdm", "reversed"}
        and iterable.args
    ):
        iterable = iterable.args[0]
    return isinstance(iterable, ast.Call) and call_name(iterable) in {"range", "trange"}


def _reads_next(value: ast.expr) -> bool:
    return (
        isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "next"
    )


def _not_batch(loop: ast.AST, scope: ast.AST, ctx: Context) -> bool:
    """A loop that does not step through batches (over a dict of losses, the rows of a
    tensor, a few names), or one over a literal display of a few items, which steps a fixed
    few times whatever its body does (``for m, name in ((ema, "ema"), (model, "model")):``
    sampling with each model): a periodic branch around it makes all of it periodic."""
    if (
        isinstance(loop, (ast.For, ast.AsyncFor))
        and isinstance(loop.iter, (ast.Tuple, ast.List))
        and 0 < len(loop.iter.elts) <= _FEW_ITEMS
        and not any(isinstance(e, ast.Starred) for e in loop.iter.elts)
    ):
        return True
    if isinstance(loop, (ast.For, ast.AsyncFor)) and isinstance(loop.iter, ast.Name):
        # the same through a name bound once to it, `VALIDATE_SEQ_LENS = (256, 512)`, in the
        # function or, when the function binds no such name, at module level
        function = ctx.function_scope()
        local = function is None or loop.iter.id in ctx.scope_bindings(function)
        module = ctx.scope.root().node
        if _few_constants(loop.iter, scope if local else module):
            return True
    kind = file_facts(ctx).loop_kind(loop, scope)
    return kind is None or kind[0] != "batch"


# A literal display this long steps a fixed few times per run of the code around it.
_FEW_ITEMS = 16


def _enclosing_comps(ctx: Context, node: ast.AST) -> tuple[ast.expr, ...]:
    """The comprehensions whose body (element, filters, later generators) holds ``node``,
    outermost first: their targets are names there. The first generator's iterable is
    evaluated outside its comprehension."""
    parents = ctx.parents
    found: list[ast.expr] = []
    for index, parent in enumerate(parents):
        if isinstance(parent, _COMPS):
            child = parents[index + 1] if index + 1 < len(parents) else node
            if child is not parent.generators[0].iter:
                found.append(parent)
    return tuple(found)


_MAIN_GUARD = re.compile(r"^if\s+__name__\s*==", re.M)


def _host_only_file(ctx: Context) -> bool:
    """A script that never names a device, an accelerator or a placement, or only the CPU
    (:func:`~.facts.names_no_device`; minimalRL's ``a3c.py``, a tutorial's
    ``05_linear_regression.py``): its models and tensors stay on the
    CPU, where reading a loss of unknown origin (``loss.item()``) waits for nothing. A script
    runs itself (a ``__main__`` block, or the read in its module-level code; a notebook,
    whose cells call the functions it defines, as d2l's ``train_ch3(net, ...)``; module-level
    statements that train through its functions, :func:`~.facts.cpu_only_program`); a library
    module's tensors come from its callers (an agent's ``update(rollouts)``)."""
    root = ctx.scope.root()
    cached: tuple[bool, bool] | None = root.cache.get("host-only")
    if cached is None:
        text = "\n".join(ctx.lines())
        runs = ctx.path.endswith(".ipynb") or _MAIN_GUARD.search(text) is not None
        cached = (names_no_device(ctx), runs)
        root.cache["host-only"] = cached
    host_only, runs_itself = cached
    return host_only and (runs_itself or ctx.function_scope() is None or cpu_only_program(ctx))


def _in_loop(
    node: ast.AST,
    what: str,
    text: str,
    fact: Fact | None,
    step: tuple[str, int, str],
    ctx: Context,
    *,
    explicit: bool,
    bulk: bool,
    read: ast.AST | None,
) -> bool:
    """Report a read inside the loop ``step`` names (its kind, line and evidence)."""
    kind, line, evidence = step
    if fact is None and (not explicit or kind != "batch" or _host_only_file(ctx)):
        return False
    if _narrowed_to_host(text, node, ctx):
        return False  # `if isinstance(value, float): print(f"{value:.4f}")`: a Python number
    if bulk and _fills_store(read or node, ctx):
        return False  # store.index_copy_(0, i, x.cpu()): filling a host buffer is the job
    if explicit and _steps_environment(read or node, ctx):
        return False  # `envs.step(action.cpu().numpy())`: a host environment's input
    if not _trains(ctx) and _yielded(read or node, ctx):
        return False  # `token = next_ids.item()`, then `yield token`: the stream's output
    once = _feeds_device(ctx.loops()[-1]) if kind == "batch" else False
    if kind == "items":
        once = _outer_feeds_device(ctx, line)
    if (
        bulk
        and not _trains(ctx)
        and not _per_element(ctx, line)
        # a row's copy counts only when a model ran on the row and the loop's statement
        # writes it out (`vocoder(mel).cpu()`, each utterance its own file): a row itself
        # could be copied once, as its batch, and a comprehension's copies joined after it
        and (kind != "rows" or (_ran_on_row(read or node) and not _enclosing_comps(ctx, node)))
        and _is_output(read or node, ctx, returns=once and kind != "rows")
    ):
        return False  # the copy to the host is the loop's output (images, a response, samples)
    if bulk and kind == "batch" and not _trains(ctx) and _decoded_batch(read or node, ctx):
        return False  # `cont.tolist()` of a batch's generated ids, decoded into its texts
    if bulk and kind == "batch" and not _trains(ctx) and _feeds_host_metric(read or node, ctx):
        return False  # `evaluator.add_batch(target, pred)`: a NumPy metric updated each step
    if bulk and kind == "items" and not _trains(ctx) and _walks_gathered(ctx):
        return False  # `[s.cpu().numpy() for s in gathered]`: each rank's whole output
    if kind == "rows":
        where = f"in the loop at line {line}, once per row of a device tensor,"
    elif kind == "items":
        where = f"in the loop at line {line}, once per device tensor of a list,"
    else:
        where = f"in the batch loop at line {line}"
    cause = fact.describe() if fact is not None else evidence
    ctx.report(
        SYNC_IN_LOOP.code,
        node,
        f"{what} of `{text}` {where} makes the host wait for the device on every step "
        f"({cause}); {_ADVICE}",
    )
    return True


def _ran_on_row(read: ast.AST) -> bool:
    """The copy ``read`` reads what a call other than a tensor method computed, through tensor
    methods at most (``vocoder(mel).squeeze(0).cpu()``): a model run on the row."""
    value: ast.AST = read
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
        if value.func.attr not in TENSOR_METHODS and value.func.attr not in _READS:
            return True  # `vocoder.decode(mel)`
        value = value.func.value
    return isinstance(value, ast.Call)  # `vocoder(mel)`


# Types whose `isinstance` test says a value is a Python scalar or text, not a tensor.
_HOST_TYPES = frozenset({"float", "int", "bool", "str", "numbers.Number", "numbers.Real"})


def _narrowed_to_host(text: str, node: ast.AST, ctx: Context) -> bool:
    """The read's subject ``text`` (a plain name) is inside the body of an ``if`` that tests
    it to be a Python number or text (``if isinstance(value, float):``, also one test of an
    ``and``, or a tuple of such types): there it holds no tensor, whatever else it may hold."""
    if not text.isidentifier():
        return False
    line = getattr(node, "lineno", 0)
    for parent in ctx.parents:
        if not isinstance(parent, ast.If) or not parent.body:
            continue
        if not parent.body[0].lineno <= line <= (parent.body[-1].end_lineno or line):
            continue
        tests = parent.test.values if isinstance(parent.test, ast.BoolOp) else [parent.test]
        if isinstance(parent.test, ast.BoolOp) and not isinstance(parent.test.op, ast.And):
            continue
        if any(_tests_host_type(test, text) for test in tests):
            return True
    return False


def _tests_host_type(test: ast.expr, name: str) -> bool:
    """``isinstance(name, float)``, ``isinstance(name, (int, float))``."""
    tested = isinstance_test(test)
    if tested is None or tested[0] != name:
        return False
    kinds = tested[1]
    return bool(kinds) and all(dotted_name(kind) in _HOST_TYPES for kind in kinds)


_DEVICE_MARKS = (".to(", ".cuda(", "device=", "backward")
_HOST_FUNCS = frozenset({"len", "str", "repr", "type", "int", "float", "round", "id", "hex"})


def _moved_value(
    receiver: ast.expr,
    scope: ast.AST,
    comps: tuple[ast.expr, ...],
    ctx: Context,
    facts: FileFacts,
) -> bool:
    """``receiver`` holds a value the code moved (or a moved model produced): by the
    function's own flow when it shows device work and knows where the value lives; otherwise
    through the device values its per-batch callers hand it (``converter.decode(preds)``,
    called from a batch loop with the model's output, tests each element in a loop;
    ``mel_spectrogram(y)``, called with the generator's output every batch, tests
    ``torch.min(y) < -1``); outside a loop only a torch call or a tensor reduction of such a
    value counts (a bare name may be anything the callers pass), or a buffer of the module
    (``int(self.queue_ptr)``), a tensor by its declaration."""
    mentions = _mentions_device(ctx)
    # outside a loop, only a torch call or a tensor reduction of what the callers hand in
    by_form = (
        bool(ctx.loops())
        or isinstance(receiver, ast.Compare)
        or _torch_value(receiver, ctx)
        or _bound_to_torch_values(receiver, ctx)
        or _reads_buffer(receiver, scope, ctx)
        or _arithmetic_of_forms(receiver, ctx)
    )
    handed = by_form and _handed_in(receiver, scope, ctx)
    if not (mentions or handed):
        return False
    # most functions are not per batch: ask before any flow
    per_batch = facts.per_batch(scope) if handed else None
    seeds = per_batch.seeds if per_batch is not None else None
    if mentions and not seeds:
        early = facts.fact(receiver, scope, comps=comps)
        return early is not None and early.moved
    if not seeds:
        return False
    early = facts.fact(receiver, scope, comps=comps)
    # a buffer made on the host in `__init__` lives where the callers moved the module
    moved_buffer = MOVED_SELF in seeds and _reads_buffer(receiver, scope, ctx)
    if early is not None and not moved_buffer:  # else a value this function makes itself
        return early.moved and (mentions or bool(facts.given(scope)))
    seeded = facts.fact(receiver, scope, seeds, comps)
    return seeded is not None and seeded.moved


def _arithmetic_of_forms(node: ast.expr, ctx: Context) -> bool:
    """``2 * inter``, ``torch.sum(sr) + torch.sum(gt)``: arithmetic of numbers and of torch
    values by their form (a torch call, a tensor reduction, a name bound only to such), with
    at least one of those."""
    if not isinstance(node, ast.BinOp):
        return False
    sides = (node.left, node.right)
    if not all(
        (isinstance(side, ast.Constant) and isinstance(side.value, (int, float)))
        or _torch_value(side, ctx)
        or _bound_to_torch_values(side, ctx)
        or _arithmetic_of_forms(side, ctx)
        for side in sides
    ):
        return False
    return not all(isinstance(side, ast.Constant) for side in sides)


def _bound_to_torch_values(receiver: ast.expr, ctx: Context) -> bool:
    """``corr = torch.sum(pred == target)``, then ``float(corr)``: a name the function binds
    only to torch calls or tensor reductions, a tensor by its form, not whatever the callers
    pass (as a bare parameter may be)."""
    if not isinstance(receiver, ast.Name):
        return False
    scope = ctx.function_scope()
    if scope is None:
        return False
    values = ctx.scope_bindings(scope).get(receiver.id) or []
    return bool(values) and all(value is not None and _torch_value(value, ctx) for value in values)


def _handed_in(receiver: ast.expr, scope: ast.AST, ctx: Context) -> bool:
    """Read from what the callers of a called function hand it (on every call, and over and
    over when in a loop), or from a buffer of the module it runs on (``int(self.queue_ptr)``
    in a method of a module its callers moved)."""
    return _called_here(scope, ctx) and (
        _reads_parameter(receiver, scope, ctx) or _reads_buffer(receiver, scope, ctx)
    )


def _reads_buffer(receiver: ast.expr, scope: ast.AST, ctx: Context) -> bool:
    """``receiver`` is ``self.<name>`` (or a part of it) for a buffer or parameter of the
    method's module class (``self.register_buffer("queue_ptr", ...)``): a tensor that lives
    where the module was moved; or a comparison of one (``self.num_updates >= 0``)."""
    if isinstance(receiver, ast.Compare):
        sides = (receiver.left, *receiver.comparators)
        return any(_reads_buffer(side, scope, ctx) for side in sides)
    node = receiver
    while isinstance(node, (ast.Subscript, ast.Call)):
        node = node.value if isinstance(node, ast.Subscript) else node.func
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        # a file that registers nothing needs no facts built to say so
        and ("register_buffer" in ctx.source or "Parameter(" in ctx.source)
        and file_facts(ctx).registered_tensor(scope, node.attr)
    )


def _parameter_names(scope: ast.AST) -> set[str] | None:
    """The parameters of a function ``scope`` but ``self`` and ``cls``; None for another
    scope (a class body, a module)."""
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    arguments = scope.args
    params = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
    return params - {"self", "cls"}


def _reads_parameter(receiver: ast.expr, scope: ast.AST, ctx: Context) -> bool:
    """``receiver`` reads a parameter of ``scope`` (not ``self``), directly or through a name
    bound from one (``t = text_index[i]``, then ``t[j]``), four bindings deep (a loss computed
    in steps: ``g = torch.log(pred) - torch.log(target)``, ``dg = torch.var(g)``, ``loss =
    torch.sqrt(dg)``)."""
    params = _parameter_names(scope)
    if params is None:
        return False
    function = ctx.function_scope()
    bindings = ctx.scope_bindings(function) if function is not None else {}
    # the rows of a parameter a loop walks, for a computed read of them (a bare loop name may
    # be any row: a file name of the batch)
    rows = _loop_rows(scope) if not isinstance(receiver, ast.Name) else {}
    names = names_in(receiver)
    for _ in range(5):
        if names & params:
            return True
        names = {
            n
            for name in names
            for v in [*(bindings.get(name) or []), *rows.get(name, [])]
            if v
            for n in names_in(v)
        }
    return False


def _loop_rows(scope: ast.AST) -> dict[str, list[ast.expr]]:
    """The names a loop of ``scope`` binds to the rows of what it iterates -> what that is
    (``for ids, embeds in zip(input_ids, inputs_embeds):``: each name to the ``zip``); found
    once per scope."""
    return kept("loop-rows", scope, _find_loop_rows)


def _find_loop_rows(scope: ast.AST) -> dict[str, list[ast.expr]]:
    found: dict[str, list[ast.expr]] = {}
    for sub in own_nodes(scope):
        if isinstance(sub, (ast.For, ast.AsyncFor)):
            for name in names_in(sub.target):
                found.setdefault(name, []).append(sub.iter)
    return found


def _unplaced_step_value(
    receiver: ast.expr, read: ast.AST | None, ctx: Context, *, bulk: bool
) -> bool:
    """In a function that is a training step by its own body (no caller says what it is
    given), a value of unknown place that may well be on the host: in a file that never names
    a device (a CPU policy's ``value.item()``), what the step is handed (``batch["lengths"]``),
    or a bulk copy handed on to another object (``mem.update_priorities(idx,
    loss.cpu().numpy())``: host data for a host structure, such as a replay's sum tree)."""
    if names_no_device(ctx):
        return True
    scope = scope_node(ctx)
    if _handed_value(receiver, scope, ctx) and not _backpropagated(receiver, scope):
        return True
    if not bulk or read is None or not ctx.parents:
        return False
    parent = ctx.parents[-1]
    return (
        isinstance(parent, ast.Call)
        and read in parent.args
        and isinstance(parent.func, ast.Attribute)
        and ctx.qualname(parent.func) is None
    )


def _backpropagated(receiver: ast.expr, scope: ast.AST) -> bool:
    """``receiver`` is (a view of) a parameter the step itself backpropagates from, ``def
    take_step(self, optimizer, loss):`` with ``loss.backward()``: the loss of the model being
    trained, a graph's output where the model runs, not data as the caller loaded it."""
    root = _root_name(receiver)
    if root is None or not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    return any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "backward"
        and isinstance(sub.func.value, ast.Name)
        and sub.func.value.id == root
        for sub in walk(scope)
    )


def _handed_value(receiver: ast.expr, scope: ast.AST, ctx: Context) -> bool:
    """``receiver`` is a parameter of ``scope`` (not ``self``) or a part of one, directly or
    through a name bound only to such parts (``lengths = batch["lengths"]``): data as the
    caller handed it, not a value the function computed."""
    params = _parameter_names(scope)
    if params is None:
        return False
    function = ctx.function_scope()
    found = ctx.scope_bindings(function) if function is not None else {}
    root = _root_name(receiver)
    for _ in range(3):
        if root is None:
            return False
        if root in params:
            return True
        values = found.get(root) or [None]
        if any(value is None for value in values):
            return False
        roots = {_root_name(value) for value in values if value is not None}
        if len(roots) != 1:
            return False
        root = roots.pop()
    return False


# Methods that hand back a view or a cast of the same data, not a computation on it.
_VIEWS = frozenset(
    {"float", "long", "int", "bool", "half", "double", "detach", "view", "reshape"}
    | {"squeeze", "unsqueeze", "contiguous", "clone", "flatten"}
)


def _root_name(node: ast.expr) -> str | None:
    """The name a chain of items, attributes, views and casts starts from (``batch`` for
    ``batch["x"].float()``); ``None`` for anything else (an operation, a method that computes,
    ``engine.loss_fn(out)``, a call of a name)."""
    while True:
        if isinstance(node, (ast.Subscript, ast.Attribute)):
            node = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _VIEWS
        ):
            node = node.func.value
        else:
            break
    return node.id if isinstance(node, ast.Name) else None


def _arithmetic_of_values(node: ast.expr, stepped: frozenset[str] = frozenset()) -> bool:
    """Arithmetic with an operand that may hold a tensor's data: a name, an element or a call
    (``bbox[0] / scale``, ``running_mfu * 100``), or an attribute the loop accumulates into
    (``stepped``: ``self.tokens += (y >= 0).sum()``), not only sizes and settings
    (``int(x.shape[-2] / model.patch_embed.patch_size)``: a shape over a module's setting)."""
    if isinstance(node, ast.BinOp):
        return _arithmetic_of_values(node.left, stepped) or _arithmetic_of_values(
            node.right, stepped
        )
    if isinstance(node, ast.UnaryOp):
        return _arithmetic_of_values(node.operand, stepped)
    if isinstance(node, ast.Subscript) and _host_syntax(node.value):
        return False  # `x.shape[-2]`
    if isinstance(node, ast.Attribute) and dotted_name(node) in stepped:
        return True
    return isinstance(node, (ast.Name, ast.Subscript, ast.Call)) and not _host_syntax(node)


def _stepped_attributes(loops: list[ast.AST] | tuple[ast.AST, ...]) -> frozenset[str]:
    """The attributes the innermost loop accumulates into (``self.tokens += n``)."""
    if not loops:
        return frozenset()
    return frozenset(
        name
        for sub in walk(loops[-1])
        if isinstance(sub, ast.AugAssign)
        and isinstance(sub.target, ast.Attribute)
        and (name := dotted_name(sub.target)) is not None
    )


def _host_syntax(node: ast.expr) -> bool:
    """Plainly a host value: a literal, ``len(x)``, ``x.shape``, ``x.dtype``, a string op."""
    if isinstance(node, (ast.Constant, ast.JoinedStr)):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        # `"Model: " + response`: a string joined to a string (a tensor beside a str raises)
        return any(
            isinstance(side, ast.JoinedStr)
            or (isinstance(side, ast.Constant) and isinstance(side.value, str))
            for side in (node.left, node.right)
        )
    if isinstance(node, ast.Attribute):
        # a dunder (`module.__class__`, `fn.__qualname__`) is Python's own data, never a tensor
        dunder = node.attr.startswith("__") and node.attr.endswith("__")
        return dunder or node.attr in {"shape", "dtype", "device", "ndim", "name"}
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name):
            return func.id in _HOST_FUNCS
        return isinstance(func, ast.Attribute) and func.attr in {"item", "tolist", "join", "size"}
    return False


def _mentions_device(ctx: Context) -> bool:
    """The enclosing function's text (or the module's) shows device work at all."""
    scope = ctx.function_scope() or ctx.scope
    cached = scope.cache.get("mentions-device")
    if cached is None:
        node = scope.node
        if isinstance(node, ast.Module):
            text = ctx.source
        else:
            lines = ctx.lines()
            start = getattr(node, "lineno", 1) - 1
            text = "\n".join(lines[start : getattr(node, "end_lineno", start + 1)])
        cached = scope.cache["mentions-device"] = any(mark in text for mark in _DEVICE_MARKS)
    return bool(cached)


def _called_here(scope: ast.AST, ctx: Context) -> bool:
    """``scope`` is a function something calls: by name in its file, as an ``Engine``'s
    process function, or, at module level, from a module beside it that imports it
    (``greedy_generate(model, ...)`` called per prompt from ``run_streaming.py``)."""
    name = getattr(scope, "name", None)
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) or name is None:
        return False
    facts = file_facts(ctx)
    if name.startswith("__") and name.endswith("__"):
        # __init__, __call__, ...: not called by this name (`self.__helper()` is); a
        # stopping criterion's `__call__` is called by `generate`, once per token; another
        # `__call__` runs when an instance is called (`compute_loss(pred, targets)`)
        if name == "__call__" and facts.per_batch(scope) is not None:
            return True
        return decode_hook(facts, scope)
    if name.endswith(("_step", "_step_end")) and name.split("_")[0] in _STAGES:
        return True  # Lightning's step hooks: the framework calls them once per batch
    if name == "forward" and _module_class_method(facts, scope):
        return True  # `loss = criterion(pred, y)` runs the module's `forward` by its instance
    if openmmlab_step(facts, scope):
        return True  # OpenMMLab's runner calls a head's `loss`, a hook's `after_train_iter`
    top = facts.parent.get(id(scope)) is facts.tree
    key = f"called:{name}:{top}"
    cache = ctx.scope.root().cache  # per file: the answer depends on the name (and level) only
    cached = cache.get(key)
    if cached is None:
        cached = cache[key] = (
            call_words(facts).called.get(name, 0) > 1
            or engine_step(facts, name)
            or (top and imported_by_siblings(facts, name))
        )
    return bool(cached)


_STAGES = frozenset({"training", "validation", "test", "predict", "train", "eval", "val", "valid"})


def _module_class_method(facts: FileFacts, scope: ast.AST) -> bool:
    """A method of a module-level class."""
    owner = facts.parent.get(id(scope))
    return isinstance(owner, ast.ClassDef) and facts.parent.get(id(owner)) is facts.tree


def _module_level(ctx: Context) -> bool:
    """A module-level function, or a method of a module-level class: other modules of the
    package may call it per batch (``model.get_step()`` on the model a script trains)."""
    scope = ctx.function_scope()
    if scope is None or scope.parent is None:
        return False
    if scope.parent.kind == "module":
        return True
    owner = scope.parent
    return owner.kind == "class" and owner.parent is not None and owner.parent.kind == "module"


def _yielded(read: ast.AST, ctx: Context) -> bool:
    """A generator hands the read's result out as one item of its stream, right away
    (``yield x.item()``) or through the name its statement binds, yielded next in the loop
    (nanochat's ``token = next_ids.item()``, then ``yield token``): the consumer receives
    each token as it is decoded, the stream's output. So is a read of a name the loop yields
    as it is (``if next_token.item() in stop_ids: break``, then ``yield next_token``): the
    consumer reads that token anyway, the stop test only reads it first."""
    loops = ctx.loops()
    receiver = _read_receiver(read)
    if loops and receiver is not None and _yields_name(loops[-1], receiver):
        return True
    node = read
    for parent in reversed(ctx.parents):
        if isinstance(parent, (ast.Yield, ast.YieldFrom)):
            return True
        if isinstance(parent, ast.stmt):
            stmt = parent
            break
        node = parent
    else:
        return False
    name = assigned_name(stmt, node)
    if name is None:
        return False
    loop = ctx.loops()[-1] if ctx.loops() else None
    return loop is not None and _flows_to_yield(loop, name)


def _flows_to_yield(loop: ast.AST, name: str) -> bool:
    """``name`` is yielded in ``loop`` as it is, or every step through what the host makes of
    it (sam2's demo server: ``masks = (...).cpu().numpy()``, ``rles = encode(masks)``, then
    ``yield Response(frame, rles)`` in the loop's body itself): each item of the stream is
    built from it on the host. A yield under a branch (FastChat's every ``stream_interval``
    tokens) hands out only some steps' reads, and ``yield start, steps`` of the read itself
    beside others could hand the tensor out as it is."""
    if _yields_name(loop, name):
        return True
    derived = {name}
    assigns = sorted(
        (sub for sub in walk(loop) if isinstance(sub, (ast.Assign, ast.AnnAssign))),
        key=lambda sub: (sub.lineno, sub.col_offset),
    )
    for assign in assigns:
        if assign.value is not None and _mentions(assign.value, derived):
            targets = assign.targets if isinstance(assign, ast.Assign) else [assign.target]
            for target in targets:
                derived.update(n.id for n in walk(target) if isinstance(n, ast.Name))
    derived.discard(name)
    return any(
        isinstance(stmt, (ast.Expr, ast.Assign))
        and isinstance(stmt.value, (ast.Yield, ast.YieldFrom))
        and stmt.value.value is not None
        and _mentions(stmt.value.value, derived)
        for stmt in getattr(loop, "body", [])
    )


def _read_receiver(read: ast.AST) -> str | None:
    """``next_token`` of ``next_token.item()`` (also through ``.cpu()``/``.detach()``)."""
    node = read
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"item", "tolist", "cpu", "numpy", "detach"}
        and not node.args
    ):
        node = node.func.value
    return node.id if isinstance(node, ast.Name) and node is not read else None


def _yields_name(loop: ast.AST, name: str) -> bool:
    return any(
        isinstance(sub, ast.Yield) and isinstance(sub.value, ast.Name) and sub.value.id == name
        for sub in walk(loop)
    )


def _trains(ctx: Context) -> bool:
    """The enclosing function calls ``.backward()``: a training step, not an output loop. At
    a script's top level (a notebook's cells), the outermost loop around the read does: a
    notebook that trains in one cell and predicts in a later one has an output loop there.
    In a function that is no training step itself, the innermost batch loop around the read
    decides: a validation loop written inside ``train()`` beside the training loop trains
    nothing."""
    scope = ctx.function_scope() or ctx.scope
    loops = ctx.loops() if ctx.function_scope() is None else []
    node = loops[0] if loops else scope.node
    if not _backpropagates(node, scope):
        return False
    function = ctx.function_scope()
    if (
        function is not None
        and isinstance(function.node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and not step_parts(function.node)[0]
    ):
        # the innermost batch loop around the read, when it has no step of its own and the
        # function is no training step itself: a validation loop written inside `train()`,
        # beside the training loop
        batch = _innermost_batch_loop(ctx)
        if batch is not None and not _steps_anywhere(batch):
            return False
    return True


def _backpropagates(node: ast.AST, scope: Scope) -> bool:
    """``node`` calls ``.backward()`` somewhere (cached on ``scope``)."""
    key = f"trains:{id(node)}"
    cached = scope.cache.get(key)
    if cached is None:
        cached = scope.cache[key] = any(
            isinstance(sub, ast.Attribute) and sub.attr == "backward" for sub in walk(node)
        )
    return bool(cached)


def _walks_gathered(ctx: Context) -> bool:
    """The innermost loop walks the list a ``dist.all_gather(gathered, x)`` (or a gather to
    one rank) of the function fills: one whole tensor per rank (a sampler's outputs gathered to be saved), in no loop
    that feeds its own result back."""
    loops = ctx.loops()
    parts = _parts(loops[-1]) if loops else None
    if parts is None or any(feeds_back(outer) for outer in loops[:-1]):
        return False  # a decoding loop's gathered tokens: one copy per token
    names = {it.id for it in parts[0] if isinstance(it, ast.Name)}
    facts = file_facts(ctx)
    return bool(names) and any(
        isinstance(sub, ast.Call)
        and isinstance(received := _gathered_into(sub, facts), ast.Name)
        and received.id in names
        for sub in walk(scope_node(ctx))
    )


def _walks_gathered_sizes(loops: list[ast.AST], facts: FileFacts, scope: ast.AST) -> bool:
    """One of ``loops`` (or comprehensions) walks each rank's packed size that an all-gather
    hands back, ``[t.item() for t in all_T]`` after ``dist.all_gather(all_T, torch.tensor([n],
    device=d))``: a function run per batch reads them once per rank, not per batch."""
    for loop in loops:
        parts = _parts(loop)
        if parts is not None and _gathers_host_values(facts, parts[0], scope):
            return True
    return False


def _innermost_batch_loop(ctx: Context) -> ast.AST | None:
    facts = file_facts(ctx)
    scope = scope_node(ctx)
    for loop in reversed(ctx.loops()):
        kind = facts.loop_kind(loop, scope)
        if kind is not None and kind[0] == "batch":
            return loop
    return None


def _steps_anywhere(loop: ast.AST) -> bool:
    """The loop calls ``.backward()``, ``.step()`` or ``.zero_grad()``, or a function named
    for a training step (``train_step(batch)``): training, not evaluating."""
    for sub in walk(loop):
        if isinstance(sub, ast.Attribute) and sub.attr in {"backward", "zero_grad"}:
            return True
        if isinstance(sub, ast.Call):
            name = (call_name(sub) or "").lower()
            if name == "step" or ("train" in name and "step" in name):
                return True
    return False


def _text(node: ast.AST, ctx: Context) -> str:
    text = " ".join((ctx.segment(node) or "the value").split())
    return text if len(text) <= 40 else text[:37] + "..."


def _backend_test(test: ast.expr) -> bool:
    """``device.type == "cuda"``, ``x.is_cuda``, ``torch.cuda.is_available()``: a test of the
    backend, the same answer on every step."""
    return any(
        (isinstance(sub, ast.Constant) and sub.value == "cuda")
        or (isinstance(sub, ast.Attribute) and sub.attr in {"is_cuda", "is_available"})
        for sub in walk(test)
    )


# Methods that read a clock: CUDA events, `time.*`, and a timer object's start and stop
# (detectron's and maskrcnn-benchmark's `Timer.tic()`/`toc()`, MATLAB's spelling).
_CLOCK_METHODS = frozenset({"elapsed_time", "record", "perf_counter", "time", "tic", "toc"})


def _flag_test(test: ast.expr, loop: ast.AST) -> bool:
    """``if timer:``, ``if timer is not None:``, ``if not args.profile:``: a test of a name (or
    an attribute of one) that the loop never rebinds holds on every step or on none; also
    with the steps after a warm-up, ``if count_time and i >= 5:``."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_flag_test(value, loop) for value in test.values) and all(
            _flag_test(value, loop) or _past_warm_up(value, loop) for value in test.values
        )
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test = test.operand
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Is, ast.IsNot))
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    ):
        test = test.left
    root = test
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name):
        return False
    return not any(
        isinstance(sub, ast.Name) and sub.id == root.id and isinstance(sub.ctx, ast.Store)
        for sub in walk(loop)
    )


def _past_warm_up(test: ast.expr, loop: ast.AST) -> bool:
    """``i >= 5`` (or ``i > 5``) with ``i`` the loop's counter: every step after the first few."""
    return (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Gt, ast.GtE))
        and isinstance(test.left, ast.Name)
        and isinstance(test.comparators[0], ast.Constant)
        and isinstance(loop, (ast.For, ast.AsyncFor))
        and test.left.id in counter_names(loop)
    )


def _warms_up(loop: ast.AST, ctx: Context) -> bool:
    """``for _ in range(n_warmup): fn(); torch.cuda.synchronize()`` followed in its block by a
    loop that times each step (``time_s = time.time()``, ``fn()``, ``synchronize()``,
    ``time_e = time.time()``): a benchmark's warm-up, synchronised as the timed steps are."""
    for block, index in ctx.stmt_path:
        if block[index] is loop:
            later = block[index + 1 :]
            return any(
                isinstance(stmt, (ast.For, ast.While)) and _times_each_step(stmt, ctx)
                for stmt in later
            )
    return False


def _times_each_step(loop: ast.AST, ctx: Context) -> bool:
    """A loop that reads a timer each step synchronizes on purpose, to time each step."""
    key = f"times-each-step:{id(loop)}"
    cached = ctx.scope.cache.get(key)
    if cached is not None:
        return bool(cached)
    body: list[ast.AST] = (
        [*loop.body, *([loop.test] if isinstance(loop, ast.While) else [])]
        if isinstance(loop, (ast.For, ast.AsyncFor, ast.While))
        else [loop]
    )
    result = False
    for stmt in body:
        if (
            isinstance(stmt, ast.If)
            and not _backend_test(stmt.test)
            and not _flag_test(stmt.test, loop)
        ):
            continue  # a clock read in a logging branch times the interval, not each step
        # (a branch on the backend, `if device.type == "cuda":` around CUDA events, or on a
        # flag the loop never rebinds, `if timer:`, runs on every step or on none: its clock
        # reads time each step)
        for sub in walk(stmt):
            if isinstance(sub, ast.Call):
                name = ctx.call_qualname(sub)
                if name in TIMERS or (
                    isinstance(sub.func, ast.Attribute) and sub.func.attr in _CLOCK_METHODS
                ):
                    result = True
                elif isinstance(sub.func, ast.Name) and "time" in sub.func.id.lower():
                    result = True  # a project's own clock helper (time_sync(), timer())
                elif _method_reads_clock(sub, ctx):
                    result = True  # `self._print_stats(i)`, whose body reads `time.time()`
            if result:
                break
        if result:
            break
    ctx.scope.cache[key] = result
    return result


def _method_reads_clock(call: ast.Call, ctx: Context) -> bool:
    """``self.method(...)`` of the class, whose own statements (not a branch of them) read a
    clock on every call (SeqTrack's ``_print_stats``, ``current_time = time.time()``)."""
    scope = ctx.function_scope()
    if scope is None or not (
        isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "self"
    ):
        return False
    method = file_facts(ctx).local_def(call.func, scope.node)
    return method is not None and any(
        isinstance(sub, ast.Call) and ctx.call_qualname(sub) in TIMERS
        for stmt in method.body
        if not isinstance(stmt, ast.If)
        for sub in walk(stmt)
    )


FAMILY = Family(
    rules=(SYNC_IN_LOOP, SYNCHRONIZE_IN_LOOP),
    checks=(
        (ast.Call, _call, (SYNC_IN_LOOP.code, SYNCHRONIZE_IN_LOOP.code)),
        (ast.JoinedStr, _joined, (SYNC_IN_LOOP.code,)),
        (ast.Compare, _compare, (SYNC_IN_LOOP.code,)),
        (ast.BinOp, _percent, (SYNC_IN_LOOP.code,)),
        (ast.Slice, _slice, (SYNC_IN_LOOP.code,)),
        (ast.Subscript, _subscript, (SYNC_IN_LOOP.code,)),
        (ast.If, _truth, (SYNC_IN_LOOP.code,)),
        (ast.IfExp, _truth, (SYNC_IN_LOOP.code,)),
        (ast.Assert, _truth, (SYNC_IN_LOOP.code,)),
    ),
    triggers=(
        ".item(",
        ".tolist(",
        "cpu(",  # also a project helper's call, `to_cpu(loss)` (see `helper_read`)
        *('"cpu"', "'cpu'", "cpu_device"),  # `x.to("cpu")`: a copy back, as `.cpu()` is
        "numpy(",
        *("_np(", "2np("),  # a project helper's copy, `to_np(x)` (see `helper_read`)
        "synchronize",
        ".add_scalar(",  # TensorBoard reads a tensor value with `.item()`
        ".add_scalars(",
        ".add_histogram(",  # ... and copies a whole one to NumPy
        ".add_image",
        ".add_embedding(",
        ".get_scale(",  # `GradScaler.get_scale()` reads its scale with `.item()`
        "full(",  # `torch.full(size, t[i])` reads its fill value, as `.fill_(t[i])` does
        # a factory's sizes, `torch.arange(lengths.max())` (see `_SIZED`)
        *("arange(", "linspace(", "logspace(", "zeros(", "ones(", "empty(", "rand(", "randn("),
        *("randint(", "eye(", "randperm(", "_indices("),
        *(" range(", "(range(", "randrange("),  # Python's counts, `range(n.max())` (`__index__`)
        # ... and those of the methods that shape, `x.view(valid.sum(), -1)` (see `_SHAPING`)
        *(".view(", ".reshape(", ".expand(", ".repeat(", ".new_", ".new("),
        "fill_(",
        # builtins, preceded by what can stand before them (not `call(`, `print(`, `hint(`)
        *(
            f"{lead}{name}("
            for lead in " (=["
            for name in ("float", "int", "bool", "all", "any", "min", "max")
        ),
        *(f"{lead}{name}(" for lead in " (=[+" for name in ("str", "repr")),
        "print(",
        "tensor(",  # `torch.tensor(xyxy)`: a list of 0-dim tensors read element by element
        "Tensor(",
        "math.",
        # ... also imported bare, `from math import log10`, then `10 * log10(1 / mse)`
        *(
            f"{lead}{name}("
            for lead in " (=*/+-"
            for name in ("log10", "log2", "log1p", "log", "sqrt", "exp", "floor", "ceil")
        ),
        "isnan(",
        "isinf(",
        "isfinite(",
        ".format(",
        '" %',  # `%` formatting: `"%g" % x`, `("%g" * 3) % (...)`
        "' %",
        ") %",
        'f"',
        "f'",
        *("if ", "if("),  # also written as a call, `if(x.sum() > 0):`
        " if",  # also a comprehension's filter at the end of a line
        *("while ", "while("),
        *("assert ", "assert("),
        *("] +=", "] -="),  # a NumPy count indexed by an element, `matrix[gc, dc] += 1`
        "]:",  # a slice bounded by an element, `x[:, lengths[i]:]`
        *("[:", ", :"),  # ... or ending at one, `x[:n]`, `mels[b, :, :lengths[b]]`
        ".narrow(",  # ... or narrowed to one, `x.narrow(0, 0, lengths[i])`
        ".data[",  # `loss.data[0]`, `.item()` before PyTorch 0.4
        "[0]",  # ... and `prec1[0]` of an accuracy beside it
        # `x.unique().numel()`, `x[m == 1].nelement()`: a count of a data-dependent result
        *("unique", "nonzero", "argwhere", "masked_select", "numel(", "nelement("),
        *("clamp", "clip"),  # `x.clamp(0, t.max())`: a tensor bound beside a number, `.item()`
        # lookup tables indexed by a device element, `vocab.itos[i]` (see `_TABLES`)
        *("itos[", "i2w[", "i2c[", "2word[", "2char[", "2label[", "2token[", "2tok["),
        *("to_word[", "to_char[", "to_label[", "to_token[", "classes[", "names["),
    ),
)
