"""TPL7xx: pinned memory and asynchronous copies (pitfalls 8 and 9)."""

from __future__ import annotations

import ast
import re

from torchplace.lint.base import (
    Context,
    Family,
    Rule,
    Scope,
    call_name,
    has_star_kwargs,
    keyword,
    names_in,
)
from torchplace.lint.nodes import own_nodes, walk
from torchplace.lint.project import pins_anywhere
from torchplace.lint.provenance import file_facts, scope_node
from torchplace.lint.provenance.flow import encodes_text
from torchplace.lint.resolver import dotted_name
from torchplace.lint.rules.facts import FACTORIES, in_periodic_branch, is_device_bound_loop

__all__ = ["FAMILY"]

PAGEABLE_NON_BLOCKING = Rule(
    "TPL701", "non-blocking-from-pageable", "`non_blocking=True` copy from unpinned memory"
)
PIN_IN_LOOP = Rule("TPL702", "pin-memory-in-loop", "`.pin_memory()` inside a device loop")

_DATALOADERS = frozenset(
    {
        "torch.utils.data.DataLoader",
        "torch.utils.data.dataloader.DataLoader",
        # webdataset's loader is a `DataLoader` that takes the same `pin_memory=`
        "webdataset.WebLoader",
        "webdataset.compat.WebLoader",
    }
)
_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "zip", "islice", "track"})
_PROGRESS_WORDS = ("log", "progress", "tqdm", "track", "meter", "metric")
_MOVING_WORDS = ("prefetch", "pin", "device", "cuda", "gpu", "prepare", "to_")


def _names_progress(name: str) -> bool:
    """A wrapper named for progress or logging, not for moving or pinning batches."""
    lowered = name.lower()
    return any(w in lowered for w in _PROGRESS_WORDS) and not any(
        w in lowered for w in _MOVING_WORDS
    )


def _call(call: ast.Call, ctx: Context) -> None:
    func = call.func
    if not isinstance(func, ast.Attribute):
        return
    if func.attr == "pin_memory" and not call.args:
        where = _pinned_per_step(ctx)
        if where is not None:
            ctx.report(
                PIN_IN_LOOP.code,
                call,
                f"`.pin_memory()` {where} allocates page-locked memory on every step; pin "
                "once: `DataLoader(pin_memory=True)` or a reused pinned staging buffer",
            )
        return
    if func.attr not in {"to", "cuda", "copy_"}:
        return
    # `async=True`: PyTorch 0.3's spelling of the flag, in code parsed with its grammar
    flag = keyword(call, "non_blocking") or keyword(call, "async")
    if flag is None or not (isinstance(flag.value, ast.Constant) and flag.value.value is True):
        return
    if func.attr == "copy_":  # `buffer.copy_(batch, non_blocking=True)`: `batch` is copied
        if not call.args:
            return
        source_node: ast.expr = call.args[0]
    else:
        target = call.args[0] if call.args else getattr(keyword(call, "device"), "value", None)
        if isinstance(target, ast.Constant) and target.value == "cpu":
            return
        source_node = func.value
    scope: Scope = ctx.function_scope() or ctx.scope
    copied = _unconverted(source_node)  # `x.float().cuda(non_blocking=True)`: `x` converted
    if isinstance(copied, ast.Call):  # torch.from_numpy(a).to(d, non_blocking=True)
        source = _fresh_pageable(copied, ctx)
        helper = None if source is not None else _pageable_helper(copied, ctx, scope)
        if helper is not None:
            source = f"`{helper}` returns a host tensor it builds"
    else:
        root = _root_name(copied)
        if root is None:
            return
        source = _unpinned_source(root, ctx, scope, call.lineno)
    if source is None and not (func.attr == "to" and _converts_only(call)):
        source = _unpinned_project(source_node, ctx)
    if source is not None:
        ctx.report(
            PAGEABLE_NON_BLOCKING.code,
            call,
            f"`{flag.arg}=True` from pageable memory ({source}): the copy cannot overlap "
            "and runs synchronously; pin the source (`pin_memory=True`) or drop the flag",
        )


def _converts_only(call: ast.Call) -> bool:
    """``x.to(torch.float16, non_blocking=True)``: a dtype given, no device or tensor."""
    if keyword(call, "device") is not None or len(call.args) > 1:
        return False
    if not call.args:
        return True
    return _dtype_of(call.args[0]) is not None


def _unpinned_project(node: ast.expr, ctx: Context) -> str | None:
    """Why ``node``, whose origin the file does not show, is pageable: nothing in its project
    pins host memory (:mod:`torchplace.lint.project`), and it is not known to be on the
    device already (a copy between devices needs no pinning)."""
    if pins_anywhere(ctx.path) is not False:
        return None
    fact = file_facts(ctx).fact(node, scope_node(ctx))
    if fact is not None and fact.on_device:
        return None
    return "nothing in this project pins host memory: no `pin_memory=True` or `.pin_memory()`"


def _pinned_per_step(ctx: Context) -> str | None:
    """Where a ``.pin_memory()`` runs once per step: inside a training or inference step loop
    (its own items moved, an optimizer stepped, or a batch loop as for TPL201), or in a
    function that a training loop calls on every step (``get_batch(split)`` pinning the rows it
    slices; not a collate function, which pins what it collates as a pinning loader does).
    Not in a branch taken every few steps."""
    loops = ctx.loops()
    if in_periodic_branch(ctx):
        return None
    parent = ctx.parents[-1] if ctx.parents else None
    # `.pin_memory().to(device)`: pinned only to be copied at once, whoever consumes it
    copied = isinstance(parent, ast.Attribute) and parent.attr in {"to", "cuda"}
    if any(is_device_bound_loop(loop, ctx) for loop in loops):
        return "inside a loop"
    facts, scope = file_facts(ctx), scope_node(ctx)
    for loop in loops:
        if copied and _yields(loop):  # a generator pinning and moving each batch it yields
            return "inside a generator loop that moves each item it yields"
        kind = facts.loop_kind(loop, scope)
        if kind is None or kind[0] != "batch" or (_yields(loop) and not copied):
            continue  # a generator pinning what it hands out works as a pinning loader
        if kind[1].startswith("it moves") and not _runs_on_items(loop):
            continue  # a pass moving a state's tensors one by one (an offload, a cache)
        return f"inside a batch loop ({kind[1]})"
    function = ctx.function_scope()
    if loops or function is None or "collate" in function.name.lower():
        return None  # a collate function pins each batch as `DataLoader(pin_memory=True)` does
    per_batch = facts.per_batch(scope)
    if per_batch is None or not per_batch.trains:
        return None  # called from a loop that trains: not a one-off pass that moves a few tensors
    return f"in a function that runs once per batch ({per_batch.how})"


def _yields(loop: ast.AST) -> bool:
    return any(isinstance(sub, (ast.Yield, ast.YieldFrom)) for sub in own_nodes(loop))


def _runs_on_items(loop: ast.AST) -> bool:
    """The loop hands what it binds to a function of the program (``run_generator(z, c)``,
    ``model(x)``): a step of work, not only a pass that moves each item."""
    bound = set(names_in(loop.target)) if isinstance(loop, (ast.For, ast.AsyncFor)) else set()
    for sub in own_nodes(loop):
        if isinstance(sub, ast.Assign):
            bound |= {name for target in sub.targets for name in names_in(target)}
    return any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Name)
        and sub.func.id not in _BUILTINS
        and any(isinstance(arg, ast.Name) and arg.id in bound for arg in sub.args)
        for sub in own_nodes(loop)
    )


_BUILTINS = frozenset(
    {"len", "range", "print", "isinstance", "str", "int", "float", "list", "tuple", "dict"}
    | {"zip", "enumerate", "getattr", "setattr", "hasattr", "sorted", "min", "max", "sum"}
)


def _unconverted(node: ast.expr) -> ast.expr:
    """What a chain of host conversions and reshapes starts from (``x`` of
    ``x.float().contiguous()``): each allocates pageable memory again, pinned or not."""
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and (node.func.attr in _PAGEABLE_METHODS or _dtype_only(node))
    ):
        node = node.func.value
    return node


def _fresh_pageable(call: ast.Call, ctx: Context) -> str | None:
    qualname = ctx.call_qualname(call)
    if not _allocates_pageable(call, qualname, ctx):
        return None
    return f"`{qualname or dotted_name(call.func)}(...)` returns pageable memory"


# Joins that allocate their result where their inputs are: new pageable memory on the host.
_JOINS = frozenset(
    {"torch.cat", "torch.concat", "torch.concatenate", "torch.stack", "torch.hstack"}
    | {"torch.vstack"}
)


def _allocates_pageable(call: ast.Call, qualname: str | None, ctx: Context) -> bool:
    """``call`` builds a new host tensor in pageable memory: a factory or ``torch.from_numpy``
    without ``pin_memory=``/``device=``, or a join (``torch.cat(crops)``) of tensors not known
    to be on the device (a join of host tensors is never pinned, whatever its inputs were)."""
    if _tokenizer_output(call):
        return True  # built on the host, never pinned (a tokenizer takes no `pin_memory`)
    if has_star_kwargs(call) or keyword(call, "pin_memory") or keyword(call, "device"):
        return False
    if qualname in FACTORIES or qualname == "torch.from_numpy":
        return True
    if qualname not in _JOINS or not call.args:
        return False
    facts, scope = file_facts(ctx), scope_node(ctx)
    joined = call.args[0]
    parts = joined.elts if isinstance(joined, (ast.List, ast.Tuple)) else [joined]
    return not any(
        (fact := facts.fact(part, scope)) is not None and fact.on_device for part in parts
    )


def _tokenizer_output(call: ast.Call) -> bool:
    """``tokenizer(texts, return_tensors="pt")`` (also given its text as ``**kw``), or a
    tokenizer's own call, ``tokenize(texts)``, ``self.model.tokenizer(prompts)``: new host
    tensors encoding text."""
    if encodes_text(call):
        return True
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return bool(call.args) and name.lower().endswith(("tokenize", "tokenizer"))


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _unpinned_source(name: str, ctx: Context, scope: Scope, line: int) -> str | None:
    rebuilt = _rebuilt_above(name, ctx, scope, line)
    if rebuilt is not None:
        return rebuilt
    # (a) a batch from a DataLoader without pin_memory=True.
    for loop in reversed(ctx.loops()):
        if not isinstance(loop, (ast.For, ast.AsyncFor)):
            continue
        targets = _batch_targets(loop)
        if name not in targets and not _derived(name, targets, loop):
            continue
        loader = _loader_call(loop.iter, ctx, scope)
        if loader is None:
            return None
        pin = keyword(loader, "pin_memory")
        if has_star_kwargs(loader):
            return None
        if pin is None or (isinstance(pin.value, ast.Constant) and pin.value.value is False):
            return f"the DataLoader on line {loader.lineno} has no `pin_memory=True`"
        return None
    # (b) a tensor built right here by a factory without pin_memory=True: the binding that
    # reaches the copy (the nearest one above it), through reshapes and dtype conversions of
    # the same name, which allocate pageable memory again.
    values = _rebindings(ctx, scope).get(name)
    if not values:
        return None
    bound = [value for value in values if value is not None]
    if any(_pins(value) for value in bound):
        return None
    value = _reaching(bound, line)
    if len(bound) < len(values) and not _just_above(value, ctx):
        return None  # a parameter or loop item may reach the copy: unknown memory
    converted: str | None = None  # the dtype a host conversion of the name made, if any
    while (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and (value.func.attr in _PAGEABLE_METHODS or _dtype_only(value))
        and isinstance(value.func.value, ast.Name)
        and value.func.value.id == name
    ):
        converted = converted or _conversion_dtype(value)
        value = _reaching(bound, value.lineno)
    if (value is not None and not isinstance(value, ast.Call)) or (
        isinstance(value, ast.Call) and _unconverted(value) is not value
    ):
        # a view or conversion of another host tensor: `x = buf[:-1]`, `x = s[:-1].to(dtype=...)`
        for branch in _branch_bindings(value, bound, ctx, scope):
            origin = _viewed_host(branch, ctx, scope, converted)
            if origin is not None:
                return f"`{name}` {origin}"
    if not isinstance(value, ast.Call):
        return None
    base = _unconverted(value)
    if base is not value and isinstance(base, ast.Call):
        # `gt = torch.arange(n).long()`: a factory's tensor, converted on the host
        value = base
    if not _allocates_pageable(value, ctx.call_qualname(value), ctx):
        helper = _pageable_helper(value, ctx, scope)
        if helper is None:
            return None
        return f"`{name}` is the host tensor `{helper}` builds on line {value.lineno}"
    if _tokenizer_output(value):
        return f"`{name}` is a tokenizer's output, built on the host on line {value.lineno}"
    return f"`{name}` is created on line {value.lineno} without `pin_memory=True`"


_CONVERTING_METHODS = {
    "float": "float32",
    "half": "float16",
    "double": "float64",
    "long": "int64",
    "int": "int32",
    "bool": "bool",
}
_DTYPE_ALIASES = {
    "float": "float32",
    "half": "float16",
    "double": "float64",
    "long": "int64",
    "int": "int32",
    "short": "int16",
}


def _dtype_of(node: ast.expr | None) -> str | None:
    """``torch.int32`` -> ``int32`` (``torch.long`` -> ``int64``); None when not a literal."""
    name = dotted_name(node) if node is not None else None
    if name is None or not name.startswith("torch.") or _DTYPE.fullmatch(name[6:]) is None:
        return None
    return _DTYPE_ALIASES.get(name[6:], name[6:])


def _conversion_dtype(call: ast.Call) -> str | None:
    """The dtype a host conversion (``x.to(dtype=torch.int32)``, ``x.long()``) makes."""
    if not isinstance(call.func, ast.Attribute):
        return None
    if call.func.attr in _CONVERTING_METHODS and not call.args:
        return _CONVERTING_METHODS[call.func.attr]
    if not _dtype_only(call):
        return None
    dtype = keyword(call, "dtype")
    return _dtype_of(dtype.value if dtype is not None else call.args[0])


def _branch_bindings(
    value: ast.expr | None, bound: list[ast.expr], ctx: Context, scope: Scope
) -> list[ast.expr]:
    """``value`` and, when it is bound in one branch of an ``if``, the bindings of the same
    name in the other branch (``if packed: x = buf[:-1]`` / ``else: x = tokens[:n]``): each
    reaches the code after the ``if`` on its own path."""
    if value is None:
        return []
    found = [value]
    for sub in own_nodes(scope.node):
        if not isinstance(sub, ast.If) or not sub.orelse:
            continue
        for mine, other in ((sub.body, sub.orelse), (sub.orelse, sub.body)):
            if not any(node is value for stmt in mine for node in walk(stmt)):
                continue
            theirs = [v for v in bound if any(node is v for stmt in other for node in walk(stmt))]
            if theirs:
                found.append(max(theirs, key=lambda v: (v.lineno, v.col_offset)))
    return found


def _viewed_host(value: ast.expr, ctx: Context, scope: Scope, converted: str | None) -> str | None:
    """Why ``value``, a view or dtype conversion of another name (``buf[:-1]``,
    ``scratch[:-1].to(dtype=torch.int32)``), is pageable host memory: ``buf`` is a host tensor
    the function builds in pageable memory (a view of it is pageable too), or a pinned one it
    builds with a literal ``dtype=`` that a conversion changes (the conversion allocates new,
    pageable memory: pinning does not carry over)."""
    node = value
    while True:
        if isinstance(node, ast.Call) and _unconverted(node) is not node:
            assert isinstance(node.func, ast.Attribute)
            converted = converted or _conversion_dtype(node)
            node = node.func.value
        elif isinstance(node, ast.Subscript) and (
            _is_view_index(node.slice)
            or (isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str))
        ):
            node = node.value  # also an entry of a mapping of host tensors, `enc["input_ids"]`
        else:
            break
    if not isinstance(node, ast.Name):
        return None
    values = _rebindings(ctx, scope).get(node.id)
    if not values or None in values:
        return None  # a parameter or loop item: memory unknown
    source = _reaching([v for v in values if v is not None], value.lineno)
    if not isinstance(source, ast.Call):
        return None
    if _pins(source):
        made = _dtype_of(getattr(keyword(source, "dtype"), "value", None))
        if converted is None or made is None or made == converted:
            return None
        return (
            f"is converted to `{converted}` on the host from the pinned `{node.id}` (line "
            f"{source.lineno}): a conversion allocates new, pageable memory"
        )
    if not _allocates_pageable(source, ctx.call_qualname(source), ctx):
        return None
    return f"comes from `{node.id}`, created on line {source.lineno} without `pin_memory=True`"


def _is_view_index(index: ast.expr) -> bool:
    """``buf[:-1]``, ``rows[:, 1:]``: basic slicing, a view of the same memory."""
    parts = index.elts if isinstance(index, ast.Tuple) else [index]
    return any(isinstance(p, ast.Slice) for p in parts) and all(
        isinstance(p, ast.Slice)
        or (isinstance(p, ast.Constant) and isinstance(p.value, int))
        or (isinstance(p, ast.Constant) and p.value is Ellipsis)
        for p in parts
    )


def _rebuilt_above(name: str, ctx: Context, scope: Scope, line: int) -> str | None:
    """``name`` bound, by a statement of a block that holds the copy, to a new host tensor
    (a factory, or a join: ``images = torch.cat([v1, v2])``, then ``images =
    images.cuda(non_blocking=True)`` under an ``if`` below): that binding reaches the copy,
    whatever the loop's batch or the name held before, and its memory is pageable."""
    bound = [value for value in _rebindings(ctx, scope).get(name, []) if value is not None]
    value = _reaching(bound, line)
    if not isinstance(value, ast.Call) or any(_pins(v) for v in bound):
        return None
    above = [stmt for body, index in ctx.stmt_path for stmt in body[:index]]
    if not any(isinstance(stmt, ast.Assign) and stmt.value is value for stmt in above):
        reworked = _reworked_batch(value, name, ctx)
        if reworked is None or not any(
            isinstance(stmt, ast.If) and any(sub is value for sub in walk(stmt)) for stmt in above
        ):
            return None
        return (
            f"`{name}` is rebuilt on the host by `{reworked}(...)` on line {value.lineno} (under "
            "an `if` above): new pageable memory, whatever the loader pinned"
        )
    qualname = ctx.call_qualname(value)
    if not _allocates_pageable(value, qualname, ctx):
        return None
    if qualname in _JOINS:
        return f"`{name}` is joined by `{qualname}(...)` on line {value.lineno}, into new pageable memory"
    if _tokenizer_output(value):
        return f"`{name}` is a tokenizer's output, built on the host on line {value.lineno}"
    return f"`{name}` is created on line {value.lineno} without `pin_memory=True`"


def _reworked_batch(value: ast.Call, name: str, ctx: Context) -> str | None:
    """The torch function that ``value`` applies to the loop's own batch ``name`` before it is
    copied (``target = F.interpolate(target.unsqueeze(1).float(), size=s).long()`` in ``for
    input, target in loader``): its result is a new host tensor, never pinned."""
    call = _unconverted(value)
    if not isinstance(call, ast.Call) or not call.args:
        return None
    qualname = ctx.call_qualname(call)
    if qualname is None or not qualname.startswith("torch.") or qualname in FACTORIES:
        return None
    first = _unconverted(call.args[0])
    if _root_name(first) != name:
        return None
    fact = file_facts(ctx).fact(first, scope_node(ctx))
    if fact is not None and fact.on_device:
        return None  # moved above: the function runs on the device
    loops = [loop for loop in ctx.loops() if isinstance(loop, (ast.For, ast.AsyncFor))]
    return qualname if any(name in _batch_targets(loop) for loop in loops) else None


def _just_above(value: ast.expr | None, ctx: Context) -> bool:
    """``value`` is bound by a statement of the block the copy is in, above it (``mask =
    self._make_mask(n)``, then ``mask = mask.to(d, non_blocking=True)``): it reaches the copy
    whatever the name held before."""
    if value is None or not ctx.stmt_path:
        return False
    body, index = ctx.stmt_path[-1]
    return any(isinstance(stmt, ast.Assign) and stmt.value is value for stmt in body[:index])


def _pageable_helper(call: ast.Call, ctx: Context, scope: Scope) -> str | None:
    """The name of the helper ``call`` runs, when it is a method of the enclosing class
    (``self._make_causal_mask(n, m)``) or a module-level function of the file whose every
    ``return`` hands back a host tensor it builds itself, in pageable memory: a factory
    without ``device=``/``pin_memory=``, or reshapes, comparisons and arithmetic of such;
    also under such methods applied to its result (``image_to_tensor(img).unsqueeze_(0)``)."""
    while (
        isinstance(call.func, ast.Attribute)
        and call.func.attr in _PAGEABLE_METHODS | _HOST_OPS
        and isinstance(call.func.value, ast.Call)
    ):
        call = call.func.value
    func = call.func
    body: list[ast.stmt] = []
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
        and scope.cls is not None
    ):
        body = getattr(scope.cls.node, "body", [])
        name = func.attr
    elif isinstance(func, ast.Name):
        body = getattr(scope.root().node, "body", [])
        name = func.id
    else:
        return None
    helper = next(
        (
            n
            for n in body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
        ),
        None,
    )
    if helper is None or helper.decorator_list:
        return None
    returns = [n for n in own_nodes(helper) if isinstance(n, ast.Return)]
    if not returns or any(r.value is None for r in returns):
        return None
    bound: dict[str, list[ast.expr]] = {}
    for sub in own_nodes(helper):
        if isinstance(sub, ast.Assign):
            for target in sub.targets:
                for var in names_in(target):
                    bound.setdefault(var, []).append(sub.value)
        elif isinstance(sub, (ast.AugAssign, ast.AnnAssign)):
            for var in names_in(sub.target):
                bound.setdefault(var, []).append(ast.Constant(None))
    for arg in (*helper.args.posonlyargs, *helper.args.args, *helper.args.kwonlyargs):
        if arg.arg in bound:  # `x = x.float()` of what the caller hands: not built here
            bound[arg.arg].append(ast.Constant(None))
    sizes = {
        arg.id
        for sub in own_nodes(helper)
        if isinstance(sub, ast.Call) and ctx.call_qualname(sub) in FACTORIES - _COPIES
        for arg in sub.args
        if isinstance(arg, ast.Name)
    }
    sizes |= {
        arg.arg
        for arg in helper.args.args
        if arg.annotation is not None and dotted_name(arg.annotation) in {"int", "float"}
    }
    if all(_host_built(r.value, bound, sizes, ctx, 0) for r in returns if r.value is not None):
        return f"{name}()"
    return None


def _host_built(
    node: ast.expr,
    bound: dict[str, list[ast.expr]],
    sizes: set[str],
    ctx: Context,
    depth: int,
    seen: frozenset[str] = frozenset(),
) -> bool:
    """``node`` is certainly a fresh pageable host tensor in the helper whose bindings are
    ``bound``: every tensor it is computed from is a factory result of that helper (a name
    rebound from itself, ``t = t.half()``, through each of its bindings)."""
    if depth > 6:
        return False
    if isinstance(node, ast.Name):
        if node.id in seen:
            return True  # `t = t.mul(2)`: what `t` held before is its other bindings
        values = bound.get(node.id)
        return bool(values) and all(
            _host_built(value, bound, sizes, ctx, depth + 1, seen | {node.id})
            for value in values or ()
        )
    if isinstance(node, ast.Compare):
        parts = [node.left, *node.comparators]
    elif isinstance(node, ast.BinOp):
        parts = [node.left, node.right]
    elif isinstance(node, ast.UnaryOp):
        parts = [node.operand]
    elif isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _PAGEABLE_METHODS | _HOST_OPS:
            return _host_built(func.value, bound, sizes, ctx, depth + 1, seen)
        qualname = ctx.call_qualname(node)
        if qualname not in FACTORIES and qualname != "torch.from_numpy":
            return False
        first = node.args[0] if node.args else None
        if qualname in _COPIES and isinstance(first, ast.Name) and first.id not in bound:
            return False  # `torch.tensor(x)` of what the caller hands: copied where it is
        return _allocates_pageable(node, qualname, ctx)
    else:
        return False
    tensors = [part for part in parts if not _host_number(part, sizes)]
    return bool(tensors) and all(
        _host_built(part, bound, sizes, ctx, depth + 1, seen) for part in tensors
    )


def _host_number(node: ast.expr, sizes: set[str]) -> bool:
    """A Python number: a literal, a name the helper uses as a factory's size
    (``torch.arange(n) - n``), a length or a tensor's size."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return node.id in sizes
    if isinstance(node, ast.Call):
        return call_name(node) in {"len", "size", "numel", "dim"}
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and (node.value.attr == "shape")
    )


# Factories that copy their data argument (a tensor is copied where it lives).
_COPIES = frozenset({"torch.tensor", "torch.as_tensor", "torch.Tensor"})

# Tensor methods that hand back a new tensor where their receiver lives.
_HOST_OPS = frozenset(
    {"tril", "triu", "masked_fill", "fill_", "repeat", "repeat_interleave", "clamp", "clip"}
    | {"add", "sub", "mul", "div", "neg", "abs", "pow", "sqrt", "exp", "log"}
    | {"unsqueeze_", "squeeze_", "t_", "transpose_", "clamp_", "add_", "sub_", "mul_", "div_"}
)


# Methods whose result is a new host tensor (or a view of one) in pageable memory.
_PAGEABLE_METHODS = frozenset(
    {
        "reshape",
        "view",
        "flatten",
        "permute",
        "transpose",
        "contiguous",
        "unsqueeze",
        "squeeze",
        "float",
        "half",
        "double",
        "long",
        "int",
        "bool",
        "clone",
        "t",
        "expand",
    }
)


def _dtype_only(call: ast.Call) -> bool:
    """``x.to(dtype=torch.int32)``, ``x.to(torch.float16)``: a conversion on the host, not a
    move (no device, no other tensor to follow)."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "to"):
        return False
    if any(kw.arg not in {"dtype", "copy", "memory_format"} for kw in call.keywords):
        return False
    if len(call.args) > 1:
        return False
    if call.args:
        arg = call.args[0]
        name = dotted_name(arg)
        return (
            name is not None
            and name.startswith("torch.")
            and _DTYPE.fullmatch(name[6:]) is not None
        )
    return keyword(call, "dtype") is not None


_DTYPE = re.compile(r"(u?int\d*|float\d*|half|double|long|short|bool|bfloat16|complex\d*)")


def _rebindings(ctx: Context, scope: Scope) -> dict[str, list[ast.expr | None]]:
    """:meth:`Context.scope_bindings` without the stores into a name's elements or
    attributes (``mask[i, j] = 1`` fills the tensor, it does not rebind ``mask``)."""
    cached: dict[str, list[ast.expr | None]] | None = scope.cache.get("rebindings")
    if cached is not None:
        return cached
    found = {name: list(values) for name, values in ctx.scope_bindings(scope).items()}
    stores: dict[str, int] = {}
    for sub in own_nodes(scope.node):
        if isinstance(sub, ast.Assign):
            for target in sub.targets:
                if isinstance(target, (ast.Subscript, ast.Attribute)):
                    for name in names_in(target):
                        stores[name] = stores.get(name, 0) + 1
    for name, count in stores.items():
        values = found.get(name, [])
        for _ in range(count):
            if None in values:
                values.remove(None)
    scope.cache["rebindings"] = found
    return found


def _reaching(values: list[ast.expr], line: int) -> ast.expr | None:
    """The binding written last above ``line`` (the one that reaches it in straight code)."""
    above = [value for value in values if value.lineno < line]
    return max(above, key=lambda v: (v.lineno, v.col_offset)) if above else None


def _pins(value: ast.expr) -> bool:
    """``x.pin_memory()`` or a factory given ``pin_memory=...``: the name may be pinned."""
    for sub in walk(value):
        if isinstance(sub, ast.Call) and (
            keyword(sub, "pin_memory") is not None
            or (isinstance(sub.func, ast.Attribute) and sub.func.attr == "pin_memory")
        ):
            return True
    return False


def _derived(name: str, targets: set[str], loop: ast.For | ast.AsyncFor) -> bool:
    """``x, y = batch`` inside the loop: ``x`` comes from the loop target."""
    for stmt in loop.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(n, ast.Name) and n.id == name for t in stmt.targets for n in walk(t)
        ):
            return bool(names_in(stmt.value) & targets)
    return False


def _batch_targets(loop: ast.For | ast.AsyncFor) -> set[str]:
    """The names a loop binds to what its first sequence yields: all its targets, but only
    the first element's in ``for (x, y), line in zip(loader, lines)`` (also under ``tqdm``)."""
    node = loop.iter
    while isinstance(node, ast.Call) and node.args and call_name(node) not in {"zip", "enumerate"}:
        node = node.args[0]
    target = loop.target
    if (
        isinstance(node, ast.Call)
        and call_name(node) == "zip"
        and isinstance(target, ast.Tuple)
        and len(target.elts) == len(node.args)
    ):
        return names_in(target.elts[0])
    return names_in(target)


def _loader_call(node: ast.expr, ctx: Context, scope: Scope) -> ast.Call | None:
    while isinstance(node, ast.Call) and node.args:
        # enumerate(loader), tqdm(loader), metric_logger.log_every(loader, 10): what the
        # loop gets is the loader's batches, as they were loaded
        name = call_name(node)
        if name is None or not (name in _WRAPPERS or _names_progress(name)):
            break
        node = node.args[0]
    if isinstance(node, ast.Name):
        values = ctx.scope_bindings(scope).get(node.id)
        if values == [None]:
            return _handed_loader(node.id, ctx, scope)
        if not values or len(values) != 1 or values[0] is None:
            return None
        node = values[0]
    return _built_loader(node, ctx)


def _built_loader(node: ast.expr, ctx: Context, index: int | None = None) -> ast.Call | None:
    """``DataLoader(...)``, or the loader a helper of the file builds and returns (element
    ``index`` of the tuple it returns, ``loader, classes = setup_loader(...)``)."""
    if index is None and isinstance(node, ast.Call) and ctx.call_qualname(node) in _DATALOADERS:
        return node
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return _helper_loader(node.func.id, ctx, index)
    return None


def _handed_loader(name: str, ctx: Context, scope: Scope) -> ast.Call | None:
    """The loader every call of this module-level function in its file hands the parameter
    ``name`` (``train(model, train_loader)`` from a ``main`` that built ``train_loader =
    DataLoader(...)``, also through a helper's tuple: ``train_loader, classes =
    setup_loader(...)``), when those loaders agree on ``pin_memory`` (the first one)."""
    function = scope.node
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    if scope.parent is None or scope.parent.kind != "module":
        return None
    params = [a.arg for a in function.args.args]
    if name not in params:
        return None
    position = params.index(name)
    facts = file_facts(ctx)
    found: list[ast.Call] = []
    for caller, call, _loops in facts.calls_of(function.name):
        if not (isinstance(call.func, ast.Name) and call.func.id == function.name):
            continue
        arg = next((kw.value for kw in call.keywords if kw.arg == name), None)
        if arg is None and position < len(call.args):
            arg = call.args[position]
        loader = _caller_loader(arg, caller, ctx)
        if loader is None:
            return None
        found.append(loader)
    pinned = {_pins_batches(loader) for loader in found}
    return found[0] if found and len(pinned) == 1 else None


def _caller_loader(arg: ast.expr | None, caller: ast.AST, ctx: Context) -> ast.Call | None:
    """The loader a caller binds ``arg`` to, once, in its own body."""
    if not isinstance(arg, ast.Name) or isinstance(arg, ast.Starred):
        return None
    bound = [
        (stmt.targets[0], stmt.value)
        for stmt in own_nodes(caller)
        if isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and arg.id in names_in(stmt.targets[0])
    ]
    if len(bound) != 1:
        return None
    target, value = bound[0]
    if isinstance(target, ast.Name):
        return _built_loader(value, ctx)
    if isinstance(target, ast.Tuple):
        index = next(
            (
                i
                for i, elt in enumerate(target.elts)
                if isinstance(elt, ast.Name) and elt.id == arg.id
            ),
            None,
        )
        return None if index is None else _built_loader(value, ctx, index)
    return None


def _pins_batches(loader: ast.Call) -> bool | None:
    """``pin_memory=True`` (True), absent or ``False`` (False), or anything else (None)."""
    if has_star_kwargs(loader):
        return None
    pin = keyword(loader, "pin_memory")
    if pin is None:
        return False
    value = pin.value.value if isinstance(pin.value, ast.Constant) else None
    return value if isinstance(value, bool) else None


def _helper_loader(name: str, ctx: Context, index: int | None = None) -> ast.Call | None:
    """The ``DataLoader(...)`` a module-level function of this file builds and returns
    (``def create_data_loader(...): loader = DataLoader(...); return loader``), when its
    only ``return`` hands back that loader."""
    root = ctx.scope.root()
    body = getattr(root.node, "body", [])
    helper = next(
        (
            n
            for n in body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
        ),
        None,
    )
    if helper is None:
        return None
    returns = [n for n in own_nodes(helper) if isinstance(n, ast.Return)]
    if len(returns) != 1 or returns[0].value is None:
        return None
    value: ast.expr = returns[0].value
    if index is not None:
        if not isinstance(value, ast.Tuple) or index >= len(value.elts):
            return None
        value = value.elts[index]
    if isinstance(value, ast.Name):
        bound = [
            n.value
            for n in own_nodes(helper)
            if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == value.id for t in n.targets)
        ]
        if len(bound) != 1:
            return None
        value = bound[0]
    if isinstance(value, ast.Call) and ctx.call_qualname(value) in _DATALOADERS:
        return value
    return None


FAMILY = Family(
    rules=(PAGEABLE_NON_BLOCKING, PIN_IN_LOOP),
    checks=((ast.Call, _call, (PAGEABLE_NON_BLOCKING.code, PIN_IN_LOOP.code)),),
    triggers=("non_blocking", "async=", ".pin_memory("),
)
